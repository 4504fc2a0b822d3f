"""Sanitize: the trace rows whose timestamps cannot be right are dropped right after ingest, counted per
frame and reported, so no later stage meets a missing time or a negative duration.

Format-neutral: it works on the trace frames any ingest adapter produces. A missing time is
`trace.MISSING_TIME` (what adapters write for NULL) or NaN; a reversed row ends before it starts. Rows of
zero duration are kept. Positional ids (`api_id`, `activity_id`: a row's position in its frame) are
renumbered after a drop; `range_id` is the source's own id and is kept.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from dlprof_profiler.errors import DLProfError
from dlprof_profiler.engine.trace import MISSING_TIME, Trace, combined_codes

# (frame attribute, what its rows are, positional id column or None)
TIMED_FRAMES = (
    ("ranges", "NVTX ranges", None),
    ("api_calls", "CUDA API calls", "api_id"),
    ("gpu", "GPU activities", "activity_id"),
    ("syncs", "GPU synchronizations", None),
    ("io_calls", "I/O calls", None),
)
# the frames an analysis is made of: when all of them are left empty by the drop, nothing is usable
CORE_FRAMES = ("ranges", "api_calls", "gpu")


@dataclasses.dataclass(frozen=True)
class Dropped:
    """Rows of one frame dropped for their timestamps."""

    frame: str
    what: str
    missing: int  # start or end not recorded
    reversed: int  # end before start

    @property
    def total(self) -> int:
        return self.missing + self.reversed

    def describe(self) -> str:
        parts = []
        if self.missing:
            parts.append(f"{self.missing:,} without a start or end time")
        if self.reversed:
            parts.append(f"{self.reversed:,} ending before they start")
        return f"{self.total:,} {self.what} ({', '.join(parts)})"


def _times(values) -> tuple[np.ndarray, np.ndarray]:
    """(int64 times, missing mask) of a start or end column (MISSING_TIME, NaN or None are missing)."""
    array = np.asarray(values)
    if array.dtype.kind == "f" or array.dtype == object:
        floats = pd.to_numeric(pd.Series(array, copy=False), errors="coerce").to_numpy(dtype=np.float64)
        missing = ~np.isfinite(floats)
        return np.where(missing, 0, floats).astype(np.int64), missing
    array = array.astype(np.int64, copy=False)
    return array, array == MISSING_TIME


def invalid_rows(start, end) -> tuple[np.ndarray, np.ndarray]:
    """Masks of rows with a missing start or end, and of the others that end before they start."""
    s, s_missing = _times(start)
    e, e_missing = _times(end)
    missing = s_missing | e_missing
    return missing, ~missing & (e < s)


def drop_invalid_times(
    frame: pd.DataFrame, what: str = "rows", name: str = "", id_column: str | None = None
) -> tuple[pd.DataFrame, Dropped]:
    """The frame without rows whose times are missing or reversed (start/end as int64), and what went."""
    if len(frame) == 0 or "start" not in frame or "end" not in frame:
        return frame, Dropped(name, what, 0, 0)
    missing, reversed_ = invalid_rows(frame["start"].to_numpy(), frame["end"].to_numpy())
    bad = missing | reversed_
    dropped = Dropped(name, what, int(missing.sum()), int(reversed_.sum()))
    if not bad.any():
        if frame["start"].dtype != np.int64 or frame["end"].dtype != np.int64:
            frame = frame.astype({"start": np.int64, "end": np.int64})
        return frame, dropped
    kept = frame.iloc[np.flatnonzero(~bad)].reset_index(drop=True)
    kept = kept.astype({"start": np.int64, "end": np.int64})
    if id_column is not None and id_column in kept:
        kept[id_column] = np.arange(len(kept), dtype=np.int64)
    return kept, dropped


def shared_correlation_ids(api_calls: pd.DataFrame) -> tuple[int, int]:
    """(correlation ids used by more than one API call of one process, calls carrying them)."""
    if len(api_calls) == 0:
        return 0, 0
    corr = api_calls["correlation_id"].to_numpy(np.int64)
    valid = corr >= 0
    corr, pid = corr[valid], api_calls["pid"].to_numpy(np.int64)[valid]
    if corr.size == 0:
        return 0, 0
    if 0 <= pid.min() and pid.max() < 1 << 24 and corr.max() < 1 << 38:
        keys = np.sort((pid << 38) | corr)
    else:
        keys = np.sort(combined_codes(pid, corr))
    first = np.ones(keys.size, dtype=bool)
    first[1:] = keys[1:] != keys[:-1]
    sizes = np.diff(np.append(np.flatnonzero(first), keys.size))
    shared = sizes[sizes > 1]
    return int(shared.size), int(shared.sum())


def drop_warnings(source, drops: list[Dropped], core_before: int, core_after: int, shared: tuple[int, int]) -> list:
    """The warnings about dropped rows and shared correlation ids; a one-line DLProfError when rows were
    dropped and no NVTX range, API call or GPU activity is left (`core_*`: their rows before and after)."""
    warnings = []
    if drops:
        detail = "; ".join(d.describe() for d in drops)
        if core_before and not core_after:
            raise DLProfError(
                f"{source}: no usable events: every NVTX range, CUDA API call and GPU "
                f"activity has a missing or reversed timestamp ({detail})"
            )
        warnings.append(f"{source}: dropped rows with impossible timestamps: {detail}")
    ids, calls = shared
    if ids:
        warnings.append(
            f"{source}: {ids:,} correlation id(s) are used by more than one CUDA API call of "
            f"the same process ({calls:,} calls); each GPU activity is attributed to the nearest "
            "such call starting before it"
        )
    return warnings


def sanitize_trace(trace: Trace) -> Trace:
    """The trace without rows of impossible times, its warnings extended with one line saying what was
    dropped per frame (and one about correlation ids shared within a process). Raises a one-line
    DLProfError when rows were dropped and no NVTX range, API call or GPU activity is left."""
    changes, drops = {}, []
    for name, what, id_column in TIMED_FRAMES:
        frame = getattr(trace, name)
        cleaned, dropped = drop_invalid_times(frame, what, name, id_column)
        if dropped.total:
            changes[name] = cleaned
            drops.append(dropped)
    before = sum(len(getattr(trace, f)) for f in CORE_FRAMES)
    after = sum(len(changes.get(f, getattr(trace, f))) for f in CORE_FRAMES)
    warnings = list(trace.warnings) + drop_warnings(
        trace.source, drops, before, after, shared_correlation_ids(changes.get("api_calls", trace.api_calls))
    )
    return dataclasses.replace(trace, warnings=warnings, **changes)
