"""Issue 24 in a real headless Chromium inside a real TensorBoard: every label every view shows (tables, panels,
details, tooltips) against its one definition in dlprof_plugin/terms.py (item 3), and the layout at 1600 x 1000
and 1000 x 700 (item 6): element boxes inside the window and not overlapping, the navigation collapsed in the
narrow window, the details drawer beside (not over) the table without scrolling it sideways and with its Maximum
column, Tensor Cores rows one line tall, the GPU Utilization legend's values on one line."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from dlprof_plugin.terms import TERMS
from tests.browser import Browser, requires_browser
from tests.profiles import make_logdir, run_dlprof
from tests.test_browser_views import VIEWS as VIEW_READY
from tests.test_compare import hand_after, hand_before

pytestmark = [pytest.mark.browser, requires_browser]

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "sample_pytorch_training.sqlite"
SIZES = [(1600, 1000), (1000, 700)]
VIEWS = [
    "dashboard",
    "op_types",
    "ops_kernels",
    "kernels_by_iteration",
    "kernels_by_op",
    "iterations",
    "timeline",
    "tensor_core",
    "gpus",
    "group_ops",
    "compare",
]
READY = {
    **VIEW_READY,
    "timeline": ".view-timeline[data-ready='1']",
    "compare": ".view-compare[data-ready='1'] #compare-ops .datatable[data-state=ready]",
}


@pytest.fixture(scope="module")
def env(tmp_path_factory, tensorboard, browser, training_run):
    root = tmp_path_factory.mktemp("layout")
    logdir = make_logdir(root / "logdir", {"training": training_run, "example": EXAMPLE})
    before, after = hand_before(root / "before.sqlite"), hand_after(root / "after.sqlite")
    run_dlprof(f"--database={after}", f"--baseline={before}", f"--output_path={logdir / 'after'}", "-v", "quiet")
    tensorboard.publish("layout", logdir)
    return SimpleNamespace(tb=tensorboard, b=browser)


def open_page(env, size) -> Browser:
    """The shared browser at `size`, on a fresh page of the module's first run."""
    b = env.b.fresh(*size)
    b.open_dlprof(env.tb.url, run="layout/after/dlprof")
    b.wait_css("#view .view", 30)
    return b


def select_run(b, run: str):
    """Choose a run (through the selector's own change event: in a narrow window it sits in the collapsed pane)."""
    b.js(
        "const s = document.getElementById('run-select'); if (s.value !== arguments[0]) { s.value = arguments[0];"
        "s.dispatchEvent(new Event('change')); }",
        run,
    )
    b.wait(
        lambda d: (
            b.js("return document.getElementById('run-select').value") == run and run in b.css(".view-subtitle").text
        ),
        30,
        f"run {run}",
    )


def goto(b, view: str):
    """A view through the navigation, as a user reaches it: a narrow window opens the collapsed pane first."""
    narrow = b.css("#nav-toggle").is_displayed()
    if narrow:
        b.click("#nav-toggle")
        b.wait(lambda d: b.css("#nav-pane").is_displayed(), what="the navigation opened")
    b.click(f"button.nav-item[data-view={view}]")
    if narrow:  # it closes (sliding out) once a view is chosen
        b.wait(
            lambda d: b.js("return document.getElementById('nav-pane').getBoundingClientRect().right") <= 0,
            what="the navigation closed",
        )
    b.wait(lambda d: b.js("return document.getElementById('view').dataset.view") == view, what=f"view {view}")
    b.wait_css(READY[view], 30)
    assert not b.all(".error-item"), [e.text for e in b.all(".error-item")]


def each_view(b):
    """Every view of the training run (Compare: of the run with a kept baseline), reached as a user does."""
    select_run(b, "layout/training/dlprof")
    for view in VIEWS:
        if view == "compare":
            select_run(b, "layout/after/dlprof")
        goto(b, view)
        yield view


def hover(b, el):
    b.js(
        "const r = arguments[0].getBoundingClientRect(); arguments[0].dispatchEvent(new MouseEvent('mousemove', "
        "{clientX: r.left + r.width / 2, clientY: r.top + r.height / 2, bubbles: true}));",
        el,
    )


# ---------------------------------------------------------------------------- item 3: one definition per label

# every label shown (headers, row labels, list terms, metric and legend labels, tooltip rows) with the term its
# element (or the nearest one carrying a term) names, and its tooltip; labels that are values (a rank's number)
# are marked data-value
LABELS = """
const out = [];
const shown = (el) => el.getClientRects().length > 0 && getComputedStyle(el).visibility !== 'hidden';
for (const el of document.querySelectorAll('thead th, tbody th, dt, .metric-label, .legend-label, .tip-row .k')) {
  if (!shown(el) || el.closest('[data-value="1"], #print-view')) continue;
  const text = el.textContent.replace(/[↕▲▼]/g, '').trim();
  if (!text) continue;
  const holder = el.closest('[data-term]');
  out.push({text, term: holder ? holder.dataset.term : null, title: holder ? holder.getAttribute('title') : null,
    where: (el.closest('[id]') || {}).id || el.tagName});
}
return out;
"""


def test_every_label_shown_has_its_one_definition(env):
    """Walk every view (and the details drawer, the Iterations and Timeline tooltips): each label is a term of
    dlprof_plugin/terms.py with that term's label and its definition as tooltip, so a label never names two
    figures (the terms' labels are unique: test_plugin_http's check_terms)."""
    b = open_page(env, (1600, 1000))
    seen: dict = {}

    def collect(step: str):
        for item in b.js(LABELS):
            where = f"{step}: {item['where']} {item['text']!r}"
            assert item["term"] in TERMS, f"{where} has no term"
            term = TERMS[item["term"]]
            assert item["text"] == term.label, f"{where} shows {item['text']!r} for {item['term']} ({term.label!r})"
            assert (item["title"] or "").startswith(term.definition), f"{where}: tooltip {item['title']!r}"
            seen.setdefault(item["text"], set()).add(term.definition)

    try:
        for view in each_view(b):
            collect(view)
            if view == "ops_kernels":
                b.click("#ops tbody tr[data-key] td[data-key=op_id]")
                b.wait_css("#op-details table.stats", 15)
                b.wait_css("#op-kernels .datatable[data-state=ready] tbody tr[data-key]", 15)
                b.click("#op-kernels tbody tr[data-key] td[data-key=kernel_name]")
                b.wait_css("#kernel-details dl", 15)
                collect("details")
                b.click("#details-pane button[aria-label='Close details']")
            elif view == "kernels_by_iteration":
                b.click("#iterations-table tbody tr[data-key='1'] td[data-key=iteration]")
                b.wait_css("#iteration-kernels .datatable[data-state=ready] tbody tr[data-key]", 15)
                collect("kernels of an iteration")
            elif view == "iterations":
                hover(b, b.css("#iterations-chart g.bar[data-iteration='1'] rect.hit"))
                b.wait_css("#iterations-chart .chart-tip[data-iteration='1']", 15, visible=True)
                collect("iteration tooltip")
            elif view == "timeline":
                b.wait_css(".view-timeline[data-window='1000000,1080000']", 15)  # iteration 0, as it opens
                for row, t, text in (("g0.7", 1_041_000, "sgemm"), ("gap0", 1_032_000, "idle")):
                    p = b.js(
                        "return document.querySelector('.view-timeline').timelinePoint(arguments[0], arguments[1])",
                        row,
                        t,
                    )
                    b.js(
                        "document.getElementById('timeline-canvas').dispatchEvent(new MouseEvent('mousemove', "
                        "{clientX: arguments[0], clientY: arguments[1], bubbles: true}));",
                        p["x"],
                        p["y"],
                    )
                    b.wait(lambda d: text in b.js("return document.querySelector('.timeline-tip').innerText"), 15, text)
                    b.wait(lambda d: b.all(".timeline-tip .tip-row"), what="the tooltip rows")
                    collect(f"timeline tooltip ({text})")
    finally:
        b.fresh()  # the page left, for the next test
    # the labels the views showed: every one with exactly one definition, and the ones issue 24 named apart
    assert all(len(d) == 1 for d in seen.values())
    assert {"Tensor Core kernels running", "TC Kernel Time per GPU", "All kernels", "Compute Kernel Time"} <= set(seen)
    assert len(seen) > 100


# ---------------------------------------------------------------------------- item 6: layout at two sizes

BOXES = """
const box = (el) => { const r = el.getBoundingClientRect(); return {left: r.left, top: r.top, right: r.right,
  bottom: r.bottom, width: r.width, height: r.height}; };
const nav = document.getElementById('nav-pane');
const cards = [...document.querySelectorAll('#view .card')].filter((c) => !c.parentElement.closest('.card'))
  .map((c) => ({id: c.id, ...box(c)}));
return {/*EXTRA*/ width: document.documentElement.clientWidth, height: document.documentElement.clientHeight,
  scrollWidth: document.documentElement.scrollWidth, cards, main: box(document.querySelector('main.main')),
  nav: box(nav), navShown: getComputedStyle(nav).visibility !== 'hidden' && nav.getBoundingClientRect().right > 0};
"""


def overlap(a: dict, b: dict) -> float:
    return max(0.0, min(a["right"], b["right"]) - max(a["left"], b["left"])) * max(
        0.0, min(a["bottom"], b["bottom"]) - max(a["top"], b["top"])
    )


def check_boxes(b, view: str, size) -> dict:
    g = b.js(BOXES)
    assert g["scrollWidth"] <= g["width"], f"{view} at {size}: the page scrolls sideways"
    for c in g["cards"]:
        assert 0 <= c["left"] and c["right"] <= g["width"] + 0.5, f"{view} at {size}: {c['id']} outside the window"
    for i, c in enumerate(g["cards"]):
        for d in g["cards"][i + 1 :]:
            assert overlap(c, d) < 1, f"{view} at {size}: {c['id']} overlaps {d['id']}"
    if size[0] < 1200:  # collapsed: a rail, the pane only when opened
        assert not g["navShown"] and g["main"]["left"] <= 48, (view, g["nav"], g["main"])
    else:
        assert g["navShown"] and g["main"]["left"] >= g["nav"]["right"] - 0.5
    return g


@pytest.mark.parametrize("size", SIZES, ids=["1600x1000", "1000x700"])
def test_every_view_fits_the_window(env, size):
    b = open_page(env, size)
    try:
        for view in each_view(b):
            check_boxes(b, view, size)
            if view in ("dashboard", "timeline", "compare"):
                b.screenshot(f"layout_{view}_{size[0]}x{size[1]}.png", full_page=False)
        # the collapsed navigation opens over the page and closes once a view is chosen
        if size[0] < 1200:
            b.click("#nav-toggle")
            b.wait(lambda d: b.js(BOXES)["navShown"], what="the navigation opened")
            b.click("button.nav-item[data-view=dashboard]")
            b.wait(lambda d: not b.js(BOXES)["navShown"], what="the navigation closed")
    finally:
        b.fresh()  # the page left, for the next test


@pytest.mark.parametrize("size", SIZES, ids=["1600x1000", "1000x700"])
def test_the_details_drawer_is_beside_the_table(env, size):
    """The drawer opens beside the table (not over it), the table is not scrolled sideways (its Op ID whole), and
    the op's statistics keep their four columns, Maximum included, inside the drawer."""
    b = open_page(env, size)
    try:
        select_run(b, "layout/example/dlprof")
        goto(b, "ops_kernels")
        b.click("#ops tbody tr[data-key]:nth-child(2) td[data-key=op_name]")
        b.wait_css("#op-details table.stats", 15)
        g = b.js(
            BOXES.replace(
                "/*EXTRA*/",
                "drawer: box(document.getElementById('details-pane')), "
                "table: box(document.querySelector('#ops .dt-scroll')), "
                "scrolled: document.querySelector('#ops .dt-scroll').scrollLeft, "
                "opId: box(document.querySelector('#ops tbody tr.selected td[data-key=op_id]')), "
                "maximum: box([...document.querySelectorAll('#op-details table.stats thead th')].pop()), ",
            )
        )
        drawer = g["drawer"]
        assert drawer["left"] >= 0 and drawer["right"] <= g["width"] + 0.5 and drawer["bottom"] <= g["height"] + 0.5
        assert overlap(drawer, g["table"]) < 1, (drawer, g["table"])
        assert all(overlap(drawer, c) < 1 for c in g["cards"]), "the drawer covers the view"
        assert g["scrolled"] == 0
        assert g["table"]["left"] <= g["opId"]["left"] and g["opId"]["right"] <= g["table"]["right"]
        m = g["maximum"]
        assert b.css("#op-details table.stats thead th:last-child").get_attribute("textContent") == "Maximum"
        assert drawer["left"] <= m["left"] and m["right"] <= drawer["right"] - 8, (m, drawer)
        b.screenshot(f"details_drawer_{size[0]}x{size[1]}.png", full_page=False)
    finally:
        b.fresh()  # the page left, for the next test


@pytest.mark.parametrize("size", SIZES, ids=["1600x1000", "1000x700"])
def test_rows_one_line_and_legend_values_unbroken(env, size):
    """Tensor Cores rows one line tall (long kernel names are cut in their cells, whole in their tooltips); the GPU
    Utilization legend keeps each value and its % on one line."""
    b = open_page(env, size)
    try:
        for run in ("layout/training/dlprof", "layout/example/dlprof"):
            select_run(b, run)
            goto(b, "tensor_core")
            heights = b.js(
                "return [...document.querySelectorAll('#tensor-core tbody tr[data-key]')].map((tr) => "
                "tr.getBoundingClientRect().height);"
            )
            line = b.js("return parseFloat(getComputedStyle(document.querySelector('#tensor-core td')).lineHeight)")
            assert heights and max(heights) <= line + 14, (run, heights, line)  # one line and the cell's padding
            goto(b, "dashboard")
            values = b.js(
                "return [...document.querySelectorAll('#panel-gpu-utilization .legend-value')].map((v) => "
                "[v.textContent, v.getClientRects().length]);"
            )
            assert len(values) == 7 and all(text.endswith(" %") and lines == 1 for text, lines in values), values
            check_boxes(b, "dashboard", size)
    finally:
        b.fresh()  # the page left, for the next test
