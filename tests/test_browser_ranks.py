"""The Ranks view and the Rank selector in a real headless Chromium inside a real TensorBoard, on a 4-rank run
with a slow rank 2 (tests/profiles.rank_profile). Expected values come from the database (sqlite3)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.browser import Browser, TensorBoard, fmt_int, fmt_ns, fmt_pct, query, requires_browser
from tests.profiles import make_logdir, rank_profile, run_dlprof, training_profile

pytestmark = [pytest.mark.browser, requires_browser]
SLOW = 2


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("browser_ranks")
    logdir = make_logdir(root / "logdir", runs={"single": training_profile(root / "training.sqlite")})
    files = [rank_profile(root / f"r{r}.sqlite", r, slow=(r == SLOW)) for r in range(4)]
    run_dlprof(f"--database={','.join(map(str, files))}", f"--output_path={logdir / 'job'}", "-v", "quiet")
    with TensorBoard(logdir) as tb, Browser() as b:
        b.open_dlprof(tb.url)
        b.wait_css("#view .view", 30)
        yield SimpleNamespace(tb=tb, b=b, db=logdir / "job" / "dlprof_dldb.sqlite")


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
    open_run(b, "job/dlprof")
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
    open_run(b, "job/dlprof")
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
    open_run(b, "single/dlprof")
    assert not b.css("#rank-select").is_displayed()
    goto(b, "ranks")
    b.wait_text("#view", "This run has one rank")
    assert "p.dlprof.rank" not in b.js("return window.parent.location.hash")
