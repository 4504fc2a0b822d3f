"""Ranks' databases merged into one (rank_merge.py): the first file renamed, the others appended with their
string ids and op indexes shifted, every rank readable as before."""

from __future__ import annotations

import pytest

import sqlite3

import pandas as pd

from dlprof_profiler import contract as K
from dlprof_profiler.db import writer as database
from dlprof_profiler.run.rank_worker import analyze_rank
from dlprof_profiler.db.merge import MergedDatabase
from tests.profiles import rank_profile
from tests.test_rank_analysis import task_for


@pytest.mark.slow
def test_merge_shifts_names_and_op_indexes(tmp_path):
    results = []
    for index, rank in enumerate((0, 3)):
        task, staging = task_for(
            tmp_path, rank_profile(tmp_path / f"r{rank}.sqlite", rank, slow=rank == 3), rank, index
        )
        (staging.root / ".ranks").mkdir(exist_ok=True)
        results.append(analyze_rank(task))
    first = sqlite3.connect(results[0].database)
    strings0 = first.execute("SELECT count(*), max(id) FROM strings").fetchone()
    ops0 = first.execute("SELECT count(*) FROM raw_ops").fetchone()[0]
    first.close()
    own_ranges = {r.rank: database.load_model(r.database, r.rank)[0].ranges for r in results}
    merged = MergedDatabase(tmp_path / "run.sqlite")
    for r in results:
        merged.add(r.database, r.rank)
    table = pd.DataFrame(
        [
            {
                "rank": r.rank,
                "source_file": r.source,
                "gpus": 1,
                "iterations": 4,
                "total_iterations": 4,
                "avg_iteration_time": 1.0,
                "max_iteration_time": 1,
                "gpu_utilization": 1.0,
                "communication_time": 0,
                "overlapped_communication_pct": 0.0,
                "times_slowest": 0,
            }
            for r in results
        ]
    )
    merged.finish({"ranks": [0, 3]}, {"elapsed_seconds": 1.5}, table, [])
    con = sqlite3.connect(tmp_path / "run.sqlite")
    try:
        # rank 3's strings follow rank 0's; every name of rank 3 resolves to its own text
        assert con.execute("SELECT min(id) FROM strings").fetchone()[0] == 0
        names = con.execute(
            "SELECT DISTINCT s.value FROM raw_gpu_activities g JOIN strings s ON s.id = g.name_id "
            "WHERE g.rank = 3 ORDER BY 1"
        ).fetchall()
        assert names == [("ncclDevKernel_AllReduce_Sum_f32_RING_LL",), ("volta_sgemm_32x32_sliced1x4_tn",)]
        assert con.execute("SELECT min(name_id) FROM raw_gpu_activities WHERE rank = 3").fetchone()[0] > strings0[1]
        # so do the kernel names of the derived tables (schema 3.4: string ids too), and their long names
        kernels = (
            "SELECT DISTINCT s.value, l.value FROM kernel_summaries k JOIN strings s ON s.id = k.name_id "
            "JOIN strings l ON l.id = k.long_name_id WHERE k.rank = ? ORDER BY 1"
        )
        assert con.execute(kernels, (3,)).fetchall() == [(n, n) for (n,) in names]
        launched = (
            "SELECT DISTINCT s.value, s.value FROM raw_gpu_activities g JOIN strings s ON s.id = g.name_id "
            "WHERE g.rank = ? AND g.kind = 0 ORDER BY 1"
        )
        assert con.execute(kernels, (0,)).fetchall() == con.execute(launched, (0,)).fetchall() != []
        # op indexes: rank 0's 0..n-1, rank 3's next; the derived tables point at the same ops
        assert con.execute("SELECT min(op_index) FROM raw_ops WHERE rank = 3").fetchone()[0] == ops0
        assert (
            con.execute(
                "SELECT count(*) FROM op_nodes n JOIN raw_ops o ON o.op_index = n.op_index WHERE n.rank != o.rank"
            ).fetchone()[0]
            == 0
        )
        assert dict(con.execute(f"SELECT rank, count(*) FROM {K.RANK_PROFILE_INFO} GROUP BY rank")).keys() == {0, 3}
        assert con.execute("SELECT elapsed_seconds FROM aggregations").fetchall() == [(1.5,)]
        assert con.execute(f"SELECT rank FROM {K.RANK_SUMMARY} ORDER BY rank").fetchall() == [(0,), (3,)]
    finally:
        con.close()
    for r in results:
        trace, corr, profile, _, _ = database.load_model(tmp_path / "run.sqlite", r.rank)
        assert profile["source_file"] == str(r.source)
        # the ranges' texts, read through their blocks' shifted string base, are the rank's own
        assert len(trace.ranges) > 0
        pd.testing.assert_frame_equal(trace.ranges, own_ranges[r.rank])
        assert corr.domains["default"].ops["name"].tolist() == [
            "/aten::conv2d",
            "/c10d::allreduce_",
            "unassociated_cudaDeviceSynchronize",
        ]
