"""The DLProf database: a versioned relational SQLite file.

Raw facts (`read_only_*`: GPU activities, API calls, NVTX ranges, op instances and ops per domain) are
stored once, so any re-aggregation needs only this file. Every derived table carries `aggr_id` and
`domain_id`; a re-aggregation appends an `aggregations` row and its rows and keeps the earlier ones.
"""
from __future__ import annotations

import getpass
import json
import socket
import sqlite3
import time
from pathlib import Path

import numpy as np
import pandas as pd

from dlprof_profiler import DB_SCHEMA_VERSION, __version__
from dlprof_profiler.aggregate import CLASSES, Aggregation
from dlprof_profiler.correlate import INSTANCE_KIND_NAMES, Correlation, DomainModel
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
    "end" INTEGER, global_tid INTEGER, pid INTEGER, event_type INTEGER, unclosed INTEGER, kind INTEGER,
    label TEXT, op_type TEXT, dataloader INTEGER);
CREATE TABLE read_only_cuda_calls (api_id INTEGER PRIMARY KEY, name TEXT, start INTEGER, "end" INTEGER,
    global_tid INTEGER, pid INTEGER, correlation_id INTEGER, event_class INTEGER, return_value INTEGER);
CREATE TABLE read_only_gpu_activities (activity_id INTEGER PRIMARY KEY, kind INTEGER, name TEXT, long_name TEXT,
    start INTEGER, "end" INTEGER, device_id INTEGER, stream_id INTEGER, context_id INTEGER, pid INTEGER,
    correlation_id INTEGER, grid_x INTEGER, grid_y INTEGER, grid_z INTEGER, block_x INTEGER, block_y INTEGER,
    block_z INTEGER, registers INTEGER, static_smem INTEGER, dynamic_smem INTEGER, bytes INTEGER,
    copy_kind INTEGER, src_kind INTEGER, dst_kind INTEGER, graph_node_id INTEGER, api_id INTEGER,
    launch_time INTEGER, uses_tc INTEGER, tc_rule TEXT);
CREATE TABLE read_only_cuda_syncs (start INTEGER, "end" INTEGER, device_id INTEGER, stream_id INTEGER, pid INTEGER,
    correlation_id INTEGER, sync_type INTEGER);
CREATE TABLE read_only_io_calls (start INTEGER, "end" INTEGER, global_tid INTEGER, pid INTEGER, name TEXT);
CREATE TABLE read_only_ops (op_index INTEGER PRIMARY KEY, domain_id INTEGER, op_id TEXT, op_name TEXT,
    direction TEXT, op_type TEXT, label TEXT, tc_eligible INTEGER, data_type TEXT, stack_trace TEXT,
    device_id INTEGER, first_start INTEGER, num_instances INTEGER, kind INTEGER);
CREATE TABLE read_only_op_instances (instance_key INTEGER PRIMARY KEY, domain_id INTEGER, instance_id INTEGER,
    op_index INTEGER, kind INTEGER, range_id INTEGER, api_id INTEGER, activity_id INTEGER, start INTEGER,
    "end" INTEGER, pid INTEGER, global_tid INTEGER, device_id INTEGER, cpu_time INTEGER, cpu_overhead INTEGER,
    gpu_time INTEGER, gpu_start INTEGER, gpu_end INTEGER, gpu_idle INTEGER, n_gpu INTEGER, n_kernels INTEGER,
    seq INTEGER, label TEXT, data_type TEXT, input_shapes TEXT, output_shapes TEXT, parameters TEXT,
    stack_trace TEXT);
CREATE TABLE read_only_activity_owners (domain_id INTEGER, activity_id INTEGER, instance_id INTEGER,
    PRIMARY KEY (domain_id, activity_id)) WITHOUT ROWID;
CREATE TABLE read_only_call_owners (domain_id INTEGER, api_id INTEGER, instance_id INTEGER,
    PRIMARY KEY (domain_id, api_id)) WITHOUT ROWID;

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

CREATE INDEX idx_ranges_domain_label ON read_only_ranges(domain_id, label);
CREATE INDEX idx_gpu_launch ON read_only_gpu_activities(launch_time);
CREATE INDEX idx_instances_op ON read_only_op_instances(domain_id, op_index, start);
CREATE INDEX idx_instances_domain_start ON read_only_op_instances(domain_id, start);
CREATE INDEX idx_owner_instance ON read_only_activity_owners(domain_id, instance_id);
CREATE INDEX idx_op_nodes_gpu ON op_nodes(aggr_id, domain_id, gpu_total);
CREATE INDEX idx_kernel_summaries ON kernel_summaries(aggr_id, domain_id, op_index);

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


def create_database(path: Path, trace: Trace, corr: Correlation, primary_domain: str, profile: dict) -> dict:
    """Write the schema and every raw table; returns {domain name: domain_id}."""
    con = sqlite3.connect(path)
    try:
        con.execute("PRAGMA journal_mode=OFF")
        con.execute("PRAGMA synchronous=OFF")
        con.executescript(SCHEMA)
        con.execute("BEGIN")
        con.execute("INSERT INTO db_version VALUES (?, ?, ?)", (DB_SCHEMA_VERSION, DB_SCHEMA_VERSION,
                                                               f"dlprof {__version__}"))
        info = {**{k: v for k, v in profile.items()}, "primary_domain": primary_domain}
        con.executemany("INSERT INTO profile_info VALUES (?, ?)", [(k, _text(v)) for k, v in info.items()])
        system = dict(trace.system)
        system.update({f"nsys:{k}": v for k, v in trace.meta.items()})
        con.executemany("INSERT INTO read_only_system_config VALUES (?, ?)",
                        [(str(k), _text(v)) for k, v in system.items()])
        con.executemany("INSERT INTO read_only_model_config VALUES (?, ?)",
                        [(str(k), json.dumps(v)) for k, v in corr.config.items()])
        _insert(con, "read_only_gpu_infos", trace.devices, list(trace.devices.columns))
        _insert(con, "read_only_processes", trace.processes, ["pid", "name"])
        _insert(con, "read_only_threads", trace.threads, ["global_tid", "pid", "tid", "name"])
        domain_ids = {name: i for i, name in enumerate(corr.domains)}
        ranges = trace.ranges
        counts = ranges["domain"].value_counts() if len(ranges) else pd.Series(dtype="int64")
        con.executemany("INSERT INTO read_only_domains VALUES (?, ?, ?, ?, ?, ?)", [
            (i, name, corr.family, int(dm.has_markers), int(counts.get(name, 0)), int(name == primary_domain))
            for name, i in domain_ids.items() for dm in [corr.domains[name]]])
        if len(ranges):
            info_cols = corr.range_info
            rframe = pd.DataFrame({
                "range_id": ranges["range_id"].to_numpy(), "domain_id": ranges["domain"].map(domain_ids).fillna(-1)
                .astype(np.int64).to_numpy(), "text": ranges["text"].to_numpy(dtype=object),
                "start": ranges["start"].to_numpy(), "end": ranges["end"].to_numpy(),
                "global_tid": ranges["global_tid"].to_numpy(), "pid": ranges["pid"].to_numpy(),
                "event_type": ranges["event_type"].to_numpy(), "unclosed": ranges["unclosed"].to_numpy(),
                "kind": info_cols["kind"].to_numpy().astype(np.int64),
                "label": info_cols["label"].to_numpy(dtype=object),
                "op_type": info_cols["op_type"].to_numpy(dtype=object),
                "dataloader": info_cols["dataloader"].to_numpy()})
            _insert(con, "read_only_ranges", rframe, list(rframe.columns))
        api = trace.api_calls
        _insert(con, "read_only_cuda_calls", api.assign(api_id=np.arange(len(api))),
                ["api_id", "name", "start", "end", "global_tid", "pid", "correlation_id", "event_class",
                 "return_value"])
        gpu = trace.gpu
        if len(gpu):
            launch = gpu["start"].to_numpy(np.int64).copy()
            has = corr.gpu_api >= 0
            launch[has] = api["start"].to_numpy(np.int64)[corr.gpu_api[has]]
            gframe = gpu.assign(api_id=corr.gpu_api, launch_time=launch, uses_tc=corr.uses_tc, tc_rule=corr.tc_rule)
            _insert(con, "read_only_gpu_activities", gframe, GPU_COLUMNS + ["api_id", "launch_time", "uses_tc",
                                                                            "tc_rule"])
        _insert(con, "read_only_cuda_syncs", trace.syncs, list(trace.syncs.columns))
        _insert(con, "read_only_io_calls", trace.io_calls, ["start", "end", "global_tid", "pid", "name"])
        offset = 0
        for name, dm in corr.domains.items():
            did = domain_ids[name]
            ops = dm.ops.assign(domain_id=did, op_index=dm.ops["op_index"] + offset)
            _insert(con, "read_only_ops", ops, ["op_index", "domain_id", "op_id", "name", "direction", "op_type",
                                                "label", "tc_eligible", "data_type", "stack_trace", "device_id",
                                                "first_start", "n_instances", "kind"],
                    ["op_index", "domain_id", "op_id", "op_name", "direction", "op_type", "label", "tc_eligible",
                     "data_type", "stack_trace", "device_id", "first_start", "num_instances", "kind"])
            inst = dm.instances.assign(domain_id=did, op_index=dm.instances["op_index"] + offset)
            icols = ["domain_id", "instance_id", "op_index", "kind", "range_id", "api_id", "activity_id", "start",
                     "end", "pid", "global_tid", "device_id", "cpu_time", "cpu_overhead", "gpu_time", "gpu_start",
                     "gpu_end", "gpu_idle", "n_gpu", "n_kernels", "seq", "label", "data_type", "input_shapes",
                     "output_shapes", "parameters", "stack_trace"]
            _insert(con, "read_only_op_instances", inst, icols)
            owners = pd.DataFrame({"domain_id": did, "activity_id": np.arange(len(dm.gpu_instance)),
                                   "instance_id": dm.gpu_instance})
            _insert(con, "read_only_activity_owners", owners, list(owners.columns))
            calls = pd.DataFrame({"domain_id": did, "api_id": np.arange(len(dm.api_instance)),
                                  "instance_id": dm.api_instance})
            _insert(con, "read_only_call_owners", calls, list(calls.columns))
            offset += len(dm.ops)
        con.execute("COMMIT")
        return domain_ids
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
    """Rebuild (trace, correlation, profile info, domain ids, offsets) from a DLProf database."""
    from dlprof_profiler.sqlite_source import SqliteSource
    src = SqliteSource(path, immutable=False)
    try:
        version = src.query_scalar("SELECT current_version FROM db_version")
        if str(version).split(".")[0] != DB_SCHEMA_VERSION.split(".")[0]:
            raise DLProfError(f"{path}: DLProf database schema {version} is not supported by this dlprof "
                              f"(schema {DB_SCHEMA_VERSION})")
        profile = dict(src.fetchall("SELECT name, value FROM profile_info"))
        system_rows = dict(src.fetchall("SELECT name, value FROM read_only_system_config"))
        trace = Trace(source=Path(profile.get("source_file", str(path))))
        trace.meta = {k[5:]: v for k, v in system_rows.items() if k.startswith("nsys:")}
        trace.system = {k: v for k, v in system_rows.items() if not k.startswith("nsys:")}
        devices = src.frame("SELECT device_id, name, compute_major, compute_minor, sm_count, total_memory, "
                            "bus_location, chip_name, uuid FROM read_only_gpu_infos ORDER BY device_id",
                            ["device_id", "name", "compute_major", "compute_minor", "sm_count", "total_memory",
                             "bus_location", "chip_name", "uuid"])
        for c in ("compute_major", "compute_minor", "sm_count", "total_memory"):
            devices[c] = pd.to_numeric(devices[c], errors="coerce").astype("Int64")
        trace.devices = devices
        trace.processes = src.frame("SELECT pid, name FROM read_only_processes", ["pid", "name"])
        trace.threads = src.frame("SELECT global_tid, pid, tid, name FROM read_only_threads",
                                  ["global_tid", "pid", "tid", "name"])
        domains = src.frame("SELECT domain_id, name, family, has_markers, num_ranges FROM read_only_domains "
                            "ORDER BY domain_id", ["domain_id", "name", "family", "has_markers", "num_ranges"])
        id_to_name = dict(zip(domains["domain_id"], domains["name"]))
        ranges = src.frame('SELECT range_id, domain_id, text, start, "end", global_tid, pid, event_type, unclosed, '
                           'kind, label, op_type, dataloader FROM read_only_ranges ORDER BY start, range_id',
                           ["range_id", "domain_id", "text", "start", "end", "global_tid", "pid", "event_type",
                            "unclosed", "kind", "label", "op_type", "dataloader"])
        ranges["domain"] = ranges["domain_id"].map(id_to_name).astype(object)
        ranges["unclosed"] = ranges["unclosed"].astype(bool)
        trace.ranges = ranges[["range_id", "domain", "text", "start", "end", "global_tid", "pid", "event_type",
                               "unclosed"]].copy()
        range_info = pd.DataFrame({"kind": ranges["kind"].astype(np.int8), "label": ranges["label"].astype(object),
                                   "op_type": ranges["op_type"].astype(object),
                                   "dataloader": ranges["dataloader"].astype(bool)})
        api = src.frame('SELECT api_id, name, start, "end", global_tid, pid, correlation_id, event_class, '
                        'return_value FROM read_only_cuda_calls ORDER BY api_id',
                        ["api_id", "name", "start", "end", "global_tid", "pid", "correlation_id", "event_class",
                         "return_value"])
        api["name"] = api["name"].astype("category")
        trace.api_calls = api
        gcols = GPU_COLUMNS + ["api_id", "uses_tc", "tc_rule"]
        gpu = src.frame(f"SELECT {', '.join(chr(34) + c + chr(34) for c in gcols)} FROM read_only_gpu_activities "
                        "ORDER BY activity_id", gcols)
        gpu["kind"] = gpu["kind"].astype(np.int8)
        gpu_api = gpu["api_id"].to_numpy(np.int64) if len(gpu) else np.zeros(0, np.int64)
        uses_tc = gpu["uses_tc"].to_numpy().astype(bool) if len(gpu) else np.zeros(0, bool)
        tc_rule = gpu["tc_rule"].to_numpy(dtype=object) if len(gpu) else np.zeros(0, object)
        gpu = gpu[GPU_COLUMNS].copy()
        gpu["name"] = gpu["name"].astype("category")
        gpu["long_name"] = gpu["long_name"].astype("category")
        trace.gpu = gpu
        trace.syncs = src.frame('SELECT start, "end", device_id, stream_id, pid, correlation_id, sync_type '
                                'FROM read_only_cuda_syncs', ["start", "end", "device_id", "stream_id", "pid",
                                                              "correlation_id", "sync_type"])
        trace.io_calls = src.frame('SELECT start, "end", global_tid, pid, name FROM read_only_io_calls',
                                   ["start", "end", "global_tid", "pid", "name"])
        trace.has_cuda_tables = len(api) > 0 or len(gpu) > 0
        trace.has_nvtx = len(ranges) > 0
        config = {k: json.loads(v) for k, v in src.fetchall("SELECT name, value FROM read_only_model_config")}
        from dlprof_profiler.correlate import link_gpu_to_api, work_devices  # noqa: F401 (same rule as ingest)
        thread_dev, process_dev = work_devices(trace, gpu_api)
        corr = Correlation(gpu_api=gpu_api, uses_tc=uses_tc, tc_rule=tc_rule, range_info=range_info,
                           mode=profile.get("mode", "nvtx"), family=profile.get("family") or None,
                           thread_device=thread_dev, process_device=process_dev, config=config)
        offsets = {}
        domain_ids = {}
        for did, name, family, has_markers, num_ranges in domains.itertuples(index=False):
            domain_ids[name] = int(did)
            ops = src.frame("SELECT op_index, op_id, op_name, direction, op_type, label, tc_eligible, data_type, "
                            "stack_trace, device_id, first_start, num_instances, kind FROM read_only_ops "
                            "WHERE domain_id = ? ORDER BY op_index",
                            ["op_index", "op_id", "name", "direction", "op_type", "label", "tc_eligible",
                             "data_type", "stack_trace", "device_id", "first_start", "n_instances", "kind"], (did,))
            offset = int(ops["op_index"].min()) if len(ops) else 0
            offsets[name] = offset
            ops["op_index"] = ops["op_index"] - offset
            ops["domain"] = name
            ops["tc_eligible"] = ops["tc_eligible"].astype(bool)
            ops["direction"] = ops["direction"].fillna("").astype(object)
            icols = ["instance_id", "op_index", "kind", "range_id", "api_id", "activity_id", "start", "end", "pid",
                     "global_tid", "device_id", "cpu_time", "cpu_overhead", "gpu_time", "gpu_start", "gpu_end",
                     "gpu_idle", "n_gpu", "n_kernels", "seq", "label", "data_type", "input_shapes", "output_shapes",
                     "parameters", "stack_trace"]
            inst = src.frame(f"SELECT {', '.join(chr(34) + c + chr(34) for c in icols)} FROM read_only_op_instances "
                             "WHERE domain_id = ? ORDER BY instance_id", icols, (did,))
            inst["op_index"] = inst["op_index"] - offset
            inst["domain"] = name
            meta = ops.set_index("op_index")
            inst["name"] = inst["op_index"].map(meta["name"]).astype(object)
            inst["direction"] = inst["op_index"].map(meta["direction"]).astype(object)
            inst["op_type"] = inst["op_index"].map(meta["op_type"]).astype(object)
            gpu_instance = src.frame("SELECT instance_id FROM read_only_activity_owners WHERE domain_id = ? "
                                     "ORDER BY activity_id", ["i"], (did,))["i"].to_numpy(np.int64)
            api_instance = src.frame("SELECT instance_id FROM read_only_call_owners WHERE domain_id = ? "
                                     "ORDER BY api_id", ["i"], (did,))["i"].to_numpy(np.int64)
            corr.domains[name] = DomainModel(domain=name, family=family or None, has_markers=bool(has_markers),
                                             instances=inst, ops=ops, api_instance=api_instance,
                                             gpu_instance=gpu_instance, n_ranges=int(num_ranges))
        return trace, corr, profile, domain_ids, offsets
    finally:
        src.close()


def instance_kind_name(kind: int) -> str:
    return INSTANCE_KIND_NAMES.get(int(kind), "op")
