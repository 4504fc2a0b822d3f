"""Sanitize: rows of impossible times are dropped, counted per frame and reported; hand-computed figures of
damaged profiles match the same profile without those rows."""

import math

import numpy as np
import pandas as pd
import pytest

from dlprof_profiler.errors import DLProfError
from dlprof_profiler.ingest.sanitize import drop_invalid_times, invalid_rows, sanitize_trace, shared_correlation_ids
from dlprof_profiler.engine.trace import MISSING_TIME, Trace
from tests import profiles
from tests.analysis import analyze
from tests.damage import damaged_copy

M = MISSING_TIME


def test_invalid_rows_are_missing_or_reversed():
    start = np.array([0, M, 5, 10, 7, 3], dtype=np.int64)
    end = np.array([10, 4, M, 9, 7, M], dtype=np.int64)
    missing, reversed_ = invalid_rows(start, end)
    assert missing.tolist() == [False, True, True, False, False, True]
    assert reversed_.tolist() == [False, False, False, True, False, False]  # zero length (7, 7) is kept


def test_nan_and_none_count_as_missing():
    missing, reversed_ = invalid_rows(np.array([1.0, math.nan, 3.0]), np.array([2.0, 5.0, 1.0]))
    assert missing.tolist() == [False, True, False] and reversed_.tolist() == [False, False, True]
    missing, _ = invalid_rows(np.array([1, None, 3], dtype=object), np.array([2, 3, None], dtype=object))
    assert missing.tolist() == [False, True, True]


def test_positional_ids_are_renumbered_source_ids_kept():
    api = pd.DataFrame({"api_id": [0, 1, 2, 3], "start": [0, M, 20, 30], "end": [5, 15, 10, 35]})
    kept, dropped = drop_invalid_times(api, "CUDA API calls", "api_calls", "api_id")
    assert kept["api_id"].tolist() == [0, 1] and kept["start"].tolist() == [0, 30]
    assert (dropped.missing, dropped.reversed) == (1, 1)
    assert dropped.describe() == "2 CUDA API calls (1 without a start or end time, 1 ending before they start)"
    ranges = pd.DataFrame({"range_id": [7, 8, 9], "start": [1.0, math.nan, 3.0], "end": [2.0, 4.0, 5.0]})
    kept, _ = drop_invalid_times(ranges, "NVTX ranges", "ranges")
    assert kept["range_id"].tolist() == [7, 9] and kept["start"].dtype == np.int64


def test_a_clean_trace_is_left_alone(tmp_path):
    trace = Trace(source=tmp_path / "x.sqlite")
    trace.api_calls = pd.DataFrame({"api_id": [0], "start": [1], "end": [2], "pid": [1], "correlation_id": [3]})
    out = sanitize_trace(trace)
    assert out.warnings == [] and out.api_calls is trace.api_calls


def test_warning_counts_per_frame_and_nothing_usable_is_one_error(tmp_path):
    trace = Trace(source=tmp_path / "x.sqlite")
    trace.ranges = pd.DataFrame({"range_id": [1, 2], "start": [0, M], "end": [10, 5]})
    trace.gpu = pd.DataFrame({"activity_id": [0, 1], "start": [5, 9], "end": [4, 12], "correlation_id": [1, 2]})
    out = sanitize_trace(trace)
    assert out.warnings == [
        (
            f"{trace.source}: dropped rows with impossible timestamps: 1 NVTX ranges (1 without a "
            "start or end time); 1 GPU activities (1 ending before they start)"
        )
    ]
    assert len(out.ranges) == 1 and out.gpu["activity_id"].tolist() == [0] and out.gpu["start"].tolist() == [9]
    trace.ranges = pd.DataFrame({"range_id": [1], "start": [M], "end": [5]})
    trace.gpu = pd.DataFrame({"activity_id": [0], "start": [5], "end": [4], "correlation_id": [1]})
    with pytest.raises(DLProfError) as err:
        sanitize_trace(trace)
    assert str(err.value).startswith(f"{trace.source}: no usable events") and "\n" not in str(err.value)


def test_shared_correlation_ids_are_counted_per_process():
    api = pd.DataFrame({"pid": [1, 1, 1, 2, 1, 1], "correlation_id": [5, 5, 6, 5, -1, -1]})
    assert shared_correlation_ids(api) == (1, 2)  # (1, 5) twice; -1 means no id


# ---------------------------------------------------------------------------- damaged profiles, by hand
# training_profile: per iteration T = 1_000_000 + i * 100_000 (i = 0..2), GPU busy 37_000 ns without overlaps
# (memcpy 1000, TC_CONV 10000, RELU 2000, SGEMM 8000 + 8000, TC_WGRAD 6000, ADD 2000); wall clock 290_000
# (first event at 1_000_000, last end 1_290_000).
T0 = profiles.BASE


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    return profiles.training_profile(tmp_path_factory.mktemp("sanitize") / "t.sqlite")


def test_a_kernel_without_a_start_is_dropped_not_stretched(tmp_path, export):
    # the first TC_CONV kernel ([T0+14000, T0+24000)) loses its start
    path = damaged_copy(
        export,
        tmp_path / "k.sqlite",
        f"UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = NULL WHERE start = {T0 + 14000}",
        nullable=["CUPTI_ACTIVITY_KIND_KERNEL"],
    )
    a = analyze(path)
    assert len(a.trace.gpu) == 3 * 7 - 1
    assert a.aggs["default"].summary["gpu_utilization"] == pytest.approx(100 * (3 * 37_000 - 10_000) / 290_000)
    assert a.op("/aten::conv2d", "fprop")["gpu_total"] == 20_000
    assert any("1 GPU activities (1 without a start or end time)" in w for w in a.trace.warnings)


def test_a_reversed_launch_call_is_dropped_and_its_kernel_kept_unassociated(tmp_path, export):
    # the first conv launch [T0+12000, T0+13000) ends before it starts
    path = damaged_copy(
        export,
        tmp_path / "r.sqlite",
        f"UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET start = {T0 + 13500} WHERE start = {T0 + 12000}",
    )
    a = analyze(path)
    assert a.aggs["default"].summary["gpu_utilization"] == pytest.approx(100 * 3 * 37_000 / 290_000)
    assert a.op("/aten::conv2d", "fprop")["gpu_total"] == 20_000
    orphan = a.op(f"unassociated_{profiles.TC_CONV}")
    assert (orphan["gpu_total"], orphan["cpu_total"]) == (10_000, 0)
    assert (a.trace.api_calls["end"] >= a.trace.api_calls["start"]).all()
    assert a.trace.api_calls["api_id"].tolist() == list(range(len(a.trace.api_calls)))


def test_ranges_without_start_or_reversed_are_dropped(tmp_path, export):
    # iteration 0: aten::relu [T0+21000, T0+25000) reversed, aten::to [T0+6000, T0+9000) without a start
    path = damaged_copy(
        export,
        tmp_path / "n.sqlite",
        f'UPDATE NVTX_EVENTS SET "end" = {T0 + 20000} WHERE start = {T0 + 21000}',
        f"UPDATE NVTX_EVENTS SET start = NULL WHERE start = {T0 + 6000}",
        nullable=["NVTX_EVENTS"],
    )
    a = analyze(path)
    assert a.op("/aten::relu", "fprop")["calls"] == 2 and a.op("/aten::to", "fprop")["calls"] == 2
    assert (a.trace.ranges["end"] >= a.trace.ranges["start"]).all()
    assert any(
        "2 NVTX ranges (1 without a start or end time, 1 ending before they start)" in w for w in a.trace.warnings
    )
