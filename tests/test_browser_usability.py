"""Issue 15 in a real headless Chromium inside a real TensorBoard (and dlprofviewer), a 1600 x 1000 window as the
report's: GRAPHS beside DLPROF, CPU-only iteration charts, the details drawer, column filter errors, kernel
start times, the re-aggregation form, dark mode, the URL state, the favicon, Top 10's TC Eligible column, the
versions in System Configuration and the Ops table's sort column. Screenshots go to test-artifacts/."""

from __future__ import annotations

import random
import re
import subprocess
import sys
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.browser import (
    ARTIFACTS,
    Browser,
    TensorBoard,
    fmt_offset_ns,
    free_port,
    http_json,
    query,
    requires_browser,
    wait_for_server,
)
from tests.nsys_builder import NsysExport
from tests.profiles import make_logdir
from tests.test_browser_views import (
    aggr_id,
    goto,
    info,
    renders,
    rows,
    search,
    select_row,
    select_run,
    set_value,
    table_in,
    wait_table,
)

pytestmark = [pytest.mark.browser, requires_browser]

WIDTH, HEIGHT = 1600, 1000
FRAME = "iframe[src*='plugin_entry.html?name=dlprof']"
DATALOADER = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"


def cpu_profile(path: Path) -> Path:
    """A PyTorch loop on the CPU only (no GPU, no CUDA): per iteration (base T = 1 ms + i * 100 us)
    a DataLoader range [T, T+30us), aten::relu [T+40us, T+60us), the optimizer step [T+70us, T+80us) holding
    aten::add_ [T+71us, T+79us). Iteration i+1 = [T_i + 80us, T_{i+1} + 80us): data loading 30 us, CPU (op ranges)
    20 + 8 = 28 us, other 100 - 58 = 42 us."""
    exp = NsysExport(schema="2022.4")
    tid = exp.add_thread(pid=50, tid=50, name="python", process_name="python")
    op_id = 1
    for i in range(3):
        t = 1_000_000 + i * 100_000
        exp.push_pop(tid, t, t + 30000, f"{DATALOADER}, op_id = {op_id}")
        exp.push_pop(tid, t + 40000, t + 60000, f"aten::relu, seq = {i}, op_id = {op_id + 1}")
        exp.push_pop(tid, t + 70000, t + 80000, f"Optimizer.step#SGD.step, op_id = {op_id + 2}")
        exp.push_pop(tid, t + 71000, t + 79000, f"aten::add_, seq = {i + 10}, op_id = {op_id + 3}")
        op_id += 4
    exp.set_session(start_time=0)
    return exp.write(path)


def flood_profile(path: Path, calls: int = 120) -> Path:
    """Three iterations of one relu and an optimizer step, with `calls` cudaEventQuery calls outside every op
    range in each (as a torch.profiler run polls its events): `calls` unassociated ops, one per n-th call."""
    exp = NsysExport(schema="2022.4")
    exp.add_gpu(device_id=0)
    tid = exp.add_thread(pid=60, tid=60, name="python", process_name="python")
    for i in range(3):
        t = 1_000_000 + i * 100_000
        exp.push_pop(tid, t, t + 10_000, f"aten::relu, seq = {i}, op_id = {i}")
        exp.launch(tid, t + 1000, t + 2000, t + 3000, t + 8000, kernel="relu_kernel")
        for k in range(calls):
            exp.runtime(tid, t + 20_000 + k * 200, t + 20_100 + k * 200, name="cudaEventQuery_v3020")
        exp.push_pop(tid, t + 60_000, t + 70_000, "Optimizer.step#SGD.step")
    exp.set_session(start_time=0)
    return exp.write(path)


@pytest.fixture(scope="module")
def env(tmp_path_factory, tensorboard, browser, training_run):
    root = tmp_path_factory.mktemp("usability")
    example = Path(__file__).resolve().parents[1] / "examples" / "sample_pytorch_training.sqlite"
    runs = {"training": training_run, "reagg": training_run, "cpu": cpu_profile(root / "cpu.sqlite")}
    runs.update(example=example, flood=flood_profile(root / "flood.sqlite"))
    logdir = make_logdir(root / "logdir", runs=runs)
    logdir = tensorboard.publish("usability", logdir)
    b = browser.fresh(WIDTH, HEIGHT)
    b.open_dlprof(tensorboard.url, run="usability/cpu/dlprof")
    b.wait_css("#view .view", 30)
    return SimpleNamespace(
        tb=tensorboard, b=b, root=root, logdir=logdir, db=lambda run: logdir / run / "dlprof_dldb.sqlite"
    )


def rect(b, el) -> dict:
    return b.js(
        "const r = arguments[0].getBoundingClientRect(); return {left: r.left, right: r.right, "
        "top: r.top, bottom: r.bottom, width: r.width, height: r.height};",
        el,
    )


def viewport(b) -> dict:
    return b.js(
        "return {width: document.documentElement.clientWidth, height: document.documentElement.clientHeight,"
        "scrollWidth: document.documentElement.scrollWidth};"
    )


def parent_hash(b) -> str:
    return b.js("return window.parent.location.hash;")


def reopen(b, timeout: float = 30.0):
    """Reload TensorBoard's page (its URL kept) and enter the plugin's iframe again."""
    d = b.driver
    d.switch_to.default_content()
    d.refresh()
    frame = b.wait(lambda drv: drv.find_element("css selector", FRAME), timeout, "the DLPROF plugin iframe")
    d.switch_to.frame(frame)
    b.wait_css("#view .view", timeout)


def close_details(b):
    if b.css("#details-pane").is_displayed():
        b.click("#details-pane button[aria-label='Close details']")
        b.wait(lambda d: not b.css("#details-pane").is_displayed(), what="details closed")


# ---------------------------------------------------------------------------- item 1: GRAPHS beside DLPROF

DEEP_FIND = (
    "const walk = (root, sel) => { for (const el of root.querySelectorAll('*')) { if (el.matches(sel)) "
    "return el; if (el.shadowRoot) { const f = walk(el.shadowRoot, sel); if (f) return f; } } return null; };"
    "return walk(document, arguments[0]);"
)
# {node name: fill of its shape} of the nodes GRAPHS draws (inside its shadow roots)
NODE_FILLS = (
    "const out = {}; const walk = (root) => { for (const el of root.querySelectorAll('g.node[data-name]')) {"
    "const shape = el.querySelector('.nodeshape ellipse, .nodeshape rect');"
    "out[el.getAttribute('data-name')] = shape ? getComputedStyle(shape).fill : null; }"
    "for (const el of root.querySelectorAll('*')) if (el.shadowRoot) walk(el.shadowRoot); };"
    "walk(document); return out;"
)


# every node GRAPHS draws (inside its shadow roots): name, the box of its shape on the page, its fill
GRAPH_NODES = (
    "const out = []; const walk = (root) => { for (const el of root.querySelectorAll('g.node[data-name]')) {"
    "const shape = el.querySelector('.nodeshape ellipse, .nodeshape rect'); if (!shape) continue;"
    "const r = shape.getBoundingClientRect();"
    "out.push({name: el.getAttribute('data-name'), fill: getComputedStyle(shape).fill,"
    "left: r.left, top: r.top, right: r.right, bottom: r.bottom, width: r.width, height: r.height}); }"
    "for (const el of root.querySelectorAll('*')) if (el.shadowRoot) walk(el.shadowRoot); };"
    "walk(document); return out;"
)
DEEP_ALL = (
    "const out = []; const walk = (root, sel) => { for (const el of root.querySelectorAll('*')) {"
    "if (el.matches(sel)) out.push(el); if (el.shadowRoot) walk(el.shadowRoot, sel); } };"
    "walk(document, arguments[0]); return out;"
)


def graph_nodes(d) -> dict:
    return {n["name"]: n for n in d.execute_script(GRAPH_NODES)}


def visible_graph(b, what: str, expected: set) -> dict:
    """GRAPHS' top-level nodes once they are `expected` and each is drawn readable inside the window (not blank:
    not off-screen, not shrunk to dots by a row of hundreds of nodes)."""

    def drawn(d):
        w, h = d.execute_script("return [window.innerWidth, window.innerHeight]")
        top = {k: n for k, n in graph_nodes(d).items() if "/" not in k}
        ok = set(top) == expected and all(
            n["width"] >= 30
            and n["height"] >= 12
            and 0 <= n["left"]
            and n["right"] <= w
            and 0 <= n["top"]
            and n["bottom"] <= h
            for n in top.values()
        )
        return top if ok else False

    return b.wait(drawn, 60, what)


def open_graphs(b, tb, run: str):
    """TensorBoard's GRAPHS tab on a run (its Default tag: the run's graph); returns its controls element."""
    d = b.driver
    d.switch_to.default_content()
    d.get(f"{tb.url}/#graphs")
    controls = b.wait(lambda drv: drv.execute_script(DEEP_FIND, "tf-graph-controls"), 60, "GRAPHS' controls")
    b.wait(lambda drv: len(drv.execute_script("return arguments[0].datasets || []", controls)) >= 3, 60, "GRAPHS' runs")
    d.execute_script(
        "const c = arguments[0]; c._selectedRunIndex = c.datasets.findIndex((r) => r.name === arguments[1]);",
        controls,
        run,
    )
    return controls


def choose_graph_tag(b, tag: str):
    """The tag dropdown of GRAPHS, used as a user does (open it, click the item)."""
    d = b.driver
    menus = d.execute_script(DEEP_ALL, "paper-dropdown-menu")
    menus[1].click()  # Run, then Tag
    item = b.wait(
        lambda drv: [
            i for i in drv.execute_script(DEEP_ALL, "paper-item") if i.text.strip() == tag and i.is_displayed()
        ],
        20,
        f"the tag {tag} in the dropdown",
    )[0]
    item.click()


def back_to_dlprof(b, tb):
    d = b.driver
    d.get(f"{tb.url}/#dlprof")
    d.switch_to.frame(b.wait(lambda drv: drv.find_element("css selector", FRAME), 30, "the DLPROF iframe"))
    b.wait_css("#view .view", 30)


def test_graphs_tab_is_active_and_shows_the_node_the_details_name(env):
    """Issue 24, item 5: the graph is drawn with either tag (after choosing dlprof/op_time it used to stay blank
    until a node was clicked), ops outside every scope sit under their op type, the sync calls outside every op
    under `unassociated`; colouring by compute time colours each scope by the sum of its ops' times."""
    b, tb = env.b, env.tb
    listing = http_json(f"{tb.url}/data/plugins_listing")
    assert listing["graphs"]["enabled"] and listing["dlprof"]["enabled"]
    select_run(b, "usability/training/dlprof")
    goto(b, "ops_kernels")
    select_row(b, table_in(b, "#ops"), "op_id", "CONV2D_2")
    node = b.wait_text("#op-details [data-field=graph_node] code", "conv2d/aten::conv2d (bprop)")
    assert node.text == "conv2d/aten::conv2d (bprop)"
    b.screenshot("graph_node_in_details.png", full_page=False)
    d = b.driver
    try:
        controls = open_graphs(b, tb, "usability/training/dlprof")
        scopes = {"to", "conv2d", "relu", "linear", "Optimizer.step#SGD.step", "unassociated"}
        visible_graph(b, "the training run's graph, drawn", scopes)
        d.save_screenshot(str(ARTIFACTS / "graphs_tab_default_tag.png"))
        choose_graph_tag(b, "dlprof/op_time")
        b.wait(lambda drv: drv.execute_script("return !!arguments[0].stats", controls), 60, "the op times loaded")
        visible_graph(b, "the graph, drawn with the dlprof/op_time tag", scopes)
        d.save_screenshot(str(ARTIFACTS / "graphs_tab_op_time_tag.png"))
        d.execute_script("arguments[0].colorBy = 'compute_time';", controls)
        fills = b.wait(
            lambda drv: (
                (f := {k: n["fill"] for k, n in graph_nodes(drv).items()}) and f.get("conv2d") != f.get("to") and f
            ),
            30,
            "nodes coloured by compute time",
        )
        d.save_screenshot(str(ARTIFACTS / "graphs_tab_compute_time.png"))
        # darker (less green) for more time: conv2d (30 + 18 us) = linear (24 + 24 us) > the sync (15 us of CPU) >
        # relu 6 us = the optimizer step's scope (its add_, 6 us) > to 3 us
        green = {name: int(re.findall(r"\d+", fill)[1]) for name, fill in fills.items() if "/" not in name}
        assert green["conv2d"] == green["linear"] < green["unassociated"] < green["relu"] < green["to"]
        assert green["Optimizer.step#SGD.step"] == green["relu"]
    finally:
        back_to_dlprof(b, tb)


def test_graphs_of_a_flat_profile_and_of_many_unassociated_calls(env):
    """Issue 24, item 5: the example run (21 ops, one scope: 21 unconnected nodes in one row before) is drawn as
    one node per op type; a run calling cudaEventQuery 120 times per iteration outside every op (a torch.profiler
    run's top level held hundreds of `unassociated_cudaEventQuery (#N)` nodes) has one node for that API."""
    b, tb = env.b, env.tb
    d = b.driver
    try:
        open_graphs(b, tb, "usability/example/dlprof")
        types = {"to", "conv2d", "batch_norm", "relu", "adaptive_avg_pool2d", "linear", "cross_entropy_loss"}
        visible_graph(b, "the example run's graph", types | {"Optimizer.step#SGD.step", "unassociated"})
        d.save_screenshot(str(ARTIFACTS / "graphs_example_by_op_type.png"))
        open_graphs(b, tb, "usability/flood/dlprof")
        flood = {"relu", "unassociated"}  # (the optimizer step launches nothing: a scope, no op)
        visible_graph(b, "the graph of the run with many unassociated calls", flood)
        choose_graph_tag(b, "dlprof/op_time")
        visible_graph(b, "that graph with the dlprof/op_time tag", flood)
    finally:
        back_to_dlprof(b, tb)
    # the API's calls are one node standing for its 120 ops (one per n-th call of an iteration), 360 calls
    from google.protobuf import text_format
    from tensorboard.compat.proto import graph_pb2

    with urllib.request.urlopen(f"{tb.url}/data/plugin/graphs/graph?run=usability/flood/dlprof", timeout=30) as resp:
        graph = text_format.Parse(resp.read().decode("utf-8"), graph_pb2.GraphDef())
    names = [n.name for n in graph.node]
    assert [n for n in names if "cudaEventQuery" in n] == ["unassociated/cudaEventQuery"]
    query = next(n for n in graph.node if n.name == "unassociated/cudaEventQuery")
    assert (query.attr["ops"].i, query.attr["calls"].i) == (120, 360)


# ---------------------------------------------------------------------------- item 4: CPU-only runs


def test_cpu_only_iterations_show_their_time_classes(env):
    b, db = env.b, env.db("cpu")
    select_run(b, "usability/cpu/dlprof")
    expected = {
        it: dict(zip(("dataloader", "cpu", "other"), v))
        for it, *v in query(
            db,
            "SELECT iter_value, dataloader_time, cpu_time, other_time FROM iteration_summary WHERE aggr_id = ?",
            (aggr_id(db),),
        )
    }
    assert expected[1] == expected[2] == {"dataloader": 30000, "cpu": 28000, "other": 42000}  # cpu_profile
    for view, chart in (("iterations", "#iterations-chart"), ("dashboard", "#panel-iterations")):
        goto(b, view)
        b.wait_css(f"{chart} g.bar")
        for it in (1, 2):
            heights = b.js(
                "const out = {}; for (const r of arguments[0].querySelectorAll('rect.seg')) "
                "out[r.getAttribute('class').split('seg-')[1]] = Number(r.getAttribute('height'));"
                "return out;",
                b.css(f"{chart} g.bar[data-iteration='{it}']"),
            )
            assert set(heights) == {"dataloader", "cpu", "other"}, heights  # not one grey bar
            total = sum(expected[it].values())
            for key, ns in expected[it].items():
                assert heights[key] / sum(heights.values()) == pytest.approx(ns / total, rel=1e-6), (view, it, key)
        legend = {li.get_attribute("data-key") for li in b.all(f"{chart} .legend li")}
        assert {"dataloader", "cpu", "other"} <= legend
    goto(b, "iterations")
    b.screenshot("cpu_only_iterations.png")


# ---------------------------------------------------------------------------- item 5: the details drawer


def test_details_drawer_opens_in_sight_and_nothing_in_it_is_wider(env):
    b = env.b
    select_run(b, "usability/training/dlprof")
    goto(b, "dashboard")
    b.js("window.scrollTo(0, document.documentElement.scrollHeight);")
    b.click("#panel-top-ops tbody tr:first-child td[data-key=op_id]")
    b.wait_text("#op-details [data-field=op_id]", "CONV2D_1")
    table = b.wait_css("#op-details .datatable[data-state=ready]")
    pane = b.css("#details-pane")
    box, view = rect(b, pane), viewport(b)
    # in sight: inside the window, whatever the page's scroll
    assert box["top"] >= 0 and box["bottom"] <= view["height"] + 0.5 and box["right"] <= view["width"] + 0.5
    assert box["left"] >= 0 and box["width"] <= view["width"]
    assert view["scrollWidth"] <= view["width"], "the page scrolls sideways"
    # never wider than the pane: every element outside a sideways-scrolling table box fits in it
    overflow = b.js(
        """
        const pane = arguments[0], p = pane.getBoundingClientRect(), out = [];
        for (const el of pane.querySelectorAll('*')) {
          if (el.closest('.dt-scroll') && !el.classList.contains('dt-scroll')) continue;
          const r = el.getBoundingClientRect();
          if (r.width && (r.left < p.left - 0.5 || r.right > p.right + 0.5)) out.push(el.tagName + '.' + el.className);
        }
        return out;""",
        pane,
    )
    assert not overflow, overflow
    assert rect(b, b.css("#op-details"))["width"] <= box["width"]
    for label in ("Minimum", "Maximum"):
        th = [e for e in b.all("#op-details table.stats thead th") if e.text.strip().lower() == label.lower()][0]
        r = rect(b, th)
        assert box["left"] <= r["left"] and r["right"] <= box["right"] and 0 <= r["top"] <= view["height"]
    for css in ("select.dt-pagesize", "input.dt-search", "button.dt-pdf", ".dt-pager button.last"):
        r = rect(b, table.find_element("css selector", css))
        assert box["left"] <= r["left"] and r["right"] <= box["right"], css
    # on a wide window the page makes room: nothing of it is hidden under the drawer
    assert rect(b, b.css("main.main"))["right"] <= box["left"] + 0.5
    b.screenshot("details_drawer.png", full_page=False)
    # a kernel's details appear in the drawer too
    select_row(b, table, "kernel_name", table.find_element("css selector", "tbody td[data-key=kernel_name]").text)
    kernel = b.wait_css("#kernel-details", visible=True)
    assert box["left"] <= rect(b, kernel)["left"] and rect(b, kernel)["right"] <= box["right"]
    # Escape closes it (the kernel row just clicked has the focus)
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    ActionChains(b.driver).send_keys(Keys.ESCAPE).perform()
    b.wait(lambda d: not b.css("#details-pane").is_displayed(), what="drawer closed")


# ---------------------------------------------------------------------------- item 6: column filter errors


def test_a_bad_column_filter_is_shown_at_the_filter_and_the_rows_stay(env):
    b = env.b
    select_run(b, "usability/training/dlprof")
    goto(b, "ops_kernels")
    dt = table_in(b, "#ops")
    box = dt.find_element("css selector", ".dt-col-search[data-key=gpu_total]")
    b.js("arguments[0].scrollIntoView({block: 'center', inline: 'nearest'});", box)
    box.click()
    box.send_keys("abc")
    b.wait(lambda d: dt.get_attribute("data-invalid") == "gpu_total", what="the filter marked invalid")
    error = dt.find_element("css selector", "th[data-key=gpu_total] .dt-filter-error")
    assert error.is_displayed() and "N, >N, <N, >=N, <=N or N..M" in error.text
    assert box.get_attribute("aria-invalid") == "true"
    assert box.get_attribute("aria-describedby") == error.get_attribute("id")
    r, i, view = rect(b, error), rect(b, box), viewport(b)
    assert i["bottom"] - 1 <= r["top"] <= i["bottom"] + 8 and r["left"] < i["right"] and i["left"] < r["right"]
    assert 0 <= r["left"] and r["right"] <= view["width"] and 0 <= r["top"] and r["bottom"] <= view["height"]
    assert info(dt) == "Showing 1 to 8 of 8 entries" and len(rows(dt)) == 8
    assert not b.all(".dt-error") and not b.all(".error-item")
    b.screenshot("filter_error.png", full_page=False)
    # the hint says what the filter takes: the units of the cells, and the unit of a plain number
    assert "e.g. >1ms, 500us..2ms, <1.5 s" in error.text and "a number alone is in µs" in error.text
    search(b, dt, ">20us", column="gpu_total")
    assert len(rows(dt)) == 3 and dt.get_attribute("data-invalid") is None and not error.is_displayed()
    # a number the server refuses (1e999 overflows): said at the filter too, rows kept
    set_value(b, box, "1e999")
    b.wait(lambda d: dt.get_attribute("data-invalid") == "gpu_total", what="the server's refusal at the filter")
    assert "N, >N, <N, >=N, <=N or N..M" in error.text and len(rows(dt)) == 3 and not b.all(".error-item")
    search(b, dt, "", column="gpu_total")


def test_filters_take_the_units_the_cells_show(env):
    """Issue 24, item 2: `>1ms`, `500us..2ms`, `<1.5 s` on durations, `>20%` on percentages, and a plain number
    in the column's display unit (the unit of its largest value: µs in the training profile's ops, whose GPU
    times are 30, 24, 24, 18, 6, 6, 3 and 0 µs); placeholder and tooltip say so."""
    b, db = env.b, env.db("training")
    select_run(b, "usability/training/dlprof")
    goto(b, "ops_kernels")
    dt = table_in(b, "#ops")
    box = dt.find_element("css selector", ".dt-col-search[data-key=gpu_total]")
    assert box.get_attribute("data-unit") == "µs" and box.get_attribute("placeholder") == ">1µs, 2..5"
    assert "a number alone is in µs, this column's unit" in box.get_attribute("title")
    gpu = dict(query(db, "SELECT o.op_id, n.gpu_total FROM op_nodes n JOIN read_only_ops o USING (op_index)"))
    for text, keep in (
        (">20us", lambda ns: ns > 20_000),
        (">0.02ms", lambda ns: ns > 20_000),
        ("6us..18us", lambda ns: 6_000 <= ns <= 18_000),
        ("6 µs..0.018 ms", lambda ns: 6_000 <= ns <= 18_000),
        ("<1.5 s", lambda ns: ns < 1_500_000_000),
        (">1ms", lambda ns: ns > 1_000_000),
        ("<=6", lambda ns: ns <= 6_000),  # µs, the column's unit
        ("6..18", lambda ns: 6_000 <= ns <= 18_000),
        (">=3000ns", lambda ns: ns >= 3_000),
    ):
        search(b, dt, text, column="gpu_total")
        expected = {k for k, v in gpu.items() if keep(v)}
        assert {r["op_id"] for r in rows(dt)} == expected, text
        assert dt.get_attribute("data-invalid") is None, text
    search(b, dt, "", column="gpu_total")
    # percentages
    goto(b, "tensor_core")
    tc = table_in(b, "#tensor-core")
    pct = tc.find_element("css selector", ".dt-col-search[data-key=tc_utilization]")
    assert pct.get_attribute("placeholder") == ">20%, 10..30" and "a number alone is in %" in pct.get_attribute("title")
    for text in (">20%", ">20"):
        search(b, tc, text, column="tc_utilization")
        assert {r["op_id"] for r in rows(tc)} == {"CONV2D_1", "CONV2D_2"}, text
    search(b, tc, "", column="tc_utilization")


# ---------------------------------------------------------------------------- item 10: the Ops table's sort column


def test_the_ops_tables_sort_column_is_in_sight_at_1600_px(env):
    b = env.b
    select_run(b, "usability/training/dlprof")
    goto(b, "ops_kernels")
    dt = table_in(b, "#ops")
    th = dt.find_element("css selector", "thead th[data-key=gpu_total]")
    scroller = dt.find_element("css selector", ".dt-scroll")
    assert th.get_attribute("aria-sort") == "descending"
    assert b.js("return arguments[0].scrollLeft", scroller) == 0
    r, s = rect(b, th), rect(b, scroller)
    assert s["left"] <= r["left"] and r["right"] <= s["right"] and r["right"] <= viewport(b)["width"]


# ---------------------------------------------------------------------------- item 8: kernel start times


def test_kernel_starts_are_shown_from_the_iteration_start_to_the_nanosecond(env):
    b, db = env.b, env.db("training")
    rng = random.Random(15)
    values = [0, 1, 999, 1000, 12_345, 999_999, 1_000_000, 1_234_567, 2_000_000_001, 12_345_678_901] + [
        rng.randrange(10**10) for _ in range(30)
    ]
    out = b.driver.execute_async_script(
        """
        const [values, done] = arguments;
        import(new URL("./format.js", document.baseURI).href).then((f) => done(values.map(f.fmtOffsetNs)));
    """,
        values,
    )
    assert out[:6] == ["+0 ns", "+1 ns", "+999 ns", "+1.000 µs", "+12.345 µs", "+999.999 µs"]
    assert out[6:9] == ["+1.000000 ms", "+1.234567 ms", "+2.000000001 s"]
    assert out == [fmt_offset_ns(v) for v in values]
    select_run(b, "usability/training/dlprof")
    goto(b, "kernels_by_iteration")
    its = table_in(b, "#iterations-table")
    kernels = b.css("#iteration-kernels .datatable")
    before = renders(kernels)
    select_row(b, its, "iteration", "1")
    wait_table(b, kernels, before)
    start, stop = query(
        db, "SELECT start_time, stop_time FROM iteration_summary WHERE aggr_id = ? AND iter_value = 1", (aggr_id(db),)
    )[0]
    assert (start, stop) == (1_080_000, 1_180_000)  # ends of the first two optimizer steps (training_profile)
    launches = query(
        db,
        "SELECT g.start, w.launch_time FROM read_only_activity_owners w "
        "JOIN read_only_gpu_activities g ON g.activity_id = w.activity_id "
        "WHERE w.launch_time >= ? AND w.launch_time < ? AND g.kind = 0 ORDER BY g.start",
        (start, stop),
    )
    got = rows(kernels)
    assert [(r["gpu_start_offset"], r["api_start_offset"]) for r in got] == [
        (fmt_offset_ns(g - start), fmt_offset_ns(a - start)) for g, a in launches
    ]
    assert got[0]["gpu_start_offset"] == "+34.000 µs"  # TC_CONV at T+14000 = 1,114,000 ns
    assert len(set(r["gpu_start_offset"] for r in got)) == len(got)  # distinct, in order
    labels = [th.text for th in kernels.find_elements("css selector", "thead tr.dt-head th")]
    assert any(t.startswith("GPU Start (from iteration start)") for t in labels)
    assert not any(t.startswith("GPU Start Time") for t in labels)
    cell = kernels.find_element("css selector", "tbody tr td[data-key=gpu_start_offset] span")
    assert f"{launches[0][0]:,} ns on the capture clock" in cell.get_attribute("title")


# ---------------------------------------------------------------------------- item 10: Top 10 and System Config


def test_top_ten_has_tc_eligible_and_system_config_the_versions(env):
    import tensorboard.version

    from dlprof_profiler import __version__

    b, db = env.b, env.db("training")
    select_run(b, "usability/training/dlprof")
    goto(b, "dashboard")
    eligible = dict(
        query(
            db,
            "SELECT o.op_id, n.tc_eligible FROM op_nodes n JOIN read_only_ops o "
            "ON o.op_index = n.op_index WHERE n.aggr_id = ?",
            (aggr_id(db),),
        )
    )
    assert "TC Eligible" in [th.text for th in b.all("#panel-top-ops thead th")]
    cell = lambda tr, key: tr.find_element("css selector", f"td[data-key={key}]").text  # noqa: E731
    shown = {cell(tr, "op_id"): cell(tr, "tc_eligible") for tr in b.all("#panel-top-ops tbody tr")}
    assert shown == {k: "Yes" if v else "No" for k, v in eligible.items()}
    assert shown["CONV2D_1"] == "Yes" and shown["RELU_1"] == "No"
    system = b.css("#panel-system")
    assert system.find_element("css selector", "dd[data-field=plugin_version]").text == __version__
    assert system.find_element("css selector", "dd[data-field=tensorboard_version]").text == tensorboard.version.VERSION


# ---------------------------------------------------------------------------- item 10: dark mode


def theme_menu(b, choice: str):
    """TensorBoard's theme menu (top-level page): Browser default, Light or Dark."""
    d = b.driver
    d.switch_to.default_content()
    try:
        d.find_element("css selector", "button[aria-label='Menu for changing light or dark theme']").click()
        item = b.wait(
            lambda drv: [
                e for e in drv.find_elements("css selector", "button[mat-menu-item]") if e.text.strip() == choice
            ],
            10,
            f"the {choice} menu item",
        )[0]
        item.click()
        b.wait(lambda drv: not drv.find_elements("css selector", "button[mat-menu-item]"), 10, "the menu closed")
    finally:
        d.switch_to.frame(d.find_element("css selector", FRAME))


def background_luminance(b) -> float:
    rgb = [int(x) for x in re.findall(r"\d+", b.js("return getComputedStyle(document.body).backgroundColor"))[:3]]
    return sum(rgb) / 3


def test_dark_mode_follows_tensorboard(env):
    b = env.b
    select_run(b, "usability/training/dlprof")
    goto(b, "dashboard")
    theme = lambda: b.js("return document.documentElement.dataset.theme")  # noqa: E731
    assert theme() == "light" and background_luminance(b) > 200
    try:
        theme_menu(b, "Dark")
        b.wait(lambda d: theme() == "dark", what="the plugin turned dark")
        assert background_luminance(b) < 60
        card = b.js("return getComputedStyle(arguments[0]).backgroundColor", b.css("#panel-performance"))
        assert sum(map(int, re.findall(r"\d+", card)[:3])) < 200
        b.screenshot("dashboard_dark.png")
        # TensorBoard keeps its choice: reloaded dark, the plugin is dark from its first paint
        reopen(b)
        assert theme() == "dark"
        theme_menu(b, "Light")
        b.wait(lambda d: theme() == "light", what="light again")
    finally:
        theme_menu(b, "Browser default")


# ---------------------------------------------------------------------------- item 10: the URL keeps the state


def test_view_and_selection_survive_a_reload(env):
    b, db = env.b, env.db("training")
    select_run(b, "usability/training/dlprof")
    goto(b, "ops_kernels")
    select_row(b, table_in(b, "#ops"), "op_id", "LINEAR_2")
    b.wait_text("#op-details [data-field=op_id]", "LINEAR_2")
    op_index = query(db, "SELECT op_index FROM read_only_ops WHERE op_id = 'LINEAR_2'")[0][0]
    b.wait(lambda d: f"p.dlprof.op={op_index}" in parent_hash(b), what="the op in TensorBoard's URL")
    assert "p.dlprof.view=ops_kernels" in parent_hash(
        b
    ) and "p.dlprof.run=usability%2Ftraining%2Fdlprof" in parent_hash(b)
    reopen(b)
    assert b.js("return document.getElementById('view').dataset.view") == "ops_kernels"
    assert b.js("return document.getElementById('run-select').value") == "usability/training/dlprof"
    b.wait_text("#op-details [data-field=op_id]", "LINEAR_2")
    b.wait_text("#op-kernels .card-title", "Kernels of LINEAR_2")
    kernels = wait_table(b, b.css("#op-kernels .datatable"))
    assert {r["op_id"] for r in rows(kernels)} == {"LINEAR_2"}
    b.wait_css("#ops tbody tr.selected")
    # another view and an iteration
    goto(b, "kernels_by_iteration")
    select_row(b, table_in(b, "#iterations-table"), "iteration", "2")
    b.wait(
        lambda d: (
            "p.dlprof.iteration=2" in parent_hash(b)
            and not re.search(r"p\.dlprof\.op=\d", parent_hash(b))
            and "p.dlprof.view=kernels_by_iteration" in parent_hash(b)
        ),
        what="the iteration in the URL",
    )
    reopen(b)
    b.wait_text("#iteration-kernels .card-title", "Kernels of iteration 2")
    kernels = wait_table(b, b.css("#iteration-kernels .datatable"))
    assert len(rows(kernels)) == 6
    assert b.css("#iterations-table tbody tr.selected").get_attribute("data-key") == "2"


# ---------------------------------------------------------------------------- item 9: re-aggregation


def aggregations(db) -> list[tuple]:
    return query(db, "SELECT aggr_id, key_node, iter_start, iter_stop FROM aggregations ORDER BY aggr_id")


def dialog_ok(b, dialog_id: str):
    dialog = b.wait_css(f"#{dialog_id}", visible=True)
    text = dialog.text
    dialog.find_element("css selector", "button.dialog-ok").click()
    b.wait(lambda d: not b.all(f"#{dialog_id}"), what=f"{dialog_id} closed")
    return text


def ready(b, aggr: str):
    """The Iterations view of aggregation `aggr`, its data loaded (the form is filled then)."""
    b.wait(
        lambda d: (
            b.js("return document.getElementById('aggr-select').value") == aggr
            and b.all(".view-iterations[data-ready='1']")
        ),
        30,
        f"the Iterations view of aggregation {aggr}",
    )


def test_reaggregate_form(env):
    b, db = env.b, env.db("reagg")
    select_run(b, "usability/reagg/dlprof")
    goto(b, "iterations")
    start, stop, go = b.css("#iter-start"), b.css("#iter-stop"), b.css("#reaggregate")
    # the range is checked against the iterations of the split (4 here) before anything is sent
    set_value(b, start, "7")
    assert "within 0–3" in b.css("#reaggregate-form .validation").text and go.get_attribute("disabled")
    set_value(b, start, "0")
    set_value(b, stop, "4")
    assert "within 0–3" in b.css("#reaggregate-form .validation").text and go.get_attribute("disabled")
    set_value(b, stop, "3")
    assert not b.css("#reaggregate-form .validation").text and not go.get_attribute("disabled")
    # the same key node and range as aggregation 1: offered, not computed again
    b.click("#reaggregate")
    assert "Aggregation #1 already covers iterations 0–3" in dialog_ok(b, "existing-aggregation-dialog")
    assert aggregations(db) == [(1, "Optimizer.step#SGD.step", 0, 3)]
    # the expert systems' proposal, applied once ...
    b.click("#apply-proposal")
    assert "iterations 0–2" in dialog_ok(b, "confirm-dialog")
    b.wait_css("#reaggregate-status[data-status=succeeded]", timeout=120)
    assert aggregations(db)[-1] == (2, "Optimizer.step#SGD.step", 0, 2)
    ready(b, "2")
    # ... and twice, from aggregation 1: the one it made is offered
    from selenium.webdriver.support.ui import Select

    Select(b.css("#aggr-select")).select_by_value("1")
    b.wait_css("#iterations-chart g.bar")
    b.wait_css("#apply-proposal", visible=True)
    b.click("#apply-proposal")
    assert "Aggregation #2 already covers iterations 0–2" in dialog_ok(b, "existing-aggregation-dialog")
    b.wait(lambda d: b.js("return document.getElementById('aggr-select').value") == "2", what="aggregation 2 shown")
    assert len(aggregations(db)) == 2
    # the chosen aggregation is in the URL too
    b.wait(lambda d: "p.dlprof.aggr=2" in parent_hash(b), what="the aggregation in the URL")
    reopen(b)
    assert b.js("return document.getElementById('aggr-select').value") == "2"
    assert b.js("return document.getElementById('view').dataset.view") == "iterations"
    # a new key node: Start / Stop are cleared (all iterations of its split), nothing of the old range stays
    b.wait_css("#iterations-chart g.bar")
    b.click("#pick-key-node")
    dialog = b.wait_css("#key-node-dialog", visible=True)
    dt = wait_table(b, dialog.find_element("css selector", ".datatable"))
    search(b, dt, "enumerate(DataLoader)")
    select_row(b, dt, "kind", "nvtx_range")
    dialog.find_element("css selector", "#use-key-node").click()
    b.wait(lambda d: not b.all("#key-node-dialog"), what="dialog closed")
    assert b.css("#key-node").get_attribute("value") == DATALOADER
    assert (b.css("#iter-start").get_attribute("value"), b.css("#iter-stop").get_attribute("value")) == ("", "")
    assert "empty Start / Stop take all" in b.css("#reaggregate-form .range-hint").text
    b.click("#reaggregate")
    assert "all iterations" in dialog_ok(b, "confirm-dialog")
    b.wait_css("#reaggregate-status[data-status=succeeded]", timeout=120)
    total = query(db, "SELECT total_iterations FROM aggregations WHERE aggr_id = 3")[0][0]
    assert total == 4 and aggregations(db)[-1] == (3, DATALOADER, 0, total - 1)
    ready(b, "3")
    # a range the engine refuses (the key node's split is unknown to the page): its reason, without the path
    set_value(b, b.css("#key-node"), "aten::relu")
    set_value(b, b.css("#iter-start"), "50")
    set_value(b, b.css("#iter-stop"), "60")
    b.click("#reaggregate")
    dialog_ok(b, "confirm-dialog")
    failed = b.wait_css("#reaggregate-status[data-status=failed]", timeout=120)
    assert "dlprof_dldb.sqlite: iteration range 50..60 is outside the profile" in failed.text
    assert str(env.logdir) not in failed.text and str(db.parent) not in failed.text
    assert len(aggregations(db)) == 3


# ---------------------------------------------------------------------------- item 10: dlprofviewer


def test_dlprofviewer_favicon_theme_and_url_state(env, tmp_path):
    db = env.db("training")
    port = free_port()
    exe = Path(sys.executable).with_name("dlprofviewer")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "dlprof_plugin.viewer"]
    log = open(tmp_path / "viewer.log", "w")
    proc = subprocess.Popen(cmd + [str(db), "--port", str(port), "--quiet"], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    try:
        try:
            wait_for_server(url + "runs", proc, what="dlprofviewer to start")
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {(tmp_path / 'viewer.log').read_text()}") from None
        with urllib.request.urlopen(url + "favicon.ico", timeout=5) as resp:
            assert resp.status == 200 and resp.headers["Content-Type"].startswith("image/svg+xml")
        with Browser(WIDTH, HEIGHT) as b:  # its own: the colour scheme it emulates would outlive the test
            d = b.driver
            d.execute_cdp_cmd(
                "Emulation.setEmulatedMedia", {"features": [{"name": "prefers-color-scheme", "value": "dark"}]}
            )
            d.get(url)
            b.wait_css("#panel-top-ops tbody tr", 30)
            assert b.js("return document.documentElement.dataset.theme") == "dark"
            d.execute_cdp_cmd(
                "Emulation.setEmulatedMedia", {"features": [{"name": "prefers-color-scheme", "value": "light"}]}
            )
            b.wait(lambda drv: b.js("return document.documentElement.dataset.theme") == "light", what="light")
            severe = [m for m in b.console() if "SEVERE" in m]
            assert not severe, severe  # no 404 for /favicon.ico (or anything else)
            b.click("button.nav-item[data-view=ops_kernels]")
            select_row(b, table_in(b, "#ops"), "op_id", "CONV2D_1")
            b.wait_text("#op-details [data-field=op_id]", "CONV2D_1")
            b.wait(lambda drv: "view=ops_kernels" in drv.execute_script("return location.hash"), what="URL state")
            assert "op=1" in d.execute_script("return location.hash")
            d.refresh()
            b.wait_text("#op-details [data-field=op_id]", "CONV2D_1", 30)
            assert b.js("return document.getElementById('view').dataset.view") == "ops_kernels"
            assert not b.all("#op-details [data-field=graph_node]")  # no GRAPHS tab without TensorBoard
            assert len(rows(wait_table(b, b.css("#op-kernels .datatable")))) == 1
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()


# ---------------------------------------------------------------------------- issue 24, item 9: the run's name


def test_a_profile_name_is_not_shown_twice(env, tmp_path):
    """`dlprof --output_path=<logdir>/example --profile_name=example`: the run is `example` (not
    `example/example`); pointed at that folder itself (the run `.`), TensorBoard's run is shown by its profile
    name."""
    from tests.profiles import run_dlprof

    logdir = tmp_path / "logdir"
    export = Path(__file__).resolve().parents[1] / "examples" / "sample_pytorch_training.sqlite"
    run_dlprof(f"--database={export}", f"--output_path={logdir / 'example'}", "--profile_name=example", "-v", "quiet")
    # a TensorBoard of its own: the runs are named by where its logdir is, and it must show exactly this one
    for root, value in ((logdir, "example"), (logdir / "example", ".")):
        with TensorBoard(root) as tb, Browser(WIDTH, HEIGHT) as b:
            b.open_dlprof(tb.url)
            b.wait_css("#view .view", 30)
            assert [o.get_attribute("value") for o in b.all("#run-select option")] == [value]
            assert [o.text for o in b.all("#run-select option")] == ["example"]
            assert b.css(".view-subtitle").text.startswith("example · aggregation")
