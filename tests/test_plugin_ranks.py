"""The multi-rank routes and the `rank` parameter (dlprof_plugin/ranks.py, service.py) over HTTP against a real
TensorBoard process, on a 4-rank run with a slow rank 2 (tests/profiles.rank_profile); expected values from the
database (sqlite3) and the profile's hand-computed figures."""

from __future__ import annotations


import pytest

from tests import test_plugin_checks as checks
from tests.profiles import RANK_ITERATION, RANK_STEPS, SLOW_ITERATION, make_logdir, rank_profile, run_dlprof

pytestmark = pytest.mark.slow  # TensorBoard and multi-rank CLI runs


SLOW = 2
RUN = "plugin_ranks/job/dlprof"


@pytest.fixture(scope="module")
def tb(tmp_path_factory, tensorboard, training_run):
    base = tmp_path_factory.mktemp("plugin_ranks")
    logdir = make_logdir(base / "logdir", {"single": training_run})
    files = [rank_profile(base / f"r{r}.sqlite", r, slow=(r == SLOW)) for r in range(4)]
    run_dlprof(f"--database={','.join(map(str, files))}", f"--output_path={logdir / 'job'}", "-v", "quiet")
    logdir = tensorboard.publish("plugin_ranks", logdir)
    return {"api": checks.Api(tensorboard.url), "db": logdir / "job" / "dlprof_dldb.sqlite", "files": files}


def test_ranks_route(tb):
    doc = tb["api"].get("ranks", run=RUN)
    assert doc["default"] == 0
    assert [(r["rank"], r["source_file"], r["host_name"]) for r in doc["ranks"]] == [
        (r, str(tb["files"][r].resolve()), "node0") for r in range(4)
    ]
    single = tb["api"].get("ranks", run="plugin_ranks/single/dlprof")
    assert [r["rank"] for r in single["ranks"]] == [0] and single["default"] == 0
    assert single["ranks"][0]["source_file"].endswith("training.sqlite")


def test_rank_summary_route(tb):
    doc = tb["api"].get("rank_summary", run=RUN)
    rows = checks.db_rows(
        tb["db"],
        "SELECT rank, avg_iteration_time, times_slowest, straggler FROM rank_summary WHERE aggr_id = 1 ORDER BY rank",
    )
    assert [(r["rank"], r["avg_iteration_time"], r["times_slowest"], r["straggler"]) for r in doc["ranks"]] == [
        (r, a, t, bool(s)) for r, a, t, s in rows
    ]
    assert doc["stragglers"] == [SLOW]
    for rank in range(4):
        length = SLOW_ITERATION if rank == SLOW else RANK_ITERATION
        assert [it["duration"] for it in doc["iterations"][str(rank)]] == [length] * RANK_STEPS + [1000]
    assert [f["exp_sys_id"] for f in doc["findings"]] == ["straggler_rank_detector", "load_imbalance_detector"]
    assert doc["findings"][0]["data"]["rank"] == SLOW
    assert tb["api"].get("rank_summary", run="plugin_ranks/single/dlprof") == {
        "ranks": [],
        "iterations": {},
        "findings": [],
        "stragglers": [],
    }


def test_every_route_shows_the_chosen_rank(tb):
    api = tb["api"]
    for rank in range(4):
        length = SLOW_ITERATION if rank == SLOW else RANK_ITERATION
        dash = api.get("dashboard", run=RUN, rank=rank)
        assert dash["summary"]["avg_iteration_time"] == (RANK_STEPS * length + 1000) / 4
        conv = next(o for o in dash["top_ops"] if o["op_name"] == "/aten::conv2d")
        assert conv["gpu_total"] == RANK_STEPS * (40_000 if rank == SLOW else 20_000)
        its = api.get("iterations", run=RUN, rank=rank)
        assert [i["duration"] for i in its["iterations"]] == [length] * RANK_STEPS + [1000]
        _, kernels = api.table("iteration_kernels", run=RUN, rank=rank, iteration=1)
        sgemm = next(k for k in kernels if k["kernel_name"] == "volta_sgemm_32x32_sliced1x4_tn")
        assert sgemm["gpu_duration"] == (40_000 if rank == SLOW else 20_000) and sgemm["api_time"] == 1000
        assert sgemm["gpu_start_offset"] == 3000
        gpus = api.get("gpus", run=RUN, rank=rank)["gpus"]
        assert len(gpus) == 1 and gpus[0]["device_id"] == 0
        domains = api.get("domains", run=RUN, rank=rank)["domains"]
        assert [d["domain_id"] for d in domains] == [rank * 1024]
        findings = api.get("expert_systems", run=RUN, rank=rank)["findings"]
        assert findings and not any(f["exp_sys_id"] == "straggler_rank_detector" for f in findings)
    # the default is rank 0
    assert api.get("dashboard", run=RUN)["summary"] == api.get("dashboard", run=RUN, rank=0)["summary"]


def test_bad_rank_parameters(tb):
    api = tb["api"]
    assert api.get("dashboard", expect=404, run=RUN, rank=7)["error"] == "unknown rank 7"
    assert "must be an integer" in api.get("dashboard", expect=400, run=RUN, rank="two")["error"]
    assert api.get("dashboard", expect=404, run="plugin_ranks/single/dlprof", rank=1)["error"] == "unknown rank 1"
    assert api.get("dashboard", run="plugin_ranks/single/dlprof", rank=0)["summary"]["iter_total"] == 4
