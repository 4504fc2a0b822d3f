"""Correlation on hand-built profiles: every expected value below is derived by hand from the layout."""

import numpy as np
import pandas as pd
import pytest

from dlprof_profiler.engine.correlate import call_metrics, launch_rows
from tests.analysis import analyze
from tests.nsys_builder import NsysExport

PID = 100


def new_export(schema="2022.4"):
    exp = NsysExport(schema=schema)
    exp.add_gpu(device_id=0)
    main = exp.add_thread(pid=PID, tid=PID, name="python", process_name="python")
    return exp, main


def test_design_naming_example(tmp_path):
    # function a calls b twice, b runs conv1d twice -> four ops (DESIGN.md "Correlation")
    exp, t = new_export()
    exp.push_pop(t, 0, 1000, "a")
    seq = 0
    for b_start in (10, 500):
        exp.push_pop(t, b_start, b_start + 400, "b")
        for off in (10, 200):
            s = b_start + off
            seq += 1
            exp.push_pop(t, s, s + 90, f"aten::conv1d, seq = {seq}, op_id = {seq}")
            exp.launch(t, s + 10, s + 20, s + 30, s + 40, kernel="conv_kernel")
    a = analyze(exp.write(tmp_path / "p.sqlite"))
    assert a.op_names() == {
        "/a/b/aten::conv1d",
        "/a/b/aten::conv1d[2]",
        "/a/b[2]/aten::conv1d",
        "/a/b[2]/aten::conv1d[2]",
    }
    for name in a.op_names():
        op = a.op(name)
        assert op["calls"] == 1 and op["gpu_total"] == 10 and op["op_type"] == "conv1d"


def test_nested_markers_fold_into_the_outermost(tmp_path):
    exp, t = new_export()
    exp.push_pop(t, 0, 100, "aten::conv2d, seq = 1, op_id = 1")
    exp.push_pop(t, 10, 90, "aten::convolution, seq = 1, op_id = 2")
    exp.push_pop(t, 20, 80, "aten::_convolution, seq = 1, op_id = 3")
    exp.launch(t, 30, 40, 50, 150, kernel="k")
    a = analyze(exp.write(tmp_path / "p.sqlite"))
    assert a.op_names() == {"/aten::conv2d"}
    op = a.op("/aten::conv2d")
    assert (op["calls"], op["cpu_total"], op["gpu_total"], op["overhead_total"]) == (1, 100, 100, 90)
    assert op["op_type"] == "conv2d" and op["direction"] == "fprop" and op["tc_eligible"]


def test_correlation_ids_repeat_across_processes(tmp_path):
    exp, t1 = new_export()
    t2 = exp.add_thread(pid=200, tid=200, name="python", process_name="python")
    exp.push_pop(t1, 0, 100, "aten::mm, seq = 1, op_id = 1")
    exp.push_pop(t2, 0, 100, "aten::relu, seq = 1, op_id = 1")
    c1 = exp.runtime(t1, 10, 20, correlation_id=5)
    c2 = exp.runtime(t2, 10, 20, correlation_id=5)
    exp.kernel(PID, c1, 30, 40, "mm_kernel")  # 10 ns, belongs to process 100's call
    exp.kernel(200, c2, 30, 70, "relu_kernel")  # 40 ns, belongs to process 200's call
    a = analyze(exp.write(tmp_path / "p.sqlite"))
    assert a.op("/aten::mm")["gpu_total"] == 10
    assert a.op("/aten::relu")["gpu_total"] == 40


def test_calls_outside_ranges_and_orphan_kernels_become_unassociated_ops(tmp_path):
    exp, t = new_export()
    other = exp.add_thread(pid=PID, tid=PID + 1, name="worker")
    exp.push_pop(t, 0, 100, "aten::add, seq = 1, op_id = 1")
    exp.launch(other, 10, 20, 30, 40, kernel="k_other_thread")  # inside the range's time, other thread
    exp.runtime(t, 200, 260, name="cudaDeviceSynchronize_v3020")  # after every range
    exp.kernel(PID, 999, 500, 530, "orphan_kernel")  # no API call with that id
    a = analyze(exp.write(tmp_path / "p.sqlite"))
    launch = a.op("unassociated_cudaLaunchKernel")
    assert (launch["calls"], launch["gpu_total"], launch["op_type"], launch["direction"]) == (
        1,
        10,
        "cudaLaunchKernel",
        "",
    )
    sync = a.op("unassociated_cudaDeviceSynchronize")
    assert (sync["cpu_total"], sync["op_id"]) == (60, "CUDADEVICESYNCHRONIZE_1")
    orphan = a.op("unassociated_orphan_kernel")
    assert (orphan["gpu_total"], orphan["cpu_total"]) == (30, 0)
    assert a.op("/aten::add")["gpu_total"] == 0
    # nothing is lost: every GPU activity belongs to exactly one instance
    assert (a.domain().gpu_instance >= 0).all() and len(a.domain().gpu_instance) == 2


def test_backward_ops_take_the_forward_name_by_sequence_number(tmp_path):
    exp, t = new_export()
    grad = exp.add_thread(pid=PID, tid=PID + 1, name="autograd")
    exp.push_pop(t, 0, 100, "aten::linear, seq = 7, op_id = 1")
    exp.push_pop(t, 10, 20, "aten::t, seq = 7, op_id = 2")
    exp.push_pop(t, 30, 90, "aten::addmm, seq = 8, op_id = 3")
    exp.launch(t, 40, 50, 60, 80, kernel="gemm")
    exp.push_pop(grad, 200, 300, "AddmmBackward0, seq = 8, op_id = 4")
    exp.launch(grad, 210, 220, 230, 270, kernel="gemm")
    # the engine's evaluate_function wrapper carries no seq: the node inside it does
    exp.push_pop(grad, 400, 500, "autograd::engine::evaluate_function: TBackward0, op_id = 5")
    exp.push_pop(grad, 410, 490, "TBackward0, seq = 7, op_id = 6")
    exp.launch(grad, 420, 430, 440, 445, kernel="transpose")
    a = analyze(exp.write(tmp_path / "p.sqlite"))
    assert a.op_names() == {"/aten::linear"}
    fwd, bwd = a.op("/aten::linear", "fprop"), a.op("/aten::linear", "bprop")
    assert (fwd["calls"], fwd["gpu_total"]) == (1, 20)
    # AddmmBackward0 and TBackward0 are the backward of one forward call: one bprop call (issue 13 item 15)
    assert (bwd["calls"], bwd["gpu_total"], bwd["cpu_total"]) == (1, 45, 200)
    assert bwd["op_type"] == "linear" and fwd["op_id"] == "LINEAR_1" and bwd["op_id"] == "LINEAR_2"


def test_unlinked_backward_nodes_keep_their_own_names(tmp_path):
    exp, t = new_export()
    grad = exp.add_thread(pid=PID, tid=PID + 1, name="autograd")
    exp.push_pop(grad, 0, 100, "MulBackward0, seq = 3, op_id = 1")
    exp.launch(grad, 10, 20, 30, 40, kernel="k")
    a = analyze(exp.write(tmp_path / "p.sqlite"))
    op = a.op("/MulBackward0")
    assert op["direction"] == "bprop" and op["op_type"] == "MulBackward0"


def test_scope_range_launching_directly_is_an_op_too(tmp_path):
    exp, t = new_export()
    exp.push_pop(t, 0, 1000, "Optimizer.step#SGD.step, op_id = 1")
    exp.launch(t, 10, 20, 30, 50, kernel="direct")  # the scope's own call
    exp.push_pop(t, 100, 200, "aten::add_, seq = 2, op_id = 2")
    exp.launch(t, 110, 120, 130, 160, kernel="add")
    a = analyze(exp.write(tmp_path / "p.sqlite"))
    assert a.op_names() == {"/Optimizer.step#SGD.step", "/Optimizer.step#SGD.step/aten::add_"}
    scope = a.op("/Optimizer.step#SGD.step")
    assert (scope["gpu_total"], scope["cpu_total"]) == (20, 1000)
    assert a.op("/Optimizer.step#SGD.step/aten::add_")["gpu_total"] == 30


def test_domain_without_markers_makes_leaf_ranges_ops(tmp_path):
    exp, t = new_export()
    exp.push_pop(t, 0, 1000, "train")
    exp.push_pop(t, 100, 400, "forward")
    exp.launch(t, 110, 120, 130, 200, kernel="f")
    exp.push_pop(t, 500, 900, "backward")
    exp.launch(t, 510, 520, 530, 650, kernel="b")
    exp.launch(t, 950, 960, 970, 980, kernel="stray")  # in train, outside both leaves
    a = analyze(exp.write(tmp_path / "p.sqlite"))
    assert a.corr.mode == "nvtx"
    assert a.op_names() == {"/train/forward", "/train/backward", "/train"}
    assert a.op("/train/forward")["gpu_total"] == 70
    assert a.op("/train/backward")["gpu_total"] == 120
    assert a.op("/train")["gpu_total"] == 10
    assert set(a.ops()["direction"]) == {""}


def test_op_ids_count_per_type_in_execution_order(tmp_path):
    exp, t = new_export()
    labels = ["aten::conv2d", "aten::relu", "aten::conv2d", "aten::uniform_"]
    for i, label in enumerate(labels):
        exp.push_pop(t, i * 100, i * 100 + 50, f"{label}, seq = {i}, op_id = {i}")
        exp.launch(t, i * 100 + 10, i * 100 + 20, i * 100 + 30, i * 100 + 40, kernel="k")
    a = analyze(exp.write(tmp_path / "p.sqlite"))
    ids = dict(zip(a.ops()["name"], a.ops()["op_id"]))
    assert ids == {
        "/aten::conv2d": "CONV2D_1",
        "/aten::relu": "RELU_1",
        "/aten::conv2d[2]": "CONV2D_2",
        "/aten::uniform_": "UNIFORM__1",
    }


def test_instance_metrics_flatten_overlaps(tmp_path):
    exp, t = new_export()
    exp.push_pop(t, 0, 1000, "aten::bmm, seq = 1, op_id = 1")
    c1 = exp.runtime(t, 100, 200)
    c2 = exp.runtime(t, 150, 300)  # overlaps the first call: API time flattened = 200
    c3 = exp.runtime(t, 500, 600)  # + 100 -> 300, CPU overhead = 1000 - 300 = 700
    exp.kernel(PID, c1, 1000, 1500, "a", stream_id=7)
    exp.kernel(PID, c2, 1200, 1800, "b", stream_id=8)  # concurrent: busy [1000, 1800) = 800
    exp.kernel(PID, c3, 2000, 2100, "c", stream_id=7)  # + 100 -> GPU time 900, span 1100 -> idle 200
    a = analyze(exp.write(tmp_path / "p.sqlite"))
    op = a.op("/aten::bmm")
    assert (op["cpu_total"], op["overhead_total"], op["gpu_total"], op["idle_total"]) == (1000, 700, 900, 200)
    # the All Kernels figure accumulates instead: 500 + 600 + 100
    assert a.agg().summary["kernels"]["all"]["gpu_time"] == 1200


def test_top_level_numbering_restarts_every_iteration(tmp_path):
    exp, t = new_export()
    for it in range(2):
        base = it * 1000
        for k in range(2):
            s = base + k * 100
            exp.push_pop(t, s, s + 50, f"aten::mul, seq = {it * 10 + k}, op_id = {it * 10 + k}")
            exp.launch(t, s + 10, s + 20, s + 30, s + 40, kernel="mul")
        exp.push_pop(t, base + 300, base + 400, "step")  # a key node after the ops: they stay top-level
    a = analyze(exp.write(tmp_path / "p.sqlite"), key_node="step")
    assert a.iterations.key_node == "step" and a.iterations.boundaries.tolist() == [400, 1400]
    assert a.op_names() == {"/aten::mul", "/aten::mul[2]"}
    assert a.op("/aten::mul")["calls"] == 2 and a.op("/aten::mul[2]")["calls"] == 2


def dlprof_marker_profile(tmp_path, with_backward_marker=False):
    exp, t = new_export()
    trace = (
        "{'traceMarker': ['train.py:57', 'model.py:30'], 'funcStack': "
        "'/<module>/Net::_call_impl/Net::forward/Conv2d::_call_impl(2)/Conv2d::forward/conv2d'}"
    )
    args = (
        "{'mod': 'torch.nn.functional', 'op': 'conv2d', 'callid': 12, 'args': [{'name': '', 'type': 'tensor', "
        "'shape': (8, 3, 64, 64), 'dtype': 'float16'}, {'name': '', 'type': 'tensor', 'shape': (16, 3, 3, 3), "
        "'dtype': 'float16'}, {'name': 'stride', 'type': 'int', 'value': 1}]}"
    )
    exp.push_pop(t, 0, 1000, trace)
    exp.push_pop(t, 10, 990, "{'mod': 'torch.nn.functional', 'strRepr': 'Conv2d(3, 16, kernel_size=(3, 3))'}")
    exp.push_pop(t, 20, 980, args)
    exp.push_pop(t, 30, 970, "aten::conv2d, seq = 4, op_id = 1")
    exp.launch(t, 40, 50, 60, 260, kernel="volta_fp16_s884cudnn_fp16_128x128_ldg8_relu_f2f_exp_small_nhwc_tn_v1")
    grad = exp.add_thread(pid=PID, tid=PID + 1, name="autograd")
    if with_backward_marker:
        exp.push_pop(grad, 2000, 3000, trace)
        exp.push_pop(
            grad,
            2010,
            2990,
            "{'mod': 'torch.nn.functional', 'op': 'conv2d', 'dir': 'bprop', 'fwdCallid': 12, 'args': []}",
        )
    else:
        exp.push_pop(grad, 2000, 3000, "ConvolutionBackward0, seq = 4, op_id = 2")
    exp.launch(grad, 2100, 2110, 2200, 2300, kernel="wgrad")
    return exp.write(tmp_path / "p.sqlite")


@pytest.mark.parametrize("with_backward_marker", [False, True])
def test_dlprof_dict_markers(tmp_path, with_backward_marker):
    a = analyze(dlprof_marker_profile(tmp_path, with_backward_marker))
    name = "/module/Net::_call_impl/Net::forward/Conv2d::_call_impl[2]/Conv2d::forward/conv2d"
    assert a.op_names() == {name}
    fwd, bwd = a.op(name, "fprop"), a.op(name, "bprop")
    assert (fwd["op_type"], fwd["data_type"], fwd["stack_trace"]) == ("conv2d", "float16", "train.py:57\nmodel.py:30")
    assert fwd["using_tc"] and fwd["tc_eligible"] and fwd["gpu_total"] == 200
    assert bwd["gpu_total"] == 100 and bwd["op_type"] == "conv2d"
    inst = a.domain().instances
    row = inst[(inst["name"] == name) & (inst["direction"] == "fprop")].iloc[0]
    assert row["input_shapes"] == "<N:8, C:3, H:64, W:64>; <K:16, C:3, R:3, S:3>"
    assert row["output_shapes"] == "<N:8, K:16, P:62, Q:62>"
    assert row["parameters"] == "stride=1"


def test_dlprof_markers_without_backward_markers_make_one_backward_op(tmp_path):
    exp, t = new_export()
    grad = exp.add_thread(pid=PID, tid=PID + 1, name="autograd")
    exp.push_pop(t, 0, 100, "{'traceMarker': ['train.py:1'], 'funcStack': '/<module>/linear'}")
    exp.push_pop(t, 10, 90, "{'mod': 'torch.nn.functional', 'op': 'linear', 'args': []}")
    exp.launch(t, 20, 30, 40, 60, kernel="gemm")
    exp.launch(grad, 200, 210, 300, 340, kernel="gemm_bwd")
    exp.launch(grad, 400, 410, 420, 430, kernel="gemm_bwd2")
    a = analyze(exp.write(tmp_path / "p.sqlite"))
    assert a.op_names() == {"/module/linear", "backward"}
    bwd = a.op("backward")
    assert (bwd["calls"], bwd["direction"], bwd["op_type"], bwd["gpu_total"], bwd["cpu_total"]) == (
        1,
        "bprop",
        "backward",
        50,
        210,
    )


def test_tensorflow_node_ranges(tmp_path):
    exp, t = new_export()
    exp.push_pop(t, 0, 100, "Conv2D: model/conv1/Conv2D")
    exp.launch(t, 10, 20, 30, 80, kernel="implicit_convolve_sgemm")
    exp.push_pop(t, 200, 300, "Conv2DBackpropInput: gradients/model/conv1/Conv2D_grad/Conv2DBackpropInput")
    exp.launch(t, 210, 220, 230, 290, kernel="dgrad")
    a = analyze(exp.write(tmp_path / "p.sqlite"))
    assert a.corr.mode == "tensorflow2"
    fwd = a.op("model/conv1/Conv2D")
    assert (fwd["op_type"], fwd["direction"], fwd["tc_eligible"], fwd["using_tc"]) == ("Conv2D", "fprop", True, False)
    bwd = a.op("gradients/model/conv1/Conv2D_grad/Conv2DBackpropInput")
    assert (bwd["op_type"], bwd["direction"]) == ("Conv2DBackpropInput", "bprop")


def test_tensorrt_layers_with_registered_names(tmp_path):
    exp, t = new_export("2024.6")
    exp.add_domain(t, domain_id=3, name="TensorRT", registered=True)
    exp.push_pop(t, 0, 1000, "ExecutionContext::execute", domain_id=3, registered=True)
    exp.push_pop(t, 10, 400, "onnx::Conv_239", domain_id=3, registered=True)
    exp.launch(t, 20, 30, 40, 200, kernel="trt_ampere_h16816gemm_64x64_ldg8_relu_stages_64x5_tn_v1")
    exp.push_pop(t, 500, 900, "onnx::Relu_240", domain_id=3, registered=True)
    exp.launch(t, 510, 520, 530, 560, kernel="relu")
    a = analyze(exp.write(tmp_path / "p.sqlite"))
    assert a.corr.mode == "tensorrt" and list(a.corr.domains) == ["TensorRT"]
    conv = a.op("/ExecutionContext::execute/onnx::Conv_239", domain="TensorRT")
    assert (conv["op_type"], conv["using_tc"], conv["tc_eligible"]) == ("Conv", True, True)
    relu = a.op("/ExecutionContext::execute/onnx::Relu_240", domain="TensorRT")
    assert (relu["op_type"], relu["tc_eligible"]) == ("Relu", False)


@pytest.mark.parametrize("registered", [False, True])
def test_text_and_registered_strings_read_alike(tmp_path, registered):
    exp, t = new_export()
    exp.push_pop(t, 0, 100, "aten::mm, seq = 1, op_id = 1", registered=registered)
    exp.launch(t, 10, 20, 30, 40, kernel="k")
    a = analyze(exp.write(tmp_path / "p.sqlite"))
    assert a.op_names() == {"/aten::mm"} and a.op("/aten::mm")["gpu_total"] == 10


@pytest.mark.slow
def test_domains_are_kept_apart(tmp_path):
    exp, t = new_export("2026.2")
    exp.add_domain(t, domain_id=1, name="NCCL")
    exp.push_pop(t, 0, 1000, "c10d::allreduce_, op_id = 1")
    exp.push_pop(t, 100, 900, "ncclAllReduce", domain_id=1)
    exp.launch(t, 200, 210, 300, 700, kernel="ncclDevKernel_AllReduce_Sum_f32_RING_LL")
    exp.push_pop(t, 2000, 2100, "ncclGroupEnd", domain_id=2)  # a handle with no create row
    exp.launch(t, 2010, 2020, 2030, 2040, kernel="k")
    a = analyze(exp.write(tmp_path / "p.sqlite"))
    assert set(a.corr.domains) == {"default", "NCCL", "domain2"}
    assert a.op("/c10d::allreduce_")["gpu_total"] == 400
    assert a.op("/ncclAllReduce", domain="NCCL")["gpu_total"] == 400
    assert a.op("/ncclGroupEnd", domain="domain2")["gpu_total"] == 10
    # every domain accounts for every activity
    for name in a.corr.domains:
        assert a.agg(name).summary["kernels"]["all"]["gpu_time"] == 410


def test_a_reused_correlation_id_links_each_activity_to_the_nearest_call_before_it(tmp_path):
    # process 100 reuses correlation id 5 (calls at 100 and 1000); process 200 has its own id 5
    exp, t = new_export()
    t2 = exp.add_thread(pid=200, tid=200, name="python", process_name="python")
    exp.push_pop(t, 0, 250, "aten::mm, seq = 1, op_id = 1")
    exp.push_pop(t, 900, 1550, "aten::relu, seq = 2, op_id = 2")
    exp.runtime(t, 100, 200, correlation_id=5)  # api row 0 (100 ns)
    exp.runtime(t2, 150, 160, correlation_id=5)  # api row 1, the other process
    exp.runtime(t, 1000, 1500, correlation_id=5)  # api row 2 (500 ns)
    exp.kernel(PID, 5, 50, 60, "k_before_every_call")  # no call before it: the earliest call (row 0)
    exp.kernel(200, 5, 170, 180, "k_other_process")  # row 1
    exp.kernel(PID, 5, 300, 400, "k_after_first")  # nearest call before it: row 0
    exp.kernel(PID, 5, 1600, 1700, "k_after_second")  # nearest call before it: row 2
    a = analyze(exp.write(tmp_path / "p.sqlite"))
    names = a.trace.gpu["name"].astype(str).tolist()
    assert dict(zip(names, a.corr.gpu_api.tolist())) == {
        "k_before_every_call": 0,
        "k_other_process": 1,
        "k_after_first": 0,
        "k_after_second": 2,
    }
    assert a.op("/aten::mm")["gpu_total"] == 10 + 100  # k_before_every_call + k_after_first
    assert a.op("/aten::relu")["gpu_total"] == 100  # k_after_second, launched by the 500 ns call
    kernels = a.aggs["default"].kernels
    api_of = dict(zip(kernels["name"].astype(str), kernels["api_total"]))
    assert (api_of["k_after_first"], api_of["k_after_second"]) == (100, 500)


def _launching_call(api_pid, api_corr, api_start, pid, corr, start) -> int:
    """The rule, one activity at a time: its (process, correlation id)'s only call; among several, the latest
    starting at or before it (equal starts: the later row), else the earliest (equal starts: the earlier row)."""
    if corr < 0:
        return -1
    calls = [i for i in range(len(api_pid)) if api_pid[i] == pid and api_corr[i] == corr]
    if len(calls) <= 1:
        return calls[0] if calls else -1
    before = [i for i in calls if api_start[i] <= start]
    if before:
        return max(before, key=lambda i: (api_start[i], i))
    return min(calls, key=lambda i: (api_start[i], i))


@pytest.mark.parametrize("pid_base", [0, 1 << 30, -5])  # packed keys; process ids past the packed range
def test_launch_rows_follow_the_rule_activity_by_activity(pid_base):
    rng = np.random.default_rng(pid_base & 0xFFFF)
    for _ in range(300):
        n_api, n_gpu = (int(x) for x in rng.integers(0, 40, 2))
        api = [rng.integers(0, 3, n_api) + pid_base, rng.integers(-2, 12, n_api), rng.integers(0, 60, n_api)]
        gpu = [rng.integers(0, 3, n_gpu) + pid_base, rng.integers(-2, 12, n_gpu), rng.integers(0, 60, n_gpu)]
        api, gpu = ([np.asarray(c, dtype=np.int64) for c in cols] for cols in (api, gpu))
        given = [c.copy() for c in api + gpu]
        expected = [_launching_call(*api, *activity) for activity in zip(*gpu)]
        assert launch_rows(*api, *gpu).tolist() == expected
        assert all((a == b).all() for a, b in zip(api + gpu, given))  # the inputs are left as they were


def test_equal_call_starts_resolve_to_the_later_row(tmp_path):
    exp, t = new_export()
    exp.runtime(t, 100, 110, correlation_id=7)
    exp.runtime(t, 100, 130, correlation_id=7)
    exp.kernel(PID, 7, 200, 210, "k")
    a = analyze(exp.write(tmp_path / "p.sqlite"))
    assert a.corr.gpu_api.tolist() == [1]


def _instance_key_frame(dm):
    inst = dm.instances.copy()
    inst["op_name"] = dm.ops.set_index("op_index")["name"].reindex(inst["op_index"]).to_numpy()
    keys = ["kind", "range_id", "api_id", "activity_id"]
    cols = keys + [
        "start",
        "end",
        "pid",
        "global_tid",
        "device_id",
        "cpu_time",
        "cpu_overhead",
        "gpu_time",
        "gpu_start",
        "gpu_end",
        "gpu_idle",
        "n_gpu",
        "n_kernels",
        "name",
        "direction",
        "op_type",
        "data_type",
        "op_name",
        "op_index",
    ]
    return inst[cols].sort_values(keys).reset_index(drop=True)


def _owner_keys(dm, owners):
    inst = dm.instances.set_index("instance_id")
    frame = inst.reindex(owners)[["kind", "range_id", "api_id", "activity_id"]].reset_index(drop=True)
    return frame


def correlation_with_cuts(a, cuts):
    from dlprof_profiler.engine import correlate as C

    classified = (a.corr.range_info, a.corr.mode, a.corr.family, dict(a.corr.config))
    links = (a.corr.gpu_api, a.corr.thread_device, a.corr.process_device)
    return C.correlate(a.trace, a.corr.mode, a.iterations.boundaries, classified, links, cuts=cuts)


@pytest.mark.slow
@pytest.mark.parametrize(
    "profile",
    [
        "training",
        "naming",
        "dlprof",
        "dlprof_backward_pass",
        "pytorch_2gpu_nccl_nsys2026.2_before.sqlite",
        "nvfuser_h200_nsys2025.1.sqlite",
        "cuda_app_no_nvtx_nsys2021.3.sqlite",
    ],
)
def test_correlation_does_not_depend_on_segments(tmp_path, profile):
    """Correlating segment by segment (ranges still open carried across) gives the model of one pass."""
    import numpy as np
    import pandas as pd

    from tests import profiles
    from tests.test_aggregate import _cut_points
    from tests.test_fixtures import FIXTURES

    if profile == "training":
        path = profiles.training_profile(tmp_path / "t.sqlite")
    elif profile == "naming":
        exp, t = new_export()
        exp.push_pop(t, 0, 1000, "a")
        seq = 0
        for b_start in (10, 500):
            exp.push_pop(t, b_start, b_start + 400, "b")
            for off in (10, 200):
                s = b_start + off
                seq += 1
                exp.push_pop(t, s, s + 90, f"aten::conv1d, seq = {seq}, op_id = {seq}")
                exp.launch(t, s + 10, s + 20, s + 30, s + 40, kernel="conv_kernel")
        path = exp.write(tmp_path / "p.sqlite")
    elif profile == "dlprof":
        path = dlprof_marker_profile(tmp_path, with_backward_marker=True)
    elif profile == "dlprof_backward_pass":
        exp, t = new_export()
        grad = exp.add_thread(pid=PID, tid=PID + 1, name="autograd")
        exp.push_pop(t, 0, 100, "{'traceMarker': ['train.py:1'], 'funcStack': '/<module>/linear'}")
        exp.push_pop(t, 10, 90, "{'mod': 'torch.nn.functional', 'op': 'linear', 'args': []}")
        exp.launch(t, 20, 30, 40, 60, kernel="gemm")
        exp.launch(grad, 200, 210, 300, 340, kernel="gemm_bwd")
        exp.launch(grad, 400, 410, 420, 430, kernel="gemm_bwd2")
        path = exp.write(tmp_path / "p.sqlite")
    else:
        path = FIXTURES / profile
    a = analyze(path)
    for seed in (1, 2, 3):
        cuts = _cut_points(a, n_random=15, seed=seed)
        split = correlation_with_cuts(a, cuts)
        for name, dm in a.corr.domains.items():
            other = split.domains[name]
            pd.testing.assert_frame_equal(dm.ops, other.ops, check_dtype=False)
            pd.testing.assert_frame_equal(_instance_key_frame(dm), _instance_key_frame(other), check_dtype=False)
            for attr in ("api_instance", "gpu_instance"):
                pd.testing.assert_frame_equal(
                    _owner_keys(dm, getattr(dm, attr)), _owner_keys(other, getattr(other, attr)), check_dtype=False
                )
            assert np.array_equal(np.sort(other.instances["instance_id"].to_numpy()), np.arange(len(other.instances)))


def test_tensorrt_onnx_paths_name_ops_without_double_slashes(tmp_path):
    exp, t = new_export("2024.6")
    exp.add_domain(t, domain_id=3, name="TensorRT", registered=True)
    exp.push_pop(t, 0, 1000, "ExecutionContext::execute", domain_id=3, registered=True)
    exp.push_pop(t, 10, 400, "/backbone/conv1/Conv + /backbone/relu/Relu", domain_id=3, registered=True)
    exp.launch(t, 20, 30, 40, 200, kernel="trt_ampere_h16816gemm_64x64_ldg8_relu_stages_64x5_tn_v1")
    exp.push_pop(t, 500, 900, "/head/fc/Gemm", domain_id=3, registered=True)
    exp.launch(t, 510, 520, 530, 560, kernel="gemm")
    a = analyze(exp.write(tmp_path / "p.sqlite"))
    names = a.op_names("TensorRT")
    assert names == {
        "/ExecutionContext::execute/backbone/conv1/Conv + /backbone/relu/Relu",
        "/ExecutionContext::execute/head/fc/Gemm",
    }
    conv = a.op("/ExecutionContext::execute/backbone/conv1/Conv + /backbone/relu/Relu", domain="TensorRT")
    assert (conv["op_type"], conv["op_id"]) == ("Conv+Relu", "CONV_RELU_1")
    assert a.op("/ExecutionContext::execute/head/fc/Gemm", domain="TensorRT")["op_id"] == "GEMM_1"


def test_op_ids_stay_short_for_long_labels(tmp_path):
    exp, t = new_export()
    label = "forward pass of the decoder stack with cross attention over the encoder memory"
    exp.push_pop(t, 0, 100, label)
    exp.launch(t, 10, 20, 30, 40, kernel="k")
    op = analyze(exp.write(tmp_path / "p.sqlite")).op("/" + label)
    # the type (the label) upper-cased is 79 characters: the whole words of its last 48 make the Op ID
    assert op["op_id"] == "WITH_CROSS_ATTENTION_OVER_THE_ENCODER_MEMORY_1"


def test_api_names_as_users_write_them():
    """The one rule naming CUDA API calls for users (contract.api_display_name): nsys's version suffix goes,
    anything else stays."""
    from dlprof_profiler.contract import api_display_name

    assert api_display_name("cudaLaunchKernel_v7000") == "cudaLaunchKernel"
    assert api_display_name("cuMemcpyHtoD_v2") == "cuMemcpyHtoD"
    assert api_display_name("cudaMemcpyAsync_ptsz_v7000") == "cudaMemcpyAsync_ptsz"
    for name in ("cudaEventQuery", "my_kernel_v", "_v3020", "conv_v2x", "kernel_v١٢"):
        assert api_display_name(name) == name
    assert api_display_name(None) is None


def test_op_grouper_numbers_calls_per_iteration_thread_and_name():
    """The op grouping both engines run (in memory: one batch of object names; out of core: batches of
    string-pool codes in start order): the n-th call of a (name, direction) on a thread within an iteration
    is the same op in every iteration; an op's first call is the earliest (then lowest id), its device the
    one most calls ran on (lowest on ties), its data type the first one given in time; batches give what one
    batch gives."""
    import numpy as np

    from dlprof_profiler.engine.correlate import OpGrouper

    # iteration bounds at 100: calls 0-3 in iteration 0, 4-7 in iteration 1; thread 1 and thread 2
    ids = np.array([0, 3, 1, 2, 4, 7, 5, 6])
    start = np.array([10, 15, 20, 30, 110, 115, 120, 130])
    tid = np.array([1, 2, 1, 1, 1, 2, 1, 1])
    device = np.array([0, 0, 1, 0, 1, 0, 1, -1])
    data_type = np.array([None, "f32", None, "f16", "f16", None, "f32", None], dtype=object)
    values = {"op_type": np.array(["t"] * 8, dtype=object), "label": ids * 10, "kind": np.zeros(8, np.int64)}
    values |= {"data_type": data_type, "stack_trace": np.full(8, None, dtype=object)}
    for names in (
        np.array(["mm", "mm", "mm", "add", "mm", "mm", "mm", "add"], dtype=object),
        np.array([7, 7, 7, 3, 7, 7, 7, 3]),  # the same calls with names as codes
    ):
        directions = np.array(["fprop"] * 8, dtype=object)
        for batches in ([slice(0, 8)], [slice(0, 3), slice(3, 5), slice(5, 8)]):
            grouper = OpGrouper(np.array([100]))
            gid = np.concatenate(
                [
                    grouper.add(
                        ids[b],
                        start[b],
                        tid[b],
                        names[b],
                        directions[b],
                        device[b],
                        {c: v[b] for c, v in values.items()},
                    )
                    for b in batches
                ]
            )
            table = grouper.table()
            # ops: mm#1 (calls 0, 3, 4, 7: the first on each thread), mm#2 (1, 5), add#1 (2, 6)
            groups = {tuple(sorted(ids[gid == g].tolist())): g for g in np.unique(gid)}
            assert set(groups) == {(0, 3, 4, 7), (1, 5), (2, 6)}
            rows = table.iloc[[groups[(0, 3, 4, 7)], groups[(1, 5)], groups[(2, 6)]]]
            assert rows["nth"].tolist() == [1, 2, 1]
            assert rows["label"].tolist() == [0, 10, 20]  # from the first call
            assert rows["first_start"].tolist() == [10, 20, 30] and rows["n_instances"].tolist() == [4, 2, 2]
            # mm#1 ran on device 0 three times (calls 0, 3, 7), on 1 once; mm#2 twice on 1; add#1 once on 0
            assert rows["device_id"].tolist() == [0, 1, 0]
            assert rows["data_type"].tolist() == ["f32", "f32", "f16"]


def test_a_backward_pass_crossing_a_cut_spans_the_calls_it_owns():
    """The completion both engines run for an instance crossing a segment cut: a backward pass takes the
    first start and last end of the API calls it owns; other instances, and one owning none, keep theirs."""
    import pandas as pd

    from dlprof_profiler.engine.correlate import BACKWARD_PASS, RANGE_OP, backward_pass_spans

    part = pd.DataFrame(
        {"instance_id": [4, 7, 9], "kind": [RANGE_OP, BACKWARD_PASS, BACKWARD_PASS], "start": [10, 50, 80]}
        | {"end": [20, 60, 90], "pid": [1, 1, 1], "global_tid": [2, 2, 2]}
    )
    span = pd.DataFrame({"s": [5, 45], "e": [25, 75]}, index=[4, 7])
    out = backward_pass_spans(part, span)
    assert out["start"].tolist() == [10, 45, 80] and out["end"].tolist() == [20, 75, 90]
    assert part["start"].tolist() == [10, 50, 80]  # a copy: the caller's frame is left alone


def test_the_run_configuration_takes_the_memory_peak_where_the_markers_give_none():
    from dlprof_profiler.engine.correlate import run_config

    gib = 1 << 30
    assert run_config({"batch_size": 8}, {"gpu_peak_memory": 6 * gib}) == {"batch_size": 8, "peak_memory": 6 * gib}
    assert run_config({"max_memory_allocated": gib}, {"gpu_peak_memory": 6 * gib}) == {"max_memory_allocated": gib}
    assert run_config({"max_memory_reserved": gib}, {"gpu_peak_memory": 6 * gib}) == {"max_memory_reserved": gib}
    assert run_config({"batch_size": 8}, {}) == {"batch_size": 8}


def test_a_handed_over_trace_drops_what_correlation_alone_reads():
    """`analyze(..., handed_over=True)` (the CLI's run: the trace is the analysis's own) drops the ranges'
    details and the classification's columns once correlated, and every table and finding is as without."""
    import pandas as pd

    from dlprof_profiler.engine import correlate as C
    from dlprof_profiler.engine.analysis import RANGE_INFO_AFTER_CORRELATION, analyze
    from dlprof_profiler.ingest.formats import read_trace
    from dlprof_profiler.ingest.sanitize import sanitize_trace
    from tests.data import KINETO
    from tests.test_aggregate import _assert_same_aggregation

    path = KINETO / "resnet50_v100_2021format.pt.trace.json.gz"
    kept = analyze(sanitize_trace(read_trace(path)))
    dropped = analyze(sanitize_trace(read_trace(path)), handed_over=True)
    assert "input_shapes" in kept.trace.ranges and kept.trace.ranges["input_shapes"].notna().any()
    assert not set(C.RANGE_DETAIL_COLUMNS) & set(dropped.trace.ranges.columns)
    assert list(dropped.corr.range_info.columns) == RANGE_INFO_AFTER_CORRELATION
    assert len(dropped.corr.range_info) == len(kept.corr.range_info)
    for name, dm in kept.corr.domains.items():
        pd.testing.assert_frame_equal(dm.instances, dropped.corr.domains[name].instances)
        pd.testing.assert_frame_equal(dm.ops, dropped.corr.domains[name].ops)
        _assert_same_aggregation(kept.aggregations[name], dropped.aggregations[name])
    assert kept.findings == dropped.findings


def test_the_owners_are_handed_on_before_the_op_tables_are_built(tmp_path, monkeypatch):
    """`correlate(..., on_owned=...)` (the database writer takes the activity owners then) gets every domain's
    final owner of each GPU activity, once, before any op table exists, also when correlated in segments."""
    import numpy as np

    from dlprof_profiler.engine import correlate as C

    exp, t = new_export()
    exp.add_domain(t, domain_id=1, name="NCCL")
    exp.push_pop(t, 0, 1000, "c10d::allreduce_, op_id = 1")
    exp.push_pop(t, 100, 900, "ncclAllReduce", domain_id=1)
    exp.launch(t, 200, 210, 300, 700, kernel="ncclDevKernel_AllReduce_Sum_f32_RING_LL")
    exp.launch(t, 2010, 2020, 2030, 2040, kernel="k")  # outside every range: its launching call is an op
    a = analyze(exp.write(tmp_path / "p.sqlite"))
    events = []
    op_table = C.op_table
    monkeypatch.setattr(C, "op_table", lambda *args: events.append("op table") or op_table(*args))
    for cuts in (None, [150, 1500]):
        events.clear()
        handed = []
        classified = (a.corr.range_info, a.corr.mode, a.corr.family, dict(a.corr.config))
        links = (a.corr.gpu_api, a.corr.thread_device, a.corr.process_device)
        corr = C.correlate(
            a.trace,
            a.corr.mode,
            a.iterations.boundaries,
            classified,
            links,
            cuts=cuts,
            on_owned=lambda gpu_api, owners: (
                events.append("owned") or handed.append((gpu_api.copy(), {d: g.copy() for d, g in owners.items()}))
            ),
        )
        assert events == ["owned", "op table", "op table"]
        [(gpu_api, owners)] = handed
        assert np.array_equal(gpu_api, corr.gpu_api) and set(owners) == {"default", "NCCL"}
        for name, dm in corr.domains.items():
            assert np.array_equal(owners[name], dm.gpu_instance) and (owners[name] >= 0).all()
            # the kernel launched outside the ranges belongs to its call's unassociated instance in both domains
            assert dm.instances.loc[owners[name][1], "kind"] == C.UNASSOCIATED_API


def test_call_metrics_sum_a_calls_instances_into_the_instance_that_opens_it():
    # instances 10 and 12 open calls; 11 and 13 are autograd nodes of call 10; 14 belongs to no loaded call
    inst = pd.DataFrame(
        {
            "instance_id": [10, 11, 12, 13, 14],
            "call_id": [10, 10, 12, 10, 99],
            "cpu_time": [5, 7, 11, 13, 17],
            "cpu_overhead": [1, 2, 3, 4, 5],
            "gpu_time": [0, 100, 30, 1000, 7],
            "gpu_idle": [2, 0, 0, 3, 0],
            "n_kernels": [0, 1, 2, 4, 8],
        }
    )
    call_metrics(inst)
    assert inst["is_call"].tolist() == [True, False, True, False, False]
    assert inst["call_cpu_time"].tolist() == [5 + 7 + 13, 0, 11, 0, 0]
    assert inst["call_cpu_overhead"].tolist() == [1 + 2 + 4, 0, 3, 0, 0]
    assert inst["call_gpu_time"].tolist() == [1100, 0, 30, 0, 0]
    assert inst["call_gpu_idle"].tolist() == [5, 0, 0, 0, 0]
    assert inst["call_n_kernels"].tolist() == [5, 0, 2, 0, 0]
    assert inst["call_n_kernels"].dtype == np.int64
