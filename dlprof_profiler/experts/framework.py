"""Framework settings a trace cannot show by itself, from the run metadata (`{"model_config": {...}}`
markers of our PyTorch instrumentation) and the export (GPU memory from TARGET_INFO_GPU): cuDNN benchmark
mode, slow debugging APIs, emit_nvtx, batch size versus GPU memory. A fact that is missing is unknown: the
detector stays silent and records it for --verbosity=detailed."""

from __future__ import annotations

import math
import re

import numpy as np

from dlprof_profiler.engine import markers as nm
from dlprof_profiler.engine.aggregate import LAUNCH_BLOCKING_MIN_KERNEL_NS as LONG_KERNEL_NS
from dlprof_profiler.engine.correlate import BACKWARD_PASS
from dlprof_profiler.experts.base import TUNING_GUIDE, Context, finding, fmt_bytes, fmt_pct, fmt_time

# cudnn_benchmark_detector: convolution kernel share from which the finding is a warning (else info).
CONV_WARNING_SHARE_PCT = 10.0
_CONV_OP = re.compile(r"conv", re.IGNORECASE)
_CONV_KERNEL = re.compile(r"conv|cudnn|winograd|implicit_gemm|fprop|dgrad|wgrad", re.IGNORECASE)

# slow_api_detector, CUDA_LAUNCH_BLOCKING evidence: at least LAUNCH_BLOCKING_MIN_KERNELS kernels lasting
# >= LAUNCH_BLOCKING_MIN_KERNEL_NS, and >= LAUNCH_BLOCKING_FRACTION of them finished before their launch
# call returned (an asynchronous launch returns in a few microseconds, long before such a kernel ends).
LAUNCH_BLOCKING_MIN_KERNELS = 20
LAUNCH_BLOCKING_MIN_KERNEL_NS = LONG_KERNEL_NS  # (aggregate.py counts them per launch)
LAUNCH_BLOCKING_FRACTION = 0.95

# batch_size_detector: fires when the peak GPU memory used is below this share of the GPU's memory.
MEMORY_UNDERUSE_PCT = 50.0
PEAK_MEMORY_KEYS = ("max_memory_reserved", "max_memory_allocated", "gpu_memory_used", "peak_memory")

SLOW_APIS = (
    (
        ("detect_anomaly", "autograd_set_detect_anomaly"),
        "anomaly detection (torch.autograd.detect_anomaly / set_detect_anomaly)",
        "torch.autograd.set_detect_anomaly(False)",
    ),
    (("gradcheck",), "torch.autograd.gradcheck", "remove gradcheck calls from the training run"),
    (("gradgradcheck",), "torch.autograd.gradgradcheck", "remove gradgradcheck calls from the training run"),
    (
        ("autograd_profile",),
        "the autograd profiler (torch.profiler / torch.autograd.profiler.profile and its record_function ranges)",
        "stop torch.profiler / autograd.profiler.profile while profiling with dlprof",
    ),
)


def _conv_time(ctx: Context) -> tuple[int, int]:
    """(kernel time of convolution ops - or of convolution kernels without an op model -, number of ops)."""
    ops = ctx.agg.ops
    if ops is not None and len(ops) and ctx.dm.has_markers:
        hit = ops["op_type"].astype(str).str.contains(_CONV_OP).to_numpy() & (ops["kernel_time"].to_numpy() > 0)
        return int(ops["kernel_time"].to_numpy()[hit].sum()), int(hit.sum())
    k = ctx.kernels
    if len(k) == 0:
        return 0, 0
    conv = ctx.kernel_name_flags(lambda name: _CONV_KERNEL.search(name))
    return int(k["gpu_total"].to_numpy(np.int64)[conv].sum()), 0


def cudnn_benchmark_detector(ctx: Context) -> list[dict]:
    """Inputs: kernel time of convolution ops; run metadata cudnn_enabled, cudnn_benchmark (or DLProf's
    cudnn_benchmark_disabled). Fires when convolutions ran with cuDNN disabled or benchmark mode off;
    warning when they take >= CONV_WARNING_SHARE_PCT (10%) of the kernel time."""
    conv, n_ops = _conv_time(ctx)
    if conv == 0:
        return []
    keys = ("cudnn_benchmark", "cudnn_benchmark_disabled", "cudnn_enabled")
    if not ctx.is_pytorch and all(ctx.cfg(k) is None for k in keys):
        return []  # other frameworks choose their convolution algorithms themselves
    share = 100.0 * conv / ctx.kernel_time if ctx.kernel_time else 0.0
    severity = "warning" if share >= CONV_WARNING_SHARE_PCT else "info"
    ops_text = f" ({n_ops} convolution op{'s' if n_ops != 1 else ''})" if n_ops else ""
    data = {"conv_kernel_time": conv, "conv_share_pct": share, "conv_ops": n_ops}
    if ctx.cfg_bool("cudnn_enabled") is False:
        return [
            finding(
                "cudnn_benchmark_detector",
                severity,
                f"cuDNN is disabled (torch.backends.cudnn.enabled = False) while convolutions take "
                f"{fmt_time(conv)}, {fmt_pct(share)} of the GPU kernel time{ops_text}",
                "Enable cuDNN (torch.backends.cudnn.enabled = True) and set torch.backends.cudnn.benchmark "
                "= True when the input shapes do not change between iterations",
                TUNING_GUIDE + "#enable-cudnn-auto-tuner",
                dict(data, cudnn_enabled=False),
            )
        ]
    bench = ctx.cfg_bool("cudnn_benchmark")
    if bench is None:
        disabled = ctx.cfg_bool("cudnn_benchmark_disabled")
        bench = None if disabled is None else not disabled
    if bench is None:
        ctx.unknown("cudnn_benchmark_detector", "torch.backends.cudnn.benchmark (model_config cudnn_benchmark)")
        return []
    if bench:
        return []
    return [
        finding(
            "cudnn_benchmark_detector",
            severity,
            f"cuDNN benchmark mode is off (torch.backends.cudnn.benchmark = False) while convolutions take "
            f"{fmt_time(conv)}, {fmt_pct(share)} of the GPU kernel time{ops_text}",
            "Set torch.backends.cudnn.benchmark = True when the input shapes do not change between "
            "iterations: cuDNN then times its convolution algorithms once per input shape and uses the "
            "fastest (leave it off when shapes vary from batch to batch)",
            TUNING_GUIDE + "#enable-cudnn-auto-tuner",
            dict(data, cudnn_benchmark=False),
        )
    ]


def launch_blocking(ctx: Context) -> dict | None:
    """Evidence of CUDA_LAUNCH_BLOCKING=1: long kernels that ended before their launch call returned."""
    facts = ctx.agg.facts or {}
    n = int(facts.get("long_kernels", 0))
    waited = int(facts.get("long_kernels_waited", 0))
    if n < LAUNCH_BLOCKING_MIN_KERNELS or waited < LAUNCH_BLOCKING_FRACTION * n:
        return None
    return {"kernels": n, "waited": waited}


def slow_api_detector(ctx: Context) -> list[dict]:
    """Inputs: run metadata detect_anomaly, autograd_set_detect_anomaly, gradcheck, gradgradcheck,
    autograd_profile; kernel launch and kernel end times (CUDA_LAUNCH_BLOCKING evidence, thresholds
    LAUNCH_BLOCKING_*). Fires when any of these debugging facilities was on: every timing of the profile
    is then inflated. Severity error."""
    applicable = ctx.is_pytorch or any(ctx.cfg(k) is not None for keys, _, _ in SLOW_APIS for k in keys)
    on, advice, missing = [], [], []
    if applicable:
        for keys, what, fix in SLOW_APIS:
            values = [ctx.cfg_bool(k) for k in keys]
            if any(v is True for v in values):
                on.append(what)
                advice.append(fix)
            elif all(v is None for v in values):
                missing.append(keys[0])
    blocking = launch_blocking(ctx)
    if blocking:
        on.append(
            f"blocking kernel launches ({blocking['waited']} of {blocking['kernels']} kernels of 20 us or "
            "more ended before their launch call returned: CUDA_LAUNCH_BLOCKING=1?)"
        )
        advice.append("unset CUDA_LAUNCH_BLOCKING")
    if not on:
        if missing:
            ctx.unknown("slow_api_detector", "whether debugging APIs were on (model_config " + ", ".join(missing) + ")")
        return []
    problem = (
        "Slow debugging APIs were on during the profiled run, so every time in this profile is inflated: "
        + "; ".join(on)
    )
    recommendation = (
        "Turn them off for training and profiling: " + "; ".join(advice) + ". Use them only in short debugging runs"
    )
    return [
        finding(
            "slow_api_detector",
            "error",
            problem,
            recommendation,
            TUNING_GUIDE + "#disable-debugging-apis",
            {"enabled": on, "unknown": missing, "launch_blocking": blocking},
        )
    ]


def emit_nvtx_detector(ctx: Context) -> list[dict]:
    """Inputs: PyTorch op instances: the backward pass left as one `backward` op per thread and iteration
    (markers without emit_nvtx), or no PyTorch op marker at all in a PyTorch profile; run metadata
    emit_nvtx (named in the text when known). Fires on either."""
    if not ctx.is_pytorch:
        return []
    ops = ctx.agg.ops
    labels = ctx.range_labels
    any_marker = bool(np.isin(labels["kind"].to_numpy(), (nm.PT_OP, nm.DL_ARG)).any()) if len(labels) else False
    emit = ctx.cfg_bool("emit_nvtx")
    said = " (model_config emit_nvtx = false)" if emit is False else ""
    link = "https://pytorch.org/docs/stable/autograd.html#torch.autograd.profiler.emit_nvtx"
    recommendation = (
        "Run the training loop inside `with torch.autograd.profiler.emit_nvtx():` so that every "
        "backward op gets its own NVTX range and is matched to its forward op"
    )
    if not any_marker:
        if not ctx.data.has_ranges_or_gpu():
            return []
        return [
            finding(
                "emit_nvtx_detector",
                "warning",
                f"No PyTorch op markers in this PyTorch profile: GPU work cannot be attributed to PyTorch ops{said}",
                recommendation + " (or use dlprof_profiler.pytorch.init())",
                link,
                {"emit_nvtx": emit, "backward_lumped": False},
            )
        ]
    if ops is None or len(ops) == 0 or "kind" not in ops.columns:
        return []
    lumped = ops[(ops["kind"].to_numpy() == BACKWARD_PASS)]
    if lumped.empty:
        return []
    gpu = int(lumped["gpu_total"].sum())
    total = int(ops["gpu_total"].sum())
    share = 100.0 * gpu / total if total else 0.0
    calls = int(lumped["calls"].sum())
    problem = (
        f"The backward pass appears as an undivided 'backward' op ({calls} call{'s' if calls > 1 else ''}, "
        f"{fmt_time(gpu)} GPU time, {fmt_pct(share)} of the ops' GPU time): PyTorch's emit_nvtx was not "
        f"enabled{said}"
    )
    return [
        finding(
            "emit_nvtx_detector",
            "warning",
            problem,
            recommendation,
            link,
            {"emit_nvtx": emit, "backward_lumped": True, "backward_gpu_time": gpu, "share_pct": share},
        )
    ]


def batch_size_detector(ctx: Context) -> list[dict]:
    """Inputs: peak GPU memory used (model_config max_memory_reserved, else max_memory_allocated), the GPU's
    memory (model_config gpu_total_memory, else TARGET_INFO_GPU totalMemory of the GPU used), batch_size.
    Threshold: peak use < MEMORY_UNDERUSE_PCT (50%) of the memory. Proposes the largest power-of-two factor
    K with K x peak <= memory."""
    if int((ctx.agg.summary or {}).get("n_visible_gpus", 0)) == 0 and not ctx.data.has_gpu_work():
        return []  # no GPU ran anything: no GPU advice
    used = ctx.cfg(*PEAK_MEMORY_KEYS)
    total = ctx.cfg("gpu_total_memory")
    if total is None:
        total = _device_memory(ctx)
    missing = []
    if used is None:
        missing.append("peak GPU memory use (model_config max_memory_reserved / max_memory_allocated)")
    if total is None:
        missing.append("GPU memory size (model_config gpu_total_memory, TARGET_INFO_GPU)")
    if missing:
        if ctx.is_pytorch or ctx.config:
            ctx.unknown("batch_size_detector", " and ".join(missing))
        return []
    try:
        used, total = float(used), float(total)
    except (TypeError, ValueError):
        return []
    if used <= 0 or total <= 0:
        return []
    pct = 100.0 * used / total
    if pct >= MEMORY_UNDERUSE_PCT:
        return []
    factor = 2 ** int(math.floor(math.log2(total / used)))
    batch = ctx.cfg("batch_size")
    problem = (
        f"GPU Memory is underutilized: Only {pct:.1f}% of GPU Memory is used "
        f"(peak {fmt_bytes(used)} of {fmt_bytes(total)}" + (f", batch size {batch})" if batch is not None else ")")
    )
    recommendation = f"Try increasing batch size by {factor}x to increase data throughput"
    if batch is not None:
        try:
            recommendation += f" (batch size {int(batch) * factor} instead of {int(batch)})"
        except (TypeError, ValueError):
            pass
    recommendation += "; scale the learning rate with the batch size"
    return [
        finding(
            "batch_size_detector",
            "info",
            problem,
            recommendation,
            TUNING_GUIDE,
            {"memory_used": used, "memory_total": total, "used_pct": pct, "factor": factor, "batch_size": batch},
        )
    ]


def _device_memory(ctx: Context):
    devices = ctx.trace.devices
    if len(devices) == 0 or "total_memory" not in devices.columns:
        return None
    mem = devices[["device_id", "total_memory"]].dropna()
    if mem.empty:
        return None
    used_devices = set(ctx.corr.process_device.values()) if ctx.corr.process_device else set()
    chosen = mem[mem["device_id"].isin(used_devices)] if used_devices else mem
    chosen = chosen if len(chosen) else mem
    value = chosen["total_memory"].min()
    return None if value is None or int(value) <= 0 else int(value)
