"""Interval algebra against brute force over integer time points (an independent oracle)."""

import numpy as np
import pytest

from dlprof_profiler.engine.intervals import covered_length, grouped_cummax, merge_intervals, union_length_by_group
from dlprof_profiler.engine.structure import RangeForest, ThreadTimeKeys, previous_greater_or_equal, tree_depths


def brute_union(intervals):
    points = set()
    for s, e in intervals:
        points.update(range(s, e))
    return len(points)


def test_union_length_by_group_hand_case():
    # group 1: [0,10) and [5,20) overlap -> 20; [30,31) -> 1; group 2: [3,4) twice -> 1
    got = union_length_by_group([1, 1, 1, 2, 2], [0, 5, 30, 3, 3], [10, 20, 31, 4, 4])
    assert got.to_dict() == {1: 21, 2: 1}


@pytest.mark.parametrize("seed", range(20))
def test_union_and_merge_match_brute_force(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 40))
    s = rng.integers(0, 100, n)
    e = s + rng.integers(0, 15, n)
    g = rng.integers(0, 3, n)
    got = union_length_by_group(g, s, e)
    for key in np.unique(g):
        assert got[key] == brute_union(list(zip(s[g == key], e[g == key])))
    ms, me = merge_intervals(s, e)
    assert (me > ms).all() and (ms[1:] > me[:-1]).all()  # disjoint, not touching
    windows = [(0, 100), (10, 20), (55, 56), (90, 200)]
    cov = covered_length(ms, me, [w[0] for w in windows], [w[1] for w in windows])
    for (ws, we), c in zip(windows, cov):
        clipped = [(max(a, ws), min(b, we)) for a, b in zip(s, e) if min(b, we) > max(a, ws)]
        assert c == brute_union(clipped)


@pytest.mark.parametrize("scale", [10, 2**61])  # small values: one accumulate; huge ones: the fallback
def test_grouped_cummax_restarts_at_each_group(scale):
    rng = np.random.default_rng(7)
    values = rng.integers(-scale, scale, 200)
    first = rng.random(200) < 0.2
    first[0] = True
    expected, best = [], None
    for v, f in zip(values.tolist(), first.tolist()):
        best = v if f else max(best, v)
        expected.append(best)
    assert grouped_cummax(first, values).tolist() == expected


@pytest.mark.parametrize("seed", range(30))
def test_previous_greater_or_equal(seed):
    # the range-tree case: targets are the values (or values + 1), lower bounds constant per segment
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 80))
    v = rng.integers(0, 30, n)
    t = v + rng.integers(0, 2, n)
    segment = np.sort(rng.integers(0, 3, n))
    lower = np.searchsorted(segment, segment, side="left")
    expected = [max([j for j in range(lower[i], i) if v[j] >= t[i]], default=-1) for i in range(n)]
    assert previous_greater_or_equal(v, t, lower).tolist() == expected


def brute_parent(tids, starts, ends, ids):
    """Innermost container on the same thread: latest start, then smallest end, then latest push."""
    parents = []
    for i in range(len(tids)):
        best = None
        for j in range(len(tids)):
            if i == j or tids[i] != tids[j]:
                continue
            contains = starts[j] <= starts[i] and ends[i] <= ends[j]
            if starts[i] == ends[i]:  # empty range: only inside a range that goes past it
                contains = contains and ends[j] > starts[i]
            if (starts[j], -ends[j], ids[j]) > (starts[i], -ends[i], ids[i]):
                contains = False  # identical intervals: the one pushed first is the parent
            if contains and (best is None or (starts[j], -ends[j], ids[j]) > (starts[best], -ends[best], ids[best])):
                best = j
        parents.append(-1 if best is None else best)
    return parents


@pytest.mark.parametrize("seed", range(25))
def test_range_forest_parents_and_probes(seed):
    rng = np.random.default_rng(seed)
    # Properly nested push/pop ranges on two threads, built from random stacks.
    tids, starts, ends = [], [], []
    for tid in (7, 9):
        t, stack = 0, []
        for _ in range(int(rng.integers(1, 25))):
            if stack and rng.random() < 0.45:
                i = stack.pop()
                t += int(rng.integers(0, 3))
                ends[i] = t
            else:
                t += int(rng.integers(0, 3))
                tids.append(tid)
                starts.append(t)
                ends.append(None)
                stack.append(len(starts) - 1)
        while stack:
            t += int(rng.integers(0, 3))
            ends[stack.pop()] = t
    ids = list(range(len(tids)))
    forest = RangeForest(np.array(tids), np.array(starts), np.array(ends), np.array(ids))
    assert forest.parent.tolist() == brute_parent(tids, starts, ends, ids)
    depth = tree_depths(forest.parent)
    for i, p in enumerate(forest.parent):
        assert depth[i] == (0 if p < 0 else depth[p] + 1)
    probes_t = rng.integers(0, max(ends) + 2, 30)
    probes_tid = rng.choice([7, 9, 11], 30)
    keys = ThreadTimeKeys([np.array(tids), probes_tid], [np.array(starts), np.array(ends), probes_t])
    got = forest.innermost_at(keys, probes_tid, probes_t)
    for k in range(30):
        inside = [j for j in ids if tids[j] == probes_tid[k] and starts[j] <= probes_t[k] < ends[j]]
        best = max(inside, key=lambda j: (starts[j], -ends[j], j), default=-1)
        assert got[k] == best


@pytest.mark.parametrize("seed", range(25))
def test_range_forest_with_overlapping_start_end_ranges(seed):
    # start/end ranges may overlap without nesting; the innermost container is still well defined
    rng = np.random.default_rng(100 + seed)
    n = int(rng.integers(1, 40))
    tids = rng.choice([1, 2], n)
    starts = rng.integers(0, 50, n)
    ends = starts + rng.integers(0, 20, n)
    ids = np.arange(n)
    forest = RangeForest(tids, starts, ends, ids)
    assert forest.parent.tolist() == brute_parent(tids.tolist(), starts.tolist(), ends.tolist(), ids.tolist())
    probes_t = rng.integers(0, 75, 40)
    probes_tid = rng.choice([1, 2], 40)
    keys = ThreadTimeKeys([tids, probes_tid], [starts, ends, probes_t])
    got = forest.innermost_at(keys, probes_tid, probes_t)
    for k in range(40):
        inside = [j for j in range(n) if tids[j] == probes_tid[k] and starts[j] <= probes_t[k] < ends[j]]
        assert got[k] == max(inside, key=lambda j: (starts[j], -ends[j], j), default=-1)
