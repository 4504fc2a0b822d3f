"""The op model of one domain read in time chunks: what aggregation consumes.

A chunk [lo, hi) holds the op instances that start in it, the GPU activities launched in it (with their
owner op and owner start), the GPU activities, data-loading ranges and I/O calls that start in it (for the
time breakdown). `InMemoryModel` serves a model held in frames; the out-of-core store serves the same
chunks from disk (`store.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from dlprof_profiler.engine.trace import Trace, make_frame

TIME_MIN = -(1 << 62)
TIME_MAX = 1 << 62

INSTANCE_FIELDS = [
    "instance_id",
    "op_index",
    "kind",
    "start",
    "end",
    "pid",
    "global_tid",
    "device_id",
    "cpu_time",
    "cpu_overhead",
    "gpu_time",
    "gpu_idle",
    "n_kernels",
    "is_call",
    "call_cpu_time",
    "call_cpu_overhead",
    "call_gpu_time",
    "call_gpu_idle",
    "call_n_kernels",
]
ACTIVITY_FIELDS = [
    "activity_id",
    "kind",
    "name_code",
    "start",
    "end",
    "device_id",
    "pid",
    "launch",
    "api_id",
    "api_duration",
    "api_name",
    "uses_tc",
    "owner",
    "owner_op",
    "owner_start",
]


# what the time breakdowns read of the GPU activities starting in a chunk (aggregate.Breakdown, breakdowns.py)
RUNNING_FIELDS = [
    "start",
    "end",
    "device_id",
    "kind",
    "uses_tc",
    "name_code",
    "stream_id",
    "launch",
    "api_id",
    "api_duration",
]


@dataclass
class ModelChunk:
    lo: int
    hi: int
    inst: pd.DataFrame  # op instances starting in [lo, hi)
    acts: pd.DataFrame  # GPU activities launched in [lo, hi)
    running: pd.DataFrame  # GPU activities starting in [lo, hi): RUNNING_FIELDS
    loader: pd.DataFrame  # data-loading ranges starting in [lo, hi): start, end, pid
    io: pd.DataFrame  # OS I/O calls starting in [lo, hi): start, end, pid


def chunk_bounds(cuts) -> list[tuple[int, int]]:
    """[lo, hi) pairs covering the whole timeline, split at the cut times."""
    points = sorted({int(c) for c in (cuts if cuts is not None else [])})
    edges = [TIME_MIN] + points + [TIME_MAX]
    return list(zip(edges[:-1], edges[1:]))


def bucket_width(lo: int, hi: int, events: int) -> int:
    """The width of the time buckets events in [lo, hi) are counted in to plan cuts (`cuts_at`): about one
    bucket per thousand events, at least 1024 and at most 2^20 buckets."""
    bins = max(min(events // 1000, 1 << 20), 1024)
    return max((hi - lo) // bins + 1, 1)


def cuts_at(edges: np.ndarray, cum: np.ndarray, boundaries, events_per_segment: int) -> list[int]:
    """Cut times giving segments of about `events_per_segment` events, at iteration `boundaries` where
    iterations are smaller than that, else inside the iterations; `edges`: the starts of the time buckets
    holding events, in order, `cum`: the events up to the end of each."""
    cuts, last = [], 0
    for b in np.sort(np.asarray(boundaries, dtype=np.int64)):
        pos = int(np.searchsorted(edges, b, side="right")) - 1
        count = int(cum[pos]) if pos >= 0 else 0
        last = cut_inside(edges, cum, cuts, last, count, events_per_segment, before=int(b))  # an iteration
        if count - last >= events_per_segment:
            cuts.append(int(b))
            last = count
    cut_inside(edges, cum, cuts, last, int(cum[-1]), events_per_segment)  # after the last boundary
    return sorted(set(cuts))


def cut_inside(edges, cum, cuts: list[int], last: int, count: int, events_per_segment: int, before=None) -> int:
    """Append to `cuts` bucket starts that split a stretch too large for one segment (more than twice
    `events_per_segment` events from `last` to `count`) into segments of about `events_per_segment`, each
    after the last cut and before `before` (if given); the events up to the last cut appended, else `last`."""
    while count - last > 2 * events_per_segment:
        i = int(np.searchsorted(cum, last + events_per_segment))
        cut = int(edges[min(i + 1, len(edges) - 1)])
        if (before is not None and cut >= before) or (cuts and cut <= cuts[-1]):
            break
        cuts.append(cut)
        last = int(cum[i])
    return last


def launch_times(trace: Trace, gpu_api: np.ndarray) -> np.ndarray:
    """When each GPU activity was launched: its API call's start, else its own start."""
    gpu, api = trace.gpu, trace.api_calls
    launch = gpu["start"].to_numpy(np.int64).copy()
    has = gpu_api >= 0
    if has.any():
        launch[has] = api["start"].to_numpy(np.int64)[gpu_api[has]]
    return launch


def first_calls(instances: pd.DataFrame | None, columns, op_index) -> dict:
    """Per op of `op_index`, the `columns` of its first call (earliest start, then lowest instance id) in the
    whole profile; None where the op has no instance or the call has no value."""
    op_index = np.asarray(op_index, dtype=np.int64)
    out = {c: np.full(op_index.size, None, dtype=object) for c in columns}
    if instances is None or len(instances) == 0 or op_index.size == 0:
        return out
    ops = instances["op_index"].to_numpy(np.int64)
    order = np.lexsort((instances["instance_id"].to_numpy(np.int64), instances["start"].to_numpy(np.int64)))
    first_of_op, first_pos = np.unique(ops[order], return_index=True)  # unique keeps the first occurrence
    rows = order[first_pos]
    where = np.searchsorted(first_of_op, op_index)
    found = (where < first_of_op.size) & (first_of_op[np.minimum(where, first_of_op.size - 1)] == op_index)
    for c in columns:
        if c in instances:
            out[c][found] = instances[c].to_numpy(dtype=object)[rows[where[found]]]
    return out


def first_given_values(instances: pd.DataFrame, column: str) -> pd.Series:
    """Per op_index, the first non-empty `column` value of its instances in start order (the instances are
    in start order)."""
    if len(instances) == 0 or column not in instances.columns:
        return pd.Series([], dtype=object)
    given = instances.loc[instances[column].notna() & (instances[column].astype(object) != ""), ["op_index", column]]
    first = given.drop_duplicates("op_index")
    return pd.Series(first[column].to_numpy(dtype=object), index=first["op_index"].to_numpy(), dtype=object)


def _codes(names: pd.Series) -> np.ndarray:
    return (
        names.cat.codes.to_numpy(np.int64)
        if isinstance(names.dtype, pd.CategoricalDtype)
        else pd.factorize(names.to_numpy(dtype=object))[0].astype(np.int64)
    )


class InMemoryModel:
    """Chunks of a model held in memory (one domain of a correlation)."""

    def __init__(self, trace: Trace, corr, dm):
        self.trace, self.corr, self.dm = trace, corr, dm
        self.domain, self.family, self.mode = dm.domain, dm.family, corr.mode
        self.ops = dm.ops
        gpu, api = trace.gpu, trace.api_calls
        inst = dm.instances
        n = len(gpu)
        gpu_api = corr.gpu_api
        has = gpu_api >= 0
        safe = np.maximum(gpu_api, 0)
        owner = np.asarray(dm.gpu_instance, dtype=np.int64)
        api_dur = (api["end"] - api["start"]).to_numpy(np.int64) if len(api) else np.zeros(0, np.int64)
        self.acts = make_frame(
            {
                "activity_id": gpu["activity_id"].to_numpy(np.int64),
                "kind": gpu["kind"].to_numpy(),
                "name_code": _codes(gpu["name"]) if n else np.zeros(0, np.int64),
                "start": gpu["start"].to_numpy(np.int64),
                "end": gpu["end"].to_numpy(np.int64),
                "device_id": gpu["device_id"].to_numpy(np.int64),
                "stream_id": gpu["stream_id"].to_numpy(np.int64),
                "pid": gpu["pid"].to_numpy(np.int64),
                "launch": launch_times(trace, gpu_api) if n else np.zeros(0, np.int64),
                "api_id": np.where(has, gpu_api, -1).astype(np.int64),
                "api_duration": np.where(has, api_dur[safe] if len(api) else 0, -1).astype(np.int64),
                "api_name": np.where(has, _codes(api["name"])[safe] if len(api) else -1, -1).astype(np.int64),
                "uses_tc": np.asarray(corr.uses_tc, dtype=bool),
                "owner": owner,
                "owner_op": inst["op_index"].to_numpy(np.int64)[owner] if n else np.zeros(0, np.int64),
                "owner_start": inst["start"].to_numpy(np.int64)[owner] if n else np.zeros(0, np.int64),
            }
        )
        ranges = trace.ranges
        if len(ranges) and "dataloader" in corr.range_info:
            loader = corr.range_info["dataloader"].to_numpy(dtype=bool)
            self.loader = make_frame({c: ranges[c].to_numpy(np.int64)[loader] for c in ("start", "end", "pid")})
        else:
            self.loader = make_frame({c: np.zeros(0, np.int64) for c in ("start", "end", "pid")})
        io = trace.io_calls
        self.io = make_frame({c: io[c].to_numpy(np.int64) for c in ("start", "end", "pid")})
        self.inst = inst

    # -- facts about the whole model ----------------------------------------------------------------------
    def first_calls(self, columns, op_index) -> dict:
        """Per op of `op_index`, `columns` of its first call in the whole profile (see `first_calls`)."""
        return first_calls(self.inst, columns, op_index)

    def window_end(self, iterations, iter_start: int, iter_stop: int) -> int | None:
        """Latest end of any op instance or GPU activity of the aggregated iterations."""
        ends = []
        it = iterations.of(self.inst["start"].to_numpy(np.int64))
        sel = (it >= iter_start) & (it <= iter_stop)
        if sel.any():
            ends.append(int(self.inst["end"].to_numpy(np.int64)[sel].max()))
        it = iterations.of(self.acts["launch"].to_numpy(np.int64))
        sel = (it >= iter_start) & (it <= iter_stop)
        if sel.any():
            ends.append(int(self.acts["end"].to_numpy(np.int64)[sel].max()))
        return max(ends) if ends else None

    def op_names(self) -> np.ndarray:
        names = np.full(len(self.ops), "", dtype=object)
        names[self.ops["op_index"].to_numpy(np.int64)] = self.ops["name"].to_numpy(dtype=object)
        return names

    def kernel_names(self):
        """(short name per name code, function: activity ids -> long names)."""
        gpu = self.trace.gpu
        if len(gpu) == 0:
            empty = np.zeros(0, dtype=object)
            return empty, lambda ids: np.full(len(ids), "", dtype=object)
        short = gpu["name"].cat.categories.to_numpy(dtype=object)
        long_cats = gpu["long_name"].cat.categories.to_numpy(dtype=object)
        long_codes = gpu["long_name"].cat.codes.to_numpy(np.int64)
        return short, lambda ids: long_cats[long_codes[np.asarray(ids, dtype=np.int64)]]

    def memory_events(self) -> pd.DataFrame:
        """The allocations and frees of the trace (memory.py)."""
        return self.trace.memory

    def device_ids(self) -> list[int]:
        devices = self.trace.devices
        return devices["device_id"].to_numpy(np.int64).tolist() if len(devices) else []

    def device_pids(self) -> dict:
        """The processes driving each GPU: those with GPU activities on it."""
        gpu = self.trace.gpu
        if len(gpu) == 0:
            return {}
        pairs = pd.DataFrame({"d": gpu["device_id"].to_numpy(np.int64), "p": gpu["pid"].to_numpy(np.int64)})
        pairs = pairs.drop_duplicates()
        return {int(d): set(g["p"].tolist()) for d, g in pairs.groupby("d")}

    def empty_acts(self) -> pd.DataFrame:
        return self.acts.iloc[:0]

    # -- chunks -------------------------------------------------------------------------------------------
    def planned_cuts(self, boundaries, events_per_chunk: int) -> list[int]:
        """Cut times giving chunks of about `events_per_chunk` op instances and GPU activities (`cuts_at`);
        none when the model is no larger than one chunk."""
        times = [t for t in (self.inst["start"].to_numpy(np.int64), self.acts["launch"].to_numpy(np.int64)) if t.size]
        total = sum(t.size for t in times)
        if total <= events_per_chunk:
            return []
        lo, hi = min(int(t.min()) for t in times), max(int(t.max()) for t in times) + 1
        width = bucket_width(lo, hi, total)
        buckets = (hi - 1 - lo) // width + 1
        counts = sum(np.bincount((t - lo) // width, minlength=buckets) for t in times)
        held = np.flatnonzero(counts)
        return cuts_at(lo + held * width, np.cumsum(counts[held]), boundaries, events_per_chunk)

    def chunks(self, cuts=None):
        bounds = chunk_bounds(cuts)
        if len(bounds) == 1:
            lo, hi = bounds[0]
            yield ModelChunk(lo, hi, self.inst, self.acts, self._running(self.acts), self.loader, self.io)
            return
        inst_start = self.inst["start"].to_numpy(np.int64)
        launch = self.acts["launch"].to_numpy(np.int64)
        start = self.acts["start"].to_numpy(np.int64)
        inst = self.inst[INSTANCE_FIELDS]  # a chunk copies what its readers take (as the store's chunks hold)
        running = self._running(self.acts)
        for lo, hi in bounds:

            def within(t):
                return (t >= lo) & (t < hi)

            yield ModelChunk(
                lo,
                hi,
                inst[within(inst_start)],
                self.acts[within(launch)],
                running[within(start)],
                self.loader[within(self.loader["start"].to_numpy(np.int64))],
                self.io[within(self.io["start"].to_numpy(np.int64))],
            )

    @staticmethod
    def _running(acts: pd.DataFrame) -> pd.DataFrame:
        return acts[RUNNING_FIELDS]
