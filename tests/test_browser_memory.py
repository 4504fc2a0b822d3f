"""The Memory view and the Timeline's memory track in a real headless Chromium inside a real TensorBoard: the
hand-computed memory profile's device figures, each device's curve with the iterations marked (hover, drag to
zoom, back to the whole profile), the ops table, a profile without memory events saying how to record them."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.browser import fmt_int, query, requires_browser
from tests.profiles import BASE, ITERATION_SPAN, MIB, make_logdir, memory_profile
from tests.test_browser_views import rows, select_run, table_in

pytestmark = [pytest.mark.browser, requires_browser]


@pytest.fixture(scope="module")
def env(tmp_path_factory, tensorboard, browser, training_run):
    root = tmp_path_factory.mktemp("memory_view")
    logdir = make_logdir(root / "logdir", {"memory": memory_profile(root / "memory.sqlite"), "plain": training_run})
    logdir = tensorboard.publish("memory_view", logdir)
    b = browser.fresh(1500, 1000)
    b.open_dlprof(tensorboard.url, run="memory_view/memory/dlprof")
    b.wait_css("#view .view", 30)
    return SimpleNamespace(tb=tensorboard, b=b, db=logdir / "memory" / "dlprof_dldb.sqlite")


def dataset(b, css=".view-memory") -> dict:
    return b.js("const e = document.querySelector(arguments[0]); return e ? {...e.dataset} : {};", css)


def open_memory(b, run: str) -> dict:
    select_run(b, run)
    if b.js("return document.getElementById('view').dataset.view") == "memory":
        b.click("button.nav-item[data-view=gpus]")
    b.click("button.nav-item[data-view=memory]")
    return b.wait(lambda d: dataset(b).get("ready") == "1" and dataset(b), 30, "the Memory view")


def chart_x(b, device: str, t: int) -> float:
    """Where time t is drawn on a device's chart, in page pixels."""
    view = dataset(b)
    t0, t1 = (int(v) for v in view["window"].split(","))
    box = b.js(
        "const r = document.querySelector(`.memory-device[data-device='${arguments[0]}'] svg`).getBoundingClientRect();"
        "return {left: r.left, width: r.width, top: r.top, height: r.height};",
        device,
    )
    return box, box["left"] + (t - t0) / (t1 - t0) * box["width"]


def mouse(b, device: str, kind: str, x: float, y: float):
    b.js(
        "document.querySelector(`.memory-device[data-device='${arguments[0]}'] svg`).dispatchEvent("
        "new MouseEvent(arguments[1], {clientX: arguments[2], clientY: arguments[3], bubbles: true, button: 0}));",
        device,
        kind,
        x,
        y,
    )


def test_devices_curves_and_ops(env):
    b = env.b
    view = open_memory(b, "memory_view/memory/dlprof")
    assert view["recorded"] == "1"
    assert b.css(".view-title").text == "Memory"
    table = b.css("#memory-devices table")
    cells = [
        [td.text for td in tr.find_elements("css selector", "td")]
        for tr in table.find_elements("css selector", "tbody tr")
    ]
    assert [c[0] for c in cells] == ["CPU", "GPU 0", "GPU 1"]
    assert cells[1][1:] == ["1 MiB", "not recorded", "0 B", "6", "6"]  # 4096 + 1 MiB, shown in MiB
    exact = b.css("#memory-devices tbody tr[data-device='GPU 0'] td:nth-child(2)").get_attribute("title")
    assert exact == f"{fmt_int(4096 + MIB)} bytes"
    # one chart per device; its points are every stored level (plus the one the window starts at)
    for device, device_type, device_id in (("CPU", 0, -1), ("GPU 0", 1, 0), ("GPU 1", 1, 1)):
        n = query(
            env.db,
            "SELECT count(*) FROM raw_memory_events WHERE device_type = ? AND device_id = ?",
            (device_type, device_id),
        )
        svg = b.css(f".memory-device[data-device='{device}'] svg.memory-chart")
        assert int(svg.get_attribute("data-points")) == n[0][0] + 1
        assert svg.find_elements("css selector", "path.allocated-line")
    marks = b.all(".memory-device[data-device='GPU 0'] line.iteration-mark")
    assert sorted(int(m.get_attribute("data-iteration")) for m in marks) == [0, 1, 2, 3]
    assert len(b.all(".memory-device[data-device='GPU 0'] rect.iteration-band")) == 4  # all aggregated
    # hovering iteration 1 after its conv2d allocated: 4096 + 1 MiB
    t = BASE + ITERATION_SPAN + 10_000
    box, x = chart_x(b, "GPU 0", t)
    mouse(b, "GPU 0", "mousemove", x, box["top"] + box["height"] / 2)
    tip = b.wait(
        lambda d: b.css(".memory-device[data-device='GPU 0'] .memory-tip").get_attribute("data-allocated"),
        what="tooltip",
    )
    assert int(tip) == 4096 + MIB
    assert "1 MiB" in b.css(".memory-device[data-device='GPU 0'] .memory-tip").text
    # the ops table: the report's Ops section, most bytes allocated first
    dt = table_in(b, "#memory-ops")
    listed = rows(dt)
    assert len(listed) == 5 and listed[0]["op_name"] == "/aten::conv2d" and listed[0]["device"] == "GPU 0"
    assert listed[0]["bytes_allocated"] == fmt_int(3 * MIB)
    b.screenshot("memory_view.png")


def test_drag_zooms_and_the_button_shows_the_whole_profile(env):
    b = env.b
    whole = open_memory(b, "memory_view/memory/dlprof")["window"]
    t = BASE + ITERATION_SPAN
    box, x0 = chart_x(b, "GPU 0", t)
    _, x1 = chart_x(b, "GPU 0", t + 30_000)
    y = box["top"] + box["height"] / 2
    mouse(b, "GPU 0", "mousedown", x0, y)
    mouse(b, "GPU 0", "mousemove", x1, y)
    mouse(b, "GPU 0", "mouseup", x1, y)
    view = b.wait(lambda d: dataset(b).get("ready") == "1" and dataset(b)["window"] != whole and dataset(b), 20, "zoom")
    a, z = (int(v) for v in view["window"].split(","))
    pixel = (int(whole.split(",")[1]) - int(whole.split(",")[0])) / box["width"]
    assert abs(a - t) <= 2 * pixel and abs(z - (t + 30_000)) <= 2 * pixel
    # iteration 1's first 30 us: its aten::empty and conv2d allocations and the optimizer's free (T+2000, T+6500,
    # T+22500)
    assert "3 events in view" in b.css(".memory-device[data-device='GPU 0'] .memory-device-name").text
    b.click("#memory-reset")
    b.wait(lambda d: dataset(b).get("ready") == "1" and dataset(b)["window"] == whole, 20, "the whole profile")
    assert b.css("#memory-reset").get_attribute("disabled") is not None


def test_without_memory_events_the_view_says_how_to_record_them(env):
    b = env.b
    view = open_memory(b, "memory_view/plain/dlprof")
    assert view["recorded"] == "0"
    text = b.css("#memory-none").text
    assert "No memory events in this profile" in text and "dlprof --detailed_mode" in text
    assert "profile_memory=True" in text and "--cuda-memory-usage=true" in text
    assert not b.css("#memory-time").is_displayed() and not b.css("#memory-ops").is_displayed()


def test_the_timeline_draws_each_gpus_memory_under_its_rows(env):
    b = env.b
    select_run(b, "memory_view/memory/dlprof")
    b.click("button.nav-item[data-view=timeline]")
    track = b.wait(
        lambda d: dataset(b, "#timeline-memory").get("ready") == "1" and dataset(b, "#timeline-memory"), 30, "track"
    )
    timeline = b.wait(
        lambda d: dataset(b, ".view-timeline").get("ready") == "1" and dataset(b, ".view-timeline"), 30, "timeline"
    )
    assert track["window"] == timeline["window"]
    devices = [svg.get_attribute("data-device") for svg in b.all("#timeline-memory svg.memory-chart")]
    assert devices == ["GPU 0", "GPU 1"]  # GPUs only, under the GPU rows
    canvas = b.css("#timeline-canvas").rect
    first = b.all("#timeline-memory svg.memory-chart")[0].rect
    assert abs(first["y"] - (canvas["y"] + canvas["height"])) < 4 and abs(first["width"] - canvas["width"]) < 4
    b.screenshot("timeline_memory_track.png", full_page=False)
