"""Out-of-core analysis over a `TraceStore`: the classification of every range, the launch links, the
segments the correlation walks, the op model it writes back into the store, and the chunks aggregation
reads from it. Where the engine has one function for a rule, this module only reads that function's inputs
from the store (the ranges' classification: markers.RangeClassifier; the iterations: iterate.IterationInputs);
the other steps match their in-memory counterparts (`correlate.py`, `model_chunks.py`) and are checked against
them in the tests. Names are integer codes into one string pool."""

from __future__ import annotations

import ctypes
import queue
import threading
from dataclasses import dataclass
from functools import partial
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pyarrow as pa

from dlprof_profiler import contract as K
from dlprof_profiler.engine import correlate as corr_mod
from dlprof_profiler.engine import markers as nm
from dlprof_profiler.engine.aggregate import LAUNCH_COLUMNS
from dlprof_profiler.engine.correlate import INSTANCE_COLUMNS, DomainFacts, Segment
from dlprof_profiler.engine import iterate
from dlprof_profiler.engine.model_chunks import (
    ACTIVITY_FIELDS,
    INSTANCE_FIELDS,
    RUNNING_FIELDS,
    TIME_MAX,
    ModelChunk,
    bucket_width,
    chunk_bounds,
    cuts_at,
)
from dlprof_profiler.store.parts import SMALL_BATCH_ROWS, PartTable, int_schema, read_part
from dlprof_profiler.process_memory import release_unused_memory
from dlprof_profiler.store.trace_store import TraceStore
from dlprof_profiler.engine.trace import LAUNCH_SHAPE, make_frame
from dlprof_profiler.outputs import report_format, reports

INFO_TEXT = [
    "label",
    "op_type",
    "func_stack",
    "stack_trace",
    "data_type",
    "input_shapes",
    "output_shapes",
    "parameters",
    "direction",
]
INFO_INT = ["kind", "seq", "backward", "dataloader", "callid", "fwd_callid"]
# range_info's narrow columns (a third less to insert for every range): flags and codes into the string pool
INFO_TYPES = {"kind": ("TINYINT", np.int8), "backward": ("TINYINT", np.int8), "dataloader": ("TINYINT", np.int8)}
CODE_TYPE = ("INTEGER", np.int32)
# the texts of an instance the database keeps (db_encode.DETAIL_COLUMNS)
DETAIL_TEXT = ["data_type", "input_shapes", "output_shapes", "parameters", "stack_trace"]
INSTANCE_TEXT = [
    "name",
    "label",
    "op_type",
    "direction",
    "data_type",
    "input_shapes",
    "output_shapes",
    "parameters",
    "stack_trace",
]
# the instances' integer columns (correlate.INSTANCE_COLUMNS without the domain and the texts) and call_id
INSTANCE_INT = [c for c in INSTANCE_COLUMNS if c != "domain" and c not in INSTANCE_TEXT] + ["call_id"]
CALL_METRICS = ("cpu_time", "cpu_overhead", "gpu_time", "gpu_idle", "n_kernels")  # correlate.CALL_METRICS
# a domain's instances as correlation writes them, and as aggregation reads them
# (narrow where the values are: a fifth less to write and read for every instance)
_INSTANCE_FIELDS = [(c, pa.int8() if c == "kind" else pa.int64()) for c in INSTANCE_INT] + [
    (f"{c}_code", pa.from_numpy_dtype(CODE_TYPE[1])) for c in INSTANCE_TEXT
]
INST_SCHEMA = pa.schema(_INSTANCE_FIELDS)
SORTED_SCHEMA = pa.schema(
    _INSTANCE_FIELDS + [("is_call", pa.bool_())] + [(f"call_{m}", pa.int64()) for m in CALL_METRICS]
)
OP_TABLE_BATCH_ROWS = 1 << 21  # calls grouped into ops at a time (correlate.OpGrouper)
# what aggregation reads of each segment's GPU activities (those launched in it, read from the staged
# gpu_by_launch in activity id order: every domain's owners of them were written in that order)
ACTS_COLUMNS = [c for c in ACTIVITY_FIELDS if c not in ("owner", "owner_op", "owner_start")] + [
    *LAUNCH_SHAPE,
    "long_code",
]
# what correlation reads of a segment's GPU activities (8 of the staged table's 31 columns: reading them all
# for each segment was 8 s of the main thread at 10^7 kernels)
SEGMENT_GPU_COLUMNS = ["activity_id", "kind", "name_code", "start", "end", "pid", "device_id", "api_id"]
# the ranges' own columns range_info holds (as the store's `ranges` table types them)
RANGE_COLUMNS = [
    ("range_id", pa.int64()),
    ("domain_code", pa.int64()),
    ("start", pa.int64()),
    ("end", pa.int64()),
    ("global_tid", pa.int64()),
    ("pid", pa.int64()),
    ("event_type", pa.int8()),
    ("unclosed", pa.bool_()),
]
# every range with its classification: the ranges' own columns, INFO_INT and a string pool code per INFO_TEXT
RANGE_INFO_SCHEMA = pa.schema(
    RANGE_COLUMNS
    + [(c, pa.from_numpy_dtype(INFO_TYPES.get(c, (None, np.int64))[1])) for c in INFO_INT]
    + [(f"{c}_code", pa.from_numpy_dtype(CODE_TYPE[1])) for c in INFO_TEXT]
)


class StringPool:
    """One table of distinct strings; every text column of the store holds codes into it (-1: None)."""

    def __init__(self):
        self.code: dict = {}
        self.values: list = []
        # decode's lookup: the values, then None (code -1) in every slot past them; grown, never rebuilt
        self.table = np.full(1, None, dtype=object)
        self.filled = 0  # the values already in it

    def encode(self, values) -> np.ndarray:
        """Codes of an object array's values. Rows are grouped by object first (object_groups: integers, no
        hashing of a string per row), then each distinct object is factorized by value: Python touches each
        distinct value once."""
        values = np.asarray(values, dtype=object)
        groups, first = object_groups(values)
        local, uniques = pd.factorize(values[first], use_na_sentinel=True)
        lut = np.empty(len(uniques) + 1, dtype=np.int64)
        lut[-1] = -1  # (factorize's -1: a missing value)
        for i, u in enumerate(uniques):
            c = self.code.get(u)
            if c is None:
                c = self.code[u] = len(self.values)
                self.values.append(u)
            lut[i] = c
        return lut[local][groups]

    def decode(self, codes) -> np.ndarray:
        """The values of codes (None for a negative one)."""
        n = len(self.values)
        if n >= len(self.table):  # no room for the None after the values: double it
            grown = np.full(2 * n + 1, None, dtype=object)
            grown[: self.filled] = self.table[: self.filled]
            self.table = grown
        if self.filled < n:
            self.table[self.filled : n] = self.values[self.filled :]
            self.filled = n
        codes = np.asarray(codes, dtype=np.int64)
        if len(codes) == 0 or codes.max() < 0:  # (most of the marker-only columns)
            return np.full(len(codes), None, dtype=object)
        if codes.min() < -1:
            codes = np.maximum(codes, -1)
        return self.table[codes]  # -1: the last slot, which stays None

    def array(self) -> np.ndarray:
        out = np.empty(len(self.values), dtype=object)
        out[:] = self.values
        return out


def object_groups(values) -> tuple[np.ndarray, np.ndarray]:
    """(group of each row, first row of each group) of an object array, grouped by object identity: the
    pointers the array holds, read as integers (rows holding one object hold one value; text columns share few
    objects, as the classifier spreads its per-distinct-text values over the rows)."""
    values = np.ascontiguousarray(values, dtype=object)  # (held while its pointers are read)
    if len(values) == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    pointers = np.ctypeslib.as_array((ctypes.c_ssize_t * len(values)).from_address(values.ctypes.data))
    if pointers.min() == pointers.max():  # one object (an all-None column): no factorization
        return np.zeros(len(values), dtype=np.int64), np.zeros(1, dtype=np.int64)
    groups = pd.factorize(pointers)[0]
    # factorize numbers groups in order of appearance: a group's first row is where the running maximum grows
    return groups, np.flatnonzero(np.diff(np.maximum.accumulate(groups), prepend=-1))


class StoreAnalysis:
    """The per-range, per-activity and per-instance tables of one store's analysis."""

    def __init__(self, store: TraceStore):
        self.store = store
        self.pool = StringPool()
        self.parts_folder = store.workdir / "parts"
        self.bounds: list = []  # the time segments: (lo, hi) pairs, once `segments` has planned them

    def publish(self, table: PartTable) -> None:
        """Make a complete part table queryable by its name (TraceStore.publish)."""
        self.store.publish(table)

    def cursor(self):
        return self.store.cursor()

    # -- classification -------------------------------------------------------------------------------
    def classify(self, mode: str | None) -> tuple[str, str | None, dict]:
        """Classify every range (in batches) into `range_info`, which holds the ranges' own columns too (every
        later query reads it alone, without joining the ranges); returns (mode, family, run config)."""
        classifier = nm.RangeClassifier(mode)
        self.range_info = PartTable(
            self.parts_folder, "range_info", RANGE_INFO_SCHEMA, keys=("start",), batch_rows=SMALL_BATCH_ROWS
        )
        domains = np.array(self.store.domains, dtype=object)
        for part in self.store.range_parts():
            texts = pd.Series(part["text"], dtype="str")
            dom = domains[part["domain_code"]] if len(domains) else np.zeros(0, object)
            info = classifier.classify(texts, dom)
            frame = {c: part[c] for c, _ in RANGE_COLUMNS}
            for c in INFO_INT:
                frame[c] = info[c].to_numpy().astype(INFO_TYPES.get(c, (None, np.int64))[1])
            for c in INFO_TEXT:
                frame[f"{c}_code"] = self.pool.encode(info[c].to_numpy(dtype=object)).astype(CODE_TYPE[1])
            self.range_info.append(frame)
        self.publish(self.range_info)
        return classifier.outcome()

    def range_labels(self) -> pd.DataFrame:
        """Ranges per (domain, label) (correlate.range_label_counts)."""
        f = self.store.frame("""
            SELECT domain_code, label_code, arg_min(kind, range_id) AS kind, count(*) AS num_ranges,
                   bool_or(dataloader = 1) AS dataloader, sum("end" - start) AS total_time
            FROM range_info GROUP BY ALL ORDER BY min(range_id)""")
        domains = np.array(self.store.domains, dtype=object)
        return pd.DataFrame(
            {
                "domain": domains[f["domain_code"].to_numpy(np.int64)] if len(f) else [],
                "label": self.pool.decode(f["label_code"].to_numpy(np.int64)),
                "kind": f["kind"].to_numpy(np.int64),
                "num_ranges": f["num_ranges"].to_numpy(np.int64),
                "dataloader": f["dataloader"].to_numpy(dtype=bool),
                "total_time": f["total_time"].to_numpy(np.int64),
            }
        )

    def domain_facts(self, domain: str, mode: str | None) -> DomainFacts:
        if mode == "simple" or domain not in self.store.domains:
            return DomainFacts(0, False, False, set(), set())
        code = self.store.domains.index(domain)
        markers = ",".join(str(k) for k in nm.OP_MARKERS)
        back = self.pool.code.get("bprop", -2)
        f = self.store.frame(f"""
            SELECT count(*) AS n, bool_or(i.kind IN ({markers})) AS has_markers,
                   bool_or(i.kind = {nm.DL_ARG}) AS dl_args
            FROM range_info i WHERE i.domain_code = {code} AND i.kind <> {nm.CONFIG}""")
        pids = self.store.frame(f"""
            SELECT i.pid, bool_or(i.kind = {nm.DL_ARG}) AS arg,
                   bool_or(i.kind IN ({nm.PT_OP}, {nm.DL_ARG}) AND (i.backward = 1 OR i.direction_code = {back}))
                       AS bwd,
                   bool_or(i.kind = {nm.DL_ARG} AND i.direction_code = {back}) AS linked
            FROM range_info i WHERE i.domain_code = {code} AND i.kind <> {nm.CONFIG} GROUP BY i.pid""")
        threads = self.store.frame(f"""
            SELECT DISTINCT i.global_tid FROM range_info i
            WHERE i.domain_code = {code} AND i.kind IN ({nm.PT_OP}, {nm.DL_ARG})""")
        row = f.iloc[0]
        return DomainFacts(
            n_ranges=int(row["n"]),
            has_markers=bool(row["has_markers"]),
            dl_args=bool(row["dl_args"]),
            unmarked_backward_pids=set(pids.loc[pids["arg"].astype(bool), "pid"].tolist())
            - set(pids.loc[pids["bwd"].astype(bool), "pid"].tolist()),
            marker_threads=set(threads["global_tid"].tolist()),
            linked_pids=set(pids.loc[pids["linked"].astype(bool), "pid"].tolist()),
        )

    def domain_order(self, mode: str | None) -> list[str]:
        return self.store.domain_order(mode)

    # -- launches ---------------------------------------------------------------------------------------
    def link_launches(self) -> tuple[dict, dict]:
        """The device each thread and process launches most GPU time on (staging linked every GPU activity to
        its launching call: the store's gpu_by_launch), and the kernel name pairs' Tensor Core use."""
        self.store.wait_staged()
        self.tc_pairs = self.store.kernel_pairs
        return dict(self.store.thread_device), dict(self.store.process_device)

    def device_pids(self) -> dict:
        return {d: set(p) for d, p in self.store.device_pids.items()}

    # -- iterations -------------------------------------------------------------------------------------
    def iteration_inputs(
        self, labels: pd.DataFrame, family: str | None, thread_device: dict, process_device: dict, preferred=None
    ) -> iterate.IterationInputs:
        """The iteration rule's inputs (iterate.trace_inputs) read from the store: the default key node from the
        range labels, the ranges a key node matches, the starts of the ranges and API calls."""
        return iterate.IterationInputs(
            default_key=lambda: preferred or iterate.default_key_node_of_labels(labels, family),
            ranges_where=partial(self.ranges_where, labels["label"].to_numpy(dtype=object)),
            event_starts=self.event_starts,
            thread_device=thread_device,
            process_device=process_device,
            profile_end=self.store.profile_end,
            profile_start=self.store.profile_start,
        )

    def ranges_where(self, labels: np.ndarray, label_test, text: str | None) -> pd.DataFrame:
        """The ranges whose label passes `label_test` (asked of the distinct `labels`) or whose text is `text`,
        in range order (iterate.key_node_ranges)."""
        hit = labels[np.asarray(label_test(labels), dtype=bool)] if len(labels) else labels
        codes = sorted({self.pool.code[v] for v in hit if v in self.pool.code})
        where = [f"i.label_code IN ({','.join(map(str, codes))})"] if codes else []
        if text is not None:
            where.append("i.range_id IN (SELECT range_id FROM ranges WHERE text = $1)")
        if not where:
            where = ["false"]
        f = self.store.frame(
            f"""SELECT i.start, i."end", i.pid, i.global_tid, i.backward, i.direction_code FROM range_info i
            WHERE {" OR ".join(where)} ORDER BY i.range_id""",
            [text] if text is not None else None,
        )
        f["direction"] = self.pool.decode(f.pop("direction_code").to_numpy(np.int64))
        return f

    def event_starts(self):
        """The starts of every range and API call, a batch at a time (iterate.occupied_by)."""
        for table in ("ranges", "api"):
            for batch in self.store.con.sql(f"SELECT start FROM {table}").to_arrow_reader(1 << 20):
                yield batch.column(0).to_numpy(zero_copy_only=False)

    # -- segments ---------------------------------------------------------------------------------------
    def plan_cuts(self, boundaries: np.ndarray, events_per_segment: int) -> list[int]:
        """Cut times giving segments of about `events_per_segment` events, at iteration boundaries where
        iterations are smaller than that, else inside the iterations."""
        total = sum(self.store.counts.values())
        if total <= events_per_segment:
            return []
        lo = int(
            self.store.scalar(
                "SELECT least((SELECT min(start) FROM ranges), (SELECT min(start) FROM api), "
                "(SELECT min(launch) FROM gpu_by_launch))"
            )
            or 0
        )
        hi = self.store.profile_end + 1
        width = bucket_width(lo, hi, total)
        f = self.store.frame(f"""
            SELECT b, sum(n) AS n FROM (
                SELECT (start - {lo}) // {width} AS b, count(*) AS n FROM ranges GROUP BY b
                UNION ALL SELECT (start - {lo}) // {width} AS b, count(*) AS n FROM api GROUP BY b
                UNION ALL SELECT (launch - {lo}) // {width} AS b, count(*) AS n FROM gpu_by_launch GROUP BY b)
            GROUP BY b ORDER BY b""")
        edges = lo + f["b"].to_numpy(np.int64) * width  # bucket starts
        return cuts_at(edges, np.cumsum(f["n"].to_numpy(np.int64)), boundaries, events_per_segment)

    def segment_activities(self, j: int, columns=None) -> dict:
        """Columns of the GPU activities launched in time segment j, in activity id order (as staged)."""
        lo, hi = self.bounds[j]
        return self.store.gpu.read_range(lo, hi, columns, key="launch")

    def segments(self, cuts: list[int]):
        """Segment by segment, the frames correlation needs (see correlate.Segment). A segment's own ranges are
        read from the parts of range_info whose starts meet it (the export's order, which nsys writes nearly in
        start order, keeps that to a part or two); the ranges still open at its start (context) are those of
        earlier segments ending after it, carried from segment to segment."""
        store = self.store
        carried = None  # range_info columns of the ranges open at the end of the previous segment
        self.bounds = chunk_bounds(cuts)
        for j, (lo, hi) in enumerate(self.bounds):
            own = _by_range_id(self.range_info.read_range(lo, hi))
            if carried is not None:
                open_rows = np.flatnonzero(carried["end"] > lo)
                context = {c: v[open_rows] for c, v in carried.items()}
                rows = {c: np.concatenate([context[c], own[c]]) for c in own}
                flags = np.concatenate([np.ones(open_rows.size, dtype=bool), np.zeros(own["start"].size, dtype=bool)])
            else:
                context, rows = None, own
                flags = np.zeros(own["start"].size, dtype=bool)
            ranges, info = self._range_frames(rows)
            ranges["context"] = flags
            # (context and own ranges each in range_id order, as correlation expects)
            still = own["end"] > hi
            later = {c: v[still] for c, v in own.items()}
            if context is not None:
                keep = context["end"] > hi
                later = _by_range_id({c: np.concatenate([context[c][keep], later[c]]) for c in later})
            carried = later
            api = store.api_window(lo, hi)
            gpu, gpu_api = self._gpu_launched(j, lo, hi, api)
            yield Segment(lo, hi, ranges, info, api, gpu, gpu_api)

    def _range_frames(self, f: dict) -> tuple[pd.DataFrame, pd.DataFrame]:
        """range_info columns -> the ranges and their classification as correlation takes them."""
        domains = np.array(self.store.domains, dtype=object)
        ranges = make_frame(
            {
                "range_id": f["range_id"].astype(np.int64, copy=False),
                "domain": domains[f["domain_code"]] if len(f["domain_code"]) else np.zeros(0, object),
                "start": f["start"].astype(np.int64, copy=False),
                "end": f["end"].astype(np.int64, copy=False),
                "global_tid": f["global_tid"].astype(np.int64, copy=False),
                "pid": f["pid"].astype(np.int64, copy=False),
                "event_type": f["event_type"].astype(np.int8, copy=False),
                "unclosed": f["unclosed"].astype(bool, copy=False),
            }
        )
        info = {c: f[c].astype(np.int64, copy=False) for c in ("kind", "seq", "callid", "fwd_callid")}
        info["kind"] = info["kind"].astype(np.int8)
        info["backward"] = f["backward"].astype(bool)
        info["dataloader"] = f["dataloader"].astype(bool)
        for c in INFO_TEXT:
            info[c] = self.pool.decode(f[f"{c}_code"])
        return ranges, make_frame(info)

    def _gpu_launched(self, j: int, lo: int, hi: int, api: pd.DataFrame) -> tuple[pd.DataFrame, np.ndarray]:
        """The GPU activities launched in [lo, hi) (segment j) and each one's launching call in `api`."""
        store = self.store
        f = self.segment_activities(j, SEGMENT_GPU_COLUMNS)
        api_id = f["api_id"]
        first = int(api["api_id"].iloc[0]) if len(api) else 0
        local = api_id - first
        ok = (api_id >= 0) & (local >= 0) & (local < len(api))
        return store.gpu_frame_of(f), np.where(ok, local, -1).astype(np.int64)


class StoreSink:
    """Where a DomainCorrelator writes one domain's op model: part files (parts.py), one per time segment."""

    def __init__(self, analysis: StoreAnalysis, domain_index: int, bounds, cuts=()):
        self.a = analysis
        self.d = domain_index
        # the ops' numbering restarts in each iteration (correlate.op_groups)
        self.bounds = np.sort(np.asarray(bounds, dtype=np.int64))
        self.cuts = np.sort(np.asarray(list(cuts), dtype=np.int64))  # chunk j: [cuts[j - 1], cuts[j])
        folder = analysis.parts_folder
        self.inst = PartTable(folder, f"inst_{domain_index}", INST_SCHEMA, keys=("instance_id",))
        self.api_owner = PartTable(folder, f"api_owner_{domain_index}", int_schema(["api_id", "instance_id"]))
        self.gpu_owner = PartTable(folder, f"gpu_owner_{domain_index}", int_schema(["activity_id", "instance_id"]))
        self.inst_sorted = PartTable(folder, f"inst_sorted_{domain_index}", SORTED_SCHEMA)
        self.patch = pd.DataFrame({"instance_id": pd.array([], dtype="Int64")})  # completed and re-kinded ones
        self.inst_op = self.inst_start = None  # per instance id, once finished: its op and its start

    def chunk_of(self, times) -> np.ndarray:
        """The time chunk (segment) of each time."""
        return np.searchsorted(self.cuts, np.asarray(times, dtype=np.int64), side="right")

    def add(self, seg, instances: pd.DataFrame, api_owner, gpu_owner) -> None:
        """One segment's new instances and the owners of its API calls and GPU activities."""
        k = int(self.chunk_of([seg.lo])[0])
        frame = {c: instances[c].to_numpy(np.int8 if c == "kind" else np.int64) for c in INSTANCE_INT}
        for c in INSTANCE_TEXT:
            frame[f"{c}_code"] = self.a.pool.encode(instances[c].to_numpy(dtype=object)).astype(CODE_TYPE[1])
        self.inst.append(frame, tag=k)
        self.api_owner.append(
            {"api_id": seg.api["api_id"].to_numpy(np.int64), "instance_id": np.asarray(api_owner, np.int64)}, tag=k
        )
        self.gpu_owner.append(
            {"activity_id": seg.gpu["activity_id"].to_numpy(np.int64), "instance_id": np.asarray(gpu_owner, np.int64)},
            tag=k,
        )

    # -- completing the model ---------------------------------------------------------------------------
    def finish(self, c) -> "StoreDomainModel":
        """Complete the partial instances, build the op table, give every instance its op_index."""
        for table in (self.inst, self.api_owner, self.gpu_owner):
            self.a.publish(table)
        if c.partial:
            self._complete(c)
        if c.kind_of:
            self._update(
                pd.DataFrame(
                    {
                        "instance_id": np.fromiter(c.kind_of, dtype=np.int64),
                        "kind": np.fromiter(c.kind_of.values(), dtype=np.int64),
                    }
                ),
                ["kind"],
            )
        self.a.store.con.register(f"_patch_{self.d}", self.patch)
        ops, op_of_call = self._op_table(c.domain, c.family, c.next_id)
        self._sort_instances(op_of_call, self._call_sums(), c.next_id)
        self.a.publish(self.inst_sorted)
        self.a.store.con.unregister(f"_patch_{self.d}")
        return StoreDomainModel(
            domain=c.domain,
            family=c.family,
            has_markers=c.facts.has_markers,
            ops=ops,
            n_ranges=c.facts.n_ranges,
            sink=self,
            n_instances=self.inst_sorted.rows,
        )

    def _patched(self) -> str:
        """The instances with the completed columns (a query over the instance parts and the patch)."""
        columns = [c for c in self.patch.columns if c != "instance_id"]
        if not columns:
            return self.inst.name
        replaced = ", ".join(f'coalesce(p."{c}", i."{c}") AS "{c}"' for c in columns)
        return (
            f"(SELECT i.* REPLACE ({replaced}) FROM {self.inst.name} i LEFT JOIN _patch_{self.d} p USING (instance_id))"
        )

    def _call_sums(self) -> pd.DataFrame:
        """Per call of several instances (the autograd nodes of one forward call: correlate.call_metrics), the
        sums of its instances' metrics (nearly every call is one instance: only those are summed)."""
        sums = ", ".join(f'sum(x."{m}") AS "{m}"' for m in CALL_METRICS)
        inst = self._patched()
        return self.a.store.frame(f"""
            WITH grouped AS (SELECT DISTINCT call_id FROM {self.inst.name} WHERE call_id <> instance_id)
            SELECT x.call_id, {sums} FROM {inst} x JOIN grouped USING (call_id) GROUP BY x.call_id
            ORDER BY x.call_id""")

    def _sort_instances(self, op_of_call: np.ndarray, multi: pd.DataFrame, n_ids: int) -> None:
        """`inst_sorted`: every instance with its op (its call's), whether it is a call and the call's metrics
        (0 on a call's other instances), written by the chunk its start falls in; per instance id its op and
        start are kept for the GPU activities it owns."""
        self.inst_op = np.full(max(n_ids, 1), -1, dtype=np.int32)
        self.inst_start = np.zeros(max(n_ids, 1), dtype=np.int64)
        patch = self.patch
        patch_ids = patch["instance_id"].to_numpy(np.int64)
        multi_ids = multi["call_id"].to_numpy(np.int64)
        for part in self.inst.parts:
            table = read_part(part.path)
            # the part's columns as they are (views of the file); only patched columns are copied
            cols = {name: table.column(name).to_numpy() for name in SORTED_SCHEMA.names if name in table.column_names}
            ids = cols["instance_id"]
            _apply_patch(cols, ids, patch, patch_ids)
            call = cols["call_id"]
            cols["op_index"] = op_of_call[call].astype(np.int64)
            is_call = call == ids
            pos = np.searchsorted(multi_ids, ids)
            in_multi = pos < multi_ids.size
            in_multi[in_multi] = multi_ids[pos[in_multi]] == ids[in_multi]
            for m in CALL_METRICS:
                own = cols[m]
                if in_multi.any():
                    own = own.copy()
                    own[in_multi] = multi[m].to_numpy(np.int64)[pos[in_multi]]
                cols[f"call_{m}"] = np.where(is_call, own, 0)
            cols["is_call"] = is_call
            self.inst_op[ids] = cols["op_index"]
            self.inst_start[ids] = cols["start"]
            chunk = self.chunk_of(cols["start"])
            chunks = np.unique(chunk)
            for j in chunks:
                # nearly every instance starts in the segment that made it: one part, not a copy
                part_cols = cols if chunks.size == 1 else {k: v[chunk == j] for k, v in cols.items()}
                self.inst_sorted.append({c: part_cols[c] for c in SORTED_SCHEMA.names}, tag=int(j), source=part.tag)
            del table, cols

    def instance_values(self, ids, columns) -> dict:
        """Columns of the given instances as correlation wrote them (not completed: their texts, say)."""
        return self.inst.lookup(np.asarray(ids, dtype=np.int64), columns)

    def instances_by_start(self, columns):
        """Per time chunk, the columns of the instances starting in it, in (start, instance_id) order."""
        for j in range(self.cuts.size + 1):
            yield _sorted_columns(self.inst_sorted.read(tag=j, columns=list(columns)), "start", "instance_id")

    def activities(self, j: int) -> dict:
        """The GPU activities launched in segment j with their owners in this domain (model_chunks.ACTIVITY_FIELDS)
        in (launch, activity_id) order."""
        cols = self.a.segment_activities(j, ACTS_COLUMNS)
        owner = self.gpu_owner.read(tag=j).column("instance_id").to_numpy()
        cols["owner"] = owner
        cols["owner_op"] = self.inst_op[owner].astype(np.int64)
        cols["owner_start"] = self.inst_start[owner]
        if owner.size > 1:
            order = np.lexsort((cols["activity_id"], cols["launch"]))
            cols = {c: v[order] for c, v in cols.items()}
        return cols

    def _update(self, frame: pd.DataFrame, columns: list[str]) -> None:
        """Completed columns of some instances (applied to every later read of them)."""
        new = frame[["instance_id"] + columns].astype("Int64")  # nullable: a row patches only its columns
        merged = self.patch.astype({"instance_id": "Int64"}).merge(
            new, on="instance_id", how="outer", suffixes=("", "_new")
        )
        for c in columns:
            if f"{c}_new" in merged:
                merged[c] = merged[f"{c}_new"].combine_first(merged[c])
                del merged[f"{c}_new"]
        self.patch = merged.sort_values("instance_id", ignore_index=True)

    def _complete(self, c) -> None:
        """Metrics of the instances that crossed segment bounds, over all their API calls and activities: the
        rows they need read from the store, then correlate.instance_metrics as in memory."""
        store, con = self.a.store, self.a.store.con
        inst, api_owner, gpu_owner = self.inst.name, self.api_owner.name, self.gpu_owner.name
        con.register("_partial", pd.DataFrame({"instance_id": np.array(sorted(c.partial), dtype=np.int64)}))
        part = store.frame(
            f'SELECT instance_id, kind, start, "end", pid, global_tid FROM {inst} '
            "JOIN _partial USING (instance_id) ORDER BY instance_id"
        )
        span = store.frame(f"""SELECT o.instance_id AS i, min(a.start) AS s, max(a."end") AS e FROM {api_owner} o
                               JOIN _partial USING (instance_id) JOIN api a USING (api_id) GROUP BY 1""")
        part = corr_mod.backward_pass_spans(part, span.set_index("i"))
        con.register("_part", part)
        # the API calls on their threads inside their spans (each once), and the activities they own
        api = store.frame("""
            SELECT DISTINCT x.api_id, x.global_tid, x.start, x."end" FROM _part p JOIN api x
              ON x.global_tid = p.global_tid AND x.start < p."end" AND x."end" > p.start
            WHERE p.global_tid >= 0""")
        gpu = store.frame(f"""
            SELECT o.instance_id, x.start, x."end", x.kind, x.device_id
            FROM {gpu_owner} o JOIN _partial USING (instance_id) JOIN gpu x USING (activity_id)""")
        con.unregister("_part")
        con.unregister("_partial")
        corr_mod.instance_metrics(
            part, api, gpu, gpu["instance_id"].to_numpy(np.int64), c.thread_device, c.process_device
        )
        out = part[
            ["instance_id", "start", "end", "cpu_time", "cpu_overhead", "gpu_time", "gpu_start", "gpu_end"]
            + ["gpu_idle", "n_gpu", "n_kernels", "device_id"]
        ]
        self._update(out, [c for c in out.columns if c != "instance_id"])

    def _op_table(self, domain: str, family: str | None, n_ids: int) -> tuple[pd.DataFrame, np.ndarray]:
        """The op table (correlate.OpGrouper over the calls streamed from the store in (start, instance id)
        order, text as pool codes): one row per (name, direction, nth); and per instance id that is a call
        (the first instance of it), its op_index (-1 elsewhere)."""
        store, pool = self.a.store, self.a.pool
        op_of_call = np.full(max(n_ids, 1), -1, dtype=np.int32)
        texts = {c: f"{c}_code" for c in ("op_type", "label", "data_type", "stack_trace")}
        calls = store.con.sql(f"""
            SELECT instance_id, start, global_tid, name_code, direction_code, device_id, kind,
                   {", ".join(texts.values())}
            FROM {self._patched()} WHERE call_id = instance_id ORDER BY start, instance_id""")
        grouper = corr_mod.OpGrouper(self.bounds)
        empty = pool.code.get("")  # a missing direction is the empty one (correlate.op_table: fillna(""))
        for batch in calls.to_arrow_reader(OP_TABLE_BATCH_ROWS):
            h = {name: batch.column(name).to_numpy() for name in batch.schema.names}
            direction = (
                h["direction_code"] if empty is None else np.where(h["direction_code"] < 0, empty, h["direction_code"])
            )
            values = {c: h[code] for c, code in texts.items()} | {"kind": h["kind"]}
            gid = grouper.add(
                h["instance_id"], h["start"], h["global_tid"], h["name_code"], direction, h["device_id"], values
            )
            op_of_call[h["instance_id"]] = gid  # the op's gid until the op table numbers the ops
            del batch, h
        if grouper.ops is None:
            return corr_mod.op_table(pd.DataFrame(), domain, family), op_of_call
        groups = grouper.table()
        for c in ("name", "direction", *texts):  # OP_GIVEN columns: None where no call gave one
            groups[c] = pool.decode(pd.Series(groups[c], dtype=object).fillna(-1).to_numpy(np.int64))
        groups["direction"] = groups["direction"].fillna("")
        groups["kind"] = groups["kind"].to_numpy(np.int64)
        ops, op_index = corr_mod.finish_op_table(groups, domain, family)
        calls_of = op_of_call >= 0
        op_of_call[calls_of] = op_index[op_of_call[calls_of]]
        return ops, op_of_call


def _apply_patch(cols: dict, ids: np.ndarray, patch: pd.DataFrame, patch_ids: np.ndarray) -> None:
    """Overwrite the patched columns of the patched instances among `ids` (in place)."""
    if patch_ids.size == 0:
        return
    pos = np.searchsorted(patch_ids, ids)
    hit = pos < patch_ids.size
    hit[hit] = patch_ids[pos[hit]] == ids[hit]
    if not hit.any():
        return
    rows, at = np.flatnonzero(hit), pos[hit]
    for c in patch.columns:
        if c == "instance_id" or c not in cols:
            continue
        values = patch[c]
        given = ~values.isna().to_numpy()[at]
        if given.any():
            column = cols[c] = np.array(cols[c], dtype=np.int64)  # a writable copy
            column[rows[given]] = values.to_numpy(dtype=np.int64, na_value=0)[at[given]]


# what a kernel-launch row of the iteration report takes from its GPU activity and from its launching instance
LAUNCH_ACTIVITY = [*LAUNCH_SHAPE, "long_code"]
LAUNCH_INSTANCE = ["data_type", "input_shapes", "parameters", "output_shapes"]
LAUNCH_SPILL_SCHEMA = pa.schema(
    [(c, pa.bool_() if c == "uses_tc" else pa.int64()) for c in LAUNCH_COLUMNS]  # aggregate._launch_rows
    + [("seq", pa.int64())]
    + [(c, pa.int64()) for c in LAUNCH_ACTIVITY]
    + [(c, pa.from_numpy_dtype(CODE_TYPE[1])) for c in LAUNCH_INSTANCE]
)
# an iteration whose launch rows outgrow this is ordered by DuckDB (which spills), not in memory
REPORT_SORT_ROWS = 1 << 21


class LaunchSpill:
    """The kernel-launch rows of one aggregation of one domain, spilled chunk by chunk (the aggregation's
    `keep_launches` sink) with everything the iteration report shows of them, and read back in its order."""

    def __init__(self, sink: "StoreSink"):
        self.sink = sink
        self.parts = PartTable(sink.a.parts_folder, f"launches_{sink.d}", LAUNCH_SPILL_SCHEMA)
        self.rows = 0

    def __call__(self, launches: pd.DataFrame, launched: pd.DataFrame) -> None:
        """The launch rows of a chunk (aggregate._launch_rows) and the GPU activities they come from, row by row."""
        frame = {c: launches[c].to_numpy() for c in LAUNCH_COLUMNS}
        frame["seq"] = self.rows + np.arange(len(launches), dtype=np.int64)  # launch order breaks ties
        self.rows += len(launches)
        for c in LAUNCH_ACTIVITY:
            frame[c] = launched[c].to_numpy(np.int64)
        codes = self.sink.instance_values(frame["instance"], [f"{c}_code" for c in LAUNCH_INSTANCE])
        for c in LAUNCH_INSTANCE:
            frame[c] = codes[f"{c}_code"]
        self.parts.append(frame)

    def report_chunks(self, ops: pd.DataFrame, rows_per_chunk: int):
        """Chunks of kernel-launch rows (reports.LAUNCH_COLUMNS) in report order: iteration, the op's first
        start, kernel name, GPU start, launch order (reports.launch_order). The rows were spilled in launch
        order, so an iteration's rows are in one part or in consecutive ones: each part is ordered in memory,
        the rows of its last iteration held back until the next part has added its own."""
        n_ops = int(ops["op_index"].max()) + 1 if len(ops) else 0
        first_start = np.full(n_ops + 1, TIME_MAX, dtype=np.int64)  # ops without a first start sort last
        first_start[ops["op_index"].to_numpy(np.int64)] = ops["first_start"].to_numpy(np.int64)
        op_rank = np.unique(first_start, return_inverse=True)[1].reshape(-1)  # equal starts, equal ranks
        held = None
        for part in self.parts.parts:
            table = self.parts.read_part(part, REPORT_SPILL_COLUMNS)  # what the report shows: not the ids
            cols = {c: table.column(c).to_numpy() for c in table.column_names}
            if held is not None:
                cols = {c: np.concatenate([held[c], cols[c]]) for c in cols}
            # the held rows come first in their order, then this part's in launch order: a stable sort
            # leaves rows of equal keys in launch order (seq) without sorting by it
            order = reports.launch_order(
                cols["iteration"], op_rank[cols["op_index"]], cols["name_code"], cols["gpu_start"]
            )
            cols = {c: v[order] for c, v in cols.items()}
            last = cols["iteration"][-1]
            done = int(np.searchsorted(cols["iteration"], last, side="left"))
            yield from _report_batches({c: v[:done] for c, v in cols.items()}, rows_per_chunk)
            held = {c: v[done:] for c, v in cols.items()}
            if held["iteration"].size > REPORT_SORT_ROWS:  # one iteration of very many launches: not in memory
                yield from self._sorted_by_duckdb(int(last), ops, rows_per_chunk)
                return
        if held is not None:
            yield from _report_batches(held, rows_per_chunk)

    def _sorted_by_duckdb(self, from_iteration: int, ops: pd.DataFrame, rows_per_chunk: int):
        """The rows of the iterations from `from_iteration` on, ordered by DuckDB over the spilled parts."""
        first = pd.DataFrame(
            {"op_index": ops["op_index"].to_numpy(np.int64), "first_start": ops["first_start"].to_numpy(np.int64)}
        )
        reader = self.sink.a.cursor()
        try:
            self.parts.register(reader, "_launches")
            reader.register("_op_first", first)
            result = reader.sql(f"""
                SELECT l.* FROM _launches l LEFT JOIN _op_first f ON f.op_index = l.op_index
                WHERE l.iteration >= {int(from_iteration)}
                ORDER BY l.iteration, coalesce(f.first_start, {TIME_MAX}), l.name_code, l.gpu_start, l.seq""")
            for batch in result.to_arrow_reader(rows_per_chunk):
                yield _report_columns({c: batch.column(c).to_numpy(zero_copy_only=False) for c in batch.schema.names})
        finally:
            reader.close()


def _report_batches(cols: dict, rows_per_chunk: int):
    n = cols["iteration"].size
    for lo in range(0, n, rows_per_chunk):
        yield _report_columns({c: v[lo : lo + rows_per_chunk] for c, v in cols.items()})


# the spilled columns _report_columns reads
REPORT_SPILL_COLUMNS = [
    *("iteration", "device_id", "gpu_start", "gpu_duration", "api_start", "api_duration", "uses_tc"),
    *LAUNCH_SHAPE,
    *("op_index", "name_code", "long_code"),
    *LAUNCH_INSTANCE,
]


def _report_columns(cols: dict) -> dict:
    """Spilled launch rows -> reports.LAUNCH_COLUMNS."""
    out = {c: cols[c] for c in ("iteration", "device_id", "gpu_start", "gpu_duration", "api_start", "api_duration")}
    out["uses_tc"] = cols["uses_tc"].astype(bool)
    for c in (*LAUNCH_SHAPE, "op_index"):
        out[c] = cols[c]
    out["kernel_name"] = cols["name_code"]  # codes into the sorted distinct names
    out["long_kernel_name"] = cols["long_code"]
    for c in LAUNCH_INSTANCE:
        out[c] = cols[c]
    return out


class StoreDomainModel:
    """One domain's op model living in the store (the in-memory DomainModel's ops and counts)."""

    def __init__(self, domain, family, has_markers, ops, n_ranges, sink: StoreSink, n_instances: int):
        self.domain, self.family, self.has_markers, self.ops = domain, family, has_markers, ops
        self.n_ranges, self.sink, self.n_instances = n_ranges, sink, n_instances

    def first_call_values(self, column: str, op_index) -> np.ndarray:
        """Per op of `op_index`, `column` of its first call (earliest start, then lowest instance id; as
        DomainModel.first_call_values in memory)."""
        return self.first_calls([column], op_index)[column]

    def first_calls(self, columns, op_index) -> dict:
        """Per op of `op_index`, the text `columns` of its first call (model_chunks.first_calls in memory), in
        one pass over the instances."""
        op_index = np.asarray(op_index, dtype=np.int64)
        sink = self.sink
        codes = ", ".join(f"{c}_code AS c{i}" for i, c in enumerate(columns))
        f = sink.a.store.frame(f"""SELECT DISTINCT ON (op_index) op_index, {codes}
                                   FROM inst_sorted_{sink.d} ORDER BY op_index, start, instance_id""")
        out = {}
        for i, c in enumerate(columns):
            values = pd.Series(
                sink.a.pool.decode(f[f"c{i}"].to_numpy(np.int64)), index=f["op_index"].to_numpy(np.int64), dtype=object
            )
            column = values.reindex(op_index).to_numpy(dtype=object).copy()
            column[pd.isna(column)] = None
            out[c] = column
        return out

    def instance_chunks(self, columns, rows: int):
        """The instances' `columns` in start order, `rows` at a time (DomainModel.instance_chunks)."""
        for cols in self.sink.instances_by_start(columns):
            for lo in range(0, cols["start"].size, rows):
                yield pd.DataFrame({c: cols[c][lo : lo + rows] for c in columns}, copy=False)

    def first_given_values(self, column: str) -> pd.Series:
        """Per op_index, the first non-empty `column` value of its instances in start order (graph_events)."""
        sink = self.sink
        pool = sink.a.pool
        empty = pool.code.get("", -2)
        f = sink.a.store.frame(f"""SELECT DISTINCT ON (op_index) op_index, {column}_code AS code
                                   FROM inst_sorted_{sink.d} WHERE {column}_code >= 0 AND {column}_code <> {empty}
                                   ORDER BY op_index, start, instance_id""")
        return pd.Series(
            pool.decode(f["code"].to_numpy(np.int64)), index=f["op_index"].to_numpy(np.int64), dtype=object
        )

    def iteration_report(self, agg):
        """The iteration report of one aggregation, streamed from its spilled launch rows."""
        store, spill = self.sink.a.store, agg.launch_spill
        text = self.sink.a.pool.array()
        dicts = reports.launch_dictionaries(
            self.ops,
            store.gpu_short,
            store.gpu_long,
            dict.fromkeys(("data_type", "input_shapes", "parameters", "output_shapes"), text),
        )
        return reports.iteration_report_from_chunks(
            lambda: spill.report_chunks(self.ops, report_format.CHUNK_ROWS), dicts
        )

    def instances_of_ops(self, op_index, columns) -> pd.DataFrame:
        """The `columns` of the instances of some ops, in start order (as DomainModel.instances_of_ops)."""
        idx = ",".join(str(int(i)) for i in op_index)
        return self.instances_where(f"op_index IN ({idx})")[list(columns)]

    def instances_where(self, where: str = "true", params=None) -> pd.DataFrame:
        """Instances as the in-memory model holds them (text columns decoded)."""
        sink = self.sink
        f = sink.a.store.frame(f"SELECT * FROM inst_sorted_{sink.d} WHERE {where} ORDER BY start, instance_id", params)
        for c in INSTANCE_TEXT:
            f[c] = sink.a.pool.decode(f.pop(f"{c}_code").to_numpy(np.int64))
        f["domain"] = self.domain
        return f


@dataclass(kw_only=True)
class StoreCorrelation(corr_mod.OpModel):
    """The op model of a staged trace (correlate.Correlation's out-of-core counterpart): its domains are
    StoreDomainModels; the per-activity links and the range classification live in the store (`store`)."""

    store: StoreAnalysis


class StoreModel:
    """Chunks of a domain's op model read from the store (model_chunks.InMemoryModel's interface)."""

    def __init__(
        self,
        analysis: StoreAnalysis,
        dm: StoreDomainModel,
        mode: str,
        device_ids: list[int],
        device_pids: dict,
        io_calls: pd.DataFrame,
    ):
        self.a, self.dm = analysis, dm
        self.domain, self.family, self.mode = dm.domain, dm.family, mode
        self.ops = dm.ops
        self._device_ids, self._device_pids = device_ids, device_pids
        store = analysis.store
        loader = store.frame("""SELECT start, "end", pid FROM range_info WHERE dataloader = 1 ORDER BY start""")
        self.loader = make_frame({c: loader[c].to_numpy(np.int64) for c in ("start", "end", "pid")})
        self.io = make_frame({c: io_calls[c].to_numpy(np.int64) for c in ("start", "end", "pid")})

    def first_calls(self, columns, op_index) -> dict:
        return self.dm.first_calls(columns, op_index)

    def window_end(self, iterations, iter_start: int, iter_stop: int) -> int | None:
        """Latest end of any op instance or GPU activity of key-node intervals iter_start..iter_stop."""
        lo, hi = iterations.time_range(iter_start, iter_stop)
        d = self.dm.sink.d
        value = self.a.store.scalar(
            f"""SELECT greatest(
            (SELECT max("end") FROM inst_sorted_{d} WHERE start >= $1 AND start < $2),
            (SELECT max("end") FROM gpu_by_launch WHERE launch >= $1 AND launch < $2))""",
            [lo, hi],
        )
        return None if value is None else int(value)

    def op_names(self) -> np.ndarray:
        names = np.full(len(self.ops), "", dtype=object)
        names[self.ops["op_index"].to_numpy(np.int64)] = self.ops["name"].to_numpy(dtype=object)
        return names

    def kernel_names(self):
        store = self.a.store
        short = store.gpu_short

        def long_names(ids):
            ids = np.asarray(ids, dtype=np.int64)
            if ids.size == 0:
                return np.zeros(0, dtype=object)
            return store.gpu_long[store.gpu.lookup(ids, ["long_code"], key="activity_id")["long_code"]]

        return short, long_names

    def memory_events(self) -> pd.DataFrame:
        """The allocations and frees of the export (a small frame, read in memory as ingest.nsys reads it)."""
        return self.a.store.trace.memory

    def device_ids(self) -> list[int]:
        return list(self._device_ids)

    def device_pids(self) -> dict:
        return self._device_pids

    def empty_acts(self) -> pd.DataFrame:
        return make_frame({c: np.zeros(0, dtype=bool if c == "uses_tc" else np.int64) for c in ACTIVITY_FIELDS})

    def chunks(self, cuts=None):
        sink, store = self.dm.sink, self.a.store
        bounds = chunk_bounds(cuts)
        if len(bounds) != sink.cuts.size + 1 or any(lo != int(c) for (lo, _), c in zip(bounds[1:], sink.cuts)):
            raise ValueError("an out-of-core model is read in the time segments it was correlated in")
        for j, ((lo, hi), inst) in enumerate(zip(bounds, sink.instances_by_start(INSTANCE_FIELDS))):
            acts = sink.activities(j)
            running = make_frame(store.gpu.read_range(lo, hi, RUNNING_FIELDS, key="start"))

            def within(frame):
                t = frame["start"].to_numpy(np.int64)
                return frame[(t >= lo) & (t < hi)]

            yield ModelChunk(lo, hi, make_frame(inst), make_frame(acts), running, within(self.loader), within(self.io))
            release_unused_memory()  # the chunk's frees, before the next one's allocations


def _by_range_id(cols: dict) -> dict:
    """Numpy columns with rows in range_id order (unchanged when they are)."""
    ids = cols["range_id"]
    if ids.size > 1 and not bool(np.all(ids[1:] > ids[:-1])):
        order = np.argsort(ids, kind="stable")
        return {c: v[order] for c, v in cols.items()}
    return cols


def _sorted_columns(table: pa.Table, *keys: str) -> dict:
    """An Arrow table's columns as numpy arrays, rows in the order of `keys` (the first the major one)."""
    cols = {c: table.column(c).to_numpy() for c in table.column_names}
    if table.num_rows > 1:
        order = np.lexsort(tuple(cols[k] for k in reversed(keys)))
        if not bool(np.all(order[1:] > order[:-1])):
            cols = {c: v[order] for c, v in cols.items()}
    return cols


# ---------------------------------------------------------------------------- the DLProf database

WRITE_ROWS = 1 << 18  # rows read from the store and queued for the database writer at a time


class DatabaseFeed:
    """Feeds a new database's writer (database.DatabaseWriter) from the store as the analysis makes things, on a
    thread of its own (the writer's queue is short: waiting for it must not hold up the analysis): the raw
    facts once staged (`raw_ranges`, `raw_calls`), each time segment's GPU activity owners once correlated
    (`owners`), the op model once complete (`model`), each table's indexes once its rows are in. The rows
    themselves are read from the part files and encoded on the writer's thread. `set_final(primary, profile)`
    and `finish()` -> ({domain name: domain_id}, op index maps); `cancel()` drops what is not queued yet (the
    analysis failed)."""

    def __init__(self, writer, store):
        self.writer, self.store = writer, store
        self.corr = self.primary = self.profile = None
        self._tasks: queue.Queue = queue.Queue()
        self._owned: dict = {}  # domain -> the segments whose owners are queued
        self._owners_indexed = False  # their indexes are queued
        self._error: BaseException | None = None
        self._cancelled = False
        self._thread = threading.Thread(target=self._run, name="dlprof-db-feed", daemon=True)
        self._thread.start()

    def raw_ranges(self) -> None:
        self._tasks.put(lambda: self.writer.add_raw(SimpleNamespace(ranges=self.store.frame_chunks("ranges"))))

    def raw_calls(self) -> None:
        """The API calls, GPU activities, synchronizations and I/O calls (once staged)."""
        trace = self.store.trace
        for frame in ("api_calls", "gpu"):  # the order _raw_rows writes a whole trace in
            self._tasks.put(
                lambda frame=frame: self.writer.add_raw(SimpleNamespace(**{frame: self.store.frame_chunks(frame)}))
            )
        self._tasks.put(
            lambda: self.writer.add_raw(
                SimpleNamespace(syncs=trace.syncs, io_calls=trace.io_calls, memory=trace.memory)
            )
        )

    def owners(self, segment: int, sinks: dict) -> None:
        """The owners of segment `segment`'s GPU activities in each domain ({domain name: StoreSink})."""
        for name, sink in sinks.items():
            self._owned.setdefault(name, set()).add(segment)
            self._tasks.put(
                lambda name=name, sink=sink: self.writer.add_domain_model(name, None, _owners(sink, segment))
            )
        if all(len(self._owned[name]) == len(sink.a.bounds) for name, sink in sinks.items()):
            self._index_owners()  # the last segment: index the owners while the op tables are built

    def _index_owners(self) -> None:
        """Every owner is queued: their indexes next (once)."""
        if not self._owners_indexed:
            self._owners_indexed = True
            self._tasks.put(lambda: self.writer.build_indexes(K.RAW_ACTIVITY_OWNERS))

    def model(self, corr) -> None:
        """The op model is complete: every domain's ops and instances (and the owners not queued yet), then the
        indexes."""
        self.corr = corr
        for name, dm in corr.domains.items():
            sink = dm.sink
            rest = [k for k in range(len(sink.a.bounds)) if k not in self._owned.get(name, set())]
            for k in rest:
                self._tasks.put(
                    lambda name=name, sink=sink, k=k: self.writer.add_domain_model(name, None, _owners(sink, k))
                )
        self._index_owners()
        strings = pd.CategoricalDtype(pd.Index(corr.store.pool.array(), dtype=object))
        for name, dm in corr.domains.items():
            self._tasks.put(lambda name=name, dm=dm: self._instances(name, dm, strings))
        self._tasks.put(self.writer.build_indexes)

    def _instances(self, name: str, dm, strings) -> None:
        """A domain's ops (first: they get consecutive database op indexes), then its instances in id order (the
        segments made them in that order)."""
        self.writer.add_ops(name, dm.ops)
        sink = dm.sink
        self.writer.add_domain_model(name, _instance_frames(sink, strings), None)

    def set_final(self, primary: str, profile: dict) -> None:
        """What `finish` writes last: the primary domain and the profile's facts."""
        self.primary, self.profile = primary, profile

    def start(self) -> None:
        """Nothing left to start: `model` queued the model (the run's output writing calls this)."""

    def cancel(self) -> None:
        self._cancelled = True
        self._tasks.put(None)

    def join(self) -> None:
        """Wait for the feeding thread (also after a failure elsewhere: the store must outlive it)."""
        if self._thread.is_alive():
            self._tasks.put(None)
            self._thread.join()

    def finish(self) -> tuple[dict, dict]:
        self.join()
        if self._error is not None:
            raise self._error
        corr, writer = self.corr, self.writer
        domains = {
            name: {"family": corr.family, "has_markers": dm.has_markers, "num_ranges": dm.n_ranges}
            for name, dm in corr.domains.items()
        }
        ids = writer.finish(
            self.profile, self.primary, domains, corr.config, corr.range_labels, kernel_tc_pairs(corr.store)
        )
        return ids, writer.op_index_maps()

    def _run(self) -> None:
        while True:
            task = self._tasks.get()
            if task is None:
                return
            if self._cancelled or self._error is not None:
                continue
            try:
                task()
            except BaseException as exc:  # noqa: BLE001 - re-raised by finish() on the analysis thread
                self._error = exc


def _owners(sink: "StoreSink", segment: int):
    """A domain's owners of one segment's GPU activities in activity id order, as frames (read on the writer's
    thread)."""
    acts = sink.a.segment_activities(segment, ["activity_id", "api_id", "launch"])
    owners = {
        "activity_id": acts["activity_id"],
        "instance_id": sink.gpu_owner.read(tag=segment).column("instance_id").to_numpy(),
        "api_id": acts["api_id"],
        "launch_time": acts["launch"],
    }
    for lo in range(0, owners["activity_id"].size, WRITE_ROWS):
        yield pd.DataFrame({c: v[lo : lo + WRITE_ROWS] for c, v in owners.items()}, copy=False)


def _instance_frames(sink: "StoreSink", strings: pd.CategoricalDtype):
    """A domain's instances in id order, WRITE_ROWS at a time, as the writer takes them."""
    for k in sink.inst_sorted.sources():
        cols = _sorted_columns(sink.inst_sorted.read(source=k), "instance_id")
        n = cols["instance_id"].size
        for lo in range(0, n, WRITE_ROWS):
            yield _instances_frame({c: v[lo : lo + WRITE_ROWS] for c, v in cols.items()}, strings)


def _instances_frame(cols: dict, strings: pd.CategoricalDtype) -> pd.DataFrame:
    """Instances as the database writer takes them: the detail texts as categoricals over the string pool
    (the writer looks up only the strings the rows use; no text is built per row)."""
    frame = {c: v for c, v in cols.items() if not c.endswith("_code")}
    for c in DETAIL_TEXT:
        codes = cols[f"{c}_code"]
        if (codes < 0).all():
            frame[c] = pd.Series(np.full(codes.size, None, dtype=object), dtype=object, copy=False)
        else:
            frame[c] = pd.Categorical.from_codes(codes, dtype=strings)
    return pd.DataFrame(frame, copy=False)


def kernel_tc_pairs(sa: StoreAnalysis) -> pd.DataFrame:
    """Tensor Core use per distinct (name, long name) of the GPU activities (database.kernel_tc_pairs)."""
    store = sa.store
    kernels = sa.tc_pairs
    others = store.other_pairs
    pairs = pd.concat(
        [kernels[["name_code", "long_code", "uses_tc", "tc_rule"]], others.assign(uses_tc=False, tc_rule="")],
        ignore_index=True,
    )
    pairs = pairs.drop_duplicates(["name_code", "long_code"])
    return pd.DataFrame(
        {
            "name": store.gpu_short[pairs["name_code"].to_numpy(np.int64)],
            "long_name": store.gpu_long[pairs["long_code"].to_numpy(np.int64)],
            "uses_tc": pairs["uses_tc"].to_numpy(dtype=bool).astype(np.int64),
            "tc_rule": pd.Series(pairs["tc_rule"].to_numpy(dtype=object), dtype=object),
        }
    )
