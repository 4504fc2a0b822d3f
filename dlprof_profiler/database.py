"""The DLProf database: a versioned relational SQLite file.

Raw facts (`read_only_*`: GPU activities, API calls, NVTX ranges, op instances and ops per domain) are
stored once, so any re-aggregation needs only this file. Every derived table carries `aggr_id` and
`domain_id`; a re-aggregation appends an `aggregations` row and its rows and keeps the earlier ones.
"""
from __future__ import annotations

import getpass
import json
import re
import socket
import sqlite3
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd

from dlprof_profiler import DB_SCHEMA_VERSION, __version__
from dlprof_profiler.aggregate import CLASSES, Aggregation
from dlprof_profiler.correlate import Correlation, DomainModel
from dlprof_profiler.errors import DLProfError
from dlprof_profiler.trace import GPU_COLUMNS, Trace

SCHEMA = """
CREATE TABLE db_version (current_version TEXT NOT NULL, original_version TEXT NOT NULL, created_by TEXT);
CREATE TABLE profile_info (name TEXT PRIMARY KEY, value TEXT);
CREATE TABLE read_only_system_config (name TEXT PRIMARY KEY, value TEXT);
CREATE TABLE read_only_model_config (name TEXT PRIMARY KEY, value TEXT);
CREATE TABLE read_only_gpu_infos (device_id INTEGER PRIMARY KEY, name TEXT, compute_major INTEGER,
    compute_minor INTEGER, sm_count INTEGER, total_memory INTEGER, bus_location TEXT, chip_name TEXT, uuid TEXT);
CREATE TABLE read_only_processes (pid INTEGER PRIMARY KEY, name TEXT);
CREATE TABLE read_only_threads (global_tid INTEGER PRIMARY KEY, pid INTEGER, tid INTEGER, name TEXT);
CREATE TABLE read_only_domains (domain_id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE, family TEXT,
    has_markers INTEGER, num_ranges INTEGER, is_primary INTEGER);
CREATE TABLE read_only_ranges (range_id INTEGER PRIMARY KEY, domain_id INTEGER, text TEXT, start INTEGER,
    "end" INTEGER, global_tid INTEGER, pid INTEGER, event_type INTEGER, unclosed INTEGER);
CREATE TABLE read_only_cuda_calls (api_id INTEGER PRIMARY KEY, name TEXT, start INTEGER, "end" INTEGER,
    global_tid INTEGER, pid INTEGER, correlation_id INTEGER, event_class INTEGER, return_value INTEGER);
CREATE TABLE read_only_gpu_activities (activity_id INTEGER PRIMARY KEY, kind INTEGER, name TEXT, long_name TEXT,
    start INTEGER, "end" INTEGER, device_id INTEGER, stream_id INTEGER, context_id INTEGER, pid INTEGER,
    correlation_id INTEGER, grid_x INTEGER, grid_y INTEGER, grid_z INTEGER, block_x INTEGER, block_y INTEGER,
    block_z INTEGER, registers INTEGER, static_smem INTEGER, dynamic_smem INTEGER, bytes INTEGER,
    copy_kind INTEGER, src_kind INTEGER, dst_kind INTEGER, graph_node_id INTEGER);
CREATE TABLE read_only_kernel_tc (name TEXT, long_name TEXT, uses_tc INTEGER, tc_rule TEXT,
    PRIMARY KEY (name, long_name));
CREATE TABLE read_only_cuda_syncs (start INTEGER, "end" INTEGER, device_id INTEGER, stream_id INTEGER, pid INTEGER,
    correlation_id INTEGER, sync_type INTEGER);
CREATE TABLE read_only_io_calls (start INTEGER, "end" INTEGER, global_tid INTEGER, pid INTEGER, name TEXT);
CREATE TABLE read_only_ops (op_index INTEGER PRIMARY KEY, domain_id INTEGER, op_id TEXT, op_name TEXT,
    direction TEXT, op_type TEXT, label TEXT, tc_eligible INTEGER, data_type TEXT, stack_trace TEXT,
    device_id INTEGER, first_start INTEGER, num_instances INTEGER, kind INTEGER);
CREATE TABLE read_only_op_instances (domain_id INTEGER, instance_id INTEGER, op_index INTEGER, kind INTEGER,
    source_id INTEGER, start INTEGER, "end" INTEGER, pid INTEGER, global_tid INTEGER, device_id INTEGER,
    cpu_overhead INTEGER, gpu_time INTEGER, gpu_start INTEGER, gpu_end INTEGER, n_gpu INTEGER, n_kernels INTEGER,
    PRIMARY KEY (domain_id, instance_id)) WITHOUT ROWID;
CREATE TABLE read_only_op_instance_details (domain_id INTEGER, instance_id INTEGER, data_type TEXT,
    input_shapes TEXT, output_shapes TEXT, parameters TEXT, stack_trace TEXT, PRIMARY KEY (domain_id, instance_id));
CREATE TABLE read_only_range_labels (domain_id INTEGER, label TEXT, kind INTEGER, num_ranges INTEGER);
CREATE TABLE read_only_activity_owners (domain_id INTEGER, activity_id INTEGER, instance_id INTEGER,
    launch_time INTEGER, PRIMARY KEY (domain_id, activity_id)) WITHOUT ROWID;

CREATE TABLE aggregations (aggr_id INTEGER PRIMARY KEY, created_utc TEXT, key_node TEXT, key_source TEXT,
    key_found INTEGER, iter_start INTEGER, iter_stop INTEGER, total_iterations INTEGER, server_user_name TEXT,
    server_host_name TEXT, engine_version TEXT, elapsed_seconds REAL);
CREATE TABLE iteration_list (aggr_id INTEGER, iter_value INTEGER, start_time INTEGER, stop_time INTEGER,
    PRIMARY KEY (aggr_id, iter_value));
CREATE TABLE iteration_summary (aggr_id INTEGER, domain_id INTEGER, iter_value INTEGER, start_time INTEGER,
    stop_time INTEGER, duration INTEGER, aggregated INTEGER, kernels INTEGER, tc_kernels INTEGER,
    kernel_time_per_gpu REAL, tc_kernel_time_per_gpu REAL, tc_time REAL, non_tc_time REAL, memory_time REAL,
    dataloader_time REAL, io_time REAL, cpu_time REAL, other_time REAL, gpu_utilization REAL,
    PRIMARY KEY (aggr_id, domain_id, iter_value));
CREATE TABLE model_summary (aggr_id INTEGER, domain_id INTEGER, wall_time INTEGER, window_start INTEGER,
    window_end INTEGER, tc_utilization REAL, gpu_utilization REAL, tc_duration_pct REAL, non_tc_duration_pct REAL,
    memory_duration_pct REAL, dataloader_duration_pct REAL, io_duration_pct REAL, cpu_duration_pct REAL,
    other_duration_pct REAL, iter_total INTEGER, iter_aggregated INTEGER, iter_start INTEGER, iter_stop INTEGER,
    avg_iteration_time REAL, iteration_time_std_dev REAL, key_node TEXT, key_found INTEGER,
    n_visible_gpus INTEGER,
    ops_all_gpu INTEGER, ops_all_cpu INTEGER, ops_all_count INTEGER,
    ops_tc_gpu INTEGER, ops_tc_cpu INTEGER, ops_tc_count INTEGER,
    ops_eligible_gpu INTEGER, ops_eligible_cpu INTEGER, ops_eligible_count INTEGER,
    ops_other_gpu INTEGER, ops_other_cpu INTEGER, ops_other_count INTEGER,
    kernels_all_gpu INTEGER, kernels_all_cpu INTEGER, kernels_all_count INTEGER,
    kernels_tc_gpu INTEGER, kernels_tc_cpu INTEGER, kernels_tc_count INTEGER,
    kernels_memory_gpu INTEGER, kernels_memory_cpu INTEGER, kernels_memory_count INTEGER,
    kernels_other_gpu INTEGER, kernels_other_cpu INTEGER, kernels_other_count INTEGER,
    PRIMARY KEY (aggr_id, domain_id));
CREATE TABLE device_utilization (aggr_id INTEGER, domain_id INTEGER, device_id INTEGER, gpu_utilization REAL,
    tc_time INTEGER, non_tc_time INTEGER, memory_time INTEGER, dataloader_time INTEGER, io_time INTEGER,
    cpu_time INTEGER, other_time INTEGER, tc_pct REAL, non_tc_pct REAL, memory_pct REAL, dataloader_pct REAL,
    io_pct REAL, cpu_pct REAL, other_pct REAL, PRIMARY KEY (aggr_id, domain_id, device_id));
CREATE TABLE op_nodes (aggr_id INTEGER, domain_id INTEGER, op_index INTEGER, num_calls INTEGER,
    kernel_calls INTEGER, tc_eligible INTEGER, using_tc INTEGER, is_bad_data_type INTEGER, kernel_time INTEGER,
    cpu_total INTEGER, cpu_avg REAL, cpu_min INTEGER, cpu_max INTEGER,
    gpu_total INTEGER, gpu_avg REAL, gpu_min INTEGER, gpu_max INTEGER,
    overhead_total INTEGER, overhead_avg REAL, overhead_min INTEGER, overhead_max INTEGER,
    idle_total INTEGER, idle_avg REAL, idle_min INTEGER, idle_max INTEGER,
    PRIMARY KEY (aggr_id, domain_id, op_index));
CREATE TABLE op_type_metrics (aggr_id INTEGER, domain_id INTEGER, op_type TEXT, num_ops INTEGER,
    num_calls INTEGER,
    cpu_total INTEGER, cpu_avg REAL, cpu_min INTEGER, cpu_max INTEGER,
    gpu_total INTEGER, gpu_avg REAL, gpu_min INTEGER, gpu_max INTEGER,
    overhead_total INTEGER, overhead_avg REAL, overhead_min INTEGER, overhead_max INTEGER,
    idle_total INTEGER, idle_avg REAL, idle_min INTEGER, idle_max INTEGER);
CREATE TABLE kernel_summaries (aggr_id INTEGER, domain_id INTEGER, kernel_name TEXT, long_name TEXT,
    op_index INTEGER, uses_tc INTEGER, num_calls INTEGER, first_start INTEGER,
    gpu_total INTEGER, gpu_avg REAL, gpu_min INTEGER, gpu_max INTEGER,
    api_total INTEGER, api_avg REAL, api_min INTEGER, api_max INTEGER);
CREATE TABLE tensor_core_summary (aggr_id INTEGER, domain_id INTEGER, op_index INTEGER, total_gpu_time INTEGER,
    tc_gpu_time INTEGER, non_tc_gpu_time INTEGER, tc_utilization REAL, total_kernel_count INTEGER,
    tc_kernel_count INTEGER, tc_kernel_names TEXT, non_tc_kernel_count INTEGER, non_tc_kernel_names TEXT);
CREATE TABLE group_ops (aggr_id INTEGER, domain_id INTEGER, name TEXT, level INTEGER, num_calls INTEGER,
    num_ops INTEGER, num_tc_eligible INTEGER, num_using_tc INTEGER,
    cpu_total INTEGER, cpu_avg REAL, cpu_min INTEGER, cpu_max INTEGER,
    gpu_total INTEGER, gpu_avg REAL, gpu_min INTEGER, gpu_max INTEGER,
    overhead_total INTEGER, overhead_avg REAL, overhead_min INTEGER, overhead_max INTEGER,
    idle_total INTEGER, idle_avg REAL, idle_min INTEGER, idle_max INTEGER);
CREATE TABLE expert_systems_feedback (id INTEGER PRIMARY KEY, aggr_id INTEGER, domain_id INTEGER,
    exp_sys_id TEXT, severity TEXT, problem TEXT, recommendation TEXT, link TEXT, action TEXT, data TEXT);

CREATE INDEX idx_op_nodes_gpu ON op_nodes(aggr_id, domain_id, gpu_total);
CREATE INDEX idx_kernel_summaries ON kernel_summaries(aggr_id, domain_id, op_index);
CREATE INDEX idx_group_ops ON group_ops(aggr_id, domain_id, level, name);

CREATE VIEW view_aggregations AS SELECT * FROM aggregations;
CREATE VIEW view_domains AS SELECT * FROM read_only_domains;
CREATE VIEW view_gpu_devices AS SELECT * FROM read_only_gpu_infos;
CREATE VIEW view_system_config AS SELECT * FROM read_only_system_config;
CREATE VIEW view_op_nodes AS
    SELECT n.aggr_id, n.domain_id, o.op_index, o.op_id, o.op_name, o.direction, o.op_type, o.tc_eligible,
           n.using_tc, n.is_bad_data_type, o.data_type, o.stack_trace, o.device_id, n.num_calls, n.kernel_calls,
           n.kernel_time, n.cpu_total, n.cpu_avg, n.cpu_min, n.cpu_max, n.gpu_total, n.gpu_avg, n.gpu_min,
           n.gpu_max, n.overhead_total, n.overhead_avg, n.overhead_min, n.overhead_max, n.idle_total, n.idle_avg,
           n.idle_min, n.idle_max, o.first_start
    FROM op_nodes n JOIN read_only_ops o ON o.op_index = n.op_index;
CREATE VIEW view_kernel_summaries AS
    SELECT k.*, o.op_id, o.op_name, o.direction, o.op_type
    FROM kernel_summaries k JOIN read_only_ops o ON o.op_index = k.op_index;
CREATE VIEW view_tensor_core_summary AS
    SELECT t.*, o.op_id, o.op_name, o.direction, o.op_type
    FROM tensor_core_summary t JOIN read_only_ops o ON o.op_index = t.op_index;
CREATE VIEW view_performance_summary AS SELECT * FROM model_summary;
CREATE VIEW view_expert_systems AS SELECT * FROM expert_systems_feedback;
"""

PRIMARY_REPORT_ORDER = ("default",)


# ---------------------------------------------------------------------------- writing

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


def _insert(con: sqlite3.Connection, table: str, frame: pd.DataFrame, columns: list[str],
            names: list[str] | None = None) -> None:
    if len(frame) == 0:
        return
    names = names or columns
    quoted = ", ".join(f'"{n}"' for n in names)
    con.executemany(f'INSERT INTO {table} ({quoted}) VALUES ({", ".join("?" * len(names))})',
                    _rows(frame, columns))


OPTIONAL_TABLES = {"read_only_range_labels"}   # databases written before it existed still load

RAW_INDEXES = """
CREATE INDEX idx_instances_op ON read_only_op_instances(domain_id, op_index, start);
CREATE INDEX idx_instances_start ON read_only_op_instances(domain_id, start);
CREATE INDEX idx_owner_instance ON read_only_activity_owners(domain_id, instance_id);
CREATE INDEX idx_owner_launch ON read_only_activity_owners(domain_id, launch_time);
"""
INSTANCE_COLUMNS = ["domain_id", "instance_id", "op_index", "kind", "source_id", "start", "end", "pid", "global_tid",
                    "device_id", "cpu_overhead", "gpu_time", "gpu_start", "gpu_end", "n_gpu", "n_kernels"]
DETAIL_COLUMNS = ["data_type", "input_shapes", "output_shapes", "parameters", "stack_trace"]


class DatabaseWriter:
    """Writes a new DLProf database. The raw tables are copied from the nsys export inside SQLite on a
    background thread (sqlite3 releases the GIL while it works), so the copy overlaps correlation and
    aggregation on the other core; `finish` then writes the op model and waits for nothing else."""

    def __init__(self, path: Path, trace: Trace, domain_ids: dict):
        self.path = Path(path)
        self.trace = trace
        self.domain_ids = domain_ids
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._copy_raw, name="dlprof-raw-copy", daemon=True)

    def start(self) -> "DatabaseWriter":
        self._thread.start()
        return self

    def _copy_raw(self) -> None:
        from dlprof_profiler import export_copy
        from dlprof_profiler.sqlite_source import SqliteSource
        trace = self.trace
        try:
            con = sqlite3.connect(self.path)
            src = SqliteSource(trace.source, immutable=True)
            try:
                con.execute("PRAGMA journal_mode=OFF")
                con.execute("PRAGMA synchronous=OFF")
                con.executescript(SCHEMA)
                export_copy.attach(con, trace.source)
                con.execute("BEGIN")
                con.execute("INSERT INTO db_version VALUES (?, ?, ?)",
                            (DB_SCHEMA_VERSION, DB_SCHEMA_VERSION, f"dlprof {__version__}"))
                system = dict(trace.system)
                system.update({f"nsys:{k}": v for k, v in trace.meta.items()})
                con.executemany("INSERT INTO read_only_system_config VALUES (?, ?)",
                                [(str(k), _text(v)) for k, v in system.items()])
                _insert(con, "read_only_gpu_infos", trace.devices, list(trace.devices.columns))
                _insert(con, "read_only_processes", trace.processes, ["pid", "name"])
                _insert(con, "read_only_threads", trace.threads, ["global_tid", "pid", "tid", "name"])
                export_copy.copy_ranges(con, src, trace.domain_map, self.domain_ids,
                                        int(trace.meta.get("capture_end", trace.profile_end)))
                export_copy.copy_api_calls(con, src)
                export_copy.copy_gpu_activities(con, src)
                _insert(con, "read_only_cuda_syncs", trace.syncs, list(trace.syncs.columns))
                _insert(con, "read_only_io_calls", trace.io_calls, ["start", "end", "global_tid", "pid", "name"])
                con.execute("COMMIT")
                con.execute("DETACH DATABASE src")
            finally:
                src.close()
                con.close()
        except BaseException as exc:  # re-raised in finish() on the main thread
            self._error = exc

    def wait(self) -> None:
        self._thread.join()
        if self._error is not None:
            if isinstance(self._error, sqlite3.Error):
                raise DLProfError(f"{self.path}: could not write the database ({self._error})") from None
            raise self._error

    def finish(self, corr: Correlation, primary_domain: str, profile: dict) -> dict:
        """Write the op model (ops, op instances, who owns each GPU activity) and the indexes."""
        self.wait()
        trace = self.trace
        con = sqlite3.connect(self.path)
        try:
            con.execute("PRAGMA journal_mode=OFF")
            con.execute("PRAGMA synchronous=OFF")
            con.execute("BEGIN")
            info = {**profile, "primary_domain": primary_domain}
            con.executemany("INSERT INTO profile_info VALUES (?, ?)", [(k, _text(v)) for k, v in info.items()])
            con.executemany("INSERT INTO read_only_model_config VALUES (?, ?)",
                            [(str(k), json.dumps(v)) for k, v in corr.config.items()])
            con.executemany("INSERT INTO read_only_domains VALUES (?, ?, ?, ?, ?, ?)", [
                (i, name, corr.family, int(corr.domains[name].has_markers), int(corr.domains[name].n_ranges),
                 int(name == primary_domain)) for name, i in self.domain_ids.items() if name in corr.domains])
            gpu = trace.gpu
            if len(gpu):
                pairs = pd.DataFrame({"name": gpu["name"].astype(object), "long_name": gpu["long_name"].astype(object),
                                      "uses_tc": corr.uses_tc, "tc_rule": corr.tc_rule}).drop_duplicates(
                    ["name", "long_name"])
                _insert(con, "read_only_kernel_tc", pairs, ["name", "long_name", "uses_tc", "tc_rule"])
            con.execute("COMMIT")
        finally:
            con.close()
        self._write_range_labels(corr)
        launch = launch_times(trace, corr.gpu_api)
        offset = 0
        for name, dm in corr.domains.items():
            _write_domain_model(self.path, self.domain_ids[name], offset, dm, launch)
            offset += len(dm.ops)
        con = sqlite3.connect(self.path)
        try:
            con.executescript(RAW_INDEXES)
        finally:
            con.close()
        return self.domain_ids


    def _write_range_labels(self, corr: Correlation) -> None:
        """Distinct NVTX range labels per domain with their counts (the viewer's key node picker)."""
        labels = corr.range_labels
        if labels is None or len(labels) == 0:
            return
        bulk_insert(self.path, "read_only_range_labels", {
            "domain_id": labels["domain"].map(self.domain_ids).fillna(-1).to_numpy(np.int64),
            "label": labels["label"].to_numpy(dtype=object), "kind": labels["kind"].to_numpy(np.int64),
            "num_ranges": labels["num_ranges"].to_numpy(np.int64)})


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


def _write_domain_model(path: Path, domain_id: int, offset: int, dm: DomainModel, launch: np.ndarray) -> None:
    ops = dm.ops.assign(domain_id=domain_id, op_index=dm.ops["op_index"] + offset)
    con = sqlite3.connect(path)
    try:
        con.execute("BEGIN")
        _insert(con, "read_only_ops", ops, ["op_index", "domain_id", "op_id", "name", "direction", "op_type",
                                            "label", "tc_eligible", "data_type", "stack_trace", "device_id",
                                            "first_start", "n_instances", "kind"],
                ["op_index", "domain_id", "op_id", "op_name", "direction", "op_type", "label", "tc_eligible",
                 "data_type", "stack_trace", "device_id", "first_start", "num_instances", "kind"])
        con.execute("COMMIT")
    finally:
        con.close()
    inst = dm.instances
    n = len(inst)
    source = np.where(inst["range_id"] >= 0, inst["range_id"],
                      np.where(inst["api_id"] >= 0, inst["api_id"], inst["activity_id"]))
    columns = {c: inst[c].to_numpy(np.int64) for c in INSTANCE_COLUMNS if c in inst.columns and c != "op_index"}
    columns.update(domain_id=np.full(n, domain_id, dtype=np.int64), source_id=source.astype(np.int64),
                   op_index=inst["op_index"].to_numpy(np.int64) + offset)
    bulk_insert(path, "read_only_op_instances", {c: columns[c] for c in INSTANCE_COLUMNS})
    has_details = inst[DETAIL_COLUMNS].notna().any(axis=1).to_numpy()
    if has_details.any():
        rows = np.flatnonzero(has_details)
        detail = {"domain_id": np.full(rows.size, domain_id, dtype=np.int64),
                  "instance_id": inst["instance_id"].to_numpy(np.int64)[rows]}
        detail.update({c: inst[c].to_numpy(dtype=object)[rows] for c in DETAIL_COLUMNS})
        bulk_insert(path, "read_only_op_instance_details", detail)
    bulk_insert(path, "read_only_activity_owners", {
        "domain_id": np.full(len(dm.gpu_instance), domain_id, dtype=np.int64),
        "activity_id": np.arange(len(dm.gpu_instance), dtype=np.int64),
        "instance_id": np.asarray(dm.gpu_instance, dtype=np.int64), "launch_time": launch})


def bulk_insert(path: Path, table: str, columns: dict) -> None:
    """Append columns (numpy arrays of equal length) to a table: through ADBC's bulk ingest, in C, when
    the driver is there; else through sqlite3's executemany."""
    n = len(next(iter(columns.values()))) if columns else 0
    if n == 0:
        return
    try:
        import adbc_driver_sqlite.dbapi as adbc
        import pyarrow as pa
    except ImportError:
        adbc = None
    if adbc is not None:
        arrays = {}
        for name, values in columns.items():
            values = np.asarray(values)
            arrays[name] = pa.array(values, type=pa.string(), from_pandas=True) if values.dtype == object \
                else pa.array(values)
        con = adbc.connect(str(path))
        try:
            cursor = con.cursor()
            cursor.adbc_ingest(table, pa.table(arrays), mode="append")
            cursor.close()
            con.commit()
        finally:
            con.close()
        return
    con = sqlite3.connect(path)
    try:
        con.execute("BEGIN")
        _insert(con, table, pd.DataFrame({k: (pd.Series(v, dtype=object) if np.asarray(v).dtype == object else v)
                                          for k, v in columns.items()}, copy=False), list(columns))
        con.execute("COMMIT")
    finally:
        con.close()


def _text(value) -> str | None:
    if value is None:
        return None
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return str(value)


def op_index_offsets(corr: Correlation) -> dict:
    """Database op_index = domain's op_index + the ops of the domains written before it."""
    offsets, offset = {}, 0
    for name, dm in corr.domains.items():
        offsets[name] = offset
        offset += len(dm.ops)
    return offsets


def append_aggregation(path: Path, aggregations: dict, domain_ids: dict, offsets: dict, iterations,
                       findings: dict | None = None, elapsed: float = 0.0) -> int:
    """Add one aggregation (all domains) in one transaction; returns its aggr_id."""
    con = sqlite3.connect(path, timeout=30)
    try:
        con.execute("BEGIN IMMEDIATE")
        first = next(iter(aggregations.values()))
        try:
            user = getpass.getuser()
        except Exception:  # no user name in some containers
            user = ""
        cur = con.execute(
            "INSERT INTO aggregations (created_utc, key_node, key_source, key_found, iter_start, iter_stop, "
            "total_iterations, server_user_name, server_host_name, engine_version, elapsed_seconds) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), first.key_node, first.key_source,
             int(first.key_found), first.iter_start, first.iter_stop, first.total_iterations, user,
             socket.gethostname(), __version__, float(elapsed)))
        aggr_id = cur.lastrowid
        con.executemany("INSERT INTO iteration_list VALUES (?, ?, ?, ?)",
                        [(aggr_id, i, int(s), int(e)) for i, (s, e) in
                         enumerate(zip(iterations.starts, iterations.ends))])
        for name, agg in aggregations.items():
            _write_aggregation(con, aggr_id, domain_ids[name], offsets[name], agg)
            for f in (findings or {}).get(name, []):
                con.execute("INSERT INTO expert_systems_feedback (aggr_id, domain_id, exp_sys_id, severity, problem, "
                            "recommendation, link, action, data) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                            (aggr_id, domain_ids[name], f.get("id"), f.get("severity"), f.get("problem"),
                             f.get("recommendation"), f.get("link"), json.dumps(f.get("action")),
                             json.dumps(f.get("data", {}), default=str)))
        con.execute("COMMIT")
        return aggr_id
    except sqlite3.Error as exc:
        con.rollback()
        raise DLProfError(f"{path}: could not write the aggregation ({exc})") from None
    finally:
        con.close()


_STAT_COLS = [f"{p}_{s}" for p in ("cpu", "gpu", "overhead", "idle") for s in ("total", "avg", "min", "max")]


def _write_aggregation(con, aggr_id: int, domain_id: int, offset: int, agg: Aggregation) -> None:
    it = agg.iterations.assign(aggr_id=aggr_id, domain_id=domain_id)
    _insert(con, "iteration_summary", it,
            ["aggr_id", "domain_id", "iteration", "start", "end", "duration", "aggregated", "kernels", "tc_kernels",
             "kernel_time_per_gpu", "tc_kernel_time_per_gpu"] + [f"{c}_time" for c in CLASSES] + ["gpu_utilization"],
            ["aggr_id", "domain_id", "iter_value", "start_time", "stop_time", "duration", "aggregated", "kernels",
             "tc_kernels", "kernel_time_per_gpu", "tc_kernel_time_per_gpu"] + [f"{c}_time" for c in CLASSES]
            + ["gpu_utilization"])
    s = agg.summary
    row = {"aggr_id": aggr_id, "domain_id": domain_id, "wall_time": s["wall_time"], "window_start": agg.window_start,
           "window_end": agg.window_end, "tc_utilization": s["tc_utilization"],
           "gpu_utilization": s["gpu_utilization"],
           **{f"{c}_duration_pct": s["pct"][c] for c in CLASSES},
           "iter_total": s["total_iterations"], "iter_aggregated": s["aggregated_iterations"],
           "iter_start": s["iter_start"], "iter_stop": s["iter_stop"], "avg_iteration_time": s["avg_iteration_time"],
           "iteration_time_std_dev": s["iteration_std"], "key_node": s["key_node"], "key_found": int(s["key_found"]),
           "n_visible_gpus": s["n_visible_gpus"]}
    for short, key in (("all", "all"), ("tc", "using_tc"), ("eligible", "eligible_not_using"), ("other", "other")):
        r = s["ops"][key]
        row.update({f"ops_{short}_gpu": r["gpu_time"], f"ops_{short}_cpu": r["cpu_time"],
                    f"ops_{short}_count": r["count"]})
    for key in ("all", "tc", "memory", "other"):
        r = s["kernels"][key]
        row.update({f"kernels_{key}_gpu": r["gpu_time"], f"kernels_{key}_cpu": r["cpu_time"],
                    f"kernels_{key}_count": r["count"]})
    con.execute(f"INSERT INTO model_summary ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})",
                [float(v) if isinstance(v, np.floating) else v for v in row.values()])
    dev = agg.devices.assign(aggr_id=aggr_id, domain_id=domain_id)
    _insert(con, "device_utilization", dev, ["aggr_id", "domain_id", "device_id", "gpu_utilization"]
            + [f"{c}_time" for c in CLASSES] + [f"{c}_pct" for c in CLASSES])
    ops = agg.ops.assign(aggr_id=aggr_id, domain_id=domain_id, op_index=agg.ops["op_index"] + offset)
    _insert(con, "op_nodes", ops, ["aggr_id", "domain_id", "op_index", "calls", "kernel_calls", "tc_eligible",
                                   "using_tc", "is_bad_data_type", "kernel_time"] + _STAT_COLS,
            ["aggr_id", "domain_id", "op_index", "num_calls", "kernel_calls", "tc_eligible", "using_tc",
             "is_bad_data_type", "kernel_time"] + _STAT_COLS)
    types = agg.op_types.assign(aggr_id=aggr_id, domain_id=domain_id)
    _insert(con, "op_type_metrics", types, ["aggr_id", "domain_id", "op_type", "n_ops", "calls"] + _STAT_COLS,
            ["aggr_id", "domain_id", "op_type", "num_ops", "num_calls"] + _STAT_COLS)
    if len(agg.kernels):
        k = agg.kernels.assign(aggr_id=aggr_id, domain_id=domain_id, op_index=agg.kernels["op_index"] + offset)
        _insert(con, "kernel_summaries", k,
                ["aggr_id", "domain_id", "name", "long_name", "op_index", "uses_tc", "count", "first_start",
                 "gpu_total", "gpu_avg", "gpu_min", "gpu_max", "api_total", "api_avg", "api_min", "api_max"],
                ["aggr_id", "domain_id", "kernel_name", "long_name", "op_index", "uses_tc", "num_calls",
                 "first_start", "gpu_total", "gpu_avg", "gpu_min", "gpu_max", "api_total", "api_avg", "api_min",
                 "api_max"])
    tc = agg.tensor_core.assign(aggr_id=aggr_id, domain_id=domain_id, op_index=agg.tensor_core["op_index"] + offset)
    if len(tc):
        tc["tc_names"] = tc["tc_kernel_names"].map(json.dumps)
        tc["non_tc_names"] = tc["non_tc_kernel_names"].map(json.dumps)
        _insert(con, "tensor_core_summary", tc,
                ["aggr_id", "domain_id", "op_index", "total_gpu_time", "tc_gpu_time", "non_tc_gpu_time",
                 "tc_utilization", "total_kernel_count", "tc_kernel_count", "tc_names", "non_tc_kernel_count",
                 "non_tc_names"],
                ["aggr_id", "domain_id", "op_index", "total_gpu_time", "tc_gpu_time", "non_tc_gpu_time",
                 "tc_utilization", "total_kernel_count", "tc_kernel_count", "tc_kernel_names", "non_tc_kernel_count",
                 "non_tc_kernel_names"])
    if len(agg.groups):
        g = agg.groups.assign(aggr_id=aggr_id, domain_id=domain_id)
        _insert(con, "group_ops", g, ["aggr_id", "domain_id", "name", "level", "calls", "n_ops", "n_tc_eligible",
                                      "n_using_tc"] + _STAT_COLS,
                ["aggr_id", "domain_id", "name", "level", "num_calls", "num_ops", "num_tc_eligible",
                 "num_using_tc"] + _STAT_COLS)


# ---------------------------------------------------------------------------- reading back

def is_dlprof_database(path: Path) -> bool:
    """Whether an SQLite file is a DLProf database written by this tool."""
    try:
        con = sqlite3.connect(f"{Path(path).resolve().as_uri()}?mode=ro", uri=True)
        try:
            tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            if not {"db_version", "read_only_ops", "read_only_op_instances"} <= tables:
                return False
            row = con.execute("SELECT created_by FROM db_version").fetchone()
            return bool(row and str(row[0]).startswith("dlprof"))
        finally:
            con.close()
    except sqlite3.Error:
        return False


def load_model(path: Path):
    """Rebuild (trace, correlation, profile info, domain ids, op_index offsets) from a DLProf database."""
    from dlprof_profiler.correlate import FAMILY_OF_MODE, launch_links
    from dlprof_profiler.nvtx_markers import classify_ranges
    from dlprof_profiler.sqlite_source import SqliteSource
    src = SqliteSource(path, immutable=False)
    try:
        missing = sorted(set(re.findall(r"CREATE TABLE (\w+)", SCHEMA)) - OPTIONAL_TABLES - src.tables)
        if missing:
            raise DLProfError(f"{path}: damaged DLProf database: table{'s' if len(missing) > 1 else ''} "
                              f"{', '.join(missing)} missing")
        version = src.query_scalar("SELECT current_version FROM db_version")
        if str(version).split(".")[0] != DB_SCHEMA_VERSION.split(".")[0]:
            raise DLProfError(f"{path}: DLProf database schema {version} is not supported by this dlprof "
                              f"(schema {DB_SCHEMA_VERSION})")
        profile = dict(src.fetchall("SELECT name, value FROM profile_info"))
        system_rows = dict(src.fetchall("SELECT name, value FROM read_only_system_config"))
        trace = Trace(source=Path(profile.get("source_file") or path))
        trace.meta = {k[5:]: v for k, v in system_rows.items() if k.startswith("nsys:")}
        trace.system = {k: v for k, v in system_rows.items() if not k.startswith("nsys:")}
        devices = src.frame("SELECT device_id, name, compute_major, compute_minor, sm_count, total_memory, "
                            "bus_location, chip_name, uuid FROM read_only_gpu_infos ORDER BY device_id",
                            ["device_id", "name", "compute_major", "compute_minor", "sm_count", "total_memory",
                             "bus_location", "chip_name", "uuid"])
        for c in ("compute_major", "compute_minor", "sm_count", "total_memory"):
            devices[c] = pd.to_numeric(devices[c], errors="coerce").astype("Int64")
        devices["device_id"] = devices["device_id"].astype(np.int64)
        trace.devices = devices
        trace.processes = src.frame("SELECT pid, name FROM read_only_processes", ["pid", "name"])
        trace.threads = src.frame("SELECT global_tid, pid, tid, name FROM read_only_threads",
                                  ["global_tid", "pid", "tid", "name"])
        domains = src.fetchall("SELECT domain_id, name, family, has_markers, num_ranges FROM read_only_domains "
                               "ORDER BY domain_id")
        id_to_name = {d[0]: d[1] for d in domains}
        rcols = src.int_columns('SELECT range_id, domain_id, start, "end", global_tid, pid, event_type, unclosed '
                                "FROM read_only_ranges ORDER BY start, range_id",
                                ["range_id", "domain_id", "start", "end", "global_tid", "pid", "event_type",
                                 "unclosed"])
        texts = src.arrow_text_column("SELECT text FROM read_only_ranges ORDER BY start, range_id")
        # ranges of domains without an op model (simple mode) carry domain_id -1: the last entry
        domain_names = np.array([id_to_name.get(d, "default") for d in range(max(id_to_name, default=-1) + 1)]
                                + ["other"], dtype=object)
        trace.ranges = pd.DataFrame({
            "range_id": rcols["range_id"], "domain": pd.Series(domain_names[rcols["domain_id"]] if len(texts) else
                                                               np.zeros(0, dtype=object), dtype=object),
            "text": pd.Series(texts, dtype="str"), "start": rcols["start"], "end": rcols["end"],
            "global_tid": rcols["global_tid"], "pid": rcols["pid"], "event_type": rcols["event_type"],
            "unclosed": rcols["unclosed"].astype(bool)})
        mode = profile.get("mode") or "nvtx"
        family = FAMILY_OF_MODE.get(mode)
        families = {family} if family else set()
        range_info = classify_ranges(trace.ranges["text"], trace.ranges["domain"], families)
        acols = src.int_columns('SELECT start, "end", global_tid, pid, correlation_id, event_class, return_value '
                                "FROM read_only_cuda_calls ORDER BY api_id",
                                ["start", "end", "global_tid", "pid", "correlation_id", "event_class",
                                 "return_value"])
        api_names = src.text_column("SELECT name FROM read_only_cuda_calls ORDER BY api_id")
        trace.api_calls = pd.DataFrame({"api_id": np.arange(len(api_names), dtype=np.int64),
                                        "name": pd.Categorical(api_names), **acols})[
            ["api_id", "name", "start", "end", "global_tid", "pid", "correlation_id", "event_class", "return_value"]]
        numeric = [c for c in GPU_COLUMNS if c not in ("name", "long_name")]
        gcols = src.int_columns(f"SELECT {', '.join(chr(34) + c + chr(34) for c in numeric)} "
                                "FROM read_only_gpu_activities ORDER BY activity_id", numeric)
        gpu = pd.DataFrame(gcols)
        gpu["kind"] = gpu["kind"].astype(np.int8)
        gpu["name"] = pd.Categorical(src.text_column("SELECT name FROM read_only_gpu_activities ORDER BY activity_id"))
        gpu["long_name"] = pd.Categorical(src.text_column(
            "SELECT long_name FROM read_only_gpu_activities ORDER BY activity_id"))
        trace.gpu = gpu[GPU_COLUMNS]
        tc = src.frame("SELECT name, long_name, uses_tc, tc_rule FROM read_only_kernel_tc",
                       ["name", "long_name", "uses_tc", "tc_rule"])
        keys = pd.MultiIndex.from_arrays([gpu["name"].astype(object), gpu["long_name"].astype(object)])
        tc_index = pd.MultiIndex.from_arrays([tc["name"].astype(object), tc["long_name"].astype(object)])
        pos = tc_index.get_indexer(keys) if len(tc) else np.full(len(gpu), -1)
        uses_tc = np.where(pos >= 0, tc["uses_tc"].to_numpy()[np.maximum(pos, 0)] if len(tc) else 0, 0).astype(bool)
        tc_rule = np.where(pos >= 0, tc["tc_rule"].to_numpy(dtype=object)[np.maximum(pos, 0)] if len(tc) else "", "")
        trace.syncs = src.frame('SELECT start, "end", device_id, stream_id, pid, correlation_id, sync_type '
                                'FROM read_only_cuda_syncs', ["start", "end", "device_id", "stream_id", "pid",
                                                              "correlation_id", "sync_type"])
        trace.io_calls = src.frame('SELECT start, "end", global_tid, pid, name FROM read_only_io_calls',
                                   ["start", "end", "global_tid", "pid", "name"])
        trace.has_cuda_tables = len(trace.api_calls) > 0 or len(gpu) > 0
        trace.has_nvtx = len(trace.ranges) > 0
        config = {k: json.loads(v) for k, v in src.fetchall("SELECT name, value FROM read_only_model_config")}
        gpu_api, thread_dev, process_dev = launch_links(trace)
        corr = Correlation(gpu_api=gpu_api, uses_tc=uses_tc, tc_rule=tc_rule, range_info=range_info, mode=mode,
                           family=family, thread_device=thread_dev, process_device=process_dev, config=config)
        offsets, domain_ids = {}, {}
        for did, name, fam, has_markers, num_ranges in domains:
            domain_ids[name] = int(did)
            corr.domains[name], offsets[name] = _load_domain(src, int(did), name, fam, has_markers, num_ranges,
                                                             len(gpu))
        return trace, corr, profile, domain_ids, offsets
    finally:
        src.close()


def _load_domain(src, did: int, name: str, family, has_markers, num_ranges, n_gpu: int):
    ops = src.frame("SELECT op_index, op_id, op_name, direction, op_type, label, tc_eligible, data_type, "
                    "stack_trace, device_id, first_start, num_instances, kind FROM read_only_ops "
                    "WHERE domain_id = ? ORDER BY op_index",
                    ["op_index", "op_id", "name", "direction", "op_type", "label", "tc_eligible", "data_type",
                     "stack_trace", "device_id", "first_start", "n_instances", "kind"], (did,))
    offset = int(ops["op_index"].min()) if len(ops) else 0
    ops["op_index"] = ops["op_index"].astype(np.int64) - offset
    ops["domain"] = name
    ops["tc_eligible"] = ops["tc_eligible"].astype(bool)
    ops["direction"] = ops["direction"].fillna("").astype(object)
    numeric = [c for c in INSTANCE_COLUMNS if c != "domain_id"]
    cols = src.int_columns(f"SELECT {', '.join(chr(34) + c + chr(34) for c in numeric)} FROM read_only_op_instances "
                           "WHERE domain_id = ? ORDER BY instance_id", numeric, (did,))
    inst = pd.DataFrame(cols)
    inst["op_index"] -= offset
    kind = inst["kind"].to_numpy()
    from dlprof_profiler.correlate import RANGE_OP, SCOPE_OP, UNASSOCIATED_API, UNASSOCIATED_GPU
    inst["range_id"] = np.where(np.isin(kind, (RANGE_OP, SCOPE_OP)), inst["source_id"], -1)
    inst["api_id"] = np.where(kind == UNASSOCIATED_API, inst["source_id"], -1)
    inst["activity_id"] = np.where(kind == UNASSOCIATED_GPU, inst["source_id"], -1)
    inst["cpu_time"] = np.where(kind == UNASSOCIATED_GPU, 0, inst["end"] - inst["start"])
    inst["gpu_idle"] = np.where(inst["n_gpu"] > 0, inst["gpu_end"] - inst["gpu_start"] - inst["gpu_time"], 0)
    details = src.frame("SELECT instance_id, data_type, input_shapes, output_shapes, parameters, stack_trace "
                        "FROM read_only_op_instance_details WHERE domain_id = ?", ["instance_id"] + DETAIL_COLUMNS,
                        (did,))
    for c in DETAIL_COLUMNS:
        column = np.full(len(inst), None, dtype=object)
        if len(details):
            column[details["instance_id"].to_numpy(np.int64)] = details[c].to_numpy(dtype=object)
        inst[c] = pd.Series(column, dtype=object)
    meta = ops.set_index("op_index")
    inst["domain"] = name
    for c in ("name", "direction", "op_type", "label"):
        inst[c] = pd.Series(inst["op_index"].map(meta[c]).to_numpy(dtype=object), dtype=object)
    owners = src.int_columns("SELECT instance_id FROM read_only_activity_owners WHERE domain_id = ? "
                             "ORDER BY activity_id", ["i"], (did,))["i"]
    model = DomainModel(domain=name, family=family or None, has_markers=bool(has_markers), instances=inst, ops=ops,
                        api_instance=np.zeros(0, dtype=np.int64), gpu_instance=owners, n_ranges=int(num_ranges))
    return model, offset
