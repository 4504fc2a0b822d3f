"""Ingest: an Nsight Systems SQLite export (2020.x to 2026.x) into trace frames.

Every table is optional; names resolve through StringIds; the file is opened read-only and immutable so
it is never modified (DLProf 1.8 modified it in place; we don't).
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from dlprof_profiler import log
from dlprof_profiler.errors import DLProfError
from dlprof_profiler.engine import memory
from dlprof_profiler.engine.memory import gpu_peak
from dlprof_profiler.ingest.sqlite_source import SqliteSource
from dlprof_profiler.engine.trace import (
    DEVICE_COLUMNS,
    DEFAULT_DOMAIN,
    GPU_COLUMNS,
    KIND_KERNEL,
    KIND_MEMCPY,
    KIND_MEMSET,
    MISSING_TIME,
    Trace,
    combined_codes,
    pid_of,
    tid_of,
)
from dlprof_profiler.engine.correlate import launch_rows

NVTX_RANGE_TYPES = (59, 60, 70, 71)
NVTX_DOMAIN_CREATE = 75

COPY_KIND_LABELS = {
    0: "[CUDA memcpy Unknown]",
    1: "[CUDA memcpy HtoD]",
    2: "[CUDA memcpy DtoH]",
    3: "[CUDA memcpy HtoA]",
    4: "[CUDA memcpy AtoH]",
    5: "[CUDA memcpy AtoA]",
    6: "[CUDA memcpy AtoD]",
    7: "[CUDA memcpy DtoA]",
    8: "[CUDA memcpy DtoD]",
    9: "[CUDA memcpy HtoH]",
    10: "[CUDA memcpy PtoP]",
    11: "[CUDA Unified Memory memcpy HtoD]",
    12: "[CUDA Unified Memory memcpy DtoH]",
    13: "[CUDA Unified Memory memcpy DtoD]",
}
MEMSET_LABEL = "[CUDA memset]"


def copy_kind_label(code) -> str:
    """The name of a memcpy of copy kind `code` (unknown kinds: `[CUDA memcpy Unknown]`)."""
    return COPY_KIND_LABELS.get(code, COPY_KIND_LABELS[0])


IO_CALLS = (
    "read",
    "write",
    "fread",
    "fwrite",
    "pread",
    "pread64",
    "pwrite",
    "pwrite64",
    "readv",
    "writev",
    "preadv",
    "pwritev",
    "fread_unlocked",
    "fwrite_unlocked",
    "open",
    "open64",
    "openat",
    "close",
    "fopen",
    "fclose",
    "fopen64",
)
KNOWN_NSYS_TABLES = (
    "StringIds",
    "NVTX_EVENTS",
    "CUPTI_ACTIVITY_KIND_RUNTIME",
    "CUPTI_ACTIVITY_KIND_KERNEL",
    "TARGET_INFO_GPU",
    "ThreadNames",
    "TARGET_INFO_SYSTEM_ENV",
)

NAMED_BY_STRING_IDS = ("CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_KERNEL")


class StringTable:
    """StringIds as arrays, to resolve millions of name ids without a join per row."""

    def __init__(self, src: SqliteSource):
        rows = src.fetchall("SELECT id, value FROM StringIds") if src.has("StringIds") else []
        ids = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
        values = np.array([r[1] if r[1] is not None else "" for r in rows], dtype=object)
        order = np.argsort(ids, kind="stable")
        self.ids = ids[order]
        codes, uniques = pd.factorize(values[order])
        self.codes = codes
        self.categories = pd.Index(uniques, dtype=object)

    def _codes_for(self, id_array) -> np.ndarray:
        id_array = np.asarray(id_array, dtype=np.int64)
        if self.ids.size == 0:
            return np.full(id_array.shape, -1, dtype=np.int64)
        pos = np.clip(np.searchsorted(self.ids, id_array), 0, self.ids.size - 1)
        return np.where(self.ids[pos] == id_array, self.codes[pos], -1)

    def codes_for(self, id_array) -> np.ndarray:
        """Positions of the ids' strings in the table's distinct values (-1 where an id is unknown)."""
        return self._codes_for(id_array)

    def text_of_code(self, code: int) -> str:
        return self.categories[code]

    def categorical(self, id_array) -> pd.Categorical:
        return pd.Categorical.from_codes(self._codes_for(id_array), categories=self.categories)

    def arrow(self, id_array):
        """Strings for the ids as an Arrow array (null where an id is unknown)."""
        codes = self._codes_for(id_array)
        dictionary = pa.array(np.asarray(self.categories, dtype=object), type=pa.string())
        return dictionary.take(pa.array(codes, mask=codes < 0))

    def lookup(self, id_array) -> np.ndarray:
        """Strings for the ids (None where an id is unknown)."""
        codes = self._codes_for(id_array)
        out = np.empty(codes.shape, dtype=object)
        known = codes >= 0
        out[known] = np.asarray(self.categories, dtype=object)[codes[known]]
        return out


def read_nsys_export(path: Path) -> Trace:
    """Read an nsys SQLite export into a Trace (raises DLProfError with a one-line reason)."""
    src = SqliteSource(path, immutable=True)
    try:
        if not any(src.has(t) for t in KNOWN_NSYS_TABLES):
            raise DLProfError(
                f"{path}: not an Nsight Systems export or DLProf database "
                "(none of the nsys tables StringIds, NVTX_EVENTS, CUPTI_ACTIVITY_KIND_* found)"
            )
        if not src.has("StringIds") and any(src.has(t) for t in NAMED_BY_STRING_IDS):
            raise DLProfError(
                f"{path}: damaged Nsight Systems export: the StringIds table, which names its events, is missing"
            )
        strings = StringTable(src)
        trace = Trace(source=Path(path))
        trace.meta = read_meta(src)
        trace.system = read_system_env(src)
        trace.processes, trace.threads = read_processes_threads(src, strings)
        trace.has_nvtx = src.has("NVTX_EVENTS")
        trace.has_cuda_tables = any(
            src.has(t)
            for t in (
                "CUPTI_ACTIVITY_KIND_RUNTIME",
                "CUPTI_ACTIVITY_KIND_KERNEL",
                "CUPTI_ACTIVITY_KIND_MEMCPY",
                "CUPTI_ACTIVITY_KIND_MEMSET",
            )
        )
        # The three large tables are read at once, each on its own connection: ADBC reads them in C without
        # the GIL, so the reads share the cores (the rest of the work has to wait for all of them anyway).
        with ThreadPoolExecutor(max_workers=3, thread_name_prefix="dlprof-read") as pool:
            range_ints = pool.submit(with_own_source, path, read_range_ints)
            range_texts = pool.submit(with_own_source, path, read_range_texts)
            gpu_read = pool.submit(with_own_source, path, read_gpu_activities, strings)
            trace.api_calls = read_api_calls(src, strings)
            trace.syncs = read_syncs(src)
            trace.io_calls = read_io_calls(src, strings)
            trace.gpu = gpu_read.result()
            columns = range_columns(range_ints.result(), range_texts.result(), strings)
        end = capture_end([_frame_end(trace.api_calls), _frame_end(trace.gpu), columns.get("latest")], trace.meta)
        trace.ranges, trace.domain_map = ranges_frame(columns, end)
        trace.devices = read_devices(src, trace.gpu)
        trace.memory = read_memory_events(src, trace.warnings)
        peak = gpu_peak(trace.memory)
        if peak is not None:
            trace.meta["gpu_peak_memory"] = peak
        trace.meta["capture_end"] = end
        trace.warnings += capture_warnings(
            path, trace.has_nvtx, trace.has_cuda_tables, len(trace.ranges), len(trace.api_calls), len(trace.gpu)
        )
        unclosed = int(trace.ranges["unclosed"].sum()) if len(trace.ranges) else 0
        if unclosed:
            trace.warnings.append(f"{path}: {unclosed} NVTX ranges were never closed; they end at the capture end")
        return trace
    finally:
        src.close()


def capture_warnings(path, has_nvtx: bool, has_cuda_tables: bool, ranges: int, api_calls: int, gpu: int) -> list:
    """What the capture lacks, one line each (`ranges`, `api_calls`, `gpu`: how many it holds); a capture
    with neither NVTX ranges nor CUDA activity gets a single line saying what to do."""
    no_ranges = not has_nvtx or ranges == 0
    if no_ranges and api_calls == 0 and gpu == 0:
        return [
            f"{path}: the capture recorded no NVTX ranges and no CUDA activity, so there are no ops and no GPU "
            "figures (the wall clock is the capture's own window); to see ops, profile a program that imports "
            "torch (dlprof annotates it, unless --pytorch_init=false or its Python ignores PYTHONPATH: -E, -I) "
            "or that marks its work with NVTX ranges (nvtx package, torch.cuda.nvtx)"
        ]
    warnings = []
    if not has_cuda_tables:
        warnings.append(
            f"{path}: no CUDA trace tables (CUPTI_ACTIVITY_KIND_*): the capture holds no "
            "CUDA API calls or GPU activities, so every GPU figure is zero"
        )
    elif gpu == 0:
        warnings.append(f"{path}: no GPU activities (kernels, memcpys, memsets) were captured")
    if no_ranges:
        warnings.append(
            f"{path}: no NVTX ranges: ops cannot be named, every GPU activity is reported "
            "under the API call that launched it"
        )
    return warnings


def read_meta(src: SqliteSource) -> dict:
    """Exporter and schema versions (META_DATA_EXPORT, EXPORT_META_DATA or a guess for <= 2021.3)."""
    meta: dict = {}
    for table in ("META_DATA_EXPORT", "EXPORT_META_DATA"):
        if src.has(table):
            meta.update({str(k): v for k, v in src.fetchall(f'SELECT name, value FROM "{table}"')})
            meta["metadata_table"] = table
            break
    version = meta.get("EXPORT_PRODUCT_VERSION")
    if not version:
        version = _guess_nsys_version(src)
    meta["nsys_version"] = version or "unknown"
    meta["schema_version"] = meta.get("EXPORT_SCHEMA_VERSION", "unknown")
    if src.has("ANALYSIS_DETAILS"):
        row = src.fetchall("SELECT startTime, stopTime, duration FROM ANALYSIS_DETAILS LIMIT 1")
        if row:
            meta["session_start"], meta["session_stop"], meta["session_duration"] = row[0]
            if isinstance(meta["session_start"], int):
                meta["capture_start"] = meta["session_start"]  # the capture's own window (trace.event_window)
    if src.has("TARGET_INFO_SESSION_START_TIME"):
        row = src.fetchall(
            f"SELECT {src.col('TARGET_INFO_SESSION_START_TIME', 'utcEpochNs')}, "
            f"{src.col('TARGET_INFO_SESSION_START_TIME', 'utcTime')} "
            "FROM TARGET_INFO_SESSION_START_TIME LIMIT 1"
        )
        if row:
            meta["session_utc_epoch_ns"], meta["session_utc_time"] = row[0]
    return meta


_VERSION_IN_PATH = re.compile(r"nsight[-_]systems(?:-cli)?[-/](20\d\d\.\d+(?:\.\d+)*)", re.IGNORECASE)


def _guess_nsys_version(src: SqliteSource) -> str | None:
    """Old exports carry no metadata table; their install paths often name the version."""
    candidates = []
    if src.has("TARGET_INFO_SYSTEM_ENV"):
        candidates += [v for (v,) in src.fetchall("SELECT value FROM TARGET_INFO_SYSTEM_ENV")]
    if src.has("StringIds"):
        candidates += [
            v for (v,) in src.fetchall("SELECT value FROM StringIds WHERE value LIKE '%nsight%systems%' LIMIT 50")
        ]
    for text in candidates:
        match = _VERSION_IN_PATH.search(str(text))
        if match:
            return match.group(1)
    return None


# Facts of the NVIDIA driver: nsys writes them also where no driver runs (NvDriverVersion 0, and the CUDA
# version nsys itself supports as CudaDriverVersion), so they are kept only when a driver was recorded.
DRIVER_FACTS = ("NvDriverVersion", "CudaDriverVersion")


def read_system_env(src: SqliteSource) -> dict:
    """TARGET_INFO_SYSTEM_ENV as a dict, plus the `SystemInfo` table DLProf 1.8 added to the exports it
    modified (under `dlprof_system_info`, labels as its System Config wrote them). Driver facts only where
    the capture recorded a driver (DRIVER_FACTS)."""
    env = {}
    if src.has("TARGET_INFO_SYSTEM_ENV"):
        for name, value in src.fetchall("SELECT name, value FROM TARGET_INFO_SYSTEM_ENV"):
            env.setdefault(str(name), value)
    if str(env.get("NvDriverVersion", "")).strip() in ("", "0"):
        for name in DRIVER_FACTS:
            env.pop(name, None)
    if src.has("SystemInfo"):
        info = read_dlprof_system_info(src)
        if info:
            env["dlprof_system_info"] = info
    return env


_SYSTEM_INFO_LABELS = {
    "gpucount": "GPU Count",
    "gpunames": "GPU Name(s)",
    "cpumodel": "CPU Model",
    "gpudriverversion": "GPU Driver Version",
    "driverversion": "GPU Driver Version",
    "framework": "Framework",
    "cudaversion": "CUDA Version",
    "cudnnversion": "cuDNN Version",
    "nsysversion": "NSys Version",
}


def read_dlprof_system_info(src: SqliteSource) -> dict:
    """DLProf 1.8's SystemInfo table (name/value rows, or one row of named columns) by System Config label."""
    columns = src.columns("SystemInfo")
    lower = [c.lower() for c in columns]
    pairs = []
    key = next((columns[i] for i, c in enumerate(lower) if c in ("name", "key", "property")), None)
    value = next((columns[i] for i, c in enumerate(lower) if c in ("value", "val")), None)
    if key and value:
        pairs = src.fetchall(f'SELECT "{key}", "{value}" FROM SystemInfo')
    else:
        rows = src.fetchall("SELECT * FROM SystemInfo LIMIT 1")
        if rows:
            pairs = list(zip(columns, rows[0]))
    out = {}
    for name, val in pairs:
        label = _SYSTEM_INFO_LABELS.get(re.sub(r"[^a-z]", "", str(name).lower()), str(name))
        if val not in (None, ""):
            out[label] = str(val)
    return out


def read_processes_threads(src: SqliteSource, strings: StringTable) -> tuple[pd.DataFrame, pd.DataFrame]:
    if src.has("PROCESSES"):
        processes = src.frame("SELECT pid, name FROM PROCESSES", ["pid", "name"])
    else:
        processes = pd.DataFrame({"pid": pd.Series(dtype="int64"), "name": pd.Series(dtype=object)})
    if src.has("ThreadNames"):
        rows = src.fetchall("SELECT globalTid, nameId FROM ThreadNames WHERE globalTid IS NOT NULL")
        gtid = np.array([r[0] for r in rows], dtype=np.int64)
        threads = pd.DataFrame(
            {"global_tid": gtid, "pid": pid_of(gtid), "tid": tid_of(gtid), "name": strings.lookup([r[1] for r in rows])}
        )
        threads = threads.drop_duplicates("global_tid")
    else:
        threads = pd.DataFrame({c: pd.Series(dtype="int64") for c in ("global_tid", "pid", "tid")})
        threads["name"] = pd.Series(dtype=object)
    processes = processes.drop_duplicates("pid").reset_index(drop=True)
    return processes, threads.reset_index(drop=True)


def read_api_calls(src: SqliteSource, strings: StringTable) -> pd.DataFrame:
    """CUDA runtime and driver calls, in (start, rowid) order: api_id is the position in that order."""
    table = "CUPTI_ACTIVITY_KIND_RUNTIME"
    names = ["start", "end", "global_tid", "correlation_id", "name_id", "event_class", "return_value"]
    if src.has(table):
        # read in table order and sorted here: SQLite's ORDER BY would sort even when the rows already are
        cols = src.int_columns(
            f"SELECT rowid, coalesce(start, {MISSING_TIME}), coalesce(end, {MISSING_TIME}), coalesce(globalTid, 0), "
            f"coalesce(correlationId, -1), coalesce(nameId, -1), "
            f"coalesce(eventClass, 0), coalesce({src.col(table, 'returnValue', '0')}, 0) "
            f"FROM {table}",
            ["rowid"] + names,
        )
        order = order_by_start(cols.pop("rowid"), cols["start"])
        if order is not None:
            cols = {name: values[order] for name, values in cols.items()}
    else:
        cols = {n: np.zeros(0, dtype=np.int64) for n in names}
    n = len(cols["start"])
    return pd.DataFrame(
        {
            "api_id": np.arange(n, dtype=np.int64),
            "name": strings.categorical(cols["name_id"]),
            "start": cols["start"],
            "end": cols["end"],
            "global_tid": cols["global_tid"],
            "pid": pid_of(cols["global_tid"]),
            "correlation_id": cols["correlation_id"],
            "event_class": cols["event_class"],
            "return_value": cols["return_value"],
        },
        copy=False,
    )


def order_by_start(rowid: np.ndarray, start: np.ndarray) -> np.ndarray | None:
    """The permutation that sorts rows by (start, rowid); None when they already are in that order."""
    if start.size < 2:
        return None
    same = start[1:] == start[:-1]
    if (start[1:] >= start[:-1]).all() and (rowid[1:][same] > rowid[:-1][same]).all():
        return None
    return np.lexsort((rowid, start))


def with_own_source(path: Path, read, *args):
    """read(src, *args) on a connection of its own (to run on another thread)."""
    src = SqliteSource(path, immutable=True)
    try:
        return read(src, *args)
    finally:
        src.close()


def int_col(src: SqliteSource, table: str, name: str, default: str = "-1") -> str:
    if name in ("start", "end"):
        default = str(MISSING_TIME)  # a NULL time is damage, dropped by sanitize.py
    if name in src.columns(table):
        return f'coalesce("{name}", {default})'
    return default


KERNEL_SOURCE_COLUMNS = [
    "start",
    "end",
    "deviceId",
    "streamId",
    "contextId",
    "globalPid",
    "correlationId",
    "gridX",
    "gridY",
    "gridZ",
    "blockX",
    "blockY",
    "blockZ",
    "registersPerThread",
    "staticSharedMemory",
    "dynamicSharedMemory",
    "graphNodeId",
]
MEMORY_SOURCE_COLUMNS = [
    "start",
    "end",
    "deviceId",
    "streamId",
    "contextId",
    "globalPid",
    "correlationId",
    "graphNodeId",
    "bytes",
]
_GPU_FIELD = {
    "deviceId": "device_id",
    "streamId": "stream_id",
    "contextId": "context_id",
    "correlationId": "correlation_id",
    "gridX": "grid_x",
    "gridY": "grid_y",
    "gridZ": "grid_z",
    "blockX": "block_x",
    "blockY": "block_y",
    "blockZ": "block_z",
    "registersPerThread": "registers",
    "staticSharedMemory": "static_smem",
    "dynamicSharedMemory": "dynamic_smem",
    "graphNodeId": "graph_node_id",
    "start": "start",
    "end": "end",
    "bytes": "bytes",
    "copyKind": "copy_kind",
    "srcKind": "src_kind",
    "dstKind": "dst_kind",
    "memKind": "dst_kind",
}


def read_gpu_activities(src: SqliteSource, strings: StringTable) -> pd.DataFrame:
    """Kernels, memcpys and memsets in one frame ordered by (start, kind, source rowid); activity_id is
    the position in that order. Names are categoricals built from integer codes (no string per row)."""
    parts = []
    kt, mt, st = "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"
    labels = list(COPY_KIND_LABELS.values()) + [MEMSET_LABEL, UNKNOWN_KERNEL]
    label_code = {text: i for i, text in enumerate(labels)}
    if src.has(kt):
        cols = src.int_columns(
            f"SELECT rowid, {', '.join(int_col(src, kt, c) for c in KERNEL_SOURCE_COLUMNS)}, "
            f"{int_col(src, kt, 'shortName')}, {int_col(src, kt, 'demangledName')} FROM {kt}",
            ["rowid"] + KERNEL_SOURCE_COLUMNS + ["shortName", "demangledName"],
        )
        short = strings.codes_for(cols.pop("shortName"))
        long = strings.codes_for(cols.pop("demangledName"))
        # Some exporters leave one of the two names unknown; each stands in for the other. Codes >= 0
        # index the string table; the fixed labels get negative codes.
        short, long = np.where(short >= 0, short, long), np.where(long >= 0, long, short)
        unknown = -1 - label_code[UNKNOWN_KERNEL]
        parts.append(
            _gpu_part(cols, KIND_KERNEL, np.where(short >= 0, short, unknown), np.where(long >= 0, long, unknown))
        )
    if src.has(mt):
        cols = src.int_columns(
            f"SELECT rowid, {', '.join(int_col(src, mt, c) for c in MEMORY_SOURCE_COLUMNS)}, "
            f"{int_col(src, mt, 'copyKind', '0')}, {int_col(src, mt, 'srcKind')}, {int_col(src, mt, 'dstKind')} "
            f"FROM {mt}",
            ["rowid"] + MEMORY_SOURCE_COLUMNS + ["copyKind", "srcKind", "dstKind"],
        )
        kind_codes = np.where(np.isin(cols["copyKind"], list(COPY_KIND_LABELS)), cols["copyKind"], 0)
        codes = -1 - kind_codes  # COPY_KIND_LABELS keys are 0..13, their position in `labels`
        parts.append(_gpu_part(cols, KIND_MEMCPY, codes, codes))
    if src.has(st):
        cols = src.int_columns(
            f"SELECT rowid, {', '.join(int_col(src, st, c) for c in MEMORY_SOURCE_COLUMNS)}, "
            f"{int_col(src, st, 'memKind')} FROM {st}",
            ["rowid"] + MEMORY_SOURCE_COLUMNS + ["memKind"],
        )
        codes = np.full(len(cols["rowid"]), -1 - label_code[MEMSET_LABEL], dtype=np.int64)
        parts.append(_gpu_part(cols, KIND_MEMSET, codes, codes))
    if not parts:
        frame = pd.DataFrame({c: np.zeros(0, dtype=np.int64) for c in GPU_COLUMNS})
        frame["kind"] = frame["kind"].astype(np.int8)
        frame["name"] = pd.Categorical([])
        frame["long_name"] = pd.Categorical([])
        return frame[GPU_COLUMNS]

    def column(name):
        return np.concatenate([p.pop(name) for p in parts]) if len(parts) > 1 else parts[0].pop(name)

    starts = np.concatenate([p["start"] for p in parts]) if len(parts) > 1 else parts[0]["start"]
    order = np.lexsort((column("rowid"), np.concatenate([p["kind"] for p in parts]), starts))
    in_order = bool((order[1:] > order[:-1]).all()) if order.size > 1 else True
    del starts
    out = {}
    for name in list(parts[0]):  # one column at a time, each source array released once moved
        values = column(name)
        out[name] = values if in_order else values[order]
        del values
    out["activity_id"] = np.arange(order.size, dtype=np.int64)
    out["name"] = _categorical(out.pop("name_code"), strings, labels)
    out["long_name"] = _categorical(out.pop("long_code"), strings, labels)
    return pd.DataFrame({c: out[c] for c in GPU_COLUMNS}, copy=False)


UNKNOWN_KERNEL = "<unknown kernel>"


def _categorical(codes: np.ndarray, strings: StringTable, labels: list[str]) -> pd.Categorical:
    """Codes >= 0 index the string table, codes < 0 the fixed labels (-1 - position)."""
    used, inverse = np.unique(codes, return_inverse=True)
    names = np.array([strings.text_of_code(int(c)) if c >= 0 else labels[-1 - int(c)] for c in used], dtype=object)
    unique_names, remap = np.unique(names, return_inverse=True)  # distinct codes may share a text
    return pd.Categorical.from_codes(remap[inverse], categories=pd.Index(unique_names, dtype=object))


def _gpu_part(cols: dict, kind: int, name_codes: np.ndarray, long_codes: np.ndarray) -> dict:
    n = len(cols["rowid"])
    part = {}
    for source, value in cols.items():
        if source in _GPU_FIELD:
            part[_GPU_FIELD[source]] = value
    for c in GPU_COLUMNS:
        if c not in part and c not in ("name", "long_name", "kind", "activity_id"):
            part[c] = np.full(n, -1, dtype=np.int64)
    part["pid"] = pid_of(cols["globalPid"])
    part["kind"] = np.full(n, kind, dtype=np.int8)
    part["rowid"] = cols["rowid"]
    part["name_code"] = np.asarray(name_codes, dtype=np.int64)
    part["long_code"] = np.asarray(long_codes, dtype=np.int64)
    return part


MEMORY_USAGE = "CUDA_GPU_MEMORY_USAGE_EVENTS"
HOST_MEMORY_KINDS = (0, 1)  # ENUM_CUDA_MEM_KIND pageable, pinned: host memory


def read_memory_events(src: SqliteSource, warnings: list | None = None) -> pd.DataFrame:
    """CUDA memory allocations and frees (captured with `nsys profile --cuda-memory-usage=true`) as the memory
    frame (memory.py): `memoryOperationType` 0 allocates `bytes`, 1 frees them; pageable and pinned host memory
    is the CPU's, the rest its `deviceId`'s. An event has no thread of its own: it takes the thread of its CUDA
    API call (same process and correlation id, the launch rule of GPU activities), whose start is its call time."""
    t = MEMORY_USAGE
    if not src.has(t) or not {"bytes", "memoryOperationType", "start"} <= set(src.columns(t)):
        return memory.empty_memory_frame()
    cols = src.int_columns(
        f"SELECT {int_col(src, t, 'start')}, {int_col(src, t, 'globalPid', '0')}, "
        f"{int_col(src, t, 'deviceId', '0')}, {int_col(src, t, 'address')}, {int_col(src, t, 'bytes', '0')}, "
        f"{int_col(src, t, 'memKind', '2')}, {int_col(src, t, 'memoryOperationType')}, "
        f"{int_col(src, t, 'correlationId')} FROM {t} ORDER BY rowid",
        ["start", "gpid", "device", "address", "bytes", "kind", "op", "correlation"],
    )
    keep = (cols["start"] != MISSING_TIME) & np.isin(cols["op"], (0, 1))
    if warnings is not None and (cols["start"] == MISSING_TIME).any():
        warnings.append(
            f"{src.path}: {int((cols['start'] == MISSING_TIME).sum()):,} CUDA memory events without a time were dropped"
        )
    cols = {k: v[keep] for k, v in cols.items()}
    pid = pid_of(cols["gpid"])
    host = np.isin(cols["kind"], HOST_MEMORY_KINDS)
    tid = np.full(pid.size, -1, dtype=np.int64)
    call_start = cols["start"].copy()
    rt = "CUPTI_ACTIVITY_KIND_RUNTIME"
    if pid.size and src.has(rt) and "correlationId" in src.columns(t):
        calls = src.int_columns(
            f"SELECT coalesce(globalTid, 0), start, correlationId FROM {rt} "
            f"WHERE start IS NOT NULL AND correlationId IN (SELECT correlationId FROM {t}) ORDER BY start, rowid",
            ["tid", "start", "correlation"],
        )
        row = launch_rows(
            pid_of(calls["tid"]), calls["correlation"], calls["start"], pid, cols["correlation"], cols["start"]
        )
        linked = row >= 0
        tid[linked] = calls["tid"][row[linked]]
        call_start[linked] = calls["start"][row[linked]]
    return memory.memory_frame(
        cols["start"],
        np.where(cols["op"] == 0, cols["bytes"], -cols["bytes"]),
        np.where(host, memory.CPU, memory.CUDA),
        np.where(host, -1, cols["device"]),
        pid,
        global_tid=tid,
        call_start=call_start,
        address=cols["address"],
    )


def read_syncs(src: SqliteSource) -> pd.DataFrame:
    t = "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"
    columns = ["start", "end", "device_id", "stream_id", "pid", "correlation_id", "sync_type"]
    if not src.has(t):
        return pd.DataFrame({c: pd.Series(dtype="int64") for c in columns})
    frame = src.frame(
        f"SELECT start, end, {int_col(src, t, 'deviceId')}, {int_col(src, t, 'streamId')}, "
        f"{int_col(src, t, 'globalPid', '0')}, {int_col(src, t, 'correlationId')}, "
        f"{int_col(src, t, 'syncType', '0')} FROM {t}",
        columns,
    )
    frame["pid"] = pid_of(frame["pid"])
    return frame


def read_io_calls(src: SqliteSource, strings: StringTable) -> pd.DataFrame:
    """OS runtime file I/O calls (only when OSRT was traced): the summary's I/O class."""
    t = "OSRT_API"
    columns = ["start", "end", "global_tid", "name_id"]
    if not src.has(t):
        frame = pd.DataFrame({c: pd.Series(dtype="int64") for c in columns})
    else:
        io_ids = [
            r[0]
            for r in src.fetchall(
                f"SELECT id FROM StringIds WHERE value IN ({','.join('?' * len(IO_CALLS))})", IO_CALLS
            )
        ]
        if io_ids:
            frame = src.frame(
                f"SELECT start, end, coalesce(globalTid, 0), nameId FROM {t} "
                f"WHERE eventClass = 27 AND nameId IN ({','.join(map(str, io_ids))})",
                columns,
            )
        else:
            frame = pd.DataFrame({c: pd.Series(dtype="int64") for c in columns})
    frame["pid"] = pid_of(frame["global_tid"])
    frame["name"] = strings.lookup(frame["name_id"])
    return frame.drop(columns="name_id")


def capture_end(latest_ends, meta: dict) -> int:
    """The capture's end: the session's stop time, unless some event ends later. `latest_ends`: the latest end
    of each kind of event (CUDA API calls, GPU activities, any NVTX event's end or time), None for a kind
    without events; both engines' readers call it (in memory and staged)."""
    last = max([0] + [int(v) for v in latest_ends if v is not None])
    stop = meta.get("session_stop")
    return int(stop) if isinstance(stop, int) and stop >= last else last


def latest_nvtx(src: SqliteSource):
    """The latest end or time of any NVTX event (None without NVTX_EVENTS): the capture end takes it into
    account."""
    if not src.has("NVTX_EVENTS"):
        return None
    value = src.query_scalar("SELECT max(coalesce(end, start)) FROM NVTX_EVENTS")
    return None if value is None else int(value)


def _frame_end(frame: pd.DataFrame):
    return int(frame["end"].max()) if len(frame) else None


RANGE_FRAME_COLUMNS = ["range_id", "domain", "text", "start", "end", "global_tid", "pid", "event_type", "unclosed"]


def read_range_columns(src: SqliteSource, strings: StringTable) -> dict:
    """What ranges_frame needs from NVTX_EVENTS: the range and domain-create rows' integer columns, their
    texts (registered strings resolved) and `latest`, the latest end or time of any NVTX event."""
    return range_columns(read_range_ints(src), read_range_texts(src), strings)


def _range_rows(src: SqliteSource) -> str:
    types = ",".join(map(str, NVTX_RANGE_TYPES + (NVTX_DOMAIN_CREATE,)))
    return f"FROM NVTX_EVENTS WHERE eventType IN ({types}) ORDER BY rowid"


def read_range_ints(src: SqliteSource) -> dict | None:
    """The integer columns of the range and domain-create rows (None without NVTX_EVENTS)."""
    t = "NVTX_EVENTS"
    if not src.has(t):
        return None
    return src.int_columns(
        f"SELECT rowid, eventType, coalesce(start, {MISSING_TIME}), coalesce(end, -1), coalesce(globalTid, 0), "
        f"{int_col(src, t, 'domainId', '0')}, {int_col(src, t, 'textId')} {_range_rows(src)}",
        ["range_id", "event_type", "start", "end", "global_tid", "domain_id", "text_id"],
    )


def read_range_texts(src: SqliteSource) -> tuple | None:
    """(inline texts of the range and domain-create rows, latest end or time of any NVTX event); a query of
    its own, so it can run beside read_range_ints (None without NVTX_EVENTS)."""
    if not src.has("NVTX_EVENTS"):
        return None
    return src.arrow_text_column(f"SELECT {src.col('NVTX_EVENTS', 'text')} {_range_rows(src)}"), latest_nvtx(src)


def range_columns(cols: dict | None, texts: tuple | None, strings: StringTable) -> dict:
    """read_range_ints' and read_range_texts' results as read_range_columns gives them."""
    if cols is None:
        return {}
    text, cols["latest"] = texts
    if len(cols["range_id"]) == 0:
        return cols
    text_id = cols.pop("text_id")
    if (text_id >= 0).any():  # registered strings (textId) take precedence over inline text
        text = pc.coalesce(strings.arrow(text_id), text)
    del text_id
    cols["text"] = pc.fill_null(text, "")
    return cols


def ranges_frame(cols: dict, capture_end: int) -> tuple[pd.DataFrame, dict]:
    """The ranges frame and the domain map from read_range_columns' columns; ranges never closed end at the
    capture's end."""
    if len(cols.get("range_id", ())) == 0:
        return _empty_ranges(RANGE_FRAME_COLUMNS), {}
    text = cols["text"]
    pid = pid_of(cols["global_tid"])
    # Domain handles are per process: (pid, domainId) -> name, from the domain-create rows.
    create = cols["event_type"] == NVTX_DOMAIN_CREATE
    created_names = text.filter(pa.array(create)).to_pylist() if create.any() else []
    names = {(int(p), int(d)): str(n) for p, d, n in zip(pid[create], cols["domain_id"][create], created_names)}
    end, start = cols["end"], cols["start"]
    unclosed = end < 0
    end = np.where(unclosed, np.maximum(capture_end, start), end)
    keep = ~create  # ranges ending before they start are dropped (and counted) by sanitize.py
    everything = bool(keep.all())
    sel = None if everything else np.flatnonzero(keep)

    def take(values):
        return values if everything else values[sel]

    domains, mapping = _domain_names(take(pid), take(cols["domain_id"]), names)
    frame = pd.DataFrame(
        {
            "range_id": take(cols["range_id"]),
            "domain": pd.Series(domains, dtype=object, copy=False),
            "text": pd.Series(text if everything else text.take(pa.array(sel)), dtype="str"),
            "start": take(start),
            "end": take(end),
            "global_tid": take(cols["global_tid"]),
            "pid": take(pid),
            "event_type": take(cols["event_type"]).astype(np.int8),
            "unclosed": take(unclosed),
        },
        copy=False,
    )
    return frame, mapping


def _empty_ranges(columns: list[str]) -> pd.DataFrame:
    frame = pd.DataFrame({c: pd.Series(dtype="int64") for c in columns})
    frame["domain"] = pd.Series(dtype=object)
    frame["text"] = pd.Series(dtype=object)
    frame["unclosed"] = pd.Series(dtype=bool)
    return frame


def domain_name_map(pids: np.ndarray, domain_ids: np.ndarray, created: dict) -> dict:
    """(pid, domain handle) -> domain name: default for handle 0, the created name, else `domain<id>`."""
    mapping = {}
    for pid, did in set(zip(pids.tolist(), domain_ids.tolist())):  # one entry per (process, handle)
        if did == 0:
            mapping[(pid, did)] = DEFAULT_DOMAIN
            continue
        name = created.get((pid, did)) or f"domain{did}"
        mapping[(pid, did)] = f"{name} (named)" if name == DEFAULT_DOMAIN else name
    return mapping


def _domain_names(pids: np.ndarray, domain_ids: np.ndarray, created: dict) -> tuple[np.ndarray, dict]:
    """Domain name per range, resolved once per distinct (process, domain handle), and the (process, domain
    handle) -> name map of the handles the ranges use."""
    if pids.size == 0:
        return np.zeros(0, dtype=object), {}
    codes = combined_codes(pids, domain_ids)
    first = np.full(int(codes.max()) + 1, -1, dtype=np.int64)
    first[codes[::-1]] = np.arange(codes.size - 1, -1, -1)
    u_pid, u_dom = pids[first], domain_ids[first]
    mapping = domain_name_map(u_pid, u_dom, created)
    names = np.array([mapping[(int(p), int(d))] for p, d in zip(u_pid, u_dom)], dtype=object)
    return names[codes], mapping


def read_devices(src: SqliteSource, gpu: pd.DataFrame) -> pd.DataFrame:
    """Every GPU listed in the export plus any device that ran work but is not listed."""
    rows = []
    t = "TARGET_INFO_GPU"
    if src.has(t):
        cols = src.columns(t)
        id_col = "id" if "id" in cols else ("deviceId" if "deviceId" in cols else None)
        if id_col:
            select = [f'"{id_col}"'] + [
                src.col(t, c)
                for c in (
                    "name",
                    "computeMajor",
                    "computeMinor",
                    "smCount",
                    "totalMemory",
                    "busLocation",
                    "chipName",
                    "uuid",
                )
            ]
            rows = src.fetchall(f"SELECT {', '.join(select)} FROM {t}")
    devices = (
        pd.DataFrame.from_records(
            rows,
            columns=list(DEVICE_COLUMNS),
        )
        if rows
        else pd.DataFrame(columns=list(DEVICE_COLUMNS))
    )
    if "TARGET_INFO_CUDA_GPU" in src.tables and len(devices) and devices["sm_count"].isna().all():
        _fill_from_cuda_gpu(src, devices)
    devices = devices.drop_duplicates("device_id")
    seen = set(np.unique(gpu["device_id"].to_numpy())) if len(gpu) else set()
    missing = sorted(seen - set(devices["device_id"].astype(int)))
    if missing:
        extra = pd.DataFrame({"device_id": missing, "name": [f"GPU {d}" for d in missing]})
        devices = pd.concat([devices, extra], ignore_index=True)
    devices["device_id"] = devices["device_id"].astype(np.int64)
    for c in ("compute_major", "compute_minor", "sm_count", "total_memory"):
        devices[c] = pd.to_numeric(devices[c], errors="coerce").astype("Int64")
    for c in ("name", "bus_location", "chip_name", "uuid"):
        devices[c] = devices[c].astype(object)
    return devices.sort_values("device_id").reset_index(drop=True)


def _fill_from_cuda_gpu(src: SqliteSource, devices: pd.DataFrame) -> None:
    """~2020.5 exports keep SM count and compute capability in TARGET_INFO_CUDA_GPU."""
    cols = src.columns("TARGET_INFO_CUDA_GPU")
    pick = {
        "numMultiprocessors": "sm_count",
        "computeCapabilityMajor": "compute_major",
        "computeCapabilityMinor": "compute_minor",
        "totalGlobalMem": "total_memory",
    }
    have = [c for c in pick if c in cols]
    key = next((k for k in ("cudaId", "deviceId", "id") if k in cols), None)
    if not have or key is None:
        return
    rows = src.fetchall(f"SELECT {key}, {', '.join(have)} FROM TARGET_INFO_CUDA_GPU")
    info = {r[0]: r[1:] for r in rows}
    for i, dev in devices["device_id"].items():
        if dev in info:
            for c, v in zip(have, info[dev]):
                devices.at[i, pick[c]] = v
    log.detail("GPU properties taken from TARGET_INFO_CUDA_GPU (old export layout)")
