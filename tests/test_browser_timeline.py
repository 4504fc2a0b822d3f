"""The Timeline view in a real headless Chromium inside a real TensorBoard: opened from the Iterations view, the
hand-computed training profile's boxes where its times say, the launch arrow and the GPU-gap hover, zoom (wheel,
shift-drag, keys) and pan, an op's details on click, and a view of 3 x 10^5 events that stays light (merged
boxes, quick draws). Screenshots and the measured times go to test-artifacts/."""

from __future__ import annotations

import contextlib
import json
from types import SimpleNamespace

import pytest

from tests.browser import ARTIFACTS, fmt_offset_ns, query, requires_browser
from tests.profiles import make_logdir
from tests.test_browser_views import big_profile, goto, select_run
from tests.test_plugin_timeline import GPU, T1

pytestmark = [pytest.mark.browser, requires_browser]

TRAINING = "timeline/training/dlprof"
BIG = 100_000  # ops, each launching one kernel: 3 x 10^5 events in one iteration


@pytest.fixture(scope="module")
def env(tmp_path_factory, tensorboard, browser, training_run):
    root = tmp_path_factory.mktemp("timeline")
    logdir = make_logdir(root / "logdir", {"training": training_run, "big": big_profile(root / "big.sqlite", BIG)})
    logdir = tensorboard.publish("timeline", logdir)
    b = browser.fresh(1600, 1000)
    b.open_dlprof(tensorboard.url, run=TRAINING)
    b.wait_css("#view .view", 30)
    return SimpleNamespace(tb=tensorboard, b=b, db=lambda run: logdir / run / "dlprof_dldb.sqlite")


@contextlib.contextmanager
def window(env, size):
    """The module's browser at `size` (a fresh page on the training run), at its own size again afterwards."""
    b = env.b.fresh(*size)
    try:
        b.open_dlprof(env.tb.url, run=TRAINING)
        yield b
    finally:
        env.b.fresh(1600, 1000).open_dlprof(env.tb.url, run=TRAINING)
        env.b.wait_css("#view .view", 30)


def dataset(b) -> dict:
    return b.js("const e = document.querySelector('.view-timeline'); return e ? {...e.dataset} : {};")


def wait_window(b, window: tuple | None = None, timeout: float = 30.0, changed_from: str | None = None) -> dict:
    """Wait until the view has drawn an answer (for `window`, or for any window but `changed_from`)."""

    def done(d):
        ds = dataset(b)
        if ds.get("ready") != "1" or ds.get("loading") == "1" or not ds.get("window"):
            return False
        if window is not None and ds["window"] != f"{window[0]},{window[1]}":
            return False
        if changed_from is not None and ds["window"] == changed_from:
            return False
        return ds

    return b.wait(done, timeout, f"the timeline window {window or 'to change'}")


def point(b, row: str, t: float) -> dict:
    p = b.js("return document.querySelector('.view-timeline').timelinePoint(arguments[0], arguments[1]);", row, t)
    assert p is not None, row
    return p


def mouse(b, kind: str, p: dict, **extra):
    """A mouse event at page point p on the canvas (window events for move/up while dragging)."""
    b.js(
        "const [kind, x, y, extra] = arguments; const c = document.getElementById('timeline-canvas');"
        "const target = (kind === 'mouseup' || (kind === 'mousemove' && extra.window)) ? window : c;"
        "target.dispatchEvent(new MouseEvent(kind, {clientX: x, clientY: y, bubbles: true, cancelable: true, "
        "button: 0, shiftKey: !!extra.shift}));",
        kind,
        p["x"],
        p["y"],
        extra,
    )


def wheel(b, p: dict, delta: float):
    b.js(
        "const c = document.getElementById('timeline-canvas'); c.dispatchEvent(new WheelEvent('wheel', "
        "{clientX: arguments[0], clientY: arguments[1], deltaY: arguments[2], bubbles: true, cancelable: true}));",
        p["x"],
        p["y"],
        delta,
    )


def view(b) -> dict:
    return b.js("return document.querySelector('.view-timeline').timelineState().view;")


def choose_iteration(b, iteration: int):
    b.js(
        "const i = document.getElementById('timeline-iteration'); i.value = String(arguments[0]);"
        "i.dispatchEvent(new Event('change'));",
        iteration,
    )


def tip(b) -> str:
    return b.js("const t = document.querySelector('.timeline-tip'); return t.hidden ? '' : t.innerText;")


def test_opens_from_the_iterations_view_on_the_iteration(env):
    b = env.b
    select_run(b, "timeline/training/dlprof")
    goto(b, "iterations")
    b.js(
        "arguments[0].dispatchEvent(new MouseEvent('dblclick', {bubbles: true}));",
        b.css("#iterations-chart g.bar[data-iteration='1']"),
    )
    wait_window(b, (1_080_000, 1_180_000))
    assert b.css(".view-title").text == "Timeline"
    assert b.css("#timeline-iteration").get_attribute("value") == "1"
    assert "p.dlprof.view=timeline" in b.js("return window.parent.location.hash;")
    assert "p.dlprof.iteration=1" in b.js("return window.parent.location.hash;")
    rows = b.js("return document.querySelector('.view-timeline').timelineState().rows;")
    assert rows == ["t0.0", "t0.api", "t1.0", "t1.api", "gap0", "g0.7"]
    b.screenshot("timeline_iteration.png")
    # the button of the Iterations view opens the iteration chosen as Start
    goto(b, "iterations")
    b.js("const i = document.getElementById('iter-start'); i.value = '2'; i.dispatchEvent(new Event('input'));")
    b.click("#open-timeline")
    wait_window(b, (1_180_000, 1_280_000))


def test_kernel_hover_draws_its_launch_arrow_and_gap_hover_tells_the_cpu(env):
    b = env.b
    select_run(b, "timeline/training/dlprof")
    b.click("button.nav-item[data-view=timeline]")
    choose_iteration(b, 1)
    wait_window(b, (1_080_000, 1_180_000))
    start, end, name, _, launch = GPU[3]  # the forward SGEMM, launched at T1 + 29 us
    mouse(b, "mousemove", point(b, "g0.7", (start + end) / 2))
    b.wait(lambda d: name in tip(b), what="the kernel's tooltip")
    text = tip(b)
    assert "Kernel" in text and "+57.000 µs" in text and "+49.000 µs" in text  # start and launch from T1 - 20 us
    assert dataset(b)["arrows"] == "1"
    b.screenshot("timeline_launch_arrow.png", full_page=False)
    # its launching API call: the arrow to the kernel
    mouse(b, "mousemove", point(b, "t0.api", launch + 500))
    b.wait(lambda d: "cudaLaunchKernel" in tip(b) and dataset(b).get("arrows") == "1", what="the call's arrow")
    # a GPU gap: [T1 + 27 us, T1 + 37 us); meanwhile aten::linear ran 9 us of it and its launch call 1 us
    mouse(b, "mousemove", point(b, "gap0", T1 + 32_000))
    b.wait(lambda d: "/aten::linear · 9 µs" in tip(b), what="the gap's CPU activity")
    text = tip(b)
    assert "GPU 0 idle 10 µs" in text and "python (pid 100, tid 100)" in text
    assert "cudaLaunchKernel · 1 µs" in text
    b.screenshot("timeline_gap_hover.png", full_page=False)
    mouse(b, "mouseleave", point(b, "gap0", T1))


def test_zoom_pan_and_details(env):
    b = env.b
    select_run(b, "timeline/training/dlprof")
    b.click("button.nav-item[data-view=timeline]")
    choose_iteration(b, 1)
    ds = wait_window(b, (1_080_000, 1_180_000))
    # the wheel zooms in at the cursor: the time under it stays under it
    at = T1 + 40_000
    p = point(b, "g0.7", at)
    wheel(b, p, -400)
    ds = wait_window(b, changed_from=ds["window"])
    v = view(b)
    assert v["t1"] - v["t0"] == pytest.approx(100_000 * 2.718281828 ** (-0.6), rel=1e-6)
    width = b.js("return document.getElementById('timeline-canvas').clientWidth") - 240
    # (mouse events carry whole pixels)
    assert (at - v["t0"]) / (v["t1"] - v["t0"]) == pytest.approx((at - 1_080_000) / 100_000, abs=1.01 / width)
    t0, t1 = (int(x) for x in ds["window"].split(","))
    assert t0 == int(v["t0"]) and t1 == -int(-v["t1"] // 1)
    assert int(ds["events"]) < 23  # fewer events in a narrower window
    # shift-drag zooms into the range
    px = (v["t1"] - v["t0"]) / width  # ns per pixel before the selection
    a, z = point(b, "g0.7", T1 + 30_000), point(b, "g0.7", T1 + 50_000)
    mouse(b, "mousedown", a, shift=True)
    mouse(b, "mousemove", z, window=True, shift=True)
    mouse(b, "mouseup", z)
    ds = wait_window(b, changed_from=ds["window"])
    v = view(b)
    assert v["t0"] == pytest.approx(T1 + 30_000, abs=px) and v["t1"] == pytest.approx(T1 + 50_000, abs=px)
    # dragging pans: 100 px to the right shows what was 100 px to the left
    span = v["t1"] - v["t0"]
    a = point(b, "t0.0", T1 + 40_000)
    mouse(b, "mousedown", a)
    mouse(b, "mousemove", {"x": a["x"] + 100, "y": a["y"]}, window=True)
    mouse(b, "mouseup", {"x": a["x"] + 100, "y": a["y"]})
    ds = wait_window(b, changed_from=ds["window"])
    moved = view(b)
    assert moved["t0"] == pytest.approx(v["t0"] - 100 * span / width, abs=span / width)
    # 0 on the keyboard: the whole iteration again
    b.js(
        "document.getElementById('timeline-canvas').dispatchEvent(new KeyboardEvent('keydown', {key: '0', "
        "bubbles: true}));"
    )
    wait_window(b, (1_080_000, 1_180_000))
    # a click on an op opens its details
    mouse(b, "mousedown", point(b, "t0.0", T1 + 15_000))
    mouse(b, "mouseup", point(b, "t0.0", T1 + 15_000))
    b.wait_text("#details-pane", "/aten::conv2d", 15)
    b.click("#details-pane button[aria-label='Close details']")


def test_three_hundred_thousand_events_stay_fluid(env):
    """One iteration holding 10^5 ops, 10^5 launch calls and 10^5 kernels: the answers hold merged boxes, the
    canvas draws in milliseconds, and every zoom step gets its window."""
    b, db = env.b, env.db("big")
    n_events = sum(
        query(db, f"SELECT count(*) FROM {t}")[0][0]
        for t in ("raw_op_instances", "raw_api_calls", "raw_gpu_activities")
    )
    assert n_events == 3 * BIG
    select_run(b, "timeline/big/dlprof")
    b.click("button.nav-item[data-view=timeline]")
    ds = wait_window(b, timeout=60)
    assert int(ds["events"]) == 3 * BIG
    rows = len(b.js("return document.querySelector('.view-timeline').timelineState().rows;"))
    width = b.js("return document.getElementById('timeline-canvas').clientWidth") - 240
    assert int(ds["boxes"]) <= rows * (2 * width + 2)
    measured = [
        {
            "step": "open",
            "events": int(ds["events"]),
            "boxes": int(ds["boxes"]),
            "fetch_ms": int(ds["fetchMs"]),
            "draw_ms": float(ds["drawMs"]),
        }
    ]
    b.screenshot("timeline_big_whole.png", full_page=False)
    # a merged box tells how many events it holds
    v = view(b)
    mouse(b, "mousemove", point(b, "g0.7", (v["t0"] + v["t1"]) / 2))
    b.wait(lambda d: "events merged" in tip(b), what="a merged box's tooltip")
    for step in range(6):  # zoom in at the middle, 4x per step
        p = point(b, "g0.7", (view(b)["t0"] + view(b)["t1"]) / 2)
        wheel(b, p, -924)
        ds = wait_window(b, changed_from=ds["window"], timeout=60)
        measured.append(
            {
                "step": f"zoom {step + 1}",
                "span_ns": int(view(b)["t1"] - view(b)["t0"]),
                "events": int(ds["events"]),
                "boxes": int(ds["boxes"]),
                "fetch_ms": int(ds["fetchMs"]),
                "draw_ms": float(ds["drawMs"]),
            }
        )
        assert int(ds["boxes"]) <= rows * (2 * width + 2)
    b.screenshot("timeline_big_zoomed.png", full_page=False)
    (ARTIFACTS / "timeline_fluid.json").write_text(json.dumps(measured, indent=1))
    assert measured[-1]["events"] < 1000  # zoomed in to a few dozen ops
    for m in measured:
        assert m["draw_ms"] < 100, measured  # a redraw (every pan or zoom frame) stays far under a frame budget
        assert m["fetch_ms"] < 10_000, measured


# ---------------------------------------------------------------------------- issue 24, item 4

GEOMETRY = """
const box = (el) => { const r = el.getBoundingClientRect(); return {left: r.left, top: r.top, right: r.right,
  bottom: r.bottom, width: r.width, height: r.height}; };
const view = document.querySelector('.view-timeline');
return {width: document.documentElement.clientWidth, height: document.documentElement.clientHeight,
  scrollWidth: document.documentElement.scrollWidth, wrap: box(document.querySelector('.timeline-wrap')),
  canvas: box(document.getElementById('timeline-canvas')), legend: box(document.getElementById('timeline-legend')),
  memory: box(document.getElementById('timeline-memory')), heights: view.timelineState().heights};
"""
# a CSS colour as the canvas writes it (#rrggbb): the browser converts hsl() and rgb() alike
CANVAS_COLOR = (
    "const c = document.createElement('canvas').getContext('2d'); c.fillStyle = arguments[0]; return c.fillStyle;"
)
# the colour of the canvas pixel at page point (x, y)
PIXEL = """
const c = document.getElementById('timeline-canvas'), r = c.getBoundingClientRect(), k = c.width / r.width;
const x = Math.round((arguments[0] - r.left) * k), y = Math.round((arguments[1] - r.top) * k);
const d = c.getContext('2d').getImageData(x, y, 1, 1).data;
return '#' + [d[0], d[1], d[2]].map((v) => v.toString(16).padStart(2, '0')).join('');
"""


def open_iteration(b, iteration: int = 1):
    select_run(b, "timeline/training/dlprof")
    b.click("button.nav-item[data-view=timeline]")
    wait_window(b)  # its iterations are known: one can be chosen
    choose_iteration(b, iteration)
    return wait_window(b, (1_080_000, 1_180_000))


@pytest.mark.parametrize("size", [(1600, 1000), (1000, 700)], ids=["1600x1000", "1000x700"])
def test_the_timeline_uses_the_window_with_readable_rows(env, size):
    """The canvas takes the height below it down to the memory track (the legend above it stays in sight), rows
    at least 20 px tall."""
    with window(env, size) as b:
        b.wait_css("#view .view", 30)
        if b.css("#nav-toggle").is_displayed():  # a narrow window: the navigation is collapsed
            b.click("#nav-toggle")
        open_iteration(b)
        g = b.js(GEOMETRY)
        assert min(g["heights"]) >= 20, g["heights"]
        assert g["scrollWidth"] <= g["width"]
        assert 0 <= g["legend"]["top"] and g["legend"]["bottom"] <= g["height"], g  # the legend in sight
        # the canvas reaches down to the memory track: no empty view below them
        assert g["wrap"]["height"] >= 240 and g["height"] - g["wrap"]["bottom"] <= g["memory"]["height"] + 70, g
        assert g["canvas"]["height"] >= g["wrap"]["height"] - 2  # it fills its box
        rows_height = sum(g["heights"]) + 26
        assert rows_height <= g["canvas"]["height"] and (
            rows_height >= g["wrap"]["height"] - 40 or max(g["heights"]) == 40
        )
        b.screenshot(f"timeline_{size[0]}x{size[1]}.png", full_page=False)


@pytest.mark.parametrize("size", [(1600, 1000), (1000, 700)], ids=["1600x1000", "1000x700"])
def test_tooltips_stay_in_the_window_and_name_the_launching_op_and_iteration(env, size):
    with window(env, size) as b:
        b.wait_css("#view .view", 30)
        if b.css("#nav-toggle").is_displayed():
            b.click("#nav-toggle")
        open_iteration(b)
        # the last kernel of the iteration, at the right edge: the optimizer step's, launched by its add_
        for start, end, name, _, launch in (GPU[-1], GPU[3]):
            mouse(b, "mousemove", point(b, "g0.7", (start + end) / 2))
            b.wait(lambda d: name in tip(b), what=f"{name}'s tooltip")
            text = tip(b)
            op = {GPU[-1][2]: "/Optimizer.step#SGD.step/aten::add_", GPU[3][2]: "/aten::linear"}[name]
            assert f"Launching Op\n{op}" in text and "In Iteration\n1" in text, text
            assert f"{fmt_offset_ns(launch - 1_080_000)}" in text
            r = b.js(
                "const r = document.querySelector('.timeline-tip').getBoundingClientRect();"
                "return [r.left, r.top, r.right, r.bottom, document.documentElement.clientWidth,"
                "document.documentElement.clientHeight, document.documentElement.scrollWidth];"
            )
            left, top, right, bottom, width, height, scroll = r
            assert 0 <= left and right <= width and 0 <= top and bottom <= height, (name, r)
            assert scroll <= width  # the page does not widen
        # an op: the iteration of its start
        mouse(b, "mousemove", point(b, "t0.0", T1 + 15_000))
        b.wait(lambda d: "/aten::conv2d" in tip(b), what="the op's tooltip")
        assert "In Iteration\n1" in tip(b)


def test_the_legend_is_what_is_drawn(env):
    """Only the kinds the window holds, in the colours they are drawn in: ops and kernels by name (a spectrum of
    the same colour function), calls, copies and GPU gaps in theirs; a pixel of each box has its colour."""
    b = env.b
    open_iteration(b)
    items = {
        i["kind"]: i
        for i in b.js(
            "return [...document.querySelectorAll('#timeline-legend li')].map((li) => { const s = "
            "getComputedStyle(li.querySelector('.swatch')); return {kind: li.dataset.kind, color: "
            "s.backgroundColor, image: s.backgroundImage}; });"
        )
    }
    assert set(items) == {"op", "api", "kernel", "memcpy", "gap"}  # no memset, nothing merged at this zoom

    def canvas_color(css: str) -> str:
        return b.js(CANVAS_COLOR, css)

    def drawn_color(kind: int, name: str) -> str:
        return canvas_color(
            b.js(
                "return document.querySelector('.view-timeline').timelineColor(arguments[0], arguments[1]);",
                kind,
                name,
            )
        )

    assert canvas_color(items["memcpy"]["color"]) == drawn_color(1, "")
    assert canvas_color(items["api"]["color"]) == drawn_color(11, "")
    for kind, code in (("op", 10), ("kernel", 0)):
        gradient = items[kind]["image"]
        stops = [drawn_color(code, f"legend-{n}") for n in "aekqw"]
        rgb = ["rgb({}, {}, {})".format(*(int(c[i : i + 2], 16) for i in (1, 3, 5))) for c in stops]
        assert gradient.startswith("linear-gradient") and all(c in gradient for c in rgb), (kind, gradient, rgb)
    # the pixels: the copy and two kernels are drawn in the colours the legend names
    for start, end, name, kind, _ in (GPU[0], GPU[1], GPU[3]):
        p = point(b, "g0.7", start + (end - start) * 0.1)
        assert b.js(PIXEL, p["x"], p["y"] - 6) == drawn_color(kind, name), name  # above the name in the box
