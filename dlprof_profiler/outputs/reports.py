"""Reports in DLProf 1.8's files, sections, columns and value formats (reference/dlprof_outputs.md), as CSV
and JSON: the layout of each report. Values are formatted and written by `report_format`, column by column
and a chunk of rows at a time; the per-launch iteration report is built chunk by chunk from kernel-launch
rows (integer columns and codes into string dictionaries), so it can be streamed in final row order."""

from __future__ import annotations

from contextlib import ExitStack, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from dlprof_profiler import __version__
from dlprof_profiler.outputs import report_format
from dlprof_profiler.engine.aggregate import Aggregation
from dlprof_profiler.engine.correlate import DomainModel
from dlprof_profiler.outputs.atomic import atomic_path
from dlprof_profiler.engine.flops import summary_figures
from dlprof_profiler.engine.memory import NO_EVENTS_TEXT
from dlprof_profiler.outputs.report_format import SectionWriters, Table
from dlprof_profiler.engine.trace import LAUNCH_SHAPE
from dlprof_profiler.experts.base import fmt_time

REPORT_FILES = {
    "summary": "summary",
    "detail": "detailed",
    "iteration": "iteration",
    "kernel": "kernel",
    "tensor": "tensor_core",
    "op_type": "op_type",
    "group_node": "group_op",
    "expert_systems": "expert_systems",
    "memory": "memory",
    "gpu_breakdown": "gpu_breakdown",
    "diff": "diff",
}
SIMPLE_MODE_REPORTS = ("summary", "kernel")

STAT_HEADERS = ["Total {m} (ns)", "Avg. {m} (ns)", "Min {m} (ns)", "Max {m} (ns)"]


@dataclass
class Report:
    name: str
    sections: list[Table] = field(default_factory=list)


def write_report(
    report: Report, out_dir: Path, base_name: str, formats: list[str], suffix: str = "", place=None
) -> list[Path]:
    """Write one report in each format, every format in one pass over the rows; `place(final_path)` gives
    where to write (staging), default a temporary file renamed into place."""
    stem = f"{base_name}_{REPORT_FILES[report.name]}{suffix}"
    finals = {fmt: out_dir / f"{stem}.{fmt}" for fmt in formats}
    with ExitStack() as stack:
        files = {}
        for fmt, final in finals.items():
            target = stack.enter_context(atomic_path(final) if place is None else nullcontext(place(final)))
            files[fmt] = stack.enter_context(open(target, "wb"))
        out = SectionWriters(files, report.name, __version__)
        out.begin()
        for table in report.sections:
            out.table(table)
        out.end()
    return list(finals.values())


def report_paths(out_dir: Path, base_name: str, reports: list[str], formats: list[str], suffix: str = "") -> list[Path]:
    return [out_dir / f"{base_name}_{REPORT_FILES[r]}{suffix}.{f}" for r in reports for f in formats]


# ---------------------------------------------------------------------------- report builders


def _stat_columns(metric: str) -> list[str]:
    return [h.format(m=metric) for h in STAT_HEADERS]


def _stats_data(frame: pd.DataFrame, prefix: str, metric: str) -> dict:
    names = _stat_columns(metric)
    return {
        names[0]: frame[f"{prefix}_total"],
        names[1]: frame[f"{prefix}_avg"],
        names[2]: frame[f"{prefix}_min"],
        names[3]: frame[f"{prefix}_max"],
    }


def aggregation_title(agg: Aggregation) -> str:
    if agg.iter_start == 0 and agg.iter_stop == agg.total_iterations - 1:
        return "All Iterations"
    return f"Iterations {agg.iter_start} to {agg.iter_stop}"


def _framework_text(agg: Aggregation, config: dict) -> str:
    name = {"pytorch": "PyTorch", "tensorflow": "TensorFlow", "tensorrt": "TensorRT"}.get(agg.family or "")
    version = config.get("torch_version") if agg.family in (None, "pytorch") else None
    version = version or config.get("framework_version")
    if version:
        return f"{name or 'PyTorch'} {version}"
    return name or "Unknown"


def _cuda_version(system: dict, config: dict) -> str:
    if config.get("cuda_version"):
        return str(config["cuda_version"])
    raw = str(system.get("CudaDriverVersion", "") or "")
    if raw.isdigit():
        value = int(raw)
        return f"{value // 1000}.{(value % 1000) // 10}"
    return raw or "Unknown"


def driver_version(raw) -> str:
    """NVIDIA's driver version as people write it: nsys stores 515.43.04 as the integer 5154304."""
    text = str(raw or "").strip()
    if text.isdigit() and len(text) >= 5:
        return f"{int(text[:-4])}.{text[-4:-2]}.{text[-2:]}"
    return text or "Unknown"


def cudnn_version(raw) -> str | None:
    """cuDNN's version from torch.backends.cudnn.version() (8902 -> 8.9.2, 90100 -> 9.1.0)."""
    try:
        value = int(raw)
    except (TypeError, ValueError):
        return str(raw) if raw else None
    if value <= 0:
        return None
    if value >= 10000:
        return f"{value // 10000}.{(value % 10000) // 100}.{value % 100}"
    return f"{value // 1000}.{(value % 1000) // 100}.{value % 100}"


def summary_report(
    agg: Aggregation, trace_system: dict, trace_meta: dict, devices: pd.DataFrame, config: dict
) -> Report:
    s = agg.summary
    names = devices["name"].fillna("").astype(str).tolist() if len(devices) else []
    dlprof_info = trace_system.get("dlprof_system_info") or {}  # DLProf 1.8's SystemInfo table, if any
    rows = [
        ("GPU Count", str(len(devices))),
        ("GPU Name(s)", "; ".join(sorted(set(names))) if names else ""),
        ("CPU Model", str(trace_system.get("CpuDescription", "") or "Unknown")),
        ("GPU Driver Version", driver_version(trace_system.get("NvDriverVersion"))),
        ("Framework", _framework_text(agg, config)),
        ("CUDA Version", _cuda_version(trace_system, config)),
    ]
    cudnn = cudnn_version(config.get("cudnn_version"))
    if cudnn:
        rows.append(("cuDNN Version", cudnn))
    rows += [
        ("NSys Version", str(trace_meta.get("nsys_build") or trace_meta.get("nsys_version", "unknown"))),
        ("DLProf Version", f"v{__version__}"),
        ("DLProf Build", f"dlprof_profiler {__version__}"),
    ]
    rows = [
        (label, str(dlprof_info.get(label) or value) if value in ("Unknown", "unknown", "") else value)
        for label, value in rows
    ]
    system = Table(
        "System Config",
        ["name", "value"],
        ["t", "t"],
        {"name": [r[0] for r in rows], "value": [r[1] for r in rows]},
        bare=True,
    )
    pct = s["pct"]
    rates = summary_figures(agg.ops, devices, s["wall_time"], s.get("n_visible_gpus", 0), _amp(config))
    summary = Table(
        "Summary Report",
        ["name", "value"],
        ["t", "t"],
        {
            "name": [
                "Wall Clock Time (ns)",
                "Tensor Core Kernel Utilization %",
                "GPU Utilization %",
                "Tensor Core Kernel Duration %",
                "Non-Tensor Core Kernel Duration %",
                "Memory Duration %",
                "Dataloader Duration %",
                "IO Duration %",
                "CPU Duration %",
                "Other Duration %",
                "Achieved TFLOP/s",
                "Model FLOPs Utilization (%)",
                "Communication Time (ns)",
                "Overlapped Communication %",
            ],
            "value": [str(int(s["wall_time"]))]
            + [
                f"{round(float(v), 1):.1f}"
                for v in (
                    s["tc_utilization"],
                    s["gpu_utilization"],
                    pct["tc"],
                    pct["non_tc"],
                    pct["memory"],
                    pct["dataloader"],
                    pct["io"],
                    pct["cpu"],
                    pct["other"],
                )
            ]
            + [
                "" if rates["achieved_tflops"] is None else f"{rates['achieved_tflops']:.3f}",
                "" if rates["mfu_pct"] is None else f"{round(rates['mfu_pct'], 1):.1f}",
                str(int(s["communication_time"])),
                f"{round(overlapped_communication_pct(s), 1):.1f}",
            ],
        },
        bare=True,
    )
    iterations = Table(
        "Iterations",
        ["name", "value"],
        ["t", "t"],
        {
            "name": [
                "Total Iterations",
                "Aggregated Iterations",
                "Start Iteration",
                "Stop Iteration",
                "Average Iteration Time (ns)",
                "Iteration Time Standard Deviation",
                "Median Iteration Time (ns)",  # ours: over the complete aggregated iterations
            ],
            "value": [
                str(s["total_iterations"]),
                str(s["aggregated_iterations"]),
                str(s["iter_start"]),
                str(s["iter_stop"]),
                f"{round(float(s['avg_iteration_time']), 1):.1f}",
                f"{round(float(s['iteration_std']), 1):.1f}",
                f"{round(float(s['median_iteration_time']), 1):.1f}",
            ],
        },
        bare=True,
    )
    ops = _class_table(
        "All Ops",
        "# Ops",
        s["ops"],
        [
            ("All ops", "all"),
            ("Ops using TC", "using_tc"),
            ("Ops eligible for TC but not using", "eligible_not_using"),
            ("All other ops", "other"),
        ],
    )
    kernels = _class_table(
        "All Kernels",
        "# Kernels",
        s["kernels"],
        [("All kernels", "all"), ("Kernels using TC", "tc"), ("Memory", "memory"), ("All other kernels", "other")],
    )
    for t in (system, summary, iterations):
        t.columns = ["name", "value"]
    return Report("summary", [_headerless(system), _headerless(summary), _headerless(iterations), ops, kernels])


def _class_table(title: str, count_label: str, figures: dict, rows: list) -> Table:
    """The summary's ops or kernels by class: GPU time, CPU time and count per (label, key of `figures`)."""
    keys = [key for _, key in rows]
    return Table(
        title,
        ["", "GPU Time (ns)", "CPU Time (ns)", count_label],
        ["t", "i", "i", "i"],
        {
            "": [label for label, _ in rows],
            "GPU Time (ns)": [figures[k]["gpu_time"] for k in keys],
            "CPU Time (ns)": [figures[k]["cpu_time"] for k in keys],
            count_label: [figures[k]["count"] for k in keys],
        },
        bare=True,
    )


def iteration_headline(s: dict) -> str:
    """The iteration figures a run leads with (the console; docs/DESIGN.md "Iterations"): the median of the
    complete aggregated iterations and their range, the partial ones named, then DLProf's average over all."""
    n, last = int(s["aggregated_iterations"]), int(s["total_iterations"]) - 1
    average = f"average {fmt_time(s['avg_iteration_time'])} over {n} aggregated (wall clock {fmt_time(s['wall_time'])})"
    if not s.get("complete_iterations"):
        why = "two key node instances bound one" if s.get("key_found") else "no key node found"
        return f"{n} iteration(s), none complete ({why}): {average}"
    first, stop = s["complete_start"], s["complete_stop"]
    span = f"iteration {first}" if first == stop else f"iterations {first}..{stop}"
    text = (
        f"Median iteration time {fmt_time(s['median_iteration_time'])} over {s['complete_iterations']} complete {span}"
    )
    # key-node intervals, and a torch capture's steps, are partial at the ends of the run
    bound = "step" if str(s.get("key_node") or "").startswith("ProfilerStep") else "key node"
    partial = [
        f"{i} ({'up to the first' if i == 0 else 'after the last'} {bound})" if i in (0, last) else str(i)
        for i in s.get("partial_iterations") or []
    ]
    if partial:
        text += f"; partial, left out: {', '.join(partial)}"
    return f"{text}; {average}"


def _amp(config: dict) -> bool | None:
    """Whether the run used AMP, as its metadata says (None: unknown)."""
    for key in ("amp_enabled", "autocast"):
        value = (config or {}).get(key)
        if value is not None:
            return value.strip().lower() in ("1", "true", "yes", "on") if isinstance(value, str) else bool(value)
    return None


def _headerless(table: Table) -> Table:
    """Label/value sections have no header line: the title, then `label,value` rows."""
    table.header_prefix = None
    return table


def detailed_report(agg: Aggregation, first_calls=None) -> Report:
    """DLProf 1.8's columns, then Input Shapes (the input shapes of each op's first call: the aggregation's,
    else `first_calls(column, op_index)`: the domain model's `first_call_values`), FLOPs per Call and
    Achieved TFLOP/s (flops.py; blank where unknown)."""
    ops = agg.ops.sort_values("op_id", kind="stable") if len(agg.ops) else agg.ops
    op_index = ops["op_index"] if len(ops) else []
    if "input_shapes" in ops:
        shapes = ops["input_shapes"]
    elif first_calls is not None:
        shapes = first_calls("input_shapes", op_index)
    else:
        shapes = np.full(len(op_index), None, dtype=object)
    columns = (
        ["Op ID", "Op Name", "Direction", "Op Type", "No. Calls", "TC Eligible", "Using TC"]
        + _stat_columns("CPU Time")
        + _stat_columns("GPU Time")
        + _stat_columns("CPU Overhead")
        + _stat_columns("GPU Idle")
        + ["Data Type", "Stack Trace", "Input Shapes", "FLOPs per Call", "Achieved TFLOP/s"]
    )
    formats = ["q", "q", "t", "q", "i", "y", "y"] + ["i", "a", "i", "i"] * 4 + ["t", "q", "q", "n", "r"]
    missing = pd.Series(np.nan, index=ops.index, dtype=np.float64)
    data = {
        "Op ID": ops["op_id"],
        "Op Name": ops["name"],
        "Direction": ops["direction"],
        "Op Type": ops["op_type"],
        "No. Calls": ops["calls"],
        "TC Eligible": ops["tc_eligible"],
        "Using TC": ops["using_tc"],
        **_stats_data(ops, "cpu", "CPU Time"),
        **_stats_data(ops, "gpu", "GPU Time"),
        **_stats_data(ops, "overhead", "CPU Overhead"),
        **_stats_data(ops, "idle", "GPU Idle"),
        "Data Type": ops["data_type"],
        "Stack Trace": ops["stack_trace"],
        "Input Shapes": shapes,
        "FLOPs per Call": ops["flops_per_call"] if "flops_per_call" in ops else missing,
        "Achieved TFLOP/s": ops["achieved_tflops"] if "achieved_tflops" in ops else missing,
    }
    return Report("detail", [Table(aggregation_title(agg), columns, formats, data)])


def _op_columns(frame: pd.DataFrame, ops: pd.DataFrame) -> pd.DataFrame:
    meta = ops.set_index("op_index")[["op_id", "name", "direction", "op_type", "first_start", "data_type"]]
    return frame.join(meta.rename(columns={c: c + "_op" for c in meta.columns if c in frame.columns}), on="op_index")


# ---------------------------------------------------------------------------- the iteration report

ITERATION_COLUMNS = [
    "Iteration",
    "Op ID",
    "Op Name",
    "Direction",
    "Op Type",
    "Kernel Name",
    "Device ID",
    "GPU Start Time (ns)",
    "GPU Duration (ns)",
    "API Call Start (ns)",
    "API Call Time (ns)",
    "Uses TC",
    "Grid X",
    "Grid Y",
    "Grid Z",
    "Block X",
    "Block Y",
    "Block Z",
    "Data Types",
    "Input Shapes",
    "Parameters",
    "Output Shapes",
    "Long Kernel Name",
]
# API Call Start/Time are blank for a kernel without a launching API call (not DLProf's -1 placeholder)
ITERATION_FORMATS = [
    "i",
    "q",
    "q",
    "t",
    "q",
    "q",
    "i",
    "i",
    "i",
    "n",
    "n",
    "y",
    "i",
    "i",
    "i",
    "i",
    "i",
    "i",
    "t",
    "q",
    "q",
    "q",
    "q",
]

# A chunk of kernel-launch rows, one row per kernel launch in report order, every column an integer (or
# bool) array of the chunk's length (NumPy or Arrow):
#   iteration, device_id; gpu_start, gpu_duration (ns); api_start, api_duration (ns, -1 without a launching
#   API call); uses_tc (bool); grid_x .. block_z;
#   codes into LaunchDictionaries (-1 or null = none, written as an empty text): op_index (the op columns),
#   kernel_name, long_kernel_name, and the launching op instance's data_type, input_shapes, parameters,
#   output_shapes.
LAUNCH_CODES = (
    "op_index",
    "kernel_name",
    "long_kernel_name",
    "data_type",
    "input_shapes",
    "parameters",
    "output_shapes",
)
LAUNCH_NUMBERS = (
    "iteration",
    "device_id",
    "gpu_start",
    "gpu_duration",
    "api_start",
    "api_duration",
    "uses_tc",
    *LAUNCH_SHAPE,
)
LAUNCH_COLUMNS = LAUNCH_NUMBERS + LAUNCH_CODES


@dataclass
class LaunchDictionaries:
    """The strings the codes of kernel-launch rows point into (Arrow string arrays; several fields may be
    the same array, e.g. one string table of the engine). Op fields are indexed by op_index."""

    op_id: pa.Array
    op_name: pa.Array
    direction: pa.Array
    op_type: pa.Array
    kernel_name: pa.Array
    long_kernel_name: pa.Array
    data_type: pa.Array
    input_shapes: pa.Array
    parameters: pa.Array
    output_shapes: pa.Array


def _codes_array(values) -> pa.Array:
    """Arrow indices for codes where -1 (or any negative, or null) means none."""
    if isinstance(values, (pa.Array, pa.ChunkedArray)):
        values = pc.fill_null(values, -1).to_numpy(zero_copy_only=False)
    codes = np.asarray(values).astype(np.int64, copy=False)
    negative = codes < 0
    return pa.array(codes, mask=negative if negative.any() else None)


def _without_launch_call(values) -> pa.Array:
    """API times with -1 (no launching API call) as missing."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    ints = values.to_numpy(zero_copy_only=False) if isinstance(values, pa.Array) else np.asarray(values)
    ints = np.asarray(ints).astype(np.int64, copy=False)
    missing = ints < 0
    return pa.array(ints, mask=missing if missing.any() else None)


def launch_report_columns(chunk, dicts: LaunchDictionaries) -> dict:
    """One chunk of kernel-launch rows (a dict of arrays or an Arrow RecordBatch with LAUNCH_COLUMNS, in
    report row order) -> the iteration report's columns: numbers as given, text as dictionary arrays over
    the shared dictionaries (the four op columns share one indices array: formatted once per op)."""
    if isinstance(chunk, pa.RecordBatch):
        chunk = {name: chunk.column(name) for name in chunk.schema.names}
    missing = [c for c in LAUNCH_COLUMNS if c not in chunk]
    if missing:
        raise KeyError(f"kernel-launch chunk without column(s) {missing}")

    def coded(indices: pa.Array, dictionary: pa.Array) -> pa.DictionaryArray:
        return pa.DictionaryArray.from_arrays(indices, dictionary)

    op = _codes_array(chunk["op_index"])
    text = {c: _codes_array(chunk[c]) for c in LAUNCH_CODES if c != "op_index"}
    return {
        "Iteration": chunk["iteration"],
        "Op ID": coded(op, dicts.op_id),
        "Op Name": coded(op, dicts.op_name),
        "Direction": coded(op, dicts.direction),
        "Op Type": coded(op, dicts.op_type),
        "Kernel Name": coded(text["kernel_name"], dicts.kernel_name),
        "Device ID": chunk["device_id"],
        "GPU Start Time (ns)": chunk["gpu_start"],
        "GPU Duration (ns)": chunk["gpu_duration"],
        "API Call Start (ns)": _without_launch_call(chunk["api_start"]),
        "API Call Time (ns)": _without_launch_call(chunk["api_duration"]),
        "Uses TC": chunk["uses_tc"],
        "Grid X": chunk["grid_x"],
        "Grid Y": chunk["grid_y"],
        "Grid Z": chunk["grid_z"],
        "Block X": chunk["block_x"],
        "Block Y": chunk["block_y"],
        "Block Z": chunk["block_z"],
        "Data Types": coded(text["data_type"], dicts.data_type),
        "Input Shapes": coded(text["input_shapes"], dicts.input_shapes),
        "Parameters": coded(text["parameters"], dicts.parameters),
        "Output Shapes": coded(text["output_shapes"], dicts.output_shapes),
        "Long Kernel Name": coded(text["long_kernel_name"], dicts.long_kernel_name),
    }


def iteration_report_from_chunks(chunks, dicts: LaunchDictionaries) -> Report:
    """The iteration report streamed from kernel-launch chunks already in report row order (iteration, op
    first start, kernel name, GPU start). `chunks`: an iterable of chunks, or a function returning one
    (then the report can be written more than once)."""

    def report_chunks():
        source = chunks() if callable(chunks) else chunks
        return (launch_report_columns(chunk, dicts) for chunk in source)

    return Report(
        "iteration",
        [
            Table(
                "Iteration Report",
                ITERATION_COLUMNS,
                ITERATION_FORMATS,
                chunks=report_chunks if callable(chunks) else report_chunks(),
            )
        ],
    )


def _string_array(values) -> pa.Array:
    """Arrow strings of an object array (None/NaN -> null; other non-strings -> their text)."""
    s = pd.Series(values, dtype=object)
    s = s.where(s.notna(), None)
    if pd.api.types.infer_dtype(s.to_numpy(dtype=object), skipna=True) not in ("string", "empty"):
        s = s.map(lambda v: v if v is None else str(v))
    return pa.array(s.to_numpy(dtype=object), type=pa.string(), from_pandas=True)


def _by_position(index: np.ndarray, values: np.ndarray, size: int) -> np.ndarray:
    out = np.full(size, None, dtype=object)
    out[index] = values
    return out


def launch_rows(agg: Aggregation, instances: pd.DataFrame, ops: pd.DataFrame, gpu: pd.DataFrame):
    """Today's frames -> (LaunchDictionaries, number of launch rows, rows_between(lo, hi) giving the
    kernel-launch chunk of rows lo..hi in report order). Rows are ordered by iteration, the op's first start,
    the kernel name and the GPU start, ties in launch order; chunks are taken from the frames when asked."""
    launches = agg.kernel_launches
    n_ops = int(ops["op_index"].max()) + 1 if len(ops) else 0
    names = gpu["name"].cat.categories.to_numpy(dtype=object) if len(gpu) else np.zeros(0, dtype=object)
    long_names = gpu["long_name"].cat.categories.to_numpy(dtype=object) if len(gpu) else np.zeros(0, dtype=object)
    by_launch = {}  # per launch row, in launch order
    by_activity = {}  # per gpu activity row
    instance_text = {}
    order = np.zeros(0, dtype=np.int64)
    activity = np.zeros(0, dtype=np.int64)
    if len(launches):
        activity = launches["activity_id"].to_numpy(np.int64)  # the gpu row of each launch
        inst = launches["instance"].to_numpy(np.int64)
        for c in ("data_type", "input_shapes", "parameters", "output_shapes"):
            codes, instance_text[c] = pd.factorize(instances[c].to_numpy(dtype=object)[inst], use_na_sentinel=True)
            by_launch[c] = codes.astype(np.int64)
        by_activity["long_kernel_name"] = gpu["long_name"].cat.codes.to_numpy(np.int64)
        for c in LAUNCH_SHAPE:
            by_activity[c] = gpu[c].to_numpy()
        by_launch["kernel_name"] = launches["name_code"].to_numpy(np.int64)
        for c in (
            "iteration",
            "op_index",
            "device_id",
            "gpu_start",
            "gpu_duration",
            "api_start",
            "api_duration",
            "uses_tc",
        ):
            by_launch[c] = launches[c].to_numpy()
        order = _report_order(by_launch, ops, n_ops, names)
    dicts = launch_dictionaries(
        ops,
        names,
        long_names,
        {
            c: instance_text.get(c, np.zeros(0, dtype=object))
            for c in ("data_type", "input_shapes", "parameters", "output_shapes")
        },
    )

    def rows_between(lo: int, hi: int) -> dict:
        take = order[lo:hi]
        rows = activity[take]
        return {**{c: v[take] for c, v in by_launch.items()}, **{c: v[rows] for c, v in by_activity.items()}}

    return dicts, order.size, rows_between


def launch_dictionaries(ops: pd.DataFrame, kernel_names, long_kernel_names, instance_text: dict) -> LaunchDictionaries:
    """The dictionaries of kernel-launch rows: op fields by op_index, kernel names and the launching instances'
    data_type, input_shapes, parameters and output_shapes by their codes."""
    n_ops = int(ops["op_index"].max()) + 1 if len(ops) else 0
    op_pos = ops["op_index"].to_numpy(np.int64)

    def op_field(column):
        return _string_array(_by_position(op_pos, ops[column].to_numpy(dtype=object), n_ops))

    return LaunchDictionaries(
        op_id=op_field("op_id"),
        op_name=op_field("name"),
        direction=op_field("direction"),
        op_type=op_field("op_type"),
        kernel_name=_string_array(kernel_names),
        long_kernel_name=_string_array(long_kernel_names),
        **{c: _string_array(v) for c, v in instance_text.items()},
    )


def _report_order(columns: dict, ops: pd.DataFrame, n_ops: int, names: np.ndarray) -> np.ndarray:
    """Launch rows by iteration, op first start, kernel name (as text), GPU start; stable."""
    first_start = np.full(n_ops, np.iinfo(np.int64).max, dtype=np.int64)  # ops without a row sort last
    first_start[ops["op_index"].to_numpy(np.int64)] = ops["first_start"].to_numpy(np.int64)
    op_rank = np.unique(first_start, return_inverse=True)[1].reshape(-1)  # equal starts, equal ranks
    name_rank = np.empty(len(names), dtype=np.int64)
    name_rank[np.argsort(names, kind="stable")] = np.arange(len(names))
    return launch_order(
        columns["iteration"], op_rank[columns["op_index"]], name_rank[columns["kernel_name"]], columns["gpu_start"]
    )


def launch_order(iteration, op_rank, name_rank, gpu_start) -> np.ndarray:
    """The stable order of launch rows by iteration, op rank, kernel name rank, then GPU start (ties keep the
    given order): the first three as one mixed-radix key where it fits, a two-key sort instead of four."""
    if len(gpu_start) == 0:
        return np.zeros(0, dtype=np.int64)
    keys = [np.asarray(k).astype(np.int64, copy=False) for k in (iteration, op_rank, name_rank)]
    keys = [k - k.min() for k in keys]
    sizes = [int(k.max()) + 1 for k in keys]
    if sizes[0] * sizes[1] * sizes[2] < 2**62:
        return np.lexsort((gpu_start, (keys[0] * sizes[1] + keys[1]) * sizes[2] + keys[2]))
    return np.lexsort((gpu_start, keys[2], keys[1], keys[0]))


def iteration_report(agg: Aggregation, instances: pd.DataFrame, ops: pd.DataFrame, gpu: pd.DataFrame) -> Report:
    """One row per kernel launch of the aggregation, streamed: the launch rows are ordered when the report
    is written, then formatted a chunk at a time."""

    def chunks():
        dicts, n, rows_between = launch_rows(agg, instances, ops, gpu)
        step = report_format.CHUNK_ROWS
        for lo in range(0, n, step):
            yield launch_report_columns(rows_between(lo, lo + step), dicts)

    return Report("iteration", [Table("Iteration Report", ITERATION_COLUMNS, ITERATION_FORMATS, chunks=chunks)])


def kernel_report(agg: Aggregation, ops: pd.DataFrame) -> Report:
    k = agg.kernels
    columns = [
        "Kernel Name",
        "Op ID",
        "Op Name",
        "Direction",
        "Uses TC",
        "Total GPU Time (ns)",
        "Avg GPU Time (ns)",
        "Min GPU Time (ns)",
        "Max GPU Time (ns)",
        "Total API Time (ns)",
        "Avg API Time (ns)",
        "Min API Time (ns)",
        "Max API Time (ns)",
    ]
    # API figures are blank for kernels no API call launched (0 would read as an instant launch)
    formats = ["q", "q", "q", "t", "y", "i", "a", "i", "i", "n", "m", "n", "n"]
    if len(k):
        k = _op_columns(k, ops).sort_values(["first_start_op", "name", "first_start"], kind="stable")
        if "api_count" in k:
            none = k["api_count"].to_numpy() == 0
            if none.any():
                k = k.copy()
                for c in ("api_total", "api_avg", "api_min", "api_max"):
                    k[c] = k[c].astype(np.float64).where(~none, np.nan)
    data = {
        "Kernel Name": k.get("name", []),
        "Op ID": k.get("op_id", []),
        "Op Name": k.get("name_op", []),
        "Direction": k.get("direction", []),
        "Uses TC": k.get("uses_tc", []),
        "Total GPU Time (ns)": k.get("gpu_total", []),
        "Avg GPU Time (ns)": k.get("gpu_avg", []),
        "Min GPU Time (ns)": k.get("gpu_min", []),
        "Max GPU Time (ns)": k.get("gpu_max", []),
        "Total API Time (ns)": k.get("api_total", []),
        "Avg API Time (ns)": k.get("api_avg", []),
        "Min API Time (ns)": k.get("api_min", []),
        "Max API Time (ns)": k.get("api_max", []),
    }
    return Report("kernel", [Table("Kernel Report", columns, formats, data)])


def tensor_core_report(agg: Aggregation) -> Report:
    t = agg.tensor_core
    columns = [
        "Op ID",
        "Op Name",
        "Direction",
        "Op Type",
        "Uses TC",
        "Total GPU Time (ns)",
        "TC GPU Time (ns)",
        "Non-TC GPU Time (ns)",
        "TC Utilization (%)",
        "Total Kernel Count",
        "TC Kernel Count",
        "TC Kernel Names",
        "Non-TC Kernel Count",
        "Non-TC Kernel Names",
    ]
    formats = ["q", "q", "t", "q", "y", "i", "i", "i", "p", "i", "i", "q", "i", "q"]
    data = {
        "Op ID": t["op_id"],
        "Op Name": t["name"],
        "Direction": t["direction"],
        "Op Type": t["op_type"],
        "Uses TC": t["using_tc"],
        "Total GPU Time (ns)": t["total_gpu_time"],
        "TC GPU Time (ns)": t["tc_gpu_time"],
        "Non-TC GPU Time (ns)": t["non_tc_gpu_time"],
        "TC Utilization (%)": t["tc_utilization"],
        "Total Kernel Count": t["total_kernel_count"],
        "TC Kernel Count": t["tc_kernel_count"],
        "TC Kernel Names": t["tc_kernel_names"].map(", ".join) if len(t) else [],
        "Non-TC Kernel Count": t["non_tc_kernel_count"],
        "Non-TC Kernel Names": t["non_tc_kernel_names"].map(", ".join) if len(t) else [],
    }
    return Report("tensor", [Table("Tensor Core Report", columns, formats, data)])


def op_type_report(agg: Aggregation) -> Report:
    t = agg.op_types
    columns = (
        ["Op Type", "# Ops", "# Calls"]
        + _stat_columns("CPU Time")
        + _stat_columns("GPU Time")
        + _stat_columns("CPU Overhead")
        + _stat_columns("GPU Idle")
    )
    formats = ["q", "i", "i"] + ["i", "a", "i", "i"] * 4
    data = {
        "Op Type": t["op_type"],
        "# Ops": t["n_ops"],
        "# Calls": t["calls"],
        **_stats_data(t, "cpu", "CPU Time"),
        **_stats_data(t, "gpu", "GPU Time"),
        **_stats_data(t, "overhead", "CPU Overhead"),
        **_stats_data(t, "idle", "GPU Idle"),
    }
    return Report("op_type", [Table("Op Type Summary Report", columns, formats, data)])


def group_op_report(agg: Aggregation) -> Report:
    g = agg.groups
    columns = (
        ["Name", "Num Calls Aggregated", "Num TC Eligible Ops", "Num Ops Using TC"]
        + _stat_columns("CPU Time")
        + _stat_columns("GPU Time")
        + _stat_columns("CPU Overhead")
        + _stat_columns("GPU Idle")
    )
    formats = ["q", "i", "i", "i"] + ["i", "a", "i", "i"] * 4
    if len(g) == 0:
        data = {c: [] for c in columns}
    else:
        data = {
            "Name": g["name"],
            "Num Calls Aggregated": g["calls"],
            "Num TC Eligible Ops": g["n_tc_eligible"],
            "Num Ops Using TC": g["n_using_tc"],
            **_stats_data(g, "cpu", "CPU Time"),
            **_stats_data(g, "gpu", "GPU Time"),
            **_stats_data(g, "overhead", "CPU Overhead"),
            **_stats_data(g, "idle", "GPU Idle"),
        }
    return Report("group_node", [Table("Group Op Report", columns, formats, data)])


def expert_systems_report(findings: list[dict]) -> Report:
    data = {
        "Problem": [f.get("problem", "") for f in findings],
        "Recommendation": [f.get("recommendation", "") for f in findings],
    }
    return Report("expert_systems", [Table("Expert Systems Feedback", ["Problem", "Recommendation"], ["q", "q"], data)])


# ---------------------------------------------------------------------------- the memory report

MEMORY_DEVICE_COLUMNS = [
    "Device",
    "Peak Allocated (bytes)",
    "Peak Reserved (bytes)",
    "Allocated at End (bytes)",
    "Allocations",
    "Frees",
]
MEMORY_OP_COLUMNS = [
    "Op ID",
    "Op Name",
    "Direction",
    "Device",
    "No. Calls",
    "Allocations",
    "Frees",
    "Bytes Allocated",
    "Bytes Freed",
    "Peak Allocated (bytes)",
]


def memory_report(agg: Aggregation) -> Report:
    """`dlprof_memory`: per device its peak allocated and reserved memory, what is allocated at the end and
    the allocations and frees, then per op and device the allocations and frees during its calls and the
    device's peak during them, in the aggregated iterations (memory.py; DESIGN.md "Memory"). Without memory
    events, one row says so and how to record them."""
    tables = agg.memory
    devices = tables.devices if tables is not None and tables.recorded else None
    if devices is None:
        device_data = {c: [None] for c in MEMORY_DEVICE_COLUMNS}
        device_data["Device"] = [NO_EVENTS_TEXT]
    else:
        device_data = {
            "Device": devices["device"],
            "Peak Allocated (bytes)": devices["peak_allocated"],
            "Peak Reserved (bytes)": devices["peak_reserved"],
            "Allocated at End (bytes)": devices["allocated_at_end"],
            "Allocations": devices["allocations"],
            "Frees": devices["frees"],
        }
    device_table = Table("Devices", MEMORY_DEVICE_COLUMNS, ["q", "n", "n", "n", "n", "n"], device_data)
    ops = tables.ops if tables is not None and tables.recorded else None
    if ops is None or len(ops) == 0:
        op_data = {c: [] for c in MEMORY_OP_COLUMNS}
    else:
        meta = agg.ops.set_index("op_index")[["op_id", "name", "direction", "calls"]]
        rows = ops.join(meta, on="op_index")
        op_data = {
            "Op ID": rows["op_id"],
            "Op Name": rows["name"],
            "Direction": rows["direction"],
            "Device": rows["device"],
            "No. Calls": rows["calls"],
            "Allocations": rows["allocations"],
            "Frees": rows["frees"],
            "Bytes Allocated": rows["bytes_allocated"],
            "Bytes Freed": rows["bytes_freed"],
            "Peak Allocated (bytes)": rows["peak_allocated"],
        }
    op_table = Table("Ops", MEMORY_OP_COLUMNS, ["q", "q", "t", "q", "i", "i", "i", "i", "i", "i"], op_data)
    return Report("memory", [device_table, op_table])


# ---------------------------------------------------------------------------- the GPU time breakdown report

BREAKDOWN_GPU_COLUMNS = [
    "Device",
    "Computation Busy (ns)",
    "Communication Busy (ns)",
    "Memory Busy (ns)",
    "GPU Busy (ns)",
    "GPU Idle (ns)",
    "Overlapped Communication (ns)",
    "Overlapped Communication %",
    "Idle Host Wait (ns)",
    "Idle Kernel Wait (ns)",
    "Idle Other (ns)",
]
BREAKDOWN_ITERATION_COLUMNS = [
    "Iteration",
    "Duration (ns)",
    "Computation Busy (ns)",
    "Communication Busy (ns)",
    "Memory Busy (ns)",
    "GPU Idle (ns)",
    "Overlapped Communication (ns)",
]
BREAKDOWN_STREAM_COLUMNS = [
    "Device",
    "Stream",
    "Busy (ns)",
    "Idle (ns)",
    "Idle Host Wait (ns)",
    "Idle Kernel Wait (ns)",
    "Idle Other (ns)",
]
BREAKDOWN_LAUNCH_COLUMNS = [
    "Kernel Name",
    "Launches",
    "Mean Launch Delay (ns)",
    "P50 Launch Delay (ns)",
    "P95 Launch Delay (ns)",
    "Short Kernels",
]


def overlapped_communication_pct(summary: dict) -> float:
    """The share of the communication time a compute kernel overlaps (0 without communication)."""
    comm = int(summary.get("communication_time", 0))
    return 100.0 * int(summary.get("overlapped_communication_time", 0)) / comm if comm else 0.0


def gpu_breakdown_report(agg: Aggregation) -> Report:
    """`dlprof_gpu_breakdown`: per GPU used the busy time of computation, communication and memory operations,
    idle time and its split, the overlapped communication; per iteration the same averaged over the GPUs used;
    per stream its idle split; per kernel name its launch delays (breakdowns.py, DESIGN.md "GPU time
    breakdowns")."""
    dev = agg.devices[agg.devices["used"]] if len(agg.devices) else agg.devices
    gb = agg.gpu_breakdowns
    idle = gb["gpus"].set_index("device_id").reindex(dev["device_id"].to_numpy(), fill_value=0)
    comm = dev["communication_busy"].to_numpy(np.float64)
    gpus = Table(
        "GPUs",
        BREAKDOWN_GPU_COLUMNS,
        ["i"] * 7 + ["p"] + ["i"] * 3,
        {
            "Device": dev["device_id"],
            "Computation Busy (ns)": dev["computation_busy"],
            "Communication Busy (ns)": dev["communication_busy"],
            "Memory Busy (ns)": dev["memory_busy"],
            "GPU Busy (ns)": dev["gpu_busy"],
            "GPU Idle (ns)": dev["gpu_idle_time"],
            "Overlapped Communication (ns)": dev["overlapped_communication_busy"],
            "Overlapped Communication %": np.divide(
                100.0 * dev["overlapped_communication_busy"].to_numpy(np.float64),
                comm,
                out=np.zeros(comm.size),
                where=comm > 0,
            ),
            "Idle Host Wait (ns)": idle["host_wait"].to_numpy(),
            "Idle Kernel Wait (ns)": idle["kernel_wait"].to_numpy(),
            "Idle Other (ns)": idle["other_wait"].to_numpy(),
        },
    )
    # per iteration, averaged over the GPUs used: none without one
    it = agg.iterations[agg.iterations["aggregated"] & (len(dev) > 0)]
    iterations = Table(
        "Iterations",
        BREAKDOWN_ITERATION_COLUMNS,
        ["i", "i"] + ["a"] * 5,  # averages over the GPUs used: one decimal
        {
            "Iteration": it["iteration"],
            "Duration (ns)": it["duration"],
            "Computation Busy (ns)": it["computation_busy"],
            "Communication Busy (ns)": it["communication_busy"],
            "Memory Busy (ns)": it["memory_busy"],
            "GPU Idle (ns)": it["gpu_idle_time"],
            "Overlapped Communication (ns)": it["overlapped_communication_busy"],
        },
    )
    st = gb["streams"]
    streams = Table(
        "Streams",
        BREAKDOWN_STREAM_COLUMNS,
        ["i"] * len(BREAKDOWN_STREAM_COLUMNS),
        {
            "Device": st["device_id"],
            "Stream": st["stream_id"],
            "Busy (ns)": st["busy"],
            "Idle (ns)": st["idle"],
            "Idle Host Wait (ns)": st["host_wait"],
            "Idle Kernel Wait (ns)": st["kernel_wait"],
            "Idle Other (ns)": st["other_wait"],
        },
    )
    ld = gb["launches"]
    launches = Table(
        "Launch Delay",
        BREAKDOWN_LAUNCH_COLUMNS,
        ["q", "i", "a", "a", "a", "i"],
        {
            "Kernel Name": ld["name"],
            "Launches": ld["launches"],
            "Mean Launch Delay (ns)": ld["mean"],
            "P50 Launch Delay (ns)": ld["p50"],
            "P95 Launch Delay (ns)": ld["p95"],
            "Short Kernels": ld["short_kernels"],
        },
    )
    return Report("gpu_breakdown", [gpus, iterations, streams, launches])


# ---------------------------------------------------------------------------- the diff report


def _figure_text(value, kind: str) -> str:
    if value is None or (isinstance(value, float) and not np.isfinite(value)):
        return ""
    if kind == "int":
        return str(int(value))
    return f"{round(float(value), 1):.1f}"


DIFF_COMPARED = [
    "Present In",
    "No. Calls",
    "Baseline No. Calls",
    "GPU Time (ns)",
    "Baseline GPU Time (ns)",
    "Delta GPU Time (ns)",
    "Delta GPU Time %",
]
DIFF_COMPARED_FORMATS = ["t", "i", "i", "i", "i", "i", "m"]


def _compared_data(frame: pd.DataFrame) -> dict:
    return {
        "Present In": frame["presence"],
        "No. Calls": frame["calls"],
        "Baseline No. Calls": frame["baseline_calls"],
        "GPU Time (ns)": frame["gpu_time"],
        "Baseline GPU Time (ns)": frame["baseline_gpu_time"],
        "Delta GPU Time (ns)": frame["delta"],
        "Delta GPU Time %": frame["delta_pct"],
    }


def diff_report(comparison) -> Report:
    """`dlprof_diff`: the compared profiles, the headline figures before / after / delta, then per op (name,
    direction) and per kernel name the GPU time of both sides and its change, largest change first
    (compare.Comparison; the Compare view shows the same rows)."""
    after, base = comparison.after, comparison.baseline
    compared = Table(
        "Compared Profiles",
        ["", "Baseline", "After"],
        ["t", "t", "t"],
        {
            "": ["Profile", "Key Node", "Iterations"],
            "Baseline": [base.label, base.key_node or "(none found)", base.iterations_text()],
            "After": [after.label, after.key_node or "(none found)", after.iterations_text()],
        },
        bare=True,
    )
    s = comparison.summary
    kinds = s["kind"].tolist()
    summary = Table(
        "Diff Summary",
        ["", "Baseline", "After", "Delta"],
        ["t", "t", "t", "t"],
        {
            "": s["label"].tolist(),
            "Baseline": [_figure_text(v, k) for v, k in zip(s["baseline"].tolist(), kinds)],
            "After": [_figure_text(v, k) for v, k in zip(s["after"].tolist(), kinds)],
            "Delta": [_figure_text(v, k) for v, k in zip(s["delta"].tolist(), kinds)],
        },
        bare=True,
    )
    ops = comparison.ops
    op_table = Table(
        "Op Diff",
        ["Op Name", "Direction", "Op Type"] + DIFF_COMPARED,
        ["q", "t", "q"] + DIFF_COMPARED_FORMATS,
        {"Op Name": ops["name"], "Direction": ops["direction"], "Op Type": ops["op_type"], **_compared_data(ops)},
    )
    k = comparison.kernels
    kernel_table = Table(
        "Kernel Diff",
        ["Kernel Name", "Uses TC"] + DIFF_COMPARED,
        ["q", "y"] + DIFF_COMPARED_FORMATS,
        {"Kernel Name": k["name"], "Uses TC": k["uses_tc"], **_compared_data(k)},
    )
    return Report("diff", [compared, summary, op_table, kernel_table])


def build_reports(names: list[str], agg: Aggregation, dm, trace, config: dict, findings: list[dict]) -> list[Report]:
    """The requested reports of one aggregation of one domain."""
    builders = {
        "summary": lambda: summary_report(agg, trace.system, trace.meta, trace.devices, config),
        "detail": lambda: detailed_report(agg, first_calls=dm.first_call_values),
        # a model kept out of core (store.model.StoreDomainModel) streams its spilled launch rows itself
        "iteration": lambda: (
            iteration_report(agg, dm.instances, dm.ops, trace.gpu)
            if isinstance(dm, DomainModel)
            else dm.iteration_report(agg)
        ),
        "kernel": lambda: kernel_report(agg, dm.ops),
        "tensor": lambda: tensor_core_report(agg),
        "op_type": lambda: op_type_report(agg),
        "group_node": lambda: group_op_report(agg),
        "expert_systems": lambda: expert_systems_report(findings),
        "memory": lambda: memory_report(agg),
        "gpu_breakdown": lambda: gpu_breakdown_report(agg),
    }
    return [builders[n]() for n in names]
