"""Memory (DESIGN.md "Memory"): the allocation and free events every ingest adapter reads into one small frame
(`memory_frame`), the allocated and reserved levels they imply, and the memory report's tables of one
aggregation, accumulated over the op model's time chunks (`MemoryAccumulator`) so that the in-memory and the
out-of-core engines compute them in one place.

An event is one allocation (bytes > 0) or free (bytes < 0) on a device: Kineto's `[memory]` instant events,
Nsight Systems' CUDA_GPU_MEMORY_USAGE_EVENTS. Columns (trace.MEMORY_COLUMNS): `start` (when), `call_start` (the
time attributed to an op: the CUDA API call's start for nsys, else `start`), `global_tid` (-1: unknown),
`pid`, `device_type` (c10::DeviceType), `device_id` (-1 for host memory), `address` (-1: not recorded),
`bytes` (> 0 allocated, < 0 freed), and the levels, the device's memory after the event:
`allocated` always (the process's `Total Allocated` where every event of the process on the device records
it, else the running sum of its bytes from the start of the trace), `reserved` where recorded (-1 otherwise),
summed over the processes using the device.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from dlprof_profiler import contract as K
from dlprof_profiler.engine.structure import RangeForest, ThreadTimeKeys
from dlprof_profiler.engine.trace import MEMORY_COLUMNS, combined_codes, make_frame

# c10::DeviceType codes (what Kineto writes as `Device Type`); nsys' CUDA events are CUDA, or CPU for host memory
CPU, CUDA = K.DEVICE_TYPE_CPU, K.DEVICE_TYPE_CUDA
device_label = K.device_label
NO_EVENTS_TEXT = (
    "No memory events in this profile: record them with dlprof --detailed_mode (either backend), "
    "nsys profile --cuda-memory-usage=true or torch.profiler.profile(profile_memory=True)"
)


def empty_memory_frame() -> pd.DataFrame:
    return make_frame({c: np.zeros(0, dtype=np.int64) for c in MEMORY_COLUMNS})


def memory_frame(
    start,
    nbytes,
    device_type,
    device_id,
    pid,
    global_tid=None,
    call_start=None,
    address=None,
    total_allocated=None,
    total_reserved=None,
) -> pd.DataFrame:
    """The events in time order (ties keep the given order) with their levels (`levels`). Missing optional
    columns: thread -1, call start = start, address -1, totals not recorded (-1)."""
    start = np.asarray(start, dtype=np.int64)
    n = start.size

    def column(values, default):
        return np.full(n, default, dtype=np.int64) if values is None else np.asarray(values, dtype=np.int64)

    cols = {
        "start": start,
        "call_start": column(call_start, 0) if call_start is not None else start.copy(),
        "global_tid": column(global_tid, -1),
        "pid": column(pid, 0),
        "device_type": column(device_type, CUDA),
        "device_id": column(device_id, 0),
        "address": column(address, -1),
        "bytes": column(nbytes, 0),
    }
    totals = column(total_allocated, -1), column(total_reserved, -1)
    order = np.argsort(start, kind="stable")
    if n and not bool((order[1:] > order[:-1]).all()):
        cols = {k: v[order] for k, v in cols.items()}
        totals = tuple(t[order] for t in totals)
    cols["allocated"], cols["reserved"] = levels(cols, *totals)
    return make_frame(cols)


def _group_cumsum(codes: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Running sum of `values` within each group of `codes`, rows in their order."""
    order = np.argsort(codes, kind="stable")
    sorted_codes, sorted_values = codes[order], values[order]
    sums = np.cumsum(sorted_values)
    first = np.ones(order.size, dtype=bool)
    first[1:] = sorted_codes[1:] != sorted_codes[:-1]
    group_first = np.maximum.accumulate(np.where(first, np.arange(order.size), 0))
    out = np.empty_like(sums)
    out[order] = sums - (sums[group_first] - sorted_values[group_first])
    return out


def _previous_in_group(codes: np.ndarray, values: np.ndarray, first_value: np.ndarray) -> np.ndarray:
    """Per row, `values` of the previous row of its group; `first_value` for a group's first row."""
    order = np.argsort(codes, kind="stable")
    sorted_codes = codes[order]
    first = np.ones(order.size, dtype=bool)
    first[1:] = sorted_codes[1:] != sorted_codes[:-1]
    prev_sorted = np.empty(order.size, dtype=np.int64)
    prev_sorted[1:] = values[order][:-1]
    prev_sorted[first] = first_value[order][first]
    out = np.empty(order.size, dtype=np.int64)
    out[order] = prev_sorted
    return out


def _codes(*arrays) -> np.ndarray:
    return combined_codes(*arrays)


def levels(cols: dict, total_allocated: np.ndarray, total_reserved: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(allocated, reserved) after each event, rows in time order. Per process and device, its own level is
    `Total Allocated` where all its events there record it, else the running sum of its bytes; its level
    before its first event is that event's level less its bytes (0 for a running sum). The device's level is
    the sum of its processes' levels. Reserved: `Total Reserved` where all of a process's events on the
    device record it (a process counts with its first value until its first event), else -1 for the device."""
    n = cols["start"].size
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    nbytes = cols["bytes"]
    device = _codes(cols["device_type"], cols["device_id"])
    group = _codes(cols["pid"], cols["device_type"], cols["device_id"])
    n_groups = int(group.max()) + 1
    recorded = np.bincount(group, weights=(total_allocated < 0), minlength=n_groups) == 0
    own = np.where(recorded[group], total_allocated, _group_cumsum(group, nbytes))
    delta = own - _previous_in_group(group, own, own - nbytes)
    first_of_group = _first_rows(group)
    init_device = np.zeros(int(device.max()) + 1, dtype=np.int64)
    np.add.at(init_device, device[first_of_group], (own - nbytes)[first_of_group])
    allocated = init_device[device] + _group_cumsum(device, delta)

    known = np.bincount(group, weights=(total_reserved < 0), minlength=n_groups) == 0
    device_known = np.ones(init_device.size, dtype=bool)
    np.logical_and.at(device_known, device, known[group])
    own_r = np.where(known[group], total_reserved, 0)
    delta_r = own_r - _previous_in_group(group, own_r, own_r)
    init_r = np.zeros(init_device.size, dtype=np.int64)
    np.add.at(init_r, device[first_of_group], own_r[first_of_group])
    reserved = np.where(device_known[device], init_r[device] + _group_cumsum(device, delta_r), -1)
    return allocated.astype(np.int64), reserved.astype(np.int64)


def _first_rows(codes: np.ndarray) -> np.ndarray:
    """Row of each code's first occurrence."""
    _, first = np.unique(codes, return_index=True)
    return first


def gpu_peak(frame: pd.DataFrame | None) -> int | None:
    """The highest allocated level of any GPU (None without GPU memory events): the expert systems' peak."""
    if frame is None or len(frame) == 0:
        return None
    on_gpu = frame["device_type"].to_numpy(np.int64) != CPU
    if not on_gpu.any():
        return None
    return int(max(frame["allocated"].to_numpy(np.int64)[on_gpu].max(), 0))


def merge_frames(frames: list[pd.DataFrame], shifts: list[int]) -> pd.DataFrame:
    """The events of several traces (one process each) on a common clock, levels summed over processes."""
    frames = [(f, s) for f, s in zip(frames, shifts) if f is not None and len(f)]
    if not frames:
        return empty_memory_frame()

    def joined(column, shift=False):
        return np.concatenate([f[column].to_numpy(np.int64) + (s if shift else 0) for f, s in frames])

    return memory_frame(
        joined("start", True),
        joined("bytes"),
        joined("device_type"),
        joined("device_id"),
        joined("pid"),
        joined("global_tid"),
        joined("call_start", True),
        joined("address"),
        joined("allocated"),  # each trace's levels are its process's own
        joined("reserved"),
    )


# ---------------------------------------------------------------------------- the report's tables


@dataclass
class MemoryTables:
    """The memory report of one aggregation."""

    recorded: bool  # the profile has memory events at all
    devices: pd.DataFrame  # DEVICE_FIELDS
    ops: pd.DataFrame  # OP_FIELDS


DEVICE_FIELDS = [
    "device_type",
    "device_id",
    "device",
    "peak_allocated",
    "peak_reserved",  # NaN: not recorded
    "allocated_at_end",
    "allocations",
    "frees",
    "bytes_allocated",
    "bytes_freed",
]
OP_FIELDS = [
    "op_index",
    "device_type",
    "device_id",
    "device",
    "allocations",
    "frees",
    "bytes_allocated",
    "bytes_freed",
    "peak_allocated",
]


def _empty(fields: list[str]) -> pd.DataFrame:
    return make_frame({c: np.zeros(0, dtype=object if c == "device" else np.int64) for c in fields})


class _Device:
    """One device's events in time order: times, levels and the level before the first event."""

    def __init__(self, rows: np.ndarray, frame_cols: dict):
        self.rows = rows
        self.times = frame_cols["start"][rows]
        self.allocated = frame_cols["allocated"][rows]
        self.reserved = frame_cols["reserved"][rows]
        self.nbytes = frame_cols["bytes"][rows]
        self.initial = int(self.allocated[0] - self.nbytes[0])
        # the levels once more with a last entry, so every [i0, i1) pair of reduceat has a valid index
        self._padded = np.append(self.allocated, np.iinfo(np.int64).min)

    def peaks_during(self, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """The highest allocated level at any moment of each interval [start, end): the level it starts at
        (after the events before it) and the levels after the events inside it."""
        i0 = np.searchsorted(self.times, starts, side="left")
        i1 = np.searchsorted(self.times, ends, side="left")
        before = np.where(i0 > 0, self.allocated[np.maximum(i0 - 1, 0)], self.initial)
        inside = i1 > i0
        out = before.copy()
        if inside.any():
            rows = np.flatnonzero(inside)
            rows = rows[np.argsort(i0[rows], kind="stable")]  # the gaps between pairs then cost O(events) in all
            pairs = np.empty(2 * rows.size, dtype=np.int64)
            pairs[0::2], pairs[1::2] = i0[rows], i1[rows]
            most = np.maximum.reduceat(self._padded, pairs)[0::2]
            out[rows] = np.maximum(before[rows], most)
        return out


class MemoryAccumulator:
    """The memory tables of one aggregation, from the memory events and the op model's time chunks (each
    chunk: the op instances starting in it). An event belongs to the innermost op instance on its thread
    whose interval holds its call time (the latest-starting one; instances of later chunks start later, so
    they replace what an earlier chunk found)."""

    def __init__(self, events: pd.DataFrame | None, iterations, iter_start: int, iter_stop: int, n_ops: int):
        self.iterations, self.lo, self.hi = iterations, int(iter_start), int(iter_stop)
        events = events if events is not None else empty_memory_frame()
        self.n = len(events)
        self.cols = {c: events[c].to_numpy(np.int64) for c in MEMORY_COLUMNS}
        self.owner_op = np.full(self.n, -1, dtype=np.int64)
        self.owner_start = np.zeros(self.n, dtype=np.int64)
        self.n_ops = int(n_ops)
        self.devices: list[tuple[int, int, _Device]] = []  # by device type, then id (CPU first)
        self.event_device = np.zeros(self.n, dtype=np.int64)  # position of each event's device in it
        if self.n:
            kinds = pd.DataFrame({"t": self.cols["device_type"], "d": self.cols["device_id"]})
            code, uniques = pd.factorize(pd.MultiIndex.from_frame(kinds), sort=True)
            for position, (device_type, device_id) in enumerate(uniques):
                rows = np.flatnonzero(code == position)
                self.devices.append((int(device_type), int(device_id), _Device(rows, self.cols)))
            self.event_device = code.astype(np.int64)
        self.peaks = [np.full(self.n_ops, np.iinfo(np.int64).min, dtype=np.int64) for _ in self.devices]

    def add(self, chunk) -> None:
        if not self.n:
            return
        inst = chunk.inst
        tid = inst["global_tid"].to_numpy(np.int64)
        start = inst["start"].to_numpy(np.int64)
        end = inst["end"].to_numpy(np.int64)
        ops = inst["op_index"].to_numpy(np.int64)
        self._attribute(chunk.lo, tid, start, end, ops)
        it = self.iterations.of(start)
        chosen = np.flatnonzero((it >= self.lo) & (it <= self.hi) & (ops >= 0) & (ops < self.n_ops))
        for (_, _, dev), peaks in zip(self.devices, self.peaks):
            during = dev.peaks_during(start[chosen], end[chosen])
            np.maximum.at(peaks, ops[chosen], during)

    def _attribute(self, lo: int, tid, start, end, ops) -> None:
        threaded = np.flatnonzero(tid >= 0)
        at = self.cols["call_start"]
        # the instances of this chunk start at or after lo: only events from lo on can lie inside them
        events = np.flatnonzero((self.cols["global_tid"] >= 0) & (at >= lo))
        if threaded.size == 0 or events.size == 0:
            return
        ev_tid, ev_time = self.cols["global_tid"][events], at[events]
        keys = ThreadTimeKeys([tid[threaded], ev_tid], [start[threaded], end[threaded], ev_time])
        forest = RangeForest(tid[threaded], start[threaded], end[threaded], threaded)
        row = forest.innermost_at(keys, ev_tid, ev_time)
        found = row >= 0
        owner = threaded[row[found]]
        self.owner_op[events[found]] = ops[owner]
        self.owner_start[events[found]] = start[owner]

    def result(self) -> MemoryTables:
        if not self.n:
            return MemoryTables(False, _empty(DEVICE_FIELDS), _empty(OP_FIELDS))
        return MemoryTables(True, self._device_table(), self._op_table())

    def _device_table(self) -> pd.DataFrame:
        its = self.iterations
        rows = []
        window_start = its.time_range(self.lo, self.hi)[0]
        for device_type, device_id, dev in self.devices:
            # the events of the aggregated iterations (steps leave out what runs between and around them)
            it = its.of(dev.times)
            chosen = np.flatnonzero((it >= self.lo) & (it <= self.hi))
            a = int(np.searchsorted(dev.times, window_start, side="left"))  # first event from the window on
            before = int(dev.allocated[a - 1]) if a > 0 else dev.initial
            inside = dev.allocated[chosen]
            reserved = dev.reserved[np.concatenate([[a - 1], chosen]) if a > 0 else chosen]
            reserved = reserved[reserved >= 0]
            nbytes = dev.nbytes[chosen]
            rows.append(
                {
                    "device_type": device_type,
                    "device_id": device_id,
                    "device": device_label(device_type, device_id),
                    "peak_allocated": max(before, int(inside.max())) if inside.size else before,
                    "peak_reserved": float(reserved.max()) if reserved.size else np.nan,
                    "allocated_at_end": int(inside[-1]) if inside.size else before,
                    "allocations": int((nbytes > 0).sum()),
                    "frees": int((nbytes < 0).sum()),
                    "bytes_allocated": int(nbytes[nbytes > 0].sum()),
                    "bytes_freed": int(-nbytes[nbytes < 0].sum()),
                }
            )
        return pd.DataFrame(rows, columns=DEVICE_FIELDS)

    def _op_table(self) -> pd.DataFrame:
        owned = self.owner_op >= 0
        it = self.iterations.of(self.owner_start)
        chosen = np.flatnonzero(owned & (it >= self.lo) & (it <= self.hi))
        if chosen.size == 0:
            return _empty(OP_FIELDS)
        dev = self.event_device[chosen]
        nbytes = self.cols["bytes"][chosen]
        frame = pd.DataFrame(
            {
                "op_index": self.owner_op[chosen],
                "dev": dev,
                "allocations": (nbytes > 0).astype(np.int64),
                "frees": (nbytes < 0).astype(np.int64),
                "bytes_allocated": np.where(nbytes > 0, nbytes, 0),
                "bytes_freed": np.where(nbytes < 0, -nbytes, 0),
            }
        )
        out = frame.groupby(["op_index", "dev"], sort=True).sum().reset_index()
        op, dev = out["op_index"].to_numpy(np.int64), out["dev"].to_numpy(np.int64)
        peaks = np.stack(self.peaks)  # devices x ops
        out["peak_allocated"] = peaks[dev, op]
        types = np.array([d[0] for d in self.devices], dtype=np.int64)
        ids = np.array([d[1] for d in self.devices], dtype=np.int64)
        labels = np.array([device_label(t, i) for t, i, _ in self.devices], dtype=object)
        out["device_type"], out["device_id"] = types[dev], ids[dev]
        out["device"] = pd.Series(labels[dev], dtype=object, index=out.index)
        out = out.sort_values(["dev", "bytes_allocated", "op_index"], ascending=[True, False, True], kind="stable")
        return out[OP_FIELDS].reset_index(drop=True)
