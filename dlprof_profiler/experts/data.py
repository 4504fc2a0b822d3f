"""What the detectors read beyond the aggregation tables: the memory operations and named API calls of the
aggregated iterations, GPU gaps, the CPU activity inside a time window, GPU idle time after given moments,
and the first input shapes of some ops. The rules are written once (`DetectorData`); `MemoryData` and
`StoreData` (bounded memory) only select the rows of a model held in memory or in the out-of-core store.

Every method returns small frames (selected rows only): detectors never see a whole trace."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from dlprof_profiler import contract as K
from dlprof_profiler.engine.intervals import merge_intervals
from dlprof_profiler.engine.trace import KIND_MEMCPY, KIND_MEMSET
from dlprof_profiler.engine.model_chunks import launch_times

EVER = int(np.iinfo(np.int64).max)  # a time bound beyond any time
_PER_THREAD_STREAM = re.compile(r"_(?:ptsz|ptds)$")


def api_base_name(name) -> str:
    """CUDA API name as users write it (`contract.api_display_name`) without the per-thread-stream suffix too:
    `cudaMemcpyAsync_ptsz_v7000` -> `cudaMemcpyAsync`, `cuMemcpyHtoD_v2` -> `cuMemcpyHtoD`."""
    return _PER_THREAD_STREAM.sub("", K.api_display_name(str(name))) if name is not None else ""


def _base_names(categories: np.ndarray) -> np.ndarray:
    return np.array([api_base_name(c) for c in categories], dtype=object)


class _AggregatedTimes:
    """Which times lie in an aggregated iteration: [lo, hi) holds them all (a range to read), `of(times)` says
    which do (steps leave the time between two steps out)."""

    def __init__(self, iterations, agg):
        self.iterations, self.first, self.last = iterations, agg.iter_start, agg.iter_stop
        self.lo, self.hi = iterations.time_range(self.first, self.last)

    def of(self, times) -> np.ndarray:
        times = np.asarray(times, dtype=np.int64)
        inside = (times >= self.lo) & (times < self.hi)
        if self.iterations.by_step:
            it = self.iterations.of(times)
            inside &= (it >= self.first) & (it <= self.last)
        return inside


MEMORY_COLUMNS = [
    "kind",
    "copy_kind",
    "src_kind",
    "dst_kind",
    "bytes",
    "start",
    "end",
    "device_id",
    "api_id",
    "api_name",
    "api_start",
    "api_end",
    "owner_op",
]
API_COLUMNS = ["api_id", "start", "end", "global_tid", "pid", "name", "owner_op"]


class DetectorData:
    """The detectors' reads: the rules written once here, over what a source gives (`_gpu_by_device`, the
    memory operations, API calls and CPU activity it selects). MemoryData reads a model held in memory,
    StoreData one in the out-of-core store."""

    def __init__(self, dm, agg, iterations):
        self.dm, self.agg, self.iterations = dm, agg, iterations
        self.window = _AggregatedTimes(iterations, agg)
        self._busy = None

    def _gpu_by_device(self, before: int = EVER, keep=None) -> dict:
        """Per device, (start, end, pid) of the GPU activities starting before `before` that `keep` (a function
        of a dict of device_id, start, end and pid arrays) selects."""
        raise NotImplementedError

    def _busy_segments(self) -> dict:
        if self._busy is None:
            everything = self._gpu_by_device()
            self._busy = {d: merge_intervals(s, e) for d, (s, e, _) in everything.items()}
        return self._busy

    def gpu_gaps(self, ws: int, we: int, min_length: int) -> pd.DataFrame:
        """Per device, idle intervals of at least `min_length` between its GPU activities inside [ws, we),
        with the processes whose activities ran on it in the window."""
        rows = []
        for d, (s, e, pid) in self._gpu_by_device(we, lambda c: c["end"] > ws).items():
            seg_s, seg_e = merge_intervals(np.clip(s, ws, we), np.clip(e, ws, we))
            if seg_s.size < 2:
                continue
            gap_s, gap_e = seg_e[:-1], seg_s[1:]
            long_ = (gap_e - gap_s) >= min_length
            pids = tuple(np.unique(pid).tolist())
            rows += [(d, int(a), int(b), pids) for a, b in zip(gap_s[long_], gap_e[long_])]
        return pd.DataFrame(rows, columns=["device_id", "start", "end", "pids"])

    def idle_after(self, times: np.ndarray, devices: np.ndarray) -> int:
        """GPU idle time from each time until the next busy interval on its device (0 when busy then; nothing
        after the device's last activity), each idle interval counted once."""
        total = 0
        busy_segments = self._busy_segments()
        for d in np.unique(devices).tolist():
            seg = busy_segments.get(int(d))
            if seg is None or seg[0].size == 0:
                continue
            s, e = seg
            t = times[devices == d]
            i = np.searchsorted(s, t, side="right") - 1  # last segment starting at or before t
            busy = (i >= 0) & (e[np.maximum(i, 0)] > t)
            nxt = i + 1
            idle = ~busy & (nxt < s.size)
            if not idle.any():
                continue
            # several calls returning in the same idle interval count it once, from the earliest of them
            gap = np.zeros(s.size, dtype=np.int64)
            np.maximum.at(gap, nxt[idle], s[nxt[idle]] - t[idle])
            total += int(gap.sum())
        return total

    def first_shapes(self, op_indices: np.ndarray) -> dict:
        """The input shapes text of the first instance (with shapes) of some ops."""
        if len(op_indices) == 0:
            return {}
        first = self.dm.first_given_values("input_shapes")
        first = first[first.index.isin(np.asarray(op_indices, dtype=np.int64))]
        return {int(o): str(v) for o, v in first.items()}


class MemoryData(DetectorData):
    """The detectors' reads over a model held in memory (trace frames, correlation, domain model)."""

    def __init__(self, trace, corr, dm, agg, iterations):
        super().__init__(dm, agg, iterations)
        self.trace, self.corr = trace, corr

    def _api_base(self) -> np.ndarray:
        api = self.trace.api_calls
        if len(api) == 0:
            return np.zeros(0, dtype=object)
        cats = api["name"].cat.categories.to_numpy(dtype=object)
        codes = api["name"].cat.codes.to_numpy(np.int64)
        base = np.append(_base_names(cats), "")
        return base[np.where(codes >= 0, codes, len(cats))]

    def _owner_op(self, owners: np.ndarray) -> np.ndarray:
        inst_op = self.dm.instances["op_index"].to_numpy(np.int64)
        owners = np.asarray(owners, dtype=np.int64)
        return np.where(owners >= 0, inst_op[np.maximum(owners, 0)] if inst_op.size else -1, -1)

    def memory_ops(self) -> pd.DataFrame:
        gpu, api = self.trace.gpu, self.trace.api_calls
        if len(gpu) == 0:
            return pd.DataFrame({c: [] for c in MEMORY_COLUMNS})
        launch = launch_times(self.trace, self.corr.gpu_api)
        kind = gpu["kind"].to_numpy()
        rows = np.flatnonzero(((kind == KIND_MEMCPY) | (kind == KIND_MEMSET)) & self.window.of(launch))
        api_rows = self.corr.gpu_api[rows]
        has = api_rows >= 0
        safe = np.maximum(api_rows, 0)
        base = self._api_base()
        out = pd.DataFrame(
            {
                c: gpu[c].to_numpy()[rows]
                for c in ("kind", "copy_kind", "src_kind", "dst_kind", "bytes", "start", "end", "device_id")
            }
        )
        out["api_id"] = np.where(has, api_rows, -1)
        out["api_name"] = np.where(has, base[safe] if len(base) else "", "")
        out["api_start"] = np.where(has, api["start"].to_numpy(np.int64)[safe] if len(api) else -1, -1)
        out["api_end"] = np.where(has, api["end"].to_numpy(np.int64)[safe] if len(api) else -1, -1)
        out["owner_op"] = self._owner_op(self.dm.gpu_instance[rows])
        return out

    def named_api_calls(self, names: set) -> pd.DataFrame:
        api = self.trace.api_calls
        if len(api) == 0:
            return pd.DataFrame({c: [] for c in API_COLUMNS})
        base = self._api_base()
        start = api["start"].to_numpy(np.int64)
        rows = np.flatnonzero(np.isin(base, list(names)) & self.window.of(start))
        out = pd.DataFrame(
            {
                "api_id": rows,
                "start": start[rows],
                "end": api["end"].to_numpy(np.int64)[rows],
                "global_tid": api["global_tid"].to_numpy(np.int64)[rows],
                "pid": api["pid"].to_numpy(np.int64)[rows],
                "name": base[rows],
            }
        )
        out["owner_op"] = self._owner_op(self.dm.api_instance[rows])
        return out

    def _gpu_by_device(self, before: int = EVER, keep=None) -> dict:
        gpu = self.trace.gpu
        c = {k: gpu[k].to_numpy(np.int64) for k in ("device_id", "start", "end", "pid")}
        m = c["start"] < before
        if keep is not None:
            m &= keep(c)
        dev = c["device_id"][m]
        s, e, pid = c["start"][m], c["end"][m], c["pid"][m]
        return {int(d): (s[dev == d], e[dev == d], pid[dev == d]) for d in np.unique(dev).tolist()}

    def cpu_activity(self, pids, t0: int, t1: int) -> dict:
        """Ranges (label, start, end, thread, data loading), API calls (base name) and I/O calls of some
        processes overlapping [t0, t1)."""
        trace, info = self.trace, self.corr.range_info
        pids = np.asarray(list(pids), dtype=np.int64)
        r = trace.ranges
        out = {}
        if len(r) and info is not None and len(info) == len(r):
            keep = (
                np.isin(r["pid"].to_numpy(np.int64), pids)
                & (r["end"].to_numpy(np.int64) > t0)
                & (r["start"].to_numpy(np.int64) < t1)
                & (r["end"].to_numpy(np.int64) > r["start"].to_numpy(np.int64))
            )
            rows = np.flatnonzero(keep)
            labels = info["label"].to_numpy(dtype=object)[rows]
            unlabelled = pd.isna(labels)
            # the text of those rows only: the whole column as objects would be a string per range (0.3 GB,
            # the peak of a 10^7-event Kineto trace's analysis)
            labels[unlabelled] = r["text"].iloc[rows[unlabelled]].to_numpy(dtype=object)
            out["ranges"] = pd.DataFrame(
                {
                    "label": labels,
                    "start": r["start"].to_numpy(np.int64)[rows],
                    "end": r["end"].to_numpy(np.int64)[rows],
                    "tid": r["global_tid"].to_numpy(np.int64)[rows],
                    "loader": info["dataloader"].to_numpy(dtype=bool)[rows],
                }
            )
        else:
            out["ranges"] = pd.DataFrame({"label": [], "start": [], "end": [], "tid": [], "loader": []})
        api = trace.api_calls
        if len(api):
            keep = (
                np.isin(api["pid"].to_numpy(np.int64), pids)
                & (api["end"].to_numpy(np.int64) > t0)
                & (api["start"].to_numpy(np.int64) < t1)
            )
            rows = np.flatnonzero(keep)
            out["api"] = pd.DataFrame(
                {
                    "name": self._api_base()[rows],
                    "start": api["start"].to_numpy(np.int64)[rows],
                    "end": api["end"].to_numpy(np.int64)[rows],
                }
            )
        else:
            out["api"] = pd.DataFrame({"name": [], "start": [], "end": []})
        io = trace.io_calls
        if len(io):
            keep = (
                np.isin(io["pid"].to_numpy(np.int64), pids)
                & (io["end"].to_numpy(np.int64) > t0)
                & (io["start"].to_numpy(np.int64) < t1)
            )
            out["io"] = pd.DataFrame(
                {
                    "name": io["name"].to_numpy(dtype=object)[keep],
                    "start": io["start"].to_numpy(np.int64)[keep],
                    "end": io["end"].to_numpy(np.int64)[keep],
                }
            )
        else:
            out["io"] = pd.DataFrame({"name": [], "start": [], "end": []})
        return out

    def has_ranges_or_gpu(self) -> bool:
        return len(self.trace.ranges) > 0 or len(self.trace.gpu) > 0

    def has_gpu_work(self) -> bool:
        return len(self.trace.gpu) > 0


class StoreData(DetectorData):
    """The detectors' reads over a model in the out-of-core store: the staged tables' part files scanned a
    part at a time (only selected rows are kept), SQL for the small reads."""

    def __init__(self, sa, dm, agg, iterations):
        super().__init__(dm, agg, iterations)
        self.sa, self.store = sa, sa.store
        base = _base_names(self.store.api_names)
        self._api_base = pd.DataFrame({"name_code": np.arange(len(base), dtype=np.int64), "base": base})
        self._base = np.append(base, "")  # (code -1: no name)
        self._memory = None

    def _with_api_names(self, query: str, params) -> pd.DataFrame:
        con = self.store.con
        con.register("_api_base", self._api_base)
        try:
            return self.store.frame(query, params)
        finally:
            con.unregister("_api_base")

    def _owner_op(self, owners, key: str, ids: np.ndarray, times: np.ndarray) -> np.ndarray:
        """The op of the instance owning each row (API call or GPU activity; `owners`: the sink's owner table
        of such rows, `key` its id column), -1 where none: rows of time segment j are looked up in that
        segment's part of the owner table (in id order)."""
        sink = self.dm.sink
        out = np.full(ids.size, -1, dtype=np.int64)
        segment = sink.chunk_of(times)
        for j in np.unique(segment).tolist():
            rows = np.flatnonzero(segment == j)
            part = owners.read(tag=j)
            stored = part.column(key).to_numpy()
            if stored.size == 0:
                continue
            at = np.minimum(np.searchsorted(stored, ids[rows]), stored.size - 1)
            found = stored[at] == ids[rows]
            owner = part.column("instance_id").to_numpy()[at[found]]
            out[rows[found]] = sink.inst_op[owner]
        return out

    def memory_ops(self) -> pd.DataFrame:
        if self._memory is None:
            window = self.window
            store, sink = self.store, self.dm.sink
            names = ["kind", "copy_kind", "src_kind", "dst_kind", "bytes", "start", "end", "device_id"]
            # each activity was staged with its launching call's id, start, duration and name (-1: none)
            g = store.gpu.read_range(
                window.lo,
                window.hi,
                names + ["api_id", "launch", "api_duration", "api_name", "activity_id"],
                key="launch",
                where=lambda c: ((c["kind"] == KIND_MEMCPY) | (c["kind"] == KIND_MEMSET)) & window.of(c["launch"]),
            )
            out = pd.DataFrame({c: g[c] for c in names})
            has = g["api_id"] >= 0
            out["api_id"] = g["api_id"]
            out["api_name"] = self._base[g["api_name"]]
            out["api_start"] = np.where(has, g["launch"], -1)
            out["api_end"] = np.where(has, g["launch"] + g["api_duration"], -1)
            out["owner_op"] = self._owner_op(sink.gpu_owner, "activity_id", g["activity_id"], g["launch"])
            self._memory = out[MEMORY_COLUMNS]
        return self._memory

    def named_api_calls(self, names: set) -> pd.DataFrame:
        codes = self._api_base.loc[self._api_base["base"].isin(names), "name_code"].to_numpy(np.int64)
        if not codes.size:
            return pd.DataFrame({c: [] for c in API_COLUMNS})
        window, sink = self.window, self.dm.sink
        a = self.store.api.read_range(
            window.lo,
            window.hi,
            ["api_id", "start", "end", "global_tid", "pid", "name_code"],
            key="start",
            where=lambda c: np.isin(c["name_code"], codes) & window.of(c["start"]),
        )
        out = pd.DataFrame({c: a[c] for c in ("api_id", "start", "end", "global_tid", "pid")})
        out["name"] = self._base[a["name_code"]]
        out["owner_op"] = self._owner_op(sink.api_owner, "api_id", a["api_id"], a["start"])
        return out[API_COLUMNS]

    def _gpu_by_device(self, before: int = EVER, keep=None) -> dict:
        """Per device, (start, end, pid) of the GPU activities starting before `before` that `keep` selects."""
        g = self.store.gpu.read_range(-EVER, before, ["device_id", "start", "end", "pid"], key="start", where=keep)
        return {
            int(d): (g["start"][g["device_id"] == d], g["end"][g["device_id"] == d], g["pid"][g["device_id"] == d])
            for d in np.unique(g["device_id"]).tolist()
        }

    def cpu_activity(self, pids, t0: int, t1: int) -> dict:
        pid_list = ",".join(str(int(p)) for p in pids) or "-1"
        ranges = self.store.frame(
            f"""
            SELECT i.label_code, r.text, i.start, i."end", i.global_tid AS tid, i.dataloader = 1 AS loader
            FROM range_info i JOIN ranges r USING (range_id)
            WHERE i.pid IN ({pid_list}) AND i."end" > $1 AND i.start < $2 AND i."end" > i.start""",
            [t0, t1],
        )
        labels = self.sa.pool.decode(ranges.pop("label_code").to_numpy(np.int64))
        texts = ranges.pop("text").to_numpy(dtype=object)
        ranges.insert(0, "label", np.where(pd.isna(labels), texts, labels))
        ranges["loader"] = ranges["loader"].astype(bool)
        api = self._with_api_names(
            f"""
            SELECT coalesce(n.base, '') AS name, a.start, a."end" FROM api a
            LEFT JOIN _api_base n ON n.name_code = a.name_code
            WHERE a.pid IN ({pid_list}) AND a."end" > $1 AND a.start < $2""",
            [t0, t1],
        )
        io = self.store.trace.io_calls
        keep = (
            np.isin(io["pid"].to_numpy(np.int64), np.asarray(list(pids), dtype=np.int64))
            & (io["end"].to_numpy(np.int64) > t0)
            & (io["start"].to_numpy(np.int64) < t1)
            if len(io)
            else np.zeros(0, dtype=bool)
        )
        return {
            "ranges": ranges,
            "api": api,
            "io": pd.DataFrame(
                {
                    "name": io["name"].to_numpy(dtype=object)[keep] if len(io) else [],
                    "start": io["start"].to_numpy(np.int64)[keep] if len(io) else [],
                    "end": io["end"].to_numpy(np.int64)[keep] if len(io) else [],
                }
            ),
        }

    def has_ranges_or_gpu(self) -> bool:
        return self.store.counts["ranges"] > 0 or self.store.counts["gpu"] > 0

    def has_gpu_work(self) -> bool:
        return self.store.counts["gpu"] > 0
