"""The Compare view in a real headless Chromium inside a real TensorBoard: on the real before/after exports it
shows the numbers of the diff report `dlprof --baseline` wrote (summary, every op and kernel row, in order),
two aggregations of one run compare as the hand-computed training profile says, and the baseline survives a
reload (URL state)."""

from __future__ import annotations

import csv
import io
import shutil
from types import SimpleNamespace

import pytest

from tests.browser import fmt_int, fmt_ns, requires_browser
from tests.profiles import run_dlprof
from tests.test_browser_usability import reopen
from tests.test_browser_views import rows, select_run, table_in
from tests.test_compare import AFTER, BEFORE, needs_fixtures, read_sections

pytestmark = [pytest.mark.browser, requires_browser, needs_fixtures]

SUMMARY_KEYS = {
    "Average Iteration Time (ns)": "avg_iteration_time",
    "GPU Utilization %": "gpu_utilization",
    "Total GPU Time (ns)": "total_gpu_time",
    "Kernel GPU Time (ns)": "kernel_gpu_time",
    "Wall Clock Time (ns)": "wall_time",
    "Aggregated Iterations": "aggregated_iterations",
    "Tensor Core Kernel Utilization %": "tc_utilization",
}


@pytest.fixture(scope="module")
def env(tmp_path_factory, tensorboard, browser, training_run):
    root = tmp_path_factory.mktemp("compare")
    logdir = root / "logdir"
    run_dlprof(f"--database={BEFORE}", f"--output_path={logdir / 'before'}", "--reports=summary", "-v", "quiet")
    run_dlprof(
        f"--database={AFTER}",
        f"--baseline={BEFORE}",
        f"--output_path={logdir / 'after'}",
        "--reports=summary",
        "-v",
        "quiet",
    )
    shutil.copytree(training_run, logdir / "training")
    # a second aggregation of the same run: iterations 1..2 (the loops 1 and 2 of the training profile)
    run_dlprof(
        f"--database={logdir / 'training' / 'dlprof_dldb.sqlite'}",
        f"--output_path={logdir / 'training'}",
        "--force=true",
        "--iter_start=1",
        "--iter_stop=2",
        "--reports=summary",
        "-v",
        "quiet",
    )
    report = read_sections(logdir / "after" / "dlprof_diff.csv")
    logdir = tensorboard.publish("compare", logdir)
    b = browser.fresh(1600, 1000)
    b.open_dlprof(tensorboard.url, run="compare/after/dlprof")
    b.wait_css("#view .view", 30)
    return SimpleNamespace(tb=tensorboard, b=b, logdir=logdir, report=report)


def open_compare(b, run: str, base_run: str, base_aggr: str | None = None):
    from selenium.webdriver.support.ui import Select

    select_run(b, run)
    goto_compare(b)
    if b.js("return document.getElementById('compare-base-run').value") != base_run:
        Select(b.css("#compare-base-run")).select_by_value(base_run)
    if base_aggr is not None:
        b.wait(
            lambda d: b.js(
                "return [...document.querySelectorAll('#compare-base-aggr option')].some("
                "(o) => o.value === arguments[0])",
                base_aggr,
            ),
            what="the baseline's aggregations",
        )
        if b.js("return document.getElementById('compare-base-aggr').value") != base_aggr:
            Select(b.css("#compare-base-aggr")).select_by_value(base_aggr)
    b.wait(
        lambda d: b.js(
            "return document.querySelector('.view-compare').dataset.ready === '1' && "
            "document.getElementById('compare-after').textContent.includes('baseline: ' + arguments[0])",
            base_run + (f" · aggregation {base_aggr}" if base_aggr else ""),
        ),
        30,
        "the comparison",
    )
    return table_in(b, "#compare-ops"), table_in(b, "#compare-kernels")


def goto_compare(b):
    b.click("button.nav-item[data-view=compare]")
    b.wait_css("#compare-summary", 20)


def summary_cells(b) -> dict:
    return b.js(
        "const out = {}; for (const tr of document.querySelectorAll('#compare-summary tbody tr')) "
        "out[tr.dataset.key] = [...tr.querySelectorAll('td')].map((td) => td.innerText.trim()); return out;"
    )


def exported_csv(b, dt) -> list[list[str]]:
    before = {p.name for p in b.download_dir.iterdir()}
    b.js("arguments[0].click();", dt.find_element("css selector", "button.dt-csv"))
    path = b.wait_download(".csv", before=before)
    return list(csv.reader(io.StringIO(path.read_text(encoding="utf-8"))))


def test_compare_view_shows_the_diff_reports_numbers(env):
    b, report = env.b, env.report
    ops_dt, kernels_dt = open_compare(b, "compare/after/dlprof", "compare/before/dlprof")
    # the headline figures: the report's Diff Summary, as the viewer formats them
    check_summary(summary_cells(b), report)
    # the first page of ops: the report's first rows, in its order (largest change first)
    first = rows(ops_dt)
    assert [(r["op_name"], r["direction"], r["presence"]) for r in first] == [
        (r[0], r[1], r[3]) for r in report["Op Diff"][1 : len(first) + 1]
    ]
    # every row of both tables, exported: the report's rows, number for number
    for dt, title in ((ops_dt, "Op Diff"), (kernels_dt, "Kernel Diff")):
        header, *exported = exported_csv(b, dt)
        theirs_header, *theirs = report[title]
        assert header == theirs_header
        assert len(exported) == len(theirs) > 0
        pct = header.index("Delta GPU Time %")
        for mine, ref in zip(exported, theirs):
            assert mine[:pct] == ref[:pct], (title, mine, ref)
            assert (mine[pct] == "") == (ref[pct] == "")
            if ref[pct]:
                assert f"{round(float(mine[pct]), 1):.1f}" == ref[pct]
    b.screenshot("compare_before_after.png")


def check_summary(cells: dict, report: dict) -> None:
    """The headline figures shown are the report's Diff Summary, as the viewer formats them."""
    for label, base, after, delta in report["Diff Summary"][1:]:
        key = SUMMARY_KEYS[label]
        if label.endswith("%"):
            sign = "+" if float(delta) > 0 else ""
            assert cells[key] == [f"{base} %", f"{after} %", f"{sign}{delta} pp".replace("-", "−")], label
        elif key == "aggregated_iterations":
            assert cells[key] == [fmt_int(int(base)), fmt_int(int(after)), fmt_int(int(delta))], label
        else:
            sign = "+" if float(delta) > 0 else ""
            expected = [fmt_ns(float(base)), fmt_ns(float(after)), (sign + fmt_ns(float(delta))).replace("-", "−")]
            assert cells[key] == expected, label


def test_compare_opens_on_the_runs_own_baseline(env):
    """Issue 24, item 1: a run analysed with --baseline opens Compare on that baseline (kept in its database), the
    diff's headline figures heading the view, the rows of dlprof_diff.csv below; a run without one opens on its
    previous aggregation, or asks, never on an unrelated run."""
    b = env.b.fresh(1600, 1000)  # a fresh page: no baseline in the URL
    b.open_dlprof(env.tb.url, run="compare/after/dlprof")
    b.wait_css("#view .view", 30)
    select_run(b, "compare/after/dlprof")
    goto_compare(b)
    b.wait(lambda d: b.js("return document.querySelector('.view-compare').dataset.ready") == "1", 30, "compare")
    assert b.js("return document.getElementById('compare-base-run').value") == ""  # the kept baseline
    assert b.css(".view-compare").get_attribute("data-baseline") == "stored"
    assert (
        "Its baseline (dlprof --baseline): pytorch_2gpu_nccl_nsys2026.2_before.sqlite"
        in b.css("#compare-base-run option[value='']").text
    )
    assert str(BEFORE) in b.css("#compare-after").text and not b.css("#compare-base-aggr").is_displayed()
    assert "p.dlprof.base_run" not in b.js("return window.parent.location.hash;")
    check_summary(summary_cells(b), env.report)
    # the headline figures head the view: the first card, above the rows
    cards = b.js("return [...document.querySelectorAll('.view-compare > .card')].map((c) => c.id);")
    assert cards == ["compare-summary", "compare-ops", "compare-kernels"]
    ops = table_in(b, "#compare-ops")
    first = rows(ops)
    assert [(r["op_name"], r["direction"], r["presence"]) for r in first] == [
        (r[0], r[1], r[3]) for r in env.report["Op Diff"][1 : len(first) + 1]
    ]
    header, *exported = exported_csv(b, ops)
    assert header == env.report["Op Diff"][0] and len(exported) == len(env.report["Op Diff"]) - 1
    b.screenshot("compare_kept_baseline.png")
    # a run with two aggregations and no kept baseline: its previous aggregation
    select_run(b, "compare/training/dlprof")
    goto_compare(b)
    b.wait(lambda d: b.js("return document.querySelector('.view-compare').dataset.ready") == "1", 30, "compare")
    assert b.js("return document.getElementById('compare-base-run').value") == "compare/training/dlprof"
    assert b.js("return document.getElementById('compare-base-aggr').value") == "1"
    # one aggregation, no kept baseline: nothing is compared until a baseline is chosen
    select_run(b, "compare/before/dlprof")
    goto_compare(b)
    b.wait_text("#compare-summary", "Choose the run", 30)
    assert b.js("return document.getElementById('compare-base-run').value") == "__none__"


def test_two_aggregations_of_one_run(env):
    """The training profile aggregated over its 4 iterations (baseline, #1) and over iterations 1..2 (#2): each
    op of the loop runs 3 times in #1 and 2 times in #2, so its GPU time is 2/3 of the baseline's."""
    b = env.b
    ops_dt, kernels_dt = open_compare(b, "compare/training/dlprof", "compare/training/dlprof", "1")
    assert b.css("#compare-summary tbody tr[data-key=aggregated_iterations]").text.split()[-3:] == ["4", "2", "−2"]
    header, *exported = exported_csv(b, ops_dt)
    col = {name: i for i, name in enumerate(header)}
    with_gpu = [r for r in exported if int(r[col["Baseline GPU Time (ns)"]]) > 0]
    assert len(with_gpu) == 7  # to, conv2d, relu, linear, their two backward ops and add_ launch GPU work
    for r in with_gpu:
        assert r[col["Present In"]] == "both"
        assert (int(r[col["No. Calls"]]), int(r[col["Baseline No. Calls"]])) == (2, 3)
        assert 3 * int(r[col["GPU Time (ns)"]]) == 2 * int(r[col["Baseline GPU Time (ns)"]])
    kernel_rows = {r["kernel_name"]: r for r in rows(kernels_dt)}
    # SGEMM: 8 us forward + 8 us backward per loop -> 2 loops 32 us, 3 loops 48 us
    assert kernel_rows["volta_sgemm_32x32_sliced1x4_tn"]["delta"] == "−16 µs"


def test_the_baseline_is_kept_in_the_url(env):
    b = env.b
    open_compare(b, "compare/after/dlprof", "compare/before/dlprof")
    assert "p.dlprof.base_run=compare%2Fbefore%2Fdlprof" in b.js("return window.parent.location.hash;")
    reopen(b)
    b.wait(
        lambda d: b.js(
            "return document.querySelector('.view-compare') && "
            "document.querySelector('.view-compare').dataset.ready === '1'"
        ),
        30,
        "compare after reload",
    )
    assert b.js("return document.getElementById('compare-base-run').value") == "compare/before/dlprof"
    assert b.css("#run-select").get_attribute("value") == "compare/after/dlprof"


def test_a_late_answer_for_the_previous_baseline_does_not_replace_the_chosen_one(env):
    """The view opens on the URL's baseline and the user picks another before its answers arrive: the slow
    answers (held back here by wrapping fetch until the chosen baseline is shown) must not bring the first
    baseline back."""
    b = env.b
    open_compare(b, "compare/after/dlprof", "compare/training/dlprof")
    b.click("button.nav-item[data-view=dashboard]")
    b.js(
        "const real = window.fetch; let held = 0; const releases = [];"
        "window.__release = () => { window.__released = true; releases.forEach((ok) => ok()); };"
        "window.fetch = (url, opts) => {"
        "  const u = String(url);"
        "  if ((u.includes('/aggregations') || u.includes('/compare')) && u.includes('training')"
        "      && held < 4 && !window.__released) {"
        "    held += 1;"
        "    return new Promise((ok) => releases.push(ok)).then(() => real(url, opts))"
        "      .then((r) => { window.__answered = (window.__answered || 0) + 1; return r; });"
        "  }"
        "  return real(url, opts);"
        "};"
        "window.__restoreFetch = () => { window.fetch = real; };"
        "window.__held = () => held;"
    )
    try:
        goto_compare(b)
        from selenium.webdriver.support.ui import Select

        Select(b.css("#compare-base-run")).select_by_value("compare/before/dlprof")
        b.wait(
            lambda d: b.js(
                "return document.querySelector('.view-compare').dataset.ready === '1' && "
                "document.getElementById('compare-after').textContent.includes('baseline: compare/before/dlprof')"
            ),
            30,
            "the chosen baseline's comparison",
        )
        assert b.js("return window.__held()") > 0  # the first baseline's answers are still outstanding
        b.js("window.__release();")
        # the held answers for training/dlprof arrive (and are dropped): wait until each was answered
        b.wait(lambda d: b.js("return (window.__answered || 0) === window.__held()"), 30, "the held answers")
        assert "baseline: compare/before/dlprof" in b.css("#compare-after").text
        assert b.js("return document.getElementById('compare-base-run').value") == "compare/before/dlprof"
        assert "p.dlprof.base_run=compare%2Fbefore%2Fdlprof" in b.js("return window.parent.location.hash;")
    finally:
        b.js("window.__restoreFetch && window.__restoreFetch();")
