"""Cross-rank detectors (experts/ranks.py) at their thresholds, on hand-made rank results."""

from __future__ import annotations

import pandas as pd

from dlprof_profiler.experts.ranks import (
    CONSISTENT_SHARE,
    EXPOSED_SHARE,
    IMBALANCE_SHARE,
    STRAGGLER_FACTOR,
    detect_ranks,
)
from dlprof_profiler.outputs.rank_report import rank_table
from tests.test_rank_report import result


def job(durations: dict, compute: dict | None = None, comm: dict | None = None, counts: dict | None = None):
    """Ranks with the given iteration durations (ns), compute-kernel time per rank, (communication, overlapped)."""
    out = []
    for rank, ds in durations.items():
        n = len(ds) if counts is None else counts[rank]
        ds = (list(ds) * n)[:n]
        ends = list(pd.Series(ds).cumsum())
        starts = [0] + ends[:-1]
        c, o = (comm or {}).get(rank, (0, 0))
        r = result(rank, starts, ends, host=f"h{rank}", comm=c, overlap=o)
        work = (compute or {}).get(rank, 0)
        r.kernels = pd.DataFrame(
            {"name": ["gemm", "ncclKernel"], "count": [n, n], "gpu_total": [work, c], "communication": [False, True]}
        )
        r.ops = pd.DataFrame(
            {"name": ["/step/linear"], "direction": ["fprop"], "calls": [n], "cpu_total": [10 * n], "gpu_total": [work]}
        )
        out.append(r)
    return out


def ids(findings) -> list[str]:
    return [f["id"] for f in findings]


def test_straggler_at_the_threshold():
    base = 10_000
    slow = int(base * STRAGGLER_FACTOR) + 10
    results = job({0: [base] * 4, 1: [base] * 4, 2: [slow] * 4, 3: [base] * 4})
    found = [f for f in detect_ranks(results, rank_table(results)) if f["id"] == "straggler_rank_detector"]
    # the median of the other ranks (0, 1, 3, all equal): the middle one, rank 1
    assert len(found) == 1 and found[0]["data"]["rank"] == 2 and found[0]["problem"].startswith("Rank 2 is")
    assert found[0]["data"]["median_rank"] == 1 and found[0]["data"]["slower_iterations"] == 4
    barely = int(base * STRAGGLER_FACTOR) - 10
    results = job({0: [base] * 4, 1: [base] * 4, 2: [barely] * 4})
    assert "straggler_rank_detector" not in ids(detect_ranks(results, rank_table(results)))


def test_one_long_iteration_is_no_straggler():
    """Rank 1's average is 1.75x the others' but from one checkpoint iteration: slower in 1 of 4 < 75 %."""
    results = job({0: [10_000] * 4, 1: [10_000, 10_000, 10_000, 40_000], 2: [10_000] * 4})
    assert 1 / 4 < CONSISTENT_SHARE
    assert "straggler_rank_detector" not in ids(detect_ranks(results, rank_table(results)))


def test_straggler_names_what_differs_from_the_median_rank():
    results = job({0: [10_000] * 2, 1: [20_000] * 2, 2: [10_000] * 2}, compute={0: 4000, 1: 10_000, 2: 4000})
    f = next(f for f in detect_ranks(results, rank_table(results)) if f["id"] == "straggler_rank_detector")
    # per iteration: rank 1 runs 10000 / 2 of gemm, the median rank 4000 / 2: +3 us; CPU time equal
    assert f["data"]["kernels"] == [["gemm", 3000.0]] and f["data"]["ops_gpu"] == [["/step/linear", 3000.0]]
    assert "ops by CPU time: none" in f["problem"]


def test_load_imbalance_threshold():
    even = job({0: [10_000] * 2, 1: [10_000] * 2}, compute={0: 10_000, 1: int(10_000 * (1 - IMBALANCE_SHARE)) + 2})
    assert "load_imbalance_detector" not in ids(detect_ranks(even, rank_table(even)))
    uneven = job({0: [10_000] * 2, 1: [10_000] * 2}, compute={0: 10_000, 1: int(10_000 * (1 - IMBALANCE_SHARE)) - 2})
    f = next(f for f in detect_ranks(uneven, rank_table(uneven)) if f["id"] == "load_imbalance_detector")
    assert (f["data"]["busiest"], f["data"]["idlest"]) == (0, 1)


def test_exposed_communication_threshold():
    """Wall time 20000 ns on one GPU: exposed = communication - overlapped."""
    wall = 20_000
    below = job({0: [10_000] * 2, 1: [10_000] * 2}, comm={0: (5000, 5000 - int(wall * EXPOSED_SHARE) + 1)})
    assert "exposed_communication_detector" not in ids(detect_ranks(below, rank_table(below)))
    above = job({0: [10_000] * 2, 1: [10_000] * 2}, comm={1: (5000, 5000 - int(wall * EXPOSED_SHARE) - 1)})
    f = next(f for f in detect_ranks(above, rank_table(above)) if f["id"] == "exposed_communication_detector")
    assert list(f["data"]["exposed"]) == ["1"] and f["data"]["exposed"]["1"]["time"] == int(wall * EXPOSED_SHARE) + 1


def test_different_iteration_counts_propose_the_common_range():
    results = job({0: [10_000], 1: [10_000]}, counts={0: 5, 1: 3})
    f = next(f for f in detect_ranks(results, rank_table(results)) if f["id"] == "rank_iteration_count_detector")
    assert "rank 0: 5, rank 1: 3" in f["problem"] and f["action"]["iter_stop"] == 2
    same = job({0: [10_000], 1: [10_000]}, counts={0: 3, 1: 3})
    assert "rank_iteration_count_detector" not in ids(detect_ranks(same, rank_table(same)))


def test_one_rank_has_no_cross_rank_findings():
    results = job({0: [10_000] * 3})
    assert detect_ranks(results, rank_table(results)) == []
