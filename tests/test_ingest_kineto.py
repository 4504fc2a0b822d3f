"""Kineto (torch.profiler) traces: every real trace in tests/data/kineto is read with exact figures
(checked against direct sums over the JSON with the standard library and Decimal, independent of the
adapter), and hand-written traces check the mapping: ops, scopes, backward links, flows, exact times."""

import csv
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
from collections import Counter, defaultdict
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import numpy as np
import pytest

from dlprof_profiler.cli.main import main
from dlprof_profiler.ingest import formats as ingest
from dlprof_profiler.ingest import kineto
from dlprof_profiler.errors import DLProfError
from dlprof_profiler.ingest.kineto import read_kineto_trace, short_kernel_name
from tests.analysis import analyze
from tests.kineto_builder import KinetoTrace
from tests import data
from tests.stored_ranges import with_raw_ranges

FIXTURES = data.KINETO
NAMES = sorted(p.name for p in FIXTURES.glob("*.json*"))
GPU_CATS = {"kernel": 0, "gpu_memcpy": 1, "memcpy": 1, "gpu_memset": 2, "memset": 2}
API_CATS = {"cuda_runtime", "runtime", "cuda_driver"}
OP_CATS = {"cpu_op", "operator"}


def ns(value) -> int:
    """Microseconds (a JSON decimal read as Decimal) -> integer ns, rounded half away from zero."""
    return int((Decimal(value) * 1000).to_integral_value(rounding=ROUND_HALF_UP))


def load_json(path: Path) -> dict:
    opener = gzip.open if path.read_bytes()[:2] == b"\x1f\x8b" else open
    with opener(path, "rb") as fh:
        return json.load(fh, parse_float=Decimal)


def expected_sums(doc: dict) -> dict:
    """Direct sums over the JSON: per (category kind, name, device) the count and total ns; API calls per
    name; ProfilerStep and op counts."""
    gpu = defaultdict(lambda: [0, 0])
    api = Counter()
    steps = ops = 0
    for e in doc["traceEvents"]:
        if e.get("ph") != "X":
            continue
        cat = str(e.get("cat", "")).lower()
        args = e.get("args") or {}
        if cat in GPU_CATS:
            key = (GPU_CATS[cat], e["name"], args.get("device", e["pid"]))
            gpu[key][0] += 1
            gpu[key][1] += ns(e["dur"])
        elif cat in API_CATS:
            api[e["name"]] += 1
        elif cat in OP_CATS and ("#" not in e["name"] or "::" in e["name"]):  # not a record_function label
            ops += 1
        if cat in ("user_annotation", "operator") and re.fullmatch(r"ProfilerStep#\d+", e["name"]):
            steps += 1  # the CPU-side step ranges (2021 traces record them as Operator events)
    return {"gpu": {k: tuple(v) for k, v in gpu.items()}, "api": api, "steps": steps, "ops": ops}


PROFILER_STEP = re.compile(r"ProfilerStep#\d+")


def expected_steps(doc: dict) -> dict:
    """Direct computation over the JSON of the iterations `ProfilerStep#N` ranges give (docs/DESIGN.md
    "Iterations"): the CPU-side step ranges [ts, ts + dur) in which another CPU event (op, annotation, runtime
    call) starts after the step's own start, and the kernel and memory time launched inside them (by the start
    of the runtime call with the device event's correlation id; a device event without one by its own start)."""
    events = [e for e in doc["traceEvents"] if e.get("ph") == "X" and "ts" in e and "dur" in e]

    def cat(e):
        return str(e.get("cat", "")).lower()

    steps = sorted(
        (ns(e["ts"]), ns(e["ts"]) + ns(e["dur"]))
        for e in events
        if cat(e) in ("user_annotation", "operator") and PROFILER_STEP.fullmatch(e["name"])
    )
    cpu = sorted(ns(e["ts"]) for e in events if cat(e) in OP_CATS | API_CATS | {"user_annotation"})
    spans = [(a, b) for a, b in steps if any(a < t < b for t in cpu)]
    launch = {
        e["args"]["correlation"]: ns(e["ts"])
        for e in events
        if cat(e) in API_CATS and "correlation" in (e.get("args") or {})
    }
    gpu = defaultdict(lambda: [0, 0])  # as expected_sums, over the activities launched inside a step
    for e in events:
        if cat(e) in GPU_CATS:
            at = launch.get((e.get("args") or {}).get("correlation"), ns(e["ts"]))
            if any(a <= at < b for a, b in spans):
                key = (GPU_CATS[cat(e)], e["name"], (e.get("args") or {}).get("device", e["pid"]))
                gpu[key][0] += 1
                gpu[key][1] += ns(e["dur"])
    return {
        "spans": spans,
        "gpu": {k: tuple(v) for k, v in gpu.items()},
        "kernel_time": sum(t for k, (_, t) in gpu.items() if k[0] == 0),
        "memory_time": sum(t for k, (_, t) in gpu.items() if k[0] != 0),
    }


@pytest.fixture(scope="module")
def fixture_copies(tmp_path_factory):
    """Read-only fixtures copied to a temporary folder before anything could touch them."""
    root = tmp_path_factory.mktemp("kineto")
    for name in NAMES:
        shutil.copy(FIXTURES / name, root / name)
    return root


def test_every_fixture_is_listed():
    assert len(NAMES) >= 6, NAMES


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_fixture_frames_match_direct_sums(fixture_copies, name):
    path = fixture_copies / name
    doc = load_json(path)
    want = expected_sums(doc)
    assert ingest.trace_format(path) == ingest.KINETO
    a = analyze(path)
    trace = a.trace
    gpu = trace.gpu
    got = defaultdict(lambda: [0, 0])
    for kind, long_name, device, dur in zip(
        gpu["kind"].tolist(),
        gpu["long_name"].astype(str).tolist(),
        gpu["device_id"].tolist(),
        (gpu["end"] - gpu["start"]).tolist(),
    ):
        got[(kind, long_name, device)][0] += 1
        got[(kind, long_name, device)][1] += dur
    assert {k: tuple(v) for k, v in got.items()} == want["gpu"]
    assert Counter(trace.api_calls["name"].astype(str).tolist()) == want["api"]
    texts = trace.ranges["text"]
    assert int(texts.str.fullmatch(r"ProfilerStep#\d+").sum()) == want["steps"]
    assert int(texts.str.contains(r", op_id = \d+$").sum()) == want["ops"]
    steps = expected_steps(doc)
    if want["steps"]:
        # N steps are N iterations, each the step's own span (a step in which nothing starts is none)
        assert a.iterations.key_node == "ProfilerStep" and a.iterations.count == len(steps["spans"])
    else:
        assert a.iterations.key_node != "ProfilerStep"
    # every GPU activity whose correlation id has a runtime call in the JSON is linked to it
    runtime_ids = {
        e["args"]["correlation"]
        for e in doc["traceEvents"]
        if e.get("ph") == "X" and str(e.get("cat", "")).lower() in API_CATS and "correlation" in (e.get("args") or {})
    }
    linked = a.corr.gpu_api >= 0
    assert linked.sum() == int(gpu["correlation_id"].isin(list(runtime_ids)).sum())
    # nothing is dropped: every GPU activity belongs to one op instance, and the summary adds them all (with
    # steps, all those launched inside a step)
    kernel_time = sum(v[1] for k, v in want["gpu"].items() if k[0] == 0)
    memory_time = sum(v[1] for k, v in want["gpu"].items() if k[0] != 0)
    if want["steps"]:
        kernel_time, memory_time = steps["kernel_time"], steps["memory_time"]
    for agg in a.aggs.values():
        kernels = agg.summary["kernels"]
        assert kernels["tc"]["gpu_time"] + kernels["other"]["gpu_time"] == kernel_time
        assert kernels["memory"]["gpu_time"] == memory_time
    assert (a.domain().gpu_instance >= 0).all()


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_fixture_iterations_are_its_profiler_steps(fixture_copies, name):
    """Iteration count, durations, wall clock, average and median against the ProfilerStep events' ts/dur."""
    import statistics

    doc = load_json(fixture_copies / name)
    spans = expected_steps(doc)["spans"]
    if not spans:
        pytest.skip("no ProfilerStep ranges")
    a = analyze(fixture_copies / name)
    agg = a.agg()
    s = agg.summary
    durations = [b - a_ for a_, b in spans]
    assert agg.iterations["duration"].tolist() == durations
    assert agg.iterations["complete"].all()
    assert (s["total_iterations"], s["aggregated_iterations"]) == (len(spans), len(spans))
    assert s["wall_time"] == spans[-1][1] - spans[0][0]  # the steps' window, nothing before or after
    assert s["avg_iteration_time"] == pytest.approx((spans[-1][1] - spans[0][0]) / len(spans))
    assert s["median_iteration_time"] == statistics.median(durations)
    assert (s["complete_start"], s["complete_stop"], s["partial_iterations"]) == (0, len(spans) - 1, [])


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_fixture_times_are_exact_nanoseconds(fixture_copies, name):
    """Kernel start times, relative to the first kernel, equal the JSON decimals to the nanosecond."""
    path = fixture_copies / name
    doc = load_json(path)
    starts = sorted(
        ns(e["ts"]) for e in doc["traceEvents"] if e.get("ph") == "X" and str(e.get("cat", "")).lower() in GPU_CATS
    )
    trace = read_kineto_trace(path)
    ours = np.sort(trace.gpu["start"].to_numpy())
    assert len(ours) == len(starts)
    if starts:
        assert (ours - ours[0]).tolist() == [s - starts[0] for s in starts]
        base = doc.get("baseTimeNanoseconds", 0)
        assert trace.meta["session_start_ns"] + int(ours[0]) == base + starts[0]


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in NAMES if "amd" in n or "ddp" in n or "ns_resolution" in n])
def test_backward_ops_link_to_the_forward_ops_of_their_fwdbwd_flows(fixture_copies, name):
    """torch.profiler draws a fwdbwd arrow from each forward op to the backward node autograd ran for it:
    the bprop op instance holding the node must carry the name of the fprop instance holding the op."""
    path = fixture_copies / name
    doc = load_json(path)
    a = analyze(path)
    base = doc.get("baseTimeNanoseconds", 0)
    origin = a.trace.meta["session_start_ns"] - base
    ends = defaultdict(dict)
    for e in doc["traceEvents"]:
        if e.get("cat") == "fwdbwd" and e.get("ph") in ("s", "f"):
            ends[e["id"]][e["ph"]] = (e["pid"], e["tid"], ns(e["ts"]) - origin)
    inst = a.domain().instances
    inst = inst[inst["kind"] == 0]
    tids = a.trace.threads.set_index(["pid", "tid"])["global_tid"].to_dict()

    def holder(point):
        pid, tid, t = point
        g = tids[(pid, tid)]
        hit = inst[(inst["global_tid"] == g) & (inst["start"] <= t) & (inst["end"] > t)]
        return hit.sort_values("start").iloc[-1] if len(hit) else None

    checked = 0
    for pair in ends.values():
        if "s" not in pair or "f" not in pair:
            continue
        forward, backward = holder(pair["s"]), holder(pair["f"])
        if forward is None or backward is None or forward["direction"] != "fprop":
            continue  # the forward op lies outside the capture window
        assert backward["direction"] == "bprop"
        assert backward["name"] == forward["name"], (forward["label"], backward["label"])
        checked += 1
    assert checked >= 3


def test_ddp_trace_keeps_rank_and_devices(fixture_copies):
    trace = read_kineto_trace(fixture_copies / "pytorch_ddp_2gpu_nccl.json.gz")
    assert trace.meta["distributed_rank"] == 0 and trace.meta["distributed_world_size"] == 2
    assert len(trace.devices) == 8 and trace.devices.loc[0, "name"] == "NVIDIA A100-PG509-200"
    assert trace.devices.loc[0, "sm_count"] == 108
    nccl = trace.gpu[trace.gpu["name"].astype(str).str.startswith("ncclKernel")]
    assert len(nccl) > 0


def test_cpu_only_trace_reads_and_warns(fixture_copies):
    trace = read_kineto_trace(fixture_copies / "pytorch_cpu_only.pt.trace.json.gz")
    assert len(trace.gpu) == 0 and len(trace.api_calls) == 0 and len(trace.ranges) == 15
    assert any("CPU-only" in w for w in trace.warnings)


@pytest.mark.slow
def test_2021_dialect_reads_categories_string_tids_and_call_stacks(fixture_copies):
    trace = read_kineto_trace(fixture_copies / "resnet50_v100_2021format.pt.trace.json.gz")
    assert len(trace.threads) == 2 and sorted(trace.threads["tid"].tolist()) == [25738, 25772]
    stacks = trace.ranges["stack_trace"].dropna()
    assert len(stacks) > 0 and stacks.str.contains(r"resnet50_profiler_api\.py\(\d+\): <module>").all()
    assert not stacks.str.contains("site-packages").any()
    assert trace.meta["gpu_peak_memory"] > 0


def test_amd_trace_names_hip_kernels(fixture_copies):
    trace = read_kineto_trace(fixture_copies / "pytorch_amd_mi250.json.gz")
    assert set(trace.api_calls["name"].astype(str)) >= {"hipLaunchKernel", "hipExtModuleLaunchKernel"}
    names = set(trace.gpu["name"].astype(str))
    assert "vectorized_elementwise_kernel" in names and any(n.startswith("Cijk_") for n in names)
    assert set(trace.gpu["device_id"]) == {2}


# ---------------------------------------------------------------------------- hand-written traces

MAIN, GRAD = 10, 11
T0 = 1_000_000_000
STEP = 100_000


def training_trace(steps: int = 2, dialect: str = "2.x") -> KinetoTrace:
    """Per step (S = T0 + i * STEP + 7, odd ns so the ns digits matter), main thread:
      [S, S+90000)        ProfilerStep#i+1
      [S+100, S+45000)    python train.py(5): step        (user frame)
      [S+500, S+900)      aten::to -> cudaMemcpyAsync [S+600, S+700) -> memcpy HtoD [S+650, S+800)
      [S+1000, S+40000)   nn.Module: Net_0
      [S+1500, S+39000)   torch/nn/modules/module.py(1): _call_impl   (not a user frame)
      [S+2000, S+20000)   nn.Module: Linear_0
      [S+3000, S+19000)   aten::linear seq=10i+1 (dims, float) > aten::addmm seq=10i+2 [S+4000, S+18000)
                          cudaLaunchKernel [S+5000, S+6000) -> volta_sgemm_128x64_nn [S+7000, S+15000)
      [S+21000, S+30000)  nn.Module: ReLU_0 > aten::relu seq=10i+3 [S+22000, S+29000)
                          cudaLaunchKernel [S+23000, S+24000) -> vectorized_elementwise_kernel [S+31000, S+33000)
      [S+75000, S+85000)  Optimizer.step#SGD.step > aten::add_ [S+76000, S+84000)
                          cudaLaunchKernel [S+77000, S+78000) -> multi_tensor_apply_kernel [S+86000, S+88000)
    autograd thread:
      [S+50000, S+56000)  evaluate_function: ReluBackward0 seq=10i+3 > ReluBackward0 [S+50500, S+55500)
                          cudaLaunchKernel [S+51000, S+52000) -> threshold_kernel [S+57000, S+59000)
      [S+60000, S+70000)  evaluate_function: AddmmBackward0 seq=10i+2 > AddmmBackward0 [S+60500, S+69500)
                          cudaLaunchKernel [S+61000, S+62000) -> volta_sgemm_128x64_nt [S+63000, S+68000)
    The profiler span starts at T0 - 1000."""
    k = KinetoTrace(dialect=dialect)
    k.device(0)
    k.metadata({MAIN: "python", GRAD: "pt_autograd_0"})
    k.span(T0 - 1000, steps * STEP + 10_000)
    for i in range(steps):
        s = T0 + i * STEP + 7
        k.annotation(MAIN, s, 90_000, f"ProfilerStep#{i + 1}")
        if dialect != "2021":
            k.python(MAIN, s + 100, 44_900, "train.py(5): step")
        k.cpu_op(MAIN, s + 500, 400, "aten::to", seq=10 * i)
        c = k.runtime(MAIN, s + 600, 100, "cudaMemcpyAsync")
        k.memcpy(s + 650, 150, c)
        if dialect != "2021":
            k.python(MAIN, s + 1000, 39_000, "nn.Module: Net_0")
            k.python(MAIN, s + 1500, 37_500, "torch/nn/modules/module.py(1): _call_impl")
            k.python(MAIN, s + 2000, 18_000, "nn.Module: Linear_0")
        stack = "train.py(5): step;train.py(10): <module>" if dialect == "2021" else None
        k.cpu_op(
            MAIN,
            s + 3000,
            16_000,
            "aten::linear",
            seq=10 * i + 1,
            dims=[[8, 16], [32, 16], [32]],
            types=["float", "float", "float"],
            stack=stack,
        )
        k.cpu_op(MAIN, s + 4000, 14_000, "aten::addmm", seq=10 * i + 2)
        c = k.runtime(MAIN, s + 5000, 1000)
        k.kernel("volta_sgemm_128x64_nn", s + 7000, 8000, c, grid=(64, 2, 1))
        if dialect != "2021":
            k.python(MAIN, s + 21_000, 9000, "nn.Module: ReLU_0")
        k.cpu_op(MAIN, s + 22_000, 7000, "aten::relu", seq=10 * i + 3)
        c = k.runtime(MAIN, s + 23_000, 1000)
        k.kernel(
            "void at::native::vectorized_elementwise_kernel<4, at::native::Relu>(int, float*)", s + 31_000, 2000, c
        )
        k.cpu_op(
            GRAD, s + 50_000, 6000, "autograd::engine::evaluate_function: ReluBackward0", seq=10 * i + 3, fwd_tid=1
        )
        k.cpu_op(GRAD, s + 50_500, 5000, "ReluBackward0", seq=10 * i + 3, fwd_tid=1)
        c = k.runtime(GRAD, s + 51_000, 1000)
        k.kernel("void at::native::threshold_kernel<float>(float*)", s + 57_000, 2000, c)
        k.cpu_op(
            GRAD, s + 60_000, 10_000, "autograd::engine::evaluate_function: AddmmBackward0", seq=10 * i + 2, fwd_tid=1
        )
        k.cpu_op(GRAD, s + 60_500, 9000, "AddmmBackward0", seq=10 * i + 2, fwd_tid=1)
        c = k.runtime(GRAD, s + 61_000, 1000)
        k.kernel("volta_sgemm_128x64_nt", s + 63_000, 5000, c)
        k.annotation(MAIN, s + 75_000, 10_000, "Optimizer.step#SGD.step")
        k.cpu_op(MAIN, s + 76_000, 8000, "aten::add_")
        c = k.runtime(MAIN, s + 77_000, 1000)
        k.kernel("void multi_tensor_apply_kernel<float>(float*)", s + 86_000, 2000, c)
    return k


def test_training_trace_ops_scopes_iterations_and_directions(tmp_path):
    a = analyze(training_trace().write(tmp_path / "t.pt.trace.json.gz", gz=True))
    assert a.corr.mode == "pytorch"
    # the ProfilerStep#N ranges split the iterations: 2 steps -> 3 intervals, the boundaries their ends
    assert a.iterations.key_node == "ProfilerStep" and a.iterations.source == "default"
    origin = T0 - 1000
    assert a.iterations.boundaries.tolist() == [T0 + 7 + 90_000 - origin, T0 + STEP + 7 + 90_000 - origin]
    linear = a.op("/ProfilerStep/Net_0/Linear_0/aten::linear", "fprop")
    assert linear["calls"] == 2 and linear["gpu_total"] == 2 * 8000 and linear["cpu_total"] == 2 * 16_000
    relu = a.op("/ProfilerStep/Net_0/ReLU_0/aten::relu", "fprop")
    assert relu["calls"] == 2 and relu["gpu_total"] == 2 * 2000
    # backward nodes take the name of the forward op their sequence number points to
    relu_back = a.op("/ProfilerStep/Net_0/ReLU_0/aten::relu", "bprop")
    assert relu_back["calls"] == 2 and relu_back["gpu_total"] == 2 * 2000 and relu_back["cpu_total"] == 2 * 6000
    linear_back = a.op("/ProfilerStep/Net_0/Linear_0/aten::linear", "bprop")  # AddmmBackward0 -> addmm in linear
    assert linear_back["calls"] == 2 and linear_back["gpu_total"] == 2 * 5000
    step = a.op("/ProfilerStep/Optimizer.step#SGD.step/aten::add_", "fprop")
    assert step["calls"] == 2 and step["gpu_total"] == 2 * 2000
    to = a.op("/ProfilerStep/aten::to", "fprop")
    assert to["gpu_total"] == 2 * 150
    # nothing else: every name is the same in both steps
    assert a.ops()["calls"].tolist() == [2] * len(a.ops())


def test_training_trace_details_and_exact_times(tmp_path):
    path = training_trace().write(tmp_path / "t.json")
    trace = read_kineto_trace(path)
    origin = T0 - 1000
    gpu = trace.gpu.sort_values("start")
    assert gpu["start"].tolist()[:3] == [650 + 7 + T0 - origin, 7000 + 7 + T0 - origin, 31_000 + 7 + T0 - origin]
    assert trace.meta["session_start_ns"] == 1_700_000_000_000_000_000 + origin
    names = gpu["name"].astype(str).tolist()
    assert names[:4] == [
        "[CUDA memcpy HtoD]",
        "volta_sgemm_128x64_nn",
        "vectorized_elementwise_kernel",
        "threshold_kernel",
    ]
    assert gpu["long_name"].astype(str).tolist()[0] == "Memcpy HtoD (Pageable -> Device)"
    assert gpu["copy_kind"].tolist()[0] == 1 and gpu["bytes"].tolist()[0] == 4096
    assert (gpu["grid_x"].tolist()[1], gpu["grid_y"].tolist()[1], gpu["block_x"].tolist()[1]) == (64, 2, 128)
    assert set(trace.threads["name"]) == {"python", "pt_autograd_0"}
    ranges = trace.ranges
    linear = ranges[ranges["text"].str.startswith("aten::linear")].iloc[0]
    assert linear["text"] == "aten::linear, seq = 1, op_id = 3"  # External id 3 (step annotation 1, aten::to 2)
    assert linear["data_type"] == "float" and linear["input_shapes"] == "<8, 16>; <32, 16>; <32>"
    assert linear["stack_trace"] == "train.py(5): step"  # module and torch frames are not user frames
    assert set(ranges["text"]) >= {"Net_0", "Linear_0", "ReLU_0", "ProfilerStep#1", "Optimizer.step#SGD.step"}
    assert not ranges["text"].str.contains("_call_impl").any()


@pytest.mark.slow
def test_2021_dialect_hand_written(tmp_path):
    """2021 traces record record_function labels (ProfilerStep#N, Optimizer.step#...) as Operator events
    like ops; they are scopes, and ProfilerStep#N splits the iterations as in newer traces."""
    a = analyze(training_trace(dialect="2021").write(tmp_path / "t.json"))
    assert a.iterations.key_node == "ProfilerStep" and a.iterations.count == 2  # the two steps
    texts = a.trace.ranges["text"].tolist()
    assert "ProfilerStep#1" in texts and "Optimizer.step#SGD.step" in texts
    linear = a.op("/ProfilerStep/aten::linear", "fprop")
    assert linear["calls"] == 2 and linear["gpu_total"] == 16_000
    assert a.op("/ProfilerStep/aten::linear", "bprop")["gpu_total"] == 10_000
    stacks = a.domain().instances["stack_trace"].dropna().unique().tolist()
    assert stacks == ["train.py(10): <module>\ntrain.py(5): step"]  # outermost frame first


def test_gpu_activities_link_through_flows_when_args_lack_correlation(tmp_path):
    k = KinetoTrace()
    k.metadata({MAIN: "python"})
    k.cpu_op(MAIN, 1000, 5000, "aten::mm", seq=1)
    c = k.runtime(MAIN, 2000, 500, args_correlation=False)
    k.kernel("volta_sgemm_128x64_nn", 3000, 4000, c, args_correlation=False)
    k.cpu_op(MAIN, 10_000, 5000, "aten::relu", seq=2)
    c = k.runtime(MAIN, 11_000, 500)
    k.kernel("relu_kernel", 12_000, 1000, c)
    a = analyze(k.write(tmp_path / "flows.json"))
    assert (a.corr.gpu_api >= 0).all()
    assert a.op("/aten::mm", "fprop")["gpu_total"] == 4000 and a.op("/aten::relu", "fprop")["gpu_total"] == 1000


def test_python_stack_traces_nest_user_frames(tmp_path):
    k = KinetoTrace()
    k.python(MAIN, 0, 10_000, "train.py(30): <module>")
    k.python(MAIN, 100, 9000, "<built-in method linear of PyCapsule object at 0x7f00>")
    k.python(MAIN, 200, 8000, "model.py(12): forward")
    k.python(MAIN, 300, 7000, "torch/nn/functional.py(9): linear")
    k.cpu_op(MAIN, 400, 6000, "aten::linear", seq=1)
    k.cpu_op(MAIN, 500, 100, "aten::t")  # folded into linear, same stack
    k.cpu_op(MAIN, 9500, 200, "aten::add", seq=2)  # inside <module> only
    trace = read_kineto_trace(k.write(tmp_path / "stack.json"))
    stacks = dict(zip(trace.ranges["text"].str.split(",").str[0], trace.ranges["stack_trace"]))
    assert stacks["aten::linear"] == "train.py(30): <module>\nmodel.py(12): forward"
    assert stacks["aten::t"] == stacks["aten::linear"]
    assert stacks["aten::add"] == "train.py(30): <module>"


def test_memory_events_give_peak_device_memory(tmp_path):
    k = KinetoTrace()
    k.cpu_op(MAIN, 0, 1000, "aten::empty")
    for t, total in ((100, 1 << 20), (200, 3 << 20), (300, 2 << 20)):
        k.raw(
            '{"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 4242, "tid": 10, '
            f'"ts": {t}.0, "args": {{"Total Allocated": {total}, "Bytes": 1, "Device Type": 1, "Device Id": 0}}}}'
        )
    k.raw(
        '{"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 4242, "tid": 10, '
        '"ts": 400.0, "args": {"Total Allocated": 99999999, "Bytes": 1, "Device Type": 0, "Device Id": -1}}'
    )
    trace = read_kineto_trace(k.write(tmp_path / "mem.json"))
    assert trace.meta["gpu_peak_memory"] == 3 << 20  # device (CUDA) memory only, not host memory


def test_thread_ids_beyond_24_bits_stay_distinct(tmp_path):
    k = KinetoTrace()
    for tid in (10, -247463936, 5_000_000_000):
        k.cpu_op(tid, 0, 1000, "aten::mm", seq=1)
        k.runtime(tid, 100, 10)
    trace = read_kineto_trace(k.write(tmp_path / "tids.json"))
    assert trace.ranges["global_tid"].nunique() == 3 and set(trace.threads["tid"]) == {10, -247463936, 5_000_000_000}
    assert (trace.ranges["global_tid"].to_numpy() >> 24 == 4242).all()


# ---------------------------------------------------------------------------- bad input


def test_malformed_events_are_skipped_with_warnings(tmp_path):
    k = KinetoTrace()
    k.cpu_op(MAIN, 0, 1000, "aten::mm", seq=1)
    k.raw('{"ph": "X", "cat": "cpu_op", "name": "no_dur", "pid": 4242, "tid": 10, "ts": 5.0}')
    k.raw('{"ph": "X", "cat": "cpu_op", "name": "no_ts", "pid": 4242, "tid": 10, "dur": 5.0}')
    k.raw('{"ph": "X", "cat": "cpu_op", "name": "text_ts", "pid": 4242, "tid": 10, "ts": "x", "dur": 1}')
    k.raw('{"ph": "X", "cat": "kernel", "name": "negative", "pid": 0, "tid": 7, "ts": 5.0, "dur": -1.0}')
    k.raw('{"ph": "X", "cat": "mystery_cat", "name": "m", "pid": 4242, "tid": 10, "ts": 5.0, "dur": 1.0}')
    trace = read_kineto_trace(k.write(tmp_path / "bad.json"))
    assert trace.ranges["text"].tolist() == ["aten::mm, seq = 1, op_id = 1"] and len(trace.gpu) == 0
    text = "\n".join(trace.warnings)
    assert "3 events without a numeric ts or dur" in text and "1 events with a negative duration" in text
    assert "unknown categories were ignored: mystery_cat (1)" in text


def test_far_off_timestamps_are_dropped_and_long_captures_kept(tmp_path):
    """Epoch times: 10 ops 8 hours apart (a capture of 3 days) and one at ts 1.0 us (53 years off). The median
    start is the 5th op's (32 h), the median distance to it 24 h: the horizon is 1000 x 24 h, and only the
    damaged op lies beyond it."""
    base = 1_700_000_000_000_000_000
    hour = 3_600 * 10**9
    k = KinetoTrace()
    for i in range(10):
        k.cpu_op(MAIN, base + i * 8 * hour, 1000, "aten::mm", seq=i)
    k.raw('{"ph": "X", "cat": "cpu_op", "name": "aten::zero_", "pid": 4242, "tid": 10, "ts": 1.0, "dur": 2.0}')
    trace = read_kineto_trace(k.write(tmp_path / "long.json"))
    assert trace.ranges["text"].str.startswith("aten::mm").sum() == 10
    assert not trace.ranges["text"].str.startswith("aten::zero_").any()
    assert [w for w in trace.warnings if "dropped" in w] == [
        f"{tmp_path / 'long.json'}: 1 events were dropped: their start or end lies more than 1,000 days from the "
        "trace's median time (a damaged timestamp, e.g. ts = 1.000 us)"
    ]
    assert sorted(trace.ranges["start"].tolist()) == [i * 8 * hour for i in range(10)]  # time zero: the first op


def test_far_off_rule_never_drops_half_the_events(tmp_path):
    k = KinetoTrace()
    k.cpu_op(MAIN, 1_700_000_000_000_000_000, 1000, "aten::mm", seq=1)
    k.raw('{"ph": "X", "cat": "cpu_op", "name": "aten::zero_", "pid": 4242, "tid": 10, "ts": 1.0, "dur": 2.0}')
    trace = read_kineto_trace(k.write(tmp_path / "two.json"))
    assert len(trace.ranges) == 2 and not [w for w in trace.warnings if "dropped" in w]


def test_names_that_are_numbers_or_escaped_read_as_texts(tmp_path):
    k = KinetoTrace()
    k.raw('{"ph": "X", "cat": "cpu_op", "name": 7, "pid": 4242, "tid": 10, "ts": 1.0, "dur": 1.0}')
    k.raw('{"ph": "X", "cat": "cpu_op", "name": "aten::\\u006dm", "pid": 4242, "tid": 10, "ts": 3.0, "dur": 1.0}')
    k.raw('{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 4242, "tid": 10, "ts": 5.0, "dur": 1.0}')
    k.raw('{"ph": "X", "cat": "cpu_op", "name": null, "pid": 4242, "tid": 10, "ts": 7.0, "dur": 1.0}')
    trace = read_kineto_trace(k.write(tmp_path / "names.json"))
    assert trace.ranges["text"].tolist() == [
        "7, op_id = 0",
        "aten::mm, op_id = 1",
        "aten::mm, op_id = 2",
        ", op_id = 3",
    ]


@pytest.mark.parametrize(
    "content, message",
    [
        (b"", "empty file"),
        (b'{"traceEvents": [{"ph": "X", ', "not valid JSON"),
        (b'{"traceEvents": [{"ph": "X"}, {"ph": "X", "name": x}, {"ph": "X"}], "n": 1}', "not valid JSON"),
        (b'{"traceEvents": [{"ph": "X"}, {"ph": "X"}], "n": 1, }', "not valid JSON"),
        (b'{"traceEvents": {"a": 1}}', "traceEvents is not an array"),
        (b'{"traceEvents": []}', "holds no events"),
        (b'{"traceEvents": [{"ph": "X", "args": [1, 2]}]}', "unexpected event content"),
        (
            b'{"traceEvents": [{"ph": "X", "name": ["aten::mm"]}]}',
            "unexpected event content (an event name is an array",
        ),
        (b'{"schemaVersion": 1}', "not an SQLite database (Nsight Systems export, DLProf database) nor a Kineto trace"),
        (b"[1, 2, 3]", "not an SQLite database (Nsight Systems export, DLProf database) nor a Kineto trace"),
        (b"garbage", "not an SQLite database (Nsight Systems export, DLProf database) nor a Kineto trace"),
    ],
)
def test_bad_files_give_one_line_errors(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(DLProfError) as err:
        ingest.read_trace(path)
    text = str(err.value)
    assert message in text and str(path) in text and "\n" not in text


def test_truncated_and_damaged_gzip(tmp_path):
    data = gzip.compress(training_trace().text().encode())
    truncated = tmp_path / "t.json.gz"
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(DLProfError, match="damaged or truncated gzip"):
        ingest.read_trace(truncated)
    damaged = tmp_path / "d.json.gz"
    damaged.write_bytes(data[:10] + b"\x00" * 50 + data[60:])
    with pytest.raises(DLProfError, match="damaged or truncated gzip|not an SQLite database"):
        ingest.read_trace(damaged)


def test_gzip_beyond_the_trusted_ratio_and_several_members(tmp_path):
    """A text compressed far more than JSON usually is (the buffer grows as it inflates), and a file of
    several gzip members (concatenated .gz files), read whole."""
    from dlprof_profiler.ingest import kineto_decode

    text = training_trace(steps=1).text().encode()
    spaced = text.replace(b"[", b"[" + b" " * 5_000_000, 1)
    path = tmp_path / "spaced.json.gz"
    path.write_bytes(gzip.compress(spaced))
    assert len(spaced) > 64 * path.stat().st_size
    assert bytes(kineto_decode.read_bytes(path)) == spaced
    half = len(text) // 2
    members = tmp_path / "members.json.gz"
    members.write_bytes(gzip.compress(text[:half]) + gzip.compress(text[half:]))
    assert bytes(kineto_decode.read_bytes(members)) == text
    assert len(read_kineto_trace(members).gpu) == len(read_kineto_trace(path).gpu) == 6


def test_detection_is_by_content_not_name(tmp_path):
    k = training_trace(steps=1)
    plain = k.write(tmp_path / "capture.sqlite")  # JSON under a misleading name
    zipped = k.write(tmp_path / "capture.bin", gz=True)
    assert ingest.trace_format(plain) == ingest.KINETO and ingest.trace_format(zipped) == ingest.KINETO
    assert len(ingest.read_trace(zipped).gpu) == len(ingest.read_trace(plain).gpu) == 6


def test_event_split_survives_separators_inside_strings(tmp_path):
    """The decoder cuts the event array between events at '}, {'; the same text inside a name must not
    be taken for a cut."""
    from dlprof_profiler.ingest import kineto_decode

    k = KinetoTrace()
    for i in range(300):
        k.cpu_op(MAIN, i * 1000, 500, "weird}, {name" if i % 7 == 0 else "aten::mm", seq=i)
    path = k.write(tmp_path / "w.json")
    decoded = kineto_decode.decode(path, chunk_bytes=512)
    assert decoded.columns.n == 300
    names = [decoded.columns.strings[c] for c in decoded.columns.name]
    assert names.count("weird}, {name") == 43


def _decode_counting_validations(path, monkeypatch):
    from dlprof_profiler.ingest import kineto_decode

    calls = []
    real = kineto_decode._validated_outline
    monkeypatch.setattr(kineto_decode, "_validated_outline", lambda *a: calls.append(1) or real(*a))
    return kineto_decode.decode(path, chunk_bytes=1), bool(calls)  # every "}, {" is a cut


def test_usual_layout_is_read_in_one_pass(tmp_path, monkeypatch):
    path = training_trace().write(tmp_path / "t.json")
    decoded, validated = _decode_counting_validations(path, monkeypatch)
    want = json.loads(path.read_text())
    assert not validated and decoded.columns.n == len(want["traceEvents"])
    assert [decoded.columns.strings[c] for c in decoded.columns.name] == [e.get("name") for e in want["traceEvents"]]
    assert decoded.meta == {k: v for k, v in want.items() if k != "traceEvents"}


EVENT = '{"ph": "X", "cat": "cpu_op", "name": "%s", "pid": 1, "tid": 2, "ts": %d.5, "dur": 1.25}'
EVENTS = "[" + ", ".join(EVENT % (name, i) for i, name in enumerate(["a", "b}, {c", "d"])) + "]"


@pytest.mark.parametrize(
    "text, one_pass",
    [
        ('{"traceEvents": %s, "deviceProperties": [{"id": 0}, {"id": 1}]}' % EVENTS, False),  # "}, {" after it
        ('{"x": {"traceEvents": [{"a": 1}]}, "traceEvents": %s}' % EVENTS, False),  # a nested key first
        ('{"traceEvents": [%s], "traceEvents": %s}' % (EVENT % ("z", 0), EVENTS), False),  # the last key counts
        ('{"traceEvents": %s, "traceName": "x}, {y"}' % EVENTS, True),  # a "}, {" in a string after it
        ('{"traceEvents": %s, "INFO": ["a] b", "c]"], "n": 1}' % EVENTS, True),
        ('\n {"traceEvents" :\n[ %s ] }\n' % EVENTS[1:-1], True),
        ('{"traceEvents": []}', True),
    ],
)
def test_other_layouts_read_like_json_load(tmp_path, monkeypatch, text, one_pass):
    """Layouts the one-pass reading does not expect go through the validating path; either way the
    events and the metadata are those json.load sees."""
    path = tmp_path / "layout.json"
    path.write_text(text)
    decoded, validated = _decode_counting_validations(path, monkeypatch)
    want = json.loads(text)
    assert validated == (not one_pass)
    assert [decoded.columns.strings[c] for c in decoded.columns.name] == [e["name"] for e in want["traceEvents"]]
    assert decoded.columns.ts.tolist() == [ns(str(e["ts"])) for e in want["traceEvents"]]
    assert decoded.meta == {k: v for k, v in want.items() if k != "traceEvents"}


def test_decimal_parser_is_exact():
    import msgspec

    from dlprof_profiler.ingest.kineto_decode import decimal_ns

    texts = [
        "1712195495519695.8",
        "4.928",
        "0",
        "-12.5",
        "1e-05",
        "1.5E+3",
        "0.0005",
        "0.0004",
        "-0.0005",
        "4203669604595.407",
        "0.30000000000000004",
        "7E2",
        "2.5e-4",
        "1.23456789012345678901234",
    ]
    values, ok = decimal_ns([msgspec.Raw(t.encode()) for t in texts])
    assert ok.all() and values.tolist() == [ns(t) for t in texts]
    values, ok = decimal_ns(
        [msgspec.Raw(t) for t in (b"null", b'"12"', b"", b"true", b"1e400", b"[1]", b"99999999999999999.9")]
    )
    assert not ok.any()


def test_plain_decimals_take_the_arrow_path_and_stay_exact(monkeypatch):
    """Kineto's usual numbers (integers, up to three decimals) are read by Arrow's decimal cast; the
    character parser is not called for them. A value needing rounding or an exponent sends the whole
    column to the character parser; both give the Decimal result."""
    import msgspec

    from dlprof_profiler.ingest import kineto_decode

    plain = [
        "1712195495519695.800",
        "4.928",
        "0",
        "-12.5",
        "1623142623460016",
        "9223372036854775.807",
        "9223372036854775.808",
        "-9223372036854775.807",
        "99999999999999999999999",
        "",
        "0.07",
        "-0",
    ]
    called = []
    real = kineto_decode._decimal_ns_by_characters
    monkeypatch.setattr(kineto_decode, "_decimal_ns_by_characters", lambda *a: called.append(1) or real(*a))
    values, ok = kineto_decode.decimal_ns([msgspec.Raw(t.encode()) for t in plain])
    assert not called
    want = [ns(t) if t else None for t in plain]
    fits = [w is not None and -(2**63) < w < 2**63 for w in want]
    assert ok.tolist() == fits == [True] * 6 + [False, True, False, False, True, True]
    assert [v for v, f in zip(values.tolist(), fits) if f] == [w for w, f in zip(want, fits) if f]
    for odd in ("0.0005", "1e-05", "null", '"12"'):
        texts = plain[:5] + [odd]
        values, ok = kineto_decode.decimal_ns([msgspec.Raw(t.encode()) for t in texts])
        assert called, odd
        called.clear()
        assert values[:5].tolist() == [ns(t) for t in plain[:5]] and ok[:5].all()
        assert (bool(ok[5]), int(values[5])) == ((True, ns(odd)) if odd[0].isdigit() else (False, 0))


def test_integer_columns_from_mixed_json_scalars():
    """pid/tid/args integers: plain ints (the fast path), ints mixed with the profiler's text ids, numeric
    text (2021 thread ids), floats (truncated), booleans, nulls, and integers past int64."""
    from dlprof_profiler.ingest.kineto_decode import to_int

    assert to_int([3, 4, 5]).tolist() == [3, 4, 5]
    mixed = [25738, "Spans", "12", None, 2.7, True, -4, 2**62 + 1]
    assert to_int(mixed, default=-9).tolist() == [25738, -9, 12, -9, 2, 1, -4, 2**62 + 1]
    assert to_int(["25738", "stream 7", "3"]).tolist() == [25738, -1, 3]
    assert to_int(["a", 1, 2**70, 3]).tolist() == [-1, 1, -1, 3]


AMD_GEMM = (
    "Cijk_Ailk_Bjlk_SB_Bias_AS_SAV_UserArgs_MT64x16x16_MI16x16x1_SN_LDSB0_AFC1_AFEM1_AFEM1_ASEM1_CLR1_CADS0_EPS0_GRVWA1_"
    "GRVWB1_GSUAMB_ISA90a_IU1_K1_LBSPPA0_LBSPPB0_LBSPPM0_LPA0_LPB0_LPM0_LRVW1_LWPMn1_MIAV0_MIWT1_1_MO40_NTn1_NTA0_NTB0_"
    "NTC0_NTD0_NTM0_NEPBS2_NLCA1_NLCB1_ONLL1_PGR2_PLR1_PKA1_SIA3_SS1_SPO1_SRVW0_SSO0_SVW1_TLDS0_USFGROn1_VSn1_VWA1_VWB1_"
    "WSGRA0_WSGRB0_WS64_WG64_4_1"
)
# Real demangled names (Kineto's demangler) from the traces in tests/data/kineto, with the short name nsys gives:
# the kernel function's own name, whatever its return type, scopes, template arguments and parameters hold.
REAL_KERNEL_NAMES = [
    (  # a return type with template arguments and a parenthesised expression (issue 21.7)
        "std::enable_if<!(false), void>::type internal::gemvx::kernel<int, int, float, float, float, float, false, "
        "true, false, false, 7, cublasGemvParams<cublasGemvTensorStridedBatched<float const>, "
        "cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float>, float> >("
        "cublasGemvParams<cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float const>, "
        "cublasGemvTensorStridedBatched<float>, float>)",
        "kernel",
    ),
    (
        "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, at::detail::Array<char*, 1> "
        ">(int, at::native::FillFunctor<float>, at::detail::Array<char*, 1>)",
        "vectorized_elementwise_kernel",
    ),
    (
        "void at::native::(anonymous namespace)::CatArrayBatchedCopy<float, unsigned int, 2, 128, 1>(float*, "
        "at::native::(anonymous namespace)::CatArrInputTensorMetadata<float, unsigned int, 128, 1>, "
        "at::native::(anonymous namespace)::TensorSizeStride<unsigned int, 4u>, int, unsigned int)",
        "CatArrayBatchedCopy",
    ),
    ("volta_sgemm_128x32_nt", "volta_sgemm_128x32_nt"),
    (
        "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_16x6_nn_align4>"
        "(cutlass_80_tensorop_s1688gemm_64x64_16x6_nn_align4::Params)",
        "Kernel",
    ),
    (
        "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)",
        "ncclKernel_AllReduce_RING_LL_Sum_float",
    ),
    ("cask_cudnn::computeOffsetsKernel(cask_cudnn::ComputeOffsetsParams)", "computeOffsetsKernel"),
    (  # operator() and lambdas inside the template arguments
        "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t<float, "
        "at::native::sum_functor<float, float, float>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, "
        "unsigned int, float, 4> >(at::native::ReduceOp<float, at::native::func_wrapper_t<float, "
        "at::native::sum_functor<float, float, float>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, "
        "unsigned int, float, 4>)",
        "reduce_kernel",
    ),
    (  # enumerators cast in the template arguments: (cub::BlockLoadAlgorithm)3
        "void cub::DeviceScanKernel<cub::AgentScanPolicy<128, 15, int, (cub::BlockLoadAlgorithm)3, "
        "(cub::CacheLoadModifier)0, (cub::BlockStoreAlgorithm)3, (cub::BlockScanAlgorithm)2, "
        "cub::MemBoundScaling<128, 15, int> >, int*, int*, cub::ScanTileState<int, true>, cub::Sum, cub::NullType, "
        "int>(int*, int*, cub::ScanTileState<int, true>, int, cub::Sum, cub::NullType, int)",
        "DeviceScanKernel",
    ),
    (
        "void (anonymous namespace)::softmax_warp_forward<float, float, float, 10, true>(float*, float const*, int, "
        "int, int)",
        "softmax_warp_forward",
    ),
    (AMD_GEMM, AMD_GEMM),  # ROCm: not demangled
]
# Written for this test: what a demangled name can also hold
OTHER_KERNEL_NAMES = [
    ("unsigned int const* ns::inner::k<3>(int) const", "k"),  # a qualified return type, a qualifier after
    ("void ns::Functor::operator()<float>(float*)", "operator()"),
    ("void ns::operator<< <int>(int*)", "operator<<"),
    ("void ns::Cmp<(N > 2)>::run(int)", "run"),  # a comparison inside the template arguments
    (
        "<unnamed>::nvfuser_pointwise_f0_c1_r0_g0(<unnamed>::Tensor<float, (int)2, (int)2>)",
        "nvfuser_pointwise_f0_c1_r0_g0",
    ),
    ("void ns::outer(int)::[lambda(int) (instance 1)]::operator ()(int) const", "operator ()"),
]


@pytest.mark.parametrize("name, short", REAL_KERNEL_NAMES + OTHER_KERNEL_NAMES)
def test_short_kernel_names(name, short):
    assert short_kernel_name(name) == short


@pytest.mark.slow
def test_real_kernel_names_of_the_table_are_in_the_fixtures(fixture_copies):
    names = set()
    for path in fixture_copies.glob("*.json*"):
        names |= {e["name"] for e in load_json(path)["traceEvents"] if str(e.get("cat", "")).lower() == "kernel"}
    assert {name for name, _ in REAL_KERNEL_NAMES} <= names


def test_short_kernel_names_agree_with_nsys():
    """Every kernel of the nsys exports in tests/data: nsys' own shortName of its demangledName."""
    import sqlite3

    pairs = set()
    for path in sorted(data.NSYS.glob("*.sqlite")):
        con = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro&immutable=1", uri=True)
        try:
            if con.execute("SELECT 1 FROM sqlite_master WHERE name = 'CUPTI_ACTIVITY_KIND_KERNEL'").fetchone():
                pairs |= set(
                    con.execute(
                        "SELECT DISTINCT s.value, d.value FROM CUPTI_ACTIVITY_KIND_KERNEL k "
                        "JOIN StringIds s ON s.id = k.shortName JOIN StringIds d ON d.id = k.demangledName"
                    ).fetchall()
                )
        finally:
            con.close()
    assert len(pairs) >= 50
    assert [(short, demangled) for short, demangled in pairs if short_kernel_name(demangled) != short] == []


# ---------------------------------------------------------------------------- the command line


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_cli_writes_every_report_and_the_database(fixture_copies, tmp_path, name):
    """`dlprof --database=TRACE` writes all reports and the database; the database's GPU activities
    match the direct sums over the JSON, and the database re-aggregates with another key node."""
    import sqlite3

    from tests.profiles import run_dlprof

    path = fixture_copies / name
    out = tmp_path / "out"
    run_dlprof(f"--database={path}", f"--output_path={out}", "--reports=all", "--formats=csv,json", "-v", "quiet")
    for report in (
        "summary",
        "detailed",
        "iteration",
        "kernel",
        "tensor_core",
        "op_type",
        "group_op",
        "expert_systems",
    ):
        assert (out / f"dlprof_{report}.csv").exists() and (out / f"dlprof_{report}.json").exists(), report
    assert list((out / "dlprof").glob("events.out.tfevents.*"))
    db = out / "dlprof_dldb.sqlite"
    con = sqlite3.connect(db)
    try:
        rows = con.execute(
            'SELECT kind, long_name, device_id, count(*), sum("end" - start) '
            "FROM read_only_gpu_activities GROUP BY 1, 2, 3"
        ).fetchall()
        profile = dict(con.execute("SELECT name, value FROM profile_info").fetchall())
    finally:
        con.close()
    want = expected_sums(load_json(path))
    assert {(k, n, d): (c, t) for k, n, d, c, t in rows} == want["gpu"]
    assert profile["source_kind"] == "kineto_json"
    # the reports: every kernel launch of the iterations (all are aggregated: the steps) in the iteration
    # report, the summary's GPU times and iteration count
    in_steps = expected_steps(load_json(path))
    launches = defaultdict(lambda: [0, 0])
    lines = (out / "dlprof_iteration.csv").read_text().splitlines()
    assert lines[0] == "Iteration Report"
    for row in csv.DictReader(lines[1:]):
        launches[(0, row["Long Kernel Name"], int(row["Device ID"]))][0] += 1
        launches[(0, row["Long Kernel Name"], int(row["Device ID"]))][1] += int(row["GPU Duration (ns)"])
    assert {k: tuple(v) for k, v in launches.items()} == {k: v for k, v in in_steps["gpu"].items() if k[0] == 0}
    summary = {}
    for row in csv.reader((out / "dlprof_summary.csv").read_text().splitlines()):
        summary.setdefault(row[0] if row else "", row[1:])
    assert int(summary["All kernels"][0]) == in_steps["kernel_time"] + in_steps["memory_time"]
    assert int(summary["Memory"][0]) == in_steps["memory_time"]
    assert want["steps"] > 0 and int(summary["Total Iterations"][0]) == len(in_steps["spans"])
    again = tmp_path / "again"
    run_dlprof(f"--database={db}", f"--output_path={again}", "--key_node=Optimizer.step", "-v", "quiet")
    assert (again / "dlprof_summary.csv").exists()


@pytest.mark.slow
def test_other_devices_map_like_cuda(tmp_path):
    """MTIA (and other privateuse devices) write their runtime calls and device activities under their own
    categories; they map to API calls and kernels like CUDA's."""
    k = KinetoTrace()
    k.cpu_op(MAIN, 0, 10_000, "aten::mm", seq=1)
    k.raw(
        '{"ph": "X", "cat": "mtia_runtime", "name": "mtiaLaunchKernel", "pid": 4242, "tid": 10, '
        '"ts": 1.000, "dur": 2.000, "args": {"correlation": 77}}'
    )
    k.raw(
        '{"ph": "X", "cat": "mtia_ccp_events", "name": "mm_kernel", "pid": 1, "tid": 3, '
        '"ts": 4.000, "dur": 3.500, "args": {"correlation": 77, "device": 1, "stream": 3}}'
    )
    k.raw(
        '{"ph": "X", "cat": "privateuse1_runtime", "name": "npuMalloc", "pid": 4242, "tid": 10, '
        '"ts": 8.000, "dur": 1.000, "args": {"correlation": 78}}'
    )
    a = analyze(k.write(tmp_path / "mtia.json"))
    assert a.trace.api_calls["name"].astype(str).tolist() == ["mtiaLaunchKernel", "npuMalloc"]
    gpu = a.trace.gpu
    assert gpu["name"].astype(str).tolist() == ["mm_kernel"] and gpu["device_id"].tolist() == [1]
    assert a.op("/aten::mm", "fprop")["gpu_total"] == 3500


def _run_measured(args: list[str], tmp_path: Path) -> tuple[subprocess.CompletedProcess, float]:
    """The CLI in a child process: its result and its own peak memory (GB, from the kernel's accounting)."""
    with open(tmp_path / "stdout.txt", "w+") as out, open(tmp_path / "stderr.txt", "w+") as err:
        proc = subprocess.Popen([sys.executable, "-m", "dlprof_profiler", *args], stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        result = subprocess.CompletedProcess(proc.args, proc.returncode, out.read(), err.read())
    return result, usage.ru_maxrss / 2**20


def _bad_inputs(tmp_path: Path) -> dict:
    good = training_trace(steps=1).text().encode()
    packed = gzip.compress(good)
    files = {
        "truncated gzip": (
            "t.json.gz",
            packed[: len(packed) // 2] + b"\xff\xff\xff\xff",
            "damaged or truncated gzip data",
        ),
        "invalid JSON": ("i.json", good.replace(b'"ph": "X"', b'"ph": X', 1), "not valid JSON"),
        "truncated JSON": ("j.json", good[: len(good) // 2], "not valid JSON"),
        "not a trace": ("n.json", b'{"schemaVersion": 1, "events": []}', "nor a Kineto trace"),
        "not an array": ("a.json", b'{"traceEvents": {"ph": "X"}}', "traceEvents is not an array"),
        "event not an object": ("o.json", b'{"traceEvents": [{"ph": "X"}, 7]}', "unexpected event content"),
        "no usable time": (
            "u.json",
            b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "ts": 1}]}',
            "no event has a usable time",
        ),
        "no events": ("e.json", b'{"traceEvents": []}', "the trace holds no events"),
    }
    return {case: (tmp_path / name, content, message) for case, (name, content, message) in files.items()}


@pytest.mark.slow
@pytest.mark.parametrize(
    "case",
    [
        "truncated gzip",
        "invalid JSON",
        "truncated JSON",
        "not a trace",
        "not an array",
        "event not an object",
        "no usable time",
        "no events",
    ],
)
def test_cli_bad_input_one_line_no_output(tmp_path, case):
    """Through the command line: one line on stderr naming the file and the problem, a non-zero exit
    status, no output folder; a truncated gzip does not allocate the size its damaged trailer claims."""
    path, content, message = _bad_inputs(tmp_path)[case]
    path.write_bytes(content)
    out = tmp_path / "out"
    proc, peak_gb = _run_measured([f"--database={path}", f"--output_path={out}", "--reports=all"], tmp_path)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode != 0 and len(lines) == 1, proc.stderr
    assert message in lines[0] and str(path) in lines[0]
    assert not out.exists()
    assert peak_gb < 1.0


@pytest.mark.slow
def test_cli_bad_events_warn_and_the_rest_is_counted(tmp_path):
    """Events without ts or dur, with a negative duration or of an unknown category: warnings that count
    them, exit status 0, and every figure from the other events only."""
    k = training_trace(steps=1)
    bad = [
        '{"ph": "X", "cat": "kernel", "name": "no_dur", "pid": 0, "tid": 7, "ts": 1000000.5}',
        '{"ph": "X", "cat": "kernel", "name": "no_ts", "pid": 0, "tid": 7, "dur": 3.0}',
        '{"ph": "X", "cat": "kernel", "name": "text_dur", "pid": 0, "tid": 7, "ts": 1000000.5, "dur": "3"}',
        '{"ph": "X", "cat": "kernel", "name": "negative", "pid": 0, "tid": 7, "ts": 1000000.5, "dur": -2.5}',
        '{"ph": "X", "cat": "mystery_device", "name": "m", "pid": 0, "tid": 7, "ts": 1000000.5, "dur": 9.0}',
        '{"ph": "X", "cat": "mystery_device", "name": "m", "pid": 0, "tid": 7, "ts": 1000001.5, "dur": 9.0}',
    ]
    for text in bad:
        k.raw(text)
    path = k.write(tmp_path / "bad_events.json")
    out = tmp_path / "out"
    proc = run_dlprof_cli(f"--database={path}", f"--output_path={out}", "--reports=summary")
    assert proc.returncode == 0, proc.stderr
    assert "3 events without a numeric ts or dur were skipped" in proc.stderr
    assert "1 events with a negative duration were skipped" in proc.stderr
    assert "events of unknown categories were ignored: mystery_device (2)" in proc.stderr
    good = json.loads(training_trace(steps=1).text())["traceEvents"]
    kernels = sum(ns(str(e["dur"])) for e in good if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
    summary = {row[0]: row[1:] for row in csv.reader((out / "dlprof_summary.csv").read_text().splitlines()) if row}
    assert int(summary["All kernels"][0]) == kernels == 8000 + 2000 + 2000 + 5000 + 2000 + 150


@pytest.mark.slow
def test_cli_reads_the_real_trace_with_an_unescaped_name(tmp_path):
    """PyTorch 2.13 wrote one event name with unescaped quotes (issue 21.2): the run succeeds, says it once, and
    the ranges in the database are those of the JSON repaired independently (its name lines re-escaped)."""
    import sqlite3

    from tests.test_kineto_repair import independently_repaired

    path = data.KINETO_MALFORMED / "pytorch2.13_cpu_unescaped_name.pt.trace.json.gz"
    out = tmp_path / "out"
    proc = run_dlprof_cli(f"--database={path}", f"--output_path={out}", "--reports=summary", "-v", "minimal")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert f"{path}: 1 events written as invalid JSON were repaired and read (1 with unescaped quotes)" in proc.stderr
    doc = json.loads(independently_repaired(gzip.decompress(path.read_bytes()).decode()), parse_float=Decimal)
    ranges = [
        e
        for e in doc["traceEvents"]
        if e.get("ph") == "X"
        and (
            e["cat"] in ("cpu_op", "user_annotation")
            or (e["cat"] == "python_function" and e["name"].startswith("nn.Module: "))
        )
    ]
    con = with_raw_ranges(sqlite3.connect(out / "dlprof_dldb.sqlite"))
    try:
        count, total = con.execute("SELECT count(*), sum(duration) FROM raw_ranges").fetchone()
    finally:
        con.close()
    assert (count, total) == (len(ranges), sum(ns(e["dur"]) for e in ranges)) == (3255, 19_148_360_362)
    assert sum(1 for e in ranges if re.fullmatch(r"ProfilerStep#\d+", e["name"])) == 11


def run_dlprof_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dlprof_profiler", *args], capture_output=True, text=True, timeout=600)


def test_backward_of_in_place_ops_on_views_and_accumulate_grad_link_to_forward_ops(tmp_path):
    """What PyTorch records for `flat[:, :8].relu_()` then `fc(flat)` and their backward (sequence numbers
    as a real CPU trace has them): the forward ops relu_ (seq 6) and linear > addmm (seq 10); backward:
    AddmmBackward0 (10), AccumulateGrad (no seq, right after the node that produced the parameter's
    gradient), AsStridedBackward0 (11: made when linear read the view; no forward op has 11), CopySlices (7:
    made by the in-place op right after its own node; it runs ReluBackward0, seq 6, inside it), AccumulateGrad.
    Every node takes a forward op's name: no AccumulateGrad or CopySlices op, relu_ and linear one backward
    call each, holding all their nodes' time (DESIGN.md, Kineto input: Direction)."""
    k = KinetoTrace()
    k.metadata({MAIN: "python", GRAD: "pt_autograd_0"})
    k.span(T0 - 1000, 200_000)
    k.cpu_op(MAIN, T0, 1000, "aten::relu_", seq=6)
    k.cpu_op(MAIN, T0 + 2000, 3000, "aten::linear", seq=9)
    k.cpu_op(MAIN, T0 + 2500, 2000, "aten::addmm", seq=10)
    evaluate = "autograd::engine::evaluate_function: "
    b = T0 + 10_000
    k.cpu_op(GRAD, b, 1000, evaluate + "AddmmBackward0", seq=10, fwd_tid=1)
    k.cpu_op(GRAD, b + 100, 800, "AddmmBackward0", seq=10, fwd_tid=1)
    k.cpu_op(GRAD, b + 2000, 300, evaluate + "torch::autograd::AccumulateGrad")
    k.cpu_op(GRAD, b + 2050, 200, "torch::autograd::AccumulateGrad")
    k.cpu_op(GRAD, b + 3000, 500, evaluate + "AsStridedBackward0", seq=11, fwd_tid=1)
    k.cpu_op(GRAD, b + 3100, 300, "AsStridedBackward0", seq=11, fwd_tid=1)
    k.cpu_op(GRAD, b + 4000, 2000, evaluate + "torch::autograd::CopySlices", seq=7, fwd_tid=1)
    k.cpu_op(GRAD, b + 4100, 1800, "torch::autograd::CopySlices", seq=7, fwd_tid=1)
    k.cpu_op(GRAD, b + 4500, 500, "ReluBackward0", seq=6, fwd_tid=1)
    k.cpu_op(GRAD, b + 7000, 400, evaluate + "torch::autograd::AccumulateGrad")
    k.cpu_op(GRAD, b + 7050, 300, "torch::autograd::AccumulateGrad")
    a = analyze(k.write(tmp_path / "views.pt.trace.json"))
    ops = a.ops()
    assert set(zip(ops["name"], ops["direction"])) == {
        ("/aten::relu_", "fprop"),
        ("/aten::relu_", "bprop"),
        ("/aten::linear", "fprop"),
        ("/aten::linear", "bprop"),
    }
    relu_back = a.op("/aten::relu_", "bprop")  # CopySlices (with ReluBackward0) + the AccumulateGrad after it
    assert relu_back["calls"] == 1 and relu_back["cpu_total"] == 2000 + 400
    linear_back = a.op("/aten::linear", "bprop")  # AddmmBackward0 + its AccumulateGrad + AsStridedBackward0
    assert linear_back["calls"] == 1 and linear_back["cpu_total"] == 1000 + 300 + 500


def test_a_trace_the_memory_cannot_analyse_is_refused_before_it_is_decoded(tmp_path, monkeypatch):
    plain = tmp_path / "trace.json"
    plain.write_bytes(gzip.decompress((data.KINETO / "pytorch_amd_mi250.json.gz").read_bytes()))
    need = kineto.ANALYSIS_BASE_BYTES + int(kineto.ANALYSIS_BYTES_PER_TEXT_BYTE * plain.stat().st_size)
    assert kineto.memory_to_analyse(plain.stat().st_size) == need
    monkeypatch.setattr(kineto, "available_memory", lambda: need - 1)
    decoded = []
    monkeypatch.setattr(kineto.kd, "decode", lambda path: decoded.append(path))
    with pytest.raises(DLProfError) as refused:
        read_kineto_trace(plain)
    assert str(refused.value).startswith(f"{plain}: analysing this trace needs about {need / 2**30:.1f} GB of memory")
    assert "\n" not in str(refused.value) and decoded == []
    out = tmp_path / "out"
    assert main([f"--database={plain}", f"--output_path={out}", "-v", "quiet"]) != 0
    assert not out.exists() or not any(out.iterdir())
    # a gzipped trace is left to the decoder's own limit on the inflated text; with room, the plain one is read
    monkeypatch.undo()
    monkeypatch.setattr(kineto, "available_memory", lambda: need - 1)
    assert len(read_kineto_trace(data.KINETO / "pytorch_amd_mi250.json.gz").gpu) > 0
    monkeypatch.setattr(kineto, "available_memory", lambda: need)
    assert len(read_kineto_trace(plain).gpu) > 0
