"""The cross-rank figures (rank_report.py): iterations matched by index, the last rank to finish on a shared
clock or by duration, and the report files."""

from __future__ import annotations

import csv

import pandas as pd

from dlprof_profiler.run.rank_worker import RankResult
from dlprof_profiler.outputs.rank_report import rank_table, shared_clock, slowest_counts, write_report


def result(rank: int, starts: list[int], ends: list[int], aggregated=None, host="h", epoch=0, comm=0, overlap=0):
    n = len(starts)
    it = pd.DataFrame(
        {
            "iteration": range(n),
            "start": starts,
            "end": ends,
            "duration": [e - s for s, e in zip(starts, ends)],
            "aggregated": aggregated if aggregated is not None else [True] * n,
            "gpu_utilization": 0.0,
            "tc_kernel_time_per_gpu": 0.0,
        }
    )
    summary = {
        "gpus": 1,
        "gpu_utilization": 50.0,
        "total_iterations": n,
        "aggregated_iterations": n,
        "iter_start": 0,
        "iter_stop": n - 1,
        "wall_time": ends[-1] - starts[0],
        "communication_time": comm,
        "overlapped_communication_time": overlap,
        "key_node": "k",
        "key_found": True,
    }
    return RankResult(
        rank=rank,
        source=f"r{rank}",
        database="",
        finals=[],
        profile={},
        primary="default",
        mode="pytorch",
        summary=summary,
        iterations=it,
        ops=pd.DataFrame(),
        kernels=pd.DataFrame(),
        findings=[],
        epoch_ns=epoch,
        host=host,
    )


def test_last_to_finish_on_a_shared_clock():
    """Rank 1 started its clock 500 ns later: its iteration 0 [0, 900) ends at 1400 on the shared clock, after
    rank 0's [0, 1000); iteration 1 ends at 2000 (rank 0) and 1900 (rank 1)."""
    a = result(0, [0, 1000], [1000, 2000], epoch=0)
    b = result(1, [0, 900], [900, 1400], epoch=500)
    assert shared_clock([a, b])
    assert slowest_counts([a, b]) == {0: 1, 1: 1}


def test_durations_when_the_clock_is_not_shared():
    """Other hosts (or no absolute start): the longer iteration is the slower one."""
    a = result(0, [0, 1000], [1000, 2000], host="h1")
    b = result(1, [0, 900], [900, 1400], host="h2", epoch=500)
    assert not shared_clock([a, b])
    assert slowest_counts([a, b]) == {0: 2, 1: 0}
    c = result(2, [0, 900], [900, 1400], host="h1", epoch=None)
    assert not shared_clock([a, c])


def test_ties_and_unmatched_iterations():
    """Iteration 0 ties (both count); iteration 2 exists on rank 0 only and iteration 1 is not aggregated on
    rank 1: neither is matched."""
    a = result(0, [0, 100, 300], [100, 300, 400], host="x", epoch=None)
    b = result(1, [0, 100], [100, 150], aggregated=[True, False], host="y")
    assert slowest_counts([a, b]) == {0: 1, 1: 1}


def test_table_and_csv(tmp_path):
    a = result(0, [0, 1000, 2000], [1000, 2000, 2500], comm=300, overlap=100)
    b = result(1, [0, 1200], [1200, 2400], aggregated=[True, False], comm=0)
    table = rank_table([b, a])
    assert table["rank"].tolist() == [0, 1]
    row0, row1 = table.to_dict("records")
    assert (row0["iterations"], row0["avg_iteration_time"], row0["max_iteration_time"]) == (3, 2500 / 3, 1000)
    assert row0["overlapped_communication_pct"] == 100 * 100 / 300
    assert (row1["iterations"], row1["avg_iteration_time"], row1["overlapped_communication_pct"]) == (1, 1200.0, 0.0)
    written = write_report(table, tmp_path, "dlprof", ["csv"], lambda p: p)
    rows = list(csv.reader(written[0].read_text().splitlines()))
    # one shared clock: iteration 0 ends at 1000 (rank 0) and 1200 (rank 1); no other iteration is matched
    assert rows[1] == ["0", "r0", "1", "3", "833", "1000", "50.0", "300", "33.3", "0"]
    assert rows[2][-1] == "1"


def test_every_time_of_the_csv_is_whole_nanoseconds(tmp_path):
    """dlprof_ranks.csv: the average iteration time rounds half up to whole ns like every other time (it used to
    read 205411500.0 among integers); percentages keep one decimal."""
    a = result(0, [0, 1000], [1001, 2000])  # durations 1001 and 1000: average 1000.5 -> 1001
    b = result(1, [0, 1000, 2000], [1000, 2000, 3001])  # 1000, 1000, 1001: average 1000.33 -> 1000
    written = write_report(rank_table([a, b]), tmp_path, "dlprof", ["csv", "json"], lambda p: p)
    header, *rows = list(csv.reader(written[0].read_text().splitlines()))
    times = [i for i, name in enumerate(header) if name.endswith("(ns)")]
    assert [header[i] for i in times] == [
        "Avg Iteration Time (ns)",
        "Max Iteration Time (ns)",
        "Communication Time (ns)",
    ]
    assert all(r[i].isdigit() for r in rows for i in times), rows
    assert [r[times[0]] for r in rows] == ["1001", "1000"]
    import json

    (section,) = json.loads(written[1].read_text())["sections"]
    assert [r[section["columns"].index("Avg Iteration Time (ns)")] for r in section["rows"]] == [1001, 1000]
