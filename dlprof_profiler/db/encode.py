"""Trace frames -> Arrow tables in the layout of the DLProf database's schema 3.0 (db_schema.py), and back.

Names become integer ids into the `strings` table (distinct names are looked up once per frame, never per
row), threads and processes small ids, end times durations. NVTX range texts are split into a shared part
and PyTorch's per-call fields: `aten::mm, seq = 12, op_id = 345` is stored as the id of `aten::mm` plus the
integers 12 and 345; any text that does not end in exactly that form is stored whole, so every text comes
back byte for byte.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from dlprof_profiler import contract as K
from dlprof_profiler.db import range_blocks
from dlprof_profiler.engine.trace import GPU_COLUMNS, combined_codes, pid_of, tid_of

# ---------------------------------------------------------------------------- column helpers


def ints(values) -> np.ndarray:
    """A column as int64 (bools and small ints widened; pandas nullable ints must have no NA)."""
    if isinstance(values, pd.Series):
        values = values.to_numpy()
    return np.asarray(values, dtype=np.int64)


def nullable(values: np.ndarray, null: np.ndarray) -> pa.Array:
    """An int64 Arrow column with NULL where `null` is set."""
    values = np.asarray(values, dtype=np.int64)
    return pa.array(values, mask=np.asarray(null, dtype=bool)) if null.any() else pa.array(values)


def keys(scope: int, local) -> np.ndarray:
    """Database-wide keys (contract.ID_BITS) of engine ids within a rank or a domain."""
    return (np.int64(scope) << np.int64(K.ID_BITS)) | ints(local)


def ids_column(ids: np.ndarray) -> pa.Array:
    """String ids with -1 (no name) as NULL."""
    return nullable(ids, ids < 0)


def arrow_strings(values) -> pa.Array:
    """A text column as one Arrow string array (no copy when it is Arrow-backed already; nulls kept)."""
    if isinstance(values, pa.ChunkedArray):
        return values.combine_chunks() if values.num_chunks != 1 else values.chunk(0)
    if isinstance(values, pa.Array):
        return values
    if isinstance(values, pd.Series) and isinstance(values.array, pd.arrays.ArrowStringArray):
        return arrow_strings(values.array._pa_array)
    obj = (
        values.to_numpy(dtype=object, na_value=None)
        if isinstance(values, pd.Series)
        else np.asarray(values, dtype=object)
    )
    if obj.size == 0:
        return pa.array([], type=pa.string())
    return pa.array(np.where(pd.isna(obj), None, obj), type=pa.string())


def string_codes(values) -> tuple[np.ndarray, list]:
    """(code per row, -1 for a missing name; the distinct names) of a text column: categoricals use their
    codes (their categories may be many more than the rows use: the caller converts the ones it needs with
    str()), Arrow strings are dictionary-encoded in C, other columns factorized."""
    if isinstance(values, (pd.Series, pd.Categorical)) and isinstance(values.dtype, pd.CategoricalDtype):
        cat = values.array if isinstance(values, pd.Series) else values
        return np.asarray(cat.codes, dtype=np.int64), cat.categories.to_numpy(dtype=object)
    if isinstance(values, (pa.Array, pa.ChunkedArray)) or (
        isinstance(values, pd.Series) and isinstance(values.array, pd.arrays.ArrowStringArray)
    ):
        encoded = pc.dictionary_encode(arrow_strings(values))
        codes = np.asarray(pc.fill_null(encoded.indices, -1).to_numpy(zero_copy_only=False), dtype=np.int64)
        return codes, encoded.dictionary.to_pylist()
    # factorize takes None, NaN and NA as missing: no pass replacing them first
    obj = values.to_numpy(dtype=object) if isinstance(values, pd.Series) else np.asarray(values, dtype=object)
    codes, uniques = pd.factorize(obj, use_na_sentinel=True)
    return np.asarray(codes, dtype=np.int64), [str(u) for u in uniques]


# ---------------------------------------------------------------------------- id registries


class StringIds:
    """Distinct strings -> ids 0, 1, 2, ... for the `strings` table.

    Strings are remembered across frames (segments) up to `budget_chars` characters; beyond that a string
    first seen in a later frame gets a new id even if an earlier frame had it (the rows stay right, the table
    may hold a few duplicates), so memory stays bounded whatever the profile's names."""

    def __init__(self, budget_chars: int = 64 << 20):
        self._ids: dict[str, int] = {}
        self._chars = 0
        self._budget = budget_chars
        self._next = 0
        self._new_ids: list[int] = []
        self._new_values: list[str] = []

    def ids(self, values) -> np.ndarray:
        """Ids of distinct strings (None -> -1)."""
        out = np.empty(len(values), dtype=np.int64)
        known = self._ids
        for i, value in enumerate(values):
            if value is None:
                out[i] = -1
                continue
            sid = known.get(value)
            if sid is None:
                sid = self._next
                self._next += 1
                self._new_ids.append(sid)
                self._new_values.append(value)
                if self._chars < self._budget:
                    known[value] = sid
                    self._chars += len(value)
            out[i] = sid
        return out

    def column(self, values) -> np.ndarray:
        """Id per row of a text column (-1 for a missing name)."""
        codes, uniques = string_codes(values)
        if codes.size == 0:
            return codes
        # only the names rows use (a categorical may carry every string of the export)
        used = np.flatnonzero(np.bincount(codes + 1, minlength=len(uniques) + 1)[1:])
        lut = np.full(len(uniques) + 1, -1, dtype=np.int64)  # code -1 -> last entry -> -1
        lut[used] = self.ids([str(uniques[i]) for i in used])
        return lut[codes]

    def one(self, value) -> int:
        return int(self.ids([value])[0])

    def pending(self) -> pa.Table | None:
        """The strings given ids since the last call, as rows of the `strings` table."""
        if not self._new_ids:
            return None
        table = pa.table(
            {"id": pa.array(self._new_ids, type=pa.int64()), "value": pa.array(self._new_values, type=pa.string())}
        )
        self._new_ids, self._new_values = [], []
        return table


class KeyIds:
    """Integer keys (a pid, a (global_tid, pid) pair) -> small dense ids, with the rows of new keys."""

    def __init__(self):
        self.ids: dict = {}
        self.rows: list[tuple] = []  # (id, *key, name) in id order
        self.names: dict = {}

    def add(self, key, name=None) -> int:
        kid = self.ids.get(key)
        if kid is None:
            kid = self.ids[key] = len(self.ids)
            self.rows.append((kid, key))
        if name is not None and self.names.get(kid) is None:
            self.names[kid] = name
        return kid


class Registry:
    """Everything the writer numbers across frames: strings, threads, processes, NVTX domains, ops."""

    def __init__(self, domain_ids: dict):
        self.strings = StringIds()
        self.threads = KeyIds()  # (global_tid, pid) -> thread_id
        self.processes = KeyIds()  # pid -> process_id
        self.domains = dict(domain_ids)
        self.op_maps: dict[str, np.ndarray] = {}  # domain -> database op_index per op of the domain (-1: none yet)
        self.next_op = 0

    def thread_column(self, global_tid, pid) -> np.ndarray:
        """thread_id per row (-1 where global_tid is -1: work without a CPU thread)."""
        gtid, pids = ints(global_tid), ints(pid)
        out = np.full(gtid.size, -1, dtype=np.int64)
        if gtid.size == 0:
            return out
        codes = combined_codes(gtid, pids)
        first = np.full(codes.max() + 1, -1, dtype=np.int64)
        first[codes[::-1]] = np.arange(codes.size - 1, -1, -1)
        lut = np.array(
            [self.thread(int(gtid[i]), int(pids[i])) if gtid[i] != -1 else -1 for i in first], dtype=np.int64
        )
        return lut[codes]

    def thread(self, global_tid: int, pid: int, name=None) -> int:
        self.processes.add(pid)
        return self.threads.add((global_tid, pid), name)

    def process_column(self, pid) -> np.ndarray:
        pids = ints(pid)
        if pids.size == 0:
            return pids
        uniques, inverse = np.unique(pids, return_inverse=True)
        lut = np.array([self.processes.add(int(p)) for p in uniques], dtype=np.int64)
        return lut[inverse]

    def domain_column(self, names) -> np.ndarray:
        """domain_id per row; a domain not given at the start gets the next free id (no op model)."""
        codes, uniques = string_codes(names)
        lut = np.array([self.domain(str(u)) for u in uniques] + [-1], dtype=np.int64)
        return lut[codes] if codes.size else codes

    def domain(self, name: str) -> int:
        if name not in self.domains:
            self.domains[name] = max(self.domains.values(), default=-1) + 1
        return self.domains[name]

    def op_index(self, domain: str, local: np.ndarray) -> np.ndarray:
        """Database op_index of a domain's ops (its op model's op_index): numbered in order of first sight,
        domain after domain, so a whole-profile write numbers them as 2.0's per-domain offsets did."""
        local = ints(local)
        mapping = self.op_maps.get(domain, np.zeros(0, dtype=np.int64))
        if local.size:
            top = int(local.max()) + 1
            if top > mapping.size:
                mapping = np.concatenate([mapping, np.full(top - mapping.size, -1, dtype=np.int64)])
            fresh = np.unique(local[(local >= 0) & (mapping[np.maximum(local, 0)] < 0)])
            mapping[fresh] = self.next_op + np.arange(fresh.size)
            self.next_op += fresh.size
        self.op_maps[domain] = mapping
        return np.where(local >= 0, mapping[np.maximum(local, 0)], -1) if local.size else local


# ---------------------------------------------------------------------------- frames -> rows


def range_rows(ranges: pd.DataFrame, reg: Registry) -> pa.Table:
    """The ranges' columns as stored (db/range_blocks.BLOCK_SCHEMA)."""
    start = ints(ranges["start"])
    return pa.table(
        {
            "range_id": ints(ranges["range_id"]),
            "domain_id": reg.domain_column(ranges["domain"]),
            "thread_id": reg.thread_column(ranges["global_tid"], ranges["pid"]),
            "event_type": ints(ranges["event_type"]),
            "start": start,
            "duration": ints(ranges["end"]) - start,
            "unclosed": ints(ranges["unclosed"]),
            "text": pc.fill_null(arrow_strings(ranges["text"]), ""),
        }
    )


def range_block(ranges: pd.DataFrame, rank: int, reg: Registry) -> pa.Table:
    """The `raw_range_blocks` row holding `ranges` (db/range_blocks.py says why blocks)."""
    return range_blocks.block_row(range_rows(ranges, reg), rank)


def api_rows(api: pd.DataFrame, rank: int, reg: Registry) -> pa.Table:
    start = ints(api["start"])
    return pa.table(
        {
            "rank": np.full(start.size, rank, dtype=np.int64),
            "api_id": keys(rank, api["api_id"]),
            "name_id": ids_column(reg.strings.column(api["name"])),
            "thread_id": reg.thread_column(api["global_tid"], api["pid"]),
            "start": start,
            "duration": ints(api["end"]) - start,
            "correlation_id": ints(api["correlation_id"]),
            "event_class": ints(api["event_class"]),
            "return_value": ints(api["return_value"]),
        }
    )


# the GPU activity columns copied as they are (identity, kind, names, times and pid are encoded)
GPU_PLAIN = [c for c in GPU_COLUMNS if c not in ("activity_id", "kind", "name", "long_name", "start", "end", "pid")]


def gpu_rows(gpu: pd.DataFrame, rank: int, reg: Registry) -> pa.Table:
    start = ints(gpu["start"])
    name = reg.strings.column(gpu["name"])
    long_name = reg.strings.column(gpu["long_name"])
    columns = {
        "rank": np.full(start.size, rank, dtype=np.int64),
        "activity_id": keys(rank, gpu["activity_id"]),
        "kind": ints(gpu["kind"]),
        "name_id": name,
        # NULL: the long name is the name (memcpy and memset labels, C kernels)
        "long_name_id": nullable(long_name, long_name == name),
        "start": start,
        "duration": ints(gpu["end"]) - start,
        "process_id": reg.process_column(gpu["pid"]),
    }
    columns.update({c: ints(gpu[c]) for c in GPU_PLAIN})
    return pa.table(columns)


def sync_rows(syncs: pd.DataFrame, rank: int, reg: Registry) -> pa.Table:
    start = ints(syncs["start"])
    return pa.table(
        {
            "rank": np.full(start.size, rank, dtype=np.int64),
            "start": start,
            "duration": ints(syncs["end"]) - start,
            "device_id": ints(syncs["device_id"]),
            "stream_id": ints(syncs["stream_id"]),
            "process_id": reg.process_column(syncs["pid"]),
            "correlation_id": ints(syncs["correlation_id"]),
            "sync_type": ints(syncs["sync_type"]),
        }
    )


def io_rows(io: pd.DataFrame, rank: int, reg: Registry) -> pa.Table:
    start = ints(io["start"])
    return pa.table(
        {
            "rank": np.full(start.size, rank, dtype=np.int64),
            "start": start,
            "duration": ints(io["end"]) - start,
            "thread_id": reg.thread_column(io["global_tid"], io["pid"]),
            "name_id": ids_column(reg.strings.column(io["name"])),
        }
    )


DETAIL_COLUMNS = ["data_type", "input_shapes", "output_shapes", "parameters", "stack_trace"]


def instance_rows(inst: pd.DataFrame, domain: str, rank: int, reg: Registry) -> list[tuple[str, pa.Table]]:
    """(table, rows) of a domain's op instances: raw_op_instances and, for instances with details,
    raw_op_instance_details."""
    n = len(inst)
    did = reg.domain(domain)
    domain_id = np.full(n, did, dtype=np.int64)
    instance_key = keys(did, inst["instance_id"])
    kind = ints(inst["kind"])
    start = ints(inst["start"])
    source = np.where(
        ints(inst["range_id"]) >= 0,
        ints(inst["range_id"]),
        np.where(ints(inst["api_id"]) >= 0, ints(inst["api_id"]), ints(inst["activity_id"])),
    )
    n_gpu = ints(inst["n_gpu"])
    no_gpu = n_gpu <= 0
    gpu_start = ints(inst["gpu_start"])
    thread = reg.thread_column(inst["global_tid"], inst["pid"])
    # the call an instance belongs to (the autograd nodes of one forward call form one backward call); NULL:
    # the instance is a call of its own
    call = ints(inst["call_id"]) if "call_id" in inst.columns else ints(inst["instance_id"])
    rows = pa.table(
        {
            "instance_id": instance_key,
            "domain_id": domain_id,
            "rank": np.full(n, rank, dtype=np.int64),
            "op_index": reg.op_index(domain, inst["op_index"]),
            "kind": kind,
            "source_id": nullable(source, source < 0),
            "thread_id": ids_column(thread),
            "process_id": reg.process_column(inst["pid"]),
            "device_id": ints(inst["device_id"]),
            "start": start,
            "duration": ints(inst["end"]) - start,
            "cpu_overhead": ints(inst["cpu_overhead"]),
            "gpu_time": ints(inst["gpu_time"]),
            "gpu_offset": nullable(gpu_start - start, no_gpu),
            "gpu_span": nullable(ints(inst["gpu_end"]) - gpu_start, no_gpu),
            "n_gpu": n_gpu,
            "n_kernels": ints(inst["n_kernels"]),
            "call_id": nullable(keys(did, call), call == ints(inst["instance_id"])),
        }
    )
    out = [(K.RAW_OP_INSTANCES, rows)]
    present = [c for c in DETAIL_COLUMNS if c in inst.columns]
    if present:
        any_detail = inst[present].notna().any(axis=1).to_numpy()
        if any_detail.any():
            sel = np.flatnonzero(any_detail)
            detail = {
                "instance_id": instance_key[sel],
                "domain_id": domain_id[sel],
                "rank": np.full(sel.size, rank, dtype=np.int64),
            }
            for c in DETAIL_COLUMNS:
                values = inst[c].to_numpy(dtype=object)[sel] if c in inst.columns else np.full(sel.size, None)
                detail[f"{c}_id"] = ids_column(reg.strings.column(pd.Series(values, dtype=object)))
            out.append((K.RAW_OP_INSTANCE_DETAILS, pa.table(detail)))
    return out


def owner_rows(owners: pd.DataFrame, domain: str, rank: int, reg: Registry) -> pa.Table:
    """Who owns each GPU activity in a domain, keyed (domain_id << 40) | activity id."""
    api_id = ints(owners["api_id"])
    n = api_id.size
    did = reg.domain(domain)
    return pa.table(
        {
            "owner_id": keys(did, owners["activity_id"]),
            "domain_id": np.full(n, did, dtype=np.int64),
            "rank": np.full(n, rank, dtype=np.int64),
            "activity_id": keys(rank, owners["activity_id"]),
            "instance_id": keys(did, owners["instance_id"]),
            "api_id": nullable(keys(rank, np.maximum(api_id, 0)), api_id < 0),
            "launch_time": ints(owners["launch_time"]),
        }
    )


def op_rows(ops: pd.DataFrame, domain: str, rank: int, reg: Registry) -> pa.Table:
    n = len(ops)
    s = reg.strings

    def text_ids(column):
        return ids_column(s.column(ops[column].astype(object)) if column in ops.columns else np.full(n, -1))

    direction = (
        ops["direction"].astype(object).to_numpy(dtype=object)
        if "direction" in ops.columns
        else np.full(n, None, dtype=object)
    )
    kind = ints(ops["kind"]) if "kind" in ops.columns else np.full(n, -1, dtype=np.int64)
    return pa.table(
        {
            "op_index": reg.op_index(domain, ops["op_index"]),
            "rank": np.full(n, rank, dtype=np.int64),
            "domain_id": np.full(n, reg.domain(domain), dtype=np.int64),
            "domain_op_index": ints(ops["op_index"]),
            "op_id": arrow_strings(ops["op_id"].astype(object)),
            "name_id": text_ids("name"),
            "direction": arrow_strings(pd.Series(direction, dtype=object)),
            "op_type_id": text_ids("op_type"),
            "label_id": text_ids("label"),
            "tc_eligible": ints(ops["tc_eligible"]),
            "data_type_id": text_ids("data_type"),
            "stack_trace_id": text_ids("stack_trace"),
            "device_id": ints(ops["device_id"]),
            "first_start": ints(ops["first_start"]),
            "num_instances": ints(ops["n_instances"]),
            "kind": nullable(kind, kind < 0),
        }
    )


# ---------------------------------------------------------------------------- registry rows


def thread_rows(reg: Registry, rank: int, start: int = 0) -> pa.Table:
    rows = reg.threads.rows[start:]
    ids = np.array([r[0] for r in rows], dtype=np.int64)
    gtid = np.array([r[1][0] for r in rows], dtype=np.int64)
    names = reg.strings.ids([reg.threads.names.get(int(i)) for i in ids])
    return pa.table(
        {
            "rank": np.full(ids.size, rank, dtype=np.int64),
            "thread_id": ids,
            "global_tid": gtid,
            "pid": np.array([r[1][1] for r in rows], dtype=np.int64),
            "tid": tid_of(gtid),
            "name_id": ids_column(names),
        }
    )


def process_rows(reg: Registry, rank: int, start: int = 0) -> pa.Table:
    rows = reg.processes.rows[start:]
    ids = np.array([r[0] for r in rows], dtype=np.int64)
    names = reg.strings.ids([reg.processes.names.get(int(i)) for i in ids])
    return pa.table(
        {
            "rank": np.full(ids.size, rank, dtype=np.int64),
            "process_id": ids,
            "pid": np.array([r[1] for r in rows], dtype=np.int64),
            "name_id": ids_column(names),
        }
    )


def register_header_threads(reg: Registry, processes: pd.DataFrame, threads: pd.DataFrame) -> None:
    """The export's named processes and threads first (they get the smallest ids)."""
    for pid, name in zip(ints(processes["pid"]), processes["name"].astype(object).tolist()):
        reg.processes.add(int(pid), None if pd.isna(name) else str(name))
    gtids = ints(threads["global_tid"])
    pids = ints(threads["pid"]) if "pid" in threads.columns else pid_of(gtids)
    for gtid, pid, name in zip(gtids, pids, threads["name"].astype(object).tolist()):
        reg.thread(int(gtid), int(pid), None if pd.isna(name) else str(name))


def memory_rows(frame: pd.DataFrame, rank: int, reg: Registry) -> pa.Table:
    """Memory events (memory.py) as raw_memory_events rows: threads and processes as small ids, unknown
    threads, addresses and reserved levels as NULL."""
    thread = reg.thread_column(frame["global_tid"], frame["pid"])
    address, reserved = ints(frame["address"]), ints(frame["reserved"])
    return pa.table(
        {
            "rank": np.full(len(frame), rank, dtype=np.int64),
            "start": ints(frame["start"]),
            "call_start": ints(frame["call_start"]),
            "thread_id": nullable(thread, thread < 0),
            "process_id": reg.process_column(frame["pid"]),
            "device_type": ints(frame["device_type"]),
            "device_id": ints(frame["device_id"]),
            "address": nullable(address, address < 0),
            "bytes": ints(frame["bytes"]),
            "allocated": ints(frame["allocated"]),
            "reserved": nullable(reserved, reserved < 0),
        }
    )
