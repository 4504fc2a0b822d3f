"""GPU time breakdowns of one profile (DESIGN.md "GPU time breakdowns"): per GPU and window the busy time of
computation, communication and memory operations, idle time and the communication overlapped by computation;
idle time per GPU and per stream split into host wait, kernel wait and other; launch delay per kernel name.

Every figure is a function of the GPU activities' columns (start, end, device, stream, launch call), fed
time chunk by time chunk in start order (`aggregate.Accumulator`), so the in-memory and out-of-core
analyses compute them by the same functions.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from dlprof_profiler.engine.intervals import covered_length, grouped_cummax, merge_intervals
from dlprof_profiler.engine.trace import KIND_KERNEL, make_frame

# Collective communication kernels (NCCL, RCCL, PyTorch c10d and the collectives' own names)
COMMUNICATION_KERNEL = re.compile(
    r"nccl|rccl|c10d|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|"
    r"broadcast|sendrecv",
    re.IGNORECASE,
)
# busy_split's columns, in order
BUSY = ("computation", "communication", "memory", "gpu", "overlapped_communication")
IDLE_PARTS = ("host_wait", "kernel_wait", "other_wait")
# A stream or GPU key that stands for the whole GPU in idle_gaps (streams are keyed device << 32 | stream)
STREAM_BITS = 32
STREAM_MASK = (1 << STREAM_BITS) - 1


def communication_codes(short_names) -> np.ndarray:
    """Per kernel name code, whether it is a collective; one more entry (False) for activities without one."""
    return np.array([bool(COMMUNICATION_KERNEL.search(str(n))) for n in short_names] + [False], dtype=bool)


def busy_split(start, end, compute, comm, memory, win_s, win_e) -> np.ndarray:
    """Per window (rows), the busy wall time (the union of the intervals, overlaps counted once) of compute
    kernels, communication kernels, memory operations and of any activity, and the part of the communication
    time during which a compute kernel runs too: windows x BUSY, int64. The activities are one GPU's."""
    start = np.asarray(start, dtype=np.int64)
    end = np.asarray(end, dtype=np.int64)

    def flat(mask):
        return covered_length(*merge_intervals(start[mask], end[mask]), win_s, win_e)

    computation, communication, memory_t = flat(compute), flat(comm), flat(memory)
    both = flat(compute | comm)
    busy = flat(np.ones(start.size, dtype=bool))
    return np.stack([computation, communication, memory_t, busy, computation + communication - both], axis=1)


def idle_gaps(keys, start, end, launch, launched, carried: dict, win_s: int, win_e: int):
    """The idle gaps inside [win_s, win_e) that the activities close, per key (a GPU or a stream): each
    activity's gap runs from the latest end of the key's earlier activities (`carried`: that end from earlier
    chunks; the window's start for a key's first activity) to its own start. A gap is host wait until the
    activity's launch call starts, kernel wait after it, other when the activity has no launch call.
    Returns (frame of per-key host_wait, kernel_wait, other_wait sums, updated carried)."""
    keys = np.asarray(keys, dtype=np.int64)
    order = _order_by(keys, np.asarray(start, np.int64))
    k, s, e = keys[order], np.asarray(start, np.int64)[order], np.asarray(end, np.int64)[order]
    lch, has = np.asarray(launch, np.int64)[order], np.asarray(launched, bool)[order]
    first = np.ones(k.size, dtype=bool)
    first[1:] = k[1:] != k[:-1]
    heads = np.flatnonzero(first)
    # the latest end before each activity: of the key's earlier activities in this chunk and earlier chunks
    before = carried_of(k[heads], carried, win_s)
    reach = np.maximum(grouped_cummax(first, e), np.repeat(before, np.diff(np.append(heads, k.size))))
    prev = np.empty(k.size, dtype=np.int64)
    prev[1:] = reach[:-1]
    prev[heads] = before
    gap_s = np.maximum(prev, win_s)
    gap_e = np.maximum(np.minimum(s, win_e), gap_s)
    cut = np.clip(lch, gap_s, gap_e)
    parts = {
        "host_wait": np.where(has, cut - gap_s, 0),
        "kernel_wait": np.where(has, gap_e - cut, 0),
        "other_wait": np.where(has, 0, gap_e - gap_s),
    }
    sums = pd.DataFrame(
        {c: np.add.reduceat(v, heads) if heads.size else v[:0] for c, v in parts.items()},
        index=pd.Index(k[heads], name="key"),
    )
    updated = dict(carried)
    if heads.size:
        tails = reach[np.append(heads[1:], k.size) - 1]  # per key its latest end (the running maximum's last)
        updated.update(zip(k[heads].tolist(), tails.tolist()))
    return sums, updated


def _order_by(keys: np.ndarray, start: np.ndarray) -> np.ndarray:
    """Indices sorting by (key, start): a stable sort by key when the starts are in order already (a chunk's
    activities are), else both."""
    if start.size < 2 or bool(np.all(start[1:] >= start[:-1])):
        return np.argsort(keys, kind="stable")
    return np.lexsort((start, keys))


def carried_of(keys: np.ndarray, carried: dict, default: int) -> np.ndarray:
    """Per (distinct) key, the latest end carried from earlier chunks (default where none)."""
    return np.array([carried.get(int(k), default) for k in keys], dtype=np.int64)  # one per key, few keys


def trailing_idle(carried: dict, keys, win_s: int, win_e: int) -> np.ndarray:
    """Idle time from each key's last activity's end (the window's start for a key without one) to the window's
    end: the gaps no activity closes (other)."""
    return np.maximum(win_e - np.maximum(carried_of(keys, carried, win_s), win_s), 0)


def stream_key(device, stream) -> np.ndarray:
    """One int64 key per (device, stream)."""
    return (np.asarray(device, np.int64) << STREAM_BITS) | (np.asarray(stream, np.int64) & STREAM_MASK)


class LaunchDelays:
    """Per kernel name, the delays of its launches (launch call start to kernel start), added a time chunk at
    a time. Exact percentiles need every delay: they are kept, 8 bytes per launch, each chunk's grouped by name
    as it arrives, so the table sorts one name's delays at a time, never every launch at once
    (at 10^7 kernels that sort and its copies, of the names too, were the run's peak: about 0.7 GB)."""

    QUANTILES = (0.5, 0.95)  # the table's p50 and p95

    def __init__(self):
        # per chunk: its distinct names (sorted), where each one's delays start, and its delays grouped by name
        self._chunks: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._sums: list[tuple[np.ndarray, ...]] = []  # per chunk: names, launches, total delay, short kernels

    def add(self, codes, delay, short) -> None:
        """One chunk's kernel launches: name codes, delays (ns) and whether each kernel was shorter than its
        launch call."""
        codes = np.asarray(codes, np.int64)
        if codes.size == 0:
            return
        delay = np.asarray(delay, np.int64)
        order = np.argsort(codes, kind="stable")  # (the delays are sorted per name at the end)
        c, d = codes[order], delay[order]
        first = np.ones(c.size, dtype=bool)
        first[1:] = c[1:] != c[:-1]
        heads = np.flatnonzero(first)
        names = c[heads]
        launches = np.diff(np.append(heads, c.size))
        short_sorted = np.asarray(short, dtype=np.int64)[order]
        self._chunks.append((names, heads, d))
        self._sums.append((names, launches, np.add.reduceat(d, heads), np.add.reduceat(short_sorted, heads)))

    def totals(self) -> tuple[int, int]:
        """(launches, short kernels) over every name."""
        return (
            int(sum(int(s[1].sum()) for s in self._sums)),
            int(sum(int(s[3].sum()) for s in self._sums)),
        )

    def _sorted_delays(self, code: int) -> np.ndarray:
        parts = []
        for names, heads, d in self._chunks:
            k = int(np.searchsorted(names, code))
            if k < names.size and names[k] == code:
                parts.append(d[heads[k] : heads[k + 1] if k + 1 < heads.size else d.size])
        return np.sort(np.concatenate(parts))

    def table(self, short_names) -> pd.DataFrame:
        """Per kernel name: launches, mean, p50 and p95 of the launch delay (numpy's default, linearly
        interpolated percentile) and the short kernels, most launches first."""
        if not self._sums:
            return make_frame(
                {
                    "name": np.zeros(0, dtype=object),
                    **{c: np.zeros(0, np.int64) for c in ("launches", "short_kernels")},
                    **{c: np.zeros(0) for c in ("mean", "p50", "p95")},
                }
            )
        names, launches, total, short = (np.concatenate(x) for x in zip(*self._sums))
        uniq, idx = np.unique(names, return_inverse=True)
        sums = {}
        for key, values in (("launches", launches), ("total", total), ("short", short)):
            sums[key] = np.zeros(uniq.size, dtype=np.int64)
            np.add.at(sums[key], idx, values)  # exact integer sums (one entry per name and chunk)
        quantiles = np.zeros((len(self.QUANTILES), uniq.size))
        for k, code in enumerate(uniq.tolist()):  # one per kernel name
            v = self._sorted_delays(code).astype(np.float64)
            for j, q in enumerate(self.QUANTILES):
                pos = (v.size - 1) * q
                lo = int(np.floor(pos))
                hi = min(lo + 1, v.size - 1)
                quantiles[j, k] = v[lo] + (v[hi] - v[lo]) * (pos - lo)
        frame = make_frame(
            {
                "name": np.asarray(short_names, dtype=object)[uniq],
                "launches": sums["launches"],
                "mean": sums["total"] / sums["launches"],
                "p50": quantiles[0],
                "p95": quantiles[1],
                "short_kernels": sums["short"],
            }
        )
        return frame.sort_values(["launches", "name"], ascending=[False, True], kind="stable", ignore_index=True)


class GpuBreakdowns:
    """The idle split and the launch delays of one aggregation, accumulated from the activities of each time
    chunk (they arrive in start order across chunks). The busy split is `busy_split`, called by
    aggregate.Breakdown with the other per-GPU times."""

    def __init__(self, iterations, iter_start: int, iter_stop: int, window_start: int, window_end: int):
        self.iterations, self.iter_start, self.iter_stop = iterations, iter_start, iter_stop
        self.win_s, self.win_e = int(window_start), int(window_end)
        self.gpu_end: dict = {}
        self.stream_end: dict = {}
        self.gpu_idle: list[pd.DataFrame] = []
        self.stream_idle: list[pd.DataFrame] = []
        self.delays = LaunchDelays()

    def add(self, running: pd.DataFrame) -> None:
        """One chunk's GPU activities (start, end, device_id, stream_id, kind, name_code, launch, api_id,
        api_duration)."""
        if not len(running):
            return
        start = running["start"].to_numpy(np.int64)
        end = running["end"].to_numpy(np.int64)
        device = running["device_id"].to_numpy(np.int64)
        launch = running["launch"].to_numpy(np.int64)
        launched = running["api_id"].to_numpy(np.int64) >= 0
        sums, self.gpu_end = idle_gaps(device, start, end, launch, launched, self.gpu_end, self.win_s, self.win_e)
        self.gpu_idle.append(sums)
        keys = stream_key(device, running["stream_id"].to_numpy(np.int64))
        sums, self.stream_end = idle_gaps(keys, start, end, launch, launched, self.stream_end, self.win_s, self.win_e)
        self.stream_idle.append(sums)
        # launch delays of the kernels launched in the aggregated iterations (as the kernel table counts them)
        it = self.iterations.of(launch)
        kernel = (running["kind"].to_numpy() == KIND_KERNEL) & launched & (it >= self.iter_start)
        kernel &= it <= self.iter_stop
        if kernel.any():
            api_dur = running["api_duration"].to_numpy(np.int64)[kernel]
            self.delays.add(
                running["name_code"].to_numpy(np.int64)[kernel],
                (start - launch)[kernel],
                (end - start)[kernel] < api_dur,
            )

    def result(self, devices, short_names) -> dict:
        """{"gpus": per GPU idle split, "streams": per (GPU, stream) busy, idle and its split, "launches": per
        kernel name launch delays, "short_kernels", "launches_total"}."""
        wl = max(self.win_e - self.win_s, 0)
        gpu = _summed(self.gpu_idle).reindex(np.asarray(devices, dtype=np.int64), fill_value=0)
        gpu["other_wait"] += trailing_idle(self.gpu_end, gpu.index, self.win_s, self.win_e)
        gpus = make_frame({"device_id": gpu.index.to_numpy(np.int64), **{c: gpu[c].to_numpy() for c in IDLE_PARTS}})
        st = _summed(self.stream_idle)
        st["other_wait"] += trailing_idle(self.stream_end, st.index, self.win_s, self.win_e)
        keys = st.index.to_numpy(np.int64)
        idle = st[list(IDLE_PARTS)].sum(axis=1).to_numpy(np.int64)
        streams = make_frame(
            {
                "device_id": keys >> STREAM_BITS,
                "stream_id": keys & STREAM_MASK,
                "busy": wl - idle,
                "idle": idle,
                **{c: st[c].to_numpy(np.int64) for c in IDLE_PARTS},
            }
        )
        launches_total, short_kernels = self.delays.totals()
        return {
            "gpus": gpus,
            "streams": streams,
            "launches": self.delays.table(short_names),
            "short_kernels": short_kernels,
            "launches_total": launches_total,
        }


def _summed(parts: list[pd.DataFrame]) -> pd.DataFrame:
    if not parts:
        return pd.DataFrame({c: np.zeros(0, np.int64) for c in IDLE_PARTS}, index=pd.Index([], dtype=np.int64))
    return pd.concat(parts).groupby(level=0).sum().astype(np.int64)
