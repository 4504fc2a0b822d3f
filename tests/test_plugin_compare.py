"""The plugin's compare routes (in process, through dlprofviewer's WSGI app): the summary and the paged tables
against the diff report of the hand-computed pair of profiles, the defaults of the baseline, and bad
parameters."""

from __future__ import annotations

import pytest
from werkzeug.test import Client

from dlprof_plugin.viewer import build_app
from tests.profiles import run_dlprof
from tests.test_compare import HAND_KERNELS, HAND_OPS, hand_after, hand_before, read_sections
from tests.test_db_load import v2  # noqa: F401 - the 2.0 database fixture


pytestmark = pytest.mark.slow  # TensorBoard and several CLI runs; test_plugin_routes.py has the fast checks


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    root = tmp_path_factory.mktemp("plugin_compare")
    before, after = hand_before(root / "before.sqlite"), hand_after(root / "after.sqlite")
    run_dlprof(f"--database={before}", f"--output_path={root / 'before'}", "--reports=summary", "-v", "quiet")
    run_dlprof(f"--database={after}", f"--output_path={root / 'after'}", "--reports=summary", "-v", "quiet")
    app = build_app([str(root / "after" / "dlprof_dldb.sqlite"), str(root / "before" / "dlprof_dldb.sqlite")])
    return Client(app)


RUNS = "run=dlprof_dldb&base_run=before/dlprof_dldb"


def get(client, url, status=200):
    reply = client.get(url)
    assert reply.status_code == status, reply.get_json()
    return reply.get_json()


def test_summary_route(client):
    doc = get(client, f"/compare?{RUNS}")
    assert doc["after"]["run"] == "dlprof_dldb" and doc["baseline"]["run"] == "before/dlprof_dldb"
    assert doc["baseline"]["domain"] == doc["after"]["domain"] == "default"
    figures = {r["key"]: r for r in doc["summary"]}
    assert (
        figures["total_gpu_time"]["baseline"],
        figures["total_gpu_time"]["after"],
        figures["total_gpu_time"]["delta"],
    ) == (15000, 10000, -5000)
    assert figures["kernel_gpu_time"]["delta"] == -5000
    assert doc["ops"] == {"both": 2, "after only": 1, "baseline only": 1}
    assert doc["kernels"] == {"both": 2, "after only": 1, "baseline only": 0}


def test_tables_hold_the_diff_rows_in_the_reports_order(client):
    doc = get(client, f"/table/compare_ops?{RUNS}")
    keys = [c["key"] for c in doc["columns"]]
    assert doc["sort"] == "abs_delta" and doc["order"] == "desc" and doc["total"] == 4
    got = [
        tuple(
            r[keys.index(k)]
            for k in (
                "op_name",
                "direction",
                "presence",
                "calls",
                "baseline_calls",
                "gpu_time",
                "baseline_gpu_time",
                "delta",
                "delta_pct",
            )
        )
        for r in doc["rows"]
    ]
    assert got == HAND_OPS
    doc = get(client, f"/table/compare_kernels?{RUNS}")
    keys = [c["key"] for c in doc["columns"]]
    got = [
        tuple(
            r[keys.index(k)]
            for k in (
                "kernel_name",
                "presence",
                "calls",
                "baseline_calls",
                "gpu_time",
                "baseline_gpu_time",
                "delta",
                "delta_pct",
            )
        )
        for r in doc["rows"]
    ]
    assert got == HAND_KERNELS


def test_tables_sort_filter_and_export(client):
    doc = get(client, f"/table/compare_ops?{RUNS}&sort=delta&order=asc")
    names = [r[1] for r in doc["rows"]]
    assert names == ["/aten::mm", "/aten::relu[2]", "/aten::relu", "/aten::add"]
    doc = get(client, f"/table/compare_ops?{RUNS}&col.presence=only")
    assert doc["filtered"] == 2 and doc["total"] == 4
    doc = get(client, f"/table/compare_ops?{RUNS}&col.delta=%3C0")
    assert sorted(r[1] for r in doc["rows"]) == ["/aten::mm", "/aten::relu[2]"]
    reply = client.get(f"/table/compare_kernels?{RUNS}&format=csv")
    assert reply.status_code == 200
    lines = reply.data.decode().splitlines()
    assert lines[0].startswith("Kernel Name,Uses TC,Present In,No. Calls")
    assert lines[1].startswith("gemm_a,no,both,1,1,6000,10000,-4000,-40")


def test_baseline_defaults_to_the_run_itself(client):
    doc = get(client, "/compare?run=dlprof_dldb")
    assert doc["baseline"]["run"] == "dlprof_dldb" and all(r["delta"] == 0 for r in doc["summary"])


@pytest.mark.parametrize(
    "query,status,text",
    [
        ("run=dlprof_dldb&base_run=nope", 404, "unknown run 'nope'"),
        ("run=dlprof_dldb&base_aggr=9", 404, "unknown aggregation 9"),
        ("run=dlprof_dldb&base_aggr=x", 400, "'base_aggr' must be an integer"),
        ("run=dlprof_dldb&base_domain=NCCL", 404, "unknown domain 'NCCL'"),
        ("run=dlprof_dldb&base_run=../x", 400, "invalid run"),
    ],
)
def test_bad_baselines(client, query, status, text):
    doc = get(client, f"/compare?{query}", status)
    assert text in doc["error"]
    doc = get(client, f"/table/compare_ops?{query}", status)
    assert text in doc["error"]


def test_a_2_0_database_compares_with_its_3_0_twin(v2):
    """The training profile written as a 2.0 database and analysed into a 3.0 one: the same rows, no change;
    the timeline needs 3.0."""
    client = Client(build_app([str(v2["v2"]), str(v2["v3"])]))
    doc = get(client, "/compare?run=dlprof_dldb&base_run=v3/dlprof_dldb")
    assert all(r["delta"] == 0 for r in doc["summary"]) and doc["summary"][2]["after"] > 0
    assert doc["ops"]["both"] > 0 and doc["ops"]["after only"] == doc["ops"]["baseline only"] == 0
    rows = get(client, "/table/compare_ops?run=dlprof_dldb&base_run=v3/dlprof_dldb&limit=100")["rows"]
    assert rows and all(r[9] == 0 for r in rows)  # delta
    doc = get(client, "/timeline?run=dlprof_dldb&iteration=1", 404)
    assert "schema 3.0" in doc["error"]


# ---------------------------------------------------------------------------- the run's own baseline, over HTTP


@pytest.fixture(scope="module")
def kept(tmp_path_factory, tensorboard):
    """The session's TensorBoard with a run `after` analysed with `--baseline` (its diff report beside it) and
    the baseline's own run `before` (as plugin_compare/after/dlprof and plugin_compare/before/dlprof)."""
    root = tmp_path_factory.mktemp("kept_baseline")
    before, after = hand_before(root / "before.sqlite"), hand_after(root / "after.sqlite")
    logdir = root / "logdir"
    run_dlprof(f"--database={before}", f"--output_path={logdir / 'before'}", "--reports=summary", "-v", "quiet")
    run_dlprof(
        f"--database={after}",
        f"--baseline={before}",
        f"--output_path={logdir / 'after'}",
        "--reports=summary",
        "-v",
        "quiet",
    )
    report = read_sections(logdir / "after" / "dlprof_diff.csv")
    tensorboard.publish("plugin_compare", logdir)
    return {"tb": tensorboard, "before": before, "report": report}


def _figure(kind: str, value) -> str:
    """A headline figure as the diff report writes it (DLProf's CSV conventions)."""
    if kind == "int":
        return str(int(value))
    return f"{value:.1f}"


def test_the_compare_route_given_only_the_run_answers_its_diff_report(kept):
    """`compare?run=` alone: the baseline `dlprof --baseline` compared the run with, kept in its database; the
    headline figures and every op and kernel row are the diff report's, and the answer says the baseline is the
    kept one."""
    import csv
    import io
    import urllib.request

    from tests.browser import http_json

    tb, report = kept["tb"], kept["report"]
    doc = tb.api("compare?run=plugin_compare/after/dlprof")
    assert doc["baseline"]["stored"] is True and doc["baseline"]["run"] is None
    assert doc["baseline"]["source"] == str(kept["before"]) and doc["baseline"]["compared_aggr"] == 1
    assert doc["after"]["stored"] is False and doc["after"]["run"] == "plugin_compare/after/dlprof"
    summary = {r["label"]: r for r in doc["summary"]}
    assert [r["label"] for r in doc["summary"]] == [row[0] for row in report["Diff Summary"][1:]]
    for label, base, after, delta in report["Diff Summary"][1:]:
        r = summary[label]
        assert [_figure(r["kind"], r[k]) for k in ("baseline", "after", "delta")] == [base, after, delta], label
    for table, section in (("compare_ops", "Op Diff"), ("compare_kernels", "Kernel Diff")):
        url = f"{tb.url}/data/plugin/dlprof/table/{table}?run=plugin_compare/after/dlprof&format=csv"
        with urllib.request.urlopen(url, timeout=30) as resp:
            header, *rows = list(csv.reader(io.StringIO(resp.read().decode("utf-8"))))
        theirs_header, *theirs = report[section]
        assert header == theirs_header and len(rows) == len(theirs) > 0
        pct = header.index("Delta GPU Time %")
        for mine, ref in zip(rows, theirs):
            assert mine[:pct] == ref[:pct], (table, mine, ref)
            assert (f"{float(mine[pct]):.1f}" if mine[pct] else "") == ref[pct], (table, mine, ref)
    # the aggregation says which baseline it was compared with
    (aggr,) = http_json(f"{tb.url}/data/plugin/dlprof/aggregations?run=plugin_compare/after/dlprof")["aggregations"]
    assert aggr["baseline"] == str(kept["before"])
    # the baseline's own run gives the same comparison (the same options), not marked as the kept one
    run = tb.api("compare?run=plugin_compare/after/dlprof&base_run=plugin_compare/before/dlprof")
    assert run["baseline"]["stored"] is False and run["baseline"]["run"] == "plugin_compare/before/dlprof"
    assert [(r["baseline"], r["after"]) for r in run["summary"]] == [
        (r["baseline"], r["after"]) for r in doc["summary"]
    ]
    # a run without a kept baseline is compared with itself
    own = tb.api("compare?run=plugin_compare/before/dlprof")
    assert own["baseline"]["stored"] is False and all(r["delta"] == 0 for r in own["summary"])
    assert (
        http_json(f"{tb.url}/data/plugin/dlprof/aggregations?run=plugin_compare/before/dlprof")["aggregations"][0][
            "baseline"
        ]
        is None
    )
