"""Reports in DLProf 1.8's files, sections, columns and value formats (reference/dlprof_outputs.md), as CSV
and JSON. Tables are formatted column by column, never row by row in Python."""
from __future__ import annotations

import json
import re
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from dlprof_profiler import __version__
from dlprof_profiler.aggregate import Aggregation, with_launch_details
from dlprof_profiler.atomic import atomic_path

REPORT_FILES = {
    "summary": "summary", "detail": "detailed", "iteration": "iteration", "kernel": "kernel",
    "tensor": "tensor_core", "op_type": "op_type", "group_node": "group_op", "expert_systems": "expert_systems",
}
SIMPLE_MODE_REPORTS = ("summary", "kernel")

# Column formats: q = always-quoted text, t = bare text (quoted only when CSV needs it), i = integer,
# a = average (one decimal), p = percentage (one decimal), y = yes/no.
STAT_HEADERS = ["Total {m} (ns)", "Avg. {m} (ns)", "Min {m} (ns)", "Max {m} (ns)"]


@dataclass
class Table:
    title: str
    columns: list[str]
    formats: list[str]
    data: dict                        # column name -> array-like
    header_prefix: str = ""           # the summary's `,GPU Time (ns),...` headers start with an empty cell
    bare: bool = False                # summary: nothing quoted

    @property
    def n_rows(self) -> int:
        return len(next(iter(self.data.values()))) if self.data else 0


@dataclass
class Report:
    name: str
    sections: list[Table] = field(default_factory=list)


# ---------------------------------------------------------------------------- value formatting

_NEEDS_QUOTES = re.compile(r'[",\n\r]')


def _quote(values: pd.Series) -> pd.Series:
    return '"' + values.str.replace('"', '""', regex=False) + '"'


def _format_column(values, fmt: str, bare: bool) -> pd.Series:
    s = pd.Series(values).reset_index(drop=True)
    if fmt == "i":
        out = pd.Series(pd.to_numeric(s, errors="coerce").fillna(0).round().astype(np.int64).astype(str))
    elif fmt in ("a", "p"):
        nums = pd.to_numeric(s, errors="coerce").fillna(0.0).astype(np.float64).round(1)
        out = nums.map("{:.1f}".format)
    elif fmt == "y":
        out = pd.Series(np.where(s.fillna(False).astype(bool).to_numpy(), "yes", "no"))
    else:
        text = s.astype(object).where(s.notna(), "").astype(str)
        if fmt == "q" and not bare:
            out = _quote(text)
        else:
            needs = text.str.contains(_NEEDS_QUOTES)
            out = text.where(~needs, _quote(text))
    return out.astype(object)


CHUNK_ROWS = 100_000  # rows formatted at a time: a per-launch report of 10^6 rows stays in bounded memory


def _slice(table: Table, lo: int, hi: int) -> dict:
    return {c: pd.Series(table.data[c]).iloc[lo:hi] for c in table.columns}


def write_table_csv(fh, table: Table) -> None:
    """One titled section; rows are formatted column-wise, a chunk of rows at a time."""
    fh.write(table.title + "\n")
    if table.header_prefix is not None:
        fh.write(table.header_prefix + ",".join(_format_column(pd.Series(table.columns, dtype=object), "t", True))
                 + "\n")
    for lo in range(0, table.n_rows, CHUNK_ROWS):
        data = _slice(table, lo, lo + CHUNK_ROWS)
        cols = [_format_column(data[c], f, table.bare) for c, f in zip(table.columns, table.formats)]
        joined = cols[0]
        for col in cols[1:]:
            joined = joined + "," + col
        fh.write("\n".join(joined.tolist()) + "\n")


def _json_value_column(values, fmt: str) -> list:
    s = pd.Series(values).reset_index(drop=True)
    if fmt == "i":
        return pd.to_numeric(s, errors="coerce").fillna(0).round().astype(np.int64).tolist()
    if fmt in ("a", "p"):
        return pd.to_numeric(s, errors="coerce").fillna(0.0).astype(np.float64).round(1).tolist()
    if fmt == "y":
        return np.where(s.fillna(False).astype(bool).to_numpy(), "yes", "no").tolist()
    return s.astype(object).where(s.notna(), "").astype(str).tolist()


def write_table_json(fh, table: Table) -> None:
    """{"title", "columns", "rows"} with the rows streamed a chunk at a time."""
    fh.write('{"title": ' + json.dumps(table.title) + ', "columns": ' + json.dumps(table.columns)
             + ', "rows": [')
    first = True
    for lo in range(0, table.n_rows, CHUNK_ROWS):
        data = _slice(table, lo, lo + CHUNK_ROWS)
        cols = [_json_value_column(data[c], f) for c, f in zip(table.columns, table.formats)]
        rows = json.dumps(list(zip(*cols)), default=_json_default)[1:-1]  # tuples dump as arrays, in C
        if rows:
            fh.write(("" if first else ",") + rows)
            first = False
    fh.write("]}")


def write_report(report: Report, out_dir: Path, base_name: str, formats: list[str], suffix: str = "",
                 place=None) -> list[Path]:
    """Write one report in each format; `place(final_path)` gives where to write (staging), default in place."""
    stem = f"{base_name}_{REPORT_FILES[report.name]}{suffix}"
    written = []
    for fmt in formats:
        final = out_dir / f"{stem}.{fmt}"
        target_ctx = atomic_path(final) if place is None else nullcontext(place(final))
        with target_ctx as target, open(target, "w", encoding="utf-8", newline="") as fh:
            if fmt == "csv":
                for i, table in enumerate(report.sections):
                    if i:
                        fh.write("\n")
                    write_table_csv(fh, table)
            else:
                fh.write('{"report": ' + json.dumps(report.name) + ', "dlprof_version": '
                         + json.dumps(__version__) + ', "sections": [')
                for i, table in enumerate(report.sections):
                    if i:
                        fh.write(",\n")
                    write_table_json(fh, table)
                fh.write("]}\n")
        written.append(final)
    return written


def _json_default(value):
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return float(value)
    return str(value)


def report_paths(out_dir: Path, base_name: str, reports: list[str], formats: list[str], suffix: str = "") -> list[Path]:
    return [out_dir / f"{base_name}_{REPORT_FILES[r]}{suffix}.{f}" for r in reports for f in formats]


# ---------------------------------------------------------------------------- report builders

def _stat_columns(metric: str) -> list[str]:
    return [h.format(m=metric) for h in STAT_HEADERS]


def _stats_data(frame: pd.DataFrame, prefix: str, metric: str) -> dict:
    names = _stat_columns(metric)
    return {names[0]: frame[f"{prefix}_total"], names[1]: frame[f"{prefix}_avg"],
            names[2]: frame[f"{prefix}_min"], names[3]: frame[f"{prefix}_max"]}


def aggregation_title(agg: Aggregation) -> str:
    if agg.iter_start == 0 and agg.iter_stop == agg.total_iterations - 1:
        return "All Iterations"
    return f"Iterations {agg.iter_start} to {agg.iter_stop}"


def _framework_text(agg: Aggregation, config: dict) -> str:
    if config.get("torch_version"):
        return f"PyTorch {config['torch_version']}"
    return {"pytorch": "PyTorch", "tensorflow": "TensorFlow", "tensorrt": "TensorRT"}.get(agg.family or "",
                                                                                          "Unknown")


def _cuda_version(system: dict, config: dict) -> str:
    if config.get("cuda_version"):
        return str(config["cuda_version"])
    raw = str(system.get("CudaDriverVersion", "") or "")
    if raw.isdigit():
        value = int(raw)
        return f"{value // 1000}.{(value % 1000) // 10}"
    return raw or "Unknown"


def summary_report(agg: Aggregation, trace_system: dict, trace_meta: dict, devices: pd.DataFrame,
                   config: dict) -> Report:
    s = agg.summary
    names = devices["name"].fillna("").astype(str).tolist() if len(devices) else []
    system = Table("System Config", ["name", "value"], ["t", "t"], {
        "name": ["GPU Count", "GPU Name(s)", "CPU Model", "GPU Driver Version", "Framework", "CUDA Version",
                 "NSys Version", "DLProf Version", "DLProf Build"],
        "value": [str(len(devices)), "; ".join(sorted(set(names))) if names else "",
                  str(trace_system.get("CpuDescription", "") or "Unknown"),
                  str(trace_system.get("NvDriverVersion", "") or "Unknown"), _framework_text(agg, config),
                  _cuda_version(trace_system, config), str(trace_meta.get("nsys_version", "unknown")),
                  f"v{__version__}", f"dlprof_profiler {__version__}"]}, bare=True)
    pct = s["pct"]
    summary = Table("Summary Report", ["name", "value"], ["t", "t"], {
        "name": ["Wall Clock Time (ns)", "Tensor Core Kernel Utilization %", "GPU Utilization %",
                 "Tensor Core Kernel Duration %", "Non-Tensor Core Kernel Duration %", "Memory Duration %",
                 "Dataloader Duration %", "IO Duration %", "CPU Duration %", "Other Duration %"],
        "value": [str(int(s["wall_time"]))] + [f"{round(float(v), 1):.1f}" for v in (
            s["tc_utilization"], s["gpu_utilization"], pct["tc"], pct["non_tc"], pct["memory"], pct["dataloader"],
            pct["io"], pct["cpu"], pct["other"])]}, bare=True)
    iterations = Table("Iterations", ["name", "value"], ["t", "t"], {
        "name": ["Total Iterations", "Aggregated Iterations", "Start Iteration", "Stop Iteration",
                 "Average Iteration Time (ns)", "Iteration Time Standard Deviation"],
        "value": [str(s["total_iterations"]), str(s["aggregated_iterations"]), str(s["iter_start"]),
                  str(s["iter_stop"]), f"{round(float(s['avg_iteration_time']), 1):.1f}",
                  f"{round(float(s['iteration_std']), 1):.1f}"]}, bare=True)
    o = s["ops"]
    ops = Table("All Ops", ["", "GPU Time (ns)", "CPU Time (ns)", "# Ops"], ["t", "i", "i", "i"], {
        "": ["All ops", "Ops using TC", "Ops eligible for TC but not using", "All other ops"],
        "GPU Time (ns)": [o[k]["gpu_time"] for k in ("all", "using_tc", "eligible_not_using", "other")],
        "CPU Time (ns)": [o[k]["cpu_time"] for k in ("all", "using_tc", "eligible_not_using", "other")],
        "# Ops": [o[k]["count"] for k in ("all", "using_tc", "eligible_not_using", "other")]}, bare=True)
    k = s["kernels"]
    kernels = Table("All Kernels", ["", "GPU Time (ns)", "CPU Time (ns)", "# Kernels"], ["t", "i", "i", "i"], {
        "": ["All kernels", "Kernels using TC", "Memory", "All other kernels"],
        "GPU Time (ns)": [k[x]["gpu_time"] for x in ("all", "tc", "memory", "other")],
        "CPU Time (ns)": [k[x]["cpu_time"] for x in ("all", "tc", "memory", "other")],
        "# Kernels": [k[x]["count"] for x in ("all", "tc", "memory", "other")]}, bare=True)
    for t in (system, summary, iterations):
        t.columns = ["name", "value"]
    return Report("summary", [_headerless(system), _headerless(summary), _headerless(iterations), ops, kernels])


def _headerless(table: Table) -> Table:
    """Label/value sections have no header line: the title, then `label,value` rows."""
    table.header_prefix = None
    return table


def detailed_report(agg: Aggregation, instances: pd.DataFrame | None = None) -> Report:
    """DLProf 1.8's columns, then Input Shapes (the input shapes of each op's first call; needs `instances`)."""
    ops = agg.ops.sort_values("op_id", kind="stable") if len(agg.ops) else agg.ops
    columns = (["Op ID", "Op Name", "Direction", "Op Type", "No. Calls", "TC Eligible", "Using TC"]
               + _stat_columns("CPU Time") + _stat_columns("GPU Time") + _stat_columns("CPU Overhead")
               + _stat_columns("GPU Idle") + ["Data Type", "Stack Trace", "Input Shapes"])
    formats = ["q", "q", "t", "q", "i", "y", "y"] + ["i", "a", "i", "i"] * 4 + ["t", "q", "q"]
    data = {"Op ID": ops["op_id"], "Op Name": ops["name"], "Direction": ops["direction"],
            "Op Type": ops["op_type"], "No. Calls": ops["calls"], "TC Eligible": ops["tc_eligible"],
            "Using TC": ops["using_tc"], **_stats_data(ops, "cpu", "CPU Time"), **_stats_data(ops, "gpu", "GPU Time"),
            **_stats_data(ops, "overhead", "CPU Overhead"), **_stats_data(ops, "idle", "GPU Idle"),
            "Data Type": ops["data_type"], "Stack Trace": ops["stack_trace"],
            "Input Shapes": first_call_values(instances, "input_shapes", ops["op_index"] if len(ops) else [])}
    return Report("detail", [Table(aggregation_title(agg), columns, formats, data)])


def first_call_values(instances: pd.DataFrame | None, column: str, op_index) -> np.ndarray:
    """Per op of `op_index`, `column` of its first call (earliest start, then lowest instance id); None where
    the op has no instance or the call has no value."""
    op_index = np.asarray(op_index, dtype=np.int64)
    out = np.full(op_index.size, None, dtype=object)
    if instances is None or len(instances) == 0 or column not in instances or op_index.size == 0:
        return out
    ops = instances["op_index"].to_numpy(np.int64)
    order = np.lexsort((instances["instance_id"].to_numpy(np.int64), instances["start"].to_numpy(np.int64)))
    ops_in_order = ops[order]
    first_of_op, first_pos = np.unique(ops_in_order, return_index=True)  # unique keeps the first occurrence
    values = instances[column].to_numpy(dtype=object)[order[first_pos]]
    where = np.searchsorted(first_of_op, op_index)
    found = (where < first_of_op.size) & (first_of_op[np.minimum(where, first_of_op.size - 1)] == op_index)
    out[found] = values[where[found]]
    return out


def _op_columns(frame: pd.DataFrame, ops: pd.DataFrame) -> pd.DataFrame:
    meta = ops.set_index("op_index")[["op_id", "name", "direction", "op_type", "first_start", "data_type"]]
    return frame.join(meta, on="op_index", rsuffix="_op")


def iteration_report(agg: Aggregation, instances: pd.DataFrame, ops: pd.DataFrame, gpu: pd.DataFrame) -> Report:
    k = with_launch_details(agg.kernel_launches, gpu) if len(agg.kernel_launches) else agg.kernel_launches
    columns = ["Iteration", "Op ID", "Op Name", "Direction", "Op Type", "Kernel Name", "Device ID",
               "GPU Start Time (ns)", "GPU Duration (ns)", "API Call Start (ns)", "API Call Time (ns)", "Uses TC",
               "Grid X", "Grid Y", "Grid Z", "Block X", "Block Y", "Block Z", "Data Types", "Input Shapes",
               "Parameters", "Output Shapes", "Long Kernel Name"]
    formats = ["i", "q", "q", "t", "q", "q", "i", "i", "i", "i", "i", "y", "i", "i", "i", "i", "i", "i", "t", "q",
               "q", "q", "q"]
    if len(k):
        k = _op_columns(k, ops)
        inst = instances[["data_type", "input_shapes", "parameters", "output_shapes"]]
        k = k.join(inst, on="instance", rsuffix="_inst")
        k = k.sort_values(["iteration", "first_start", "name", "gpu_start"], kind="stable")
    data = {"Iteration": k["iteration"] if len(k) else [], "Op ID": k.get("op_id", []), "Op Name": k.get("name_op", []),
            "Direction": k.get("direction", []), "Op Type": k.get("op_type", []), "Kernel Name": k.get("name", []),
            "Device ID": k.get("device_id", []), "GPU Start Time (ns)": k.get("gpu_start", []),
            "GPU Duration (ns)": k.get("gpu_duration", []), "API Call Start (ns)": k.get("api_start", []),
            "API Call Time (ns)": k.get("api_duration", []), "Uses TC": k.get("uses_tc", []),
            "Grid X": k.get("grid_x", []), "Grid Y": k.get("grid_y", []), "Grid Z": k.get("grid_z", []),
            "Block X": k.get("block_x", []), "Block Y": k.get("block_y", []), "Block Z": k.get("block_z", []),
            "Data Types": k.get("data_type_inst", []), "Input Shapes": k.get("input_shapes", []),
            "Parameters": k.get("parameters", []), "Output Shapes": k.get("output_shapes", []),
            "Long Kernel Name": k.get("long_name", [])}
    return Report("iteration", [Table("Iteration Report", columns, formats, data)])


def kernel_report(agg: Aggregation, ops: pd.DataFrame) -> Report:
    k = agg.kernels
    columns = ["Kernel Name", "Op ID", "Op Name", "Direction", "Uses TC", "Total GPU Time (ns)", "Avg GPU Time (ns)",
               "Min GPU Time (ns)", "Max GPU Time (ns)", "Total API Time (ns)", "Avg API Time (ns)",
               "Min API Time (ns)", "Max API Time (ns)"]
    formats = ["q", "q", "q", "t", "y", "i", "a", "i", "i", "i", "a", "i", "i"]
    if len(k):
        k = _op_columns(k, ops).sort_values(["first_start_op", "name", "first_start"], kind="stable")
    data = {"Kernel Name": k.get("name", []), "Op ID": k.get("op_id", []), "Op Name": k.get("name_op", []),
            "Direction": k.get("direction", []), "Uses TC": k.get("uses_tc", []),
            "Total GPU Time (ns)": k.get("gpu_total", []), "Avg GPU Time (ns)": k.get("gpu_avg", []),
            "Min GPU Time (ns)": k.get("gpu_min", []), "Max GPU Time (ns)": k.get("gpu_max", []),
            "Total API Time (ns)": k.get("api_total", []), "Avg API Time (ns)": k.get("api_avg", []),
            "Min API Time (ns)": k.get("api_min", []), "Max API Time (ns)": k.get("api_max", [])}
    return Report("kernel", [Table("Kernel Report", columns, formats, data)])


def tensor_core_report(agg: Aggregation) -> Report:
    t = agg.tensor_core
    columns = ["Op ID", "Op Name", "Direction", "Op Type", "Uses TC", "Total GPU Time (ns)", "TC GPU Time (ns)",
               "Non-TC GPU Time (ns)", "TC Utilization (%)", "Total Kernel Count", "TC Kernel Count",
               "TC Kernel Names", "Non-TC Kernel Count", "Non-TC Kernel Names"]
    formats = ["q", "q", "t", "q", "y", "i", "i", "i", "p", "i", "i", "q", "i", "q"]
    data = {"Op ID": t["op_id"], "Op Name": t["name"], "Direction": t["direction"], "Op Type": t["op_type"],
            "Uses TC": t["using_tc"], "Total GPU Time (ns)": t["total_gpu_time"],
            "TC GPU Time (ns)": t["tc_gpu_time"], "Non-TC GPU Time (ns)": t["non_tc_gpu_time"],
            "TC Utilization (%)": t["tc_utilization"], "Total Kernel Count": t["total_kernel_count"],
            "TC Kernel Count": t["tc_kernel_count"],
            "TC Kernel Names": t["tc_kernel_names"].map(", ".join) if len(t) else [],
            "Non-TC Kernel Count": t["non_tc_kernel_count"],
            "Non-TC Kernel Names": t["non_tc_kernel_names"].map(", ".join) if len(t) else []}
    return Report("tensor", [Table("Tensor Core Report", columns, formats, data)])


def op_type_report(agg: Aggregation) -> Report:
    t = agg.op_types
    columns = (["Op Type", "# Ops", "# Calls"] + _stat_columns("CPU Time") + _stat_columns("GPU Time")
               + _stat_columns("CPU Overhead") + _stat_columns("GPU Idle"))
    formats = ["q", "i", "i"] + ["i", "a", "i", "i"] * 4
    data = {"Op Type": t["op_type"], "# Ops": t["n_ops"], "# Calls": t["calls"],
            **_stats_data(t, "cpu", "CPU Time"), **_stats_data(t, "gpu", "GPU Time"),
            **_stats_data(t, "overhead", "CPU Overhead"), **_stats_data(t, "idle", "GPU Idle")}
    return Report("op_type", [Table("Op Type Summary Report", columns, formats, data)])


def group_op_report(agg: Aggregation) -> Report:
    g = agg.groups
    columns = (["Name", "Num Calls Aggregated", "Num TC Eligible Ops", "Num Ops Using TC"]
               + _stat_columns("CPU Time") + _stat_columns("GPU Time") + _stat_columns("CPU Overhead")
               + _stat_columns("GPU Idle"))
    formats = ["q", "i", "i", "i"] + ["i", "a", "i", "i"] * 4
    if len(g) == 0:
        data = {c: [] for c in columns}
    else:
        data = {"Name": g["name"], "Num Calls Aggregated": g["calls"], "Num TC Eligible Ops": g["n_tc_eligible"],
                "Num Ops Using TC": g["n_using_tc"], **_stats_data(g, "cpu", "CPU Time"),
                **_stats_data(g, "gpu", "GPU Time"), **_stats_data(g, "overhead", "CPU Overhead"),
                **_stats_data(g, "idle", "GPU Idle")}
    return Report("group_node", [Table("Group Op Report", columns, formats, data)])


def expert_systems_report(findings: list[dict]) -> Report:
    data = {"Problem": [f.get("problem", "") for f in findings],
            "Recommendation": [f.get("recommendation", "") for f in findings]}
    return Report("expert_systems", [Table("Expert Systems Feedback", ["Problem", "Recommendation"], ["q", "q"], data)])


def build_reports(names: list[str], agg: Aggregation, dm, trace, config: dict, findings: list[dict]) -> list[Report]:
    """The requested reports of one aggregation of one domain."""
    builders = {
        "summary": lambda: summary_report(agg, trace.system, trace.meta, trace.devices, config),
        "detail": lambda: detailed_report(agg, dm.instances),
        "iteration": lambda: iteration_report(agg, dm.instances, dm.ops, trace.gpu),
        "kernel": lambda: kernel_report(agg, dm.ops),
        "tensor": lambda: tensor_core_report(agg),
        "op_type": lambda: op_type_report(agg),
        "group_node": lambda: group_op_report(agg),
        "expert_systems": lambda: expert_systems_report(findings),
    }
    return [builders[n]() for n in names]
