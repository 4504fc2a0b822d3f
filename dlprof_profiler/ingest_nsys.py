"""Ingest: an Nsight Systems SQLite export (2020.x to 2026.x) into trace frames.

Every table is optional; names resolve through StringIds; the file is opened read-only and immutable so
it is never modified (DLProf 1.8 modified it in place; we don't).
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

from dlprof_profiler import log
from dlprof_profiler.errors import DLProfError
from dlprof_profiler.sqlite_source import SqliteSource
from dlprof_profiler.trace import (DEFAULT_DOMAIN, GPU_COLUMNS, KIND_KERNEL, KIND_MEMCPY, KIND_MEMSET, Trace,
                                   pid_of, tid_of)

NVTX_RANGE_TYPES = (59, 60, 70, 71)
NVTX_DOMAIN_CREATE = 75

COPY_KIND_LABELS = {
    0: "[CUDA memcpy Unknown]", 1: "[CUDA memcpy HtoD]", 2: "[CUDA memcpy DtoH]", 3: "[CUDA memcpy HtoA]",
    4: "[CUDA memcpy AtoH]", 5: "[CUDA memcpy AtoA]", 6: "[CUDA memcpy AtoD]", 7: "[CUDA memcpy DtoA]",
    8: "[CUDA memcpy DtoD]", 9: "[CUDA memcpy HtoH]", 10: "[CUDA memcpy PtoP]",
    11: "[CUDA Unified Memory memcpy HtoD]", 12: "[CUDA Unified Memory memcpy DtoH]",
    13: "[CUDA Unified Memory memcpy DtoD]",
}
MEMSET_LABEL = "[CUDA memset]"
IO_CALLS = ("read", "write", "fread", "fwrite", "pread", "pread64", "pwrite", "pwrite64", "readv", "writev",
            "preadv", "pwritev", "fread_unlocked", "fwrite_unlocked", "open", "open64", "openat", "close",
            "fopen", "fclose", "fopen64")
KNOWN_NSYS_TABLES = ("StringIds", "NVTX_EVENTS", "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_KERNEL",
                     "TARGET_INFO_GPU", "ThreadNames", "TARGET_INFO_SYSTEM_ENV")


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

    def categorical(self, id_array) -> pd.Categorical:
        return pd.Categorical.from_codes(self._codes_for(id_array), categories=self.categories)

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
            raise DLProfError(f"{path}: not an Nsight Systems export or DLProf database "
                              "(none of the nsys tables StringIds, NVTX_EVENTS, CUPTI_ACTIVITY_KIND_* found)")
        strings = StringTable(src)
        trace = Trace(source=Path(path))
        trace.meta = read_meta(src)
        trace.system = read_system_env(src)
        trace.processes, trace.threads = read_processes_threads(src, strings)
        trace.has_nvtx = src.has("NVTX_EVENTS")
        trace.has_cuda_tables = any(src.has(t) for t in (
            "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY",
            "CUPTI_ACTIVITY_KIND_MEMSET"))
        trace.api_calls = read_api_calls(src, strings)
        trace.gpu = read_gpu_activities(src, strings)
        trace.syncs = read_syncs(src)
        trace.io_calls = read_io_calls(src, strings)
        capture_end = _capture_end(src, trace)
        trace.ranges = read_ranges(src, strings, capture_end)
        trace.devices = read_devices(src, trace.gpu)
        trace.meta["capture_end"] = int(capture_end)
        if not trace.has_cuda_tables:
            trace.warnings.append(f"{path}: no CUDA trace tables (CUPTI_ACTIVITY_KIND_*): the capture holds no "
                                  "CUDA API calls or GPU activities, so every GPU figure is zero")
        elif len(trace.gpu) == 0:
            trace.warnings.append(f"{path}: no GPU activities (kernels, memcpys, memsets) were captured")
        if not trace.has_nvtx or len(trace.ranges) == 0:
            trace.warnings.append(f"{path}: no NVTX ranges: ops cannot be named, every GPU activity is reported "
                                  "under the API call that launched it")
        unclosed = int(trace.ranges["unclosed"].sum()) if len(trace.ranges) else 0
        if unclosed:
            trace.warnings.append(f"{path}: {unclosed} NVTX ranges were never closed; they end at the capture end")
        return trace
    finally:
        src.close()


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
    if src.has("TARGET_INFO_SESSION_START_TIME"):
        row = src.fetchall(f"SELECT {src.col('TARGET_INFO_SESSION_START_TIME', 'utcEpochNs')}, "
                           f"{src.col('TARGET_INFO_SESSION_START_TIME', 'utcTime')} "
                           "FROM TARGET_INFO_SESSION_START_TIME LIMIT 1")
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
        candidates += [v for (v,) in src.fetchall(
            "SELECT value FROM StringIds WHERE value LIKE '%nsight%systems%' LIMIT 50")]
    for text in candidates:
        match = _VERSION_IN_PATH.search(str(text))
        if match:
            return match.group(1)
    return None


def read_system_env(src: SqliteSource) -> dict:
    if not src.has("TARGET_INFO_SYSTEM_ENV"):
        return {}
    env = {}
    for name, value in src.fetchall("SELECT name, value FROM TARGET_INFO_SYSTEM_ENV"):
        env.setdefault(str(name), value)
    return env


def read_processes_threads(src: SqliteSource, strings: StringTable) -> tuple[pd.DataFrame, pd.DataFrame]:
    if src.has("PROCESSES"):
        processes = src.frame("SELECT pid, name FROM PROCESSES", ["pid", "name"])
    else:
        processes = pd.DataFrame({"pid": pd.Series(dtype="int64"), "name": pd.Series(dtype=object)})
    if src.has("ThreadNames"):
        rows = src.fetchall("SELECT globalTid, nameId FROM ThreadNames WHERE globalTid IS NOT NULL")
        gtid = np.array([r[0] for r in rows], dtype=np.int64)
        threads = pd.DataFrame({"global_tid": gtid, "pid": pid_of(gtid), "tid": tid_of(gtid),
                                "name": strings.lookup([r[1] for r in rows])})
        threads = threads.drop_duplicates("global_tid")
    else:
        threads = pd.DataFrame({c: pd.Series(dtype="int64") for c in ("global_tid", "pid", "tid")})
        threads["name"] = pd.Series(dtype=object)
    processes = processes.drop_duplicates("pid").reset_index(drop=True)
    return processes, threads.reset_index(drop=True)


def read_api_calls(src: SqliteSource, strings: StringTable) -> pd.DataFrame:
    table = "CUPTI_ACTIVITY_KIND_RUNTIME"
    columns = ["api_id", "start", "end", "global_tid", "correlation_id", "name_id", "event_class",
               "return_value"]
    if not src.has(table):
        frame = pd.DataFrame({c: pd.Series(dtype="int64") for c in columns})
    else:
        frame = src.frame(
            f"SELECT rowid, start, end, coalesce(globalTid, 0), coalesce(correlationId, -1), nameId, "
            f"coalesce(eventClass, 0), coalesce({src.col(table, 'returnValue', '0')}, 0) "
            f"FROM {table} ORDER BY start", columns)
    frame["pid"] = pid_of(frame["global_tid"])
    frame["name"] = strings.categorical(frame["name_id"])
    frame = frame.drop(columns="name_id").reset_index(drop=True)
    return frame[["api_id", "name", "start", "end", "global_tid", "pid", "correlation_id", "event_class",
                  "return_value"]]


def _int_col(src: SqliteSource, table: str, name: str, default: str = "-1") -> str:
    if name in src.columns(table):
        return f'coalesce("{name}", {default})'
    return default


def read_gpu_activities(src: SqliteSource, strings: StringTable) -> pd.DataFrame:
    """Kernels, memcpys and memsets in one frame (kind column), names as categoricals."""
    parts = []
    kt = "CUPTI_ACTIVITY_KIND_KERNEL"
    if src.has(kt):
        cols = ["start", "end", "deviceId", "streamId", "contextId", "globalPid", "correlationId",
                "shortName", "demangledName", "gridX", "gridY", "gridZ", "blockX", "blockY", "blockZ",
                "registersPerThread", "staticSharedMemory", "dynamicSharedMemory", "graphNodeId"]
        frame = src.frame(
            f"SELECT {', '.join(_int_col(src, kt, c) for c in cols)} FROM {kt}", cols)
        names = strings.categorical(frame["shortName"])
        # Some exporters leave shortName empty where the demangled name is known.
        long_names = strings.categorical(frame["demangledName"])
        part = pd.DataFrame({
            "kind": np.full(len(frame), KIND_KERNEL, dtype=np.int8),
            "name": pd.Series(names).astype(object).where(pd.Series(names).notna(),
                                                          pd.Series(long_names).astype(object)).to_numpy(),
            "long_name": np.asarray(pd.Series(long_names).astype(object)),
            "start": frame["start"], "end": frame["end"], "device_id": frame["deviceId"],
            "stream_id": frame["streamId"], "context_id": frame["contextId"],
            "pid": pid_of(frame["globalPid"]), "correlation_id": frame["correlationId"],
            "grid_x": frame["gridX"], "grid_y": frame["gridY"], "grid_z": frame["gridZ"],
            "block_x": frame["blockX"], "block_y": frame["blockY"], "block_z": frame["blockZ"],
            "registers": frame["registersPerThread"], "static_smem": frame["staticSharedMemory"],
            "dynamic_smem": frame["dynamicSharedMemory"], "bytes": -1, "copy_kind": -1, "src_kind": -1,
            "dst_kind": -1, "graph_node_id": frame["graphNodeId"],
        })
        parts.append(part)
    mt = "CUPTI_ACTIVITY_KIND_MEMCPY"
    if src.has(mt):
        cols = ["start", "end", "deviceId", "streamId", "contextId", "globalPid", "correlationId", "bytes",
                "copyKind", "srcKind", "dstKind", "graphNodeId"]
        frame = src.frame(f"SELECT {', '.join(_int_col(src, mt, c) for c in cols)} FROM {mt}", cols)
        label = frame["copyKind"].map(COPY_KIND_LABELS).fillna("[CUDA memcpy Unknown]")
        parts.append(_memory_part(frame, KIND_MEMCPY, label.to_numpy(dtype=object)))
    st = "CUPTI_ACTIVITY_KIND_MEMSET"
    if src.has(st):
        cols = ["start", "end", "deviceId", "streamId", "contextId", "globalPid", "correlationId", "bytes",
                "memKind", "graphNodeId"]
        frame = src.frame(f"SELECT {', '.join(_int_col(src, st, c) for c in cols)} FROM {st}", cols)
        frame["copyKind"] = -1
        frame["srcKind"] = -1
        frame["dstKind"] = frame["memKind"]
        parts.append(_memory_part(frame, KIND_MEMSET, np.full(len(frame), MEMSET_LABEL, dtype=object)))
    parts = [p for p in parts if len(p)]
    if not parts:
        empty = pd.DataFrame({c: pd.Series(dtype="int64") for c in GPU_COLUMNS})
        empty["name"] = pd.Series(dtype="category")
        empty["long_name"] = pd.Series(dtype="category")
        return empty
    gpu = pd.concat(parts, ignore_index=True)
    gpu = gpu.sort_values("start", kind="stable").reset_index(drop=True)
    gpu["activity_id"] = np.arange(len(gpu), dtype=np.int64)
    gpu["name"] = gpu["name"].fillna("<unknown>").astype("category")
    gpu["long_name"] = gpu["long_name"].fillna(gpu["name"].astype(object)).astype("category")
    for c in GPU_COLUMNS:
        if c not in ("name", "long_name", "kind") and gpu[c].dtype != np.int64:
            gpu[c] = gpu[c].astype(np.int64)
    return gpu[GPU_COLUMNS]


def _memory_part(frame: pd.DataFrame, kind: int, labels: np.ndarray) -> pd.DataFrame:
    n = len(frame)
    return pd.DataFrame({
        "kind": np.full(n, kind, dtype=np.int8), "name": labels, "long_name": labels,
        "start": frame["start"], "end": frame["end"], "device_id": frame["deviceId"],
        "stream_id": frame["streamId"], "context_id": frame["contextId"], "pid": pid_of(frame["globalPid"]),
        "correlation_id": frame["correlationId"], "grid_x": -1, "grid_y": -1, "grid_z": -1, "block_x": -1,
        "block_y": -1, "block_z": -1, "registers": -1, "static_smem": -1, "dynamic_smem": -1,
        "bytes": frame["bytes"], "copy_kind": frame["copyKind"], "src_kind": frame["srcKind"],
        "dst_kind": frame["dstKind"], "graph_node_id": frame["graphNodeId"],
    })


def read_syncs(src: SqliteSource) -> pd.DataFrame:
    t = "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"
    columns = ["start", "end", "device_id", "stream_id", "pid", "correlation_id", "sync_type"]
    if not src.has(t):
        return pd.DataFrame({c: pd.Series(dtype="int64") for c in columns})
    frame = src.frame(f"SELECT start, end, {_int_col(src, t, 'deviceId')}, {_int_col(src, t, 'streamId')}, "
                      f"{_int_col(src, t, 'globalPid', '0')}, {_int_col(src, t, 'correlationId')}, "
                      f"{_int_col(src, t, 'syncType', '0')} FROM {t}", columns)
    frame["pid"] = pid_of(frame["pid"])
    return frame


def read_io_calls(src: SqliteSource, strings: StringTable) -> pd.DataFrame:
    """OS runtime file I/O calls (only when OSRT was traced): the summary's I/O class."""
    t = "OSRT_API"
    columns = ["start", "end", "global_tid", "name_id"]
    if not src.has(t):
        frame = pd.DataFrame({c: pd.Series(dtype="int64") for c in columns})
    else:
        io_ids = [r[0] for r in src.fetchall(
            f"SELECT id FROM StringIds WHERE value IN ({','.join('?' * len(IO_CALLS))})", IO_CALLS)]
        if io_ids:
            frame = src.frame(f"SELECT start, end, coalesce(globalTid, 0), nameId FROM {t} "
                              f"WHERE eventClass = 27 AND nameId IN ({','.join(map(str, io_ids))})", columns)
        else:
            frame = pd.DataFrame({c: pd.Series(dtype="int64") for c in columns})
    frame["pid"] = pid_of(frame["global_tid"])
    frame["name"] = strings.lookup(frame["name_id"])
    return frame.drop(columns="name_id")


def _capture_end(src: SqliteSource, trace: Trace) -> int:
    ends = [0]
    for frame in (trace.api_calls, trace.gpu):
        if len(frame):
            ends.append(int(frame["end"].max()))
    if src.has("NVTX_EVENTS"):
        value = src.query_scalar("SELECT max(coalesce(end, start)) FROM NVTX_EVENTS")
        if value is not None:
            ends.append(int(value))
    stop = trace.meta.get("session_stop")
    latest = max(ends)
    return int(stop) if isinstance(stop, int) and stop >= latest else latest


def read_ranges(src: SqliteSource, strings: StringTable, capture_end: int) -> pd.DataFrame:
    """NVTX push/pop and start/end ranges with resolved text and domain names."""
    t = "NVTX_EVENTS"
    out_cols = ["range_id", "domain", "text", "start", "end", "global_tid", "pid", "event_type", "unclosed"]
    if not src.has(t):
        return _empty_ranges(out_cols)
    text_id = _int_col(src, t, "textId")
    domain_id = _int_col(src, t, "domainId", "0")
    types = ",".join(map(str, NVTX_RANGE_TYPES + (NVTX_DOMAIN_CREATE,)))
    rows = src.fetchall(
        f"SELECT rowid, eventType, start, coalesce(end, -1), coalesce(globalTid, 0), {domain_id}, "
        f"{src.col(t, 'text')}, {text_id} FROM {t} WHERE eventType IN ({types})")
    frame = pd.DataFrame.from_records(rows, columns=["range_id", "event_type", "start", "end", "global_tid",
                                                     "domain_id", "raw_text", "text_id"]) if rows else None
    if frame is None:
        return _empty_ranges(out_cols)
    for c in ("range_id", "event_type", "start", "end", "global_tid", "domain_id", "text_id"):
        frame[c] = frame[c].astype(np.int64)
    registered = strings.lookup(frame["text_id"].to_numpy())
    raw = frame["raw_text"].to_numpy(dtype=object)
    text = np.where(pd.isna(registered), raw, registered)
    frame["text"] = pd.Series(text, index=frame.index).fillna("").astype(object)
    frame["pid"] = pid_of(frame["global_tid"])
    # Domain handles are per process: (pid, domainId) -> name, from the domain-create rows.
    creates = frame[frame["event_type"] == NVTX_DOMAIN_CREATE]
    names = {(int(p), int(d)): str(n) for p, d, n in zip(creates["pid"], creates["domain_id"], creates["text"])}
    frame = frame[frame["event_type"] != NVTX_DOMAIN_CREATE]
    frame["domain"] = _domain_names(frame["pid"].to_numpy(), frame["domain_id"].to_numpy(), names)
    unclosed = frame["end"].to_numpy() < 0
    end = np.where(unclosed, np.maximum(capture_end, frame["start"].to_numpy()), frame["end"].to_numpy())
    frame["end"] = end
    frame["unclosed"] = unclosed
    frame = frame[frame["end"] >= frame["start"]]
    return frame[out_cols].sort_values(["start", "range_id"], kind="stable").reset_index(drop=True)


def _empty_ranges(columns: list[str]) -> pd.DataFrame:
    frame = pd.DataFrame({c: pd.Series(dtype="int64") for c in columns})
    frame["domain"] = pd.Series(dtype=object)
    frame["text"] = pd.Series(dtype=object)
    frame["unclosed"] = pd.Series(dtype=bool)
    return frame


def _domain_names(pids: np.ndarray, domain_ids: np.ndarray, names: dict) -> np.ndarray:
    """Name per range: default domain for id 0, created name, or a synthetic `domain<id>`."""
    keys = pd.MultiIndex.from_arrays([pids, domain_ids])
    unique_keys = keys.unique()
    mapping = {}
    used = {DEFAULT_DOMAIN}
    for pid, did in unique_keys:  # one entry per (process, domain handle), not per range
        if did == 0:
            mapping[(pid, did)] = DEFAULT_DOMAIN
            continue
        name = names.get((pid, did)) or f"domain{did}"
        if name == DEFAULT_DOMAIN:
            name = f"{name} (named)"
        mapping[(pid, did)] = name
        used.add(name)
    codes = keys.map(lambda k: mapping[k]) if len(unique_keys) else pd.Index([], dtype=object)
    return np.asarray(codes, dtype=object)


def read_devices(src: SqliteSource, gpu: pd.DataFrame) -> pd.DataFrame:
    """Every GPU listed in the export plus any device that ran work but is not listed."""
    rows = []
    t = "TARGET_INFO_GPU"
    if src.has(t):
        cols = src.columns(t)
        id_col = "id" if "id" in cols else ("deviceId" if "deviceId" in cols else None)
        if id_col:
            select = [f'"{id_col}"'] + [src.col(t, c) for c in ("name", "computeMajor", "computeMinor", "smCount",
                                                                 "totalMemory", "busLocation", "chipName", "uuid")]
            rows = src.fetchall(f"SELECT {', '.join(select)} FROM {t}")
    devices = pd.DataFrame.from_records(rows, columns=["device_id", "name", "compute_major", "compute_minor",
                                                        "sm_count", "total_memory", "bus_location", "chip_name",
                                                        "uuid"]) if rows else pd.DataFrame(
        columns=["device_id", "name", "compute_major", "compute_minor", "sm_count", "total_memory",
                 "bus_location", "chip_name", "uuid"])
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
    pick = {"numMultiprocessors": "sm_count", "computeCapabilityMajor": "compute_major",
            "computeCapabilityMinor": "compute_minor", "totalGlobalMem": "total_memory"}
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
