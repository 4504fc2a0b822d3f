"""Vectorized interval algebra on half-open [start, end) integer nanosecond intervals.

Two ways to combine intervals are used throughout (DESIGN.md "Time"): *accumulate* (plain sums) and
*flatten* (the union, overlaps counted once). Everything here works on whole arrays; nothing loops per
interval in Python.
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def union_length_by_group(groups, starts, ends) -> pd.Series:
    """Flattened length of the intervals of each group (index: group key, sorted)."""
    g = np.asarray(groups)
    s = np.asarray(starts, dtype=np.int64)
    e = np.asarray(ends, dtype=np.int64)
    if g.size == 0:
        return pd.Series(dtype=np.int64)
    order = np.lexsort((s, g))
    g, s, e = g[order], s[order], e[order]
    first = np.ones(g.size, dtype=bool)
    first[1:] = g[1:] != g[:-1]
    # Sorted by start, an interval adds only what reaches past the furthest end seen before it in its group.
    reach = grouped_cummax(first, e)
    floor = s.copy()
    later = np.flatnonzero(~first)
    floor[later] = np.maximum(s[later], reach[later - 1])
    added = np.clip(e - floor, 0, None)
    heads = np.flatnonzero(first)
    return pd.Series(np.add.reduceat(added, heads), index=g[heads])


def grouped_cummax(first: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Running maximum of int64 `values` restarting where `first` is set (groups of consecutive elements):
    one accumulate over values lifted by group rank, so every group lies above the ones before it (pandas'
    groupby when that lift would overflow)."""
    values = np.asarray(values, dtype=np.int64)
    if values.size == 0:
        return values.copy()
    rank = np.cumsum(first) - 1
    low, high = int(values.min()), int(values.max())
    span = high - low + 1
    if (int(rank[-1]) + 1) * span >= 1 << 62:
        return pd.Series(values).groupby(rank).cummax().to_numpy(np.int64)
    lift = rank * span - low
    return np.maximum.accumulate(values + lift) - lift


def merge_intervals(starts, ends) -> tuple[np.ndarray, np.ndarray]:
    """Union of intervals as sorted, disjoint, non-touching segments (starts, ends)."""
    s = np.asarray(starts, dtype=np.int64)
    e = np.asarray(ends, dtype=np.int64)
    keep = e > s
    s, e = s[keep], e[keep]
    if s.size == 0:
        return s, e
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    reach = np.maximum.accumulate(e)
    # A new segment starts where an interval begins after everything before it has ended.
    new_segment = np.empty(s.size, dtype=bool)
    new_segment[0] = True
    new_segment[1:] = s[1:] > reach[:-1]
    seg_id = np.cumsum(new_segment) - 1
    seg_start = s[new_segment]
    seg_end = np.zeros(seg_start.size, dtype=np.int64)
    np.maximum.at(seg_end, seg_id, e)
    return seg_start, seg_end


def covered_length(seg_start: np.ndarray, seg_end: np.ndarray, win_start, win_end) -> np.ndarray:
    """Length of merged segments inside each window [win_start, win_end) (windows vectorized)."""
    win_start = np.asarray(win_start, dtype=np.int64)
    win_end = np.asarray(win_end, dtype=np.int64)
    if seg_start.size == 0:
        return np.zeros(win_start.shape, dtype=np.int64)
    cum = np.concatenate([[0], np.cumsum(seg_end - seg_start)])

    def covered_before(t):
        # Covered time in (-inf, t): whole segments ending before t plus the part of the one containing t.
        idx = np.searchsorted(seg_start, t, side="right")  # segments starting at or before t
        full = cum[np.maximum(idx - 1, 0)]
        last = np.maximum(idx - 1, 0)
        partial = np.clip(np.minimum(t, seg_end[last]) - seg_start[last], 0, None)
        return np.where(idx > 0, full + partial, 0)

    return np.clip(covered_before(win_end) - covered_before(win_start), 0, None)


def segment_starts(keys: np.ndarray) -> np.ndarray:
    """For sorted segment keys, the index where each element's segment begins."""
    n = keys.size
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    first = np.empty(n, dtype=bool)
    first[0] = True
    first[1:] = keys[1:] != keys[:-1]
    idx = np.where(first, np.arange(n), 0)
    return np.maximum.accumulate(idx)


class StreamingUnion:
    """Flattened length per key of intervals that arrive chunk by chunk.

    `flush(cut)` declares that every interval still to come starts at or after `cut`: merged segments that
    end by then are final and only their lengths are kept, so memory holds just the segments still open at
    the cut. An interval that arrives starting before the last flush point is clipped to it (it cannot
    overlap finalized time twice)."""

    def __init__(self):
        self._keys: list[np.ndarray] = []
        self._s: list[np.ndarray] = []
        self._e: list[np.ndarray] = []
        self._floor: int | None = None
        self._totals = pd.Series(dtype=np.int64)

    def add(self, keys, starts, ends) -> None:
        keys = np.asarray(keys, dtype=np.int64)
        s = np.asarray(starts, dtype=np.int64)
        e = np.asarray(ends, dtype=np.int64)
        if self._floor is not None:
            s = np.maximum(s, self._floor)
        keep = e > s
        if not keep.all():
            keys, s, e = keys[keep], s[keep], e[keep]
        if keys.size:
            self._keys.append(keys)
            self._s.append(s)
            self._e.append(e)

    def flush(self, cut: int) -> None:
        self._floor = cut if self._floor is None else max(self._floor, cut)
        if not self._keys:
            return
        keys, s, e = (np.concatenate(x) for x in (self._keys, self._s, self._e))
        order = np.lexsort((s, keys))
        keys, s, e = keys[order], s[order], e[order]
        new_key = np.ones(keys.size, dtype=bool)
        new_key[1:] = keys[1:] != keys[:-1]
        reach = grouped_cummax(new_key, e)
        new = new_key.copy()
        new[1:] |= s[1:] > reach[:-1]
        first = np.flatnonzero(new)
        seg_k, seg_s = keys[first], s[first]
        seg_e = np.maximum.reduceat(e, first)
        final = seg_e <= cut
        if final.any():
            k = seg_k[final]  # sorted: one sum per run of equal keys
            heads = np.flatnonzero(np.concatenate([[True], k[1:] != k[:-1]]))
            done = pd.Series(np.add.reduceat(seg_e[final] - seg_s[final], heads), index=k[heads])
            self._totals = done if len(self._totals) == 0 else self._totals.add(done, fill_value=0)
        self._keys, self._s, self._e = [seg_k[~final]], [seg_s[~final]], [seg_e[~final]]

    def totals(self) -> pd.Series:
        """Flattened length per key of everything added (index: key, sorted)."""
        self.flush(np.iinfo(np.int64).max)
        return self._totals.astype(np.int64).sort_index()
