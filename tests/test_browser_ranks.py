"""The Ranks view and the Rank selector in a real headless Chromium inside a real TensorBoard, on a 4-rank run
with a slow rank 2 (tests/profiles.rank_profile). Expected values come from the database (sqlite3)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.browser import fmt_int, fmt_ns, fmt_pct, query, requires_browser
from tests.nsys_builder import NsysExport
from tests.profiles import RANK_STEPS, make_logdir, rank_profile, run_dlprof

pytestmark = [pytest.mark.browser, requires_browser]
SLOW = 2


def tail_profile(path: Path, pid: int = 1001, steps: int = 2) -> Path:
    """A rank whose capture ends with its last optimizer step: per iteration (T = 1 ms + i * 50 us) a conv2d
    [T, T+10us) launching a 20 us kernel, the step [T+48us, T+50us); nothing after the last step, so the
    iteration after it (from the step's end to the capture's end) has no time at all."""
    exp = NsysExport(schema="2022.4")
    exp.add_gpu(device_id=0)
    tid = exp.add_thread(pid=pid, tid=pid, name="python", process_name="python")
    for i in range(steps):
        t = 1_000_000 + i * 50_000
        exp.push_pop(tid, t, t + 10_000, f"aten::conv2d, seq = {i}, op_id = {i}")
        exp.launch(tid, t + 1000, t + 2000, t + 3000, t + 23_000, kernel="sgemm_kernel")
        exp.push_pop(tid, t + 48_000, t + 50_000, "Optimizer.step#SGD.step")
    exp.set_session(start_time=0)
    return exp.write(path)


@pytest.fixture(scope="module")
def env(tmp_path_factory, tensorboard, browser, training_run):
    root = tmp_path_factory.mktemp("browser_ranks")
    runs = {"single": training_run, "tail": tail_profile(root / "tail.sqlite")}
    logdir = make_logdir(root / "logdir", runs=runs)
    files = [rank_profile(root / f"r{r}.sqlite", r, slow=(r == SLOW)) for r in range(4)]
    run_dlprof(f"--database={','.join(map(str, files))}", f"--output_path={logdir / 'job'}", "-v", "quiet")
    short = [rank_profile(root / "s0.sqlite", 0), tail_profile(root / "s1.sqlite", pid=1001, steps=RANK_STEPS)]
    run_dlprof(f"--database={','.join(map(str, short))}", f"--output_path={logdir / 'short'}", "-v", "quiet")
    logdir = tensorboard.publish("ranks", logdir)
    b = browser.fresh()
    b.open_dlprof(tensorboard.url, run="ranks/job/dlprof")
    b.wait_css("#view .view", 30)
    return SimpleNamespace(tb=tensorboard, b=b, db=logdir / "job" / "dlprof_dldb.sqlite")


def select(b, css: str, value: str):
    b.choose(css, value)


def open_run(b, run: str):
    if b.js("return document.getElementById('run-select').value") != run:
        select(b, "#run-select", run)
    b.wait(
        lambda d: b.js("return document.getElementById('run-select').value") == run and b.all("#view .view"),
        what=f"run {run}",
    )


def goto(b, view: str):
    b.click(f"button.nav-item[data-view={view}]")
    b.wait(lambda d: b.js("return document.getElementById('view').dataset.view") == view, what=f"view {view}")


def test_ranks_view_shows_the_cross_rank_table_and_the_straggler(env):
    b, db = env.b, env.db
    open_run(b, "ranks/job/dlprof")
    assert b.css("#rank-select").is_displayed()
    assert [o.get_attribute("value") for o in b.all("#rank-select option")] == ["0", "1", "2", "3"]
    goto(b, "ranks")
    b.wait(lambda d: len(b.all("#rank-table tbody tr")) == 4, what="the four ranks")
    rows = query(
        db,
        "SELECT rank, iterations, avg_iteration_time, max_iteration_time, gpu_utilization, "
        "communication_time, overlapped_communication_pct, times_slowest, straggler FROM rank_summary "
        "WHERE aggr_id = 1 ORDER BY rank",
    )
    for rank, its, avg, mx, util, comm, overlap, slowest, straggler in rows:
        row = b.css(f"#rank-table tbody tr[data-rank='{rank}']")
        cells = [td.text for td in row.find_elements("css selector", "td")]
        assert cells[0].startswith(str(rank))
        assert cells[3:10] == [
            fmt_int(its),
            fmt_ns(avg),
            fmt_ns(mx),
            fmt_pct(util),
            fmt_ns(comm),
            fmt_pct(overlap),
            fmt_int(slowest),
        ]
        assert ("straggler" in row.get_attribute("class")) == bool(straggler) == (rank == SLOW)
    assert b.css(f"#rank-table tbody tr[data-rank='{SLOW}'] .straggler-badge").text.lower() == "straggler"
    series = b.all("#rank-iterations g.rank-series")
    assert [s.get_attribute("data-rank") for s in series] == ["0", "1", "2", "3"]
    assert "straggler" in series[SLOW].get_attribute("class")
    # each rank's line has a point per aggregated iteration
    assert all(len(s.find_elements("css selector", "circle")) == 4 for s in series)
    assert "Rank 2 is a straggler" in b.css("#rank-findings").text
    b.screenshot("view_ranks.png")


def test_rank_selector_applies_to_every_view(env):
    b, db = env.b, env.db
    open_run(b, "ranks/job/dlprof")
    goto(b, "dashboard")
    for rank in ("2", "0"):
        select(b, "#rank-select", rank)
        gpu = query(
            db,
            "SELECT n.gpu_total FROM op_nodes n JOIN read_only_ops o ON o.op_index = n.op_index "
            "WHERE n.aggr_id = 1 AND n.rank = ? AND o.op_name = '/aten::conv2d'",
            (int(rank),),
        )[0][0]
        b.wait(
            lambda d: (
                f"rank {rank}" in b.css(".view-subtitle").text
                and b.all("#panel-top-ops tbody tr")
                and fmt_ns(gpu) in b.css("#panel-top-ops").text
            ),
            what=f"rank {rank}'s top ops",
        )
    assert b.js("return window.parent.location.hash").find("p.dlprof.rank=0") >= 0
    goto(b, "ranks")
    b.wait(lambda d: b.all("#rank-table tbody tr[data-rank='3'] button"), what="the rank table")
    b.click("#rank-table tbody tr[data-rank='3'] button")
    b.wait(
        lambda d: (
            b.js("return document.getElementById('view').dataset.view") == "dashboard"
            and b.js("return document.getElementById('rank-select').value") == "3"
        ),
        what="rank 3's dashboard",
    )


def test_single_rank_runs_hide_the_selector(env):
    b = env.b
    open_run(b, "ranks/single/dlprof")
    assert not b.css("#rank-select").is_displayed()
    goto(b, "ranks")
    b.wait_text("#view", "This run has one rank")
    assert "p.dlprof.rank" not in b.js("return window.parent.location.hash")


# ---------------------------------------------------------------------------- issue 24, item 7


def test_an_iteration_without_time_is_absent_not_zero(env):
    """A capture ending with its last key node has a last iteration of 0 ns (from the step's end to the capture's
    end): the Ranks chart leaves it out of the rank's line and the Iterations chart draws no bar for it, neither
    draws it as an iteration of 0 ms."""
    b, db = env.b, env.db.parent.parent / "short" / "dlprof_dldb.sqlite"
    durations = {
        (rank, it): d
        for rank, it, d in query(
            db,
            "SELECT d.rank, s.iter_value, s.duration FROM iteration_summary s JOIN read_only_domains d "
            "ON d.domain_id = s.domain_id WHERE d.is_primary AND s.aggr_id = 1",
        )
    }
    empty = {key for key, d in durations.items() if d == 0}
    assert empty == {(1, RANK_STEPS)}  # rank 1's tail
    open_run(b, "ranks/short/dlprof")
    goto(b, "ranks")
    b.wait(lambda d: len(b.all("#rank-iterations g.rank-series")) == 2, what="the two ranks' lines")
    points = b.js(
        "return [...document.querySelectorAll('#rank-iterations g.rank-series')].map((g) => [g.dataset.rank, "
        "[...g.querySelectorAll('circle title')].map((t) => t.textContent)]);"
    )
    drawn = {int(rank): titles for rank, titles in points}
    assert len(drawn[0]) == RANK_STEPS + 1 and len(drawn[1]) == RANK_STEPS  # rank 1: its steps, not its tail
    assert not any(t.endswith(": 0 ns") for titles in drawn.values() for t in titles)
    # the polyline goes through the drawn points only (none at the chart's bottom, 0 ms)
    lows = b.js(
        "const svg = document.querySelector('#rank-iterations svg'); const h = svg.viewBox.baseVal.height;"
        "return [...svg.querySelectorAll('g.rank-series polyline')].flatMap((p) => [...p.points].map((q) => q.y))"
        ".filter((y) => y >= h - 34 - 0.5).length;"
    )
    assert lows == 0
    b.screenshot("ranks_tail_iteration.png")
    # the Iterations chart of a single capture ending at its key node
    tail = env.db.parent.parent / "tail" / "dlprof_dldb.sqlite"
    tail_durations = dict(query(tail, "SELECT iter_value, duration FROM iteration_summary WHERE aggr_id = 1"))
    assert tail_durations == {0: 50_000, 1: 50_000, 2: 0}
    open_run(b, "ranks/tail/dlprof")
    goto(b, "iterations")
    b.wait(lambda d: b.all("#iterations-chart g.bar"), what="the iteration bars")
    assert [g.get_attribute("data-iteration") for g in b.all("#iterations-chart g.bar")] == ["0", "1"]
    assert "iteration 2 has no time" in b.css("#iterations-chart .chart-info").text
    goto(b, "dashboard")
    b.wait(lambda d: b.all("#panel-iterations g.bar"), what="the dashboard's iteration bars")
    assert [g.get_attribute("data-iteration") for g in b.all("#panel-iterations g.bar")] == ["0", "1"]
