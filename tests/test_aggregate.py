"""Aggregation of the hand-computable training profile (tests/profiles.py: its docstring has the layout).

Per iteration i (T = 1,000,000 + 100,000 i), GPU busy: memcpy [T+7000,T+8000); TC_CONV [T+14000,T+24000);
RELU [T+25000,T+27000); SGEMM [T+37000,T+45000); SGEMM [T+53000,T+61000); TC_WGRAD [T+62000,T+68000);
ADD [T+74000,T+76000). Key node: Optimizer.step#SGD.step ending at T+80000 -> boundaries 1.08M, 1.18M, 1.28M
-> 4 iterations; the last holds only the final cudaDeviceSynchronize [1,285,000, 1,290,000).
"""

import pytest

from tests import profiles
from tests.analysis import analyze


@pytest.fixture(scope="module")
def training(tmp_path_factory):
    return analyze(profiles.training_profile(tmp_path_factory.mktemp("t") / "t.sqlite"))


def test_iterations(training):
    it = training.iterations
    assert it.key_node == "Optimizer.step#SGD.step" and it.source == "default"
    assert it.boundaries.tolist() == [1_080_000, 1_180_000, 1_280_000]
    table = training.agg().iterations
    # iteration 0 starts at the first recorded event (the DataLoader range at 1,000,000), not at 0
    assert table["start"].tolist() == [1_000_000, 1_080_000, 1_180_000, 1_280_000]
    assert table["duration"].tolist() == [80_000, 100_000, 100_000, 10_000]
    # kernels launched per iteration: 6 per training iteration (the memcpy is not a kernel)
    assert table["kernels"].tolist() == [6, 6, 6, 0]
    assert table["tc_kernels"].tolist() == [2, 2, 2, 0]
    assert table["tc_kernel_time_per_gpu"].tolist() == [16_000, 16_000, 16_000, 0]


def test_summary_time_breakdown(training):
    s = training.agg().summary
    wall = 290_000  # from the first recorded event (1,000,000) to the last end (1,290,000)
    assert s["wall_time"] == wall
    # per training iteration: TC 10000 + 6000; non-TC 2000 + 8000 + 8000 + 2000; memory 1000;
    # dataloader [T, T+5000); CPU = op ranges not covered by GPU work (2000 + 4000 + 1000 + 9000 + 3000
    # + 1000 + 6000) plus the unassociated cudaDeviceSynchronize 5000
    expected = {
        "tc": 3 * 16_000,
        "non_tc": 3 * 20_000,
        "memory": 3 * 1_000,
        "dataloader": 3 * 5_000,
        "io": 0,
        "cpu": 3 * 31_000,
    }
    expected["other"] = wall - sum(expected.values())
    for name, ns in expected.items():
        assert s["pct"][name] == pytest.approx(100.0 * ns / wall), name
    assert s["gpu_utilization"] == pytest.approx(100.0 * (48_000 + 60_000 + 3_000) / wall)
    # TC kernel time over kernel time of eligible ops (conv2d and linear, both directions): 16000 / 32000
    assert s["tc_utilization"] == pytest.approx(50.0)
    assert s["avg_iteration_time"] == pytest.approx(wall / 4)


def test_summary_ops_and_kernels_sections(training):
    s = training.agg().summary
    # using TC: conv2d fprop (3 x 10000 GPU, 3 x 10000 CPU) and bprop (3 x 6000, 3 x 8000)
    assert s["ops"]["using_tc"] == {"gpu_time": 48_000, "cpu_time": 54_000, "count": 2}
    # eligible but not using: linear fprop (8000 GPU, 10000 CPU) and bprop (8000 GPU, 6000 CPU)
    assert s["ops"]["eligible_not_using"] == {"gpu_time": 48_000, "cpu_time": 48_000, "count": 2}
    assert s["ops"]["all"]["count"] == 8
    assert s["kernels"]["tc"] == {"gpu_time": 48_000, "cpu_time": 6 * 1000, "count": 2}
    assert s["kernels"]["memory"] == {"gpu_time": 3_000, "cpu_time": 3_000, "count": 1}
    assert s["kernels"]["other"] == {"gpu_time": 60_000, "cpu_time": 12 * 1000, "count": 3}
    assert s["kernels"]["all"]["gpu_time"] == 111_000


def test_op_table(training):
    conv = training.op("/aten::conv2d", "fprop")
    assert (conv["op_id"], conv["calls"], conv["cpu_total"], conv["gpu_total"], conv["overhead_avg"]) == (
        "CONV2D_1",
        3,
        30_000,
        30_000,
        9_000,
    )
    add = training.op("/Optimizer.step#SGD.step/aten::add_")
    assert (add["op_id"], add["gpu_total"], add["tc_eligible"]) == ("ADD__1", 6_000, False)
    sync = training.op("unassociated_cudaDeviceSynchronize")
    assert (sync["calls"], sync["cpu_total"], sync["direction"]) == (3, 15_000, "")


def test_tensor_core_and_kernel_reports(training):
    tc = training.agg().tensor_core.set_index(["name", "direction"])
    conv = tc.loc[("/aten::conv2d", "fprop")]
    assert (conv["total_gpu_time"], conv["tc_gpu_time"], conv["tc_utilization"]) == (30_000, 30_000, 100.0)
    assert conv["tc_kernel_names"] == [profiles.TC_CONV] and conv["non_tc_kernel_count"] == 0
    linear = tc.loc[("/aten::linear", "bprop")]
    assert (linear["total_gpu_time"], linear["tc_gpu_time"], linear["non_tc_kernel_names"]) == (
        24_000,
        0,
        [profiles.SGEMM],
    )
    kernels = training.agg().kernels
    sgemm = kernels[kernels["name"] == profiles.SGEMM]
    assert len(sgemm) == 2 and set(sgemm["count"]) == {3}
    assert set(sgemm["gpu_avg"]) == {8_000.0} and set(sgemm["api_total"]) == {3_000}


def test_op_types_and_groups(training):
    types = training.agg().op_types.set_index("op_type")
    assert (types.loc["conv2d", "n_ops"], types.loc["conv2d", "calls"], types.loc["conv2d", "gpu_total"]) == (
        2,
        6,
        48_000,
    )
    groups = training.agg().groups.set_index("name")
    # "/" holds the 7 named ops; per iteration their CPU ranges flatten to 49,000 ns
    root = groups.loc["/"]
    assert (root["calls"], root["cpu_total"], root["cpu_min"], root["cpu_max"]) == (21, 147_000, 49_000, 49_000)
    assert root["n_tc_eligible"] == 4 and root["n_using_tc"] == 2
    complete = groups.loc["_CompleteModel_"]
    # iteration 0: 49,000; 1 and 2: 49,000 + the previous iteration's 5,000 ns sync; 3: the last sync
    assert (complete["calls"], complete["cpu_total"], complete["cpu_min"], complete["cpu_max"]) == (
        24,
        162_000,
        5_000,
        54_000,
    )
    assert list(training.agg().groups["name"])[-1] == "_CompleteModel_"


def test_sub_range_aggregation(tmp_path):
    a = analyze(profiles.training_profile(tmp_path / "t.sqlite"), iter_start=1, iter_stop=2)
    s = a.agg().summary
    # window [1,080,000, 1,280,000): iterations 1 and 2 themselves (the key node ends at T+80000); the last
    # item of iteration 2 is aten::add_ ending at T+79000, and [T+79000, T+80000) is Other time
    assert s["wall_time"] == 200_000
    assert s["pct"]["tc"] == pytest.approx(100 * 32_000 / 200_000)
    assert s["pct"]["cpu"] == pytest.approx(100 * 62_000 / 200_000)
    assert a.op("/aten::conv2d", "fprop")["calls"] == 2


def _assert_same_aggregation(a, b):
    import pandas as pd

    assert (a.window_start, a.window_end) == (b.window_start, b.window_end)
    _same_dict(a.summary, b.summary)
    for name in ("ops", "op_types", "kernels", "tensor_core", "groups", "devices", "iterations", "kernel_launches"):
        x, y = getattr(a, name), getattr(b, name)
        if name == "kernel_launches":
            x = x.sort_values("activity_id").reset_index(drop=True)
            y = y.sort_values("activity_id").reset_index(drop=True)
        pd.testing.assert_frame_equal(x.reset_index(drop=True), y.reset_index(drop=True), check_dtype=False, obj=name)
    for name in ("gpus", "streams", "launches"):
        pd.testing.assert_frame_equal(a.gpu_breakdowns[name], b.gpu_breakdowns[name], check_dtype=False, obj=name)


def _same_dict(a, b):
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], dict):
            _same_dict(a[k], b[k])
        else:
            assert a[k] == pytest.approx(b[k]), k
    return True


def _cut_points(analysis, n_random=12, seed=1):
    import numpy as np

    trace = analysis.trace
    times = (
        np.concatenate(
            [trace.gpu["start"].to_numpy(), trace.ranges["start"].to_numpy(), trace.api_calls["start"].to_numpy()]
        )
        if len(trace.gpu)
        else trace.ranges["start"].to_numpy()
    )
    rng = np.random.default_rng(seed)
    lo, hi = int(times.min()), int(times.max())
    random_cuts = rng.integers(lo, hi + 1, n_random).tolist()
    return sorted(set(random_cuts + analysis.iterations.boundaries.tolist() + [lo, hi]))


@pytest.mark.slow
@pytest.mark.parametrize(
    "fixture",
    [
        "training",
        "pytorch_2gpu_nccl_nsys2026.2_before.sqlite",
        "nvfuser_8xh100_nsys2024.6.sqlite",
        "cuda_app_no_nvtx_nsys2021.3.sqlite",
    ],
)
def test_aggregation_does_not_depend_on_chunks(training, fixture):
    """Any split of the timeline into chunks gives the same tables as one chunk (unions carried across)."""
    from dlprof_profiler.engine.aggregate import aggregate
    from tests.test_fixtures import FIXTURES

    a = training if fixture == "training" else analyze(FIXTURES / fixture)
    cuts = _cut_points(a)
    for name, dm in a.corr.domains.items():
        whole = a.aggs[name]
        split = aggregate(a.trace, a.corr, dm, a.iterations, whole.iter_start, whole.iter_stop, cuts=cuts)
        _assert_same_aggregation(whole, split)


def _shifted_copy(source, target, offset: int):
    """A copy of an export with every timestamp moved by `offset` ns (a capture that started later)."""
    import shutil
    import sqlite3

    shutil.copy(source, target)
    con = sqlite3.connect(target)
    for table, columns in (
        ("NVTX_EVENTS", ("start", "end")),
        ("CUPTI_ACTIVITY_KIND_RUNTIME", ("start", "end")),
        ("CUPTI_ACTIVITY_KIND_KERNEL", ("start", "end")),
        ("CUPTI_ACTIVITY_KIND_MEMCPY", ("start", "end")),
    ):
        sets = ", ".join(f'"{c}" = "{c}" + {offset}' for c in columns)
        con.execute(f"UPDATE {table} SET {sets}")
    con.commit()
    con.close()
    return target


def test_figures_do_not_change_when_the_capture_starts_later(training, tmp_path):
    """Iteration 0 starts at the first recorded event: shifting every timestamp (a late capture, --delay)
    changes no figure; with iteration 0 starting at the session start it would look mostly idle."""
    shifted = analyze(
        _shifted_copy(profiles.training_profile(tmp_path / "t.sqlite"), tmp_path / "s.sqlite", 7_000_000_000)
    )
    a, b = training.agg(), shifted.agg()
    assert a.wall_time == b.wall_time == 290_000
    _same_dict({k: v for k, v in a.summary.items()}, {k: v for k, v in b.summary.items()})
    assert a.iterations["duration"].tolist() == b.iterations["duration"].tolist()
    assert (b.iterations["start"] - a.iterations["start"]).eq(7_000_000_000).all()
    import pandas as pd

    pd.testing.assert_frame_equal(a.ops.drop(columns=["first_start"]), b.ops.drop(columns=["first_start"]))


def test_a_capture_without_nvtx_gets_a_wall_clock_and_a_full_breakdown():
    from tests.test_fixtures import FIXTURES

    a = analyze(FIXTURES / "cuda_app_no_nvtx_nsys2021.3.sqlite")
    s = a.agg().summary
    first = min(int(a.trace.api_calls["start"].min()), int(a.trace.gpu["start"].min()))
    last = max(int(a.trace.api_calls["end"].max()), int(a.trace.gpu["end"].max()))
    assert s["wall_time"] == last - first > 0
    assert sum(s["pct"].values()) == pytest.approx(100.0)


@pytest.mark.parametrize(
    "name,dtype",
    [
        ("volta_sgemm_128x64_nn", "float32"),
        ("volta_scudnn_128x64_relu_interior_nn_v1", "float32"),
        ("volta_fp16_s884cudnn_fp16_128x128_ldg8_relu_f2f_exp_small_nhwc_tn_v1", "float16"),
        ("sm80_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x32", "bfloat16"),
        ("turing_h1688gemm_128x128_ldg8_tn", "float16"),
        ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>", "float32"),
        ("ampere_int8_i16832gemm_int8_128x128", "int8"),
        ("volta_dgemm_64x64_nn", "float64"),
        ("multi_tensor_apply_kernel", None),
    ],
)
def test_kernel_names_show_their_precision(name, dtype):
    from dlprof_profiler.engine.tensor_cores import kernel_precision

    assert kernel_precision(name) == dtype


def test_group_gpu_idle_is_the_sum_of_its_ops_idle(tmp_path):
    """Scope `a` holds op x (kernels [100, 200) and [300, 400): 100 ns idle) and op y (kernel [1000, 1100):
    no idle). DLProf 1.8: the group's GPU idle is 100 + 0, not its GPU span minus busy (1000 - 300)."""
    from tests.nsys_builder import NsysExport

    exp = NsysExport()
    exp.add_gpu(device_id=0)
    t = exp.add_thread(pid=1, tid=1, name="python", process_name="python")
    exp.push_pop(t, 0, 900, "a")
    exp.push_pop(t, 10, 90, "aten::x, seq = 1, op_id = 1")
    exp.launch(t, 20, 30, 100, 200, kernel="k1")
    exp.launch(t, 40, 50, 300, 400, kernel="k2")
    exp.push_pop(t, 500, 600, "aten::y, seq = 2, op_id = 2")
    exp.launch(t, 510, 520, 1000, 1100, kernel="k3")
    a = analyze(exp.write(tmp_path / "p.sqlite"))
    assert (a.op("/a/aten::x")["idle_total"], a.op("/a/aten::y")["idle_total"]) == (100, 0)
    groups = a.agg().groups.set_index("name")
    assert groups.loc["/a/", "idle_total"] == 100 and groups.loc["/a/", "gpu_total"] == 300


def test_memory_kernels_count_distinct_memory_api_names(tmp_path):
    """Four memory operations from three APIs (two cudaMemcpyAsync copies in opposite directions, one
    cudaMemcpy, one cudaMemsetAsync): `# Kernels` of the Memory row is 3, as DLProf 1.8 counted; two kernels
    of one name add 1 to All kernels."""
    from tests.nsys_builder import NsysExport

    exp = NsysExport()
    exp.add_gpu(device_id=0)
    t = exp.add_thread(pid=1, tid=1, name="python", process_name="python")
    for start, api, kind in (
        (0, "cudaMemcpyAsync_v3020", 1),
        (1000, "cudaMemcpyAsync_v3020", 2),
        (2000, "cudaMemcpy_v3020", 1),
    ):
        corr = exp.runtime(t, start, start + 100, name=api)
        exp.memcpy(1, corr, start + 200, start + 300, bytes=64, copy_kind=kind)
    corr = exp.runtime(t, 3000, 3100, name="cudaMemsetAsync_v3020")
    exp.memset(1, corr, 3200, 3300, bytes=64)
    exp.launch(t, 4000, 4100, 4200, 4300, kernel="k")
    exp.launch(t, 5000, 5100, 5200, 5300, kernel="k")
    kernels = analyze(exp.write(tmp_path / "m.sqlite")).agg().summary["kernels"]
    assert kernels["memory"] == {"gpu_time": 400, "cpu_time": 400, "count": 3}
    assert kernels["other"] == {"gpu_time": 200, "cpu_time": 200, "count": 1}
    assert kernels["all"]["count"] == 4


def test_communication_time_and_its_overlap_with_compute(tmp_path):
    """GPU 0: an NCCL all-reduce [1000, 3000) while a compute kernel runs [2000, 2500) and another [2800,
    4000): 2000 ns of communication, 500 + 200 overlapped by compute. Clipped to the aggregation window."""
    from tests.nsys_builder import NsysExport

    exp = NsysExport()
    exp.add_gpu(device_id=0)
    t = exp.add_thread(pid=1, tid=1, name="python", process_name="python")
    exp.launch(t, 0, 100, 1000, 3000, kernel="ncclDevKernel_AllReduce_Sum_f32_RING_LL", stream_id=8)
    exp.launch(t, 200, 300, 2000, 2500, kernel="gemm")
    exp.launch(t, 400, 500, 2800, 4000, kernel="relu")
    s = analyze(exp.write(tmp_path / "c.sqlite")).agg().summary
    assert (s["communication_time"], s["overlapped_communication_time"]) == (2000, 700)


def test_a_large_in_memory_model_is_aggregated_in_planned_chunks(training, monkeypatch):
    """A model of more than EVENTS_PER_CHUNK op instances and GPU activities is aggregated in time chunks
    (its working memory is a chunk's), and its tables are those of one chunk."""
    from dlprof_profiler.engine import aggregate as agg_mod
    from dlprof_profiler.engine.model_chunks import InMemoryModel

    a = training
    name, dm = next(iter(a.corr.domains.items()))
    whole = a.aggs[name]
    events = len(dm.instances) + len(a.trace.gpu)
    model = InMemoryModel(a.trace, a.corr, dm)
    assert model.planned_cuts(a.iterations.boundaries, events) == []
    cuts = model.planned_cuts(a.iterations.boundaries, max(events // 4, 1))
    assert len(cuts) >= 2
    original, planned = agg_mod.aggregate_model, []

    def recording(model, iterations, iter_start, iter_stop, cuts=None, keep_launches=True):
        planned.append(cuts)
        return original(model, iterations, iter_start, iter_stop, cuts, keep_launches)

    monkeypatch.setattr(agg_mod, "EVENTS_PER_CHUNK", max(events // 4, 1))
    monkeypatch.setattr(agg_mod, "aggregate_model", recording)
    split = agg_mod.aggregate(a.trace, a.corr, dm, a.iterations, whole.iter_start, whole.iter_stop)
    assert planned == [cuts]
    _assert_same_aggregation(whole, split)
