"""Where the time goes: underutilized or unused GPUs, imbalanced GPUs, data loading, unfused elementwise
kernels. Inputs are the aggregation's time breakdown (summary and per-GPU class times) and kernel launches."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from dlprof_profiler.contract import DATALOADER_PCT, GPU_UTILIZATION_PCT
from dlprof_profiler.experts.base import DLPROF_GUIDE, Context, finding, fmt_pct, fmt_time, short

# underutilized_gpu_detector: GPU utilization below GPU_UTILIZATION_PCT (contract.py, shared with the viewer).

# imbalanced_gpus_detector: among GPUs with work, the least busy one is busy less than (1 - IMBALANCE) x
# the busiest, and the difference is at least IMBALANCE_MIN_WALL_PCT of the wall clock time.
IMBALANCE = 0.20
IMBALANCE_MIN_WALL_PCT = 1.0

# dataloader_detector: data loading while every GPU class is idle (the summary's Dataloader Duration %) from
# DATALOADER_PCT (contract.py).

# no_fusion_detector: unfused elementwise/normalization kernels take >= FUSION_SHARE_PCT of the kernel time,
# with >= FUSION_MIN_PER_ITERATION such launches per aggregated iteration.
FUSION_SHARE_PCT = 30.0
FUSION_MIN_PER_ITERATION = 20
ELEMENTWISE_KERNEL = re.compile(
    r"elementwise|pointwise|reduce_kernel|EigenMetaKernel|batch_norm|layer_norm|"
    r"softmax|dropout",
    re.IGNORECASE,
)
FUSED_KERNEL = re.compile(r"triton|nvfuser|CudaCodeGen|fusion|multi_tensor_apply|jit_", re.IGNORECASE)

CLASS_LABELS = {"dataloader": "Dataloader", "io": "IO", "cpu": "CPU", "other": "Other"}
_CLASS_ADVICE = {
    "cpu": "Consider swapping ops that are running on the CPU for equivalent GPU ops",
    "dataloader": "Consider speeding up data loading: more DataLoader workers, pinned memory, or NVIDIA DALI",
    "io": "Consider faster storage, caching the dataset in memory, and reading it in background workers",
    "other": "The GPU waits while no profiled op, data loading or I/O runs: see the GPU gaps for the host "
    "activity in that time, and annotate the host code outside the profiled ranges with NVTX",
}


def underutilized_gpu_detector(ctx: Context) -> list[dict]:
    """Inputs: summary GPU utilization and non-GPU class shares; per-GPU busy time; the world size the trace
    records. Fires for GPUs with no work while others have some (unused GPU; not for one rank of a distributed
    job, whose machine's other GPUs run the other ranks), and when GPU utilization < GPU_UTILIZATION_PCT (50%)."""
    summary = ctx.agg.summary or {}
    n_gpus = int(summary.get("n_visible_gpus", 0))
    if n_gpus == 0:
        return []  # no GPU ran anything: no GPU advice
    out = []
    devices = ctx.agg.devices
    if devices is not None and len(devices) > 1 and not one_rank_of_several(ctx):
        busy = (devices["tc_time"] + devices["non_tc_time"] + devices["memory_time"]).to_numpy(np.int64)
        ids = devices["device_id"].to_numpy(np.int64)
        unused = ids[busy == 0]
        if unused.size and (busy > 0).any():
            labels = ", ".join(ctx.device_label(int(d)) for d in unused)
            out.append(
                finding(
                    "underutilized_gpu_detector",
                    "warning",
                    f"{labels} ran no kernel or memory operation in the aggregated iterations while "
                    f"{int((busy > 0).sum())} other GPU{'s' if (busy > 0).sum() > 1 else ''} did",
                    "Use every GPU you reserve: launch one data-parallel process per GPU (torchrun "
                    "--nproc_per_node, DistributedDataParallel), or make only the GPUs you use visible "
                    "(CUDA_VISIBLE_DEVICES)",
                    "https://pytorch.org/docs/stable/notes/ddp.html",
                    {"kind": "unused", "unused_devices": unused.tolist(), "busy_devices": ids[busy > 0].tolist()},
                )
            )
    util = float(summary.get("gpu_utilization", 0.0))
    if util < GPU_UTILIZATION_PCT:
        split = idle_split(ctx)
        pct = summary.get("pct", {})
        cls = max(CLASS_LABELS, key=lambda c: float(pct.get(c, 0.0)))
        share = float(pct.get(cls, 0.0))
        out.append(
            finding(
                "underutilized_gpu_detector",
                "warning",
                f"The GPU is underutilized: Only {util:.1f}% of the profiled time is spent on GPU kernel operations",
                f"{CLASS_LABELS[cls]} has the highest (non-GPU) usage at {share:.1f}%. {_CLASS_ADVICE[cls]}"
                + idle_split_text(split),
                DLPROF_GUIDE,
                {
                    "kind": "low_utilization",
                    "gpu_utilization": util,
                    "threshold_pct": GPU_UTILIZATION_PCT,
                    "top_class": cls,
                    "top_class_pct": share,
                    "class_pct": {k: float(v) for k, v in pct.items()},
                    "idle_split": split,
                },
            )
        )
    return out


def idle_split(ctx: Context) -> dict:
    """The GPUs' idle time split (engine/breakdowns.py), summed over the GPUs used: host_wait, kernel_wait,
    other_wait in ns (empty without them)."""
    gb = getattr(ctx.agg, "gpu_breakdowns", None)
    if not gb or not len(gb["gpus"]):
        return {}
    used = ctx.agg.devices.loc[ctx.agg.devices["used"], "device_id"]
    gpus = gb["gpus"][gb["gpus"]["device_id"].isin(used)]
    return {c: int(gpus[c].sum()) for c in ("host_wait", "kernel_wait", "other_wait")}


def idle_split_text(split: dict) -> str:
    """What the idle GPUs waited for, as shares of their idle time ('' without it)."""
    total = sum(split.values())
    if not total:
        return ""
    share = {k: 100.0 * v / total for k, v in split.items()}
    return (
        f" Of the GPUs' idle time, {fmt_pct(share['host_wait'])} waited for the host to launch work (host wait), "
        f"{fmt_pct(share['kernel_wait'])} for launched work to start (kernel wait), {fmt_pct(share['other_wait'])} "
        "other: a high host wait means the CPU is the bottleneck (see the gpu_breakdown report)."
    )


def one_rank_of_several(ctx: Context) -> bool:
    """Whether the profile records a world size above 1 (Kineto's distributedInfo): it is one process of a
    distributed job, and the GPUs it did not use may be the other ranks'."""
    try:
        return int(ctx.trace.meta.get("distributed_world_size") or 0) > 1
    except (TypeError, ValueError):
        return False


def imbalanced_gpus_detector(ctx: Context) -> list[dict]:
    """Inputs: per-GPU busy time (TC + non-TC kernels + memory operations) in the aggregation window.
    Threshold: among GPUs with work, min busy < (1 - IMBALANCE) x max busy (20%) and max - min >=
    IMBALANCE_MIN_WALL_PCT (1%) of the wall clock time."""
    devices = ctx.agg.devices
    if devices is None or len(devices) < 2 or ctx.wall <= 0:
        return []
    busy = (devices["tc_time"] + devices["non_tc_time"] + devices["memory_time"]).to_numpy(np.int64)
    ids = devices["device_id"].to_numpy(np.int64)
    used = busy > 0
    if used.sum() < 2:
        return []
    b, d = busy[used], ids[used]
    hi, lo = int(b.max()), int(b.min())
    if lo >= (1.0 - IMBALANCE) * hi or 100.0 * (hi - lo) / ctx.wall < IMBALANCE_MIN_WALL_PCT:
        return []
    hi_dev, lo_dev = int(d[np.argmax(b)]), int(d[np.argmin(b)])
    per = {int(x): 100.0 * int(y) / ctx.wall for x, y in zip(d, b)}
    gap = 100.0 * (hi - lo) / hi
    problem = (
        f"GPU work is imbalanced across {int(used.sum())} GPUs: GPU {lo_dev} is busy {fmt_pct(per[lo_dev])} of "
        f"the time and GPU {hi_dev} {fmt_pct(per[hi_dev])} ({fmt_time(hi - lo)}, {gap:.1f}% less work on the "
        "least busy GPU)"
    )
    recommendation = (
        "Give every GPU the same work: one DistributedDataParallel process per GPU with equal batch "
        "sizes and data shards (nn.DataParallel runs the loss and the optimizer on GPU 0), and move "
        "work done only by one rank (logging, evaluation, checkpointing) out of the training loop"
    )
    return [
        finding(
            "imbalanced_gpus_detector",
            "warning",
            problem,
            recommendation,
            "https://pytorch.org/docs/stable/notes/cuda.html#use-nn-parallel-distributeddataparallel-instead-"
            "of-multiprocessing-or-nn-dataparallel",
            {"busy_pct": per, "min_device": lo_dev, "max_device": hi_dev, "imbalance_pct": gap},
        )
    ]


def _dali_used(ctx: Context) -> bool:
    labels = ctx.range_labels
    if len(labels) == 0:
        return False
    if any(str(d).upper().startswith("DALI") for d in pd.unique(labels["domain"].to_numpy(dtype=object))):
        return True
    loader = labels[labels["dataloader"].to_numpy(dtype=bool)]
    return any(str(label).upper().startswith("DALI") for label in loader["label"])


def dataloader_detector(ctx: Context) -> list[dict]:
    """Inputs: summary Dataloader Duration % (data loading ranges active while no GPU class is), DALI ranges,
    run metadata num_workers and pin_memory. As DLProf did, a profile with GPU work and no DALI gets "No DALI
    ops detected" (info); a warning with the figures when data loading takes >= DATALOADER_PCT (10%) of the
    wall clock time (with DALI too)."""
    summary = ctx.agg.summary or {}
    if int(summary.get("n_visible_gpus", 0)) == 0:
        return []  # no GPU ran anything: data loading cannot starve it
    pct = float(summary.get("pct", {}).get("dataloader", 0.0))
    slow = pct >= DATALOADER_PCT
    figures = f"data loading takes {pct:.1f}% of the profiled time while the GPU is idle"
    data = {"dataloader_pct": pct, "threshold_pct": DATALOADER_PCT}
    if _dali_used(ctx):
        if not slow:
            return []
        return [
            finding(
                "dataloader_detector",
                "warning",
                f"DALI is used, but {figures}",
                "Move more of the input pipeline to the GPU (DALI GPU operators, mixed image decoding), "
                "and raise the pipeline's num_threads and prefetch_queue_depth",
                "https://docs.nvidia.com/deeplearning/dali/user-guide/docs/index.html",
                dict(data, dali=True),
            )
        ]
    recommendation = (
        "Consider using NVIDIA DALI, a library that is a high performance alternative to built-in "
        "data loaders and data iterators. Learn more here: https://developer.nvidia.com/DALI"
    )
    workers, pin = ctx.cfg("num_workers"), ctx.cfg_bool("pin_memory")
    if slow and workers is not None and int(workers) == 0:
        recommendation += (
            ". The PyTorch DataLoader loads in the training process (num_workers=0): give it "
            "worker processes (num_workers > 0)"
        )
    if slow and pin is False:
        recommendation += ". Set pin_memory=True so batches are copied to the GPU asynchronously"
    problem = (
        f"No DALI ops detected; {figures}"
        if slow
        else f"No DALI ops detected (data loading takes {pct:.1f}% of the profiled time while the GPU is idle)"
    )
    return [
        finding(
            "dataloader_detector",
            "warning" if slow else "info",
            problem,
            recommendation,
            "https://developer.nvidia.com/DALI",
            dict(data, dali=False, num_workers=workers, pin_memory=pin),
        )
    ]


def no_fusion_detector(ctx: Context) -> list[dict]:
    """Inputs: kernel launches of the aggregation (names, durations). Unfused elementwise kernels: names
    matching ELEMENTWISE_KERNEL and not FUSED_KERNEL. Thresholds: >= FUSION_SHARE_PCT (30%) of the kernel
    time and >= FUSION_MIN_PER_ITERATION (20) launches per iteration."""
    k = ctx.kernels
    if len(k) == 0 or ctx.kernel_time == 0:
        return []
    hit = ctx.kernel_name_flags(lambda name: ELEMENTWISE_KERNEL.search(name) and not FUSED_KERNEL.search(name))
    n = int(k["count"].to_numpy(np.int64)[hit].sum())
    if n == 0:
        return []
    time = int(k["gpu_total"].to_numpy(np.int64)[hit].sum())
    share = 100.0 * time / ctx.kernel_time
    per_iteration = n / max(ctx.n_iterations, 1)
    if share < FUSION_SHARE_PCT or per_iteration < FUSION_MIN_PER_ITERATION:
        return []
    by_name = k[hit].groupby("name", sort=False)["gpu_total"].sum()
    top = by_name.sort_values(ascending=False, kind="stable").head(3)
    top_text = ", ".join(f"{short(name, 50)} ({fmt_time(v)})" for name, v in top.items())
    problem = (
        f"{per_iteration:.0f} unfused elementwise kernels per iteration take {fmt_time(time)}, "
        f"{fmt_pct(share)} of the GPU kernel time (average {fmt_time(time / n)} each): {top_text}"
    )
    if ctx.corr.family == "tensorflow":
        recommendation = (
            "Fuse them with XLA: compile the model with jit_compile=True or set TF_XLA_FLAGS=--tf_xla_auto_jit=2"
        )
        link = "https://www.tensorflow.org/xla"
    else:
        recommendation = (
            "Fuse elementwise ops: compile the model with torch.compile, use fused optimizers "
            "(fused=True or foreach=True) and fused layers (e.g. apex or Transformer Engine)"
        )
        link = "https://pytorch.org/docs/stable/generated/torch.compile.html"
    return [
        finding(
            "no_fusion_detector",
            "warning" if share >= 50.0 else "info",
            problem,
            recommendation,
            link,
            {
                "kernels": n,
                "per_iteration": per_iteration,
                "kernel_time": time,
                "share_pct": share,
                "top_kernels": [str(name) for name in top.index],
            },
        )
    ]
