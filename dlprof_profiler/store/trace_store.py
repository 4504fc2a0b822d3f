"""The out-of-core trace store: a large nsys export staged on disk as Arrow part files (parts.py), read segment
by segment, so a profile of 10^7 kernels is analysed in bounded memory.

Staging streams the export's NVTX ranges, CUDA API calls and GPU activities (ADBC record batches, each table
on a thread and a connection of its own) into part files, then derives what ingest.nsys.read_nsys_export
derives in memory: API calls in (start, rowid) order and GPU activities in (start, kind, rowid) order, their
position in that order their id; names as integer codes into sorted dictionaries; every GPU activity linked to
its launching call (correlate.launch_rows, over columns held in memory), with its launch time; ranges with
their domain and, never closed, ending at the capture end. Python holds the columns of one part at a time,
and a few integer columns of every API call and GPU activity while linking them. The staged tables are views
of a DuckDB connection for the expert systems' queries; no row is copied into DuckDB.
"""

from __future__ import annotations

import shutil
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa

from dlprof_profiler.ingest import nsys
from dlprof_profiler import log
from dlprof_profiler.engine.correlate import launch_rows
from dlprof_profiler.errors import DLProfError
from dlprof_profiler.store.parts import PartTable, int_schema
from dlprof_profiler.process_memory import release_unused_memory
from dlprof_profiler.ingest.sanitize import (
    CORE_FRAMES,
    TIMED_FRAMES,
    Dropped,
    drop_invalid_times,
    drop_warnings,
    invalid_rows,
    shared_correlation_ids,
)
from dlprof_profiler.ingest.sqlite_source import SqliteSource
from dlprof_profiler.engine.tensor_cores import kernel_uses_tc
from dlprof_profiler.engine.trace import (
    API_COLUMNS,
    GPU_COLUMNS,
    KIND_KERNEL,
    KIND_MEMCPY,
    KIND_MEMSET,
    LAUNCH_SHAPE,
    MISSING_TIME,
    Trace,
    combined_codes,
    event_window,
    make_frame,
    pid_of,
)

# DuckDB's own memory: at 10^7 kernels its queries completing the op model (end of correlation) held up to
# 1.2 GB beside the numpy columns, the run's peak (2.37 GB sampled, 2.69 GB max RSS under load); at 700 MB it
# spills sooner, that peak was 1.8 GB and the run took as long (157 s against 153 s)
DEFAULT_MEMORY_LIMIT = "700MB"
STAGE_ROWS = 1 << 20  # rows of a staged part
READ_ROWS = 1 << 18  # rows read from the export at a time (each reading thread holds a batch or two)
UNKNOWN_KERNEL = nsys.UNKNOWN_KERNEL

RAW_API = ["rowid", "start", "end", "global_tid", "correlation_id", "name_id", "event_class", "return_value"]
API_STORED = [
    "api_id",
    "name_code",
    "start",
    "end",
    "global_tid",
    "pid",
    "correlation_id",
    "event_class",
    "return_value",
]
# a GPU activity as exported (every kind in one layout: absent columns -1), and as staged: in id order, named
# by codes, with its launch (gpu_by_launch)
RAW_GPU = [
    "rowid",
    "start",
    "end",
    "device_id",
    "stream_id",
    "context_id",
    "global_pid",
    "correlation_id",
    *LAUNCH_SHAPE,
    "registers",
    "static_smem",
    "dynamic_smem",
    "graph_node_id",
    "bytes",
    "copy_kind",
    "src_kind",
    "dst_kind",
    "short_id",
    "long_id",
]
LINK_COLUMNS = ["api_id", "launch", "api_duration", "api_tid", "api_name", "uses_tc"]
GPU_STORED = [{"name": "name_code", "long_name": "long_code"}.get(c, c) for c in GPU_COLUMNS]
GPU_SCHEMA = pa.schema(
    [(c, pa.int8() if c == "kind" else pa.int64()) for c in GPU_STORED]
    + [(c, pa.bool_() if c == "uses_tc" else pa.int64()) for c in LINK_COLUMNS]
)
RANGES_SCHEMA = pa.schema(
    [(c, pa.int64()) for c in ("range_id", "start", "end", "global_tid", "pid", "domain_id")]
    + [("event_type", pa.int8()), ("text", pa.string())]
)  # `end` as exported: -1 for a range never closed (see ranges_of)
# GPU activity kinds in the order activity ids break ties of start time (ingest.nsys.read_gpu_activities)
GPU_TABLES = (
    ("CUPTI_ACTIVITY_KIND_KERNEL", KIND_KERNEL),
    ("CUPTI_ACTIVITY_KIND_MEMCPY", KIND_MEMCPY),
    ("CUPTI_ACTIVITY_KIND_MEMSET", KIND_MEMSET),
)


class TraceStore:
    """An nsys export staged for out-of-core analysis (part files and a DuckDB database in `workdir`)."""

    def __init__(self, export: Path, workdir: Path, memory_limit: str = DEFAULT_MEMORY_LIMIT, threads: int = 2):
        self.export = Path(export)
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.path = self.workdir / "trace.duckdb"
        tmp = self.workdir / "spill"
        tmp.mkdir(exist_ok=True)
        self.con = duckdb.connect(str(self.path))
        for setting in (
            f"SET memory_limit = '{memory_limit}'",
            f"SET threads = {int(threads)}",
            "SET temp_directory = '{}'".format(str(tmp).replace("'", "''")),  # an output path may hold a quote
            "SET preserve_insertion_order = false",
        ):
            self.con.execute(setting).fetchall()
        folder = self.workdir / "staged"
        self.raw_ranges = PartTable(folder, "ranges_raw", RANGES_SCHEMA, keys=("start", "range_id"))
        # read again for every time segment: uncompressed (parts.COMPRESSED)
        self.api = PartTable(folder, "api", int_schema(API_STORED), keys=("start", "api_id"), compression=None)
        self.gpu = PartTable(folder, "gpu", GPU_SCHEMA, keys=("start", "launch", "activity_id"), compression=None)
        self.views: dict[str, PartTable] = {}
        self.trace: Trace | None = None
        self.counts: dict = {}
        self.gpu_short: np.ndarray = np.zeros(0, dtype=object)  # short kernel name per name code
        self.gpu_long: np.ndarray = np.zeros(0, dtype=object)  # long kernel name per long code
        self.api_names: np.ndarray = np.zeros(0, dtype=object)  # API name per name code
        self.domains: list[str] = []  # domain name per domain code
        self.domain_first: list[int] = []  # domain codes in order of their first range (by range_id)
        self.domain_code: dict = {}  # (pid, domain handle) -> domain code
        self.capture_end = 0
        self.drops: dict = {}  # frame -> rows dropped for impossible timestamps (sanitize.py)
        self.before: dict = {}  # frame -> rows read before the drop
        self.unclosed = 0
        self.thread_device: dict = {}  # the device each thread / process launches most GPU time on
        self.process_device: dict = {}
        self.device_pids: dict = {}  # device -> processes with GPU activities on it
        self.kernel_pairs = pd.DataFrame()  # distinct (name_code, long_code) of kernels: uses_tc, tc_rule
        self.other_pairs = pd.DataFrame()  # distinct (name_code, long_code) of memcpys and memsets
        self._profile_start = self._profile_end = 0
        self._shared = (0, 0)
        self._staging = self._read = None
        self.staged = threading.Event()  # set once the API calls and GPU activities are staged (see load)
        self.on_staged = None  # called with the trace by wait_staged, once

    def close(self) -> None:
        try:
            self.con.close()
        finally:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def domain_order(self, mode: str | None) -> list[str]:
        """Domains in order of first appearance (by range_id), as correlate.domain_order. The same for the
        --mode given and the mode the classification then finds: it finds "simple" only without ranges."""
        if mode == "simple" or self.raw_ranges.rows == 0:
            return ["default"]
        return [self.domains[c] for c in self.domain_first]

    # -- SQL over the staged tables (and the analysis' own, see publish) ---------------------------------
    def publish(self, table: PartTable, name: str | None = None) -> None:
        """Make a complete part table queryable as `name` (default: its own) on the store's connection and on
        every `cursor()`."""
        self.views[name or table.name] = table
        table.register(self.con, name)

    def cursor(self):
        """A cursor of the store's database on which every published table is queryable too."""
        cursor = self.con.cursor()
        for name, table in self.views.items():
            table.register(cursor, name)
        return cursor

    def sql(self, query: str, params=None):
        return self.con.execute(query, params) if params is not None else self.con.execute(query)

    def run(self, statement: str, params=None) -> None:
        """A statement whose result is not needed (DDL, INSERT), run to completion."""
        self.sql(statement, params).fetchall()

    def scalar(self, query: str, params=None):
        rows = self.sql(query, params).fetchall()
        return rows[0][0] if rows else None

    def frame(self, query: str, params=None) -> pd.DataFrame:
        return self.sql(query, params).df()

    # -- staging --------------------------------------------------------------------------------------
    def load(self, on_read=None) -> Trace:
        """Read the export; return a Trace holding its small frames (the large ones live in the store). The API
        calls and GPU activities are then staged on a thread of their own while the caller goes on (classifying
        the ranges, say): `wait_staged()` before using them. `on_read(trace)` is called once the export is read
        and the trace's small frames are complete, before that staging starts."""
        src = SqliteSource(self.export, immutable=True)
        try:
            if not any(src.has(t) for t in nsys.KNOWN_NSYS_TABLES):
                raise DLProfError(
                    f"{self.export}: not an Nsight Systems export or DLProf database "
                    "(none of the nsys tables StringIds, NVTX_EVENTS, CUPTI_ACTIVITY_KIND_* found)"
                )
            trace = Trace(source=self.export)
            trace.meta = nsys.read_meta(src)
            trace.system = nsys.read_system_env(src)
            strings = _ExportStrings(src)
            trace.processes, trace.threads = nsys.read_processes_threads(src, strings)
            trace.has_nvtx = src.has("NVTX_EVENTS")
            trace.has_cuda_tables = any(src.has(t) for t in ("CUPTI_ACTIVITY_KIND_RUNTIME", *dict(GPU_TABLES)))
            with log.stage("Reading the NVTX ranges, CUDA API calls and GPU activities"):
                with ThreadPoolExecutor(max_workers=4, thread_name_prefix="dlprof-stage") as pool:
                    ranges = pool.submit(nsys.with_own_source, self.export, self._read_ranges)
                    latest = pool.submit(nsys.with_own_source, self.export, nsys.latest_nvtx)
                    gpu = pool.submit(nsys.with_own_source, self.export, self._read_gpu)
                    api = self._read_api(src)
                    gpu, ranges, latest = gpu.result(), ranges.result(), latest.result()
            trace.syncs, self.drops["syncs"] = drop_invalid_times(nsys.read_syncs(src), "GPU synchronizations", "syncs")
            trace.io_calls, self.drops["io_calls"] = drop_invalid_times(
                nsys.read_io_calls(src, strings), "I/O calls", "io_calls"
            )
            self.capture_end = nsys.capture_end([api["raw_end"], gpu["raw_end"], latest], trace.meta)
            release_unused_memory()  # what the reading threads' batches left with the allocators
            trace.domain_map = self._domain_codes(ranges)
            trace.devices = nsys.read_devices(
                src, pd.DataFrame({"device_id": np.array(sorted(gpu["devices"]), dtype=np.int64)})
            )
            trace.memory = nsys.read_memory_events(src, trace.warnings)
            peak = nsys.gpu_peak(trace.memory)
            if peak is not None:
                trace.meta["gpu_peak_memory"] = peak
            trace.meta["capture_end"] = int(self.capture_end)
        finally:
            src.close()
        self.trace = trace
        self.publish(self.raw_ranges, "ranges")  # (their texts: range_info has the rest, see StoreAnalysis)
        if on_read is not None:
            on_read(trace)
        self._read = (ranges, api, gpu)
        staging = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dlprof-stage-calls")
        self._staging = staging.submit(nsys.with_own_source, self.export, self._stage_calls, api, gpu)
        staging.shutdown(wait=False)
        return trace

    def _stage_calls(self, src: SqliteSource, api: dict, gpu: dict) -> None:
        try:
            strings = _ExportStrings(src)
            with log.stage("Staging CUDA API calls"):
                links = self._stage_api(api, strings)
            with log.stage("Staging GPU activities and linking them to their launches"):
                self._stage_gpu(gpu, links, strings)
            del links
            release_unused_memory()
        finally:
            self.staged.set()  # (also after a failure: nothing waits forever; wait_staged raises it)

    def wait_staged(self) -> Trace:
        """Wait for the API calls and GPU activities to be staged (once; raises what staging raised); then the
        store's counts, profile bounds, warnings and SQL views are complete."""
        if self._staging is None:
            return self.trace
        staging, self._staging = self._staging, None
        staging.result()
        ranges, api, gpu = self._read
        self.counts = {"ranges": self.raw_ranges.rows, "api": self.api.rows, "gpu": self.gpu.rows}
        ends = [api["last"], gpu["last"], ranges["last"]]
        if ranges["unclosed_start"] is not None:  # never closed: ends at the capture end (or at its start)
            ends.append(max(self.capture_end, ranges["unclosed_start"]))
        self._profile_start, self._profile_end = event_window(
            [ranges["first"], api["first"], gpu["first"]], ends, self.trace.meta
        )
        for table in (self.api, self.gpu):
            self.publish(table)
        self.publish(self.gpu, "gpu_by_launch")
        self.trace.warnings = self.trace.warnings + self._warnings(self.trace)  # (the memory events' first)
        if self.on_staged is not None:
            self.on_staged(self.trace)
        return self.trace

    @property
    def profile_end(self) -> int:
        return self._profile_end

    @property
    def profile_start(self) -> int:
        """Start of the first recorded event (Trace.profile_start)."""
        return self._profile_start

    def _count(self, frame: str, what: str, start: np.ndarray, end: np.ndarray, closed=None) -> np.ndarray:
        """Rows with possible times (sanitize.invalid_rows; `closed`: where `end` is a real end), counted."""
        missing, reversed_ = invalid_rows(start, end)
        if closed is not None:
            missing = start == MISSING_TIME
            reversed_ = ~missing & closed & (end < start)
        old = self.drops.get(frame, Dropped(frame, what, 0, 0))
        self.drops[frame] = Dropped(frame, what, old.missing + int(missing.sum()), old.reversed + int(reversed_.sum()))
        self.before[frame] = self.before.get(frame, 0) + start.size
        return ~(missing | reversed_)

    def _kept_batches(
        self, src: SqliteSource, query: str, columns: list, out: dict, frame: str, what: str, devices: bool = False
    ):
        """The query's record batches as numpy columns, rows of impossible times counted and dropped; tracks
        the capture's first and last times (and the devices, of GPU activities) in `out`."""
        for batch in src.record_batches(query, int_schema(columns), READ_ROWS):
            cols = {c: batch.column(i).to_numpy() for i, c in enumerate(columns)}
            _track_end(out, cols["end"])
            if devices:
                out["devices"].update(pd.unique(cols["device_id"]).tolist())
            ok = self._count(frame, what, cols["start"], cols["end"])
            if not ok.all():
                cols = {c: v[ok] for c, v in cols.items()}
            if cols["start"].size == 0:
                continue
            _track(out, "first", int(cols["start"].min()), min)
            _track(out, "last", int(cols["end"].max()), max)
            yield cols

    # CUDA API calls -------------------------------------------------------------------------------------
    def _read_api(self, src: SqliteSource) -> dict:
        """Raw parts of the API calls with possible times, and the columns their order and links need."""
        t = "CUPTI_ACTIVITY_KIND_RUNTIME"
        raw = PartTable(self.workdir / "staged", "api_raw", int_schema(RAW_API), keys=("start",))
        out = {"raw": raw, "raw_end": None, "first": None, "last": None, "names": set()}
        keep = _Columns({"rowid": np.int64, "start": np.int64}, _rows_at_most(src, [t]))
        if src.has(t):
            query = (
                f"SELECT rowid, coalesce(start, {MISSING_TIME}), coalesce(end, {MISSING_TIME}), "
                f"coalesce(globalTid, 0), coalesce(correlationId, -1), coalesce(nameId, -1), "
                f"coalesce(eventClass, 0), coalesce({src.col(t, 'returnValue', '0')}, 0) FROM {t}"
            )
            for cols in self._kept_batches(src, query, RAW_API, out, "api_calls", "CUDA API calls"):
                raw.append(cols)
                keep.add(rowid=cols["rowid"], start=cols["start"])
                out["names"].update(pd.unique(cols["name_id"]).tolist())
                release_unused_memory()  # the batch's, before the next one's
        out.update(keep.arrays())
        return out

    def _stage_api(self, api: dict, strings) -> dict:
        """The API calls in (start, rowid) order as the `api` table, name codes into the sorted distinct names;
        returns the columns of every call that linking the GPU activities needs, in id order."""
        raw: PartTable = api["raw"]
        ids = np.array(sorted(api["names"]), dtype=np.int64)
        texts = strings.lookup(ids)
        known = np.array([t is not None for t in texts], dtype=bool)
        self.api_names = np.array(sorted(set(texts[known].tolist())), dtype=object)
        code_of_id = np.where(known, np.searchsorted(self.api_names, np.where(known, texts, "")), -1).astype(np.int64)
        order = nsys.order_by_start(api["rowid"], api["start"])
        n = api["start"].size
        del api["rowid"], api["start"]
        links = {c: np.empty(n, dtype=np.int64) for c in ("pid", "correlation_id", "start", "end", "tid", "name")}
        for lo, cols in _in_order(raw, order, RAW_API):
            m = cols["start"].size
            name_code = code_of_id[np.searchsorted(ids, cols["name_id"])] if ids.size else np.full(m, -1)
            pid = pid_of(cols["global_tid"])
            self.api.append(
                {
                    "api_id": np.arange(lo, lo + m, dtype=np.int64),
                    "name_code": name_code,
                    "start": cols["start"],
                    "end": cols["end"],
                    "global_tid": cols["global_tid"],
                    "pid": pid,
                    "correlation_id": cols["correlation_id"],
                    "event_class": cols["event_class"],
                    "return_value": cols["return_value"],
                }
            )
            part = slice(lo, lo + m)
            links["pid"][part], links["correlation_id"][part] = pid, cols["correlation_id"]
            links["start"][part], links["end"][part] = cols["start"], cols["end"]
            links["tid"][part], links["name"][part] = cols["global_tid"], name_code
        raw.drop()
        self._shared = shared_correlation_ids(pd.DataFrame({k: links[k] for k in ("pid", "correlation_id")}))
        return links

    # GPU activities --------------------------------------------------------------------------------------
    def _read_gpu(self, src: SqliteSource) -> dict:
        """Raw parts of the kernels, memcpys and memsets with possible times (kernels first, then memcpys, then
        memsets, each in rowid order), the columns their order and links need, and their distinct name keys."""
        raw = PartTable(self.workdir / "staged", "gpu_raw", int_schema(RAW_GPU + ["kind"]))
        out = {"raw": raw, "raw_end": None, "first": None, "last": None, "devices": set(), "keys": set()}
        keep = _Columns(
            {"rowid": np.int64, "kind": np.int8, "start": np.int64, "pid": np.int64, "correlation_id": np.int64},
            _rows_at_most(src, [t for t, _ in GPU_TABLES]),
        )
        for table, kind in GPU_TABLES:
            if not src.has(table):
                continue
            query = _gpu_query(src, table, kind)
            for cols in self._kept_batches(src, query, RAW_GPU, out, "gpu", "GPU activities", devices=True):
                cols["kind"] = np.full(cols["start"].size, kind, dtype=np.int64)
                raw.append(cols)
                keep.add(
                    rowid=cols["rowid"],
                    kind=cols["kind"],
                    start=cols["start"],
                    pid=pid_of(cols["global_pid"]),
                    correlation_id=cols["correlation_id"],
                )
                out["keys"].update(_name_keys(kind, cols))
                release_unused_memory()
        out.update(keep.arrays())
        return out

    def _stage_gpu(self, gpu: dict, api: dict, strings) -> None:
        """The GPU activities in (start, kind, rowid) order as the `gpu` table (which is gpu_by_launch too): name
        codes, the launching call (correlate.launch_rows), launch time, call duration, thread and name, Tensor
        Core use; the device each thread and process launches most GPU time on."""
        raw: PartTable = gpu["raw"]
        key_codes = self._gpu_names(gpu["keys"], strings)
        start = gpu["start"]
        order = np.lexsort((gpu.pop("rowid"), gpu["kind"], start))
        if bool(np.all(order[1:] > order[:-1])):
            order = None
        sorted_by_id = (lambda v: v) if order is None else (lambda v: v[order])
        row = launch_rows(
            api["pid"],
            api["correlation_id"],
            api["start"],
            sorted_by_id(gpu.pop("pid")),
            sorted_by_id(gpu.pop("correlation_id")),
            sorted_by_id(gpu.pop("start")),
        )
        del gpu["kind"]
        pairs = self.kernel_pairs
        n_long = max(len(self.gpu_long), 1)
        tc_key = pd.Index(pairs["name_code"].to_numpy(np.int64) * n_long + pairs["long_code"].to_numpy(np.int64))
        tc_uses = pairs["uses_tc"].to_numpy(dtype=bool)
        by_thread, by_process = {}, {}
        device_pids = set()
        for lo, cols in _in_order(raw, order, RAW_GPU + ["kind"]):
            m = cols["start"].size
            link = row[lo : lo + m]
            has = link >= 0
            at = np.maximum(link, 0)
            names = key_codes.loc_codes(cols)
            kernel = cols["kind"] == KIND_KERNEL
            uses = np.zeros(m, dtype=bool)
            if kernel.any():
                hit = tc_key.get_indexer(names[0][kernel] * n_long + names[1][kernel])
                uses[kernel] = np.where(hit >= 0, tc_uses[np.maximum(hit, 0)], False)
            pid = pid_of(cols["global_pid"])
            staged = {
                "activity_id": np.arange(lo, lo + m, dtype=np.int64),
                "kind": cols["kind"].astype(np.int8),
                "name_code": names[0],
                "long_code": names[1],
                "pid": pid,
            }
            for c in GPU_STORED:
                if c not in staged:
                    staged[c] = cols[c]
            if has.any():
                call_start = api["start"][at]
                linked = {
                    "launch": np.where(has, call_start, cols["start"]),
                    "api_duration": np.where(has, api["end"][at] - call_start, -1),
                    "api_tid": np.where(has, api["tid"][at], -1),
                    "api_name": np.where(has, api["name"][at], -1),
                }
            else:
                none = np.full(m, -1)
                linked = {"launch": cols["start"], "api_duration": none, "api_tid": none, "api_name": none}
            staged.update(api_id=np.where(has, link, -1), uses_tc=uses, **linked)
            self.gpu.append(staged)
            busy = cols["end"] - cols["start"] + 1
            _add_sums(by_thread, staged["api_tid"], cols["device_id"], busy, staged["api_tid"] >= 0)
            _add_sums(by_process, pid, cols["device_id"], busy, pid >= 0)
            device_pids.update(_distinct_rows(cols["device_id"], pid))
        raw.drop()
        self.thread_device, self.process_device = _most_busy(by_thread), _most_busy(by_process)
        self.device_pids = {}
        for device, pid in device_pids:
            self.device_pids.setdefault(int(device), set()).add(int(pid))

    def _gpu_names(self, keys: set, strings) -> "_GpuNameCodes":
        """Names per distinct (kind, short id, long id, copy kind), as ingest.nsys gives them: a kernel's short
        and long names stand in for each other when one is unknown; memcpys are named by copy kind, memsets
        `[CUDA memset]`; codes index the sorted distinct names. Sets the kernel name pairs' Tensor Core use."""
        keys = np.array(sorted(keys), dtype=np.int64).reshape(-1, 4)
        kind, short_id, long_id, copy = keys.T
        short_text, long_text = strings.lookup(short_id), strings.lookup(long_id)
        copy_label = np.array([nsys.copy_kind_label(int(c)) for c in copy], dtype=object)
        known_short = np.array([t is not None for t in short_text], dtype=bool)
        known_long = np.array([t is not None for t in long_text], dtype=bool)
        kernel_name = np.where(known_short, short_text, np.where(known_long, long_text, UNKNOWN_KERNEL))
        kernel_long = np.where(known_long, long_text, np.where(known_short, short_text, UNKNOWN_KERNEL))
        other = np.where(kind == KIND_MEMCPY, copy_label, nsys.MEMSET_LABEL)
        name = np.where(kind == KIND_KERNEL, kernel_name, other).astype(object)
        long_name = np.where(kind == KIND_KERNEL, kernel_long, other).astype(object)
        self.gpu_short = np.array(sorted(set(name.tolist())), dtype=object)
        self.gpu_long = np.array(sorted(set(long_name.tolist())), dtype=object)
        name_code = np.searchsorted(self.gpu_short, name).astype(np.int64) if name.size else np.zeros(0, np.int64)
        long_code = np.searchsorted(self.gpu_long, long_name).astype(np.int64) if name.size else np.zeros(0, np.int64)
        pairs = pd.DataFrame({"kind": kind, "name_code": name_code, "long_code": long_code})
        kernels = pairs[pairs["kind"] == KIND_KERNEL].drop_duplicates(["name_code", "long_code"])
        uses, rules = kernel_uses_tc(
            self.gpu_short[kernels["name_code"].to_numpy(np.int64)],
            self.gpu_long[kernels["long_code"].to_numpy(np.int64)],
        )
        self.kernel_pairs = (
            kernels[["name_code", "long_code"]].assign(uses_tc=uses, tc_rule=rules).reset_index(drop=True)
        )
        self.other_pairs = (
            pairs[pairs["kind"] != KIND_KERNEL][["name_code", "long_code"]].drop_duplicates().reset_index(drop=True)
        )
        return _GpuNameCodes(keys, name_code, long_code)

    # NVTX ranges -------------------------------------------------------------------------------------------
    def _read_ranges(self, src: SqliteSource) -> dict:
        """Raw parts of the NVTX ranges with possible times (texts resolved, in rowid order), the domains'
        create rows, and per (process, domain handle) the first range."""
        t = "NVTX_EVENTS"
        out = {"first": None, "last": None, "unclosed_start": None, "created": {}, "handles": {}}
        if not src.has(t):
            return out
        types = ",".join(map(str, nsys.NVTX_RANGE_TYPES + (nsys.NVTX_DOMAIN_CREATE,)))
        inline = 'e."text"' if "text" in src.columns(t) else "NULL"
        # registered strings (textId) take precedence over inline text (ingest.nsys.range_columns)
        if src.has("StringIds") and "textId" in src.columns(t):
            text, joined = f"coalesce(s.value, {inline}, '')", "LEFT JOIN StringIds s ON s.id = e.textId"
        else:
            text, joined = f"coalesce({inline}, '')", ""
        domain = 'coalesce(e."domainId", 0)' if "domainId" in src.columns(t) else "0"
        query = (
            f'SELECT e.rowid, e.eventType, coalesce(e.start, {MISSING_TIME}), coalesce(e."end", -1), '
            f"coalesce(e.globalTid, 0), {domain}, {text} "
            f"FROM {t} e {joined} WHERE e.eventType IN ({types}) ORDER BY e.rowid"
        )
        names = ["range_id", "event_type", "start", "end", "global_tid", "domain_id", "text"]
        schema = pa.schema([(c, pa.string() if c == "text" else pa.int64()) for c in names])
        for batch in src.record_batches(query, schema, READ_ROWS):
            cols = {c: batch.column(i) for i, c in enumerate(names)}
            ints = {c: cols[c].to_numpy() for c in names if c != "text"}
            pid = pid_of(ints["global_tid"])
            create = ints["event_type"] == nsys.NVTX_DOMAIN_CREATE
            if create.any():
                for p, d, name in zip(
                    pid[create], ints["domain_id"][create], cols["text"].filter(pa.array(create)).to_pylist()
                ):
                    out["created"][(int(p), int(d))] = str(name)
            start, end = ints["start"], ints["end"]
            closed = end >= 0  # -1 (or any negative end): never closed
            ok = self._count("ranges", "NVTX ranges", start[~create], end[~create], closed[~create])
            keep = np.flatnonzero(~create)[ok]
            if keep.size == 0:
                continue
            rows = {c: v[keep] for c, v in ints.items()}
            rows["pid"] = pid[keep]
            rows["event_type"] = rows["event_type"].astype(np.int8)
            rows["text"] = cols["text"].take(pa.array(keep))
            self.raw_ranges.append({c: rows[c] for c in RANGES_SCHEMA.names})
            s, e = rows["start"], rows["end"]
            _track(out, "first", int(s.min()), min)
            closed_rows = e >= 0
            if closed_rows.any():
                _track(out, "last", int(e[closed_rows].max()), max)
            if not closed_rows.all():
                self.unclosed += int((~closed_rows).sum())
                _track(out, "unclosed_start", int(s[~closed_rows].max()), max)
            handles = combined_codes(rows["pid"], rows["domain_id"])
            first = _first_rows(handles)
            for i in first:
                key = (int(rows["pid"][i]), int(rows["domain_id"][i]))
                out["handles"].setdefault(key, int(rows["range_id"][i]))
        return out

    def _domain_codes(self, ranges: dict) -> dict:
        """(process, domain handle) -> domain name of the handles the ranges use; domain codes in order of the
        names, and the codes in order of their first range."""
        handles = ranges["handles"]
        pids = np.array([k[0] for k in handles], dtype=np.int64)
        dids = np.array([k[1] for k in handles], dtype=np.int64)
        mapping = nsys.domain_name_map(pids, dids, ranges["created"])
        self.domains = list(dict.fromkeys(mapping.values()))
        code = {name: i for i, name in enumerate(self.domains)}
        self.domain_code = {k: code[v] for k, v in mapping.items()}
        first = {}
        for key, range_id in handles.items():
            c = self.domain_code[key]
            first[c] = min(first.get(c, range_id), range_id)
        self.domain_first = sorted(first, key=first.get)
        return mapping

    def range_parts(self):
        """Per staged part, the ranges' columns in range_id order as ingest.nsys gives them (a domain code for
        the domain, never closed ranges ending at the capture end) and their texts (an Arrow array)."""
        for part in self.raw_ranges.parts:
            yield self.ranges_of(self.raw_ranges.read_part(part))

    def ranges_of(self, table: pa.Table) -> dict:
        cols = {c: table.column(c).to_numpy() for c in RANGES_SCHEMA.names if c != "text"}
        unclosed = cols["end"] < 0
        if unclosed.any():
            cols["end"] = np.where(unclosed, np.maximum(self.capture_end, cols["start"]), cols["end"])
        cols["unclosed"] = unclosed
        handles = combined_codes(cols["pid"], cols["domain_id"])
        first = _first_rows(handles)
        lut = np.zeros(int(handles.max()) + 1 if handles.size else 0, dtype=np.int64)
        for i in first:
            lut[handles[i]] = self.domain_code[(int(cols["pid"][i]), int(cols["domain_id"][i]))]
        cols["domain_code"] = lut[handles] if handles.size else handles
        text = table.column("text")
        cols["text"] = text.combine_chunks() if isinstance(text, pa.ChunkedArray) else text
        return cols

    # facts --------------------------------------------------------------------------------------------
    def _warnings(self, trace: Trace) -> list[str]:
        """The ingest's warnings (counts as staged) and sanitize.py's (rows dropped, shared correlation ids)."""
        path = self.export
        out = nsys.capture_warnings(
            path,
            trace.has_nvtx,
            trace.has_cuda_tables,
            self.before.get("ranges", 0),
            self.before.get("api_calls", 0),
            self.before.get("gpu", 0),
        )
        if self.unclosed:
            out.append(f"{path}: {self.unclosed} NVTX ranges were never closed; they end at the capture end")
        drops = [self.drops[name] for name, _, _ in TIMED_FRAMES if name in self.drops and self.drops[name].total]
        table = {"ranges": "ranges", "api_calls": "api", "gpu": "gpu"}
        before = sum(self.before.get(f, 0) for f in CORE_FRAMES)
        after = sum(self.counts[table[f]] for f in CORE_FRAMES)
        return out + drop_warnings(path, drops, before, after, self._shared)

    # -- frames, as ingest.nsys builds them -------------------------------------------------------------
    def api_frame_of(self, cols: dict) -> pd.DataFrame:
        """API call columns (the `api` table's) -> trace.api_calls' layout."""
        frame = {c: cols[c] for c in API_STORED if c != "name_code"}
        frame["name"] = pd.Categorical.from_codes(
            np.asarray(cols["name_code"], dtype=np.int64), categories=pd.Index(self.api_names, dtype=object)
        )
        return make_frame({c: frame[c] for c in API_COLUMNS})

    def gpu_frame_of(self, cols: dict) -> pd.DataFrame:
        """GPU activity columns (the `gpu` table's) -> trace.gpu's layout (the columns of it `cols` holds)."""
        frame = {c: cols[c] for c in GPU_STORED if c in cols and c not in ("name_code", "long_code")}
        if "kind" in cols:
            frame["kind"] = np.asarray(cols["kind"]).astype(np.int8)
        for column, codes, names in (("name", "name_code", self.gpu_short), ("long_name", "long_code", self.gpu_long)):
            if codes in cols:
                frame[column] = pd.Categorical.from_codes(
                    np.asarray(cols[codes], dtype=np.int64), categories=pd.Index(names, dtype=object)
                )
        return make_frame({c: frame[c] for c in GPU_COLUMNS if c in frame})

    def ranges_frame_of(self, cols: dict) -> pd.DataFrame:
        """range_parts' columns -> trace.ranges' layout."""
        domains = np.array(self.domains, dtype=object)
        codes = np.asarray(cols["domain_code"], dtype=np.int64)
        return pd.DataFrame(
            {
                "range_id": cols["range_id"],
                "domain": pd.Series(domains[codes] if codes.size else np.zeros(0, object), dtype=object),
                "text": pd.Series(cols["text"], dtype="str"),
                "start": cols["start"],
                "end": cols["end"],
                "global_tid": cols["global_tid"],
                "pid": cols["pid"],
                "event_type": np.asarray(cols["event_type"]).astype(np.int8),
                "unclosed": np.asarray(cols["unclosed"], dtype=bool),
            },
            copy=False,
        )

    def api_window(self, lo: int, hi: int) -> pd.DataFrame:
        """The API calls starting in [lo, hi), in id order."""
        return self.api_frame_of(self.api.read_range(lo, hi, key="start"))

    def frame_chunks(self, frame: str):
        """Every row of `ranges`, `api_calls` or `gpu` in id order, a staged part at a time."""
        if frame == "ranges":
            for cols in self.range_parts():
                yield self.ranges_frame_of(cols)
            return
        self.staged.wait()
        table, convert = {"api_calls": (self.api, self.api_frame_of), "gpu": (self.gpu, self.gpu_frame_of)}[frame]
        for part in table.parts:
            data = table.read_part(part)
            yield convert({c: data.column(c).to_numpy() for c in data.column_names})

    def whole_trace(self) -> Trace:
        """Every frame in memory, exactly as read_nsys_export builds them (for small stores and tests)."""
        trace = self.wait_staged()
        out = Trace(
            source=trace.source,
            meta=dict(trace.meta),
            system=dict(trace.system),
            devices=trace.devices,
            processes=trace.processes,
            threads=trace.threads,
            syncs=trace.syncs,
            io_calls=trace.io_calls,
            memory=trace.memory,
            domain_map=dict(trace.domain_map),
            warnings=list(trace.warnings),
            has_cuda_tables=trace.has_cuda_tables,
            has_nvtx=trace.has_nvtx,
        )
        for name in ("ranges", "api_calls", "gpu"):
            chunks = list(self.frame_chunks(name))
            if chunks:
                setattr(out, name, pd.concat(chunks, ignore_index=True) if len(chunks) > 1 else chunks[0])
            else:
                empty = {
                    "ranges": lambda: self.ranges_frame_of(
                        {
                            c: np.zeros(0, np.int64)
                            for c in (
                                "range_id",
                                "domain_code",
                                "start",
                                "end",
                                "global_tid",
                                "pid",
                                "event_type",
                                "unclosed",
                            )
                        }
                        | {"text": pa.array([], pa.string())}
                    ),
                    "api_calls": lambda: self.api_frame_of({c: np.zeros(0, np.int64) for c in API_STORED}),
                    "gpu": lambda: self.gpu_frame_of({c: np.zeros(0, np.int64) for c in GPU_STORED}),
                }[name]
                setattr(out, name, empty())
        return out


class _GpuNameCodes:
    """(name code, long name code) of GPU activities from their name key (see _name_keys)."""

    def __init__(self, keys: np.ndarray, name_code: np.ndarray, long_code: np.ndarray):
        self.index = pd.MultiIndex.from_arrays([keys[:, c] for c in range(4)]) if len(keys) else None
        self.name_code, self.long_code = name_code, long_code

    def loc_codes(self, cols: dict) -> tuple[np.ndarray, np.ndarray]:
        k = _key_columns(int(cols["kind"][0]) if cols["kind"].size else KIND_KERNEL, cols, per_row=True)
        if self.index is None or k[0].size == 0:
            return np.zeros(k[0].size, np.int64), np.zeros(k[0].size, np.int64)
        at = self.index.get_indexer(pd.MultiIndex.from_arrays(list(k)))
        return self.name_code[at], self.long_code[at]


def _key_columns(kind, cols: dict, per_row: bool = False) -> tuple:
    """An activity's name key: (kind, short id, long id, copy kind), the ids -1 where they name nothing."""
    kinds = cols["kind"] if per_row else np.full(cols["start"].size, kind, dtype=np.int64)
    kinds = np.asarray(kinds, dtype=np.int64)
    is_kernel, is_copy = kinds == KIND_KERNEL, kinds == KIND_MEMCPY
    return (
        kinds,
        np.where(is_kernel, cols["short_id"], -1),
        np.where(is_kernel, cols["long_id"], -1),
        np.where(is_copy, cols["copy_kind"], -1),
    )


def _name_keys(kind: int, cols: dict) -> set:
    """The distinct name keys of one table's batch of activities."""
    return _distinct_rows(*_key_columns(kind, cols))


def _distinct_rows(*columns: np.ndarray) -> set:
    """The distinct tuples of some integer columns (hashed: np.unique's sort cost a third of reading)."""
    frame = pd.DataFrame({i: c for i, c in enumerate(columns)}).drop_duplicates()
    return set(zip(*(frame[i].tolist() for i in range(len(columns)))))


def _first_rows(codes: np.ndarray) -> np.ndarray:
    """The row of each distinct value's first occurrence."""
    return np.flatnonzero(~pd.Series(codes).duplicated().to_numpy())


def _gpu_query(src: SqliteSource, table: str, kind: int) -> str:
    """The export's columns of one GPU activity table in RAW_GPU's layout (absent columns read as -1, as
    ingest.nsys reads them; a missing time as MISSING_TIME: damage, dropped and counted)."""
    common = {
        "start": "start",
        "end": "end",
        "device_id": "deviceId",
        "stream_id": "streamId",
        "context_id": "contextId",
        "global_pid": "globalPid",
        "correlation_id": "correlationId",
        "graph_node_id": "graphNodeId",
    }
    kernel = {
        **common,
        "grid_x": "gridX",
        "grid_y": "gridY",
        "grid_z": "gridZ",
        "block_x": "blockX",
        "block_y": "blockY",
        "block_z": "blockZ",
        "registers": "registersPerThread",
        "static_smem": "staticSharedMemory",
        "dynamic_smem": "dynamicSharedMemory",
        "short_id": "shortName",
        "long_id": "demangledName",
    }
    memcpy = {**common, "bytes": "bytes", "copy_kind": "copyKind", "src_kind": "srcKind", "dst_kind": "dstKind"}
    memset = {**common, "bytes": "bytes", "dst_kind": "memKind"}
    columns = {KIND_KERNEL: kernel, KIND_MEMCPY: memcpy, KIND_MEMSET: memset}[kind]
    exprs = ["rowid"]
    for f in RAW_GPU[1:]:
        source = columns.get(f)
        default = "0" if (f == "copy_kind" and kind == KIND_MEMCPY) else "-1"
        exprs.append(nsys.int_col(src, table, source, default) if source else "-1")
    return f"SELECT {', '.join(exprs)} FROM {table}"


def _track_end(out: dict, end: np.ndarray) -> None:
    """The latest end among rows as exported (missing ends aside): the capture end takes it into account."""
    real = end[end != MISSING_TIME]
    if real.size:
        _track(out, "raw_end", int(real.max()), max)
        return


def _track(out: dict, key: str, value: int, pick) -> None:
    out[key] = value if out.get(key) is None else pick(out[key], value)


class _Columns:
    """Columns filled a batch at a time into arrays allocated once (no list of batches concatenated at the
    end: that held every column twice at the peak of reading)."""

    def __init__(self, dtypes: dict, capacity: int):
        self.columns = {c: np.empty(capacity, dtype=t) for c, t in dtypes.items()}
        self.size = 0

    def add(self, **batch) -> None:
        n = len(next(iter(batch.values())))
        if self.size + n > len(next(iter(self.columns.values()))):  # more rows than the rowids promised
            self.columns = {c: np.resize(v, max(2 * len(v), self.size + n)) for c, v in self.columns.items()}
        for c, v in batch.items():
            self.columns[c][self.size : self.size + n] = v
        self.size += n

    def arrays(self) -> dict:
        return {c: v[: self.size] for c, v in self.columns.items()}


def _rows_at_most(src: SqliteSource, tables: list[str]) -> int:
    """An upper bound of the tables' rows from their rowid range (read from the b-tree's ends, no scan: SQLite
    reads a lone min() or max() of the rowid that way, but scans the table for both in one SELECT)."""
    total = 0
    for t in tables:
        if src.has(t):
            lo, hi = src.fetchall(f"SELECT (SELECT min(rowid) FROM {t}), (SELECT max(rowid) FROM {t})")[0]
            total += 0 if lo is None else int(hi) - int(lo) + 1
    return total


def _in_order(raw: PartTable, order: np.ndarray | None, columns: list[str]):
    """(first id, columns) of the raw parts' rows in the given order (None: as they are), a part's worth at a
    time: each window gathers its rows from the parts they are in (one or two when the export is nearly
    sorted)."""
    rows = STAGE_ROWS
    offsets = np.cumsum([0] + [p.rows for p in raw.parts])
    total = int(offsets[-1])
    if order is None:
        for i, part in enumerate(raw.parts):
            table = raw.read_part(part, columns)
            yield int(offsets[i]), {c: table.column(c).to_numpy() for c in columns}
        return
    for lo in range(0, total, rows):
        want = order[lo : lo + rows]
        which = np.searchsorted(offsets, want, side="right") - 1
        out = {}
        for i in np.unique(which):
            at = np.flatnonzero(which == i)
            table = raw.read_part(raw.parts[i], columns)
            local = want[at] - offsets[i]
            for c in columns:
                values = table.column(c).to_numpy()
                if c not in out:
                    out[c] = np.empty(want.size, dtype=values.dtype)
                out[c][at] = values[local]
        yield lo, out


def _add_sums(sums: dict, key: np.ndarray, device: np.ndarray, weight: np.ndarray, valid: np.ndarray) -> None:
    """Add per (key, device) sums of `weight` over the valid rows into `sums`."""
    if not valid.any():
        return
    frame = pd.DataFrame({"k": key[valid], "d": device[valid], "w": weight[valid]})
    for (k, d), w in frame.groupby(["k", "d"], sort=False)["w"].sum().items():
        sums[(int(k), int(d))] = sums.get((int(k), int(d)), 0) + int(w)


def _most_busy(sums: dict) -> dict:
    """key -> the device with the largest sum (the lowest device on ties; correlate.work_devices)."""
    best = {}
    for (k, d), _sum in sorted(sums.items(), key=lambda kv: (kv[0][0], -kv[1], kv[0][1])):
        best.setdefault(k, d)
    return best


class _ExportStrings:
    """Names of the export's string ids, looked up in its StringIds table when asked (it may hold millions)."""

    def __init__(self, src: SqliteSource):
        self.src = src
        self.present = src.has("StringIds")

    def lookup(self, ids) -> np.ndarray:
        """Strings for the ids (None where an id is unknown)."""
        ids = np.asarray(ids, dtype=np.int64)
        out = np.full(ids.size, None, dtype=object)
        if ids.size == 0 or not self.present:
            return out
        distinct = np.unique(ids[ids >= 0])
        found = {}
        for lo in range(0, distinct.size, 500):
            chunk = ",".join(str(int(i)) for i in distinct[lo : lo + 500])
            for i, value in self.src.fetchall(f"SELECT id, value FROM StringIds WHERE id IN ({chunk})"):
                found[int(i)] = value if value is not None else ""
        keys, inverse = np.unique(ids, return_inverse=True)
        values = np.empty(keys.size, dtype=object)
        values[:] = [found.get(i) for i in keys.tolist()]
        return values[inverse]
