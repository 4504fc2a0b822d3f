"""A DLProf database of schema 2.0 (what dlprof wrote before schema 3.0), built in tests: the 2.0 layout
(names as text on every row, no rank) filled from the engine's frames with plain sqlite3 inserts, so the
readers of old databases (engine and viewer) are tested without keeping an old binary file."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import numpy as np
import pandas as pd

SCHEMA_2_0 = """
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
"""
INDEXES_2_0 = """
CREATE INDEX idx_instances_op ON read_only_op_instances(domain_id, op_index, start);
CREATE INDEX idx_instances_start ON read_only_op_instances(domain_id, start);
CREATE INDEX idx_owner_instance ON read_only_activity_owners(domain_id, instance_id);
CREATE INDEX idx_owner_launch ON read_only_activity_owners(domain_id, launch_time);
"""


def _values(frame: pd.DataFrame, columns: list[str]) -> list[tuple]:
    out = []
    for row in frame[columns].astype(object).itertuples(index=False):
        out.append(
            tuple(
                None
                if (v is None or (isinstance(v, float) and np.isnan(v)) or v is pd.NA)
                else (int(v) if isinstance(v, (bool, np.bool_, np.integer)) else v)
                for v in row
            )
        )
    return out


def write_v2_database(path: Path, trace, corr, primary: str, profile: dict) -> dict:
    """The raw tables of a 2.0 database for an analysed trace; returns {domain: domain_id} (op_index offsets
    are the domains' op counts before them, as 2.0 numbered them). Aggregations are appended by the caller."""
    from dlprof_profiler.db.writer import launch_times

    con = sqlite3.connect(path)
    con.executescript(SCHEMA_2_0)
    domain_ids = {name: i for i, name in enumerate(corr.domains)}

    def ins(table: str, rows: list, n: int) -> None:
        con.executemany(f"INSERT INTO {table} VALUES ({', '.join('?' * n)})", rows)

    ins("db_version", [("2.0.0", "2.0.0", "dlprof 2.0.0")], 3)
    ins(
        "profile_info",
        [
            (k, v if isinstance(v, str) or v is None else json.dumps(v))
            for k, v in {**profile, "primary_domain": primary}.items()
        ],
        2,
    )
    system = {**trace.system, **{f"nsys:{k}": v for k, v in trace.meta.items()}}
    ins("read_only_system_config", [(str(k), None if v is None else str(v)) for k, v in system.items()], 2)
    ins("read_only_model_config", [(k, json.dumps(v)) for k, v in corr.config.items()], 2)
    ins("read_only_gpu_infos", _values(trace.devices, list(trace.devices.columns)), 9)
    ins("read_only_processes", _values(trace.processes, ["pid", "name"]), 2)
    ins("read_only_threads", _values(trace.threads, ["global_tid", "pid", "tid", "name"]), 4)
    ins(
        "read_only_domains",
        [
            (i, n, corr.family, int(corr.domains[n].has_markers), int(corr.domains[n].n_ranges), int(n == primary))
            for n, i in domain_ids.items()
        ],
        6,
    )
    r = trace.ranges.assign(domain_id=trace.ranges["domain"].map(domain_ids).fillna(-1).astype(int))
    ins(
        "read_only_ranges",
        _values(r, ["range_id", "domain_id", "text", "start", "end", "global_tid", "pid", "event_type", "unclosed"]),
        9,
    )
    ins(
        "read_only_cuda_calls",
        _values(
            trace.api_calls,
            ["api_id", "name", "start", "end", "global_tid", "pid", "correlation_id", "event_class", "return_value"],
        ),
        9,
    )
    gpu_columns = list(trace.gpu.columns)
    ins("read_only_gpu_activities", _values(trace.gpu, gpu_columns), len(gpu_columns))
    pairs = pd.DataFrame(
        {
            "name": trace.gpu["name"].astype(object),
            "long_name": trace.gpu["long_name"].astype(object),
            "uses_tc": corr.uses_tc.astype(int),
            "tc_rule": corr.tc_rule,
        }
    ).drop_duplicates(["name", "long_name"])
    ins("read_only_kernel_tc", _values(pairs, ["name", "long_name", "uses_tc", "tc_rule"]), 4)
    ins("read_only_cuda_syncs", _values(trace.syncs, list(trace.syncs.columns)), 7)
    ins("read_only_io_calls", _values(trace.io_calls, ["start", "end", "global_tid", "pid", "name"]), 5)
    labels = corr.range_labels
    if labels is not None and len(labels):
        ins(
            "read_only_range_labels",
            _values(
                labels.assign(domain_id=labels["domain"].map(domain_ids)), ["domain_id", "label", "kind", "num_ranges"]
            ),
            4,
        )
    launch = launch_times(trace, corr.gpu_api)
    offset = 0
    for name, dm in corr.domains.items():
        did = domain_ids[name]
        ops = dm.ops.assign(domain_id=did, op_index=dm.ops["op_index"] + offset)
        ins(
            "read_only_ops",
            _values(
                ops,
                [
                    "op_index",
                    "domain_id",
                    "op_id",
                    "name",
                    "direction",
                    "op_type",
                    "label",
                    "tc_eligible",
                    "data_type",
                    "stack_trace",
                    "device_id",
                    "first_start",
                    "n_instances",
                    "kind",
                ],
            ),
            14,
        )
        inst = dm.instances
        source = np.where(
            inst["range_id"] >= 0, inst["range_id"], np.where(inst["api_id"] >= 0, inst["api_id"], inst["activity_id"])
        )
        rows = inst.assign(domain_id=did, source_id=source, op_index=inst["op_index"] + offset)
        ins(
            "read_only_op_instances",
            _values(
                rows,
                [
                    "domain_id",
                    "instance_id",
                    "op_index",
                    "kind",
                    "source_id",
                    "start",
                    "end",
                    "pid",
                    "global_tid",
                    "device_id",
                    "cpu_overhead",
                    "gpu_time",
                    "gpu_start",
                    "gpu_end",
                    "n_gpu",
                    "n_kernels",
                ],
            ),
            16,
        )
        details = rows[
            rows[["data_type", "input_shapes", "output_shapes", "parameters", "stack_trace"]].notna().any(axis=1)
        ]
        ins(
            "read_only_op_instance_details",
            _values(
                details,
                ["domain_id", "instance_id", "data_type", "input_shapes", "output_shapes", "parameters", "stack_trace"],
            ),
            7,
        )
        owners = pd.DataFrame(
            {
                "domain_id": did,
                "activity_id": np.arange(len(dm.gpu_instance)),
                "instance_id": dm.gpu_instance,
                "launch_time": launch,
            }
        )
        ins("read_only_activity_owners", _values(owners, ["domain_id", "activity_id", "instance_id", "launch_time"]), 4)
        offset += len(dm.ops)
    con.executescript(INDEXES_2_0)
    con.commit()
    con.close()
    return domain_ids
