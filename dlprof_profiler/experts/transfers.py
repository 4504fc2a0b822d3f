"""CUDA API rules of Nsight Systems' expert system that matter for training: asynchronous copies from
pageable memory, synchronous memcpy/memset, explicit synchronizations blocking the host."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from dlprof_profiler.experts.base import TUNING_GUIDE, Context, counted, finding, fmt_bytes, fmt_pct, fmt_time
from dlprof_profiler.engine.trace import KIND_MEMCPY, KIND_MEMSET

MEM_PAGEABLE = 0
COPY_HTOD, COPY_DTOH, COPY_DTOD = 1, 2, 8
COPY_NAMES = {1: "Host-to-Device", 2: "Device-to-Host", 8: "Device-to-Device", 9: "Host-to-Host", 10: "Peer-to-Peer"}

# pageable_memcpy_detector and sync_memcpy_detector: fire on any such operation in the aggregation;
# warning when the host time of their API calls is >= HOST_WARNING_PCT of the wall clock time, else info.
HOST_WARNING_PCT = 1.0
# sync_api_detector: fires when synchronization calls block their threads for >= SYNC_BLOCKED_PCT of the
# threads' time (wall clock time x calling threads); warning when the GPU then stays idle (until new work
# arrives) for >= HOST_WARNING_PCT of the wall clock time, else info.
SYNC_BLOCKED_PCT = 1.0
SYNC_APIS = {
    "cudaDeviceSynchronize",
    "cudaStreamSynchronize",
    "cudaEventSynchronize",
    "cudaThreadSynchronize",
    "cuCtxSynchronize",
    "cuStreamSynchronize",
    "cuEventSynchronize",
}
_MEM_API = re.compile(r"^cu(?:da)?Mem(?:cpy|set)")

PINNED_LINK = "https://pytorch.org/docs/stable/notes/cuda.html#use-pinned-memory-buffers"
NSYS_GUIDE = "https://docs.nvidia.com/nsight-systems/UserGuide/index.html"


def _host_time(ops: pd.DataFrame) -> int:
    """Summed duration of the distinct API calls that launched some memory operations."""
    calls = ops[ops["api_id"] >= 0].drop_duplicates("api_id")
    return int((calls["api_end"] - calls["api_start"]).sum())


def _by_name(names: np.ndarray) -> list[tuple[str, int]]:
    counts = pd.Series(names[names != ""]).value_counts(sort=True)
    return [(str(k), int(v)) for k, v in counts.items()]


def pageable_memcpy_detector(ctx: Context) -> list[dict]:
    """Inputs: memcpy activities in the aggregation (copy kind, source/destination memory kinds, bytes,
    duration) and the names of their API calls. Fires on asynchronous copies (API name with `Async`) whose
    host side is pageable memory: the driver stages them and they block the host."""
    ops_frame = ctx.data.memory_ops()
    if len(ops_frame) == 0:
        return []
    is_copy = ops_frame["kind"].to_numpy() == KIND_MEMCPY
    names = ops_frame["api_name"].to_numpy(dtype=object)
    is_async = np.array(["Async" in str(n) for n in names], dtype=bool) & is_copy
    if not is_async.any():
        return []
    src = ops_frame["src_kind"].to_numpy(np.int64)
    dst = ops_frame["dst_kind"].to_numpy(np.int64)
    pageable = is_async & ((src == MEM_PAGEABLE) | (dst == MEM_PAGEABLE))
    unknown = is_async & ((src < 0) & (dst < 0))
    if not pageable.any():
        if unknown.any():
            ctx.unknown(
                "pageable_memcpy_detector",
                f"the host memory kind of {int(unknown.sum())} asynchronous "
                "memcpy(s) (no srcKind/dstKind in the export)",
            )
        return []
    sel = ops_frame[pageable]
    n = int(len(sel))
    nbytes = int(np.clip(sel["bytes"].to_numpy(np.int64), 0, None).sum())
    gpu_time = int((sel["end"] - sel["start"]).sum())
    host = _host_time(sel)
    kinds = pd.Series(sel["copy_kind"].to_numpy(np.int64)).value_counts()
    kinds_text = ", ".join(f"{int(v)} {COPY_NAMES.get(int(k), 'other')}" for k, v in kinds.items())
    apis = _by_name(names[pageable])
    ops = ctx.top_ops(sel["owner_op"].to_numpy(np.int64))
    problem = (
        f"{n} asynchronous memcpy operation{'s' if n > 1 else ''} ({counted(apis)}) used pageable host "
        f"memory: {fmt_bytes(nbytes)}, {fmt_time(gpu_time)} on the GPU and {fmt_time(host)} in the calls "
        f"({kinds_text})"
        + (f"; launched from {counted(ops)}" if ops else "")
        + ". Copies from pageable memory are staged by the driver and do not overlap with the host"
    )
    recommendation = (
        "Copy from pinned (page-locked) host memory: DataLoader(pin_memory=True) or "
        "tensor.pin_memory(), then .to(device, non_blocking=True); in CUDA code allocate host "
        "buffers with cudaMallocHost or cudaHostAlloc"
    )
    pin = ctx.cfg_bool("pin_memory")
    if pin is False:
        recommendation += " (this run's DataLoader has pin_memory=False)"
    share = 100.0 * host / ctx.wall if ctx.wall else 0.0
    return [
        finding(
            "pageable_memcpy_detector",
            "warning" if share >= HOST_WARNING_PCT else "info",
            problem,
            recommendation,
            PINNED_LINK,
            {
                "count": n,
                "bytes": nbytes,
                "gpu_time": gpu_time,
                "host_time": host,
                "host_pct": share,
                "copy_kinds": {COPY_NAMES.get(int(k), str(int(k))): int(v) for k, v in kinds.items()},
                "apis": dict(apis),
                "ops": dict(ops),
            },
        )
    ]


def sync_memcpy_detector(ctx: Context) -> list[dict]:
    """Inputs: memcpy/memset activities in the aggregation and their API calls. Fires on copies launched by
    synchronous APIs (cudaMemcpy*, cuMemcpy* without `Async`; device-to-device copies excepted: they do not
    block the host) and on memsets from synchronous APIs whose call returned only after the memset ended."""
    ops_frame = ctx.data.memory_ops()
    if len(ops_frame) == 0:
        return []
    names = ops_frame["api_name"].to_numpy(dtype=object)
    sync_api = np.array([bool(_MEM_API.match(str(n))) and "Async" not in str(n) for n in names], dtype=bool)
    kind = ops_frame["kind"].to_numpy()
    copy_kind = ops_frame["copy_kind"].to_numpy(np.int64)
    api_end = ops_frame["api_end"].to_numpy(np.int64)
    gpu_end = ops_frame["end"].to_numpy(np.int64)
    is_copy = sync_api & (kind == KIND_MEMCPY) & (copy_kind != COPY_DTOD)
    is_set = sync_api & (kind == KIND_MEMSET) & (api_end >= gpu_end)
    hit = is_copy | is_set
    if not hit.any():
        return []
    sel = ops_frame[hit]
    host = _host_time(sel)
    gpu_time = int((sel["end"] - sel["start"]).sum())
    n_copy, n_set = int(is_copy.sum()), int(is_set.sum())
    what = " and ".join(x for x in (f"{n_copy} memcpy" if n_copy else "", f"{n_set} memset" if n_set else "") if x)
    apis = _by_name(names[hit])
    ops = ctx.top_ops(sel["owner_op"].to_numpy(np.int64))
    share = 100.0 * host / ctx.wall if ctx.wall else 0.0
    problem = (
        f"{what} operations ran synchronously with the host ({counted(apis)}): the calls blocked the host "
        f"for {fmt_time(host)} ({fmt_pct(share)} of the wall clock time) for {fmt_time(gpu_time)} of GPU work"
        + (f"; launched from {counted(ops)}" if ops else "")
    )
    recommendation = (
        "Use the asynchronous versions (cudaMemcpyAsync, cudaMemsetAsync) on a stream with pinned "
        "host memory and synchronize only where the result is needed; in PyTorch copy with "
        ".to(device, non_blocking=True) from pinned memory"
    )
    return [
        finding(
            "sync_memcpy_detector",
            "warning" if share >= HOST_WARNING_PCT else "info",
            problem,
            recommendation,
            NSYS_GUIDE,
            {
                "memcpy": n_copy,
                "memset": n_set,
                "host_time": host,
                "host_pct": share,
                "gpu_time": gpu_time,
                "apis": dict(apis),
                "ops": dict(ops),
            },
        )
    ]


def sync_api_detector(ctx: Context) -> list[dict]:
    """Inputs: CUDA API calls in the aggregation named cudaDeviceSynchronize, cudaStreamSynchronize,
    cudaEventSynchronize (and driver equivalents), their threads and durations; GPU busy intervals of the
    calling threads' GPUs. Threshold: blocked time >= SYNC_BLOCKED_PCT (1%) of wall clock time x calling
    threads. Also reports how long the GPU stayed idle after the calls returned (the queue they drained)."""
    if ctx.wall <= 0:
        return []
    calls = ctx.data.named_api_calls(SYNC_APIS)
    if len(calls) == 0:
        return []
    start = calls["start"].to_numpy(np.int64)
    end = calls["end"].to_numpy(np.int64)
    dur = end - start
    tids = calls["global_tid"].to_numpy(np.int64)
    n_threads = int(np.unique(tids).size)
    blocked = int(dur.sum())
    share = 100.0 * blocked / (ctx.wall * n_threads)
    if share < SYNC_BLOCKED_PCT:
        return []
    devices = ctx.device_of_threads(tids, calls["pid"].to_numpy(np.int64))
    idle_after = ctx.data.idle_after(end, devices)
    idle_pct = 100.0 * idle_after / ctx.wall
    names = calls["name"].to_numpy(dtype=object)
    per_api = pd.DataFrame({"n": names, "d": dur}).groupby("n").agg(calls=("d", "size"), time=("d", "sum"))
    per_api = per_api.sort_values("time", ascending=False)
    api_text = ", ".join(f"{k} ({int(r.calls)} calls, {fmt_time(r.time)})" for k, r in per_api.head(3).iterrows())
    ops = ctx.top_ops(calls["owner_op"].to_numpy(np.int64), dur)
    ops_text = ", ".join(f"{name} ({fmt_time(t)})" for name, t in ops)
    problem = (
        f"Explicit synchronizations blocked the host for {fmt_time(blocked)}, {fmt_pct(share)} of the "
        + (f"{n_threads} calling threads' time" if n_threads > 1 else "calling thread's time")
        + f": {api_text}"
        + (f"; called from {ops_text}" if ops_text else "")
        + f". After they returned the GPU stayed idle for {fmt_time(idle_after)} ({fmt_pct(idle_pct)} of the "
        "wall clock time) until new work arrived"
    )
    if ctx.is_pytorch or ctx.corr.family is None:
        recommendation = (
            "Remove synchronizations from the training loop: torch.cuda.synchronize(), tensor.item(), "
            ".cpu(), .numpy(), print(tensor) and Python conditions on GPU tensors wait for the GPU. "
            "Read such values every N iterations, or copy them with non_blocking=True into pinned "
            "memory and wait on a CUDA event only when they are needed"
        )
    else:
        recommendation = (
            "Remove synchronizations from the training loop: fetch values from the GPU every N steps "
            "only, and let the framework's asynchronous execution keep the GPU queue full"
        )
    return [
        finding(
            "sync_api_detector",
            "warning" if idle_pct >= HOST_WARNING_PCT else "info",
            problem,
            recommendation,
            TUNING_GUIDE + "#avoid-unnecessary-cpu-gpu-synchronization",
            {
                "calls": int(len(calls)),
                "blocked_time": blocked,
                "blocked_pct": share,
                "threads": n_threads,
                "gpu_idle_after": idle_after,
                "gpu_idle_after_pct": idle_pct,
                "apis": {k: int(r.time) for k, r in per_api.iterrows()},
                "ops": dict(ops),
            },
        )
    ]
