"""What the engine and the viewer plugin agree on: plugin and event-file names, the DLProf database's schema
version, the table and column names the plugin reads, and the integer codes stored in them.

Standard library only (nothing is imported): `dlprof_plugin` imports it without pulling in the engine, as
TensorBoard's `plugins/*/metadata.py` modules do.
"""

# ---------------------------------------------------------------------------- TensorBoard

PLUGIN_NAME = "dlprof"  # TensorBoard plugin name, route prefix /data/plugin/dlprof/
PROFILE_TAG = "dlprof/profile"  # the event-file tensor holding a run's metadata (database path ...)
EVENT_SUFFIX = ".dlprof"  # suffix of the event files dlprof writes
# In an output folder while a run's outputs are renamed into place (and after a kill then, until the next run
# into the folder completes the publication): the viewer hides the run's database meanwhile
PUBLISH_JOURNAL = ".dlprof-publish.json"
SCALAR_TAGS = {
    "iteration_time_ms": "dlprof/iteration_time_ms",
    "gpu_utilization_pct": "dlprof/gpu_utilization_pct",
    "tc_kernel_time_ms": "dlprof/tc_kernel_time_per_gpu_ms",
}

# ---------------------------------------------------------------------------- database versions

DB_SCHEMA_VERSION = "3.4.0"  # written by this dlprof (db_version.current_version); 3.1 added the memory tables,
# 3.2 the GPU time breakdowns, 3.3 stores the NVTX ranges as blocks (raw_range_blocks, not raw_ranges rows), 3.4
# names kernel_summaries' kernels by string id (name_id, long_name_id: kernel_summary_names)
READABLE_SCHEMA_MAJORS = ("2", "3")  # schema majors the engine and the viewer open
CREATED_BY_PREFIX = "dlprof"  # db_version.created_by starts with it in every DLProf database


def schema_major(version) -> str:
    """Major part of a schema version text ('3.0.0' -> '3')."""
    return str(version).split(".")[0]


# ---------------------------------------------------------------------------- codes stored in the database

# raw_gpu_activities.kind (read_only_gpu_activities.kind)
KIND_KERNEL, KIND_MEMCPY, KIND_MEMSET = 0, 1, 2

# raw_op_instances.kind: what an op instance stands for (its source_id names a range, an API call or a GPU
# activity, or nothing for a backward-pass instance)
RANGE_OP, SCOPE_OP, UNASSOCIATED_API, UNASSOCIATED_GPU, BACKWARD_PASS = range(5)
INSTANCE_KINDS_FROM_RANGES = (RANGE_OP, SCOPE_OP)

# expert_systems_feedback.severity, most severe first; older spellings sort with their equivalent
SEVERITIES = ("error", "warning", "info")
SEVERITY_ORDER = {"error": 0, "high": 0, "warning": 1, "medium": 1, "info": 2, "low": 2}

# ---------------------------------------------------------------------------- schema 3.0 tables

# Row keys of the large raw tables are database-wide integers: (scope << ID_BITS) | the engine's id, the scope
# being the rank (API calls, GPU activities) or the domain_id (op instances, activity owners). Rank 0 and
# domain 0 keep the engine's ids; every join is a rowid lookup.
ID_BITS = 40
ID_MASK = (1 << ID_BITS) - 1


def db_id(scope: int, local: int) -> int:
    """Database-wide key of an engine id within a rank or domain."""
    return (int(scope) << ID_BITS) | int(local)


STRINGS = "strings"  # (id, value): every repeated name, referenced by *_id columns
RANKS = "ranks"  # one row per profile (rank); a single-file analysis is rank 0
RAW_SYSTEM_CONFIG = "raw_system_config"
RAW_MODEL_CONFIG = "raw_model_config"
RAW_GPU_INFOS = "raw_gpu_infos"
RAW_PROCESSES = "raw_processes"
RAW_THREADS = "raw_threads"
RAW_DOMAINS = "raw_domains"
RAW_RANGES = "raw_ranges"  # schema 3.0-3.2: a row per NVTX range (still read from those files)
RAW_RANGE_BLOCKS = "raw_range_blocks"  # schema 3.3: the NVTX ranges as compressed Arrow blocks (db/range_blocks.py)
RAW_API_CALLS = "raw_api_calls"
RAW_GPU_ACTIVITIES = "raw_gpu_activities"
RAW_KERNEL_TC = "raw_kernel_tc"
RAW_SYNCS = "raw_syncs"
RAW_IO_CALLS = "raw_io_calls"
RAW_OPS = "raw_ops"
RAW_OP_INSTANCES = "raw_op_instances"
RAW_OP_INSTANCE_DETAILS = "raw_op_instance_details"
RAW_ACTIVITY_OWNERS = "raw_activity_owners"
RAW_RANGE_LABELS = "raw_range_labels"
RAW_MEMORY_EVENTS = "raw_memory_events"  # schema 3.1: memory allocations and frees with the levels after them

# Views with the readable layout of schema 2.0 (names joined from `strings`, end times, pids), over every
# rank (each has a `rank` column). In a 2.0 database these names are the tables themselves, so SQL written
# against them reads both schema versions.
READ_ONLY_OPS = "read_only_ops"
READ_ONLY_DOMAINS = "read_only_domains"
READ_ONLY_GPU_INFOS = "read_only_gpu_infos"
READ_ONLY_SYSTEM_CONFIG = "read_only_system_config"
READ_ONLY_MODEL_CONFIG = "read_only_model_config"
READ_ONLY_RANGES = "read_only_ranges"  # 2.0 tables and 3.0-3.2 views only (3.3 stores blocks)
READ_ONLY_RANGE_LABELS = "read_only_range_labels"
READ_ONLY_GPU_ACTIVITIES = "read_only_gpu_activities"
READ_ONLY_CUDA_CALLS = "read_only_cuda_calls"
READ_ONLY_OP_INSTANCES = "read_only_op_instances"
READ_ONLY_OP_INSTANCE_DETAILS = "read_only_op_instance_details"
READ_ONLY_ACTIVITY_OWNERS = "read_only_activity_owners"
READ_ONLY_KERNEL_TC = "read_only_kernel_tc"

# Derived (aggregation) tables: one row set per aggregation, rank and domain
AGGREGATIONS = "aggregations"
ITERATION_LIST = "iteration_list"
ITERATION_SUMMARY = "iteration_summary"
MODEL_SUMMARY = "model_summary"
DEVICE_UTILIZATION = "device_utilization"
OP_NODES = "op_nodes"
OP_TYPE_METRICS = "op_type_metrics"
KERNEL_SUMMARIES = "kernel_summaries"
# schema 3.4: kernel_summaries names its kernels by string id; before, as text (kernel_name, long_name)
KERNEL_NAME_IDS = ("name_id", "long_name_id")
TENSOR_CORE_SUMMARY = "tensor_core_summary"
GROUP_OPS = "group_ops"
EXPERT_SYSTEMS_FEEDBACK = "expert_systems_feedback"
MEMORY_DEVICES = "memory_devices"  # schema 3.1: the memory report's Devices section
MEMORY_OPS = "memory_ops"  # schema 3.1: the memory report's Ops section
# tables schema 3.1 added: 3.0 files lack them and are read as profiles without memory events
SCHEMA_3_1_TABLES = (RAW_MEMORY_EVENTS, MEMORY_DEVICES, MEMORY_OPS, "read_only_memory_events")
GPU_BREAKDOWN = "gpu_breakdown"  # schema 3.2: per GPU busy split, idle split, overlapped communication
ITERATION_BREAKDOWN = "iteration_breakdown"  # schema 3.2: per iteration busy split averaged over the GPUs used
STREAM_IDLE = "stream_idle"  # schema 3.2: per GPU and stream busy time and idle split
LAUNCH_DELAYS = "launch_delays"  # schema 3.2: per kernel name launch delays and short kernels
# tables schema 3.2 added: older files lack them and are read without the GPU time breakdowns
SCHEMA_3_2_TABLES = (GPU_BREAKDOWN, ITERATION_BREAKDOWN, STREAM_IDLE, LAUNCH_DELAYS)
SCHEMA_3_3_TABLES = (RAW_RANGE_BLOCKS,)  # files of 3.0-3.2 hold RAW_RANGES (and its view READ_ONLY_RANGES) instead

# raw_memory_events.device_type: c10::DeviceType (CPU for host memory, CUDA for a GPU's); the devices' names
DEVICE_TYPE_CPU, DEVICE_TYPE_CUDA = 0, 1
DEVICE_TYPE_NAMES = {
    DEVICE_TYPE_CPU: "CPU",
    DEVICE_TYPE_CUDA: "GPU",
    6: "GPU",
    12: "XPU",
    13: "MPS",
    15: "HPU",
    19: "MTIA",
}


def device_label(device_type: int, device_id: int) -> str:
    """`CPU`, `GPU 0`, `XPU 1` ... (memory reports and the viewer)."""
    if int(device_type) == DEVICE_TYPE_CPU:
        return "CPU"
    return f"{DEVICE_TYPE_NAMES.get(int(device_type), f'device type {int(device_type)}')} {int(device_id)}"


def device_label_sql(type_column: str, id_column: str) -> str:
    """device_label as an SQL expression over two integer columns."""
    names = " ".join(
        f"WHEN {t} THEN '{n} ' || {id_column}" for t, n in DEVICE_TYPE_NAMES.items() if t != DEVICE_TYPE_CPU
    )
    return (
        f"(CASE {type_column} WHEN {DEVICE_TYPE_CPU} THEN 'CPU' {names} "
        f"ELSE 'device type ' || {type_column} || ' ' || {id_column} END)"
    )


# Multi-rank runs (tables present only in databases of several ranks): each rank's profile_info, and the
# cross-rank report per aggregation. Findings across ranks (straggler, load imbalance ...) are stored in
# expert_systems_feedback with rank = ALL_RANKS and domain_id = ALL_RANKS.
RANK_PROFILE_INFO = "rank_profile_info"
RANK_SUMMARY = "rank_summary"
ALL_RANKS = -1

# The baseline a run was compared with (`dlprof --baseline`): per aggregation of the run it was compared with,
# rank and domain, the baseline's side of the diff report (its op and kernel rows and headline figures), so the
# viewer's Compare view shows the diff report's comparison without the baseline's files (compare.Side).
BASELINE_PROFILES = "baseline_profiles"
BASELINE_OPS = "baseline_ops"
BASELINE_KERNELS = "baseline_kernels"

# The tables (or views) whose presence makes a file a DLProf database the viewer can open
VIEWER_REQUIRED = ("db_version", READ_ONLY_OPS, AGGREGATIONS, MODEL_SUMMARY)
ENGINE_REQUIRED = ("db_version", READ_ONLY_OPS, READ_ONLY_OP_INSTANCES)

# ---------------------------------------------------------------------------- names users read


def api_display_name(name):
    """A CUDA API name as users write it: Nsight Systems records the API's version after it
    (`cudaLaunchKernel_v7000`, `cuMemcpyHtoD_v2`), which nobody writes; the database keeps the recorded name,
    ops, reports and the viewer show this one. Anything else is returned as it is."""
    if not isinstance(name, str):
        return name
    head, sep, tail = name.rpartition("_v")
    return head if sep and head and tail.isascii() and tail.isdigit() else name


# The rank the viewer shows when no rank is asked for (a single-file analysis is rank 0; a multi-rank run
# shows its lowest rank)
DEFAULT_RANK = 0

# Thresholds the expert systems decide by and the viewer's dashboard guidance repeats (experts/utilization.py):
# GPU utilization (TC + non-TC kernels + memory operations, averaged over the visible GPUs) below this share of
# the wall clock time, and data loading while every GPU class is idle above this share.
GPU_UTILIZATION_PCT = 50.0
DATALOADER_PCT = 10.0


def string_text(id_sql: str) -> str:
    """SQL of the text of a string id (an id into STRINGS; NULL stays NULL)."""
    return f"(SELECT value FROM {STRINGS} WHERE id = {id_sql})"


def kernel_summary_names(columns, alias: str = "k") -> tuple[str, str]:
    """SQL of (kernel name, long kernel name) of a kernel_summaries row under `alias`, given the table's
    `columns`: string ids since schema 3.4 (a kernel name repeated for each op launching it made the table a
    quarter of a database), text before."""
    if KERNEL_NAME_IDS[0] in columns:
        return tuple(string_text(f"{alias}.{c}") for c in KERNEL_NAME_IDS)
    return f"{alias}.kernel_name", f"{alias}.long_name"
