"""The cross-rank report of a multi-rank run (`<base>_ranks.csv`, docs/DESIGN.md "Multi-rank analysis"): one row
per rank with its iteration times, GPU utilization, communication time and how much of it compute overlaps, and
how often it was the last rank to finish an iteration (iterations matched across ranks by index)."""

from __future__ import annotations

import csv
import json
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import numpy as np
import pandas as pd

from dlprof_profiler import __version__

COLUMNS = [
    ("rank", "Rank"),
    ("source_file", "Source file"),
    ("gpus", "GPUs"),
    ("iterations", "Iterations"),
    ("avg_iteration_time", "Avg Iteration Time (ns)"),
    ("max_iteration_time", "Max Iteration Time (ns)"),
    ("gpu_utilization", "GPU Utilization %"),
    ("communication_time", "Communication Time (ns)"),
    ("overlapped_communication_pct", "Overlapped Communication %"),
    ("times_slowest", "Times Slowest"),
]
REPORT_NAME = "ranks"


def shared_clock(results) -> bool:
    """Whether the ranks' timestamps can be compared: every rank recorded the absolute time of its time 0 and
    all ran on one host (processes on one host read one clock; across hosts clocks may differ by more than an
    iteration's skew, so durations are compared instead)."""
    hosts = {r.host for r in results}
    return all(r.epoch_ns is not None for r in results) and len(hosts) == 1 and None not in hosts


def matched_iterations(results, column: str = "duration", absolute: bool = False) -> pd.DataFrame:
    """Aggregated complete iterations by index (rows) and rank (columns): `column` of each, NaN where a rank
    did not aggregate that iteration or it is partial (key-node intervals 0 and last: start-up and tear-down,
    whose ends are each profile's own); `absolute` adds each rank's epoch (end times on one clock)."""
    series = {}
    for r in results:
        chosen = r.iterations["aggregated"].to_numpy(dtype=bool)
        if "complete" in r.iterations:
            chosen = chosen & r.iterations["complete"].to_numpy(dtype=bool)
        it = r.iterations[chosen]
        values = it[column].to_numpy(np.float64) + (float(r.epoch_ns) if absolute else 0.0)
        series[r.rank] = pd.Series(values, index=it["iteration"].to_numpy(np.int64))
    return pd.DataFrame(series).sort_index()


def slowest_counts(results) -> dict:
    """Per rank: the matched iterations (complete, aggregated by at least two ranks) in which it was the last to
    finish: the latest end on a shared clock, else the longest duration (ties count for every tied rank)."""
    shared = shared_clock(results)
    frame = matched_iterations(results, "end" if shared else "duration", absolute=shared)
    counts = {r.rank: 0 for r in results}
    if frame.empty:
        return counts
    frame = frame[frame.notna().sum(axis=1) >= 2]
    if frame.empty:
        return counts
    values = frame.to_numpy(np.float64)
    latest = np.nanmax(values, axis=1, keepdims=True)
    hits = (values == latest).sum(axis=0)
    for rank, n in zip(frame.columns, hits):
        counts[int(rank)] = int(n)
    return counts


def rank_table(results) -> pd.DataFrame:
    """One row per rank (rank order), keys of COLUMNS plus total_iterations."""
    slowest = slowest_counts(results)
    rows = []
    for r in sorted(results, key=lambda x: x.rank):
        it = r.iterations[r.iterations["aggregated"].to_numpy(dtype=bool)]
        durations = it["duration"].to_numpy(np.int64)
        s = r.summary
        comm = int(s["communication_time"])
        rows.append(
            {
                "rank": r.rank,
                "source_file": str(r.profile.get("source_file") or r.source),
                "gpus": int(s["gpus"]),
                "iterations": int(durations.size),
                "total_iterations": int(s["total_iterations"]),
                "avg_iteration_time": float(durations.mean()) if durations.size else 0.0,
                "max_iteration_time": int(durations.max()) if durations.size else 0,
                "gpu_utilization": float(s["gpu_utilization"]),
                "communication_time": comm,
                "overlapped_communication_pct": 100.0 * int(s["overlapped_communication_time"]) / comm if comm else 0.0,
                "times_slowest": slowest[r.rank],
            }
        )
    return pd.DataFrame(rows)


def _whole_ns(value: float) -> int:
    """A time in whole nanoseconds (half up), like every other time of the report."""
    return int(Decimal(repr(float(value))).quantize(Decimal(1), rounding=ROUND_HALF_UP))


def _cells(row: dict) -> list:
    return [
        int(row["rank"]),
        row["source_file"],
        int(row["gpus"]),
        int(row["iterations"]),
        _whole_ns(row["avg_iteration_time"]),
        int(row["max_iteration_time"]),
        f"{row['gpu_utilization']:.1f}",
        int(row["communication_time"]),
        f"{row['overlapped_communication_pct']:.1f}",
        int(row["times_slowest"]),
    ]


def write_report(table: pd.DataFrame, out_dir: Path, base_name: str, formats: list[str], place) -> list[Path]:
    """`<base>_ranks.csv` (a header row, then one row per rank; times in whole ns, the average iteration time
    rounded, percentages with one decimal) and/or `<base>_ranks.json` (the JSON reports' layout); `place(final)`
    gives where to write."""
    written = []
    records = table.to_dict("records")
    if "csv" in formats:
        final = Path(out_dir) / f"{base_name}_{REPORT_NAME}.csv"
        with open(place(final), "w", newline="", encoding="utf-8") as fh:
            writer = csv.writer(fh, lineterminator="\n")
            writer.writerow([label for _, label in COLUMNS])
            for row in records:
                writer.writerow(_cells(row))
        written.append(final)
    if "json" in formats:
        final = Path(out_dir) / f"{base_name}_{REPORT_NAME}.json"
        rows = [
            [
                float(c) if isinstance(c, str) and k not in ("source_file",) else c
                for (k, _), c in zip(COLUMNS, _cells(row))
            ]
            for row in records
        ]
        doc = {
            "report": REPORT_NAME,
            "dlprof_version": __version__,
            "sections": [{"title": "Ranks", "columns": [label for _, label in COLUMNS], "rows": rows}],
        }
        Path(place(final)).write_text(json.dumps(doc) + "\n", encoding="utf-8")
        written.append(final)
    return written
