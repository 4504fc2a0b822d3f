"""Range trees per CPU thread: parents, depths, innermost enclosing range of a point, values carried down
the tree. All vectorized: one pass per tree level at most, never one per range."""

from __future__ import annotations

import numpy as np
import pandas as pd

from dlprof_profiler.engine.intervals import grouped_cummax, segment_starts


class ThreadTimeKeys:
    """Maps (thread, time) pairs onto one sortable int64 axis: thread rank * span + time offset."""

    def __init__(self, tids: list[np.ndarray], times: list[np.ndarray]):
        tids = [np.asarray(t, dtype=np.int64) for t in tids]
        times = [np.asarray(t, dtype=np.int64) for t in times]
        nonempty = [t for t in times if t.size]
        # few distinct threads: hashing beats sorting every id
        self.threads = np.sort(pd.unique(np.concatenate(tids))) if any(t.size for t in tids) else np.zeros(0, np.int64)
        self.tmin = int(min(t.min() for t in nonempty)) if nonempty else 0
        tmax = int(max(t.max() for t in nonempty)) if nonempty else 0
        self.span = tmax - self.tmin + 2
        if max(len(self.threads), 1) * self.span >= 2**62:
            raise OverflowError("time span too large for combined thread/time keys")

    def rank(self, tids) -> np.ndarray:
        return np.searchsorted(self.threads, np.asarray(tids, dtype=np.int64))

    def key(self, tids, times) -> np.ndarray:
        return self.rank(tids) * self.span + (np.asarray(times, dtype=np.int64) - self.tmin)

    def thread_floor(self, tids) -> np.ndarray:
        """The smallest key of each thread."""
        return self.rank(tids) * self.span


def previous_greater_or_equal(values: np.ndarray, targets: np.ndarray, lower: np.ndarray) -> np.ndarray:
    """For each i, the largest j with lower[i] <= j < i and values[j] >= targets[i]; -1 if none.

    Valid when targets[i] is values[i] or values[i] + 1 and `lower` is constant within each segment (the
    range-tree case): then the candidate of i may jump to its candidate's candidate, because everything
    jumped over is below targets[i]. Rounds of jumps run over all unresolved elements at once; memory is
    O(n) (a range-maximum table would need O(n log n)).
    """
    n = values.size
    cand = np.arange(n, dtype=np.int64) - 1
    cand[cand < lower] = -1
    # Elements no earlier one of their segment reaches (top-level ranges) have none: the running maximum of
    # the segment says so at once, so the jumps below only run for the others.
    active = np.flatnonzero(cand >= 0)
    if active.size:
        first = np.ones(n, dtype=bool)
        first[1:] = lower[1:] != lower[:-1]
        reach = grouped_cummax(first, values)
        none = reach[cand[active]] < targets[active]
        cand[active[none]] = -1
        active = active[~none]
    while active.size:
        done = values[cand[active]] >= targets[active]
        active = active[~done]
        if not active.size:
            break
        jump = cand[cand[active]]
        ok = jump >= lower[active]
        cand[active] = np.where(ok, jump, -1)
        active = active[ok]
    return cand


class RangeForest:
    """Ranges of one domain as per-thread trees (innermost container = parent)."""

    def __init__(self, tids: np.ndarray, starts: np.ndarray, ends: np.ndarray, ids: np.ndarray):
        tids = np.asarray(tids, dtype=np.int64)
        starts = np.asarray(starts, dtype=np.int64)
        ends = np.asarray(ends, dtype=np.int64)
        n = tids.size
        # Outer ranges first: by thread, start, then longest first, then push order.
        self.order = np.lexsort((np.asarray(ids), -ends, starts, tids))
        self.s_tid, self.s_start, self.s_end = tids[self.order], starts[self.order], ends[self.order]
        self.lower = segment_starts(self.s_tid)
        # A zero-length range [t, t) is inside a range only if that range goes past t.
        target = np.where(self.s_end > self.s_start, self.s_end, self.s_end + 1)
        self.parent_sorted = previous_greater_or_equal(self.s_end, target, self.lower)
        self.parent = np.full(n, -1, dtype=np.int64)  # in the caller's row order
        has = self.parent_sorted >= 0
        self.parent[self.order[has]] = self.order[self.parent_sorted[has]]
        self.depth = tree_depths(self.parent)
        self.n = n

    def innermost_at(self, keys: ThreadTimeKeys, tids, times) -> np.ndarray:
        """Row of the innermost range containing each (thread, time) point, or -1."""
        times = np.asarray(times, dtype=np.int64)
        if self.n == 0 or times.size == 0:
            return np.full(times.shape, -1, dtype=np.int64)
        range_keys = keys.key(self.s_tid, self.s_start)
        pos = np.searchsorted(range_keys, keys.key(tids, times), side="right") - 1
        floor = np.searchsorted(range_keys, keys.thread_floor(tids), side="left")
        pos = np.where(pos >= floor, pos, -1)
        # The last range starting at or before t either contains t or ended before it; in the latter
        # case every range containing t is one of its ancestors: climb until one reaches past t.
        active = np.flatnonzero(pos >= 0)
        while active.size:
            ended = self.s_end[pos[active]] <= times[active]
            active = active[ended]
            pos[active] = self.parent_sorted[pos[active]]
            active = active[pos[active] >= 0]
        return np.where(pos >= 0, self.order[np.maximum(pos, 0)], -1)


def tree_depths(parent: np.ndarray) -> np.ndarray:
    """Number of ancestors of each node (pointer chasing, one vectorized step per level)."""
    depth = np.zeros(parent.size, dtype=np.int64)
    cursor = parent.copy()
    active = np.flatnonzero(cursor >= 0)
    while active.size:
        depth[active] += 1
        cursor[active] = parent[cursor[active]]
        active = active[cursor[active] >= 0]
    return depth


def levels(depth: np.ndarray) -> list[np.ndarray]:
    """Node indices grouped by depth, shallowest first."""
    if depth.size == 0:
        return []
    order = np.argsort(depth, kind="stable")
    bounds = np.searchsorted(depth[order], np.arange(depth.max() + 2))
    return [order[bounds[d] : bounds[d + 1]] for d in range(depth.max() + 1)]


def outermost_flagged(parent: np.ndarray, depth: np.ndarray, flagged: np.ndarray) -> np.ndarray:
    """For each node, the outermost flagged node among itself and its ancestors (or -1)."""
    result = np.where(flagged, np.arange(parent.size), -1)
    for idx in levels(depth)[1:]:
        from_parent = result[parent[idx]]
        result[idx] = np.where(from_parent >= 0, from_parent, result[idx])
    return result


def nearest_flagged_ancestor(parent: np.ndarray, depth: np.ndarray, flagged: np.ndarray) -> np.ndarray:
    """For each node, the nearest strict ancestor that is flagged (or -1)."""
    result = np.full(parent.size, -1, dtype=np.int64)
    for idx in levels(depth)[1:]:
        p = parent[idx]
        result[idx] = np.where(flagged[p], p, result[p])
    return result
