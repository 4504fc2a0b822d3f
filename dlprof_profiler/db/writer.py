"""The DLProf database: a versioned relational SQLite file (schema in db_schema.py, 3.0).

Raw facts (GPU activities, API calls, NVTX ranges, op instances and ops per domain) are stored once, so any
re-aggregation needs only this file; every derived table carries `aggr_id`, `domain_id` and `rank`, and a
re-aggregation appends an `aggregations` row and its rows, keeping the earlier ones.

Writing: `DatabaseWriter(path, header)`, then per time segment `add_raw(frames)` and
`add_domain_model(domain, instances, owners)`, at the end `add_ops(domain, ops)` and `finish(...)`. The calls
only queue their frames: a background thread turns them into Arrow tables (names as string ids) and
bulk-inserts them through ADBC, so the writing runs on the second core while the analysis goes on; the
queue is bounded, so a writer that falls behind holds back the producer instead of piling up memory.
Secondary indexes whose keys arrive in order exist from the start (segment after segment, keeping them up to
date costs little); the one with random keys is sorted once in finish(). A writer given the whole model at
once (`deferred_indexes`, the in-memory analysis) builds them all after the rows, sorted once, when
`build_indexes()` is queued: at 10^6 kernels that is 1.4 s instead of 2.1 s of the writer's CPU, and the
database is 2% smaller. Databases of schema 2.0 are still read (db_load.py) and appended to
(`append_aggregation`).
"""

from __future__ import annotations

import contextlib
import functools
import getpass
import json
import queue
import socket
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from dlprof_profiler import __version__
from dlprof_profiler import contract as K
from dlprof_profiler.db import encode as E
from dlprof_profiler.db import load
from dlprof_profiler.engine.compare import SIDE_FIGURES
from dlprof_profiler import log
from dlprof_profiler.engine.aggregate import CLASSES, Aggregation
from dlprof_profiler.db.schema import BASELINE_TABLES, FINAL_INDEXES, RAW_INDEXES, SCHEMA
from dlprof_profiler.errors import DLProfError
from dlprof_profiler.engine.trace import DEVICE_COLUMNS, Trace

DB_SCHEMA_VERSION = K.DB_SCHEMA_VERSION
PRIMARY_REPORT_ORDER = ("default",)
QUEUE_SEGMENTS = 4  # frames waiting for the writer thread at most (each holds its segment alive)
CHUNK_ROWS = 1 << 18  # rows encoded and inserted at a time: bounds the writer's own memory
INSERT_CACHE_KIB = 16 << 10  # page cache, KiB: appended rows and index entries touch the last pages only
SORT_CACHE_KIB = 64 << 10  # page cache, and so sorter memory, while the final indexes are built, KiB
PAGE_SIZE = 16384  # bulk appends a quarter faster than SQLite's 4 KiB default, the same file size
# ...but every table and index takes at least a page: a database of a small profile (below SMALL_PROFILE_EVENTS
# ranges, calls and activities) has 4 KiB pages, which made those of the real exports in tests/data/nsys 0.4-1.6x
# the export instead of 1.2-3.9x (one holding long op names aside: docs/DESIGN.md, "Database size"), in the same
# time (10^5 kernels: 1.8 s either way)
SMALL_PAGE_SIZE = 4096
SMALL_PROFILE_EVENTS = 1_000_000


def page_size_for(events: int | None) -> int:
    """The page size of a new database of a profile of `events` events (None: not counted, a large one)."""
    return SMALL_PAGE_SIZE if events is not None and events < SMALL_PROFILE_EVENTS else PAGE_SIZE


# ---------------------------------------------------------------------------- writing


@dataclass
class Header:
    """What the writer needs before the first segment: the rank and the capture's static facts."""

    rank: int = 0
    system: dict = field(default_factory=dict)  # system configuration; nsys metadata under `nsys:<name>`
    devices: pd.DataFrame | None = None  # trace.DEVICE_COLUMNS
    processes: pd.DataFrame | None = None  # pid, name
    threads: pd.DataFrame | None = None  # global_tid, pid, tid, name
    domain_ids: dict = field(default_factory=dict)  # NVTX domain name -> domain_id, for the op-model domains

    @classmethod
    def from_trace(cls, trace: Trace, domain_ids: dict, rank: int = 0) -> Header:
        system = dict(trace.system)
        system.update({f"nsys:{k}": v for k, v in trace.meta.items()})
        return cls(
            rank=rank,
            system=system,
            devices=trace.devices,
            processes=trace.processes,
            threads=trace.threads,
            domain_ids=dict(domain_ids),
        )


class DatabaseWriter:
    """Writes a new DLProf database (schema 3.0) from trace frames; see the module docstring."""

    def __init__(
        self,
        path: Path,
        header: Header,
        queue_size: int = QUEUE_SEGMENTS,
        raw_indexes: bool = True,
        final_indexes: bool = True,
        deferred_indexes: bool = False,
        page_size: int = PAGE_SIZE,
    ):
        """`raw_indexes` / `final_indexes`: build the viewer's raw-table indexes (a rank's database merged into
        another, which builds its own, needs neither). `deferred_indexes`: build every secondary index after the
        rows (build_indexes or finish), sorted once, instead of keeping the in-order ones up to date row by row
        (cheaper when all rows come at once). `page_size`: see page_size_for."""
        self.path = Path(path)
        self.final_indexes = final_indexes
        self.header = header
        self.rank = int(header.rank)
        self.registry = E.Registry(header.domain_ids)
        self.written_models: set[str] = set()  # domains whose instances are queued
        self.owners_written: set[str] = set()  # domains whose activity owners are queued (write_owners)
        # the writer thread's work: rows inserted, wall seconds busy, CPU seconds encoding / inserting (indexes
        # whose keys arrive in order are kept up to date meanwhile) / building the final indexes
        self.stats = {"rows": 0, "seconds_busy": 0.0, "encode_cpu": 0.0, "insert_cpu": 0.0, "index_cpu": 0.0}
        self._indexes = _statements(
            (RAW_INDEXES if raw_indexes and deferred_indexes else "") + (FINAL_INDEXES if final_indexes else "")
        )  # still to build
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, queue_size))
        self._error: BaseException | None = None
        self._aborted = False
        self._closed = False
        try:
            con = sqlite3.connect(self.path)
            try:
                con.execute(f"PRAGMA page_size = {int(page_size)}")
                # as on the writer's own connection: the file is staged (discarded if the run fails), and a
                # sync per CREATE statement took ~1 s on a busy disk
                con.execute("PRAGMA journal_mode = OFF")
                con.execute("PRAGMA synchronous = OFF")
                con.executescript(SCHEMA + (RAW_INDEXES if raw_indexes and not deferred_indexes else ""))
            finally:
                con.close()
        except sqlite3.Error as exc:
            raise DLProfError(f"{self.path}: could not write the database ({exc})") from None
        self._thread = threading.Thread(target=self._run, name="dlprof-db-writer", daemon=True)
        self._thread.start()
        self._submit(self._header_rows)

    # ------------------------------------------------------------------ producer side (the analysis thread)
    def add_raw(self, frames) -> None:
        """One time segment of raw facts, segments in time order: `frames.ranges`, `.api_calls`, `.gpu`,
        `.syncs`, `.io_calls`, `.memory` (trace frames; any may be missing or empty)."""
        self._submit(self._raw_rows, frames)

    def add_domain_model(self, domain: str, instances: pd.DataFrame, owners=None) -> None:
        """Op instances of one NVTX domain (correlate.INSTANCE_COLUMNS; op_index = the domain's op index) and
        the owner of each GPU activity: a frame (or an iterable of frames, consumed on the writer's thread) with
        columns activity_id, instance_id, api_id (-1: no launching call), launch_time."""
        if instances is not None:
            self.written_models.add(domain)
        self._submit(self._model_rows, domain, instances, owners)

    def add_ops(self, domain: str, ops: pd.DataFrame) -> None:
        """The final op table of one NVTX domain (correlate.OP_COLUMNS plus label and kind), before or after
        its instances (ops are numbered in the database in order of first sight)."""
        self._submit(self._op_rows, domain, ops)

    def build_indexes(self, table: str | None = None) -> None:
        """Build the secondary indexes not built yet (of `table` only, if given), on the writer's thread, once
        the rows queued so far are in (for a caller that has queued every row of them: the index work then
        overlaps the analysis instead of waiting for finish; rows added later still go into the indexes)."""
        self._submit(self._index_rows, table)

    def add_aggregation(self, aggregations: dict, iterations, findings: dict | None, elapsed: float) -> int:
        """A new database's first aggregation (aggr_id 1), after the op models queued so far: its rows are
        ingested on the writer's thread like the others (10^6 ops in a profile without iterations), not
        inserted one by one once the file is closed (append_aggregation). Returns its aggr_id."""
        self._submit(self._aggregation_rows, aggregations, iterations, findings, elapsed)
        return FIRST_AGGREGATION

    def finish(
        self,
        profile: dict,
        primary_domain: str,
        domains: dict | None = None,
        config: dict | None = None,
        range_labels: pd.DataFrame | None = None,
        kernel_tc: pd.DataFrame | None = None,
    ) -> dict:
        """Write the remaining facts, build the last index, close the file; returns {domain name: domain_id} of
        the op-model domains. `domains`: name -> dict(family, has_markers, num_ranges) of every domain with an
        op model; `range_labels`: domain, label, kind, num_ranges; `kernel_tc`: name, long_name, uses_tc,
        tc_rule per distinct kernel name pair."""
        self._submit(
            self._final_rows,
            dict(profile),
            primary_domain,
            dict(domains or {}),
            dict(config or {}),
            range_labels,
            kernel_tc,
        )
        self._close()
        st = self.stats
        log.detail(
            f"database writer: {st['rows']:,} rows, busy {st['seconds_busy']:.1f} s (CPU: encoding "
            f"{st['encode_cpu']:.1f} s, inserting {st['insert_cpu']:.1f} s, indexing {st['index_cpu']:.1f} s)"
        )
        return {name: self.registry.domains[name] for name in (domains or {}) if name in self.registry.domains}

    def op_index_maps(self) -> dict:
        """Per op-model domain: the database op_index of each of its ops (index = the domain's op index);
        complete once finish() returned."""
        return {name: mapping.copy() for name, mapping in self.registry.op_maps.items()}

    def wait(self) -> None:
        """Stop writing (dropping what is still queued unless finish() ran) and wait for the thread."""
        if not self._closed:
            self._aborted = True
        self._close()

    def _submit(self, fn, *args) -> None:
        while True:
            if self._closed:  # also while waiting: another thread may close an aborted writer
                raise RuntimeError("the database writer is closed")
            if self._error is not None:
                self._close()
            try:
                self._queue.put((fn, args), timeout=0.5)
                return
            except queue.Full:
                continue

    def _close(self) -> None:
        if not self._closed:
            self._closed = True
            self._queue.put(None)
        self._thread.join()
        if self._error is not None:
            error, self._error = self._error, None
            self._aborted = True
            if isinstance(error, (sqlite3.Error, OSError)) or type(error).__module__.startswith("adbc"):
                raise DLProfError(f"{self.path}: could not write the database ({error})") from None
            raise error

    # ------------------------------------------------------------------ writer thread
    def _run(self) -> None:
        con = cursor = None
        closed = False  # the producer's end-of-work mark was taken from the queue
        try:
            import adbc_driver_sqlite.dbapi as adbc

            con = adbc.connect(str(self.path), autocommit=True)
            cursor = con.cursor()
            for pragma in ("journal_mode=OFF", "synchronous=OFF", f"cache_size=-{INSERT_CACHE_KIB}"):
                cursor.execute(f"PRAGMA {pragma}")
                if cursor.description:
                    cursor.fetchall()
            cursor.execute("BEGIN")
            while True:
                item = self._queue.get()
                if item is None:
                    closed = True
                    break
                if self._aborted or self._error is not None:
                    continue
                fn, args = item
                started = time.perf_counter()
                batches = fn(*args)
                while True:
                    cpu = time.thread_time()
                    table, rows = next(batches, (None, None))
                    self.stats["encode_cpu"] += time.thread_time() - cpu
                    if table is None:
                        break
                    if rows.num_rows:
                        cpu = time.thread_time()
                        cursor.adbc_ingest(table, rows, mode="append")
                        self.stats["insert_cpu"] += time.thread_time() - cpu
                        self.stats["rows"] += rows.num_rows
                pending = self.registry.strings.pending()
                if pending is not None:
                    cursor.adbc_ingest(K.STRINGS, pending, mode="append")
                if fn in (self._final_rows, self._index_rows) and self._indexes:
                    cpu = time.thread_time()
                    table = args[0] if fn == self._index_rows else None
                    now = [s for s in self._indexes if table is None or f" ON {table}(" in s]
                    cursor.execute(f"PRAGMA cache_size=-{SORT_CACHE_KIB}")
                    for statement in now:
                        cursor.execute(statement)
                    self._indexes = [s for s in self._indexes if s not in now]
                    cursor.execute(f"PRAGMA cache_size=-{INSERT_CACHE_KIB}")
                    self.stats["index_cpu"] += time.thread_time() - cpu
                self.stats["seconds_busy"] += time.perf_counter() - started
            cursor.execute("COMMIT")
        except BaseException as exc:  # noqa: BLE001 - re-raised on the producer's thread
            self._error = exc
            while not closed:  # let the producer's puts and close() go through
                closed = self._queue.get() is None
        finally:
            for handle in (cursor, con):
                if handle is not None:
                    with contextlib.suppress(Exception):  # closing after an error: the error is what matters
                        handle.close()

    def _header_rows(self):
        h, rank = self.header, self.rank
        yield (
            K.RAW_SYSTEM_CONFIG,
            pa.table(
                {
                    "rank": pa.array([rank] * len(h.system), pa.int64()),
                    "name": pa.array([str(k) for k in h.system], pa.string()),
                    "value": pa.array([_text(v) for v in h.system.values()], pa.string()),
                }
            ),
        )
        devices = h.devices if h.devices is not None else pd.DataFrame(columns=DEVICE_COLUMNS)
        if len(devices):
            columns = {"rank": np.full(len(devices), rank, dtype=np.int64)}
            for c in DEVICE_COLUMNS:
                values = devices[c] if c in devices.columns else pd.Series([None] * len(devices))
                if c in ("name", "bus_location", "chip_name", "uuid"):
                    columns[c] = pa.array([None if pd.isna(v) else str(v) for v in values.astype(object)], pa.string())
                else:
                    columns[c] = pa.array([None if pd.isna(v) else int(v) for v in values.astype(object)], pa.int64())
            yield K.RAW_GPU_INFOS, pa.table(columns)
        if h.processes is not None and h.threads is not None:
            E.register_header_threads(self.registry, h.processes, h.threads)

    def _raw_rows(self, frames):
        reg, rank = self.registry, self.rank
        for attr, table, encode in (
            ("ranges", K.RAW_RANGE_BLOCKS, E.range_block),
            ("api_calls", K.RAW_API_CALLS, E.api_rows),
            ("gpu", K.RAW_GPU_ACTIVITIES, E.gpu_rows),
            ("syncs", K.RAW_SYNCS, E.sync_rows),
            ("io_calls", K.RAW_IO_CALLS, E.io_rows),
            ("memory", K.RAW_MEMORY_EVENTS, E.memory_rows),
        ):
            for chunk in _chunks(getattr(frames, attr, None)):
                yield table, encode(chunk, rank, reg)

    def _model_rows(self, domain, instances, owners):
        for chunk in _chunks(instances):
            yield from E.instance_rows(chunk, domain, self.rank, self.registry)
        for chunk in _chunks(owners):
            yield K.RAW_ACTIVITY_OWNERS, E.owner_rows(chunk, domain, self.rank, self.registry)

    def _aggregation_rows(self, aggregations, iterations, findings, elapsed):
        first = next(iter(aggregations.values()))
        rows = _ArrowRows(self.rank, self.registry.strings)
        rows.row(K.AGGREGATIONS, {"aggr_id": FIRST_AGGREGATION, **_aggregation_row(first, elapsed)})
        domain_ids = {name: self.registry.domains[name] for name in aggregations}
        offsets = {name: self.registry.op_maps[name].copy() for name in aggregations}
        _write_rank_rows(rows, FIRST_AGGREGATION, aggregations, domain_ids, offsets, iterations, findings)
        yield from rows.tables

    def _index_rows(self, table=None):
        return  # no rows: _run builds the indexes after this item
        yield

    def _op_rows(self, domain, ops):
        self.registry.op_maps.setdefault(domain, np.zeros(0, dtype=np.int64))
        if ops is not None and len(ops):
            yield K.RAW_OPS, E.op_rows(ops, domain, self.rank, self.registry)

    def _final_rows(self, profile, primary, domains, config, range_labels, kernel_tc):
        reg, rank = self.registry, self.rank
        info = {**profile, "primary_domain": primary}
        yield (
            "profile_info",
            pa.table(
                {
                    "name": pa.array(list(info), pa.string()),
                    "value": pa.array([_text(v) for v in info.values()], pa.string()),
                }
            ),
        )
        yield (
            K.RAW_MODEL_CONFIG,
            pa.table(
                {
                    "rank": pa.array([rank] * len(config), pa.int64()),
                    "name": pa.array([str(k) for k in config], pa.string()),
                    "value": pa.array([json.dumps(v) for v in config.values()], pa.string()),
                }
            ),
        )
        yield (
            K.RANKS,
            pa.table(
                {
                    "rank": [rank],
                    "source_file": [_text(profile.get("source_file"))],
                    "source_kind": [_text(profile.get("source_kind"))],
                    "host_name": [_text(self.header.system.get("Hostname"))],
                    "nsys_version": [_text(profile.get("nsys_version"))],
                    "capture_end": pa.array([_int_or_none(self.header.system.get("nsys:capture_end"))], pa.int64()),
                    "profile_end": pa.array([_int_or_none(profile.get("profile_end"))], pa.int64()),
                }
            ),
        )
        for name in domains:
            reg.domain(name)
        names = list(reg.domains)
        yield (
            K.RAW_DOMAINS,
            pa.table(
                {
                    "domain_id": pa.array([reg.domains[n] for n in names], pa.int64()),
                    "rank": pa.array([rank] * len(names), pa.int64()),
                    "name": pa.array(names, pa.string()),
                    "family": pa.array([_text(domains.get(n, {}).get("family")) for n in names], pa.string()),
                    "has_markers": pa.array(
                        [int(bool(domains.get(n, {}).get("has_markers"))) for n in names], pa.int64()
                    ),
                    "num_ranges": pa.array([int(domains.get(n, {}).get("num_ranges") or 0) for n in names], pa.int64()),
                    "is_primary": pa.array([int(n == primary) for n in names], pa.int64()),
                    "has_model": pa.array([int(n in domains) for n in names], pa.int64()),
                }
            ),
        )
        if range_labels is not None and len(range_labels):
            n = len(range_labels)
            yield (
                K.RAW_RANGE_LABELS,
                pa.table(
                    {
                        "rank": np.full(n, rank, dtype=np.int64),
                        "domain_id": reg.domain_column(range_labels["domain"]),
                        "label_id": reg.strings.column(range_labels["label"].astype(object)),
                        "kind": E.ints(range_labels["kind"]),
                        "num_ranges": E.ints(range_labels["num_ranges"]),
                    }
                ),
            )
        if kernel_tc is not None and len(kernel_tc):
            n = len(kernel_tc)
            yield (
                K.RAW_KERNEL_TC,
                pa.table(
                    {
                        "rank": np.full(n, rank, dtype=np.int64),
                        "name_id": reg.strings.column(kernel_tc["name"]),
                        "long_name_id": reg.strings.column(kernel_tc["long_name"]),
                        "uses_tc": E.ints(kernel_tc["uses_tc"]),
                        "tc_rule": E.arrow_strings(kernel_tc["tc_rule"].astype(object)),
                    }
                ),
            )
        yield K.RAW_THREADS, E.thread_rows(reg, rank)
        yield K.RAW_PROCESSES, E.process_rows(reg, rank)
        yield (
            "db_version",
            pa.table(
                {
                    "current_version": [DB_SCHEMA_VERSION],
                    "original_version": [DB_SCHEMA_VERSION],
                    "created_by": [f"{K.CREATED_BY_PREFIX} {__version__}"],
                }
            ),
        )


def _chunks(frame):
    """Row slices of a frame, CHUNK_ROWS at a time (views: nothing is copied); an iterable of frames (built
    lazily on the writer's thread) is passed through."""
    if frame is None:
        return
    if not isinstance(frame, pd.DataFrame):
        yield from frame
        return
    for first in range(0, len(frame), CHUNK_ROWS):
        yield frame.iloc[first : first + CHUNK_ROWS]


def _statements(script: str) -> list[str]:
    return [statement.strip() for statement in script.split(";") if statement.strip()]


def _text(value) -> str | None:
    if value is None:
        return None
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return str(value)


def _optional_text(value) -> str | None:
    """Text of a frame cell; missing (None, NaN) stays NULL."""
    return None if value is None or (isinstance(value, float) and value != value) else str(value)


def _int_or_none(value):
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


# ---------------------------------------------------------------------------- a whole analysis as one segment


def domain_ids_for(corr_or_names) -> dict:
    names = list(corr_or_names.domains) if hasattr(corr_or_names, "domains") else list(corr_or_names)
    return {name: i for i, name in enumerate(names)}


def launch_times(trace: Trace, gpu_api: np.ndarray) -> np.ndarray:
    """When each GPU activity was launched: its API call's start, else its own start."""
    gpu, api = trace.gpu, trace.api_calls
    launch = gpu["start"].to_numpy(np.int64).copy()
    has = gpu_api >= 0
    if has.any():
        launch[has] = api["start"].to_numpy(np.int64)[gpu_api[has]]
    return launch


def _owner_chunks(trace: Trace, gpu_api: np.ndarray, gpu_instance: np.ndarray):
    """A domain's activity owners, CHUNK_ROWS at a time, from arrays the analysis holds anyway."""
    activity = trace.gpu["activity_id"].to_numpy(np.int64)
    gpu_start = trace.gpu["start"].to_numpy(np.int64)
    api = trace.api_calls
    api_ids = api["api_id"].to_numpy(np.int64) if len(api) else np.zeros(1, dtype=np.int64)
    api_start = api["start"].to_numpy(np.int64) if len(api) else np.zeros(1, dtype=np.int64)
    for first in range(0, activity.size, CHUNK_ROWS):
        part = slice(first, first + CHUNK_ROWS)
        row = np.asarray(gpu_api[part], dtype=np.int64)
        has = row >= 0
        yield pd.DataFrame(
            {
                "activity_id": activity[part],
                "instance_id": np.asarray(gpu_instance[part], np.int64),
                "api_id": np.where(has, api_ids[np.maximum(row, 0)], -1),
                "launch_time": np.where(has, api_start[np.maximum(row, 0)], gpu_start[part]),
            },
            copy=False,
        )


def write_owners(writer: DatabaseWriter, trace: Trace, gpu_api: np.ndarray, gpu_instances: dict) -> None:
    """Queue the GPU activity owners of a whole-trace correlation ({domain: gpu_instance}) as soon as they are
    known, and their indexes: the writer's thread, idle while the op tables are built, takes them then instead
    of after the instances (at 10^6 kernels, 10^6 rows and two indexes off the end of the run)."""
    for name, gpu_instance in gpu_instances.items():
        writer.add_domain_model(name, None, _owner_chunks(trace, gpu_api, gpu_instance))
        writer.owners_written.add(name)
    writer.build_indexes(K.RAW_ACTIVITY_OWNERS)


def write_correlation(writer: DatabaseWriter, trace: Trace, corr) -> None:
    """Queue every domain's op model of a whole-trace correlation (instances, activity owners unless
    `write_owners` queued them, ops)."""
    queued = False
    for name, dm in corr.domains.items():
        if name in writer.written_models:
            continue
        writer.add_ops(name, dm.ops)  # first: the domain's ops get consecutive database op indexes
        owners = None if name in writer.owners_written else _owner_chunks(trace, corr.gpu_api, dm.gpu_instance)
        writer.add_domain_model(name, dm.instances, owners)
        queued = True
    if queued:
        writer.build_indexes()  # every instance and owner is queued: index them while the analysis goes on


def kernel_tc_pairs(trace: Trace, corr) -> pd.DataFrame:
    """Tensor Core use per distinct (name, long name) of the GPU activities."""
    gpu = trace.gpu
    if len(gpu) == 0:
        return pd.DataFrame({"name": [], "long_name": [], "uses_tc": [], "tc_rule": []})
    name_codes, names = E.string_codes(gpu["name"])
    long_codes, longs = E.string_codes(gpu["long_name"])
    pair = name_codes * (len(longs) + 1) + long_codes
    _, first = np.unique(pair, return_index=True)
    return pd.DataFrame(
        {
            "name": np.asarray(names, dtype=object)[name_codes[first]],
            "long_name": np.asarray(longs, dtype=object)[long_codes[first]],
            "uses_tc": np.asarray(corr.uses_tc, dtype=bool)[first].astype(np.int64),
            "tc_rule": pd.Series(np.asarray(corr.tc_rule, dtype=object)[first], dtype=object),
        }
    )


def finish_analysis(writer: DatabaseWriter, trace: Trace, corr, primary_domain: str, profile: dict) -> dict:
    """Finish a database whose raw facts were added as one segment (the models too, unless already queued)."""
    write_correlation(writer, trace, corr)
    domains = {
        name: {"family": corr.family, "has_markers": dm.has_markers, "num_ranges": dm.n_ranges}
        for name, dm in corr.domains.items()
    }
    return writer.finish(profile, primary_domain, domains, corr.config, corr.range_labels, kernel_tc_pairs(trace, corr))


def op_index_offsets(corr) -> dict:
    """Database op_index = domain's op_index + the ops of the domains written before it (a whole-trace
    write numbers ops this way; see DatabaseWriter.op_index_maps for the general mapping)."""
    offsets, offset = {}, 0
    for name, dm in corr.domains.items():
        offsets[name] = offset
        offset += len(dm.ops)
    return offsets


# ---------------------------------------------------------------------------- derived tables


def _rows(frame: pd.DataFrame, columns: list[str]):
    """Plain Python tuples for executemany (NaN/NA -> NULL), built column-wise."""
    cols = []
    for c in columns:
        values = frame[c]
        if values.dtype == object or str(values.dtype) in ("str", "string", "category"):
            arr = values.astype(object).to_numpy(dtype=object)
            arr = np.where(pd.isna(arr), None, arr)
            cols.append(arr.tolist())
        elif values.dtype == bool:
            cols.append(values.to_numpy().astype(np.int64).tolist())
        elif str(values.dtype) in ("Int64", "boolean"):
            cols.append([None if pd.isna(v) else int(v) for v in values.to_numpy(dtype=object)])
        elif np.issubdtype(values.dtype, np.floating):
            arr = values.to_numpy(dtype=np.float64)
            lst = arr.tolist()
            if np.isnan(arr).any():
                lst = [None if v != v else v for v in lst]
            cols.append(lst)
        else:
            cols.append(values.to_numpy().tolist())
    return zip(*cols)


def _table_names(columns: list[str], renamed: dict | None) -> list[str]:
    """The table's column names of a frame's columns: the same, except those `renamed` (DLProf 1.8's names)."""
    return [renamed.get(c, c) for c in columns] if renamed else list(columns)


class _Inserter:
    """Inserts aggregation frames into the derived tables, with the rank where the schema has one; columns
    the file's table lacks (a database written by an earlier version) are left out."""

    def __init__(self, con: sqlite3.Connection, rank: int):
        self.con, self.rank = con, rank
        self._columns: dict[str, set] = {}

    def columns(self, table: str) -> set:
        if table not in self._columns:
            self._columns[table] = {r[1] for r in self.con.execute(f'PRAGMA table_info("{table}")')}
        return self._columns[table]

    def has_table(self, table: str) -> bool:
        return (
            self.con.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)).fetchone()
            is not None
        )

    def has_rank(self, table: str) -> bool:
        return "rank" in self.columns(table)

    def insert(self, table: str, frame: pd.DataFrame, columns: list[str], renamed: dict | None = None) -> None:
        if len(frame) == 0:
            return
        names = _table_names(columns, renamed)
        known = self.columns(table)
        pairs = [(c, n) for c, n in zip(columns, names) if n in known]
        columns, names = [c for c, _ in pairs], [n for _, n in pairs]
        if self.has_rank(table):
            frame = frame.assign(_rank=self.rank)
            columns.append("_rank")
            names.append("rank")
        quoted = ", ".join(f'"{n}"' for n in names)
        sql = f"INSERT INTO {table} ({quoted}) VALUES ({', '.join('?' * len(names))})"
        for lo in range(0, len(frame), INSERT_ROWS):  # Python values of a slice at a time: 10^6 ops take GBs
            self.con.executemany(sql, _rows(frame.iloc[lo : lo + INSERT_ROWS], columns))

    def string_ids(self, values: pd.Series) -> pd.Series:
        """The `strings` ids of texts (nullable; None: NULL), new texts added to the table."""
        codes, uniques = E.string_codes(values)
        used = np.flatnonzero(np.bincount(codes + 1, minlength=len(uniques) + 1)[1:])
        texts = [str(uniques[i]) for i in used]
        ids: dict = {}
        if texts:
            # no index on value: one scan of the table for all the texts, through a temporary table
            self.con.execute("CREATE TEMP TABLE IF NOT EXISTS _dlprof_texts (value TEXT PRIMARY KEY)")
            self.con.execute("DELETE FROM _dlprof_texts")
            self.con.executemany("INSERT INTO _dlprof_texts VALUES (?)", [(t,) for t in texts])
            ids = dict(
                self.con.execute(
                    f"SELECT s.value, min(s.id) FROM {K.STRINGS} s JOIN _dlprof_texts t ON t.value = s.value "
                    "GROUP BY s.value"
                ).fetchall()
            )
            self.con.execute("DELETE FROM _dlprof_texts")
            missing = [t for t in texts if t not in ids]
            if missing:
                first = self.con.execute(f"SELECT coalesce(max(id) + 1, 0) FROM {K.STRINGS}").fetchone()[0]
                ids.update({t: first + i for i, t in enumerate(missing)})
                rows = [(ids[t], t) for t in missing]
                self.con.executemany(f"INSERT INTO {K.STRINGS} (id, value) VALUES (?, ?)", rows)
        lut = np.full(len(uniques) + 1, -1, dtype=np.int64)  # code -1 (missing) -> the last entry -> -1
        lut[used] = [ids[t] for t in texts]
        return _nullable_ids(lut[codes], values.index)

    def row(self, table: str, row: dict) -> int:
        known = self.columns(table)
        row = {k: v for k, v in row.items() if k in known}
        if self.has_rank(table):
            row["rank"] = self.rank
        cur = self.con.execute(
            f"INSERT INTO {table} ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})",
            [float(v) if isinstance(v, np.floating) else v for v in row.values()],
        )
        return cur.lastrowid


class _ArrowRows:
    """The rows _write_rank_rows produces, as Arrow tables for the database writer's thread (a new schema 3.0
    file: every derived table but `aggregations` has a rank column), instead of inserted."""

    def __init__(self, rank: int, strings: E.StringIds):
        self.rank, self.strings = rank, strings
        self.tables: list[tuple[str, pa.Table]] = []

    def columns(self, table: str) -> frozenset:
        """The columns of this version's table (a new file's)."""
        return _schema_columns(table)

    def string_ids(self, values: pd.Series) -> pd.Series:
        """The `strings` ids of texts (nullable; None: NULL), registered with the writer's strings."""
        return _nullable_ids(self.strings.column(values), values.index)

    def insert(self, table: str, frame: pd.DataFrame, columns: list[str], renamed: dict | None = None) -> None:
        if len(frame) == 0:
            return
        names = _table_names(columns, renamed)
        data = {n: _arrow_column(frame[c]) for c, n in zip(columns, names)}
        if table != K.AGGREGATIONS:
            data["rank"] = pa.array(np.full(len(frame), self.rank, dtype=np.int64))
        self.tables.append((table, pa.table(data)))

    def row(self, table: str, row: dict) -> None:
        frame = pd.DataFrame({k: [float(v) if isinstance(v, np.floating) else v] for k, v in row.items()})
        self.insert(table, frame, list(row))

    def has_table(self, table: str) -> bool:
        """A new file has every table of this version's schema."""
        return True


def _nullable_ids(ids: np.ndarray, index) -> pd.Series:
    """String ids as a nullable column (-1: NULL)."""
    return pd.Series(ids, index=index).astype("Int64").mask(ids < 0)


@functools.cache
def _schema_columns(table: str) -> frozenset:
    con = sqlite3.connect(":memory:")
    try:
        con.executescript(SCHEMA)
        return frozenset(r[1] for r in con.execute(f'PRAGMA table_info("{table}")'))
    finally:
        con.close()


def _arrow_column(values: pd.Series) -> pa.Array:
    """A column as _rows binds it: missing -> NULL, booleans as integers."""
    if values.dtype == object or str(values.dtype) in ("str", "string", "category"):
        arr = values.astype(object).to_numpy(dtype=object)
        arr = np.where(pd.isna(arr), None, arr)
        try:
            return pa.array(arr, pa.string())
        except (pa.ArrowInvalid, pa.ArrowTypeError):  # not text: as the values are
            return pa.array(arr.tolist())
    if values.dtype == bool:
        return pa.array(values.to_numpy().astype(np.int64))
    if str(values.dtype) in ("Int64", "boolean"):
        return pa.array([None if pd.isna(v) else int(v) for v in values.to_numpy(dtype=object)], pa.int64())
    if np.issubdtype(values.dtype, np.floating):
        arr = values.to_numpy(dtype=np.float64)
        return pa.array(arr, mask=np.isnan(arr))
    return pa.array(values.to_numpy())


def _global_op_index(local, mapping) -> np.ndarray:
    """Database op_index of a domain's op indices: mapping is an offset (int) or an array (op_index_maps)."""
    local = np.asarray(local, dtype=np.int64)
    if isinstance(mapping, (int, np.integer)):
        return local + int(mapping)
    mapping = np.asarray(mapping, dtype=np.int64)
    return mapping[local] if local.size else local


# Page cache of the connection appending an aggregation: its index entries (by GPU time, by op) go to random
# places of their B-trees, which SQLite's default 2 MiB cache rereads and rewrites at 10^6 ops
AGGREGATION_CACHE_KIB = 64 << 10
FIRST_AGGREGATION = 1  # aggr_id of a new database's aggregation
INSERT_ROWS = 1 << 16  # rows converted to Python values at once


def append_aggregation(
    path: Path,
    aggregations: dict,
    domain_ids: dict,
    offsets: dict,
    iterations,
    findings: dict | None = None,
    elapsed: float = 0.0,
    rank: int = K.DEFAULT_RANK,
) -> int:
    """Add one aggregation (all domains) in one transaction; returns its aggr_id. `offsets`: per domain, the
    database op_index of its ops (an offset or an array, see _global_op_index). Writes schema 2.0 files in
    their own layout (no rank)."""
    con = sqlite3.connect(path, timeout=30)
    try:
        con.execute(f"PRAGMA cache_size = -{AGGREGATION_CACHE_KIB}")
        con.execute("BEGIN IMMEDIATE")
        aggr_id = _insert_aggregation(con, next(iter(aggregations.values())), elapsed)
        _write_rank_rows(_Inserter(con, rank), aggr_id, aggregations, domain_ids, offsets, iterations, findings)
        con.execute("COMMIT")
        return aggr_id
    except sqlite3.Error as exc:
        con.rollback()
        raise DLProfError(f"{path}: could not write the aggregation ({exc})") from None
    finally:
        con.close()


def write_baselines(path: Path, aggr_id: int, domain_ids: dict, sides: dict, rank: int = K.DEFAULT_RANK) -> None:
    """Keep with the run the baseline it was compared with (`--baseline`): per domain name, the baseline's
    `compare.Side` (its op and kernel rows and headline figures, as the diff report compared them), beside the
    aggregation `aggr_id` of the run, so the viewer shows the diff report's comparison without the baseline's
    files. One transaction; a file written before gets the tables (db_schema.BASELINE_TABLES)."""
    if not sides:
        return
    con = sqlite3.connect(path, timeout=30)
    try:
        con.executescript(BASELINE_TABLES)
        con.execute("BEGIN IMMEDIATE")
        for name, side in sides.items():
            domain_id = int(domain_ids[name])
            key = (int(aggr_id), domain_id, int(rank))
            first, last, total = side.iterations if len(side.iterations) == 3 else (None, None, None)
            columns = ("aggr_id", "domain_id", "rank", "source", "key_node", "iter_start", "iter_stop")
            columns += ("total_iterations", *SIDE_FIGURES)
            con.execute(
                f"INSERT OR REPLACE INTO {K.BASELINE_PROFILES} ({', '.join(columns)}) "
                f"VALUES ({', '.join('?' * len(columns))})",
                (*key, side.label, side.key_node, first, last, total, *(side.figures.get(k) for k in SIDE_FIGURES)),
            )
            for table in (K.BASELINE_OPS, K.BASELINE_KERNELS):
                con.execute(f"DELETE FROM {table} WHERE aggr_id = ? AND domain_id = ? AND rank = ?", key)
            con.executemany(
                f"INSERT INTO {K.BASELINE_OPS} VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    (*key, _optional_text(n), _optional_text(d), _optional_text(t), int(c), int(g))
                    for n, d, t, c, g in side.ops[["name", "direction", "op_type", "calls", "gpu_time"]].itertuples(
                        index=False
                    )
                ),
            )
            con.executemany(
                f"INSERT INTO {K.BASELINE_KERNELS} VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    (*key, _optional_text(n), int(bool(u)), int(c), int(g))
                    for n, u, c, g in side.kernels[["name", "uses_tc", "calls", "gpu_time"]].itertuples(index=False)
                ),
            )
        con.execute("COMMIT")
    except sqlite3.Error as exc:
        if con.in_transaction:
            con.rollback()
        raise DLProfError(f"{path}: could not keep the baseline ({exc})") from None
    finally:
        con.close()


def append_rank_aggregations(path: Path, ranks: list[dict], elapsed: float = 0.0, extra=None) -> int:
    """One aggregation of every rank of a multi-rank database, in one transaction; returns its aggr_id. `ranks`:
    per rank a dict of rank, aggregations, domain_ids, offsets, iterations, findings (as append_aggregation
    takes them); `extra(con, aggr_id)` adds rows in the same transaction (the cross-rank tables)."""
    con = sqlite3.connect(path, timeout=30)
    try:
        con.execute("BEGIN IMMEDIATE")
        aggr_id = _insert_aggregation(con, next(iter(ranks[0]["aggregations"].values())), elapsed)
        for r in ranks:
            _write_rank_rows(
                _Inserter(con, r["rank"]),
                aggr_id,
                r["aggregations"],
                r["domain_ids"],
                r["offsets"],
                r["iterations"],
                r["findings"],
            )
        if extra is not None:
            extra(con, aggr_id)
        con.execute("COMMIT")
        return aggr_id
    except sqlite3.Error as exc:
        con.rollback()
        raise DLProfError(f"{path}: could not write the aggregation ({exc})") from None
    finally:
        con.close()


def _aggregation_row(first: Aggregation, elapsed: float) -> dict:
    """The aggregations row (key node and iteration range as asked), without its aggr_id."""
    try:
        user = getpass.getuser()
    except Exception:  # no user name in some containers
        user = ""
    return {
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "key_node": first.key_node,
        "key_source": first.key_source,
        "key_found": int(first.key_found),
        "iter_start": first.iter_start,
        "iter_stop": first.iter_stop,
        "total_iterations": first.total_iterations,
        "server_user_name": user,
        "server_host_name": socket.gethostname(),
        "engine_version": __version__,
        "elapsed_seconds": float(elapsed),
    }


def _insert_aggregation(con: sqlite3.Connection, first: Aggregation, elapsed: float) -> int:
    """Insert the aggregations row; returns its aggr_id."""
    row = _aggregation_row(first, elapsed)
    cur = con.execute(
        f"INSERT INTO {K.AGGREGATIONS} ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})", list(row.values())
    )
    return cur.lastrowid


def _write_rank_rows(
    out: _Inserter, aggr_id: int, aggregations: dict, domain_ids: dict, offsets: dict, iterations, findings: dict | None
) -> None:
    """One rank's rows of an aggregation: iteration bounds, every domain's tables and findings."""
    bounds = pd.DataFrame(
        {
            "aggr_id": aggr_id,
            "iter_value": np.arange(len(iterations.starts)),
            "start_time": np.asarray(iterations.starts, dtype=np.int64),
            "stop_time": np.asarray(iterations.ends, dtype=np.int64),
        }
    )
    out.insert(K.ITERATION_LIST, bounds, ["aggr_id", "iter_value", "start_time", "stop_time"])
    for name, agg in aggregations.items():
        _write_aggregation(out, aggr_id, domain_ids[name], offsets[name], agg)
        for f in (findings or {}).get(name, []):
            out.row(
                K.EXPERT_SYSTEMS_FEEDBACK,
                {
                    "aggr_id": aggr_id,
                    "domain_id": domain_ids[name],
                    "exp_sys_id": f.get("id"),
                    "severity": f.get("severity"),
                    "problem": f.get("problem"),
                    "recommendation": f.get("recommendation"),
                    "link": f.get("link"),
                    "action": json.dumps(f.get("action")),
                    "data": json.dumps(f.get("data", {}), default=str),
                },
            )


_STAT_COLS = [f"{p}_{s}" for p in ("cpu", "gpu", "overhead", "idle") for s in ("total", "avg", "min", "max")]
FLOPS_COLS = ["flops_per_call", "achieved_tflops"]  # flops.py; absent from files of earlier schemas


def _write_aggregation(out: _Inserter, aggr_id: int, domain_id: int, ops_map, agg: Aggregation) -> None:
    it = agg.iterations.assign(aggr_id=aggr_id, domain_id=domain_id)
    columns = [
        "aggr_id",
        "domain_id",
        "iteration",
        "start",
        "end",
        "duration",
        "aggregated",
        "kernels",
        "tc_kernels",
        "kernel_time_per_gpu",
        "tc_kernel_time_per_gpu",
        *[f"{c}_time" for c in CLASSES],
        "gpu_utilization",
        "complete",
    ]
    out.insert(K.ITERATION_SUMMARY, it, columns, {"iteration": "iter_value", "start": "start_time", "end": "stop_time"})
    s = agg.summary
    row = {
        "aggr_id": aggr_id,
        "domain_id": domain_id,
        "wall_time": s["wall_time"],
        "window_start": agg.window_start,
        "window_end": agg.window_end,
        "tc_utilization": s["tc_utilization"],
        "gpu_utilization": s["gpu_utilization"],
        **{f"{c}_duration_pct": s["pct"][c] for c in CLASSES},
        "iter_total": s["total_iterations"],
        "iter_aggregated": s["aggregated_iterations"],
        "iter_start": s["iter_start"],
        "iter_stop": s["iter_stop"],
        "avg_iteration_time": s["avg_iteration_time"],
        "iteration_time_std_dev": s["iteration_std"],
        "median_iteration_time": s["median_iteration_time"],
        "complete_iterations": s["complete_iterations"],
        "complete_start": s["complete_start"],
        "complete_stop": s["complete_stop"],
        "key_node": s["key_node"],
        "key_found": int(s["key_found"]),
        "n_visible_gpus": s["n_visible_gpus"],
    }
    for short, key in (("all", "all"), ("tc", "using_tc"), ("eligible", "eligible_not_using"), ("other", "other")):
        r = s["ops"][key]
        row.update(
            {f"ops_{short}_gpu": r["gpu_time"], f"ops_{short}_cpu": r["cpu_time"], f"ops_{short}_count": r["count"]}
        )
    for key in ("all", "tc", "memory", "other"):
        r = s["kernels"][key]
        row.update(
            {
                f"kernels_{key}_gpu": r["gpu_time"],
                f"kernels_{key}_cpu": r["cpu_time"],
                f"kernels_{key}_count": r["count"],
            }
        )
    out.row(K.MODEL_SUMMARY, row)
    dev = agg.devices.assign(aggr_id=aggr_id, domain_id=domain_id)
    out.insert(
        K.DEVICE_UTILIZATION,
        dev,
        ["aggr_id", "domain_id", "device_id", "gpu_utilization"]
        + [f"{c}_time" for c in CLASSES]
        + [f"{c}_pct" for c in CLASSES],
    )
    ops = agg.ops.assign(aggr_id=aggr_id, domain_id=domain_id, op_index=_global_op_index(agg.ops["op_index"], ops_map))
    out.insert(
        K.OP_NODES,
        ops,
        [
            "aggr_id",
            "domain_id",
            "op_index",
            "calls",
            "kernel_calls",
            "tc_eligible",
            "using_tc",
            "is_bad_data_type",
            "kernel_time",
        ]
        + _STAT_COLS
        + FLOPS_COLS,
        {"calls": "num_calls"},
    )
    types = agg.op_types.assign(aggr_id=aggr_id, domain_id=domain_id)
    out.insert(
        K.OP_TYPE_METRICS,
        types,
        ["aggr_id", "domain_id", "op_type", "n_ops", "calls"] + _STAT_COLS,
        {"n_ops": "num_ops", "calls": "num_calls"},
    )
    if len(agg.kernels):
        k = agg.kernels.assign(
            aggr_id=aggr_id, domain_id=domain_id, op_index=_global_op_index(agg.kernels["op_index"], ops_map)
        )
        names = ["name", "long_name"]  # text before schema 3.4, string ids since (contract.KERNEL_NAME_IDS)
        if K.KERNEL_NAME_IDS[0] in out.columns(K.KERNEL_SUMMARIES):
            k = k.assign(**{c: out.string_ids(k[name]) for c, name in zip(K.KERNEL_NAME_IDS, names)})
            names = list(K.KERNEL_NAME_IDS)
        out.insert(
            K.KERNEL_SUMMARIES,
            k,
            [
                "aggr_id",
                "domain_id",
                *names,
                "op_index",
                "uses_tc",
                "count",
                "first_start",
                "gpu_total",
                "gpu_avg",
                "gpu_min",
                "gpu_max",
                "api_total",
                "api_avg",
                "api_min",
                "api_max",
            ],
            {"name": "kernel_name", "count": "num_calls"},
        )
    tc = agg.tensor_core.assign(
        aggr_id=aggr_id, domain_id=domain_id, op_index=_global_op_index(agg.tensor_core["op_index"], ops_map)
    )
    if len(tc):
        tc["tc_names"] = tc["tc_kernel_names"].map(json.dumps)
        tc["non_tc_names"] = tc["non_tc_kernel_names"].map(json.dumps)
        out.insert(
            K.TENSOR_CORE_SUMMARY,
            tc,
            [
                "aggr_id",
                "domain_id",
                "op_index",
                "total_gpu_time",
                "tc_gpu_time",
                "non_tc_gpu_time",
                "tc_utilization",
                "total_kernel_count",
                "tc_kernel_count",
                "tc_names",
                "non_tc_kernel_count",
                "non_tc_names",
            ],
            {"tc_names": "tc_kernel_names", "non_tc_names": "non_tc_kernel_names"},
        )
    if len(agg.groups):
        g = agg.groups.assign(aggr_id=aggr_id, domain_id=domain_id)
        out.insert(
            K.GROUP_OPS,
            g,
            ["aggr_id", "domain_id", "name", "level", "calls", "n_ops", "n_tc_eligible", "n_using_tc"] + _STAT_COLS,
            {
                "calls": "num_calls",
                "n_ops": "num_ops",
                "n_tc_eligible": "num_tc_eligible",
                "n_using_tc": "num_using_tc",
            },
        )
    _write_memory(out, aggr_id, domain_id, ops_map, agg)
    _write_breakdowns(out, aggr_id, domain_id, agg)


_MEMORY_DEVICE_COLS = ["device_type", "device_id", "peak_allocated", "peak_reserved", "allocated_at_end"] + [
    "allocations",
    "frees",
    "bytes_allocated",
    "bytes_freed",
]
_MEMORY_OP_COLS = ["op_index", "device_type", "device_id", "allocations", "frees", "bytes_allocated", "bytes_freed"] + [
    "peak_allocated"
]


def _write_memory(out: _Inserter, aggr_id: int, domain_id: int, ops_map, agg: Aggregation) -> None:
    """The memory report's tables (schema 3.1; a file of an older schema has no place for them, and its profile
    no memory events)."""
    tables = agg.memory
    if tables is None or not tables.recorded or not out.has_table(K.MEMORY_DEVICES):
        return
    keys = {"aggr_id": aggr_id, "domain_id": domain_id}
    out.insert(K.MEMORY_DEVICES, tables.devices.assign(**keys), ["aggr_id", "domain_id"] + _MEMORY_DEVICE_COLS)
    ops = tables.ops.assign(**keys, op_index=_global_op_index(tables.ops["op_index"], ops_map))
    out.insert(K.MEMORY_OPS, ops, ["aggr_id", "domain_id"] + _MEMORY_OP_COLS)


def _write_breakdowns(out: _Inserter, aggr_id: int, domain_id: int, agg: Aggregation) -> None:
    """The GPU time breakdowns (schema 3.2; a file of an older schema has no place for them)."""
    gb = agg.gpu_breakdowns
    if gb is None or not out.has_table(K.GPU_BREAKDOWN):
        return
    keys = {"aggr_id": aggr_id, "domain_id": domain_id}
    dev = agg.devices[agg.devices["used"]]
    idle = gb["gpus"].set_index("device_id").reindex(dev["device_id"].to_numpy(), fill_value=0)
    gpus = dev.assign(
        **keys,
        gpu_idle=dev["gpu_idle_time"],
        overlapped_communication=dev["overlapped_communication_busy"],
        **{c: idle[c].to_numpy() for c in ("host_wait", "kernel_wait", "other_wait")},
    )
    busy = ["computation_busy", "communication_busy", "memory_busy", "gpu_busy"]
    out.insert(
        K.GPU_BREAKDOWN,
        gpus,
        ["aggr_id", "domain_id", "device_id"]
        + busy
        + ["gpu_idle", "overlapped_communication", "host_wait", "kernel_wait", "other_wait"],
    )
    it = agg.iterations.assign(
        **keys,
        iter_value=agg.iterations["iteration"],
        gpu_idle=agg.iterations["gpu_idle_time"],
        overlapped_communication=agg.iterations["overlapped_communication_busy"],
    )
    out.insert(
        K.ITERATION_BREAKDOWN,
        it,
        ["aggr_id", "domain_id", "iter_value"] + busy + ["gpu_idle", "overlapped_communication"],
    )
    stream_cols = ["device_id", "stream_id", "busy", "idle", "host_wait", "kernel_wait", "other_wait"]
    out.insert(K.STREAM_IDLE, gb["streams"].assign(**keys), ["aggr_id", "domain_id"] + stream_cols)
    launches = gb["launches"].assign(**keys, kernel_name=gb["launches"]["name"])
    launch_cols = ["kernel_name", "launches", "mean", "p50", "p95", "short_kernels"]
    out.insert(K.LAUNCH_DELAYS, launches, ["aggr_id", "domain_id"] + launch_cols)


# ---------------------------------------------------------------------------- reading back


def schema_version(path: Path) -> str | None:
    """db_version.current_version of a DLProf database (None if the file is not one)."""
    try:
        con = sqlite3.connect(f"{Path(path).resolve().as_uri()}?mode=ro", uri=True)
        try:
            names = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")}
            if not set(K.ENGINE_REQUIRED) <= names:
                return None
            row = con.execute("SELECT current_version, created_by FROM db_version").fetchone()
            if not row or not str(row[1]).startswith(K.CREATED_BY_PREFIX):
                return None
            return str(row[0])
        finally:
            con.close()
    except sqlite3.Error:
        return None


def is_dlprof_database(path: Path) -> bool:
    """Whether an SQLite file is a DLProf database written by this tool."""
    return schema_version(path) is not None


def load_model(path: Path, rank: int = K.DEFAULT_RANK):
    """Rebuild (trace, correlation, profile info, domain ids, op_index offsets) of one rank from a DLProf
    database of schema 3.0 or 2.0 (see db_load)."""
    return load.load_model(path, rank)
