"""Expert systems: for every detector a generated profile that triggers it and one that does not, with the
problem text checked; the finding contract; unknown facts reported at detailed verbosity."""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import pytest

from dlprof_profiler import log
from dlprof_profiler import experts as expert_systems
from dlprof_profiler.experts import DETECTORS, render_command
from tests.analysis import analyze
from tests.nsys_builder import NsysExport

MS, US = 1_000_000, 1_000
ITER = 10 * MS
LOADER = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
TC_CONV = "volta_fp16_s884cudnn_fp16_128x128_ldg8_relu_f2f_exp_small_nhwc_tn_v1"
TC_WGRAD = "volta_fp16_s884cudnn_fp16_256x64_ldg8_dgrad_f2f_exp_small_nhwc_tn_v1"
TC_GEMM = "sm80_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize128x128x32_stage4_warpsize2x2x1_tensor16x8x16"
FP32_CONV = "volta_scudnn_128x64_relu_interior_nn_v1"
FP32_WGRAD = "volta_scudnn_128x32_relu_small_nn_v1"
FP32_GEMM = "volta_sgemm_128x64_nn"
PLAIN_GEMM = "gemmSN_NN_kernel"  # neither a Tensor Core nor a 16-bit kernel name
ADD = "multi_tensor_apply_kernel"
ELEMENTWISE = "vectorized_elementwise_kernel"
A100_MEMORY = 42505273344


def loop_profile(
    path: Path,
    *,
    n_iter: int = 4,
    start: int = 0,
    span: int = ITER,
    config: dict | None = None,
    markers: str = "emit_nvtx",
    conv_kernel: str = TC_CONV,
    linear_kernel: str = TC_GEMM,
    bwd_kernels: tuple = (TC_WGRAD, TC_GEMM),
    dtype: str = "float16",
    linear_shapes: tuple = ((8, 256), (64, 256)),
    memcpy_src: int = 1,
    memcpy_api: str = "cudaMemcpyAsync_v3020",
    stall: int = 0,
    stall_label: str = LOADER,
    stall_apis: tuple = (),
    stall_io: tuple = (),
    sync: int = 0,
    elementwise: int = 0,
    elementwise_kernel: str = ELEMENTWISE,
    devices: tuple = (0,),
    scale: dict | None = None,
    idle_gpus: tuple = (),
    blocking_launches: bool = False,
    backward_markers: bool = True,
    outer: str | None = None,
    stall_pieces: int = 1,
    setup: bool = True,
) -> Path:
    """A PyTorch training loop, one process per device in `devices`, n_iter iterations of `span` + `stall` ns
    from `start`; every iteration but the last ends with an `Optimizer.step#SGD.step` range (the default key
    node), so all n_iter iteration intervals are equally long (iteration 0 is longer by `start`: with `setup`,
    a `model setup` range [0, start) on each main thread is the start-up the capture saw; without it, the
    capture just started late and iteration 0 starts at its first event).

    Per iteration (T = start + i x (span + stall), S = T + stall; main thread unless said):
      [T, S+span)             `outer` range around the whole iteration (when given)
      [T, T+stall)            `stall_label` range (or `stall_pieces` back-to-back ones), with `stall_apis`
                              (name, duration) and `stall_io` calls in it
      [S, S+300us)            enumerate(DataLoader) range
      [S+300us, S+500us)      aten::to -> memcpy_api [S+350us, S+400us) -> HtoD memcpy 100 us (src kind memcpy_src)
      [S+500us, S+700us)      aten::conv2d -> conv_kernel 4 ms
      [S+700us, S+900us)      aten::linear -> linear_kernel 2 ms
      `elementwise` aten::relu ranges of 10 us after S+900us, each -> elementwise_kernel 100 us
      autograd thread: ConvolutionBackward0 -> bwd_kernels[0] 2 ms, AddmmBackward0 -> bwd_kernels[1] 0.5 ms
                              (the two ranges left out when not backward_markers)
      [S+span-300us, S+span-100us) Optimizer.step#SGD.step with aten::add_ -> ADD 100 us (not in the last)
      `sync` ns of cudaStreamSynchronize at S+span-1ms (when sync > 0)
    Kernels run back to back (10 us apart) from S+600us; their durations are multiplied by scale[device]."""
    exp = NsysExport(schema="2022.4")
    for dev in tuple(devices) + tuple(idle_gpus):
        exp.add_gpu(device_id=dev, name="NVIDIA A100-SXM4-40GB", total_memory=A100_MEMORY)
    op_id = [1]
    for dev in devices:
        pid = 100 + 10 * dev
        main = exp.add_thread(pid=pid, tid=pid, name="python", process_name="python")
        grad = exp.add_thread(pid=pid, tid=pid + 1, name="pt_autograd_0", process_name="python")
        factor = (scale or {}).get(dev, 1.0)
        if setup and start > 0:
            exp.push_pop(main, 0, start, "model setup")
        if config is not None:
            exp.push_pop(main, start, start, json.dumps({"model_config": config}))

        def op(tid, a, b, label, seq=None, args=None):
            if markers == "dlprof" and args is not None:
                text = repr({"mod": "torch.nn.functional", "op": label.replace("aten::", ""), "args": args})
            else:
                text = label + (f", seq = {seq}" if seq is not None else "") + f", op_id = {op_id[0]}"
            op_id[0] += 1
            exp.push_pop(tid, a, b, text)

        def tensor(shape):
            return {"name": "", "type": "tensor", "shape": tuple(shape), "dtype": dtype}

        for i in range(n_iter):
            t = start + i * (span + stall)
            s = t + stall
            seq = 10 * i + 1
            if outer:
                exp.push_pop(main, t, s + span, outer)
            if stall:
                piece = stall // stall_pieces
                for k in range(stall_pieces):
                    exp.push_pop(main, t + k * piece, t + (k + 1) * piece, stall_label)
                cursor = t + 10 * US
                for name, dur in stall_apis:
                    exp.runtime(main, cursor, cursor + dur, name=name)
                    cursor += dur + 10 * US
                for name, dur in stall_io:
                    exp.osrt(main, cursor, cursor + dur, name=name)
                    cursor += dur + 10 * US
            gpu = [s + 600 * US]

            def kernel(tid, api_at, dur, name):
                d = int(dur * factor)
                a_end = api_at + 50 * US
                g_start = max(gpu[0], a_end + 10 * US) if not blocking_launches else api_at + 5 * US
                if blocking_launches:
                    a_end = g_start + d + 5 * US
                exp.launch(tid, api_at, a_end, g_start, g_start + d, kernel=name, device_id=dev)
                gpu[0] = g_start + d + 10 * US

            op(main, s, s + 300 * US, LOADER)
            op(main, s + 300 * US, s + 500 * US, "aten::to", seq + 5, [tensor((8, 3, 32, 32))])
            corr = exp.runtime(main, s + 350 * US, s + 400 * US, name=memcpy_api)
            exp.memcpy(
                pid,
                corr,
                s + 400 * US,
                s + 500 * US,
                bytes=1 << 20,
                copy_kind=1,
                src_kind=memcpy_src,
                dst_kind=2,
                device_id=dev,
            )
            op(main, s + 500 * US, s + 700 * US, "aten::conv2d", seq, [tensor((8, 3, 32, 32)), tensor((16, 3, 3, 3))])
            kernel(main, s + 550 * US, 4 * MS, conv_kernel)
            op(main, s + 700 * US, s + 900 * US, "aten::linear", seq + 2, [tensor(x) for x in linear_shapes])
            kernel(main, s + 750 * US, 2 * MS, linear_kernel)
            for k in range(elementwise):
                a = s + 900 * US + k * 10 * US
                op(main, a, a + 8 * US, "aten::relu", seq + 100 + k, [tensor((8, 64))])
                kernel(main, a + 1 * US, 100 * US, elementwise_kernel)
            b0 = s + 900 * US + elementwise * 10 * US + 100 * US
            if backward_markers:
                op(grad, b0, b0 + 200 * US, "ConvolutionBackward0", seq)
            kernel(grad, b0 + 50 * US, 2 * MS, bwd_kernels[0])
            if backward_markers:
                op(grad, b0 + 200 * US, b0 + 400 * US, "AddmmBackward0", seq + 3)
            kernel(grad, b0 + 250 * US, 500 * US, bwd_kernels[1])
            if sync:
                exp.runtime(main, s + span - 1 * MS, s + span - 1 * MS + sync, name="cudaStreamSynchronize_v3020")
            if i < n_iter - 1:
                op(main, s + span - 300 * US, s + span - 100 * US, "Optimizer.step#SGD.step")
                op(main, s + span - 290 * US, s + span - 110 * US, "aten::add_", seq + 6, [tensor((64, 256))])
                gpu[0] = max(gpu[0], s + span - 250 * US)
                kernel(main, s + span - 280 * US, 100 * US, ADD)
    exp.set_session(start_time=0)
    return exp.write(path)


def run(path: Path, **kwargs) -> list[dict]:
    a = analyze(path, **kwargs)
    return expert_systems.detect(a.trace, a.corr, a.domain(), a.agg(), a.iterations, strict=True)


def only(findings: list[dict], exp_sys_id: str) -> list[dict]:
    return [f for f in findings if f["id"] == exp_sys_id]


def one(findings: list[dict], exp_sys_id: str) -> dict:
    hits = only(findings, exp_sys_id)
    assert len(hits) == 1, f"expected one {exp_sys_id}, got {[f['id'] for f in findings]}"
    return hits[0]


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    """The steady, well-configured loop: no detector fires."""
    config = {
        "amp_enabled": True,
        "cudnn_benchmark": True,
        "detect_anomaly": False,
        "gradcheck": False,
        "gradgradcheck": False,
        "autograd_profile": False,
        "emit_nvtx": True,
        "num_workers": 4,
        "pin_memory": True,
        "batch_size": 256,
        "max_memory_reserved": 30 << 30,
    }
    path = loop_profile(tmp_path_factory.mktemp("es") / "baseline.sqlite", config=config)
    return path, run(path)


@pytest.fixture
def make(tmp_path):
    counter = [0]

    def build(**kwargs) -> Path:
        counter[0] += 1
        return loop_profile(tmp_path / f"p{counter[0]}.sqlite", **kwargs)

    return build


# ---------------------------------------------------------------------------- contract


def test_baseline_is_silent(baseline):
    # as DLProf did, a profile without DALI hears of it, as information only
    assert [(f["id"], f["severity"], f["problem"].split(" (")[0]) for f in baseline[1]] == [
        ("dataloader_detector", "info", "No DALI ops detected")
    ]


@pytest.mark.slow
def test_every_finding_follows_the_contract(make):
    path = make(
        start=6 * MS,
        stall=3 * MS,
        memcpy_src=0,
        sync=600 * US,
        conv_kernel=FP32_CONV,
        linear_kernel=FP32_GEMM,
        bwd_kernels=(FP32_WGRAD, FP32_GEMM),
        config={
            "amp_enabled": False,
            "cudnn_benchmark": False,
            "detect_anomaly": True,
            "max_memory_reserved": 4 << 30,
            "num_workers": 0,
        },
    )
    findings = run(path)
    ids = {f["id"] for f in findings}
    assert (
        {
            "bad_iteration_range_detector",
            "slow_api_detector",
            "gpu_gap_detector",
            "dataloader_detector",
            "amp_detector",
            "cudnn_benchmark_detector",
            "batch_size_detector",
            "pageable_memcpy_detector",
            "sync_api_detector",
        }
        <= ids
        <= set(DETECTORS)
    )
    for f in findings:
        assert set(f) == {"id", "severity", "problem", "recommendation", "link", "action", "data"}
        assert f["severity"] in ("error", "warning", "info")
        assert f["problem"] and f["recommendation"] and f["link"].startswith("https://")
        assert f["action"] is None or isinstance(f["action"], dict)
        json.dumps(f)  # JSON-ready: the database stores action and data as JSON
    order = list(DETECTORS)
    assert [order.index(f["id"]) for f in findings] == sorted(order.index(f["id"]) for f in findings)


@pytest.fixture
def verbosity():
    """Set the console verbosity for one test (other tests run the CLI in-process and change it)."""
    level = log.verbosity()
    yield log.set_verbosity
    log.set_verbosity(level)


def test_a_failing_detector_is_skipped_with_a_warning(make, monkeypatch, capsys, verbosity):
    verbosity(log.INFO)
    path = make(config={"detect_anomaly": True})
    a = analyze(path)

    def broken(ctx):
        raise ValueError("boom")

    monkeypatch.setitem(DETECTORS, "amp_detector", broken)
    findings = expert_systems.detect(a.trace, a.corr, a.domain(), a.agg(), a.iterations)
    assert only(findings, "slow_api_detector")
    assert "expert system amp_detector failed" in capsys.readouterr().err
    with pytest.raises(ValueError):
        expert_systems.detect(a.trace, a.corr, a.domain(), a.agg(), a.iterations, strict=True)


def test_unknown_facts_are_named_at_detailed_verbosity(make, capsys, verbosity):
    path = make(conv_kernel=FP32_CONV, linear_kernel=FP32_GEMM, bwd_kernels=(FP32_WGRAD, FP32_GEMM))
    verbosity(log.INFO)
    findings = run(path)
    assert "stayed silent" not in capsys.readouterr().out
    verbosity(log.DETAILED)
    assert run(path) == findings
    out = capsys.readouterr().out
    silent = {line.split(": ")[1].split()[0]: line for line in out.splitlines() if "stayed silent" in line}
    assert set(silent) == {"slow_api_detector", "cudnn_benchmark_detector", "batch_size_detector"}
    assert "cudnn_benchmark" in silent["cudnn_benchmark_detector"]
    assert "detect_anomaly" in silent["slow_api_detector"]
    assert "peak GPU memory use" in silent["batch_size_detector"]
    assert not only(findings, "cudnn_benchmark_detector")
    # the markers carry no data type, but the kernels' names show FP32 (sgemm, scudnn): AMP is not used
    amp = one(findings, "amp_detector")
    assert amp["data"]["evidence"] == "data types float32"
    assert amp["problem"].startswith("4 ops were eligible to use tensor cores but none are using FP16")


# ---------------------------------------------------------------------------- iterations


@pytest.mark.slow
def test_no_iterations(baseline, make):
    assert not only(baseline[1], "no_iterations_detector")
    path = make()
    f = one(run(path, key_node="no_such_node"), "no_iterations_detector")
    assert f["problem"] == "Unable to split profile into training iterations: key op no_such_node not found"
    assert f["recommendation"].startswith("Specify key op by setting the --key_op argument")
    assert "Optimizer.step#SGD.step (3 times)" in f["recommendation"]
    assert f["action"] == {
        "type": "reaggregate",
        "key_node": "Optimizer.step#SGD.step",
        "command": "dlprof --database=<db> --key_op='Optimizer.step#SGD.step'",
    }
    # nothing looked for (nvtx mode has no default key node): DLProf's sentence, no empty name in it
    f = one(run(path, mode="nvtx"), "no_iterations_detector")
    assert f["problem"] == (
        "Unable to split profile into training iterations: key op not found (no --key_op given "
        "and nvtx profiles have no default key op)"
    )
    # a PyTorch profile without its default key op: named
    f = one(run(make(n_iter=1)), "no_iterations_detector")
    assert f["problem"] == (
        "Unable to split profile into training iterations: key op not found (no --key_op given; "
        "the pytorch default, Optimizer.step# or ProfilerStep#N ranges, is not in the profile)"
    )


@pytest.mark.slow
def test_bad_iteration_range(baseline, make):
    assert not only(baseline[1], "bad_iteration_range_detector")
    path = make(start=5 * MS, n_iter=5)  # iteration 0 holds 5 ms of start-up: 15 ms instead of 10 ms
    f = one(run(path), "bad_iteration_range_detector")
    assert f["problem"] == (
        "Iteration 0 of the aggregated range 0..4 is not steady (median iteration time 10.0 ms): "
        "iteration 0 took 14.9 ms (1.49x the median)"
    )
    assert f["recommendation"] == (
        "Aggregate the steady iterations 1..4 only: set --iter_start 1 --iter_stop 4, "
        "or apply this proposal in the Iterations view"
    )
    assert f["action"] == {
        "type": "reaggregate",
        "iter_start": 1,
        "iter_stop": 4,
        "command": "dlprof --database=<db> --iter_start 1 --iter_stop 4",
    }
    # rendered for a run: its database, its folder (so the run is updated), paths quoted for the shell
    assert (
        render_command(f["action"], Path("out dir/dlprof_dldb.sqlite"))
        == "dlprof --database='out dir/dlprof_dldb.sqlite' --output_path='out dir' --force=true "
        "--iter_start 1 --iter_stop 4"
    )
    assert (
        render_command(f["action"], Path("/r/exp1_dldb.sqlite"), "trial")
        == "dlprof --database=/r/exp1_dldb.sqlite --output_path=/r --base_name=exp1 --profile_name=trial --force=true "
        "--iter_start 1 --iter_stop 4"
    )
    assert (
        render_command(f["action"], Path("/r/exp1_dldb.sqlite"), "exp1")
        == "dlprof --database=/r/exp1_dldb.sqlite --output_path=/r --base_name=exp1 --force=true "
        "--iter_start 1 --iter_stop 4"
    )
    # the proposal applied: steady, silent
    assert not only(run(path, iter_start=1, iter_stop=4), "bad_iteration_range_detector")
    # a key node given by the user is repeated in the command
    f = one(run(path, key_node="Optimizer.step#SGD.step"), "bad_iteration_range_detector")
    assert f["action"]["command"] == (
        "dlprof --database=<db> --key_op='Optimizer.step#SGD.step' --iter_start 1 --iter_stop 4"
    )
    assert f["action"]["key_node"] == "Optimizer.step#SGD.step"


# ---------------------------------------------------------------------------- utilization


def test_underutilized_gpu(baseline, make):
    assert not only(baseline[1], "underutilized_gpu_detector")
    f = one(run(make(stall=12 * MS)), "underutilized_gpu_detector")  # 12 ms of data loading per 22 ms
    m = re.fullmatch(
        r"The GPU is underutilized: Only (\d+\.\d)% of the profiled time is spent on GPU kernel "
        r"operations",
        f["problem"],
    )
    assert m and float(m.group(1)) < 50
    assert re.match(r"Dataloader has the highest \(non-GPU\) usage at \d+\.\d%\. ", f["recommendation"])


def test_unused_gpu(make):
    findings = only(run(make(idle_gpus=(1,))), "underutilized_gpu_detector")
    unused = [f for f in findings if f["data"]["kind"] == "unused"]
    assert len(unused) == 1 and unused[0]["problem"] == (
        "GPU 1 (NVIDIA A100-SXM4-40GB) ran no kernel or memory operation in the aggregated iterations while "
        "1 other GPU did"
    )
    assert not [
        f for f in only(run(make(devices=(0, 1))), "underutilized_gpu_detector") if f["data"]["kind"] == "unused"
    ]


def test_imbalanced_gpus(make):
    assert not only(run(make(devices=(0, 1))), "imbalanced_gpus_detector")
    f = one(run(make(devices=(0, 1), scale={1: 0.5})), "imbalanced_gpus_detector")
    # GPU 1 runs every kernel in half the time (the memcpys keep their length)
    assert f["problem"] == (
        "GPU work is imbalanced across 2 GPUs: GPU 1 is busy 44.8% of the time and GPU 0 88.7% "
        "(17.1 ms, 49.4% less work on the least busy GPU)"
    )
    assert f["data"]["min_device"] == 1 and f["data"]["max_device"] == 0


@pytest.mark.slow
def test_dataloader(baseline, make):
    assert [f["severity"] for f in only(baseline[1], "dataloader_detector")] == ["info"]
    f = one(run(make(stall=3 * MS, config={"num_workers": 0, "pin_memory": False})), "dataloader_detector")
    assert re.fullmatch(
        r"No DALI ops detected; data loading takes 2\d\.\d% of the profiled time while the GPU is "
        r"idle",
        f["problem"],
    ), f["problem"]
    assert f["recommendation"].startswith(
        "Consider using NVIDIA DALI, a library that is a high performance alternative to built-in data loaders "
        "and data iterators. Learn more here: https://developer.nvidia.com/DALI"
    )
    assert "num_workers=0" in f["recommendation"] and "pin_memory=True" in f["recommendation"]
    f = one(run(make(stall=3 * MS, stall_label="DALI:decode")), "dataloader_detector")
    assert f["problem"].startswith("DALI is used, but data loading takes")


def test_no_fusion(baseline, make):
    assert not only(baseline[1], "no_fusion_detector")
    f = one(run(make(elementwise=60, span=16 * MS)), "no_fusion_detector")
    assert re.fullmatch(
        r"60 unfused elementwise kernels per iteration take 24\.0 ms, 4\d\.\d% of the GPU kernel "
        r"time \(average 100\.0 us each\): vectorized_elementwise_kernel \(24\.0 ms\)",
        f["problem"],
    ), f["problem"]
    assert "torch.compile" in f["recommendation"]
    assert not only(
        run(make(elementwise=60, span=16 * MS, elementwise_kernel="triton_poi_fused_relu_0")), "no_fusion_detector"
    )


# ---------------------------------------------------------------------------- Tensor Cores

FP32 = {"conv_kernel": FP32_CONV, "linear_kernel": FP32_GEMM, "bwd_kernels": (FP32_WGRAD, FP32_GEMM)}


@pytest.mark.slow
def test_amp(baseline, make):
    assert not only(baseline[1], "amp_detector")
    f = one(run(make(config={"amp_enabled": False}, **FP32)), "amp_detector")
    # eligible ops: conv2d and linear, forward and backward (the backward ones take the forward names):
    # 4 x (4 + 2 + 2 + 0.5) ms of the 4 x 8.5 + 3 x 0.1 ms of kernels
    assert f["problem"] == (
        "4 ops were eligible to use tensor cores but none are using FP16 (34.0 ms, 99.1% of the GPU kernel time)"
    )
    assert f["recommendation"] == (
        "Try enabling AMP (Automatic Mixed Precision). For more information: "
        "https://developer.nvidia.com/automatic-mixed-precision"
    )
    assert f["action"]["type"] == "show_ops" and len(f["action"]["op_ids"]) == 4
    # AMP on: silent; data types known (DLProf markers) without metadata: they decide
    assert not only(run(make(config={"amp_enabled": True}, **FP32)), "amp_detector")
    f = one(run(make(markers="dlprof", dtype="float32", **FP32)), "amp_detector")
    assert f["data"]["evidence"] == "data types float32"
    assert not only(run(make(markers="dlprof", dtype="float16", **FP32)), "amp_detector")


@pytest.mark.slow
def test_bad_tensor_shape(baseline, make):
    assert not only(baseline[1], "bad_tensor_shape_detector")
    path = make(markers="dlprof", dtype="float16", linear_kernel=PLAIN_GEMM, linear_shapes=((8, 250), (64, 250)))
    f = one(run(path), "bad_tensor_shape_detector")
    assert f["problem"] == (
        "1 Tensor Core eligible op ran without Tensor Core kernels (8.0 ms, 23.3% of the GPU "
        "kernel time): LINEAR_1 /linear (float16; 8.0 ms; K:250 not a multiple of 8)"
    )
    assert f["recommendation"].startswith("Make their dimensions multiples of 8 for FP16/BF16")
    assert f["severity"] == "warning" and f["data"]["ops"][0]["bad_dims"] == ["K:250"]
    # multiples of 8 and a Tensor Core kernel: silent
    assert not only(
        run(make(markers="dlprof", dtype="float16", linear_shapes=((8, 256), (64, 256)))), "bad_tensor_shape_detector"
    )
    # FP32 ops while AMP is on ran outside autocast: the data type is the cause; beside Tensor Core ops that is
    # missed_tensor_cores_detector's finding
    fp32 = run(make(markers="dlprof", dtype="float32", linear_kernel=PLAIN_GEMM, config={"amp_enabled": True}))
    assert not only(fp32, "bad_tensor_shape_detector")
    assert (
        "LINEAR_1 /linear fprop (float32; gemmSN_NN_kernel 8.0 ms"
        in one(fp32, "missed_tensor_cores_detector")["problem"]
    )
    # without any Tensor Core op it stays bad_tensor_shape_detector's
    f = one(
        run(
            make(
                markers="dlprof",
                dtype="float32",
                conv_kernel=FP32_CONV,
                linear_kernel=PLAIN_GEMM,
                bwd_kernels=(FP32_WGRAD, FP32_GEMM),
                config={"amp_enabled": True},
            )
        ),
        "bad_tensor_shape_detector",
    )
    assert "LINEAR_1 /linear (float32; 8.0 ms)" in f["problem"]
    assert f["recommendation"].startswith("Run them in FP16/BF16")


@pytest.mark.slow
def test_missed_tensor_cores(baseline, make):
    """FP16 Tensor Core kernels for the convolution (fprop and bprop) and the linear bprop, one FP32 sgemm in the
    linear fprop (an eligible op), AMP unknown. Kernel time: 4 iterations x (4 + 2 + 2 + 0.5 ms) + 3 optimizer
    steps x 0.1 ms = 34.3 ms; the sgemm: 4 x 2 ms = 8 ms, 23.3% of it."""
    assert not only(baseline[1], "missed_tensor_cores_detector")
    findings = run(make(linear_kernel=FP32_GEMM))
    f = one(findings, "missed_tensor_cores_detector")
    assert f["problem"] == (
        "1 Tensor Core eligible op ran in FP32 without Tensor Cores while 3 other ops used Tensor Cores "
        "(float16): 8.0 ms, 23.3% of the GPU kernel time: LINEAR_1 /aten::linear fprop (float32; "
        "volta_sgemm_128x64_nn 8.0 ms; 23.3%)"
    )
    assert f["severity"] == "warning" and f["action"] == {"type": "show_ops", "op_ids": ["LINEAR_1"]}
    assert f["data"]["ops"][0]["kernels"] == [{"name": FP32_GEMM, "gpu_time": 8 * MS}]
    assert f["recommendation"].startswith("Run them in the 16-bit type of the other ops")
    assert "torch.set_float32_matmul_precision('high')" in f["recommendation"]
    assert not only(findings, "amp_detector") and not only(findings, "bad_tensor_shape_detector")
    # no op on Tensor Cores: amp_detector's case, not this one
    no_tc = run(make(conv_kernel=FP32_CONV, linear_kernel=FP32_GEMM, bwd_kernels=(FP32_WGRAD, FP32_GEMM)))
    assert not only(no_tc, "missed_tensor_cores_detector") and one(no_tc, "amp_detector")
    # TF32 convolutions beside FP32 matmuls: only the TF32 advice
    tf32 = "ampere_tf32_s1688gemm_tf32_128x128_ldg8_f2f_nn"
    f = one(
        run(make(conv_kernel=tf32, linear_kernel=FP32_GEMM, bwd_kernels=(tf32, tf32))), "missed_tensor_cores_detector"
    )
    assert "used Tensor Cores (float32)" in f["problem"]
    assert f["recommendation"].startswith("Where they must stay in FP32, let them use TF32 Tensor Cores")


def test_missed_tensor_cores_silent_on_a_cpu_only_run():
    """A real CPU run (PyTorch 2.13 training a small CNN): FP32 convolutions and linear layers, no kernel."""
    from tests.data import KINETO_MALFORMED

    a = analyze(KINETO_MALFORMED / "pytorch2.13_cpu_unescaped_name.pt.trace.json.gz")
    ops = a.agg().ops
    assert {"conv2d", "linear"} <= set(ops["op_type"])
    assert not ops["tc_eligible"].any()  # without GPU work no op is Tensor Core eligible (DESIGN.md "GPUs")
    findings = expert_systems.detect(a.trace, a.corr, a.domain(), a.agg(), a.iterations, strict=True)
    assert not only(findings, "missed_tensor_cores_detector")


# ---------------------------------------------------------------------------- framework settings


@pytest.mark.slow
def test_cudnn_benchmark(baseline, make):
    assert not only(baseline[1], "cudnn_benchmark_detector")
    f = one(run(make(config={"cudnn_benchmark": False})), "cudnn_benchmark_detector")
    assert re.fullmatch(
        r"cuDNN benchmark mode is off \(torch.backends.cudnn.benchmark = False\) while convolutions "
        r"take 24\.0 ms, 70\.0% of the GPU kernel time \(2 convolution ops\)",
        f["problem"],
    ), f["problem"]
    assert f["recommendation"].startswith("Set torch.backends.cudnn.benchmark = True")
    # DLProf's key spelling
    assert one(run(make(config={"cudnn_benchmark_disabled": True})), "cudnn_benchmark_detector")
    f = one(run(make(config={"cudnn_enabled": False})), "cudnn_benchmark_detector")
    assert f["problem"].startswith("cuDNN is disabled (torch.backends.cudnn.enabled = False)")


def test_slow_api(baseline, make):
    assert not only(baseline[1], "slow_api_detector")
    f = one(
        run(make(config={"detect_anomaly": True, "autograd_profile": True, "gradcheck": False})), "slow_api_detector"
    )
    assert f["severity"] == "error"
    assert f["problem"] == (
        "Slow debugging APIs were on during the profiled run, so every time in this profile is "
        "inflated: anomaly detection (torch.autograd.detect_anomaly / set_detect_anomaly); the "
        "autograd profiler (torch.profiler / torch.autograd.profiler.profile and its "
        "record_function ranges)"
    )
    assert f["recommendation"].startswith(
        "Turn them off for training and profiling: torch.autograd.set_detect_anomaly(False); stop torch.profiler"
    )
    f = one(run(make(n_iter=3, elementwise=10, blocking_launches=True)), "slow_api_detector")
    assert "blocking kernel launches (" in f["problem"] and "CUDA_LAUNCH_BLOCKING=1?" in f["problem"]
    assert "unset CUDA_LAUNCH_BLOCKING" in f["recommendation"]


def test_emit_nvtx(baseline, make):
    assert not only(baseline[1], "emit_nvtx_detector")
    # backward ops marked by emit_nvtx ranges, even without emit_nvtx in the metadata: silent
    assert not only(run(make(markers="dlprof", config={"emit_nvtx": False})), "emit_nvtx_detector")
    f = one(run(make(markers="dlprof", backward_markers=False, config={"emit_nvtx": False})), "emit_nvtx_detector")
    # 4 x 2.5 ms of the ops' 4 x 8.6 ms - 0.1 ms GPU time (memcpy included)
    assert f["problem"] == (
        "The backward pass appears as an undivided 'backward' op (4 calls, 10.0 ms GPU time, "
        "28.8% of the ops' GPU time): PyTorch's emit_nvtx was not enabled (model_config "
        "emit_nvtx = false)"
    )
    assert "torch.autograd.profiler.emit_nvtx()" in f["recommendation"]


def test_batch_size(baseline, make):
    assert not only(baseline[1], "batch_size_detector")  # 30 GiB of 39.6 GiB used
    f = one(run(make(config={"max_memory_reserved": 8 << 30, "batch_size": 32})), "batch_size_detector")
    assert f["problem"] == (
        "GPU Memory is underutilized: Only 20.2% of GPU Memory is used (peak 8.0 GiB of 39.6 GiB, batch size 32)"
    )
    assert f["recommendation"].startswith(
        "Try increasing batch size by 4x to increase data throughput (batch size 128 instead of 32)"
    )
    # the memory size from the run metadata wins over TARGET_INFO_GPU
    f = one(run(make(config={"max_memory_allocated": 4 << 30, "gpu_total_memory": 16 << 30})), "batch_size_detector")
    assert f["problem"] == "GPU Memory is underutilized: Only 25.0% of GPU Memory is used (peak 4.0 GiB of 16.0 GiB)"
    assert f["recommendation"].startswith("Try increasing batch size by 4x")


# ---------------------------------------------------------------------------- CUDA API rules


def test_pageable_memcpy(baseline, make):
    assert not only(baseline[1], "pageable_memcpy_detector")
    f = one(run(make(memcpy_src=0, config={"pin_memory": False})), "pageable_memcpy_detector")
    assert f["problem"] == (
        "4 asynchronous memcpy operations (cudaMemcpyAsync (4)) used pageable host memory: "
        "4.0 MiB, 400.0 us on the GPU and 200.0 us in the calls (4 Host-to-Device); launched "
        "from /aten::to (4). Copies from pageable memory are staged by the driver and do not "
        "overlap with the host"
    )
    assert f["recommendation"].startswith("Copy from pinned (page-locked) host memory")
    assert f["recommendation"].endswith("(this run's DataLoader has pin_memory=False)")


def test_sync_memcpy(baseline, make):
    assert not only(baseline[1], "sync_memcpy_detector")
    f = one(run(make(memcpy_api="cudaMemcpy_v3020")), "sync_memcpy_detector")
    assert f["problem"] == (
        "4 memcpy operations ran synchronously with the host (cudaMemcpy (4)): the calls blocked "
        "the host for 200.0 us (0.5% of the wall clock time) for 400.0 us of GPU work; launched "
        "from /aten::to (4)"
    )
    assert f["severity"] == "info" and "cudaMemcpyAsync" in f["recommendation"]


def test_sync_api(baseline, make):
    assert not only(baseline[1], "sync_api_detector")
    assert not only(run(make(sync=20 * US)), "sync_api_detector")  # 0.2% of the thread's time
    f = one(run(make(sync=600 * US)), "sync_api_detector")
    assert re.fullmatch(
        r"Explicit synchronizations blocked the host for 2\.4 ms, 6\.\d% of the calling thread's "
        r"time: cudaStreamSynchronize \(4 calls, 2\.4 ms\); called from "
        r"unassociated_cudaStreamSynchronize \(2\.4 ms\)\. After they returned the GPU stayed "
        r"idle for .* until new work arrived",
        f["problem"],
    ), f["problem"]
    assert "tensor.item()" in f["recommendation"]


@pytest.mark.slow
def test_gpu_gaps(baseline, make):
    assert not only(baseline[1], "gpu_gap_detector")
    path = make(
        stall=3 * MS,
        stall_label="data_prep",
        stall_apis=(("cudaStreamSynchronize_v3020", 1 * MS),),
        stall_io=(("read", 500 * US),),
    )
    f = one(run(path), "gpu_gap_detector")
    gaps = f["data"]["gaps"]
    assert f["data"]["count"] == 3 and len(gaps) == 3  # the gaps before iterations 1..3 (iteration 0 has none)
    first = gaps[0]
    assert first["duration"] == 3 * MS + 520 * US  # ADD ends 120 us before the stall, memcpy starts 400 us after
    assert (
        "Longest: gap of 3.5 ms on GPU 0 at 12.880 ms: CPU in data_prep (3.0 ms), cudaStreamSynchronize "
        "(1.0 ms), cudaMemcpyAsync (50.0 us), read (500.0 us); gap of 3.5 ms on GPU 0 at 25.880 ms" in f["problem"]
    )
    assert f["problem"].startswith(
        "GPU 0 (NVIDIA A100-SXM4-40GB) was idle in 3 gaps of at least 1.0 ms, 10.6 ms in total"
    )
    # the innermost range covering the gap is named, not the ranges enclosing it
    f = one(run(make(stall=3 * MS, stall_label=LOADER, outer="train_step")), "gpu_gap_detector")
    assert "CPU in " + LOADER + " (3.0 ms), cudaMemcpyAsync (50.0 us); gap" in f["problem"], f["problem"]
    assert "train_step" not in f["problem"] and "The GPU waits for data" in f["recommendation"]
    # short ranges that together cover the gap are named by label with their count
    f = one(run(make(stall=3 * MS, stall_label="data_prep", stall_pieces=20, outer="train_step")), "gpu_gap_detector")
    assert "CPU in data_prep x20 (3.0 ms), cudaMemcpyAsync (50.0 us); gap" in f["problem"], f["problem"]


def test_docs_cover_every_detector():
    doc = (Path(__file__).resolve().parents[1] / "docs" / "expert_systems.md").read_text(encoding="utf-8")
    for exp_sys_id in DETECTORS:
        assert f"`{exp_sys_id}`" in doc, exp_sys_id


@pytest.mark.slow
@pytest.mark.parametrize("names", [(), ("--base_name=exp1", "--profile_name=trial")])
def test_printed_command_updates_the_run(make, tmp_path, names):
    """The `apply with:` command, run as printed from the folder it was printed in, updates that run: the
    run's database gains the proposed aggregation (the first one is kept), the run's event file points at it,
    its reports (the same ones) cover the proposed range; no other file is written."""
    import shlex

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from tests.profiles import run_dlprof

    path = make(start=5 * MS, n_iter=5)  # iteration 0 is not steady: the proposal is 1..4
    work = tmp_path / "work"
    work.mkdir()
    proc = run_dlprof(f"--database={path}", "--output_path=run dir", "--reports=summary", *names, cwd=work)
    line = next(text for text in proc.stdout.splitlines() if "apply with: " in text)
    argv = shlex.split(line.split("apply with: ", 1)[1])
    base, run_name = ("exp1", "trial") if names else ("dlprof", "dlprof")
    assert argv[:3] == ["dlprof", f"--database=run dir/{base}_dldb.sqlite", "--output_path=run dir"]
    assert argv[-4:] == ["--iter_start", "1", "--iter_stop", "4"]
    assert "--force=true" in argv and "--reports=summary" in argv  # the run's own reports, replaced
    before = sorted(p.relative_to(work) for p in work.rglob("*") if "tfevents" not in p.name)
    run_dlprof(*argv[1:], cwd=work)
    run_dir = work / "run dir"
    assert sorted(p.relative_to(work) for p in work.rglob("*") if "tfevents" not in p.name) == before
    con = sqlite3.connect(run_dir / f"{base}_dldb.sqlite")
    try:
        assert con.execute("SELECT aggr_id, iter_start, iter_stop FROM aggregations ORDER BY aggr_id").fetchall() == [
            (1, 0, 4),
            (2, 1, 4),
        ]
    finally:
        con.close()
    events = list((run_dir / run_name).glob("*tfevents*"))
    assert len(events) == 1
    acc = EventAccumulator(str(run_dir / run_name), size_guidance={"tensors": 0})
    acc.Reload()
    meta = json.loads(acc.Tensors("dlprof/profile")[0].tensor_proto.string_val[0])
    assert meta["aggr_id"] == 2 and meta["database"] == f"../{base}_dldb.sqlite"
    summary = (run_dir / f"{base}_summary.csv").read_text()
    assert "Start Iteration,1" in summary and "Stop Iteration,4" in summary and "Aggregated Iterations,4" in summary


def test_no_gpu_advice_without_gpu_activity(tmp_path):
    """A capture with a GPU listed, ranges, data loading and CUDA API calls but no GPU activity gets no GPU
    advice (it would otherwise read as 0% GPU utilization, 100% data loading)."""
    exp = NsysExport(schema="2022.4")
    exp.add_gpu(device_id=0, name="NVIDIA A100-SXM4-40GB", total_memory=A100_MEMORY)
    main = exp.add_thread(pid=100, tid=100, name="python", process_name="python")
    for i in range(4):
        t = i * 10 * MS
        exp.push_pop(main, t, t + 8 * MS, LOADER)
        exp.push_pop(main, t + 8 * MS, t + 9 * MS, f"aten::mm, seq = {i}, op_id = {i}")
        exp.runtime(main, t + 9 * MS, t + 9 * MS + 100, name="cudaGetDevice_v3020")
        exp.push_pop(main, t + 9 * MS, t + 10 * MS, "Optimizer.step#SGD.step")
    exp.push_pop(main, 0, 0, json.dumps({"model_config": {"num_workers": 0, "max_memory_reserved": 1 << 20}}))
    findings = run(exp.write(tmp_path / "cpu.sqlite"))
    gpu_advice = {
        "underutilized_gpu_detector",
        "imbalanced_gpus_detector",
        "dataloader_detector",
        "amp_detector",
        "bad_tensor_shape_detector",
        "pageable_memcpy_detector",
        "batch_size_detector",
        "no_fusion_detector",
        "cudnn_benchmark_detector",
        "gpu_gap_detector",
    }
    assert not {f["id"] for f in findings} & gpu_advice


def test_no_gpu_no_tensor_core_eligibility_nor_dashboard_gpu_advice(tmp_path):
    """A CPU-only run of conv2d and linear (op types eligible for Tensor Cores on a GPU): no op is eligible
    (the summary's "Ops eligible for TC but not using" row is empty, all are "other ops"), and the dashboard's
    guidance gives no GPU advice (Tensor Cores, a busy GPU, data loading) though GPU utilization is 0 % and data
    loading 50 %."""
    from dlprof_plugin.guidance import dashboard_guidance

    exp = NsysExport(schema="2022.4")
    main = exp.add_thread(pid=100, tid=100, name="python", process_name="python")
    for i in range(3):
        t = i * 10 * MS
        exp.push_pop(main, t, t + 5 * MS, LOADER)
        exp.push_pop(main, t + 5 * MS, t + 7 * MS, f"aten::conv2d, seq = {2 * i}, op_id = {2 * i}")
        exp.push_pop(main, t + 7 * MS, t + 9 * MS, f"aten::linear, seq = {2 * i + 1}, op_id = {2 * i + 1}")
        exp.push_pop(main, t + 9 * MS, t + 10 * MS, "Optimizer.step#SGD.step")
    a = analyze(exp.write(tmp_path / "cpu.sqlite"))
    s = a.agg().summary
    assert s["ops"]["eligible_not_using"]["count"] == 0 and s["ops"]["other"]["count"] == s["ops"]["all"]["count"] == 2
    assert not a.agg().ops["tc_eligible"].any() and len(a.agg().tensor_core) == 0
    summary = {
        "key_found": True,
        "n_visible_gpus": s["n_visible_gpus"],
        "gpu_utilization": s["gpu_utilization"],
        "dataloader_duration_pct": s["pct"]["dataloader"],
    }
    assert s["n_visible_gpus"] == 0 and s["pct"]["dataloader"] > 40
    assert [g["title"] for g in dashboard_guidance(summary, {"eligible_not_using_ops": 2})] == ["Performance guide"]
    # with a GPU that ran work the same figures are advice
    titles = [g["title"] for g in dashboard_guidance(dict(summary, n_visible_gpus=1), {"eligible_not_using_ops": 2})]
    assert titles == ["Use Tensor Cores", "Keep the GPU busy", "Speed up data loading"]


def test_one_rank_of_a_distributed_job_leaves_the_other_gpus_to_the_other_ranks(tmp_path):
    """A trace of rank 3 of 8 on an 8-GPU node (deviceProperties lists all 8; its kernels run on GPU 3): the
    other GPUs are not reported as unused when the trace records a world size above 1 (distributedInfo); the same
    trace without it is a single process that left 7 GPUs idle."""
    from tests.kineto_builder import KinetoTrace

    def trace(world_size):
        k = KinetoTrace()
        for d in range(8):
            k.device(d)
        if world_size:
            k.top["distributedInfo"] = {"backend": "nccl", "rank": 3, "world_size": world_size}
        k.metadata({10: "python"})
        for i in range(3):
            s = i * 100_000
            k.annotation(10, s, 90_000, f"ProfilerStep#{i}")
            k.cpu_op(10, s + 1000, 20_000, "aten::mm", seq=i)
            c = k.runtime(10, s + 2000, 1000)
            k.kernel(FP32_GEMM, s + 4000, 50_000, c, device=3)
        return k.write(tmp_path / f"rank3_{world_size}.json")

    def unused(path):
        return [f for f in only(run(path), "underutilized_gpu_detector") if f["data"]["kind"] == "unused"]

    assert unused(trace(8)) == []
    (alone,) = unused(trace(None))
    assert alone["data"]["unused_devices"] == [0, 1, 2, 4, 5, 6, 7] and alone["data"]["busy_devices"] == [3]


def test_bad_iteration_range_of_profiler_steps(tmp_path):
    """Steps are complete iterations, the first one too: five ProfilerSteps of 30, 10, 10, 10, 10 ms (the first
    one slow: warm-up) have the median 10 ms, and the steady range 1..4 is proposed."""
    from tests.kineto_builder import KinetoTrace

    k = KinetoTrace()
    k.metadata({10: "python"})
    start = 0
    for i, length in enumerate((30 * MS, 10 * MS, 10 * MS, 10 * MS, 10 * MS)):
        k.annotation(10, start, length, f"ProfilerStep#{i}")
        k.cpu_op(10, start + 1000, length // 2, "aten::mm", seq=i)
        start += length
    f = one(run(k.write(tmp_path / "steps.json")), "bad_iteration_range_detector")
    assert f["problem"] == (
        "Iteration 0 of the aggregated range 0..4 is not steady (median iteration time 10.0 ms): "
        "iteration 0 took 30.0 ms (3.00x the median)"
    )
    assert (f["action"]["iter_start"], f["action"]["iter_stop"]) == (1, 4)
