"""Which engine analyses a source: an nsys export of OUT_OF_CORE_EVENTS events or more (or any, with
--out_of_core=on) is staged on disk and analysed out of core; everything else in memory."""

from __future__ import annotations

from pathlib import Path

from dlprof_profiler import log
from dlprof_profiler.ingest import formats as ingest
from dlprof_profiler.ingest.sqlite_source import SqliteSource
from dlprof_profiler.options import OUT_OF_CORE_EVENTS, RunOptions


def out_of_core(source: Path, options: RunOptions) -> bool:
    """Whether to analyse an nsys export out of core (--out_of_core; auto: by its number of events)."""
    choice = options.out_of_core or "auto"
    if choice == "off" or ingest.trace_format(source) != ingest.SQLITE:
        if choice == "on":
            log.warning(f"{source}: --out_of_core applies to Nsight Systems exports; this trace is read in memory")
        return False
    return choice == "on" or export_events(source) >= OUT_OF_CORE_EVENTS


def size_bounded(source: Path, options: RunOptions) -> bool:
    """Whether a source analysed in memory is one the automatic choice bounds in size: an nsys export of fewer
    than OUT_OF_CORE_EVENTS events (a Kineto trace, an nsys report or an export forced in memory is not)."""
    return (options.out_of_core or "auto") == "auto" and ingest.trace_format(source) == ingest.SQLITE


def export_events(source: Path) -> int:
    """About how many NVTX ranges, CUDA API calls and GPU activities an nsys export holds (the largest rowid
    of each table: no table scan)."""
    src = SqliteSource(source, immutable=True)
    try:
        return sum(
            int(src.query_scalar(f"SELECT coalesce(max(rowid), 0) FROM {t}") or 0)
            for t in (
                "NVTX_EVENTS",
                "CUPTI_ACTIVITY_KIND_RUNTIME",
                "CUPTI_ACTIVITY_KIND_KERNEL",
                "CUPTI_ACTIVITY_KIND_MEMCPY",
                "CUPTI_ACTIVITY_KIND_MEMSET",
            )
            if src.has(t)
        )
    finally:
        src.close()
