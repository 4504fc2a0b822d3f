"""One rank in a worker (rank_analysis.py), run in this process: its database and reports go into the staging
folder, only small frames come back (figures of tests/profiles.rank_profile, computed by hand)."""

from __future__ import annotations

import pytest

import sqlite3
from pathlib import Path

from dlprof_profiler import contract as K
from dlprof_profiler.cli.main import parse_options
from dlprof_profiler.outputs.publish import Staging
from dlprof_profiler.run.rank_worker import DOMAINS_PER_RANK, RankTask, analyze_rank
from tests.profiles import RANK_STEPS, SLOW_ITERATION, rank_profile


def task_for(tmp_path: Path, source: Path, rank: int, index: int) -> tuple[RankTask, Staging]:
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    staging = Staging(out)
    options = parse_options([f"--database={source}", f"--output_path={out}", "--reports=summary,kernel"])
    return RankTask(
        rank=rank, index=index, source=str(source), options=options, output_dir=str(out), staging_root=str(staging.root)
    ), staging


@pytest.mark.slow
def test_a_rank_in_a_worker(tmp_path):
    source = rank_profile(tmp_path / "r5.sqlite", 5, slow=True)
    task, staging = task_for(tmp_path, source, rank=5, index=2)
    (staging.root / ".ranks").mkdir()
    result = analyze_rank(task)
    # what comes back: the slow rank's three 80 us steps and its 1 us tail; 3 x 10 us of NCCL, all overlapped
    assert result.rank == 5 and result.primary == "default" and result.mode == "pytorch"
    assert result.iterations["duration"].tolist() == [SLOW_ITERATION] * RANK_STEPS + [1000]
    assert (result.summary["communication_time"], result.summary["overlapped_communication_time"]) == (30_000, 30_000)
    kernels = result.kernels.set_index("name")
    assert kernels.loc["ncclDevKernel_AllReduce_Sum_f32_RING_LL", "communication"]
    assert int(kernels.loc["volta_sgemm_32x32_sliced1x4_tn", "gpu_total"]) == RANK_STEPS * 40_000
    assert not kernels.loc["volta_sgemm_32x32_sliced1x4_tn", "communication"]
    assert result.graph is None  # only the first rank's op graph is kept (the TensorBoard run shows it)
    # its reports in the staging folder under their final names with the rank suffix
    assert sorted(Path(f).name for f in result.finals) == ["dlprof_kernel_rank5.csv", "dlprof_summary_rank5.csv"]
    assert (staging.root / "dlprof_summary_rank5.csv").exists()
    # its database: rank 5, keys scoped by it, NVTX domains numbered from its position x DOMAINS_PER_RANK
    con = sqlite3.connect(result.database)
    try:
        assert con.execute(f"SELECT DISTINCT rank FROM {K.RAW_GPU_ACTIVITIES}").fetchall() == [(5,)]
        assert {r[0] >> K.ID_BITS for r in con.execute(f"SELECT activity_id FROM {K.RAW_GPU_ACTIVITIES}")} == {5}
        assert con.execute(f"SELECT domain_id, rank FROM {K.RAW_DOMAINS}").fetchall() == [(2 * DOMAINS_PER_RANK, 5)]
        assert {r[0] >> K.ID_BITS for r in con.execute(f"SELECT instance_id FROM {K.RAW_OP_INSTANCES}")} == {
            2 * DOMAINS_PER_RANK
        }
        assert (
            con.execute(
                "SELECT count(*) FROM sqlite_master WHERE type = 'index' AND name IN "
                "('idx_instances_start', 'idx_instances_op')"
            ).fetchone()[0]
            == 0
        )  # the merge builds them
    finally:
        con.close()
    staging.discard()
