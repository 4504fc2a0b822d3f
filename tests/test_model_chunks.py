"""Where an out-of-core correlation cuts the profile into segments (model_chunks.cuts_at), worked out by hand."""

import numpy as np

from dlprof_profiler.engine.model_chunks import cuts_at

# ten time buckets starting at 0, 10, ..., 90, each holding 10 events: 10, 20, ..., 100 events up to the end of each
EDGES = np.arange(0, 100, 10, dtype=np.int64)
CUM = np.arange(10, 110, 10, dtype=np.int64)


def test_small_iterations_merge_and_are_cut_at_their_boundaries():
    # 20 events a segment. Boundary 15: 20 events so far (buckets 0, 10), 20 >= 20: cut at 15.
    # Boundary 25: 30 events, 10 since the last cut: none. Boundary 35: 40 events, 20 since: cut at 35.
    # After it 60 events remain, more than twice 20: cut where 40 + 20 = 60 events are reached (bucket 50),
    # at the next bucket's start, 60; 40 then remain, not more than twice 20: no more cuts.
    assert cuts_at(EDGES, CUM, [25, 15, 35], 20) == [15, 35, 60]


def test_an_iteration_too_large_is_cut_inside_then_at_its_end():
    # One iteration ending at 100 (past the last bucket's start: all 100 events) and 20 events a segment.
    # 100 > 40: the 20th event ends bucket 10, cut at 20; 80 > 40: the 40th ends bucket 30, cut at 40;
    # 60 > 40: cut at 60; 40 is not > 40: stop. 40 events since the last cut >= 20: cut at the boundary, 100.
    assert cuts_at(EDGES, CUM, [100], 20) == [20, 40, 60, 100]


def test_both_stretches_too_large_are_cut_the_same_way():
    # 10 events a segment, one boundary at 55: 60 events up to it (buckets 0 to 50).
    # Inside the iteration: 60 > 20, cut at 10; 50 > 20, 20; 40 > 20, 30; 30 > 20, 40; 20 is not > 20.
    # 20 events since 40 >= 10: cut at 55. After it 40 events remain (buckets 60 to 90):
    # 40 > 20: the 70th event ends bucket 60, cut at 70; 30 > 20: cut at 80; 20 is not > 20: stop.
    assert cuts_at(EDGES, CUM, [55], 10) == [10, 20, 30, 40, 55, 70, 80]


def test_no_boundaries_cuts_the_whole_profile_as_one_stretch():
    # 30 events a segment: 100 > 60, the 30th event ends bucket 20, cut at 30; 70 > 60, the 60th ends
    # bucket 50, cut at 60; 40 is not > 60: stop.
    assert cuts_at(EDGES, CUM, [], 30) == [30, 60]
    assert cuts_at(EDGES, CUM, [], 50) == []  # 100 is not more than twice 50


def test_a_cut_inside_an_iteration_never_passes_its_boundary():
    # bucket 0 holds 100 events, bucket 10 another 10; 10 events a segment, boundary at 5 (inside bucket 0).
    # Inside the iteration: 100 > 20, the 10th event ends bucket 0, the cut would be 10, not before 5: none.
    # 100 >= 10: cut at 5. After it 10 events remain: no more cuts.
    assert cuts_at(np.array([0, 10]), np.array([100, 110]), [5], 10) == [5]


def test_a_single_huge_bucket_is_not_cut_twice_at_its_start():
    # bucket 0 holds 10 events, bucket 10 another 190; 10 events a segment, no boundaries.
    # 200 > 20: the 10th event ends bucket 0, cut at 10; 190 > 20: the 20th event ends bucket 10, the last,
    # whose start 10 is no later than the last cut: stop.
    assert cuts_at(np.array([0, 10]), np.array([10, 200]), [], 10) == [10]


def test_boundaries_before_the_first_event_are_not_cuts():
    # no events up to -5; 10 up to 0 (bucket 0 starts there): 10 < 20, no cut at either. After them all
    # 100 events are one stretch: cut at 20, 40, 60 as without boundaries.
    assert cuts_at(EDGES, CUM, [-5, 0], 20) == [20, 40, 60]
