"""Databases of schema 2.0 (written by dlprof before 3.0) still open: the engine reloads and re-aggregates
them in their own layout, the viewer serves them (with names that are not UTF-8 decoded leniently)."""

from __future__ import annotations

import json
import sqlite3
import subprocess

import numpy as np
import pandas as pd
import pytest
from werkzeug.test import EnvironBuilder
from werkzeug.wrappers import Request

from dlprof_profiler import contract
from dlprof_profiler.db import writer as database
from dlprof_profiler.engine import markers as nm
from dlprof_profiler.run.single import reaggregate_in_place
from tests import test_plugin_checks as checks
from tests.analysis import analyze
from tests.db_v2 import write_v2_database
from tests.profiles import run_dlprof, training_profile
from tests.test_plugin_viewer import _viewer
from tests.waiting import wait_until
from tests import data

RUN = "dlprof_dldb"
ADD = "multi_tensor_apply_kernel"


def _profile_info(export, corr) -> dict:
    return {
        "profile_name": "dlprof",
        "source_file": str(export),
        "source_kind": "nsys_sqlite",
        "nsys_version": "2022.4.2.1",
        "schema_version": "x",
        "mode": corr.mode,
        "family": corr.family or "",
        "dlprof_version": "2.0.0",
        "created_utc": "2024-01-01T00:00:00Z",
        "profile_end": 1_290_000,
        "base_name": "dlprof",
    }


@pytest.fixture(scope="module")
def v2(tmp_path_factory):
    """The training profile as a 2.0 database (one aggregation) and as a 3.0 one from the CLI."""
    base = tmp_path_factory.mktemp("v2")
    export = training_profile(base / "training.sqlite")
    a = analyze(export)
    path = base / "v2" / "dlprof_dldb.sqlite"
    path.parent.mkdir()
    ids = write_v2_database(path, a.trace, a.corr, "default", _profile_info(export, a.corr))
    offsets = database.op_index_offsets(a.corr)
    from dlprof_profiler import experts as expert_systems

    findings = {
        n: expert_systems.detect(a.trace, a.corr, a.corr.domains[n], agg, a.iterations) for n, agg in a.aggs.items()
    }
    database.append_aggregation(path, a.aggs, ids, offsets, a.iterations, findings)
    run_dlprof(f"--database={export}", "--reports=summary", f"--output_path={base / 'v3'}", "-v", "quiet")
    return {"export": export, "v2": path, "v3": base / "v3" / "dlprof_dldb.sqlite", "base": base}


def rows(db, sql, params=()):
    con = sqlite3.connect(db)
    try:
        return con.execute(sql, params).fetchall()
    finally:
        con.close()


@pytest.mark.slow
def test_a_2_0_database_reloads_as_3_0_does(v2):
    old = database.load_model(v2["v2"])
    new = database.load_model(v2["v3"])
    assert database.schema_version(v2["v2"]) == "2.0.0" and database.schema_version(v2["v3"]) == "3.4.0"
    for name in ("api_calls", "gpu", "devices"):
        a, b = getattr(old[0], name), getattr(new[0], name)
        assert list(a.columns) == list(b.columns)
        for c in a.columns:
            assert [str(v) for v in a[c].astype(object)] == [str(v) for v in b[c].astype(object)], (name, c)
    ra = old[0].ranges.sort_values("range_id").reset_index(drop=True)
    rb = new[0].ranges.sort_values("range_id").reset_index(drop=True)
    for c in ("range_id", "domain", "text", "start", "end", "global_tid", "pid", "event_type", "unclosed"):
        assert [str(v) for v in ra[c].astype(object)] == [str(v) for v in rb[c].astype(object)], c
    assert np.array_equal(old[1].uses_tc, new[1].uses_tc) and old[3] == new[3] == {"default": 0}
    for c in (
        "op_index",
        "kind",
        "start",
        "end",
        "pid",
        "global_tid",
        "device_id",
        "cpu_time",
        "cpu_overhead",
        "gpu_time",
        "gpu_idle",
        "n_kernels",
        "name",
    ):
        assert old[1].domains["default"].instances[c].tolist() == new[1].domains["default"].instances[c].tolist(), c
    assert old[1].domains["default"].ops["op_id"].tolist() == new[1].domains["default"].ops["op_id"].tolist()


@pytest.mark.slow
def test_a_reload_counts_the_ranges_per_label_as_the_export_s_analysis(v2):
    """The expert systems read the ranges per label (whether a PyTorch profile has op markers at all): a
    re-analysis of the database must see the 36 emit_nvtx ranges the export's analysis saw, not none."""
    fresh = analyze(v2["export"]).corr.range_labels
    loaded = database.load_model(v2["v3"])[1].range_labels
    assert loaded is not None and int(loaded["num_ranges"].sum()) == 36
    assert (loaded["kind"] == nm.PT_OP).sum() == (fresh["kind"] == nm.PT_OP).sum() > 0
    pd.testing.assert_frame_equal(loaded, fresh, check_dtype=False)


@pytest.mark.slow
@pytest.mark.parametrize("which", ["v2", "v3"])
def test_reloaded_api_calls_keep_their_op_instances(v2, which):
    """The database keeps no API-call owner column: every call's op instance is rebuilt (launches from the
    activity owners, unassociated calls from their instance, others from the instance around them) and
    matches the correlation of the export, so detectors that name ops of API calls (syncs) work on reloads."""
    a = analyze(v2["export"])
    trace, corr = database.load_model(v2[which])[:2]
    fresh, loaded = a.corr.domains["default"], corr.domains["default"]

    # instance ids differ between a fresh model and a reload; compare the op and interval each call maps to
    def owners(dm, api):
        inst = dm.instances.set_index("instance_id")
        rows = inst.loc[dm.api_instance]
        return list(zip(rows["op_index"], rows["start"], rows["end"], api["start"]))

    assert len(loaded.api_instance) == len(trace.api_calls) == len(a.trace.api_calls) == 24
    assert (loaded.api_instance >= 0).all()
    assert owners(loaded, trace.api_calls) == owners(fresh, a.trace.api_calls)
    # the cudaDeviceSynchronize calls outside every range are the unassociated ones
    sync = (trace.api_calls["name"].astype(str).str.startswith("cudaDeviceSynchronize")).to_numpy()
    kinds = loaded.instances.set_index("instance_id").loc[loaded.api_instance[sync], "kind"]
    assert kinds.tolist() == [contract.UNASSOCIATED_API] * 3


@pytest.mark.slow
def test_a_2_0_database_is_reaggregated_in_its_own_layout(v2, tmp_path):
    path = tmp_path / "old.sqlite"
    path.write_bytes(v2["v2"].read_bytes())
    columns = [r[1] for r in rows(path, "PRAGMA table_info(model_summary)")]
    assert reaggregate_in_place(path, iter_start=1, iter_stop=2) == 2
    assert [r[1] for r in rows(path, "PRAGMA table_info(model_summary)")] == columns and "rank" not in columns
    # iterations 1 and 2 of the training profile: [1,080,000, 1,280,000)
    assert rows(path, "SELECT aggr_id, wall_time FROM model_summary ORDER BY aggr_id") == [(1, 290_000), (2, 200_000)]
    assert rows(path, "SELECT current_version FROM db_version") == [("2.0.0",)]
    # the CLI copies it (to a 2.0 file with one more aggregation)
    run_dlprof(
        f"--database={path}",
        "--key_node=aten::relu",
        "--reports=summary",
        f"--output_path={tmp_path / 'o'}",
        "-v",
        "quiet",
    )
    copy = tmp_path / "o" / "dlprof_dldb.sqlite"
    assert rows(copy, "SELECT aggr_id, key_node, total_iterations FROM aggregations ORDER BY aggr_id")[-1] == (
        3,
        "aten::relu",
        4,
    )


@pytest.fixture(scope="module")
def v2_viewer(v2):
    port = checks.free_port()
    with open(v2["base"] / "viewer.log", "w") as log:
        proc = subprocess.Popen(
            _viewer() + [str(v2["v2"]), f"--port={port}", "--host=127.0.0.1", "--quiet"],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        api = checks.Api(f"http://127.0.0.1:{port}")
        try:
            wait_until(lambda: api.raw(api.url("runs"), timeout=5)[0] == 200, 30, "dlprofviewer to start", proc)
            yield api
        finally:
            checks.stop(proc)


@pytest.mark.slow
def test_the_viewer_serves_a_2_0_database(v2, v2_viewer):
    checks.check_metadata_routes(v2_viewer, RUN, v2["v2"])
    checks.check_dashboard(v2_viewer, RUN, v2["v2"])
    checks.check_tables(v2_viewer, RUN, v2["v2"])


def _get(service, route: str, **args) -> dict:
    request = Request(EnvironBuilder(path=f"/{route}", query_string=args).get_environ())
    reply = service.handle(route, request, None, "")
    assert reply.status == 200, reply.body
    return json.loads(reply.body)


def test_kernels_of_a_3_3_database_are_read_by_name(v2, tmp_path):
    """Before schema 3.4 kernel_summaries held its kernel names as text: the viewer reads such a file as it
    reads a 3.4 one (names by string id), in the kernels table and in a comparison."""
    from dlprof_plugin.compare import side_from_database
    from dlprof_plugin.db import Database
    from dlprof_plugin.runs import RunInfo, StaticRuns
    from dlprof_plugin.service import Service

    old = tmp_path / "v3_3.sqlite"
    old.write_bytes(v2["v3"].read_bytes())
    con = sqlite3.connect(old)
    con.executescript(
        """
        DROP VIEW view_kernel_summaries;
        ALTER TABLE kernel_summaries ADD COLUMN kernel_name TEXT;
        ALTER TABLE kernel_summaries ADD COLUMN long_name TEXT;
        UPDATE kernel_summaries SET kernel_name = (SELECT value FROM strings WHERE id = name_id),
            long_name = (SELECT value FROM strings WHERE id = long_name_id);
        ALTER TABLE kernel_summaries DROP COLUMN name_id;
        ALTER TABLE kernel_summaries DROP COLUMN long_name_id;
        CREATE VIEW view_kernel_summaries AS SELECT k.*, o.op_id, o.op_name, o.direction, o.op_type
            FROM kernel_summaries k JOIN read_only_ops o ON o.op_index = k.op_index;
        UPDATE db_version SET current_version = '3.3.0', original_version = '3.3.0';
        """
    )
    con.close()
    tables = {}
    for name, path in (("new", v2["v3"]), ("old", old)):
        service = Service(StaticRuns({"r": RunInfo(run="r", database=str(path), shown_database=path.name)}))
        doc = _get(service, "table/kernels", run="r", limit=100, sort="kernel_name", order="asc")
        keys = [c["key"] for c in doc["columns"]]
        tables[name] = [dict(zip(keys, r)) for r in doc["rows"]]
        side = side_from_database(Database(path), 1, 0, name)
        tables[name + " compare"] = sorted(map(tuple, side.kernels.itertuples(index=False)))
    names = sorted(r["kernel_name"] for r in tables["new"])
    assert names == [r["kernel_name"] for r in tables["new"]]  # sorted by name in SQL too
    assert len(names) > 3 and "multi_tensor_apply_kernel" in names
    assert tables["old"] == tables["new"] and tables["old compare"] == tables["new compare"]
    assert {k[0] for k in tables["new compare"]} == set(names)
    # re-aggregated, a 3.3 file gets its new kernel rows in its own layout
    aggr = reaggregate_in_place(old)
    con = sqlite3.connect(old)
    by_aggregation = "SELECT kernel_name, long_name, num_calls FROM kernel_summaries WHERE aggr_id = ? ORDER BY rowid"
    assert con.execute(by_aggregation, (aggr,)).fetchall() == con.execute(by_aggregation, (1,)).fetchall() != []
    con.close()


@pytest.mark.parametrize("schema", ["v2", "v3"])
def test_names_that_are_not_utf8_are_shown_with_replacement_characters(v2, tmp_path, schema):
    """2.0 copied kernel names from the export byte for byte; a 3.0 file with such bytes (written by some
    other tool) is read leniently from the first failure on."""
    from dlprof_plugin.runs import RunInfo, StaticRuns
    from dlprof_plugin.service import Service

    path = tmp_path / f"{schema}.sqlite"
    path.write_bytes(v2[schema].read_bytes())
    bad = "CAST(X'6d756c74695f74656e736f72ff5f6170706c795f6b65726e656c' AS TEXT)"  # multi_tensor\xff_apply_kernel
    con = sqlite3.connect(path)
    if schema == "v2":
        con.execute(f"UPDATE read_only_gpu_activities SET name = {bad}, long_name = {bad} WHERE name = ?", (ADD,))
        con.execute(f"UPDATE read_only_kernel_tc SET name = {bad}, long_name = {bad} WHERE name = ?", (ADD,))
    else:
        con.execute(f"UPDATE strings SET value = {bad} WHERE value = ?", (ADD,))
    if schema == "v2":  # 3.4 names kernel_summaries' kernels by string id: the update of strings above renamed them
        con.execute(f"UPDATE kernel_summaries SET kernel_name = {bad}, long_name = {bad} WHERE kernel_name = ?", (ADD,))
    con.commit()
    con.close()
    service = Service(StaticRuns({"r": RunInfo(run="r", database=str(path), shown_database=path.name)}))
    shown = "multi_tensor\ufffd_apply_kernel"
    for _ in range(2):  # 3.0: the first attempt may fail (and switch the file to lenient decoding)
        request = Request(EnvironBuilder(path="/table/kernels", query_string={"run": "r", "limit": 100}).get_environ())
        reply = service.handle("table/kernels", request, None, "")
        if reply.status == 200:
            break
    doc = json.loads(reply.body)
    names = [r[[c["key"] for c in doc["columns"]].index("kernel_name")] for r in doc["rows"]]
    assert shown in names and ADD not in names
    doc = _get(service, "table/iteration_kernels", run="r", iteration=1, limit=100)
    names = [r[[c["key"] for c in doc["columns"]].index("kernel_name")] for r in doc["rows"]]
    assert names.count(shown) == 1 and len(names) == checks.KERNELS_PER_ITERATION


FIXTURE_DIR = data.DATA
REPORTS = ("summary", "detailed", "kernel", "iteration", "op_type", "group_op")


@pytest.mark.slow
@pytest.mark.parametrize(
    "fixture",
    [
        "nsys/pytorch_2gpu_nccl_nsys2026.2_after.sqlite",
        "kineto/pytorch_ddp_2gpu_nccl.json.gz",
        "kineto/resnet50_v100_2021format.pt.trace.json.gz",
    ],
)
def test_a_database_gives_the_reports_of_its_capture(fixture, tmp_path):
    """Re-aggregating the database dlprof wrote gives the reports of the capture, byte for byte (every
    figure, the backward calls grouped per forward call, the op names and ids): the database keeps what the
    analysis needs."""
    source = FIXTURE_DIR / fixture
    reports = "--reports=summary,detail,kernel,iteration,op_type,group_node"
    run_dlprof(f"--database={source}", reports, f"--output_path={tmp_path / 'a'}", "-v", "quiet")
    run_dlprof(
        f"--database={tmp_path / 'a' / 'dlprof_dldb.sqlite'}", reports, f"--output_path={tmp_path / 'b'}", "-v", "quiet"
    )
    for name in REPORTS:
        a = (tmp_path / "a" / f"dlprof_{name}.csv").read_text().splitlines()
        b = (tmp_path / "b" / f"dlprof_{name}.csv").read_text().splitlines()
        if name == "summary":  # the run's own facts: when, from which file
            own = ("Time Stamp", "Profile Name", "File", "Dlprof")
            a, b = ([line for line in x if not line.startswith(own)] for x in (a, b))
        assert len(a) > 2 and a == b, name
