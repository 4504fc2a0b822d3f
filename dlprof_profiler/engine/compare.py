"""Compare two aggregations (a run against a baseline): per op (name, direction) and per kernel name, the GPU
time of each side and its change, and the change of the headline figures. Pure functions over frames: the
engine feeds them an `Aggregation` (the diff report), the viewer plugin the same figures read back from the two
databases' derived tables (its Compare view), so the report and the view cannot disagree.

Rows present on one side only are kept, with 0 calls and 0 GPU time on the other side and `presence` naming
the side that has them. Several ops with the same (name, direction), e.g. the same layer in two processes or
the n-th calls of an unassociated API, are one row: their calls and GPU times are summed. So the op deltas add
up exactly to the change of the total op GPU time (the summary's "All ops" GPU time), and the kernel deltas to
the change of the total compute-kernel time (docs/DESIGN.md, "Comparing with a baseline").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

OP_KEY = ["name", "direction"]
KERNEL_KEY = ["name"]
# one row per op / kernel name: what each side brings
OP_INPUT = ["name", "direction", "op_type", "calls", "gpu_time"]
KERNEL_INPUT = ["name", "uses_tc", "calls", "gpu_time"]
BOTH, AFTER_ONLY, BASELINE_ONLY = "both", "after only", "baseline only"
COMPARED = ["presence", "calls", "baseline_calls", "gpu_time", "baseline_gpu_time", "delta", "delta_pct"]
OP_COLUMNS = ["name", "direction", "op_type"] + COMPARED
KERNEL_COLUMNS = ["name", "uses_tc"] + COMPARED
# the headline figures, in the order shown: (key, label, kind) with kind int (ns or count), avg (ns, one
# decimal) or pct (percent, one decimal)
SUMMARY_ROWS = [
    ("avg_iteration_time", "Average Iteration Time (ns)", "avg"),
    ("gpu_utilization", "GPU Utilization %", "pct"),
    ("total_gpu_time", "Total GPU Time (ns)", "int"),
    ("kernel_gpu_time", "Kernel GPU Time (ns)", "int"),
    ("wall_time", "Wall Clock Time (ns)", "int"),
    ("aggregated_iterations", "Aggregated Iterations", "int"),
    ("tc_utilization", "Tensor Core Kernel Utilization %", "pct"),
]


# the headline figures each side brings (its two totals come from its rows), and their types
SIDE_FIGURES = {
    "avg_iteration_time": float,
    "gpu_utilization": float,
    "wall_time": int,
    "aggregated_iterations": int,
    "tc_utilization": float,
}


def side_figures(values) -> dict:
    """The SIDE_FIGURES of a mapping that holds them under their keys (a missing one is None)."""
    return {k: None if values.get(k) is None else cast(values[k]) for k, cast in SIDE_FIGURES.items()}


@dataclass
class Side:
    """What one aggregation brings to a comparison."""

    ops: pd.DataFrame  # OP_INPUT, one row per op (names may repeat)
    kernels: pd.DataFrame  # KERNEL_INPUT, one row per (kernel name, op) or per kernel name
    figures: dict  # avg_iteration_time, gpu_utilization, wall_time, aggregated_iterations, tc_utilization
    label: str = ""  # what it is (a file, a run and aggregation), for the report's header
    key_node: str = ""  # the key node that split it into iterations ("" when none was found)
    iterations: tuple = ()  # (first, last) aggregated iteration and the number of iterations of the profile

    def iterations_text(self) -> str:
        if len(self.iterations) != 3:
            return ""
        first, last, total = self.iterations
        return f"{first} to {last} of {total}"


@dataclass
class Comparison:
    ops: pd.DataFrame  # OP_COLUMNS, sorted by the absolute change, largest first
    kernels: pd.DataFrame  # KERNEL_COLUMNS, same order
    summary: pd.DataFrame  # key, label, kind, baseline, after, delta (SUMMARY_ROWS order)
    after: Side
    baseline: Side


def side_from_aggregation(agg, label: str = "") -> Side:
    """The figures of an engine Aggregation (agg.ops per op, agg.kernels per (kernel name, op))."""
    ops = agg.ops
    kernels = agg.kernels
    s = agg.summary
    op_frame = pd.DataFrame(
        {
            "name": ops["name"].to_numpy(dtype=object) if len(ops) else [],
            "direction": ops["direction"].to_numpy(dtype=object) if len(ops) else [],
            "op_type": ops["op_type"].to_numpy(dtype=object) if len(ops) else [],
            "calls": ops["calls"].to_numpy(np.int64) if len(ops) else np.zeros(0, np.int64),
            "gpu_time": ops["gpu_total"].to_numpy(np.int64) if len(ops) else np.zeros(0, np.int64),
        }
    )
    has_kernels = len(kernels) and "gpu_total" in kernels
    kernel_frame = pd.DataFrame(
        {
            "name": kernels["name"].to_numpy(dtype=object) if has_kernels else [],
            "uses_tc": kernels["uses_tc"].to_numpy(dtype=bool) if has_kernels else np.zeros(0, bool),
            "calls": kernels["count"].to_numpy(np.int64) if has_kernels else np.zeros(0, np.int64),
            "gpu_time": kernels["gpu_total"].to_numpy(np.int64) if has_kernels else np.zeros(0, np.int64),
        }
    )
    return Side(
        op_frame,
        kernel_frame,
        side_figures(s),
        label,
        agg.key_node if agg.key_found else "",
        (int(agg.iter_start), int(agg.iter_stop), int(agg.total_iterations)),
    )


def _normalized(frame: pd.DataFrame, columns: list[str], text: list[str]) -> pd.DataFrame:
    out = (
        pd.DataFrame({c: frame[c] for c in columns})
        if len(frame)
        else pd.DataFrame({c: pd.Series(dtype=object if c in text else np.int64) for c in columns})
    )
    for c in text:  # a missing direction (non-PyTorch ops) is the empty text on both sides
        out[c] = out[c].where(out[c].notna(), "").astype(str) if len(out) else out[c].astype(object)
    out["calls"] = out["calls"].fillna(0).astype(np.int64)
    out["gpu_time"] = out["gpu_time"].fillna(0).astype(np.int64)
    return out


def _join(after: pd.DataFrame, baseline: pd.DataFrame, key: list[str], first: dict) -> pd.DataFrame:
    """Outer join of per-key sums; `first`: other columns and how both sides combine into one value."""
    sums = {"calls": "sum", "gpu_time": "sum", **first}
    a = after.groupby(key, sort=False).agg(sums)
    b = baseline.groupby(key, sort=False).agg(sums)
    joined = a.merge(b, how="outer", left_index=True, right_index=True, suffixes=("", "_b"))
    in_a = joined["gpu_time"].notna().to_numpy()
    in_b = joined["gpu_time_b"].notna().to_numpy()
    out = pd.DataFrame(index=joined.index)
    for c, how in first.items():  # the after side's value, else the baseline's (flags: either side's)
        left, right = joined[c], joined[c + "_b"]
        if how == "any":
            out[c] = left.fillna(False).astype(bool) | right.fillna(False).astype(bool)
        else:
            out[c] = left.where(in_a, right)
    out["presence"] = np.where(in_a & in_b, BOTH, np.where(in_a, AFTER_ONLY, BASELINE_ONLY))
    out["calls"] = joined["calls"].fillna(0).astype(np.int64)
    out["baseline_calls"] = joined["calls_b"].fillna(0).astype(np.int64)
    out["gpu_time"] = joined["gpu_time"].fillna(0).astype(np.int64)
    out["baseline_gpu_time"] = joined["gpu_time_b"].fillna(0).astype(np.int64)
    out["delta"] = out["gpu_time"] - out["baseline_gpu_time"]
    base = out["baseline_gpu_time"].to_numpy(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        out["delta_pct"] = np.where(base > 0, 100.0 * out["delta"].to_numpy(np.float64) / base, np.nan)
    out = out.reset_index()
    # largest absolute change first; ties by the key, so the order is the same everywhere
    out["_order"] = -np.abs(out["delta"].to_numpy(np.int64))
    return out.sort_values(["_order"] + key, kind="stable").drop(columns="_order").reset_index(drop=True)


def compare_ops(after: pd.DataFrame, baseline: pd.DataFrame) -> pd.DataFrame:
    """Per (op name, direction): calls and GPU time after and in the baseline, their change (after -
    baseline) and the change in % of the baseline (NaN when the baseline has none). OP_COLUMNS."""
    a = _normalized(after, OP_INPUT, ["name", "direction", "op_type"])
    b = _normalized(baseline, OP_INPUT, ["name", "direction", "op_type"])
    return _join(a, b, OP_KEY, {"op_type": "first"})[OP_COLUMNS]


def compare_kernels(after: pd.DataFrame, baseline: pd.DataFrame) -> pd.DataFrame:
    """Per kernel name (over every op launching it): launches and GPU time after and in the baseline, their
    change and the change in %. KERNEL_COLUMNS."""
    a = _normalized(after, KERNEL_INPUT, ["name"])
    b = _normalized(baseline, KERNEL_INPUT, ["name"])
    for frame in (a, b):
        frame["uses_tc"] = frame["uses_tc"].fillna(False).astype(bool) if len(frame) else frame["uses_tc"]
    return _join(a, b, KERNEL_KEY, {"uses_tc": "any"})[KERNEL_COLUMNS]


def figures(side: Side) -> dict:
    """The headline figures of one side; the two totals are the sums of its op and kernel rows."""
    out = dict(side.figures)
    out["total_gpu_time"] = int(side.ops["gpu_time"].fillna(0).astype(np.int64).sum()) if len(side.ops) else 0
    out["kernel_gpu_time"] = int(side.kernels["gpu_time"].fillna(0).astype(np.int64).sum()) if len(side.kernels) else 0
    return out


def compare_summary(after: Side, baseline: Side) -> pd.DataFrame:
    """The headline figures of both sides and their change (after - baseline), in SUMMARY_ROWS order."""
    fa, fb = figures(after), figures(baseline)
    rows = []
    for key, label, kind in SUMMARY_ROWS:
        a, b = fa.get(key), fb.get(key)
        delta = None if a is None or b is None else a - b
        rows.append({"key": key, "label": label, "kind": kind, "baseline": b, "after": a, "delta": delta})
    return pd.DataFrame(rows, columns=["key", "label", "kind", "baseline", "after", "delta"], dtype=object)


def compare(after: Side, baseline: Side) -> Comparison:
    """Everything the diff report and the Compare view show."""
    return Comparison(
        ops=compare_ops(after.ops, baseline.ops),
        kernels=compare_kernels(after.kernels, baseline.kernels),
        summary=compare_summary(after, baseline),
        after=after,
        baseline=baseline,
    )
