"""The DLProf database's schema 3.0: raw tables (integer name ids into `strings`, small thread and process
ids, durations instead of end times, a `rank` in every table), the derived (aggregation) tables, the views
that give the raw tables schema 2.0's readable layout, and the secondary indexes the viewer's queries use.

docs/DESIGN.md ("Outputs") says why each column is there.
"""

from __future__ import annotations

from dlprof_profiler import contract as K

# Raw tables. The large ones are keyed by database-wide integers (contract.ID_BITS): API calls and GPU
# activities by (rank << 40) | id, op instances and activity owners by (domain_id << 40) | id, a domain_id
# numbering one NVTX domain of one rank (so every key includes the rank). Tables the viewer never looks up
# by key (syncs, I/O calls, range labels) are plain rowid tables filled in append order; the NVTX ranges, read
# only all at once by a re-analysis, are compressed Arrow blocks (db/range_blocks.py).
RAW_TABLES = f"""
CREATE TABLE db_version (current_version TEXT NOT NULL, original_version TEXT NOT NULL, created_by TEXT);
CREATE TABLE profile_info (name TEXT PRIMARY KEY, value TEXT);
CREATE TABLE {K.STRINGS} (id INTEGER PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE {K.RANKS} (rank INTEGER PRIMARY KEY, source_file TEXT, source_kind TEXT, host_name TEXT,
    nsys_version TEXT, capture_end INTEGER, profile_end INTEGER);
CREATE TABLE {K.RAW_SYSTEM_CONFIG} (rank INTEGER NOT NULL, name TEXT NOT NULL, value TEXT,
    PRIMARY KEY (rank, name));
CREATE TABLE {K.RAW_MODEL_CONFIG} (rank INTEGER NOT NULL, name TEXT NOT NULL, value TEXT, PRIMARY KEY (rank, name));
CREATE TABLE {K.RAW_GPU_INFOS} (rank INTEGER NOT NULL, device_id INTEGER NOT NULL, name TEXT, compute_major INTEGER,
    compute_minor INTEGER, sm_count INTEGER, total_memory INTEGER, bus_location TEXT, chip_name TEXT, uuid TEXT,
    PRIMARY KEY (rank, device_id));
CREATE TABLE {K.RAW_PROCESSES} (rank INTEGER NOT NULL, process_id INTEGER NOT NULL, pid INTEGER NOT NULL,
    name_id INTEGER, PRIMARY KEY (rank, process_id));
CREATE TABLE {K.RAW_THREADS} (rank INTEGER NOT NULL, thread_id INTEGER NOT NULL, global_tid INTEGER NOT NULL,
    pid INTEGER NOT NULL, tid INTEGER NOT NULL, name_id INTEGER, PRIMARY KEY (rank, thread_id));
CREATE TABLE {K.RAW_DOMAINS} (domain_id INTEGER PRIMARY KEY, rank INTEGER NOT NULL, name TEXT NOT NULL,
    family TEXT, has_markers INTEGER, num_ranges INTEGER, is_primary INTEGER, has_model INTEGER NOT NULL,
    UNIQUE (rank, name));
CREATE TABLE {K.RAW_RANGE_BLOCKS} (rank INTEGER NOT NULL, rows INTEGER NOT NULL, data BLOB NOT NULL);
CREATE TABLE {K.RAW_API_CALLS} (api_id INTEGER PRIMARY KEY, rank INTEGER NOT NULL, name_id INTEGER,
    thread_id INTEGER NOT NULL, start INTEGER NOT NULL, duration INTEGER NOT NULL, correlation_id INTEGER,
    event_class INTEGER, return_value INTEGER);
CREATE TABLE {K.RAW_GPU_ACTIVITIES} (activity_id INTEGER PRIMARY KEY, rank INTEGER NOT NULL, kind INTEGER NOT NULL,
    name_id INTEGER NOT NULL, long_name_id INTEGER, start INTEGER NOT NULL, duration INTEGER NOT NULL,
    device_id INTEGER, stream_id INTEGER, context_id INTEGER, process_id INTEGER NOT NULL, correlation_id INTEGER,
    grid_x INTEGER, grid_y INTEGER, grid_z INTEGER, block_x INTEGER, block_y INTEGER, block_z INTEGER,
    registers INTEGER, static_smem INTEGER, dynamic_smem INTEGER, bytes INTEGER, copy_kind INTEGER,
    src_kind INTEGER, dst_kind INTEGER, graph_node_id INTEGER);
CREATE TABLE {K.RAW_KERNEL_TC} (rank INTEGER NOT NULL, name_id INTEGER NOT NULL, long_name_id INTEGER NOT NULL,
    uses_tc INTEGER NOT NULL, tc_rule TEXT, PRIMARY KEY (rank, name_id, long_name_id));
CREATE TABLE {K.RAW_SYNCS} (rank INTEGER NOT NULL, start INTEGER NOT NULL, duration INTEGER NOT NULL,
    device_id INTEGER, stream_id INTEGER, process_id INTEGER, correlation_id INTEGER, sync_type INTEGER);
CREATE TABLE {K.RAW_IO_CALLS} (rank INTEGER NOT NULL, start INTEGER NOT NULL, duration INTEGER NOT NULL,
    thread_id INTEGER NOT NULL, name_id INTEGER);
CREATE TABLE {K.RAW_OPS} (op_index INTEGER PRIMARY KEY, rank INTEGER NOT NULL, domain_id INTEGER NOT NULL,
    domain_op_index INTEGER NOT NULL, op_id TEXT, name_id INTEGER, direction TEXT, op_type_id INTEGER,
    label_id INTEGER, tc_eligible INTEGER,
    data_type_id INTEGER, stack_trace_id INTEGER, device_id INTEGER, first_start INTEGER, num_instances INTEGER,
    kind INTEGER);
CREATE TABLE {K.RAW_OP_INSTANCES} (instance_id INTEGER PRIMARY KEY, domain_id INTEGER NOT NULL,
    rank INTEGER NOT NULL, op_index INTEGER NOT NULL, kind INTEGER NOT NULL, source_id INTEGER, thread_id INTEGER,
    process_id INTEGER NOT NULL, device_id INTEGER, start INTEGER NOT NULL, duration INTEGER NOT NULL,
    cpu_overhead INTEGER, gpu_time INTEGER, gpu_offset INTEGER, gpu_span INTEGER, n_gpu INTEGER, n_kernels INTEGER,
    call_id INTEGER);
CREATE TABLE {K.RAW_OP_INSTANCE_DETAILS} (instance_id INTEGER PRIMARY KEY, domain_id INTEGER NOT NULL,
    rank INTEGER NOT NULL, data_type_id INTEGER, input_shapes_id INTEGER, output_shapes_id INTEGER,
    parameters_id INTEGER, stack_trace_id INTEGER);
CREATE TABLE {K.RAW_ACTIVITY_OWNERS} (owner_id INTEGER PRIMARY KEY, domain_id INTEGER NOT NULL,
    rank INTEGER NOT NULL, activity_id INTEGER NOT NULL, instance_id INTEGER NOT NULL, api_id INTEGER,
    launch_time INTEGER NOT NULL);
CREATE TABLE {K.RAW_RANGE_LABELS} (rank INTEGER NOT NULL, domain_id INTEGER NOT NULL, label_id INTEGER NOT NULL,
    kind INTEGER, num_ranges INTEGER);
CREATE TABLE {K.RAW_MEMORY_EVENTS} (rank INTEGER NOT NULL, start INTEGER NOT NULL, call_start INTEGER NOT NULL,
    thread_id INTEGER, process_id INTEGER NOT NULL, device_type INTEGER NOT NULL, device_id INTEGER NOT NULL,
    address INTEGER, bytes INTEGER NOT NULL, allocated INTEGER NOT NULL, reserved INTEGER);
"""

# Derived tables: every row carries its aggregation, domain and rank. A domain_id already names one rank, so
# the rank comes last in the keys and the viewer's (aggr_id, domain_id) lookups use them as prefixes.
DERIVED_TABLES = f"""
CREATE TABLE {K.AGGREGATIONS} (aggr_id INTEGER PRIMARY KEY, created_utc TEXT, key_node TEXT, key_source TEXT,
    key_found INTEGER, iter_start INTEGER, iter_stop INTEGER, total_iterations INTEGER, server_user_name TEXT,
    server_host_name TEXT, engine_version TEXT, elapsed_seconds REAL);
CREATE TABLE {K.ITERATION_LIST} (aggr_id INTEGER, iter_value INTEGER, rank INTEGER NOT NULL DEFAULT 0,
    start_time INTEGER, stop_time INTEGER, PRIMARY KEY (aggr_id, iter_value, rank));
CREATE TABLE {K.ITERATION_SUMMARY} (aggr_id INTEGER, domain_id INTEGER, iter_value INTEGER,
    rank INTEGER NOT NULL DEFAULT 0, start_time INTEGER,
    stop_time INTEGER, duration INTEGER, aggregated INTEGER, kernels INTEGER, tc_kernels INTEGER,
    kernel_time_per_gpu REAL, tc_kernel_time_per_gpu REAL, tc_time REAL, non_tc_time REAL, memory_time REAL,
    dataloader_time REAL, io_time REAL, cpu_time REAL, other_time REAL, gpu_utilization REAL, complete INTEGER,
    PRIMARY KEY (aggr_id, domain_id, iter_value, rank));
CREATE TABLE {K.MODEL_SUMMARY} (aggr_id INTEGER, domain_id INTEGER, rank INTEGER NOT NULL DEFAULT 0,
    wall_time INTEGER, window_start INTEGER,
    window_end INTEGER, tc_utilization REAL, gpu_utilization REAL, tc_duration_pct REAL, non_tc_duration_pct REAL,
    memory_duration_pct REAL, dataloader_duration_pct REAL, io_duration_pct REAL, cpu_duration_pct REAL,
    other_duration_pct REAL, iter_total INTEGER, iter_aggregated INTEGER, iter_start INTEGER, iter_stop INTEGER,
    avg_iteration_time REAL, iteration_time_std_dev REAL, key_node TEXT, key_found INTEGER,
    n_visible_gpus INTEGER, median_iteration_time REAL, complete_iterations INTEGER, complete_start INTEGER,
    complete_stop INTEGER,
    ops_all_gpu INTEGER, ops_all_cpu INTEGER, ops_all_count INTEGER,
    ops_tc_gpu INTEGER, ops_tc_cpu INTEGER, ops_tc_count INTEGER,
    ops_eligible_gpu INTEGER, ops_eligible_cpu INTEGER, ops_eligible_count INTEGER,
    ops_other_gpu INTEGER, ops_other_cpu INTEGER, ops_other_count INTEGER,
    kernels_all_gpu INTEGER, kernels_all_cpu INTEGER, kernels_all_count INTEGER,
    kernels_tc_gpu INTEGER, kernels_tc_cpu INTEGER, kernels_tc_count INTEGER,
    kernels_memory_gpu INTEGER, kernels_memory_cpu INTEGER, kernels_memory_count INTEGER,
    kernels_other_gpu INTEGER, kernels_other_cpu INTEGER, kernels_other_count INTEGER,
    PRIMARY KEY (aggr_id, domain_id, rank));
CREATE TABLE {K.DEVICE_UTILIZATION} (aggr_id INTEGER, domain_id INTEGER, device_id INTEGER,
    rank INTEGER NOT NULL DEFAULT 0, gpu_utilization REAL,
    tc_time INTEGER, non_tc_time INTEGER, memory_time INTEGER, dataloader_time INTEGER, io_time INTEGER,
    cpu_time INTEGER, other_time INTEGER, tc_pct REAL, non_tc_pct REAL, memory_pct REAL, dataloader_pct REAL,
    io_pct REAL, cpu_pct REAL, other_pct REAL, PRIMARY KEY (aggr_id, domain_id, device_id, rank));
CREATE TABLE {K.OP_NODES} (aggr_id INTEGER, domain_id INTEGER, op_index INTEGER, rank INTEGER NOT NULL DEFAULT 0,
    num_calls INTEGER,
    kernel_calls INTEGER, tc_eligible INTEGER, using_tc INTEGER, is_bad_data_type INTEGER, kernel_time INTEGER,
    cpu_total INTEGER, cpu_avg REAL, cpu_min INTEGER, cpu_max INTEGER,
    gpu_total INTEGER, gpu_avg REAL, gpu_min INTEGER, gpu_max INTEGER,
    overhead_total INTEGER, overhead_avg REAL, overhead_min INTEGER, overhead_max INTEGER,
    idle_total INTEGER, idle_avg REAL, idle_min INTEGER, idle_max INTEGER,
    flops_per_call INTEGER, achieved_tflops REAL,
    PRIMARY KEY (aggr_id, domain_id, op_index, rank));
CREATE TABLE {K.OP_TYPE_METRICS} (aggr_id INTEGER, domain_id INTEGER, rank INTEGER NOT NULL DEFAULT 0,
    op_type TEXT, num_ops INTEGER,
    num_calls INTEGER,
    cpu_total INTEGER, cpu_avg REAL, cpu_min INTEGER, cpu_max INTEGER,
    gpu_total INTEGER, gpu_avg REAL, gpu_min INTEGER, gpu_max INTEGER,
    overhead_total INTEGER, overhead_avg REAL, overhead_min INTEGER, overhead_max INTEGER,
    idle_total INTEGER, idle_avg REAL, idle_min INTEGER, idle_max INTEGER);
CREATE TABLE {K.KERNEL_SUMMARIES} (aggr_id INTEGER, domain_id INTEGER, rank INTEGER NOT NULL DEFAULT 0,
    name_id INTEGER, long_name_id INTEGER,
    op_index INTEGER, uses_tc INTEGER, num_calls INTEGER, first_start INTEGER,
    gpu_total INTEGER, gpu_avg REAL, gpu_min INTEGER, gpu_max INTEGER,
    api_total INTEGER, api_avg REAL, api_min INTEGER, api_max INTEGER);
CREATE TABLE {K.TENSOR_CORE_SUMMARY} (aggr_id INTEGER, domain_id INTEGER, rank INTEGER NOT NULL DEFAULT 0,
    op_index INTEGER, total_gpu_time INTEGER,
    tc_gpu_time INTEGER, non_tc_gpu_time INTEGER, tc_utilization REAL, total_kernel_count INTEGER,
    tc_kernel_count INTEGER, tc_kernel_names TEXT, non_tc_kernel_count INTEGER, non_tc_kernel_names TEXT);
CREATE TABLE {K.GROUP_OPS} (aggr_id INTEGER, domain_id INTEGER, rank INTEGER NOT NULL DEFAULT 0, name TEXT,
    level INTEGER, num_calls INTEGER,
    num_ops INTEGER, num_tc_eligible INTEGER, num_using_tc INTEGER,
    cpu_total INTEGER, cpu_avg REAL, cpu_min INTEGER, cpu_max INTEGER,
    gpu_total INTEGER, gpu_avg REAL, gpu_min INTEGER, gpu_max INTEGER,
    overhead_total INTEGER, overhead_avg REAL, overhead_min INTEGER, overhead_max INTEGER,
    idle_total INTEGER, idle_avg REAL, idle_min INTEGER, idle_max INTEGER);
CREATE TABLE {K.EXPERT_SYSTEMS_FEEDBACK} (id INTEGER PRIMARY KEY, aggr_id INTEGER, domain_id INTEGER,
    rank INTEGER NOT NULL DEFAULT 0,
    exp_sys_id TEXT, severity TEXT, problem TEXT, recommendation TEXT, link TEXT, action TEXT, data TEXT);

CREATE TABLE {K.MEMORY_DEVICES} (aggr_id INTEGER, domain_id INTEGER, rank INTEGER NOT NULL DEFAULT 0,
    device_type INTEGER, device_id INTEGER, peak_allocated INTEGER, peak_reserved INTEGER, allocated_at_end INTEGER,
    allocations INTEGER, frees INTEGER, bytes_allocated INTEGER, bytes_freed INTEGER,
    PRIMARY KEY (aggr_id, domain_id, device_type, device_id, rank));
CREATE TABLE {K.MEMORY_OPS} (aggr_id INTEGER, domain_id INTEGER, rank INTEGER NOT NULL DEFAULT 0, op_index INTEGER,
    device_type INTEGER, device_id INTEGER, allocations INTEGER, frees INTEGER, bytes_allocated INTEGER,
    bytes_freed INTEGER, peak_allocated INTEGER);
CREATE TABLE {K.GPU_BREAKDOWN} (aggr_id INTEGER, domain_id INTEGER, rank INTEGER NOT NULL DEFAULT 0,
    device_id INTEGER, computation_busy INTEGER, communication_busy INTEGER, memory_busy INTEGER, gpu_busy INTEGER,
    gpu_idle INTEGER, overlapped_communication INTEGER, host_wait INTEGER, kernel_wait INTEGER, other_wait INTEGER,
    PRIMARY KEY (aggr_id, domain_id, device_id, rank));
CREATE TABLE {K.ITERATION_BREAKDOWN} (aggr_id INTEGER, domain_id INTEGER, rank INTEGER NOT NULL DEFAULT 0,
    iter_value INTEGER, computation_busy REAL, communication_busy REAL, memory_busy REAL, gpu_busy REAL,
    gpu_idle REAL, overlapped_communication REAL, PRIMARY KEY (aggr_id, domain_id, iter_value, rank));
CREATE TABLE {K.STREAM_IDLE} (aggr_id INTEGER, domain_id INTEGER, rank INTEGER NOT NULL DEFAULT 0,
    device_id INTEGER, stream_id INTEGER, busy INTEGER, idle INTEGER, host_wait INTEGER, kernel_wait INTEGER,
    other_wait INTEGER);
CREATE TABLE {K.LAUNCH_DELAYS} (aggr_id INTEGER, domain_id INTEGER, rank INTEGER NOT NULL DEFAULT 0,
    kernel_name TEXT, launches INTEGER, mean REAL, p50 REAL, p95 REAL, short_kernels INTEGER);

CREATE INDEX idx_op_nodes_gpu ON {K.OP_NODES}(aggr_id, domain_id, gpu_total);
CREATE INDEX idx_kernel_summaries ON {K.KERNEL_SUMMARIES}(aggr_id, domain_id, op_index);
CREATE INDEX idx_group_ops ON {K.GROUP_OPS}(aggr_id, domain_id, level, name);
CREATE INDEX idx_memory_ops ON {K.MEMORY_OPS}(aggr_id, domain_id);
"""


_name = K.string_text  # a string id column read as its text


def _thread(alias: str, field: str) -> str:
    return f"(SELECT t.{field} FROM {K.RAW_THREADS} t WHERE t.rank = {alias}.rank AND t.thread_id = {alias}.thread_id)"


def _process_pid(alias: str) -> str:
    return f"(SELECT p.pid FROM {K.RAW_PROCESSES} p WHERE p.rank = {alias}.rank AND p.process_id = {alias}.process_id)"


def _local(key: str) -> str:
    """The engine's id of a database-wide key."""
    return f"({key} & {K.ID_MASK})"


# Names are looked up by correlated subqueries: a view stays one table (SQLite flattens it into the query)
# and a name costs a lookup only where a query reads it.
_KERNEL_NAMES = K.kernel_summary_names(K.KERNEL_NAME_IDS)
COMPAT_VIEWS = f"""
CREATE VIEW {K.READ_ONLY_SYSTEM_CONFIG} AS SELECT rank, name, value FROM {K.RAW_SYSTEM_CONFIG};
CREATE VIEW {K.READ_ONLY_MODEL_CONFIG} AS SELECT rank, name, value FROM {K.RAW_MODEL_CONFIG};
CREATE VIEW {K.READ_ONLY_GPU_INFOS} AS SELECT rank, device_id, name, compute_major, compute_minor, sm_count,
    total_memory, bus_location, chip_name, uuid FROM {K.RAW_GPU_INFOS};
CREATE VIEW read_only_processes AS SELECT p.rank, p.pid, {_name("p.name_id")} AS name FROM {K.RAW_PROCESSES} p;
CREATE VIEW read_only_threads AS SELECT t.rank, t.global_tid, t.pid, t.tid, {_name("t.name_id")} AS name
    FROM {K.RAW_THREADS} t;
CREATE VIEW {K.READ_ONLY_DOMAINS} AS SELECT domain_id, rank, name, family, has_markers, num_ranges, is_primary
    FROM {K.RAW_DOMAINS} WHERE has_model;
CREATE VIEW {K.READ_ONLY_CUDA_CALLS} AS SELECT c.rank, {_local("c.api_id")} AS api_id, {_name("c.name_id")} AS name,
    c.start,
    c.start + c.duration AS "end", {_thread("c", "global_tid")} AS global_tid, {_thread("c", "pid")} AS pid,
    c.correlation_id, c.event_class, c.return_value FROM {K.RAW_API_CALLS} c;
CREATE VIEW {K.READ_ONLY_GPU_ACTIVITIES} AS SELECT g.rank, {_local("g.activity_id")} AS activity_id, g.kind,
    {_name("g.name_id")} AS name,
    {_name("coalesce(g.long_name_id, g.name_id)")} AS long_name, g.start, g.start + g.duration AS "end",
    g.device_id, g.stream_id, g.context_id, {_process_pid("g")} AS pid, g.correlation_id, g.grid_x, g.grid_y,
    g.grid_z, g.block_x, g.block_y, g.block_z, g.registers, g.static_smem, g.dynamic_smem, g.bytes, g.copy_kind,
    g.src_kind, g.dst_kind, g.graph_node_id FROM {K.RAW_GPU_ACTIVITIES} g;
CREATE VIEW {K.READ_ONLY_KERNEL_TC} AS SELECT k.rank, {_name("k.name_id")} AS name,
    {_name("k.long_name_id")} AS long_name, k.uses_tc, k.tc_rule FROM {K.RAW_KERNEL_TC} k;
CREATE VIEW read_only_cuda_syncs AS SELECT s.rank, s.start, s.start + s.duration AS "end", s.device_id,
    s.stream_id, {_process_pid("s")} AS pid, s.correlation_id, s.sync_type FROM {K.RAW_SYNCS} s;
CREATE VIEW read_only_io_calls AS SELECT io.rank, io.start, io.start + io.duration AS "end",
    {_thread("io", "global_tid")} AS global_tid, {_thread("io", "pid")} AS pid, {_name("io.name_id")} AS name
    FROM {K.RAW_IO_CALLS} io;
CREATE VIEW {K.READ_ONLY_OPS} AS SELECT o.op_index, o.rank, o.domain_id, o.op_id, {_name("o.name_id")} AS op_name,
    o.direction, {_name("o.op_type_id")} AS op_type, {_name("o.label_id")} AS label, o.tc_eligible,
    {_name("o.data_type_id")} AS data_type, {_name("o.stack_trace_id")} AS stack_trace, o.device_id, o.first_start,
    o.num_instances, o.kind FROM {K.RAW_OPS} o;
CREATE VIEW {K.READ_ONLY_OP_INSTANCES} AS SELECT i.domain_id, {_local("i.instance_id")} AS instance_id, i.rank,
    i.op_index, i.kind,
    i.source_id, i.start, i.start + i.duration AS "end", {_process_pid("i")} AS pid,
    coalesce({_thread("i", "global_tid")}, -1) AS global_tid, i.device_id, i.cpu_overhead, i.gpu_time,
    CASE WHEN i.n_gpu > 0 THEN i.start + i.gpu_offset ELSE -1 END AS gpu_start,
    CASE WHEN i.n_gpu > 0 THEN i.start + i.gpu_offset + i.gpu_span ELSE -1 END AS gpu_end, i.n_gpu, i.n_kernels,
    {_local("coalesce(i.call_id, i.instance_id)")} AS call_id
    FROM {K.RAW_OP_INSTANCES} i;
CREATE VIEW {K.READ_ONLY_OP_INSTANCE_DETAILS} AS SELECT d.domain_id, {_local("d.instance_id")} AS instance_id,
    d.rank,
    {_name("d.data_type_id")} AS data_type, {_name("d.input_shapes_id")} AS input_shapes,
    {_name("d.output_shapes_id")} AS output_shapes, {_name("d.parameters_id")} AS parameters,
    {_name("d.stack_trace_id")} AS stack_trace FROM {K.RAW_OP_INSTANCE_DETAILS} d;
CREATE VIEW {K.READ_ONLY_ACTIVITY_OWNERS} AS SELECT w.domain_id, {_local("w.activity_id")} AS activity_id, w.rank,
    {_local("w.instance_id")} AS instance_id, {_local("w.api_id")} AS api_id, w.launch_time
    FROM {K.RAW_ACTIVITY_OWNERS} w;
CREATE VIEW read_only_memory_events AS SELECT m.rank, m.start, m.call_start,
    coalesce({_thread("m", "global_tid")}, -1) AS global_tid, {_process_pid("m")} AS pid, m.device_type, m.device_id,
    m.address, m.bytes, m.allocated, m.reserved FROM {K.RAW_MEMORY_EVENTS} m;
CREATE VIEW {K.READ_ONLY_RANGE_LABELS} AS SELECT l.rank, l.domain_id, {_name("l.label_id")} AS label, l.kind,
    l.num_ranges FROM {K.RAW_RANGE_LABELS} l;

CREATE VIEW view_aggregations AS SELECT * FROM {K.AGGREGATIONS};
CREATE VIEW view_domains AS SELECT * FROM {K.READ_ONLY_DOMAINS};
CREATE VIEW view_gpu_devices AS SELECT * FROM {K.READ_ONLY_GPU_INFOS};
CREATE VIEW view_system_config AS SELECT * FROM {K.READ_ONLY_SYSTEM_CONFIG};
CREATE VIEW view_op_nodes AS
    SELECT n.aggr_id, n.domain_id, n.rank, o.op_index, o.op_id, o.op_name, o.direction, o.op_type, o.tc_eligible,
           n.using_tc, n.is_bad_data_type, o.data_type, o.stack_trace, o.device_id, n.num_calls, n.kernel_calls,
           n.kernel_time, n.cpu_total, n.cpu_avg, n.cpu_min, n.cpu_max, n.gpu_total, n.gpu_avg, n.gpu_min,
           n.gpu_max, n.overhead_total, n.overhead_avg, n.overhead_min, n.overhead_max, n.idle_total, n.idle_avg,
           n.idle_min, n.idle_max, o.first_start
    FROM {K.OP_NODES} n JOIN {K.READ_ONLY_OPS} o ON o.op_index = n.op_index;
CREATE VIEW view_kernel_summaries AS
    SELECT k.*, {_KERNEL_NAMES[0]} AS kernel_name, {_KERNEL_NAMES[1]} AS long_name, o.op_id, o.op_name, o.direction,
           o.op_type
    FROM {K.KERNEL_SUMMARIES} k JOIN {K.READ_ONLY_OPS} o ON o.op_index = k.op_index;
CREATE VIEW view_tensor_core_summary AS
    SELECT t.*, o.op_id, o.op_name, o.direction, o.op_type
    FROM {K.TENSOR_CORE_SUMMARY} t JOIN {K.READ_ONLY_OPS} o ON o.op_index = t.op_index;
CREATE VIEW view_performance_summary AS SELECT * FROM {K.MODEL_SUMMARY};
CREATE VIEW view_expert_systems AS SELECT * FROM {K.EXPERT_SYSTEMS_FEEDBACK};
"""

SCHEMA = RAW_TABLES + DERIVED_TABLES + COMPAT_VIEWS

# Tables of multi-rank databases only (rank_merge.py creates them): not part of SCHEMA, so single-rank
# databases, and those written before, need not have them.
RANK_TABLES = f"""
CREATE TABLE IF NOT EXISTS {K.RANK_PROFILE_INFO} (rank INTEGER NOT NULL, name TEXT NOT NULL, value TEXT,
    PRIMARY KEY (rank, name));
CREATE TABLE IF NOT EXISTS {K.RANK_SUMMARY} (aggr_id INTEGER NOT NULL, rank INTEGER NOT NULL, source_file TEXT,
    gpus INTEGER, iterations INTEGER, total_iterations INTEGER, avg_iteration_time REAL, max_iteration_time INTEGER,
    gpu_utilization REAL, communication_time INTEGER, overlapped_communication_pct REAL, times_slowest INTEGER,
    straggler INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (aggr_id, rank));
"""

# The baseline of a run analysed with `--baseline` (database.write_baselines): the baseline's side of the diff
# report, per aggregation of the run it was compared with; not part of SCHEMA, created when first written.
BASELINE_TABLES = f"""
CREATE TABLE IF NOT EXISTS {K.BASELINE_PROFILES} (aggr_id INTEGER NOT NULL, domain_id INTEGER NOT NULL,
    rank INTEGER NOT NULL, source TEXT, key_node TEXT, iter_start INTEGER, iter_stop INTEGER,
    total_iterations INTEGER, avg_iteration_time REAL, gpu_utilization REAL, wall_time INTEGER,
    aggregated_iterations INTEGER, tc_utilization REAL, PRIMARY KEY (aggr_id, domain_id, rank));
CREATE TABLE IF NOT EXISTS {K.BASELINE_OPS} (aggr_id INTEGER NOT NULL, domain_id INTEGER NOT NULL,
    rank INTEGER NOT NULL, op_name TEXT, direction TEXT, op_type TEXT, num_calls INTEGER, gpu_total INTEGER);
CREATE TABLE IF NOT EXISTS {K.BASELINE_KERNELS} (aggr_id INTEGER NOT NULL, domain_id INTEGER NOT NULL,
    rank INTEGER NOT NULL, kernel_name TEXT, uses_tc INTEGER, num_calls INTEGER, gpu_total INTEGER);
CREATE INDEX IF NOT EXISTS idx_baseline_ops ON {K.BASELINE_OPS}(aggr_id, domain_id, rank);
CREATE INDEX IF NOT EXISTS idx_baseline_kernels ON {K.BASELINE_KERNELS}(aggr_id, domain_id, rank);
"""

# Secondary indexes on raw tables, only for viewer queries. Those whose keys arrive in order are created with
# the tables (each insert appends to them):
#  - idx_instances_start: the op instances starting in an iteration (iteration_ops);
#  - idx_owner_instance: the GPU activities of instances (iteration_op_kernels);
#  - idx_owner_launch: the launches of an iteration (iteration_kernels);
#  - idx_memory_events: a device's memory curve in a time window (the Memory view, the timeline's memory track).
GPU_INSTANCES = "n_gpu > 0"
RAW_INDEXES = f"""
CREATE INDEX idx_instances_start ON {K.RAW_OP_INSTANCES}(domain_id, start);
CREATE INDEX idx_owner_instance ON {K.RAW_ACTIVITY_OWNERS}(instance_id);
CREATE INDEX idx_owner_launch ON {K.RAW_ACTIVITY_OWNERS}(domain_id, launch_time);
CREATE INDEX idx_memory_events ON {K.RAW_MEMORY_EVENTS}(rank, device_type, device_id, start);
"""
# Built once after the last row (one sort; kept up to date, its random keys would cost a b-tree search each):
#  - idx_instances_op: one op's instances in an iteration (iteration_op_kernels), only those with GPU work
#    (instances without any, such as aten::empty or views, launch nothing: the index leaves them out).
FINAL_INDEXES = f"""
CREATE INDEX idx_instances_op ON {K.RAW_OP_INSTANCES}(domain_id, op_index, start) WHERE {GPU_INSTANCES};
"""
