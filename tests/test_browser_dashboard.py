"""The DLPROF tab's Dashboard in a real headless Chromium, inside a real TensorBoard.

Figures are read from the DLProf database the UI reads (sqlite3) and formatted as format.js does, so the
tests check what a user sees against the source of truth.
"""

from __future__ import annotations

import random
import sqlite3
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from dlprof_plugin.terms import TERMS
from tests.browser import (
    ARTIFACTS,
    fmt_int,
    fmt_ns,
    fmt_pct,
    free_port,
    query,
    requires_browser,
    wait_for_server,
)
from tests.profiles import make_logdir

pytestmark = [pytest.mark.browser, requires_browser]

RUN = "dashboard/training/dlprof"
PANELS = [
    "panel-gpu-utilization",
    "panel-performance",
    "panel-tensor-core",
    "panel-op-summary",
    "panel-kernel-summary",
    "panel-iterations",
    "panel-top-ops",
    "panel-system",
    "panel-recommendations",
    "panel-guidance",
]
SCREENSHOT_LIMIT = 1_000_000  # bytes: a full-page PNG; the committed copy in docs/ is reduced by hand


@pytest.fixture(scope="module")
def env(tmp_path_factory, tensorboard, browser, training_run):
    logdir = make_logdir(tmp_path_factory.mktemp("dashboard") / "logdir", {"training": training_run})
    db = tensorboard.publish("dashboard", logdir) / "training" / "dlprof_dldb.sqlite"
    b = browser.fresh()
    b.open_dlprof(tensorboard.url, run=RUN)
    b.wait_css("#panel-top-ops tbody tr", 30)
    return SimpleNamespace(tb=tensorboard, b=b, db=db)


@pytest.fixture
def dash(env):
    """The Dashboard view, details pane closed."""
    b = env.b
    if b.js("return document.getElementById('view').dataset.view") == "dashboard":
        b.click("button.nav-item[data-view=gpus]")  # leave and come back: a fresh Dashboard
    b.click("button.nav-item[data-view=dashboard]")
    b.wait_css("#panel-top-ops tbody tr")
    return env


def newest_summary(db: Path) -> dict:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    con.row_factory = sqlite3.Row
    try:
        return dict(
            con.execute(
                "SELECT m.* FROM model_summary m JOIN read_only_domains d ON d.domain_id = m.domain_id "
                "WHERE d.is_primary = 1 ORDER BY m.aggr_id DESC LIMIT 1"
            ).fetchone()
        )
    finally:
        con.close()


def metric_text(b, key: str) -> str:
    return b.css(f"[data-metric={key}] .metric-value").text


def test_performance_summary_shows_the_database_figures(dash):
    b, sm = dash.b, newest_summary(dash.db)
    # training_profile's docstring: the first event at 1_000_000, the last sync ends at 1_290_000; busy
    # 3 x 37_000 ns
    assert sm["wall_time"] == 290_000
    assert metric_text(b, "wall_time") == fmt_ns(sm["wall_time"]) == "290 µs"
    assert metric_text(b, "gpu_utilization") == fmt_pct(sm["gpu_utilization"]) == "38.3 %"
    assert metric_text(b, "tc_utilization") == fmt_pct(sm["tc_utilization"]) == "50.0 %"
    assert metric_text(b, "iter_total") == fmt_int(sm["iter_total"]) == "4"
    assert metric_text(b, "iter_aggregated") == "4"
    assert metric_text(b, "avg_iteration_time") == fmt_ns(sm["avg_iteration_time"])
    assert metric_text(b, "iteration_time_std_dev") == fmt_ns(sm["iteration_time_std_dev"])
    # the steady figures lead: iterations 1 and 2 (100 us each) are complete, 0 and 3 partial
    assert sm["median_iteration_time"] == 100_000
    assert metric_text(b, "median_iteration_time") == fmt_ns(100_000) == "100 µs"
    assert metric_text(b, "complete_iterations") == "1 – 2 (2); partial: 0, 3"
    assert "after the last key node" in b.css("[data-metric=complete_iterations]").get_attribute("title")
    assert "Optimizer.step#SGD.step" in b.css("[data-metric=key_node]").text
    # exact value and the metric's definition as tooltips
    assert b.css("[data-metric=wall_time] .metric-value").get_attribute("title") == "290,000 ns"
    assert b.css("[data-metric=wall_time]").get_attribute("title") == TERMS["wall_time"].definition
    assert "Tensor Core kernels" in b.css("[data-metric=tc_utilization]").get_attribute("title")


def test_all_ten_panels_render(dash):
    b, sm = dash.b, newest_summary(dash.db)
    for panel in PANELS:
        assert b.css(f"#{panel}").is_displayed(), panel
    # GPU utilization pie: the seven classes with the database's percentages, utilization in the middle
    pie = b.css("#panel-gpu-utilization")
    assert pie.find_element("css selector", ".donut-center").text == fmt_pct(sm["gpu_utilization"])
    legend = {li.get_attribute("data-key"): li.text for li in pie.find_elements("css selector", ".legend li")}
    assert set(legend) == {"tc", "non_tc", "memory", "dataloader", "io", "cpu", "other"}
    assert legend["tc"].endswith(fmt_pct(sm["tc_duration_pct"]))
    assert legend["other"].endswith(fmt_pct(sm["other_duration_pct"]))
    assert pie.find_elements("css selector", "path.slice")
    # op and kernel summaries: the summary report's All Ops / All Kernels rows
    ops_all = b.css("#panel-op-summary tr[data-row=ops_all]").text
    assert fmt_ns(sm["ops_all_gpu"]) in ops_all and fmt_ns(sm["ops_all_cpu"]) in ops_all
    assert ops_all.split()[-1] == str(sm["ops_all_count"]) == "8"
    kernels_tc = b.css("#panel-kernel-summary tr[data-row=kernels_tc]").text
    assert fmt_ns(sm["kernels_tc_gpu"]) in kernels_tc and kernels_tc.split()[-1] == str(sm["kernels_tc_count"])
    # Tensor Core efficiency
    tc = b.css("#panel-tensor-core")
    assert tc.find_element("css selector", ".donut-center").text == "50.0 %"
    eligible = query(dash.db, "SELECT count(*) FROM op_nodes WHERE aggr_id = ? AND tc_eligible != 0", (sm["aggr_id"],))
    assert tc.find_element("css selector", "[data-metric=eligible_ops] .metric-value").text == str(eligible[0][0])
    # iteration summary: one bar per iteration, the aggregated range marked
    bars = b.all("#panel-iterations g.bar")
    assert [g.get_attribute("data-iteration") for g in bars] == ["0", "1", "2", "3"]
    assert "Aggregated: iterations 0–3" in b.css("#panel-iterations .range-label").text
    assert b.all("#panel-iterations g.bar rect.seg-tc") and not b.all("#panel-iterations g.bar.outside")
    # system configuration from the database
    system = b.css("#panel-system").text
    gpu_name = query(dash.db, "SELECT name FROM read_only_gpu_infos")[0][0]
    assert gpu_name in system and "Test CPU @ 2.00GHz" in system and "535.104.05" in system
    # recommendations and guidance
    assert b.css("#panel-recommendations .card-body").text
    assert b.all("#panel-guidance li")


def test_top_ten_first_row_is_the_op_with_the_most_gpu_time(dash):
    b, sm = dash.b, newest_summary(dash.db)
    expected = query(
        dash.db,
        "SELECT o.op_id, o.op_name, o.direction, n.gpu_total FROM op_nodes n "
        "JOIN read_only_ops o ON o.op_index = n.op_index WHERE n.aggr_id = ? "
        "ORDER BY n.gpu_total DESC, n.op_index LIMIT 10",
        (sm["aggr_id"],),
    )
    rows = b.all("#panel-top-ops tbody tr")
    assert len(rows) == len(expected) == 8
    first = rows[0]
    cell = lambda row, key: row.find_element("css selector", f"td[data-key={key}]").text  # noqa: E731
    assert (cell(first, "op_id"), cell(first, "op_name"), cell(first, "direction")) == (
        "CONV2D_1",
        "/aten::conv2d",
        "fprop",
    )
    assert expected[0][:3] == ("CONV2D_1", "/aten::conv2d", "fprop")
    assert cell(first, "gpu_total") == fmt_ns(expected[0][3]) == "30 µs"
    assert [cell(r, "op_id") for r in rows] == [e[0] for e in expected]
    assert "GPU time" in b.css("#panel-top-ops thead th[title*='GPU time']").get_attribute("title")


def test_selecting_a_top_op_fills_the_details_pane(dash):
    b = dash.b
    b.click("#panel-top-ops tbody tr:first-child")
    details = b.wait_css("#op-details", visible=True)
    b.wait_text("#op-details [data-field=op_id]", "CONV2D_1")
    assert b.css("#op-details [data-field=op_type]").text == "conv2d"
    assert b.css("#op-details [data-field=using_tc]").text == "Yes"
    op_index, cpu_total, gpu_avg = query(
        dash.db,
        "SELECT n.op_index, n.cpu_total, n.gpu_avg FROM op_nodes n JOIN "
        "read_only_ops o ON o.op_index = n.op_index WHERE o.op_id = 'CONV2D_1' "
        "ORDER BY n.aggr_id DESC LIMIT 1",
    )[0]
    stats = details.find_element("css selector", "table.stats").text
    assert f"CPU Time {fmt_ns(cpu_total)}" in stats and fmt_ns(gpu_avg) in stats
    kernels = query(
        dash.db, "SELECT kernel_name FROM view_kernel_summaries WHERE op_index = ? ORDER BY gpu_total DESC", (op_index,)
    )
    table = b.wait_css("#op-details .datatable[data-state=ready]")
    rows = table.find_elements("css selector", "tbody tr[data-key]")
    assert [r.find_element("css selector", "td[data-key=kernel_name]").text for r in rows] == [k[0] for k in kernels]
    rows[0].click()
    b.wait_text("#kernel-details", kernels[0][0])
    assert b.css("#kernel-details [data-field=uses_tc]").text == "Yes"
    b.click("#details-pane button[aria-label='Close details']")
    b.wait(lambda d: not b.css("#details-pane").is_displayed(), what="details pane closed")


def test_navigation_pane_selectors_are_labelled(dash):
    b = dash.b
    for sel, label in (("run-select", "Run"), ("domain-select", "Domain"), ("aggr-select", "Aggregation")):
        assert b.css(f"label[for={sel}]").get_attribute("textContent") == label
        assert b.css(f"#{sel}").tag_name == "select"
    assert b.js("return document.getElementById('run-select').value") == RUN
    assert b.js("return document.getElementById('domain-select').value") == "default"
    assert len(b.all("#aggr-select option")) == 1
    views = b.all("nav.views .nav-item")
    assert [v.tag_name for v in views] == ["button"] * len(views) and len(views) >= 8
    assert b.css("nav.views .nav-item[aria-current=page]").text == "Dashboard"


def test_units_are_humane_and_match_the_test_formatter(dash):
    """format.js in the browser and tests/browser.py's formatter agree (so the other tests' expectations hold)."""
    b = dash.b
    rng = random.Random(7)
    values = (
        [
            0,
            1,
            999,
            1000,
            1500,
            30_000,
            322_500,
            506_779.044554922,
            999_999,
            1_000_000,
            1_290_000,
            2.5e9,
            12_345_678_901,
            0.5,
            99.995,
        ]
        + [rng.uniform(0, 1e10) for _ in range(40)]
        + [rng.randrange(10**7) for _ in range(40)]
    )
    out = b.driver.execute_async_script(
        """
        const [values, done] = arguments;
        import(new URL("./format.js", document.baseURI).href).then((f) => done({
          ns: values.map(f.fmtNs), pct: values.map((v) => f.fmtPct(v / 1e6)), int: values.map(f.fmtInt)}));
    """,
        values,
    )
    assert out["ns"][:4] == ["0 ns", "1 ns", "999 ns", "1 µs"]
    assert out["ns"][5:7] == ["30 µs", "322.5 µs"] and out["ns"][10] == "1.29 ms" and out["ns"][11] == "2.5 s"
    assert out["ns"][12] == "12.35 s" and out["int"][12] == "12,345,678,901"
    assert out["ns"] == [fmt_ns(v) for v in values]
    assert out["pct"] == [fmt_pct(v / 1e6) for v in values]
    assert out["int"] == [fmt_int(v) for v in values]


def test_dashboard_screenshot(dash):
    """test-artifacts/dashboard.png; docs/screenshots/dashboard.png (shown by the README, < 300 KB) is a copy of
    one of these, refreshed by hand so test runs do not touch tracked files."""
    b = dash.b
    b.wait_css("#panel-iterations g.bar")
    path = b.screenshot("dashboard.png")
    if path.stat().st_size > SCREENSHOT_LIMIT:
        path = b.screenshot("dashboard.png", scale=0.75)
    assert path == ARTIFACTS / "dashboard.png"
    assert 10_000 < path.stat().st_size < SCREENSHOT_LIMIT


def test_dlprofviewer_serves_the_same_ui_standalone(env, tmp_path):
    """`dlprofviewer <database> --port N`: the same module and routes without TensorBoard."""
    port = free_port()
    exe = Path(sys.executable).with_name("dlprofviewer")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "dlprof_plugin.viewer"]
    log = open(tmp_path / "viewer.log", "w")
    proc = subprocess.Popen(cmd + [str(env.db), "--port", str(port), "--quiet"], stdout=log, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}/"
        try:
            wait_for_server(url + "data/plugin/dlprof/runs", proc, what="dlprofviewer to start")
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {(tmp_path / 'viewer.log').read_text()}") from None
        b = env.b
        b.console()  # read: only this page's messages are checked
        b.driver.switch_to.default_content()
        b.driver.get(url)
        b.wait_css("[data-metric=wall_time] .metric-value", 30)
        assert b.css("[data-metric=wall_time] .metric-value").text == fmt_ns(newest_summary(env.db)["wall_time"])
        assert b.css("#panel-top-ops tbody tr td[data-key=op_id]").text == "CONV2D_1"
        b.click("button.nav-item[data-view=ops_kernels]")
        dt = b.wait_css("#ops .datatable[data-state=ready]")
        assert "of 8 entries" in dt.find_element("css selector", ".dt-info").text
        errors = [m for m in b.console() if "SEVERE" in m and "favicon.ico" not in m]
        assert not errors, errors
    finally:
        env.b.open_dlprof(env.tb.url, run=RUN)  # back in TensorBoard for the module's other tests
        proc.terminate()
        proc.wait(timeout=10)
        log.close()


def test_gpu_breakdown_panel_matches_the_report(dash, tmp_path, training_export):
    """The GPU Time Breakdown panel shows the gpu_breakdown report's GPU row and the summary report's
    communication lines (the same export analysed again with those reports)."""
    import csv

    from tests.profiles import run_dlprof

    run_dlprof(
        f"--database={training_export}", f"--output_path={tmp_path}", "--reports=summary,gpu_breakdown", "-v", "quiet"
    )
    lines = (tmp_path / "dlprof_gpu_breakdown.csv").read_text().splitlines()
    header = lines.index("GPUs") + 1
    (row,) = [r for r in csv.DictReader(lines[header : lines.index("", header)])]
    summary = dict(r[:2] for r in csv.reader((tmp_path / "dlprof_summary.csv").read_text().splitlines()) if len(r) >= 2)
    b = dash.b
    panel = b.css("#panel-gpu-breakdown")
    cells = {
        td.get_attribute("data-key"): td
        for td in panel.find_elements("css selector", f"tr[data-device='{row['Device']}'] td[data-key]")
    }
    columns = {
        "computation_busy": "Computation Busy (ns)",
        "communication_busy": "Communication Busy (ns)",
        "memory_busy": "Memory Busy (ns)",
        "overlapped_communication": "Overlapped Communication (ns)",
        "gpu_idle": "GPU Idle (ns)",
        "host_wait": "Idle Host Wait (ns)",
        "kernel_wait": "Idle Kernel Wait (ns)",
        "other_wait": "Idle Other (ns)",
    }
    assert set(cells) == set(columns)
    for key, label in columns.items():
        assert cells[key].text == fmt_ns(int(row[label])), key
        assert cells[key].get_attribute("title") == f"{int(row[label]):,} ns", key
    # the training profile's GPU: busy 3 x 37,000 ns of the 290,000 ns window; no collective kernels
    assert int(row["GPU Busy (ns)"]) == 111_000 and int(row["GPU Idle (ns)"]) == 290_000 - 111_000
    assert int(row["Idle Host Wait (ns)"]) + int(row["Idle Kernel Wait (ns)"]) + int(row["Idle Other (ns)"]) == 179_000
    assert metric_text(b, "communication_time") == fmt_ns(int(summary["Communication Time (ns)"]))
    assert metric_text(b, "overlapped_communication_pct") == fmt_pct(float(summary["Overlapped Communication %"]))
