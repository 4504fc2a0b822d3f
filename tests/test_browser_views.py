"""The DLPROF tab's views, data tables, exports and re-aggregation in a real headless Chromium inside a real
TensorBoard. Expected values come from the DLProf databases (sqlite3) and from the engine itself."""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from tests.browser import (
    ARTIFACTS,
    fmt_int,
    fmt_ns,
    fmt_offset_ns,
    fmt_pct,
    query,
    requires_browser,
)
from tests.nsys_builder import NsysExport
from tests.profiles import make_logdir, run_dlprof

pytestmark = [pytest.mark.browser, requires_browser]

BIG_OPS = 100_000
VIEWS = {
    "dashboard": "#panel-top-ops tbody tr",
    "op_types": "#op-types .datatable[data-state=ready]",
    "ops_kernels": "#ops .datatable[data-state=ready]",
    "kernels_by_iteration": "#iterations-table .datatable[data-state=ready]",
    "kernels_by_op": "#kbo-iterations .datatable[data-state=ready]",
    "iterations": "#iterations-chart g.bar",
    "tensor_core": "#tensor-core .datatable[data-state=ready]",
    "gpus": "#gpu-properties tbody tr",
    "group_ops": "#group-tree tr.tree-row",
}


# ---------------------------------------------------------------------------- profiles


def stack_profile(path: Path) -> Path:
    """Two iterations of one conv2d with nvidia_dlprof_pytorch_nvtx-style markers (traceMarker / mod-op dict /
    aten range), so the op carries a long Python stack trace."""
    exp = NsysExport(schema="2022.4")
    exp.add_gpu(device_id=0)
    tid = exp.add_thread(pid=7, tid=7, name="python", process_name="python")
    frames = [f"/home/user/project/train.py:{40 + i}: in <module> step_{i}()" for i in range(4)]
    frames.append("/home/user/project/model.py:88: in forward: x = self.conv(x)")
    for i in range(2):
        t = 1_000_000 + i * 100_000
        exp.push_pop(
            tid,
            t,
            t + 20000,
            repr({"traceMarker": frames, "funcStack": "Net::_call_impl/Net::forward/Conv2d::forward/conv2d"}),
        )
        exp.push_pop(
            tid, t + 100, t + 19900, repr({"mod": "torch.nn.functional", "op": "conv2d", "args": [], "dir": "fprop"})
        )
        exp.push_pop(tid, t + 200, t + 19800, f"aten::conv2d, seq = {i}, op_id = {i}")
        exp.launch(tid, t + 1000, t + 2000, t + 3000, t + 9000, kernel="volta_sgemm_128x64_nn")
        exp.push_pop(tid, t + 50000, t + 60000, "Optimizer.step#SGD.step")
    exp.set_session(start_time=0)
    return exp.write(path)


def big_profile(path: Path, n: int = BIG_OPS) -> Path:
    """n distinct ops: one iteration of n sibling `aten::relu` ranges (named /aten::relu, /aten::relu[2], ...),
    each launching one kernel. (benchmarks/bench_engine.py's generate() has only a few thousand distinct ops
    at 10^5 kernels: its op names repeat in every iteration.)"""
    exp = NsysExport(schema="2022.4")
    exp.add_gpu(device_id=0)
    tid = exp.add_thread(pid=9, tid=9, name="python", process_name="python")
    i = np.arange(n, dtype=np.int64)
    t = 1_000_000 + i * 10_000
    exp.push_pop_many(
        np.full(n, tid), t, t + 8000, np.array([f"aten::relu, seq = {k}, op_id = {k}" for k in range(n)], dtype=object)
    )
    exp.runtime_many(np.full(n, tid), t + 1000, t + 2000, np.full(n, "cudaLaunchKernel_v7000", dtype=object), i + 1)
    exp.kernels_many(
        np.full(n, 9),
        i + 1,
        t + 3000,
        t + 4000 + (i * 7919) % 5000,
        np.full(n, "vectorized_elementwise_kernel", dtype=object),
    )
    exp.set_session(start_time=0)
    return exp.write(path)


@pytest.fixture(scope="module")
def env(tmp_path_factory, tensorboard, browser, training_export, training_run):
    root = tmp_path_factory.mktemp("views")
    training = training_export
    logdir = make_logdir(
        root / "logdir",
        runs={
            "training": training_run,
            "reagg": training_run,
            "proposal": training_run,
            "stack": stack_profile(root / "stack.sqlite"),
            "big": big_profile(root / "big.sqlite"),
        },
    )
    run_dlprof(
        f"--database={training}", f"--output_path={logdir / 'plain'}", "--reports=summary", "-v", "quiet", "--mode=nvtx"
    )
    logdir = tensorboard.publish("views", logdir)
    b = browser.fresh()
    b.open_dlprof(tensorboard.url, run="views/big/dlprof")
    b.wait_css("#view .view", 30)
    return SimpleNamespace(
        tb=tensorboard,
        b=b,
        root=root,
        logdir=logdir,
        training=training,
        db=lambda run: logdir / run / "dlprof_dldb.sqlite",
    )


# ---------------------------------------------------------------------------- helpers


def select_run(b, run: str):
    # the run list is re-rendered when TensorBoard reports new runs: b.choose tries a stale <select> again
    if b.js("return document.getElementById('run-select').value") != run:
        b.choose("#run-select", run)
    b.wait(
        lambda d: (
            b.js("return document.getElementById('run-select').value") == run
            and run in b.css(".view-subtitle").text
            and b.all("#view .view")
        ),
        what=f"run {run}",
    )


def goto(b, view: str):
    """Open a view (re-mounted even when it is the current one) and wait until it has loaded."""
    if b.js("return document.getElementById('view').dataset.view") == view:
        b.click("button.nav-item[data-view=dashboard]" if view != "dashboard" else "button.nav-item[data-view=gpus]")
    b.click(f"button.nav-item[data-view={view}]")
    b.wait_css(VIEWS[view], 20)
    assert not b.all(".error-item"), [e.text for e in b.all(".error-item")]


def renders(dt) -> int:
    return int(dt.get_attribute("data-renders") or 0)


def wait_table(b, dt, after: int | None = None, timeout: float = 15.0):
    """Wait until a data table has rendered (more than `after` times when given)."""
    b.wait(
        lambda d: dt.get_attribute("data-state") == "ready" and (after is None or renders(dt) > after),
        timeout,
        "table rendered",
    )
    return dt


def table_in(b, css: str):
    return wait_table(b, b.wait_css(f"{css} .datatable"))


def rows(dt) -> list[dict]:
    """Visible rows as {column key: cell text} (one script call: fast even for 100-row pages)."""
    return dt.parent.execute_script(
        "return [...arguments[0].querySelectorAll('tbody tr[data-key]')].map((tr) => Object.fromEntries("
        "[...tr.querySelectorAll('td')].map((td) => [td.dataset.key, td.innerText.trim()])));",
        dt,
    )


def headers(dt) -> list[str]:
    return [
        th.get_attribute("textContent").replace("↕", "").replace("▲", "").replace("▼", "").strip()
        for th in dt.find_elements("css selector", "thead tr.dt-head th")
    ]


def info(dt) -> str:
    return dt.find_element("css selector", ".dt-info").text


def set_value(b, el, value: str):
    """Type into an input the way a user does (value + input event)."""
    b.js(
        "arguments[0].value = arguments[1]; arguments[0].dispatchEvent(new Event('input', {bubbles: true}));", el, value
    )


def search(b, dt, value: str, column: str | None = None):
    before = renders(dt)
    box = dt.find_element("css selector", f".dt-col-search[data-key={column}]" if column else "input.dt-search")
    set_value(b, box, value)
    return wait_table(b, dt, before)


def click_and_wait(b, dt, el):
    before = renders(dt)
    started = time.perf_counter()
    b.js("arguments[0].click();", el)
    wait_table(b, dt, before)
    return time.perf_counter() - started


def sort_button(dt, key: str):
    return dt.find_element("css selector", f"thead th[data-key={key}] button.dt-sort")


def select_row(b, dt, column: str, text: str, timeout: float = 10.0):
    """Click the row whose cell in column reads text (waiting for it to be listed), on that cell, as a user
    does (a row can be wider than the table's box, which scrolls sideways)."""

    def find(d):
        for tr in dt.find_elements("css selector", "tbody tr[data-key]"):
            if tr.find_element("css selector", f"td[data-key={column}]").text == text:
                return tr
        return False

    tr = b.wait(find, timeout, f"a row with {column} = {text!r}")
    cell = tr.find_element("css selector", f"td[data-key={column}]")
    b.js("arguments[0].scrollIntoView({block: 'center', inline: 'nearest'});", cell)
    cell.click()
    return tr


def aggr_id(db: Path, newest: bool = True) -> int:
    return query(db, f"SELECT {'max' if newest else 'min'}(aggr_id) FROM aggregations")[0][0]


# ---------------------------------------------------------------------------- views


def test_every_view_renders(env):
    b = env.b
    select_run(b, "views/training/dlprof")
    for view in VIEWS:
        goto(b, view)
        assert b.css(".view-title").text == b.css(f"button.nav-item[data-view={view}]").text
        b.screenshot(f"view_{view}.png")


def test_op_type_summary_shows_every_statistic_per_op_type(env):
    b, db = env.b, env.db("training")
    select_run(b, "views/training/dlprof")
    goto(b, "op_types")
    dt = table_in(b, "#op-types")
    expected = query(
        db,
        "SELECT op_type, num_ops, num_calls, cpu_total, gpu_total, gpu_avg, idle_max "
        "FROM op_type_metrics WHERE aggr_id = ? ORDER BY gpu_total DESC, op_type",
        (aggr_id(db),),
    )
    got = rows(dt)
    assert [r["op_type"] for r in got] == [e[0] for e in expected]
    for r, (_op_type, num_ops, num_calls, cpu_total, gpu_total, gpu_avg, idle_max) in zip(got, expected):
        assert (r["num_ops"], r["num_calls"]) == (fmt_int(num_ops), fmt_int(num_calls))
        assert (r["cpu_total"], r["gpu_total"], r["gpu_avg"], r["idle_max"]) == (
            fmt_ns(cpu_total),
            fmt_ns(gpu_total),
            fmt_ns(gpu_avg),
            fmt_ns(idle_max),
        )
    labels = headers(dt)
    for stat in ("CPU Time", "GPU Time", "CPU Overhead", "GPU Idle"):
        for agg in ("Total", "Avg.", "Min", "Max"):
            assert f"{agg} {stat}" in labels
    assert f"of {len(expected)} entries" in info(dt)


def test_ops_and_kernels_selecting_an_op_fills_its_kernels(env):
    b, db = env.b, env.db("training")
    select_run(b, "views/training/dlprof")
    goto(b, "ops_kernels")
    ops = table_in(b, "#ops")
    kernels = b.css("#op-kernels .datatable")
    assert "Select an op" in kernels.text
    before = renders(kernels)
    select_row(b, ops, "op_id", "LINEAR_2")
    wait_table(b, kernels, before)
    op_index = query(db, "SELECT op_index FROM read_only_ops WHERE op_id = 'LINEAR_2'")[0][0]
    expected = query(
        db,
        "SELECT kernel_name, num_calls, gpu_total, api_total FROM view_kernel_summaries "
        "WHERE aggr_id = ? AND op_index = ? ORDER BY gpu_total DESC",
        (aggr_id(db), op_index),
    )
    got = rows(kernels)
    assert [(r["kernel_name"], r["num_calls"], r["gpu_total"], r["api_total"]) for r in got] == [
        (k, fmt_int(n), fmt_ns(g), fmt_ns(a)) for k, n, g, a in expected
    ]
    assert got[0]["direction"] == "bprop" and got[0]["op_id"] == "LINEAR_2"
    assert "Kernels of LINEAR_2" in b.css("#op-kernels .card-title").text
    # the details pane shows the op; a kernel row shows the kernel
    b.wait_text("#op-details [data-field=op_id]", "LINEAR_2")
    select_row(b, kernels, "kernel_name", expected[0][0])
    b.wait_text("#kernel-details", expected[0][0])


def iteration_bounds(db: Path, iteration: int) -> tuple[int, int]:
    return query(
        db,
        "SELECT start_time, stop_time FROM iteration_summary WHERE aggr_id = ? AND iter_value = ?",
        (aggr_id(db), iteration),
    )[0]


def test_kernels_by_iteration(env):
    b, db = env.b, env.db("training")
    select_run(b, "views/training/dlprof")
    goto(b, "kernels_by_iteration")
    its = table_in(b, "#iterations-table")
    expected = query(
        db,
        "SELECT iter_value, start_time, duration, kernels, tc_kernels, kernel_time_per_gpu, "
        "tc_kernel_time_per_gpu FROM iteration_summary WHERE aggr_id = ? ORDER BY iter_value",
        (aggr_id(db),),
    )
    got = rows(its)
    assert [r["iteration"] for r in got] == [str(e[0]) for e in expected] == ["0", "1", "2", "3"]
    for r, (_it, start, duration, kernels, tc_kernels, kt, tct) in zip(got, expected):
        assert (r["start"], r["duration"], r["kernels"], r["tc_kernels"]) == (
            fmt_ns(start),
            fmt_ns(duration),
            fmt_int(kernels),
            fmt_int(tc_kernels),
        )
        pct = 100 * kt / duration if duration else 0
        tc_pct = 100 * tct / kt if kt else 0
        assert r["kernel_time_per_gpu"] == f"{fmt_ns(kt)} ({fmt_pct(pct)})"
        assert r["tc_kernel_time_per_gpu"] == f"{fmt_ns(tct)} ({fmt_pct(tc_pct)})"
    assert got[1]["kernel_time_per_gpu"] == "36 µs (36.0 %)"
    bar = its.find_element("css selector", "tbody tr[data-key='1'] td[data-key=kernel_time_per_gpu] .progress-fill")
    assert bar.get_attribute("style").replace(" ", "") == "width:36%;"

    kernels = b.css("#iteration-kernels .datatable")
    before = renders(kernels)
    select_row(b, its, "iteration", "1")
    wait_table(b, kernels, before)
    start, stop = iteration_bounds(db, 1)
    launches = query(
        db,
        'SELECT g.name, g.start, g."end" - g.start FROM read_only_activity_owners w '
        "JOIN read_only_gpu_activities g ON g.activity_id = w.activity_id WHERE w.launch_time >= ? "
        "AND w.launch_time < ? AND g.kind = 0 ORDER BY g.start",
        (start, stop),
    )
    got = rows(kernels)
    assert len(got) == len(launches) == 6
    # kernel starts from the iteration's start, to the nanosecond (issue 15, item 8)
    assert [(r["kernel_name"], r["gpu_start_offset"], r["gpu_duration"]) for r in got] == [
        (n, fmt_offset_ns(s - start), fmt_ns(d)) for n, s, d in launches
    ]
    assert "Kernels of iteration 1" in b.css("#iteration-kernels .card-title").text


def test_kernels_by_op(env):
    b, db = env.b, env.db("training")
    select_run(b, "views/training/dlprof")
    goto(b, "kernels_by_op")
    its = table_in(b, "#kbo-iterations")
    ops = b.css("#kbo-ops .datatable")
    before = renders(ops)
    select_row(b, its, "iteration", "2")
    wait_table(b, ops, before)
    start, stop = iteration_bounds(db, 2)
    expected = query(
        db,
        "SELECT o.op_id, count(*), sum(i.gpu_time) FROM read_only_op_instances i JOIN read_only_ops o "
        "ON o.op_index = i.op_index WHERE i.start >= ? AND i.start < ? GROUP BY i.op_index "
        "ORDER BY sum(i.gpu_time) DESC, i.op_index",
        (start, stop),
    )
    got = rows(ops)
    assert [(r["op_id"], r["calls"], r["gpu_time"]) for r in got] == [
        (o, fmt_int(c), fmt_ns(g)) for o, c, g in expected
    ]
    kernels = b.css("#kbo-kernels .datatable")
    before = renders(kernels)
    select_row(b, ops, "op_id", "CONV2D_1")
    wait_table(b, kernels, before)
    got = rows(kernels)
    assert len(got) == 1
    assert got[0]["kernel_name"].startswith("volta_fp16_s884cudnn_fp16_128x128")
    first_kernel = query(
        db,
        "SELECT min(g.start) FROM read_only_gpu_activities g JOIN read_only_activity_owners w "
        "ON w.activity_id = g.activity_id JOIN read_only_op_instances i ON i.domain_id = w.domain_id "
        "AND i.instance_id = w.instance_id JOIN read_only_ops o ON o.op_index = i.op_index "
        "WHERE o.op_id = 'CONV2D_1' AND i.start >= ? AND i.start < ?",
        (start, stop),
    )[0][0]
    assert got[0]["gpu_start_offset"] == fmt_offset_ns(first_kernel - start)
    assert "CONV2D_1 in iteration 2" in b.css("#kbo-kernels .card-title").text


def test_gpus_view(env):
    b, db = env.b, env.db("training")
    select_run(b, "views/training/dlprof")
    goto(b, "gpus")
    name, major, minor, sms, memory = query(
        db, "SELECT name, compute_major, compute_minor, sm_count, total_memory FROM read_only_gpu_infos"
    )[0]
    row = b.css("#gpu-properties tbody tr[data-device='0']").text
    assert name in row and f"{major}.{minor}" in row and str(sms) in row and "39.59 GiB" in row
    util = query(db, "SELECT gpu_utilization FROM device_utilization WHERE aggr_id = ?", (aggr_id(db),))[0][0]
    assert b.css("#gpu-utilization .gpu-row[data-device='0'] .gpu-util").text == fmt_pct(util) == "38.3 %"
    segments = b.all("#gpu-utilization .gpu-row[data-device='0'] .hstack-seg")
    assert {s.get_attribute("data-key") for s in segments} >= {"tc", "non_tc", "other"}


def test_group_ops_hierarchy_expands(env):
    b, db = env.b, env.db("training")
    select_run(b, "views/training/dlprof")
    goto(b, "group_ops")
    top = [tr.get_attribute("data-name") for tr in b.all("#group-tree tr.tree-row")]
    assert top == sorted(
        n for (n,) in query(db, "SELECT name FROM group_ops WHERE aggr_id = ? AND level <= 0", (aggr_id(db),))
    )
    root = b.css("#group-tree tr.tree-row[data-name='/'] .tree-toggle")
    assert root.get_attribute("aria-expanded") == "false"
    root.click()
    child = b.wait_css("#group-tree tr.tree-row[data-name='/Optimizer.step#SGD.step/']")
    assert child.get_attribute("data-depth") == "1" and "Optimizer.step#SGD.step/" in child.text
    assert root.get_attribute("aria-expanded") == "true"
    root.click()
    b.wait(lambda d: not b.all("#group-tree tr.tree-row[data-name='/Optimizer.step#SGD.step/']"), what="collapsed")
    assert b.css("#group-tree tr.tree-row[data-name='_CompleteModel_'] .tree-toggle").get_attribute("disabled")
    flat = table_in(b, "#group-table")
    assert f"of {query(db, 'SELECT count(*) FROM group_ops WHERE aggr_id = ?', (aggr_id(db),))[0][0]} entries" in info(
        flat
    )


# ---------------------------------------------------------------------------- the data table


def test_search_filter_and_sort_on_the_server(env):
    b, db = env.b, env.db("training")
    select_run(b, "views/training/dlprof")
    goto(b, "ops_kernels")
    dt = table_in(b, "#ops")
    aggr = aggr_id(db)
    assert info(dt) == "Showing 1 to 8 of 8 entries"
    # global search over the text columns
    search(b, dt, "conv")
    assert info(dt) == "Showing 1 to 2 of 2 entries (filtered from 8 total entries)"
    assert {r["op_id"] for r in rows(dt)} == {"CONV2D_1", "CONV2D_2"}
    search(b, dt, "")
    # per-column search: 1/0 on yes/no columns, comparisons on numbers, contains on text
    search(b, dt, "1", column="using_tc")
    assert [r["using_tc"] for r in rows(dt)] == ["Yes", "Yes"]
    search(b, dt, "0", column="using_tc")
    n_not = query(db, "SELECT count(*) FROM op_nodes WHERE aggr_id = ? AND using_tc = 0", (aggr,))[0][0]
    assert len(rows(dt)) == n_not == 6 and {r["using_tc"] for r in rows(dt)} == {"No"}
    search(b, dt, "", column="using_tc")
    # durations with the unit the cells show; a plain number in the column's unit (µs here: its largest is 30 µs)
    n_big = query(db, "SELECT count(*) FROM op_nodes WHERE aggr_id = ? AND gpu_total > 20000", (aggr,))[0][0]
    for text in (">20us", ">0.02ms", ">20"):
        search(b, dt, text, column="gpu_total")
        assert len(rows(dt)) == n_big == 3, text
    assert dt.find_element("css selector", ".dt-col-search[data-key=gpu_total]").get_attribute("data-unit") == "µs"
    search(b, dt, "", column="gpu_total")
    # a malformed number search is explained at its filter, not as a page error; the rows stay; clearing it
    # recovers (issue 15, item 6; tests/test_browser_usability.py checks where the message is)
    set_value(b, dt.find_element("css selector", ".dt-col-search[data-key=gpu_total]"), "abc")
    b.wait(lambda d: dt.get_attribute("data-invalid") == "gpu_total", what="filter error")
    assert "N, >N, <N" in dt.find_element("css selector", "th[data-key=gpu_total] .dt-filter-error").text
    assert info(dt) == "Showing 1 to 8 of 8 entries" and not b.all(".error-item") and not b.all(".dt-error")
    set_value(b, dt.find_element("css selector", ".dt-col-search[data-key=gpu_total]"), "")
    b.wait(lambda d: dt.get_attribute("data-invalid") is None, what="filter error cleared")
    search(b, dt, "bprop", column="direction")
    assert {r["direction"] for r in rows(dt)} == {"bprop"}
    search(b, dt, "", column="direction")
    assert info(dt) == "Showing 1 to 8 of 8 entries"
    # default order: GPU time, largest first
    th = dt.find_element("css selector", "thead th[data-key=gpu_total]")
    assert th.get_attribute("aria-sort") == "descending"
    # numbers sort descending first, then ascending
    click_and_wait(b, dt, sort_button(dt, "cpu_avg"))
    assert dt.find_element("css selector", "thead th[data-key=cpu_avg]").get_attribute("aria-sort") == "descending"
    cpu = query(db, "SELECT cpu_avg FROM op_nodes WHERE aggr_id = ? ORDER BY cpu_avg DESC", (aggr,))
    assert [r["cpu_avg"] for r in rows(dt)] == [fmt_ns(v) for (v,) in cpu]
    click_and_wait(b, dt, sort_button(dt, "cpu_avg"))
    assert [r["cpu_avg"] for r in rows(dt)] == [fmt_ns(v) for (v,) in reversed(cpu)]
    # text sorts ascending first
    click_and_wait(b, dt, sort_button(dt, "op_id"))
    ids = [
        r[0]
        for r in query(
            db,
            "SELECT o.op_id FROM op_nodes n JOIN read_only_ops o ON o.op_index = n.op_index "
            "WHERE n.aggr_id = ? ORDER BY o.op_id",
            (aggr,),
        )
    ]
    assert [r["op_id"] for r in rows(dt)] == ids
    # page size
    from selenium.webdriver.support.ui import Select

    before = renders(dt)
    Select(dt.find_element("css selector", "select.dt-pagesize")).select_by_value("25")
    wait_table(b, dt, before)
    assert [o.text for o in Select(dt.find_element("css selector", "select.dt-pagesize")).options] == [
        "10",
        "25",
        "50",
        "100",
    ]


def test_exports_of_the_filtered_rows(env):
    b = env.b
    select_run(b, "views/training/dlprof")
    goto(b, "ops_kernels")
    dt = table_in(b, "#ops")
    search(b, dt, "conv")
    shown = sorted(r["op_id"] for r in rows(dt))
    downloads = b.download_dir

    def export(cls: str, suffix: str) -> Path:
        before = set(os.listdir(downloads))
        dt.find_element("css selector", f"button.{cls}").click()
        return b.wait_download(suffix, before=before)

    path = export("dt-csv", ".csv")
    table = list(csv.reader(path.read_text(encoding="utf-8").splitlines()))
    assert table[0][:3] == ["Op ID", "Op Name", "Direction"] and "Total GPU Time (ns)" in table[0]
    assert sorted(r[0] for r in table[1:]) == shown
    gpu = table[0].index("Total GPU Time (ns)")
    assert {r[0]: r[gpu] for r in table[1:]}["CONV2D_1"] == "30000"

    path = export("dt-json", ".json")
    doc = json.loads(path.read_text(encoding="utf-8"))
    keys = [c["key"] for c in doc["columns"]]
    assert sorted(r[keys.index("op_id")] for r in doc["rows"]) == shown and doc["filtered"] == 2

    path = export("dt-xlsx", ".xlsx")
    with zipfile.ZipFile(path) as z:
        sheet = next(n for n in z.namelist() if n.startswith("xl/worksheets/") and n.endswith(".xml"))
        xml = z.read(sheet).decode("utf-8")
        strings = z.read("xl/sharedStrings.xml").decode("utf-8") if "xl/sharedStrings.xml" in z.namelist() else ""
    assert len(re.findall(r"<row\b", xml)) == 1 + len(shown)
    assert "CONV2D_1" in xml + strings and "Op ID" in xml + strings

    # clipboard: the filtered rows as tab-separated text
    origin = env.tb.url
    b.driver.switch_to.default_content()
    b.driver.execute_cdp_cmd(
        "Browser.grantPermissions", {"origin": origin, "permissions": ["clipboardReadWrite", "clipboardSanitizedWrite"]}
    )
    frame = b.css("iframe[src*='plugin_entry.html?name=dlprof']")
    b.driver.switch_to.frame(frame)
    b.js(
        "window.__copied = null;"
        "const w = navigator.clipboard && navigator.clipboard.writeText.bind(navigator.clipboard);"
        "if (w) navigator.clipboard.writeText = (t) => { window.__copied = t; return w(t); };"
    )
    dt.find_element("css selector", "button.dt-copy").click()
    b.wait(lambda d: dt.get_attribute("data-copied") == "2", what="copied")
    copied = b.js("return window.__copied;")
    lines = copied.split("\n")
    assert lines[0].split("\t")[:2] == ["Op ID", "Op Name"]
    assert sorted(line.split("\t")[0] for line in lines[1:]) == shown
    assert "Copied 2 rows" in dt.find_element("css selector", ".dt-status").get_attribute("textContent")

    # PDF: a print-styled view of every filtered row, then the print dialog
    b.js("window.__printed = 0; window.print = () => { window.__printed += 1; };")
    dt.find_element("css selector", "button.dt-pdf").click()
    view = b.wait_css("#print-view", visible=True)
    b.wait(lambda d: b.js("return window.__printed") == 1, what="window.print()")
    assert sorted(td.text for td in view.find_elements("css selector", "tbody tr td:first-child")) == shown
    assert "Total GPU Time" in view.find_element("css selector", "thead").text
    assert not b.css("#dlprof-app").is_displayed()
    # printed on a landscape page (1040 px within its margins): no header breaks inside a word ("Dire ction"),
    # and the table fits the page
    d = b.driver
    d.execute_cdp_cmd("Emulation.setEmulatedMedia", {"media": "print"})
    d.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride", {"width": 1040, "height": 800, "deviceScaleFactor": 1, "mobile": False}
    )
    try:
        broken = b.js(WORDS_BROKEN, view.find_element("css selector", "table.print-table"))
        width = b.js("return arguments[0].getBoundingClientRect().width", view.find_element("css selector", "table"))
    finally:
        d.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
        d.execute_cdp_cmd("Emulation.setEmulatedMedia", {"media": ""})
    assert not broken, broken
    assert width <= 1040
    view.find_element("css selector", "button.print-close").click()
    b.wait(lambda d: not b.all("#print-view"), what="print view closed")
    assert b.css("#dlprof-app").is_displayed()
    search(b, dt, "")


# the header words of a table laid out on more than one line (a word broken across lines has several boxes)
WORDS_BROKEN = """
const out = [];
for (const th of arguments[0].querySelectorAll('thead th')) {
  const node = th.firstChild; if (!node || node.nodeType !== 3) continue;
  const text = node.textContent; let at = 0;
  for (const word of text.split(/\\s+/).filter(Boolean)) {
    const i = text.indexOf(word, at); at = i + word.length;
    const r = document.createRange(); r.setStart(node, i); r.setEnd(node, i + word.length);
    if (r.getClientRects().length > 1) out.push(word);
  }
}
return out;
"""


def test_a_table_of_100000_ops_stays_responsive(env):
    b, db = env.b, env.db("big")
    select_run(b, "views/big/dlprof")
    goto(b, "ops_kernels")
    dt = wait_table(b, b.wait_css("#ops .datatable"), timeout=30)
    assert query(db, "SELECT count(*) FROM op_nodes")[0][0] == BIG_OPS
    assert info(dt) == f"Showing 1 to 10 of {BIG_OPS:,} entries"
    # Each action is timed three times and judged by its fastest: the suite runs several workers on two cores,
    # and another worker's burst of CPU is not the table's slowness.
    timings = {}

    def timed(key: str, seconds: float) -> None:
        timings[key] = min(seconds, timings.get(key, seconds))

    first = rows(dt)[0]["op_id"]
    timed("next page", click_and_wait(b, dt, dt.find_element("css selector", ".dt-pager button.next")))
    assert info(dt) == f"Showing 11 to 20 of {BIG_OPS:,} entries" and rows(dt)[0]["op_id"] != first
    for _ in range(2):
        timed("next page", click_and_wait(b, dt, dt.find_element("css selector", ".dt-pager button.next")))
    assert info(dt) == f"Showing 31 to 40 of {BIG_OPS:,} entries"
    from selenium.webdriver.support.ui import Select

    for size in ("100", "25", "100"):
        before = renders(dt)
        started = time.perf_counter()
        Select(dt.find_element("css selector", "select.dt-pagesize")).select_by_value(size)
        wait_table(b, dt, before)
        timed("page size", time.perf_counter() - started)
    assert len(rows(dt)) == 100 and info(dt) == f"Showing 1 to 100 of {BIG_OPS:,} entries"
    for button in ("last", "first", "last"):
        timed(
            "first or last page", click_and_wait(b, dt, dt.find_element("css selector", f".dt-pager button.{button}"))
        )
    assert info(dt) == f"Showing 99,901 to 100,000 of {BIG_OPS:,} entries"
    max_gpu = fmt_ns(query(db, "SELECT max(gpu_max) FROM op_nodes")[0][0])
    min_name = query(db, "SELECT min(o.op_name) FROM op_nodes n JOIN read_only_ops o ON o.op_index = n.op_index")[0][0]
    for _ in range(3):  # switching columns: each click sorts by a new column in its first order
        timed("sort max GPU time", click_and_wait(b, dt, sort_button(dt, "gpu_max")))
        assert rows(dt)[0]["gpu_max"] == max_gpu
        timed("sort op name", click_and_wait(b, dt, sort_button(dt, "op_name")))
        assert rows(dt)[0]["op_name"] == min_name
    for term in ("relu[77776]", "relu[77778]", "relu[77777]"):
        started = time.perf_counter()
        search(b, dt, term)
        timed("search", time.perf_counter() - started - 0.25)  # minus the search box's debounce
    assert [r["op_name"] for r in rows(dt)] == ["/aten::relu[77777]"]
    assert info(dt) == f"Showing 1 to 1 of 1 entries (filtered from {BIG_OPS:,} total entries)"
    (ARTIFACTS / "big_table_timings.json").write_text(
        json.dumps({k: round(v, 3) for k, v in timings.items()}, indent=1)
    )
    slow = {k: round(v, 3) for k, v in timings.items() if v >= 1.0}
    assert not slow, f"slower than a second: {slow} (all: {timings})"


# ---------------------------------------------------------------------------- framework-specific columns


def test_direction_and_stack_trace_only_for_pytorch_runs(env):
    b = env.b
    select_run(b, "views/training/dlprof")
    goto(b, "ops_kernels")
    labels = headers(table_in(b, "#ops"))
    assert "Direction" in labels and "Stack Trace" in labels
    select_run(b, "views/plain/dlprof")
    goto(b, "ops_kernels")
    dt = table_in(b, "#ops")
    labels = headers(dt)
    assert "Op ID" in labels and "Direction" not in labels and "Stack Trace" not in labels
    before = renders(b.css("#op-kernels .datatable"))
    dt.find_element("css selector", "tbody tr[data-key]").click()
    kernels = wait_table(b, b.css("#op-kernels .datatable"), before)
    assert "Direction" not in headers(kernels)
    assert not b.all("#op-details [data-field=direction]")
    goto(b, "dashboard")
    assert "Direction" not in b.css("#panel-top-ops thead").text
    # this run found no key node: the expert systems say so in Recommendations, with a severity badge
    findings = query(
        env.db("plain"),
        "SELECT exp_sys_id, severity, problem, recommendation FROM expert_systems_feedback WHERE aggr_id = 1",
    )
    shown = b.all("#panel-recommendations li.finding")
    assert len(shown) == len(findings) >= 1
    exp_sys, severity, problem, recommendation = findings[0]
    assert shown[0].get_attribute("data-exp-sys") == exp_sys == "no_iterations_detector"
    squash = lambda s: " ".join(s.split())  # noqa: E731 - HTML collapses runs of spaces
    assert squash(problem) in squash(shown[0].text) and squash(recommendation) in squash(shown[0].text)
    assert shown[0].find_element("css selector", ".badge").get_attribute("textContent") == severity
    assert "Set a key node" in b.css("#panel-guidance").text


def test_long_cells_collapse_behind_see_more(env):
    b, db = env.b, env.db("stack")
    select_run(b, "views/stack/dlprof")
    goto(b, "ops_kernels")
    dt = table_in(b, "#ops")
    full = query(db, "SELECT stack_trace FROM read_only_ops WHERE op_id = 'CONV2D_1'")[0][0]
    assert "model.py:88" in full
    cell = dt.find_element("css selector", "tbody tr[data-key] td[data-key=stack_trace]")
    button = cell.find_element("css selector", "button.see-more")
    assert button.text == "See More" and "model.py:88" not in cell.text
    button.click()
    assert button.text == "See Less" and "model.py:88" in cell.text
    assert cell.find_element("css selector", ".cell-text").get_attribute("textContent") == full
    button.click()
    assert button.text == "See More" and "model.py:88" not in cell.text
    # the op's details carry the stack trace too, collapsed the same way
    dt.find_element("css selector", "tbody tr[data-key] td[data-key=op_id]").click()
    more = b.wait_css("#op-details .stack button.see-more")
    more.click()
    assert "model.py:88" in b.css("#op-details .stack").text


# ---------------------------------------------------------------------------- iterations and re-aggregation


def engine_summary(export: Path, out: Path, start: int, stop: int) -> dict:
    """{row label: value} of the engine's own summary report for an iteration range."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "dlprof_profiler",
            f"--database={export}",
            "--iter_start",
            str(start),
            "--iter_stop",
            str(stop),
            "--reports=summary",
            "--formats=json",
            f"--output_path={out}",
            "-v",
            "quiet",
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    doc = json.loads((out / "dlprof_summary.json").read_text())
    return {row[0]: row[1] for sec in doc["sections"] for row in sec["rows"] if len(row) == 2}


def test_iterations_view_and_reaggregation(env, tmp_path):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.support.ui import Select

    b, db = env.b, env.db("reagg")
    select_run(b, "views/reagg/dlprof")
    goto(b, "iterations")
    bars = b.all("#iterations-chart g.bar")
    assert [g.get_attribute("data-iteration") for g in bars] == ["0", "1", "2", "3"]
    # hover details
    ActionChains(b.driver).move_to_element(bars[1]).perform()
    tip = b.wait_css("#iterations-chart .chart-tip", visible=True)
    b.wait(lambda d: tip.get_attribute("data-iteration") == "1", what="hover tooltip")
    duration = query(db, "SELECT duration FROM iteration_summary WHERE iter_value = 1")[0][0]
    assert "Iteration 1" in tip.text and f"Duration\n{fmt_ns(duration)}" in tip.text and fmt_ns(duration) == "100 µs"
    # the GPU time breakdowns of the iteration: busy 37 us of its 100 us (the training profile's docstring)
    idle, compute = query(db, "SELECT gpu_idle, computation_busy FROM iteration_breakdown WHERE iter_value = 1")[0]
    assert (idle, compute) == (63_000, 36_000)
    assert f"GPU idle\n{fmt_ns(idle)}" in tip.text and f"Compute kernels running\n{fmt_ns(compute)}" in tip.text
    ActionChains(b.driver).move_by_offset(0, 400).perform()
    # Select Iter Start / Stop with boundary markers
    start, stop = b.css("#iter-start"), b.css("#iter-stop")
    assert (start.get_attribute("value"), stop.get_attribute("value"), stop.get_attribute("max")) == ("0", "3", "3")
    assert b.css("label[for=iter-start]").get_attribute("textContent") == "Select Iter Start"
    assert b.css("label[for=iter-stop]").get_attribute("textContent") == "Select Iter Stop"
    set_value(b, start, "3")
    set_value(b, stop, "2")
    assert "Start must not be after Stop" in b.css("#reaggregate-form .validation").text
    assert b.css("#reaggregate").get_attribute("disabled")
    set_value(b, start, "1")
    set_value(b, stop, "2")
    assert not b.css("#reaggregate").get_attribute("disabled")
    hit = {
        g.get_attribute("data-iteration"): g.find_element("css selector", "rect.hit")
        for g in b.all("#iterations-chart g.bar")
    }
    x_start = float(b.css("#iterations-chart line.marker-start").get_attribute("x1"))
    x_stop = float(b.css("#iterations-chart line.marker-stop").get_attribute("x1"))
    assert x_start == pytest.approx(float(hit["1"].get_attribute("x")))
    assert x_stop == pytest.approx(float(hit["2"].get_attribute("x")) + float(hit["2"].get_attribute("width")))
    # the key node picker: the full searchable key node table in a dialog
    b.click("#pick-key-node")
    dialog = b.wait_css("#key-node-dialog", visible=True)
    dt = wait_table(b, dialog.find_element("css selector", ".datatable"))
    search(b, dt, "Optimizer.step#SGD.step")
    select_row(b, dt, "kind", "nvtx_range")
    b.screenshot("key_node_dialog.png", full_page=False)
    dialog.find_element("css selector", "#use-key-node").click()
    b.wait(lambda d: not b.all("#key-node-dialog"), what="dialog closed")
    assert b.css("#key-node").get_attribute("value") == "Optimizer.step#SGD.step"
    # Reaggregate: confirmation, underway, success
    assert len(b.all("#aggr-select option")) == 1
    b.click("#reaggregate")
    confirm = b.wait_css("#confirm-dialog", visible=True)
    assert "iterations 1–2" in confirm.text and "Optimizer.step#SGD.step" in confirm.text
    confirm.find_element("css selector", "button.dialog-ok").click()
    b.wait_text("#reaggregate-status[data-status=running]", "underway", timeout=10)
    b.screenshot("reaggregation_underway.png", full_page=False)
    b.wait_css("#reaggregate-status[data-status=succeeded]", timeout=120)
    assert "Re-aggregation succeeded" in b.css("#reaggregate-status").text
    new_id = aggr_id(db)
    assert new_id == aggr_id(db, newest=False) + 1
    options = [o.get_attribute("value") for o in b.all("#aggr-select option")]
    assert options == ["1", str(new_id)]
    assert b.js("return document.getElementById('aggr-select').value") == str(new_id)
    b.wait_text("#iterations-chart .range-label", "Aggregated: iterations 1–2")
    assert [g.get_attribute("data-iteration") for g in b.all("#iterations-chart g.bar.outside")] == ["0", "3"]
    b.screenshot("reaggregated.png")
    b.css("#iters-profiled").click()
    assert [g.get_attribute("data-iteration") for g in b.all("#iterations-chart g.bar")] == ["1", "2"]
    b.css("#iters-all").click()
    assert len(b.all("#iterations-chart g.bar")) == 4

    # the Dashboard shows the engine's numbers for iterations 1..2
    engine = engine_summary(env.training, tmp_path / "engine", 1, 2)
    goto(b, "dashboard")
    metric = lambda key: b.css(f"[data-metric={key}] .metric-value").text  # noqa: E731
    assert metric("wall_time") == fmt_ns(int(engine["Wall Clock Time (ns)"]))
    assert metric("gpu_utilization") == f"{engine['GPU Utilization %']} %"
    assert metric("tc_utilization") == f"{engine['Tensor Core Kernel Utilization %']} %"
    assert metric("iter_aggregated") == engine["Aggregated Iterations"] == "2"
    assert metric("iter_range") == f"{engine['Start Iteration']} – {engine['Stop Iteration']}" == "1 – 2"
    assert metric("avg_iteration_time") == fmt_ns(float(engine["Average Iteration Time (ns)"]))
    assert metric("wall_time") != "290 µs"
    # earlier aggregations stay: switching back shows the old figures
    Select(b.css("#aggr-select")).select_by_value("1")
    b.wait(lambda d: metric("wall_time") == "290 µs", what="aggregation 1 on the dashboard")
    assert metric("iter_aggregated") == "4"

    # a failing re-aggregation is shown and leaves the aggregations intact
    goto(b, "iterations")
    set_value(b, b.css("#key-node"), "no_such_node_xyz")
    b.click("#reaggregate")
    b.wait_css("#confirm-dialog", visible=True).find_element("css selector", "button.dialog-ok").click()
    failed = b.wait_css("#reaggregate-status[data-status=failed]", timeout=120)
    assert "failed" in failed.text and "no_such_node_xyz" in failed.text and "unchanged" in failed.text
    assert [o.get_attribute("value") for o in b.all("#aggr-select option")] == ["1", str(new_id)]
    assert aggr_id(db) == new_id


def test_expert_system_proposal_applies_with_one_click(env):
    """The bad iteration range detector proposes the steady iterations 0-2 of the training profile (iteration 3
    holds only the last sync; iteration 0 starts at the first recorded event, so it is a full step): the
    Dashboard shows the proposal with its command, and the Iterations view applies it with one click (after the
    confirmation)."""
    b, db = env.b, env.db("proposal")
    select_run(b, "views/proposal/dlprof")
    goto(b, "dashboard")
    finding = b.wait_css("#panel-recommendations li[data-exp-sys=bad_iteration_range_detector]", 20)
    assert "Apply: aggregate iterations 0–2" in finding.text
    assert "dlprof --database=<db> --iter_start 0 --iter_stop 2" in finding.text
    goto(b, "iterations")
    button = b.wait_css("#apply-proposal", 20, visible=True)
    assert "iterations 0–2" in button.text
    button.click()
    confirm = b.wait_css("#confirm-dialog", visible=True)
    assert "iterations 0–2" in confirm.text
    confirm.find_element("css selector", "button.dialog-ok").click()
    b.wait_css("#reaggregate-status[data-status=succeeded]", timeout=120)
    assert query(db, "SELECT iter_start, iter_stop FROM aggregations ORDER BY aggr_id DESC LIMIT 1") == [(0, 2)]
    # from the first event (1_000_000) to the end of iteration 2, its key node's end (1_200_000 + 80_000)
    assert query(db, "SELECT wall_time FROM model_summary ORDER BY aggr_id DESC LIMIT 1") == [(280_000,)]
    b.wait_text("#iterations-chart .range-label", "Aggregated: iterations 0–2")
