"""Iteration detectors: the key node was not found; the aggregated range holds warm-up or tail iterations."""

from __future__ import annotations

import re
import shlex

import numpy as np
import pandas as pd

from dlprof_profiler.engine import markers as nm
from dlprof_profiler.engine.correlate import UNASSOCIATED_API, UNASSOCIATED_GPU
from dlprof_profiler.experts.base import DLPROF_GUIDE, Context, finding, fmt_time

# bad_iteration_range_detector: an iteration is steady when its duration is within a factor STEADY_FACTOR of
# the median duration of the aggregated iterations that are complete (key-node intervals: iteration 0 and
# the last, partial ones, are left out of the median when others remain; steps are all complete).
# Iteration-to-iteration jitter of a training loop is a few percent; warm-up iterations (cuDNN autotuning,
# allocator growth, lazy initialisation) take 2x and more, and the first and last key-node intervals also
# hold the program's start-up and tear-down.
STEADY_FACTOR = 1.25
MIN_ITERATIONS = 3  # fewer iterations: no median to judge by

# no_iterations_detector: proposed key nodes are range labels repeated at least this often.
CANDIDATE_MIN_COUNT = 2
_COUNTER = re.compile(r"#\d+$")
_OP_LIKE = re.compile(r"::|Backward\d*$|_backward$")
_STEP_LIKE = re.compile(r"step|iter|batch|train", re.IGNORECASE)


def _command(iterations, **options) -> str:
    parts = ["dlprof", "--database=<db>"]
    if iterations is not None and iterations.source == "user" and iterations.key_node:
        parts.append(f"--key_op={shlex.quote(iterations.key_node)}")
    for name, value in options.items():
        if name == "key_node":
            parts.append(f"--key_op={shlex.quote(str(value))}")
        else:
            parts += [f"--{name}", str(value)]
    return " ".join(parts)


def no_iterations_detector(ctx: Context) -> list[dict]:
    """Inputs: Iterations.found and key_node; NVTX range labels (to propose candidates).
    Fires when no key node instance was found (the whole profile is one iteration)."""
    it = ctx.iterations
    if it.found:
        return []
    key = it.key_node or ""
    candidates = key_node_candidates(ctx)
    recommendation = "Specify key op by setting the --key_op argument"
    action = None
    if candidates:
        listed = ", ".join(f"{c['name']} ({c['count']} times)" for c in candidates)
        first = candidates[0]
        recommendation += (
            f"; ranges repeated in this profile: {listed}: --key_op={shlex.quote(first['name'])} would split the "
            f"run at its {first['count']:,} ranges"
        )
        action = {
            "type": "reaggregate",
            "key_node": first["name"],
            "command": _command(None, key_node=first["name"]),
        }
    else:
        recommendation += (
            "; no NVTX range of this profile repeats as a training step would: put each step in a range of its "
            "own (an NVTX range, torch.profiler's prof.step()"
            + (", or the optimizer's step, the PyTorch default" if ctx.is_pytorch else "")
            + ") and give its text as --key_op"
        )
    recommendation += _why_so_many_ops(ctx)
    return [
        finding(
            "no_iterations_detector",
            "warning",
            _not_found(ctx, key),
            recommendation,
            DLPROF_GUIDE,
            {"key_node": key, "source": it.source, "candidates": candidates},
            action,
        )
    ]


def _why_so_many_ops(ctx: Context) -> str:
    """Why a profile without iterations has as many ops as calls: the sentence, with the name repeated most."""
    ops = ctx.dm.ops
    label = "label" if "label" in ops.columns else "op_type"
    if len(ops) == 0 or label not in ops.columns:
        return ""
    if "kind" in ops.columns:
        ops = ops[~ops["kind"].isin([UNASSOCIATED_API, UNASSOCIATED_GPU])]
    per_label = ops[label].value_counts(sort=True)
    if len(per_label) == 0 or int(per_label.iloc[0]) < 2:
        return ""
    return (
        ". Without iterations each call of a name is an op of its own (an op is the n-th call of a name in an "
        f"iteration, as DLProf counts them): {per_label.index[0]} alone is {int(per_label.iloc[0]):,} ops, "
        f"{len(ctx.dm.ops):,} ops in all"
    )


DEFAULT_KEY_OPS = {
    "pytorch": "Optimizer.step# or ProfilerStep#N ranges",
    "tensorflow": "a global_step node",
    "tensorrt": "ExecutionContext::execute/enqueue ranges",
}


def _not_found(ctx: Context, key: str) -> str:
    """DLProf's sentence, with the key op named (or what the framework default would have been)."""
    if key:
        return f"Unable to split profile into training iterations: key op {key} not found"
    looked = DEFAULT_KEY_OPS.get(ctx.corr.family or "")
    return "Unable to split profile into training iterations: key op not found (no --key_op given" + (
        f"; the {ctx.corr.family} default, {looked}, is not in the profile)"
        if looked
        else f" and {ctx.corr.mode} profiles have no default key op)"
    )


def key_node_candidates(ctx: Context, limit: int = 3) -> list[dict]:
    """Scope range labels (without `#N` counters) repeated >= CANDIDATE_MIN_COUNT times that are neither
    framework ops, data loading nor run metadata; step-like names first, then by total duration."""
    labels = ctx.range_labels
    if len(labels) == 0:
        return []
    keep = (labels["kind"].to_numpy() == nm.SCOPE) & ~labels["dataloader"].to_numpy(dtype=bool)
    if not keep.any():
        return []
    sub = labels[keep]
    stripped = pd.Series([_COUNTER.sub("", str(u)) for u in sub["label"]], dtype=object)
    frame = pd.DataFrame(
        {
            "name": stripped,
            "count": sub["num_ranges"].to_numpy(np.int64),
            "total": sub["total_time"].to_numpy(np.float64),
        }
    )
    frame = frame.groupby("name", sort=False).agg(count=("count", "sum"), total=("total", "sum")).reset_index()
    frame = frame[
        (frame["count"] >= CANDIDATE_MIN_COUNT)
        & (frame["name"].str.len().between(1, 200))
        & ~frame["name"].str.contains(_OP_LIKE)
    ]
    if frame.empty:
        return []
    frame["step_like"] = frame["name"].str.contains(_STEP_LIKE)
    frame = frame.sort_values(["step_like", "total", "name"], ascending=[False, False, True], kind="stable")
    return [
        {"name": str(r.name), "count": int(r.count), "total_time": int(r.total)}
        for r in frame.head(limit).itertuples(index=False)
    ]


def bad_iteration_range_detector(ctx: Context) -> list[dict]:
    """Inputs: the iteration table (duration of every iteration) and the aggregated range.
    Threshold: steady = duration within a factor STEADY_FACTOR (1.25) of the median of the aggregated
    complete iterations. Fires when the first or last aggregated iterations are not steady and a steady run remains;
    proposes the range from the first to the last steady iteration."""
    it, agg = ctx.iterations, ctx.agg
    table = agg.iterations
    if not it.found or it.count < MIN_ITERATIONS or table is None or len(table) < it.count:
        return []
    dur = table["duration"].to_numpy(np.float64)
    start, stop = int(agg.iter_start), int(agg.iter_stop)
    sel = np.arange(start, stop + 1)
    if sel.size < 2:
        return []
    interior = sel[it.complete[sel]]
    median = float(np.median(dur[interior if interior.size else sel]))
    if median <= 0:
        return []
    ratio = dur / median
    steady = (ratio <= STEADY_FACTOR) & (ratio >= 1.0 / STEADY_FACTOR)
    in_sel = steady[sel]
    if in_sel.all() or not in_sel.any():
        return []
    first = int(sel[np.argmax(in_sel)])
    last = int(sel[sel.size - 1 - np.argmax(in_sel[::-1])])
    if (first, last) == (start, stop):
        return []  # only iterations in the middle deviate (evaluation, checkpoints): no better range
    edges = [int(i) for i in sel if i < first or i > last]
    inner = [int(i) for i in sel if first < i < last and not steady[i]]

    def describe(i):
        if dur[i] <= 0 and not it.by_step:
            return f"iteration {i} is empty (the profile ends with the key node)"
        return f"iteration {i} took {fmt_time(dur[i])} ({ratio[i]:.2f}x the median)"

    shown = ", ".join(describe(i) for i in edges[:5]) + (f" and {len(edges) - 5} more" if len(edges) > 5 else "")
    if len(edges) <= 2:
        subject = f"Iteration{'s' if len(edges) > 1 else ''} {' and '.join(str(i) for i in edges)}"
    else:
        subject = f"{len(edges)} iterations"
    problem = (
        f"{subject} of the aggregated range {start}..{stop} {'are' if len(edges) > 1 else 'is'} not "
        f"steady (median iteration time {fmt_time(median)}): {shown}"
    )
    if inner:
        problem += f"; inside the proposed range, {', '.join(describe(i) for i in inner[:3])}" + (
            f" and {len(inner) - 3} more deviate" if len(inner) > 3 else ""
        )
    recommendation = (
        f"Aggregate the steady iterations {first}..{last} only: set --iter_start {first} "
        f"--iter_stop {last}, or apply this proposal in the Iterations view"
    )
    action = {
        "type": "reaggregate",
        "iter_start": first,
        "iter_stop": last,
        "command": _command(it, iter_start=first, iter_stop=last),
    }
    if it.source == "user" and it.key_node:
        action["key_node"] = it.key_node
    data = {
        "iter_start": start,
        "iter_stop": stop,
        "proposed_start": first,
        "proposed_stop": last,
        "median_duration": median,
        "unsteady": edges,
        "inner_unsteady": inner,
        "durations": {str(i): int(dur[i]) for i in edges + inner},
        "steady_factor": STEADY_FACTOR,
    }
    return [finding("bad_iteration_range_detector", "warning", problem, recommendation, DLPROF_GUIDE, data, action)]
