"""Paged tables: column whitelists, SQL sources, and the sort / filter / page query builder.

Column keys, sort keys and filter keys are looked up in these definitions; request text never reaches SQL
except as bound parameters. Every query uses named parameters (`:aggr`, `:domain`, ...).
"""

from __future__ import annotations

import math
import re
from decimal import Decimal
from dataclasses import dataclass, field

from dlprof_plugin.replies import BadRequest, NotFound, TooLarge
from dlprof_plugin.terms import term
from dlprof_profiler import contract as K

TEXT_TYPES = ("text", "multiline")
NUMERIC_TYPES = ("int", "ns", "float", "pct")
MAX_PAGE = 1000
MAX_EXPORT_ROWS = 1_000_000
MAX_FILTER_LEN = 1000

KIND_KERNEL = K.KIND_KERNEL  # gpu activity kind of a compute kernel
UNASSOCIATED_GPU = K.UNASSOCIATED_GPU  # op instance kind of a GPU activity outside every op (no CPU time)


@dataclass
class Col:
    key: str
    label: str  # the export's column header (DLProf 1.8's report names)
    type: str
    sql: str
    term: str | None = None  # the shown label and tooltip: terms.TERMS[term] (default: the key's)
    hidden: bool = False
    sortable: bool = True
    filterable: bool = True
    sort_sql: str | None = None  # expression used for ORDER BY when it differs from the value
    searchable: bool = True  # part of the table-wide search `q` (text columns)

    def meta(self) -> dict:
        shown = term(self.term or self.key)
        out = {
            "key": self.key,
            "label": self.label,
            "type": self.type,
            "term": self.term or self.key,
            "display": shown.label,
            "tooltip": shown.definition,
        }
        if self.hidden:
            out["hidden"] = True
        if not self.sortable:
            out["sortable"] = False
        if not self.filterable:
            out["filterable"] = False
        return out


@dataclass
class TableQuery:
    name: str
    columns: list[Col]
    source: str  # FROM ... (joins included)
    where: list[str]  # fixed conditions
    params: dict  # named parameters of source and where
    default_sort: tuple[str, str]  # (column key, asc|desc)
    tiebreak: str  # SQL expression making the order total (stable paging)
    post: object = None  # optional callable(db, rows, columns) filling computed columns of a page
    extra: dict = field(default_factory=dict)  # extra keys of the JSON answer
    key: str | None = None  # unique integer row key: pages are found on (sort value, key) alone, then
    # only their rows are read in full (and it is the tiebreak)
    count_source: str | None = None  # cheaper source giving the same unfiltered row count (no lookups)
    range: tuple | None = None  # (alias, table) of an aggregation table: see rowid_range()
    indexed_sorts: tuple = ()  # sort keys an index already orders (unfiltered pages use it)
    db: object = None  # the database the query reads, when not the run's (a comparison's rows)

    def col(self, key: str) -> Col | None:
        for c in self.columns:
            if c.key == key:
                return c
        return None


# ---------------------------------------------------------------------------- column helpers


def _stats(prefix: str, label: str, alias: str, term_prefix: str = "") -> list[Col]:
    """Total / Avg. / Min / Max columns of a metric (DLProf's detailed report layout)."""
    return [
        Col(f"{prefix}_{s}", f"{head} {label} (ns)", "ns", f"{alias}.{prefix}_{s}", term=f"{term_prefix}{prefix}_{s}")
        for s, head in (("total", "Total"), ("avg", "Avg."), ("min", "Min"), ("max", "Max"))
    ]


def _op_stats(alias: str, term_prefix: str = "") -> list[Col]:
    """The statistics of ops and op types (over calls), or of group nodes (term_prefix "group_": over
    iterations)."""
    return (
        _stats("cpu", "CPU Time", alias, term_prefix)
        + _stats("gpu", "GPU Time", alias, term_prefix)
        + _stats("overhead", "CPU Overhead", alias, term_prefix)
        + _stats("idle", "GPU Idle", alias, term_prefix)
    )


def op_identity(alias: str, pytorch: bool, with_type: bool = True) -> list[Col]:
    """The columns naming an op (id, name, direction for PyTorch, type)."""
    cols = [
        Col("op_id", "Op ID", "text", f"{alias}.op_id"),
        Col("op_name", "Op Name", "text", f"{alias}.op_name"),
    ]
    if pytorch:
        cols.append(
            Col(
                "direction",
                "Direction",
                "text",
                f"{alias}.direction",
            )
        )
    if with_type:
        cols.append(Col("op_type", "Op Type", "text", f"{alias}.op_type"))
    return cols


def aggregation_filters(aggr_domain_alias: str) -> list[str]:
    """The conditions selecting the scope's aggregation and domain."""
    return [f"{aggr_domain_alias}.aggr_id = :aggr", f"{aggr_domain_alias}.domain_id = :domain"]


# ---------------------------------------------------------------------------- table definitions

# the op's first call (as the detailed report's Input Shapes). 2.0: one step down the (domain, op, start) index;
# 3.0: the instances starting at the op's first start (the (domain, start) index), since its op index holds
# only instances with GPU work
_FIRST_CALL_SHAPES = {
    "2": (
        "(SELECT d.input_shapes FROM read_only_op_instances i LEFT JOIN read_only_op_instance_details d "
        "ON d.domain_id = i.domain_id AND d.instance_id = i.instance_id WHERE i.domain_id = n.domain_id "
        "AND i.op_index = n.op_index ORDER BY i.start, i.instance_id LIMIT 1)"
    ),
    "3": (
        f"(SELECT {K.string_text('d.input_shapes_id')} FROM {K.RAW_OP_INSTANCES} i "
        f"LEFT JOIN {K.RAW_OP_INSTANCE_DETAILS} d ON d.instance_id = i.instance_id WHERE i.domain_id = n.domain_id "
        "AND i.start = o.first_start AND i.op_index = n.op_index ORDER BY i.instance_id LIMIT 1)"
    ),
}


# FLOPs per Call and Achieved TFLOP/s (the engine's flops.py, stored in op_nodes): definitions, one for both tables
def _flops_columns(ctx, per_call_sql: str, tflops_sql: str) -> list[Col]:
    """FLOPs per Call and Achieved TFLOP/s (NULL, neither sortable nor filterable, in files written before
    op_nodes had them)."""
    stored = "flops_per_call" in ctx.db.columns("op_nodes")
    return [
        Col(key, label, kind, sql if stored else "NULL", sortable=stored, filterable=stored)
        for key, label, kind, sql in (
            ("flops_per_call", "FLOPs per Call", "int", per_call_sql),
            ("achieved_tflops", "Achieved TFLOP/s", "float", tflops_sql),
        )
    ]


def _op_node_value(column: str) -> str:
    """A kernel row's op figure: its op's op_nodes row of the same aggregation (a primary-key lookup)."""
    return (
        f"(SELECT n.{column} FROM op_nodes n WHERE n.aggr_id = k.aggr_id AND n.domain_id = k.domain_id "
        "AND n.op_index = k.op_index)"
    )


def ops_table(ctx) -> TableQuery:
    pt = ctx.pytorch
    cols = [Col("op_index", "Op Index", "int", "n.op_index", hidden=True)]
    cols += op_identity("o", pt)
    cols += [
        Col("num_calls", "No. Calls", "int", "n.num_calls"),
        Col("tc_eligible", "TC Eligible", "bool", "n.tc_eligible"),
        Col("using_tc", "Using TC", "bool", "n.using_tc"),
        Col("kernel_calls", "Kernel Calls", "int", "n.kernel_calls", hidden=True),
    ]
    cols += _op_stats("n")
    cols.append(Col("data_type", "Data Type", "text", "o.data_type"))
    # a lookup per row: sorting or filtering by it reads every op's first call, so the table-wide search,
    # which runs on every keystroke, leaves it out
    cols.append(
        Col(
            "input_shapes",
            "Input Shapes",
            "text",
            _FIRST_CALL_SHAPES["3" if ctx.db.v3 else "2"],
            searchable=False,
        )
    )
    cols += _flops_columns(ctx, "n.flops_per_call", "n.achieved_tflops")
    if pt:
        cols.append(Col("stack_trace", "Stack Trace", "multiline", "o.stack_trace"))
    cols.append(
        Col(
            "is_bad_data_type",
            "Bad Data Type",
            "bool",
            "n.is_bad_data_type",
            hidden=True,
        )
    )
    return TableQuery(
        "ops",
        cols,
        "op_nodes n JOIN read_only_ops o ON o.op_index = n.op_index",
        aggregation_filters("n"),
        ctx.params(),
        ("gpu_total", "desc"),
        "n.rowid",
        key="n.rowid",
        count_source="op_nodes n",
        range=("n", "op_nodes"),
        indexed_sorts=("gpu_total",),
    )


def kernels_table(ctx, op_index: int | None = None) -> TableQuery:
    pt = ctx.pytorch
    name, long_name = K.kernel_summary_names(ctx.db.columns(K.KERNEL_SUMMARIES), "k")
    cols = [
        Col("op_index", "Op Index", "int", "k.op_index", hidden=True),
        Col("kernel_name", "Kernel Name", "text", name),
    ]
    cols += op_identity("o", pt)
    cols += [
        Col("uses_tc", "Uses TC", "bool", "k.uses_tc"),
        Col("num_calls", "No. Calls", "int", "k.num_calls", term="launches"),
        Col("gpu_total", "Total GPU Time (ns)", "ns", "k.gpu_total", term="kernel_total"),
        Col("gpu_avg", "Avg GPU Time (ns)", "ns", "k.gpu_avg", term="kernel_avg"),
        Col("gpu_min", "Min GPU Time (ns)", "ns", "k.gpu_min", term="kernel_min"),
        Col("gpu_max", "Max GPU Time (ns)", "ns", "k.gpu_max", term="kernel_max"),
        Col("api_total", "Total API Time (ns)", "ns", "k.api_total"),
        Col("api_avg", "Avg API Time (ns)", "ns", "k.api_avg"),
        Col("api_min", "Min API Time (ns)", "ns", "k.api_min"),
        Col("api_max", "Max API Time (ns)", "ns", "k.api_max"),
        Col("long_name", "Long Kernel Name", "text", long_name, hidden=True),
    ]
    cols += _flops_columns(ctx, _op_node_value("flops_per_call"), _op_node_value("achieved_tflops"))
    where = aggregation_filters("k")
    params = ctx.params()
    if op_index is not None:
        where.append("k.op_index = :op_index")
        params["op_index"] = op_index
    return TableQuery(
        "kernels",
        cols,
        "kernel_summaries k JOIN read_only_ops o ON o.op_index = k.op_index",
        where,
        params,
        ("gpu_total", "desc"),
        "k.rowid",
        key="k.rowid",
        count_source="kernel_summaries k",
        range=None if op_index is not None else ("k", "kernel_summaries"),
    )


def op_types_table(ctx) -> TableQuery:
    cols = [
        Col("op_type", "Op Type", "text", "t.op_type"),
        Col("num_ops", "# Ops", "int", "t.num_ops"),
        Col("num_calls", "# Calls", "int", "t.num_calls"),
    ]
    cols += _op_stats("t")
    return TableQuery(
        "op_types",
        cols,
        "op_type_metrics t",
        aggregation_filters("t"),
        ctx.params(),
        ("gpu_total", "desc"),
        "t.rowid",
        key="t.rowid",
        range=("t", "op_type_metrics"),
    )


def _names(expr: str) -> str:
    """A JSON list of names as one ', '-joined text (anything else as stored)."""
    return (
        f"(CASE WHEN json_valid({expr}) AND json_type({expr}) = 'array' THEN "
        f"(SELECT coalesce(group_concat(value, ', '), '') FROM json_each({expr})) ELSE {expr} END)"
    )


def tensor_core_table(ctx) -> TableQuery:
    cols = [Col("op_index", "Op Index", "int", "t.op_index", hidden=True)]
    cols += op_identity("o", ctx.pytorch)
    cols += [
        Col("uses_tc", "Uses TC", "bool", "(t.tc_kernel_count > 0)", term="using_tc"),
        Col("total_gpu_time", "Total GPU Time (ns)", "ns", "t.total_gpu_time", term="op_kernel_time"),
        Col("tc_gpu_time", "TC GPU Time (ns)", "ns", "t.tc_gpu_time", term="tc_kernel_time"),
        Col("non_tc_gpu_time", "Non-TC GPU Time (ns)", "ns", "t.non_tc_gpu_time", term="non_tc_kernel_time"),
        Col("tc_utilization", "TC Utilization (%)", "pct", "t.tc_utilization", term="op_tc_utilization"),
        Col("total_kernel_count", "Total Kernel Count", "int", "t.total_kernel_count", term="kernel_count"),
        Col("tc_kernel_count", "TC Kernel Count", "int", "t.tc_kernel_count"),
        Col("tc_kernel_names", "TC Kernel Names", "text", _names("t.tc_kernel_names")),
        Col("non_tc_kernel_count", "Non-TC Kernel Count", "int", "t.non_tc_kernel_count"),
        Col(
            "non_tc_kernel_names",
            "Non-TC Kernel Names",
            "text",
            _names("t.non_tc_kernel_names"),
        ),
    ]
    return TableQuery(
        "tensor_core",
        cols,
        "tensor_core_summary t JOIN read_only_ops o ON o.op_index = t.op_index",
        aggregation_filters("t"),
        ctx.params(),
        ("total_gpu_time", "desc"),
        "t.rowid",
        key="t.rowid",
        count_source="tensor_core_summary t",
        range=("t", "tensor_core_summary"),
    )


def group_ops_table(ctx, parent: str | None = None) -> TableQuery:
    children = (
        "EXISTS (SELECT 1 FROM group_ops c WHERE c.aggr_id = g.aggr_id AND c.domain_id = g.domain_id "
        "AND c.level = g.level + 1 AND g.level >= 0 AND substr(c.name, 1, length(g.name)) = g.name)"
    )
    cols = [
        Col("name", "Name", "text", "g.name", term="group_name"),
        Col("level", "Level", "int", "g.level", hidden=True),
        Col("num_calls", "Num Calls Aggregated", "int", "g.num_calls"),
        Col("num_ops", "Num Ops", "int", "g.num_ops", hidden=True),
        Col("num_tc_eligible", "Num TC Eligible Ops", "int", "g.num_tc_eligible"),
        Col("num_using_tc", "Num Ops Using TC", "int", "g.num_using_tc"),
    ]
    cols += _op_stats("g", "group_")
    cols.append(
        Col(
            "has_children",
            "Has Children",
            "bool",
            children,
            hidden=True,
            sortable=False,
            filterable=False,
        )
    )
    where = aggregation_filters("g")
    params = ctx.params()
    if parent is not None:
        if parent == "":
            where.append("g.level <= 0")
        else:
            row = ctx.db.query(
                "SELECT level FROM group_ops WHERE aggr_id = ? AND domain_id = ? AND name = ? LIMIT 1",
                (ctx.aggr_id, ctx.domain_id, parent),
            )
            if not row:
                raise NotFound(f"unknown group '{_clip(parent)}'")
            where += ["g.level = :child_level", "substr(g.name, 1, :parent_len) = :parent"]
            params.update(child_level=int(row[0][0]) + 1, parent_len=len(parent), parent=parent)
    return TableQuery(
        "group_ops",
        cols,
        "group_ops g",
        where,
        params,
        ("name", "asc"),
        "g.rowid",
        key="g.rowid",
        range=("g", "group_ops"),
    )


def iterations_table(ctx) -> TableQuery:
    cols = [
        Col("iteration", "Iteration", "int", "s.iter_value"),
        Col("start", "Start (ns)", "ns", "s.start_time", term="iteration_start"),
        Col("end", "End (ns)", "ns", "s.stop_time", term="iteration_end"),
        Col("duration", "Duration (ns)", "ns", "s.duration"),
        Col("aggregated", "Aggregated", "bool", "s.aggregated"),
        Col("kernels", "Kernels", "int", "s.kernels"),
        Col("tc_kernels", "TC Kernels", "int", "s.tc_kernels"),
        Col(
            "kernel_time_per_gpu",
            "Kernel Time per GPU (ns)",
            "ns",
            "s.kernel_time_per_gpu",
        ),
        Col(
            "tc_kernel_time_per_gpu",
            "TC Kernel Time per GPU (ns)",
            "ns",
            "s.tc_kernel_time_per_gpu",
        ),
        Col("tc_time", "TC (ns)", "ns", "s.tc_time", term="busy_tc"),
        Col("non_tc_time", "Non-TC (ns)", "ns", "s.non_tc_time", term="busy_non_tc"),
        Col("memory_time", "Memory (ns)", "ns", "s.memory_time", term="busy_memory"),
        Col("dataloader_time", "Dataloader (ns)", "ns", "s.dataloader_time", term="busy_dataloader"),
        Col("io_time", "I/O (ns)", "ns", "s.io_time", term="busy_io"),
        Col("cpu_time", "CPU (ns)", "ns", "s.cpu_time", term="busy_cpu"),
        Col("other_time", "Other (ns)", "ns", "s.other_time", term="busy_other"),
        Col("gpu_utilization", "GPU Utilization (%)", "pct", "s.gpu_utilization"),
    ]
    return TableQuery(
        "iterations",
        cols,
        "iteration_summary s",
        aggregation_filters("s"),
        ctx.params(),
        ("iteration", "asc"),
        "s.iter_value",
        key="s.rowid",
        range=("s", "iteration_summary"),
        indexed_sorts=("iteration",),
    )


_name = K.string_text  # schema 3.0: the text of a string id


# Launch columns whose SQL differs between the schemas (2.0: read_only_* tables; 3.0: raw tables, names by id)
_LAUNCH_SQL = {
    "2": {
        "kernel_name": "g.name",
        "gpu_duration": 'g."end" - g.start',
        "data_type": "coalesce(d.data_type, o.data_type)",
        "input_shapes": "d.input_shapes",
        "parameters": "d.parameters",
        "output_shapes": "d.output_shapes",
        "long_name": "g.long_name",
    },
    "3": {
        "kernel_name": _name("g.name_id"),
        "gpu_duration": "g.duration",
        "data_type": f"coalesce({_name('d.data_type_id')}, o.data_type)",
        "input_shapes": _name("d.input_shapes_id"),
        "parameters": _name("d.parameters_id"),
        "output_shapes": _name("d.output_shapes_id"),
        "long_name": _name("coalesce(g.long_name_id, g.name_id)"),
    },
}


def _launch_columns(ctx, iteration_sql: str) -> list[Col]:
    sql = _LAUNCH_SQL["3" if ctx.db.v3 else "2"]
    cols = [
        Col("activity_id", "Activity", "int", "g.activity_id", hidden=True),
        Col("iteration", "Iteration", "int", iteration_sql, sortable=False, filterable=False),
        Col("op_index", "Op Index", "int", "i.op_index", hidden=True),
    ]
    cols += op_identity("o", ctx.pytorch)
    cols += [
        Col("kernel_name", "Kernel Name", "text", sql["kernel_name"]),
        Col("device_id", "Device ID", "int", "g.device_id"),
        Col("gpu_start", "GPU Start Time (ns)", "ns", "g.start"),
        Col(
            "gpu_start_offset",
            "GPU Start in Iteration (ns)",
            "ns",
            "g.start - :istart",
        ),
        Col("gpu_duration", "GPU Duration (ns)", "ns", sql["gpu_duration"], term="duration"),
        Col("api_start", "API Call Start (ns)", "ns", "w.launch_time"),
        Col(
            "api_start_offset",
            "API Call Start in Iteration (ns)",
            "ns",
            "w.launch_time - :istart",
        ),
        Col(
            "api_time",
            "API Call Time (ns)",
            "ns",
            "NULL",
            sortable=False,
            filterable=False,
        ),
        Col("uses_tc", "Uses TC", "bool", "coalesce(t.uses_tc, 0)"),
        Col("grid_x", "Grid X", "int", "g.grid_x"),
        Col("grid_y", "Grid Y", "int", "g.grid_y"),
        Col("grid_z", "Grid Z", "int", "g.grid_z"),
        Col("block_x", "Block X", "int", "g.block_x"),
        Col("block_y", "Block Y", "int", "g.block_y"),
        Col("block_z", "Block Z", "int", "g.block_z"),
        Col("data_type", "Data Types", "text", sql["data_type"]),
        Col("input_shapes", "Input Shapes", "text", sql["input_shapes"]),
        Col("parameters", "Parameters", "text", sql["parameters"]),
        Col("output_shapes", "Output Shapes", "text", sql["output_shapes"]),
        Col("long_name", "Long Kernel Name", "text", sql["long_name"]),
        Col("stream_id", "Stream", "int", "g.stream_id", hidden=True),
    ]
    return cols


_LAUNCH_JOINS = (
    "JOIN read_only_ops o ON o.op_index = i.op_index "
    "LEFT JOIN read_only_kernel_tc t ON t.name = g.name AND t.long_name = g.long_name "
    "LEFT JOIN read_only_op_instance_details d ON d.domain_id = i.domain_id "
    "AND d.instance_id = i.instance_id"
)
# Schema 3.0 keys are database-wide (contract.ID_BITS): every join below is a rowid lookup
_LAUNCH_JOINS_V3 = (
    f"JOIN {K.READ_ONLY_OPS} o ON o.op_index = i.op_index "
    f"LEFT JOIN {K.RAW_KERNEL_TC} t ON t.rank = g.rank AND t.name_id = g.name_id "
    "AND t.long_name_id = coalesce(g.long_name_id, g.name_id) "
    f"LEFT JOIN {K.RAW_OP_INSTANCE_DETAILS} d ON d.instance_id = i.instance_id"
)
_OWNER_GPU_V3 = f"CROSS JOIN {K.RAW_GPU_ACTIVITIES} g ON g.activity_id = w.activity_id "


def _api_time_post(ctx):
    """The page filler of the API call column (3.0 finds the calls through the domain's owner rows)."""
    if not ctx.db.v3:
        return fill_api_time
    domain = ctx.domain_id
    return lambda db, rows, columns: fill_api_time(db, rows, columns, domain)


def iteration_kernels_table(ctx, iteration: int, bounds: tuple[int, int]) -> TableQuery:
    # CROSS JOIN: the iteration's launches (index on launch_time) drive the query whatever the filters
    if ctx.db.v3:
        source = (
            f"{K.RAW_ACTIVITY_OWNERS} w {_OWNER_GPU_V3}CROSS JOIN {K.RAW_OP_INSTANCES} i "
            "ON i.instance_id = w.instance_id " + _LAUNCH_JOINS_V3
        )
    else:
        source = (
            "read_only_activity_owners w CROSS JOIN read_only_gpu_activities g ON g.activity_id = w.activity_id "
            "CROSS JOIN read_only_op_instances i ON i.domain_id = w.domain_id AND i.instance_id = w.instance_id "
            + _LAUNCH_JOINS
        )
    where = ["w.domain_id = :domain", "w.launch_time >= :istart", "w.launch_time < :istop", f"g.kind = {KIND_KERNEL}"]
    params = dict(ctx.params(), iteration=iteration, istart=bounds[0], istop=bounds[1])
    params.pop("aggr")
    return TableQuery(
        "iteration_kernels",
        _launch_columns(ctx, ":iteration"),
        source,
        where,
        params,
        ("gpu_start", "asc"),
        "g.activity_id",
        post=_api_time_post(ctx),
        key="g.activity_id",
    )


def iteration_op_kernels_table(ctx, iteration: int, bounds: tuple[int, int], op_index: int) -> TableQuery:
    # CROSS JOIN fixes the loop order: the op's instances in the iteration (index on op_index, start) drive
    # the query; otherwise the planner may scan every activity owner of the domain
    # and the owners are found through their instance index (without statistics the planner prefers a scan of
    # the domain's primary-key range); index names come from sqlite_master, never from the request
    owners, key = (
        (K.RAW_ACTIVITY_OWNERS, ("instance_id",))
        if ctx.db.v3
        else ("read_only_activity_owners", ("domain_id", "instance_id"))
    )
    index = ctx.db.index_on(owners, key)
    indexed = f' INDEXED BY "{index}"' if index and re.fullmatch(r"\w+", index) else ""
    if ctx.db.v3:
        source = (
            f"{K.RAW_OP_INSTANCES} i CROSS JOIN {owners} w{indexed} ON w.instance_id = i.instance_id "
            + _OWNER_GPU_V3
            + _LAUNCH_JOINS_V3
        )
    else:
        source = (
            f"read_only_op_instances i CROSS JOIN {owners} w{indexed} "
            "ON w.domain_id = i.domain_id AND w.instance_id = i.instance_id CROSS JOIN read_only_gpu_activities g "
            "ON g.activity_id = w.activity_id " + _LAUNCH_JOINS
        )
    where = [
        "i.domain_id = :domain",
        "i.op_index = :op_index",
        "i.start >= :istart",
        "i.start < :istop",
        f"g.kind = {KIND_KERNEL}",
    ]
    if ctx.db.v3:
        where.append("i.n_gpu > 0")  # instances with GPU work: the condition of 3.0's index on (domain, op, start)
    params = dict(ctx.params(), iteration=iteration, istart=bounds[0], istop=bounds[1], op_index=op_index)
    params.pop("aggr")
    return TableQuery(
        "iteration_op_kernels",
        _launch_columns(ctx, ":iteration"),
        source,
        where,
        params,
        ("gpu_start", "asc"),
        "g.activity_id",
        post=_api_time_post(ctx),
        key="g.activity_id",
    )


def iteration_ops_table(ctx, iteration: int, bounds: tuple[int, int]) -> TableQuery:
    instances, duration = (
        (K.RAW_OP_INSTANCES, "i.duration") if ctx.db.v3 else ("read_only_op_instances", 'i."end" - i.start')
    )
    source = (
        f"(SELECT i.op_index AS op_index, count(*) AS calls, "
        f"sum(CASE WHEN i.kind = {UNASSOCIATED_GPU} THEN 0 ELSE {duration} END) AS cpu_time, "
        f"sum(i.gpu_time) AS gpu_time, sum(i.cpu_overhead) AS cpu_overhead, sum(i.n_kernels) AS kernels, "
        f"min(i.start) AS first_start FROM {instances} i WHERE i.domain_id = :domain "
        f"AND i.start >= :istart AND i.start < :istop GROUP BY i.op_index) s "
        f"JOIN read_only_ops o ON o.op_index = s.op_index"
    )
    cols = [
        Col("op_index", "Op Index", "int", "s.op_index", hidden=True),
        Col("iteration", "Iteration", "int", ":iteration", sortable=False, filterable=False, hidden=True),
    ]
    cols += op_identity("o", ctx.pytorch)
    cols += [
        Col("tc_eligible", "TC Eligible", "bool", "o.tc_eligible"),
        Col("calls", "Calls", "int", "s.calls", term="calls_in_iteration"),
        Col("cpu_time", "CPU Time (ns)", "ns", "s.cpu_time", term="cpu_time_in_iteration"),
        Col("gpu_time", "GPU Time (ns)", "ns", "s.gpu_time", term="gpu_time_in_iteration"),
        Col("cpu_overhead", "CPU Overhead (ns)", "ns", "s.cpu_overhead", term="cpu_overhead_in_iteration"),
        Col("kernels", "Kernels", "int", "s.kernels", term="kernels_launched"),
        Col("first_start", "First Start (ns)", "ns", "s.first_start", hidden=True),
    ]
    params = dict(ctx.params(), iteration=iteration, istart=bounds[0], istop=bounds[1])
    params.pop("aggr")
    return TableQuery("iteration_ops", cols, source, [], params, ("gpu_time", "desc"), "s.op_index")


def key_nodes_table(ctx, range_source: str) -> TableQuery:
    """Candidate key nodes: every op of the domain and every NVTX range text seen at least twice.
    `range_source` is a SELECT giving (domain_id, text, num) rows."""
    source = (
        "(SELECT 'op' AS kind, op_name AS name, op_id, label, op_type, num_instances AS instances "
        "FROM read_only_ops WHERE domain_id = :domain "
        f"UNION ALL SELECT 'nvtx_range', r.text, NULL, NULL, NULL, r.num FROM ({range_source}) r "
        "WHERE r.domain_id = :domain) k"
    )
    cols = [
        Col("kind", "Kind", "text", "k.kind"),
        Col("name", "Name", "text", "k.name", term="candidate"),
        Col("op_id", "Op ID", "text", "k.op_id"),
        Col("label", "Label", "text", "k.label"),
        Col("op_type", "Op Type", "text", "k.op_type"),
        Col("instances", "Instances", "int", "k.instances"),
    ]
    params = ctx.params()
    params.pop("aggr")
    return TableQuery("key_nodes", cols, source, [], params, ("instances", "desc"), "k.kind, k.name")


SEVERITY_ORDER_SQL = (
    "CASE lower(e.severity) "
    + " ".join(f"WHEN '{k}' THEN {v}" for k, v in K.SEVERITY_ORDER.items())
    + f" ELSE {len(K.SEVERITIES)} END"
)


def expert_systems_table(ctx) -> TableQuery:
    cols = [
        Col("id", "ID", "int", "e.id", hidden=True),
        Col("exp_sys_id", "Detector", "text", "e.exp_sys_id"),
        Col("severity", "Severity", "text", "e.severity", sort_sql=SEVERITY_ORDER_SQL),
        Col("problem", "Problem", "text", "e.problem"),
        Col("recommendation", "Recommendation", "text", "e.recommendation"),
        Col("link", "Link", "text", "e.link", hidden=True),
    ]
    return TableQuery(
        "expert_systems",
        cols,
        "expert_systems_feedback e",
        aggregation_filters("e"),
        ctx.params(),
        ("severity", "asc"),
        "e.id",
        key="e.id",
        range=("e", "expert_systems_feedback"),
    )


# ---------------------------------------------------------------------------- computed columns


def fill_api_time(db, rows: list[list], columns: list[Col], domain: int | None = None) -> None:
    """API call durations of one page of launches. Schema 3.0: the owner rows of the launches (in `domain`)
    name their calls. Schema 2.0: with an index on read_only_cuda_calls(pid, correlation_id) one indexed join;
    without it, each launch's call is found by binary search on api_id, which the engine assigns in start order
    (read_only_activity_owners.launch_time is the call's start)."""
    keys = [c.key for c in columns]
    if "api_time" not in keys or not rows:
        return
    a, t = keys.index("activity_id"), keys.index("api_time")
    ids = [r[a] for r in rows]
    marks = ",".join("?" * len(ids))
    by_id: dict = {}
    with db.snapshot() as con:
        if domain is not None:  # owner rows are keyed (domain_id << ID_BITS) | the activity's own id
            owner_keys = [K.db_id(domain, i & K.ID_MASK) for i in ids]
            by_id = dict(
                con.execute(
                    f"SELECT w.activity_id, c.duration FROM {K.RAW_ACTIVITY_OWNERS} w JOIN {K.RAW_API_CALLS} c "
                    f"ON c.api_id = w.api_id WHERE w.owner_id IN ({marks})",
                    owner_keys,
                ).fetchall()
            )
        elif db.has_index("read_only_cuda_calls", ("pid", "correlation_id")):
            by_id = dict(
                con.execute(
                    f'SELECT g.activity_id, c."end" - c.start FROM read_only_gpu_activities g '
                    f"JOIN read_only_cuda_calls c ON c.pid = g.pid AND c.correlation_id = g.correlation_id "
                    f"WHERE g.activity_id IN ({marks})",
                    ids,
                ).fetchall()
            )
        else:
            launch = {r[a]: r[keys.index("api_start")] for r in rows}
            acts = sorted(
                (
                    (aid, pid, corr, launch.get(aid))
                    for aid, pid, corr in con.execute(
                        f"SELECT activity_id, pid, correlation_id FROM read_only_gpu_activities "
                        f"WHERE activity_id IN ({marks})",
                        ids,
                    ).fetchall()
                ),
                key=lambda x: (x[3] is None, x[3] or 0),
            )
            n = con.execute("SELECT max(api_id) FROM read_only_cuda_calls").fetchone()[0]
            probe = "SELECT start FROM read_only_cuda_calls WHERE api_id = ?"
            near = (
                'SELECT pid, correlation_id, "end" - start FROM read_only_cuda_calls '
                "WHERE api_id >= ? AND api_id < ? AND start = ?"
            )
            lo_bound = 0
            for aid, pid, corr, launch in acts:
                if n is None or launch is None:
                    continue
                lo, hi = lo_bound, n + 1  # first api_id whose start >= launch
                while lo < hi:
                    mid = (lo + hi) // 2
                    row = con.execute(probe, (mid,)).fetchone()
                    if row is not None and row[0] is not None and row[0] < launch:
                        lo = mid + 1
                    else:
                        hi = mid
                lo_bound = lo
                for cpid, ccorr, dur in con.execute(near, (lo, lo + 256, launch)).fetchall():
                    if cpid == pid and ccorr == corr:
                        by_id[aid] = dur
                        break
    for r in rows:
        r[t] = by_id.get(r[a])


# ---------------------------------------------------------------------------- filters and the query

_NUM = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
_UNIT = r"\s*([a-zA-Z\u00b5\u03bc%]+)?"
_CMP = re.compile(rf"^\s*(>=|<=|>|<|=)?\s*({_NUM}){_UNIT}\s*$")
_RANGE = re.compile(rf"^\s*({_NUM}){_UNIT}\s*\.\.\s*({_NUM}){_UNIT}\s*$")
# The units a filter value may carry, as the cells show them: durations (`ns` columns, in ns) and percentages
DURATION_UNITS = {"ns": 1, "us": 1_000, "\u00b5s": 1_000, "\u03bcs": 1_000, "ms": 1_000_000, "s": 1_000_000_000}
FILTER_UNITS = {"ns": DURATION_UNITS, "pct": {"%": 1}}
_GRAMMAR = "N, >N, <N, >=N, <=N or N..M"
_UNIT_HINT = {
    "ns": " with N a duration such as 1.5ms, 500us, 2 s or 800ns (a number alone is in ns)",
    "pct": " with N a percentage (20 or 20%)",
}


def _number(text: str, unit: str | None, col: "Col") -> float | int:
    """A filter's number in the column's stored unit (a duration's unit scales it to ns)."""
    value = Decimal(text)  # exact: 0.1ms is 100000 ns, not 100000.00000000001
    if unit:
        scale = FILTER_UNITS.get(col.type, {}).get(unit.lower() if unit.lower() in DURATION_UNITS else unit)
        if scale is None:
            raise ValueError(unit)
        value *= scale
    if not value.is_finite() or abs(value) > 1e300:
        raise ValueError(text)
    return int(value) if value == value.to_integral_value() and abs(value) < 2**63 else float(value)


def _like(text: str) -> str:
    return "%" + text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def _clip(text: str, n: int = 60) -> str:
    text = str(text)
    return text if len(text) <= n else text[:n] + "..."


def column_filter(col: Col, value: str, name: str, params: dict) -> str:
    """SQL condition (named parameter `name`) for a per-column search."""
    if len(value) > MAX_FILTER_LEN:
        raise BadRequest(f"filter on '{col.key}' is too long")
    if not col.filterable:
        raise BadRequest(f"column '{col.key}' cannot be filtered")
    if col.type in TEXT_TYPES:
        params[name] = _like(value)
        return f"({col.sql}) LIKE :{name} ESCAPE '\\'"
    if col.type == "bool":
        v = value.strip().lower()
        if v in ("1", "yes", "true"):
            return f"coalesce({col.sql}, 0) != 0"
        if v in ("0", "no", "false"):
            return f"coalesce({col.sql}, 0) = 0"
        raise BadRequest(f"filter on '{col.key}' must be yes or no (1 or 0), got '{_clip(value)}'")
    m = _RANGE.match(value)
    try:
        if m:
            lo, hi = _number(m.group(1), m.group(2), col), _number(m.group(3), m.group(4), col)
            params[name + "_lo"], params[name + "_hi"] = lo, hi
            return f"({col.sql}) BETWEEN :{name}_lo AND :{name}_hi"
        m = _CMP.match(value)
        if not m:
            raise ValueError(value)
        params[name] = _number(m.group(2), m.group(3), col)
    except ValueError:
        raise BadRequest(
            f"filter on '{col.key}' must be {_GRAMMAR}{_UNIT_HINT.get(col.type, '')}, got '{_clip(value)}'"
        ) from None
    return f"({col.sql}) {m.group(1) or '='} :{name}"


@dataclass
class Page:
    sort: str
    order: str
    offset: int
    limit: int  # -1: every row
    q: str | None
    filters: dict  # column key -> text


def _only_alias(expr: str, alias: str) -> bool:
    """Whether an SQL expression reads columns of `alias` only (table aliases are one letter)."""
    return set(re.findall(r"\b([a-z])\.", expr)) <= {alias} and "SELECT" not in expr.upper()


def lean_source(tq: TableQuery, page: Page) -> str:
    """The source a page's keys can be found from: the base table alone (count_source) when the sort and
    every filter read only its columns, else the full source."""
    if not tq.count_source:
        return tq.source
    alias = tq.count_source.split()[-1]
    used = [tq.col(page.sort)] + [tq.col(k) for k, v in page.filters.items() if v != ""]
    if page.q:
        used += [c for c in tq.columns if c.type in TEXT_TYPES and c.filterable]
    if all(c is not None and _only_alias(c.sort_sql or c.sql, alias) for c in used):
        return tq.count_source
    return tq.source


def build_conditions(tq: TableQuery, page: Page) -> tuple[list[str], dict]:
    """Filter conditions and their parameters (added to a copy of the table's parameters)."""
    params = dict(tq.params)
    conds = []
    if page.q:
        if len(page.q) > MAX_FILTER_LEN:
            raise BadRequest("search text is too long")
        params["q"] = _like(page.q)
        texts = [c for c in tq.columns if c.type in TEXT_TYPES and c.filterable and c.searchable]
        if texts:
            conds.append("(" + " OR ".join(f"({c.sql}) LIKE :q ESCAPE '\\'" for c in texts) + ")")
        else:
            conds.append("0")
    for i, (key, value) in enumerate(sorted(page.filters.items())):
        col = tq.col(key)
        if col is None:
            raise BadRequest(f"unknown column '{_clip(key)}' for table {tq.name}")
        if value == "":
            continue
        conds.append(column_filter(col, value, f"f{i}", params))
    return conds, params


def order_by(tq: TableQuery, page: Page) -> str:
    col = tq.col(page.sort)
    expr = col.sort_sql or col.sql
    direction = "DESC" if page.order == "desc" else "ASC"
    return f"ORDER BY ({expr}) {direction}, {tq.key or tq.tiebreak}"


def rowid_range(db, tq: TableQuery) -> tuple[int, int]:
    """First and last rowid of the table's rows for this aggregation and domain. The engine inserts them
    together, so they are (nearly) contiguous: a rowid range scan reads them sequentially, where walking an
    (aggr_id, domain_id) index costs one random row lookup each (8x slower at 10^5 rows). The aggr_id and
    domain_id conditions stay, so the answer is right even if the rows were interleaved."""
    alias, table = tq.range
    aggr, domain = tq.params.get("aggr"), tq.params.get("domain")

    def compute():
        lo, hi = db.query(
            f"SELECT min(rowid), max(rowid) FROM {table} WHERE aggr_id = ? AND domain_id = ?", (aggr, domain)
        )[0]
        return (lo if lo is not None else 1, hi if hi is not None else 0)

    return db.cached(("rowid_range", table, aggr, domain), compute)


def run_query(db, tq: TableQuery, page: Page, max_rows: int | None = None) -> dict:
    """One page (or every row when limit is -1) plus total and filtered counts, from one snapshot.

    With a row key, a page is found in two steps: the keys of the page (only the filter and sort columns are
    touched, so the sorter holds two values per row), then the full rows of those keys."""
    conds, params = build_conditions(tq, page)
    base = " AND ".join(tq.where) if tq.where else "1"
    where_all = " AND ".join([base] + conds)
    scan_all = where_all
    if tq.range and (conds or page.sort not in tq.indexed_sorts):
        lo, hi = rowid_range(db, tq)
        alias = tq.range[0]
        ranged = [f"{alias}.rowid BETWEEN :_lo AND :_hi"] + [
            "+" + w if w in (f"{alias}.aggr_id = :aggr", f"{alias}.domain_id = :domain") else w for w in tq.where
        ]
        scan_all = " AND ".join(ranged + conds)
        params.update(_lo=lo, _hi=hi)
    select = ", ".join(f"{c.sql}" for c in tq.columns)
    with db.snapshot() as con:
        total = con.execute(f"SELECT count(*) FROM {tq.count_source or tq.source} WHERE {base}", params).fetchone()[0]
        filtered = (
            total
            if not conds
            else con.execute(f"SELECT count(*) FROM {lean_source(tq, page)} WHERE {scan_all}", params).fetchone()[0]
        )
        where_all = scan_all
        if page.limit < 0 and max_rows is not None and filtered > max_rows:
            raise TooLarge(f"{filtered} rows is more than the {max_rows} an export may hold; filter the table")
        if page.limit == 0 or page.offset >= filtered:
            rows = []
        elif tq.key and page.limit > 0:
            keys = [
                r[0]
                for r in con.execute(
                    f"SELECT {tq.key} FROM {lean_source(tq, page)} WHERE {where_all} {order_by(tq, page)} "
                    f"LIMIT :_limit OFFSET :_offset",
                    dict(params, _limit=page.limit, _offset=page.offset),
                )
            ]
            found = {}
            for i in range(0, len(keys), 500):
                chunk = keys[i : i + 500]
                marks = ", ".join(f":_k{j}" for j in range(len(chunk)))
                for r in con.execute(
                    f"SELECT {select}, {tq.key} FROM {tq.source} WHERE {base} AND {tq.key} IN ({marks})",
                    dict(params, **{f"_k{j}": k for j, k in enumerate(chunk)}),
                ):
                    found[r[-1]] = list(r[:-1])
            rows = [found[k] for k in keys if k in found]
        else:
            sql = f"SELECT {select} FROM {tq.source} WHERE {where_all} {order_by(tq, page)}"
            if page.limit >= 0:
                sql += " LIMIT :_limit OFFSET :_offset"
                params = dict(params, _limit=page.limit, _offset=page.offset)
            rows = [list(r) for r in con.execute(sql, params).fetchall()]
    if tq.post:
        tq.post(db, rows, tq.columns)
    clean_rows(rows, tq.columns)
    return {"total": total, "filtered": filtered, "rows": rows}


def clean_rows(rows: list[list], columns: list[Col]) -> None:
    bools = [i for i, c in enumerate(columns) if c.type == "bool"]
    floats = [i for i, c in enumerate(columns) if c.type in NUMERIC_TYPES]
    for r in rows:
        for i in bools:
            if r[i] is not None:
                r[i] = bool(r[i])
        for i in floats:
            v = r[i]
            if isinstance(v, float) and not math.isfinite(v):
                r[i] = None
