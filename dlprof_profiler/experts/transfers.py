"""CUDA API rules of Nsight Systems' expert system that matter for training: asynchronous copies from
pageable memory, synchronous memcpy/memset, explicit synchronizations blocking the host."""
from __future__ import annotations

import re

import numpy as np
import pandas as pd

from dlprof_profiler.experts.base import (TUNING_GUIDE, Context, counted, finding, fmt_bytes, fmt_pct, fmt_time)
from dlprof_profiler.trace import KIND_MEMCPY, KIND_MEMSET

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
SYNC_APIS = {"cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "cudaThreadSynchronize",
             "cuCtxSynchronize", "cuStreamSynchronize", "cuEventSynchronize"}
_MEM_API = re.compile(r"^cu(?:da)?Mem(?:cpy|set)")

PINNED_LINK = "https://pytorch.org/docs/stable/notes/cuda.html#use-pinned-memory-buffers"
NSYS_GUIDE = "https://docs.nvidia.com/nsight-systems/UserGuide/index.html"


def _memory_ops(ctx: Context) -> tuple[np.ndarray, np.ndarray]:
    """(rows of memcpy/memset activities in the aggregation, their launching API rows)."""
    gpu = ctx.trace.gpu
    if len(gpu) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    kind = gpu["kind"].to_numpy()
    rows = np.flatnonzero(((kind == KIND_MEMCPY) | (kind == KIND_MEMSET)) & ctx.act_in)
    return rows, ctx.corr.gpu_api[rows]


def _host_time(ctx: Context, api_rows: np.ndarray) -> int:
    api_rows = np.unique(api_rows[api_rows >= 0])
    if api_rows.size == 0:
        return 0
    api = ctx.trace.api_calls
    return int((api["end"].to_numpy(np.int64) - api["start"].to_numpy(np.int64))[api_rows].sum())


def _by_name(names: np.ndarray) -> list[tuple[str, int]]:
    counts = pd.Series(names[names != ""]).value_counts(sort=True)
    return [(str(k), int(v)) for k, v in counts.items()]


def pageable_memcpy_detector(ctx: Context) -> list[dict]:
    """Inputs: memcpy activities in the aggregation (copy kind, source/destination memory kinds, bytes,
    duration) and the names of their API calls. Fires on asynchronous copies (API name with `Async`) whose
    host side is pageable memory: the driver stages them and they block the host."""
    rows, api_rows = _memory_ops(ctx)
    gpu = ctx.trace.gpu
    if rows.size == 0:
        return []
    is_copy = gpu["kind"].to_numpy()[rows] == KIND_MEMCPY
    names = ctx.api_base(api_rows)
    is_async = np.array(["Async" in n for n in names], dtype=bool) & is_copy
    if not is_async.any():
        return []
    src = gpu["src_kind"].to_numpy(np.int64)[rows]
    dst = gpu["dst_kind"].to_numpy(np.int64)[rows]
    pageable = is_async & ((src == MEM_PAGEABLE) | (dst == MEM_PAGEABLE))
    unknown = is_async & ((src < 0) & (dst < 0))
    if not pageable.any():
        if unknown.any():
            ctx.unknown("pageable_memcpy_detector", f"the host memory kind of {int(unknown.sum())} asynchronous "
                                                    "memcpy(s) (no srcKind/dstKind in the export)")
        return []
    sel = rows[pageable]
    n = int(sel.size)
    nbytes = int(np.clip(gpu["bytes"].to_numpy(np.int64)[sel], 0, None).sum())
    gpu_time = int((gpu["end"].to_numpy(np.int64) - gpu["start"].to_numpy(np.int64))[sel].sum())
    host = _host_time(ctx, api_rows[pageable])
    copy_kind = gpu["copy_kind"].to_numpy(np.int64)[sel]
    kinds = pd.Series(copy_kind).value_counts()
    kinds_text = ", ".join(f"{int(v)} {COPY_NAMES.get(int(k), 'other')}" for k, v in kinds.items())
    apis = _by_name(names[pageable])
    ops = ctx.top_ops_of_gpu(sel)
    problem = (f"{n} asynchronous memcpy operation{'s' if n > 1 else ''} ({counted(apis)}) used pageable host "
               f"memory: {fmt_bytes(nbytes)}, {fmt_time(gpu_time)} on the GPU and {fmt_time(host)} in the calls "
               f"({kinds_text})" + (f"; launched from {counted(ops)}" if ops else "")
               + ". Copies from pageable memory are staged by the driver and do not overlap with the host")
    recommendation = ("Copy from pinned (page-locked) host memory: DataLoader(pin_memory=True) or "
                      "tensor.pin_memory(), then .to(device, non_blocking=True); in CUDA code allocate host "
                      "buffers with cudaMallocHost or cudaHostAlloc")
    pin = ctx.cfg_bool("pin_memory")
    if pin is False:
        recommendation += " (this run's DataLoader has pin_memory=False)"
    share = 100.0 * host / ctx.wall if ctx.wall else 0.0
    return [finding("pageable_memcpy_detector", "warning" if share >= HOST_WARNING_PCT else "info", problem,
                    recommendation, PINNED_LINK,
                    {"count": n, "bytes": nbytes, "gpu_time": gpu_time, "host_time": host, "host_pct": share,
                     "copy_kinds": {COPY_NAMES.get(int(k), str(int(k))): int(v) for k, v in kinds.items()},
                     "apis": dict(apis), "ops": dict(ops)})]


def sync_memcpy_detector(ctx: Context) -> list[dict]:
    """Inputs: memcpy/memset activities in the aggregation and their API calls. Fires on copies launched by
    synchronous APIs (cudaMemcpy*, cuMemcpy* without `Async`; device-to-device copies excepted: they do not
    block the host) and on memsets from synchronous APIs whose call returned only after the memset ended."""
    rows, api_rows = _memory_ops(ctx)
    gpu = ctx.trace.gpu
    if rows.size == 0:
        return []
    names = ctx.api_base(api_rows)
    sync_api = np.array([bool(_MEM_API.match(n)) and "Async" not in n for n in names], dtype=bool)
    kind = gpu["kind"].to_numpy()[rows]
    copy_kind = gpu["copy_kind"].to_numpy(np.int64)[rows]
    api = ctx.trace.api_calls
    api_end = np.where(api_rows >= 0, api["end"].to_numpy(np.int64)[np.maximum(api_rows, 0)] if len(api) else 0, -1)
    gpu_end = gpu["end"].to_numpy(np.int64)[rows]
    is_copy = sync_api & (kind == KIND_MEMCPY) & (copy_kind != COPY_DTOD)
    is_set = sync_api & (kind == KIND_MEMSET) & (api_end >= gpu_end)
    hit = is_copy | is_set
    if not hit.any():
        return []
    sel = rows[hit]
    host = _host_time(ctx, api_rows[hit])
    gpu_time = int((gpu["end"].to_numpy(np.int64) - gpu["start"].to_numpy(np.int64))[sel].sum())
    n_copy, n_set = int(is_copy.sum()), int(is_set.sum())
    what = " and ".join(x for x in (f"{n_copy} memcpy" if n_copy else "", f"{n_set} memset" if n_set else "") if x)
    apis = _by_name(names[hit])
    ops = ctx.top_ops_of_gpu(sel)
    share = 100.0 * host / ctx.wall if ctx.wall else 0.0
    problem = (f"{what} operations ran synchronously with the host ({counted(apis)}): the calls blocked the host "
               f"for {fmt_time(host)} ({fmt_pct(share)} of the wall clock time) for {fmt_time(gpu_time)} of GPU work"
               + (f"; launched from {counted(ops)}" if ops else ""))
    recommendation = ("Use the asynchronous versions (cudaMemcpyAsync, cudaMemsetAsync) on a stream with pinned "
                      "host memory and synchronize only where the result is needed; in PyTorch copy with "
                      ".to(device, non_blocking=True) from pinned memory")
    return [finding("sync_memcpy_detector", "warning" if share >= HOST_WARNING_PCT else "info", problem,
                    recommendation, NSYS_GUIDE,
                    {"memcpy": n_copy, "memset": n_set, "host_time": host, "host_pct": share, "gpu_time": gpu_time,
                     "apis": dict(apis), "ops": dict(ops)})]


def sync_api_detector(ctx: Context) -> list[dict]:
    """Inputs: CUDA API calls in the aggregation named cudaDeviceSynchronize, cudaStreamSynchronize,
    cudaEventSynchronize (and driver equivalents), their threads and durations; GPU busy intervals of the
    calling threads' GPUs. Threshold: blocked time >= SYNC_BLOCKED_PCT (1%) of wall clock time x calling
    threads. Also reports how long the GPU stayed idle after the calls returned (the queue they drained)."""
    api = ctx.trace.api_calls
    if len(api) == 0 or ctx.wall <= 0:
        return []
    hit = ctx.api_rows_matching(lambda n: n in SYNC_APIS) & ctx.api_in
    rows = np.flatnonzero(hit)
    if rows.size == 0:
        return []
    start = api["start"].to_numpy(np.int64)[rows]
    end = api["end"].to_numpy(np.int64)[rows]
    dur = end - start
    tids = api["global_tid"].to_numpy(np.int64)[rows]
    n_threads = int(np.unique(tids).size)
    blocked = int(dur.sum())
    share = 100.0 * blocked / (ctx.wall * n_threads)
    if share < SYNC_BLOCKED_PCT:
        return []
    devices = ctx.device_of_threads(tids, api["pid"].to_numpy(np.int64)[rows])
    idle_after = _idle_after(ctx, end, devices)
    idle_pct = 100.0 * idle_after / ctx.wall
    names = ctx.api_base(rows)
    per_api = pd.DataFrame({"n": names, "d": dur}).groupby("n").agg(calls=("d", "size"), time=("d", "sum"))
    per_api = per_api.sort_values("time", ascending=False)
    api_text = ", ".join(f"{k} ({int(r.calls)} calls, {fmt_time(r.time)})" for k, r in per_api.head(3).iterrows())
    ops = ctx.top_ops_of_api(rows, dur)
    ops_text = ", ".join(f"{name} ({fmt_time(t)})" for name, t in ops)
    problem = (f"Explicit synchronizations blocked the host for {fmt_time(blocked)}, {fmt_pct(share)} of the "
               + (f"{n_threads} calling threads' time" if n_threads > 1 else "calling thread's time") + f": {api_text}"
               + (f"; called from {ops_text}" if ops_text else "")
               + f". After they returned the GPU stayed idle for {fmt_time(idle_after)} ({fmt_pct(idle_pct)} of the "
               "wall clock time) until new work arrived")
    if ctx.is_pytorch or ctx.corr.family is None:
        recommendation = ("Remove synchronizations from the training loop: torch.cuda.synchronize(), tensor.item(), "
                          ".cpu(), .numpy(), print(tensor) and Python conditions on GPU tensors wait for the GPU. "
                          "Read such values every N iterations, or copy them with non_blocking=True into pinned "
                          "memory and wait on a CUDA event only when they are needed")
    else:
        recommendation = ("Remove synchronizations from the training loop: fetch values from the GPU every N steps "
                          "only, and let the framework's asynchronous execution keep the GPU queue full")
    return [finding("sync_api_detector", "warning" if idle_pct >= HOST_WARNING_PCT else "info", problem,
                    recommendation, TUNING_GUIDE + "#avoid-unnecessary-cpu-gpu-synchronization",
                    {"calls": int(rows.size), "blocked_time": blocked, "blocked_pct": share, "threads": n_threads,
                     "gpu_idle_after": idle_after, "gpu_idle_after_pct": idle_pct,
                     "apis": {k: int(r.time) for k, r in per_api.iterrows()}, "ops": dict(ops)})]


def _idle_after(ctx: Context, times: np.ndarray, devices: np.ndarray) -> int:
    """GPU idle time from each time until the next busy interval on its device (0 when busy then; nothing
    after the device's last activity), each idle interval counted once."""
    total = 0
    for d in np.unique(devices).tolist():
        seg = ctx.busy_segments.get(int(d))
        if seg is None or seg[0].size == 0:
            continue
        s, e = seg
        t = times[devices == d]
        i = np.searchsorted(s, t, side="right") - 1        # last segment starting at or before t
        busy = (i >= 0) & (e[np.maximum(i, 0)] > t)
        nxt = i + 1
        has_next = nxt < s.size
        idle = ~busy & has_next
        if not idle.any():
            continue
        # several calls returning in the same idle interval count it once, from the earliest of them
        gap = np.zeros(s.size, dtype=np.int64)
        np.maximum.at(gap, nxt[idle], s[nxt[idle]] - t[idle])
        total += int(gap.sum())
    return total
