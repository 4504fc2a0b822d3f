"""Aggregate: one aggregation (domain, key node, iteration range) -> op, op-type, kernel, Tensor Core,
group-node, iteration, device and summary tables (DESIGN.md "Per op instance", "Iterations",
"Tensor Cores", "Summary time breakdown").

The op model is read in time chunks (`model_chunks.py`), so a profile of 10^7 kernels is aggregated in
bounded memory: every table is a combination of per-chunk partials (sums, minima, maxima, sets), and the
flattened times (group-node unions, the time breakdown) are unions computed chunk by chunk with the
intervals still open at a chunk's end carried into the next. A single chunk gives the same tables.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from dlprof_profiler.engine.breakdowns import (
    BUSY,
    COMMUNICATION_KERNEL,  # noqa: F401 (the rank analysis reads it here)
    GpuBreakdowns,
    busy_split,
    communication_codes,
)
from dlprof_profiler.engine.correlate import (
    BACKWARD_PASS,
    RANGE_OP,
    SCOPE_OP,
    UNASSOCIATED_API,
    Correlation,
    DomainModel,
)
from dlprof_profiler.engine.flops import FIRST_CALL_COLUMNS, op_flops, with_op_flops
from dlprof_profiler.engine.intervals import StreamingUnion, covered_length, merge_intervals
from dlprof_profiler.engine.iterate import Iterations
from dlprof_profiler.engine.naming import group_prefix_codes
from dlprof_profiler.engine.tensor_cores import precision_by_op
from dlprof_profiler.engine.trace import KIND_KERNEL, LAUNCH_SHAPE, Trace, make_frame, obj
from dlprof_profiler.engine.memory import MemoryAccumulator
from dlprof_profiler.engine.model_chunks import InMemoryModel
from dlprof_profiler.log import Progress

CLASSES = ("tc", "non_tc", "memory", "dataloader", "io", "cpu", "other")
HALF_PRECISION = ("float16", "half", "bfloat16", "float8_e4m3fn", "float8_e5m2")
COMPLETE_MODEL = "_CompleteModel_"
CPU_KINDS = (RANGE_OP, SCOPE_OP, BACKWARD_PASS, UNASSOCIATED_API)
METRICS = (("cpu_time", "cpu"), ("gpu_time", "gpu"), ("cpu_overhead", "overhead"), ("gpu_idle", "idle"))
# Op instances and GPU activities per time chunk of an in-memory aggregation: its working memory is a chunk's
# (at 10^7 Kineto events, 3·10^6 of them, the whole run's peak was 0.25 GB higher in one chunk)
EVENTS_PER_CHUNK = 1_000_000
# Kernels at least this long that end before their launch call returns are CUDA_LAUNCH_BLOCKING evidence.
LAUNCH_BLOCKING_MIN_KERNEL_NS = 20_000


@dataclass
class Aggregation:
    """Every table of one aggregation."""

    domain: str
    family: str | None
    mode: str
    key_node: str
    key_found: bool
    key_source: str
    iter_start: int
    iter_stop: int
    total_iterations: int
    window_start: int
    window_end: int
    summary: dict = field(default_factory=dict)
    iterations: pd.DataFrame = None  # every iteration of the profile
    ops: pd.DataFrame = None  # per op with calls in the aggregation
    op_types: pd.DataFrame = None
    kernels: pd.DataFrame = None  # per (kernel name, op)
    tensor_core: pd.DataFrame = None  # per TC-eligible op
    groups: pd.DataFrame = None  # per group node of the op-name tree
    devices: pd.DataFrame = None  # per visible GPU: time breakdown
    kernel_launches: pd.DataFrame = None  # per kernel launch in the aggregation (iteration report), when kept
    launch_chunks: list = field(default_factory=list)  # the same rows chunk by chunk
    launch_spill: object = None  # out-of-core runs: where the kernel-launch rows went (store_model)
    facts: dict = field(default_factory=dict)  # per-launch evidence the expert systems need
    memory: object = None  # memory.MemoryTables: the memory report's tables
    gpu_breakdowns: dict = None  # breakdowns.GpuBreakdowns.result: idle split, launch delays

    @property
    def wall_time(self) -> int:
        return self.window_end - self.window_start


def aggregate(
    trace: Trace,
    corr: Correlation,
    dm: DomainModel,
    iterations: Iterations,
    iter_start: int,
    iter_stop: int,
    cuts=None,
    keep_launches: bool = True,
) -> Aggregation:
    """Compute every table of one aggregation of one domain of an in-memory model. `cuts` split the
    timeline into chunks (default: chunks of EVENTS_PER_CHUNK); the tables do not depend on them."""
    model = InMemoryModel(trace, corr, dm)
    if cuts is None:
        cuts = model.planned_cuts(iterations.boundaries, EVENTS_PER_CHUNK)
    return aggregate_model(model, iterations, iter_start, iter_stop, cuts, keep_launches)


def aggregate_model(
    model, iterations: Iterations, iter_start: int, iter_stop: int, cuts=None, keep_launches=True
) -> Aggregation:
    """Aggregate a model that yields time chunks (in memory or from an out-of-core store). `keep_launches`:
    True keeps the kernel-launch rows (the iteration report) in `kernel_launches`; a function receives them
    instead, chunk by chunk, as (launches, chunk)."""
    window_start, window_end = aggregation_window(model, iterations, iter_start, iter_stop)
    agg = Aggregation(
        domain=model.domain,
        family=model.family,
        mode=model.mode,
        key_node=iterations.key_node or "",
        key_found=iterations.found,
        key_source=iterations.source,
        iter_start=iter_start,
        iter_stop=iter_stop,
        total_iterations=iterations.count,
        window_start=window_start,
        window_end=window_end,
    )
    acc = Accumulator(model, iterations, agg, keep_launches)
    memory = MemoryAccumulator(model.memory_events(), iterations, iter_start, iter_stop, len(model.ops))
    progress = Progress(f"time chunks aggregated (domain {model.domain})", len(cuts or ()) + 1)
    for n, chunk in enumerate(model.chunks(cuts), 1):
        acc.add(chunk)
        memory.add(chunk)
        progress.update(n)
    acc.finish()
    agg.memory = memory.result()
    return agg


def aggregation_window(model, iterations: Iterations, iter_start: int, iter_stop: int) -> tuple[int, int]:
    """The wall clock window of iterations iter_start..iter_stop (DESIGN.md "Iterations", "Clarifications"):
    steps, from the first one's start to the last one's end; key-node intervals, from the first one's start to
    the end of the last one, or the latest end of any op instance or GPU activity started (launched) in them
    if later (so data loading at the end of the profile, say, is not cut off)."""
    window_start = int(iterations.starts[iter_start])
    window_end = int(iterations.ends[iter_stop])
    if not iterations.by_step:
        items = model.window_end(iterations, iter_start, iter_stop)
        window_end = max(window_end, int(items) if items is not None else window_end)
    return window_start, max(window_end, window_start)


# ---------------------------------------------------------------------------- per-chunk accumulation


class Accumulator:
    """Per-chunk partials of every table of one aggregation, combined by `finish`."""

    def __init__(self, model, iterations: Iterations, agg: Aggregation, keep_launches: bool):
        self.model, self.iterations, self.agg = model, iterations, agg
        self.keep_launches = keep_launches
        self.op_parts: list[pd.DataFrame] = []
        self.kernel_parts: list[pd.DataFrame] = []
        self.tc_parts: list[pd.DataFrame] = []
        self.tc_names: list[pd.DataFrame] = []
        self.kernel_rows = {k: [] for k in ("all", "tc", "memory", "other")}
        n = iterations.count
        self.iter_kernels = np.zeros(n, dtype=np.int64)
        self.iter_tc_kernels = np.zeros(n, dtype=np.int64)
        self.iter_kernel_time = np.zeros(n, dtype=np.float64)
        self.iter_tc_time = np.zeros(n, dtype=np.float64)
        self.groups = GroupUnions(model.op_names(), n)
        self.breakdown = Breakdown(model, iterations, agg.window_start, agg.window_end)
        self.gpu_breakdowns = GpuBreakdowns(iterations, agg.iter_start, agg.iter_stop, agg.window_start, agg.window_end)
        self.facts = {"long_kernels": 0, "long_kernels_waited": 0}

    def add(self, chunk) -> None:
        agg, its = self.agg, self.iterations
        lo_it, hi_it = agg.iter_start, agg.iter_stop
        inst = chunk.inst
        inst_iter = its.of(inst["start"].to_numpy(np.int64))
        sel = (inst_iter >= lo_it) & (inst_iter <= hi_it)
        chosen = inst[sel]
        if len(chosen):
            self.op_parts.append(_op_partial(chosen))
            self.groups.add_instances(chosen, inst_iter[sel])
        acts = chunk.acts
        act_iter = its.of(acts["launch"].to_numpy(np.int64))
        kernel = acts["kind"].to_numpy() == KIND_KERNEL
        uses_tc = acts["uses_tc"].to_numpy(dtype=bool)
        dur = (acts["end"] - acts["start"]).to_numpy(np.int64)
        n = its.count
        kernel_in = kernel & (act_iter >= 0)  # launched in an iteration (not between or around steps)
        tc_in = kernel_in & uses_tc
        self.iter_kernels += np.bincount(act_iter[kernel_in], minlength=n)[:n]
        self.iter_tc_kernels += np.bincount(act_iter[tc_in], minlength=n)[:n]
        self.iter_kernel_time += np.bincount(act_iter[kernel_in], weights=dur[kernel_in], minlength=n)[:n]
        self.iter_tc_time += np.bincount(act_iter[tc_in], weights=dur[tc_in], minlength=n)[:n]
        sel_act = (act_iter >= lo_it) & (act_iter <= hi_it)
        # GPU work of the chosen instances (by the instance's iteration, not the launch's)
        owner_iter = its.of(acts["owner_start"].to_numpy(np.int64))
        owned = (owner_iter >= lo_it) & (owner_iter <= hi_it)
        if owned.any():
            self.groups.add_activities(
                acts["owner_op"].to_numpy(np.int64)[owned],
                owner_iter[owned],
                acts["start"].to_numpy(np.int64)[owned],
                acts["end"].to_numpy(np.int64)[owned],
            )
            tc_owned = owned & kernel & uses_tc
            if tc_owned.any():
                self.op_parts.append(
                    pd.DataFrame(
                        {"using_tc": True},
                        index=pd.Index(np.unique(acts["owner_op"].to_numpy(np.int64)[tc_owned]), name="op_index"),
                    )
                )
        self._summary_kernels(acts, sel_act, kernel, uses_tc, dur)
        launched = acts[sel_act & kernel]
        launches = _launch_rows(launched, act_iter[sel_act & kernel])
        if len(launches):
            self.kernel_parts.append(_kernel_partial(launches))
            self.tc_parts.append(
                launches.groupby("op_index", sort=False)
                .agg(kernel_time=("gpu_duration", "sum"))
                .assign(tc_time=launches[launches["uses_tc"]].groupby("op_index")["gpu_duration"].sum())
            )
            self.tc_names.append(launches[["op_index", "name_code", "uses_tc"]].drop_duplicates())
            self._launch_facts(launches)
            if callable(self.keep_launches):  # a sink (an out-of-core run spills them)
                self.keep_launches(launches, launched)
            elif self.keep_launches:
                self.agg.launch_chunks.append(launches)
        self.groups.flush(chunk.hi)
        self.breakdown.add(chunk)
        self.gpu_breakdowns.add(chunk.running)

    def _summary_kernels(self, acts, sel_act, kernel, uses_tc, dur) -> None:
        rows = {
            "all": sel_act,
            "tc": sel_act & kernel & uses_tc,
            "memory": sel_act & ~kernel,
            "other": sel_act & kernel & ~uses_tc,
        }
        api_id = acts["api_id"].to_numpy(np.int64)
        api_dur = acts["api_duration"].to_numpy(np.int64)
        # `# Kernels` counts distinct kernel names, and for memory operations distinct memory API names
        # (cudaMemcpyAsync, cudaMemcpy, cudaMemsetAsync: 3), as DLProf 1.8 did; an operation without an API
        # call counts by its own name
        names = acts["name_code"].to_numpy(np.int64)
        api_names = acts["api_name"].to_numpy(np.int64) if "api_name" in acts else np.full(len(acts), -1)
        memory_key = np.where(api_names >= 0, (1 << 40) + api_names, (1 << 41) + names)
        codes = np.where(kernel, names, memory_key)
        for key, mask in rows.items():
            if not mask.any():
                continue
            # CPU time: the distinct launching API calls (an API call lives in one chunk only)
            ids, first = np.unique(api_id[mask], return_index=True)
            keep = ids >= 0
            self.kernel_rows[key].append(
                (int(dur[mask].sum()), int(api_dur[mask][first[keep]].sum()), np.unique(codes[mask]))
            )

    def _launch_facts(self, launches: pd.DataFrame) -> None:
        dur = launches["gpu_duration"].to_numpy(np.int64)
        long_ = (launches["api_row"].to_numpy(np.int64) >= 0) & (dur >= LAUNCH_BLOCKING_MIN_KERNEL_NS)
        if long_.any():
            api_end = (launches["api_start"].to_numpy(np.int64) + launches["api_duration"].to_numpy(np.int64))[long_]
            gpu_end = (launches["gpu_start"].to_numpy(np.int64) + dur)[long_]
            self.facts["long_kernels"] += int(long_.sum())
            self.facts["long_kernels_waited"] += int((api_end >= gpu_end).sum())

    def finish(self) -> None:
        agg, model = self.agg, self.model
        agg.ops = op_table(model.ops, self.op_parts, self.tc_parts)
        if not self.breakdown.device_pids:
            # no GPU ran anything: Tensor Cores are out of reach, so no op is eligible for them (DESIGN.md
            # "Clarifications", GPUs)
            agg.ops["tc_eligible"] = False
        agg.op_types = op_type_statistics(agg.ops)
        agg.kernels = kernel_table(self.kernel_parts, model.kernel_names())
        # the data type the kernels' names show, for ops whose markers carry none (expert systems)
        shown = precision_by_op(agg.kernels)
        agg.ops["kernel_data_type"] = obj(agg.ops["op_index"].map(shown).to_numpy(dtype=object), agg.ops.index)
        known = agg.ops["data_type"].where(agg.ops["data_type"].notna(), agg.ops["kernel_data_type"])
        agg.ops["is_bad_data_type"] = (
            agg.ops["tc_eligible"] & ~agg.ops["using_tc"] & ~known.fillna("").isin(HALF_PRECISION)
        )
        agg.ops = op_flops_table(agg.ops, model)
        agg.tensor_core = tensor_core_table(agg.ops, self.tc_parts, self.tc_names, model.kernel_names()[0])
        agg.groups = self.groups.table(agg.ops, len(model.ops))
        breakdown = self.breakdown.result()
        agg.devices = breakdown["devices"]
        agg.gpu_breakdowns = self.gpu_breakdowns.result(self.breakdown.devices, model.kernel_names()[0])
        agg.iterations = self._iteration_table(breakdown)
        agg.summary = self._summary(breakdown)
        agg.facts = dict(self.facts)
        if self.keep_launches and not callable(self.keep_launches):
            agg.kernel_launches = (
                pd.concat(agg.launch_chunks, ignore_index=True)
                if agg.launch_chunks
                else _launch_rows(model.empty_acts(), np.zeros(0, dtype=np.int64))
            )

    def _iteration_table(self, breakdown: dict) -> pd.DataFrame:
        its, agg = self.iterations, self.agg
        n = its.count
        starts, ends = its.starts, its.ends
        frame = make_frame({"iteration": np.arange(n), "start": starts, "end": ends, "duration": ends - starts})
        frame["aggregated"] = (frame["iteration"] >= agg.iter_start) & (frame["iteration"] <= agg.iter_stop)
        frame["complete"] = its.complete
        frame["kernels"] = self.iter_kernels
        frame["tc_kernels"] = self.iter_tc_kernels
        n_dev = max(breakdown["n_devices"], 1)
        frame["kernel_time_per_gpu"] = self.iter_kernel_time / n_dev
        frame["tc_kernel_time_per_gpu"] = self.iter_tc_time / n_dev
        mean = breakdown["mean"][1:]  # row 0 is the aggregation window
        for c, name in enumerate(CLASSES):
            frame[f"{name}_time"] = mean[:, c]
        busy = breakdown["busy_mean"][1:]
        for c, name in enumerate(BUSY):
            frame[f"{name}_busy"] = busy[:, c]
        # no GPU ran anything: no GPU to be idle (as GPU utilization is 0 then, not the host's view)
        frame["gpu_idle_time"] = (
            np.maximum(frame["duration"].to_numpy(np.float64) - busy[:, 3], 0) if breakdown["n_devices"] else 0.0
        )
        length = np.maximum(frame["duration"].to_numpy(), 1)
        frame["gpu_utilization"] = (
            100.0 * (mean[:, 0] + mean[:, 1] + mean[:, 2]) / length if breakdown["n_devices"] else 0.0
        )
        return frame

    def _summary(self, breakdown: dict) -> dict:
        agg = self.agg
        wall = agg.wall_time
        mean = breakdown["mean"][0]
        pct = {name: (100.0 * mean[c] / wall if wall else 0.0) for c, name in enumerate(CLASSES)}
        gpu_util = (pct["tc"] + pct["non_tc"] + pct["memory"]) if breakdown["n_devices"] else 0.0
        ops = agg.ops
        tc = agg.tensor_core
        elig_time = int(tc["total_gpu_time"].sum()) if len(tc) else 0
        elig_tc = int(tc["tc_gpu_time"].sum()) if len(tc) else 0
        it = agg.iterations
        durations = it.loc[it["aggregated"], "duration"].to_numpy(np.float64)
        aggregated = agg.iter_stop - agg.iter_start + 1
        std = float(np.std(durations, ddof=1)) if durations.size > 1 else 0.0
        steady = steady_iterations(it)

        def op_row(mask):
            sub = ops[mask] if len(ops) else ops
            return {
                "gpu_time": int(sub["gpu_total"].sum()) if len(sub) else 0,
                "cpu_time": int(sub["cpu_total"].sum()) if len(sub) else 0,
                "count": int(len(sub)),
            }

        using = ops["using_tc"].to_numpy(dtype=bool) if len(ops) else np.zeros(0, dtype=bool)
        elig = ops["tc_eligible"].to_numpy(dtype=bool) if len(ops) else np.zeros(0, dtype=bool)

        def kernel_row(parts):
            if not parts:
                return {"gpu_time": 0, "cpu_time": 0, "count": 0}
            return {
                "gpu_time": int(sum(p[0] for p in parts)),
                "cpu_time": int(sum(p[1] for p in parts)),
                "count": int(np.unique(np.concatenate([p[2] for p in parts])).size),
            }

        return {
            "wall_time": int(wall),
            "tc_utilization": 100.0 * elig_tc / elig_time if elig_time else 0.0,
            "gpu_utilization": gpu_util,
            "pct": pct,
            "total_iterations": int(agg.total_iterations),
            "aggregated_iterations": int(aggregated),
            "iter_start": int(agg.iter_start),
            "iter_stop": int(agg.iter_stop),
            "avg_iteration_time": wall / aggregated if aggregated else 0.0,
            "iteration_std": std,
            **steady,
            "ops": {
                "all": op_row(np.ones(len(ops), dtype=bool)),
                "using_tc": op_row(using),
                "eligible_not_using": op_row(elig & ~using),
                "other": op_row(~elig & ~using),
            },
            "kernels": {k: kernel_row(v) for k, v in self.kernel_rows.items()},
            "key_node": agg.key_node,
            "key_found": bool(agg.key_found),
            "communication_time": int(agg.devices["communication_time"].sum()) if len(agg.devices) else 0,
            "overlapped_communication_time": int(agg.devices["overlapped_communication_time"].sum())
            if len(agg.devices)
            else 0,
            "n_visible_gpus": int(breakdown["n_devices"]),  # the GPUs used, which the figures average over
            "n_listed_gpus": int(breakdown["n_listed"]),
        }


def steady_iterations(table: pd.DataFrame) -> dict:
    """The steady figures of an iteration table (aggregated, complete, duration): the median duration of the
    aggregated iterations that are complete (of all aggregated ones when none is), their range and count, and
    the aggregated iterations that are partial."""
    aggregated = table["aggregated"].to_numpy(dtype=bool)
    complete = aggregated & table["complete"].to_numpy(dtype=bool)
    numbers = table["iteration"].to_numpy(np.int64)
    durations = table["duration"].to_numpy(np.float64)
    chosen = complete if complete.any() else aggregated
    return {
        "median_iteration_time": float(np.median(durations[chosen])) if chosen.any() else 0.0,
        "complete_iterations": int(complete.sum()),
        "complete_start": int(numbers[complete].min()) if complete.any() else None,
        "complete_stop": int(numbers[complete].max()) if complete.any() else None,
        "partial_iterations": numbers[aggregated & ~complete].tolist(),
    }


# ---------------------------------------------------------------------------- op statistics


def op_flops_table(ops: pd.DataFrame, model) -> pd.DataFrame:
    """The op table with the first call's input shapes, FLOPs per call and achieved TFLOP/s (flops.py): the
    FLOPs of every op of the model (a bprop op takes its fprop op's), from its first call in the profile."""
    all_ops = model.ops
    first = model.first_calls(FIRST_CALL_COLUMNS, all_ops["op_index"].to_numpy(np.int64))
    index = all_ops["op_index"].to_numpy(np.int64)
    per_call = op_flops(all_ops, first).set_axis(index)
    shapes = pd.Series(first["input_shapes"], index=index, dtype=object)
    return with_op_flops(ops, per_call, shapes)


def _op_partial(chosen: pd.DataFrame) -> pd.DataFrame:
    """Per op: calls, kernel calls and total/min/max of the four call metrics of some instances (a call is
    one instance, or the autograd nodes of one forward call: see correlate.call_metrics)."""
    calls = chosen[chosen["is_call"].to_numpy(dtype=bool)] if "is_call" in chosen else chosen
    prefix_col = "call_" if "call_cpu_time" in calls else ""
    g = calls.groupby("op_index", sort=False)
    cols = {"calls": g.size(), "kernel_calls": g[f"{prefix_col}n_kernels"].sum()}
    for column, prefix in METRICS:
        cols[f"{prefix}_total"] = g[f"{prefix_col}{column}"].sum()
        cols[f"{prefix}_min"] = g[f"{prefix_col}{column}"].min()
        cols[f"{prefix}_max"] = g[f"{prefix_col}{column}"].max()
    return pd.DataFrame(cols)


_COMBINE_OPS = {
    "calls": "sum",
    "kernel_calls": "sum",
    "using_tc": "any",
    **{f"{p}_{s}": ("sum" if s == "total" else s) for _, p in METRICS for s in ("total", "min", "max")},
}


def op_table(ops_meta: pd.DataFrame, parts: list[pd.DataFrame], tc_parts: list[pd.DataFrame]) -> pd.DataFrame:
    """Per op with calls in the aggregation: calls and total/avg/min/max of the four instance metrics."""
    if parts:
        frame = pd.concat(parts)
        for c in _COMBINE_OPS:
            if c not in frame:
                frame[c] = False if c == "using_tc" else np.nan
        frame["using_tc"] = frame["using_tc"].astype("boolean").fillna(False).astype(bool)
        stats = frame.groupby(level=0).agg(_COMBINE_OPS)
        stats = stats[stats["calls"].fillna(0) > 0]
    else:
        stats = pd.DataFrame({c: pd.Series(dtype="float64") for c in _COMBINE_OPS})
    stats.index.name = "op_index"
    for c in _COMBINE_OPS:
        if c not in ("using_tc",):
            stats[c] = stats[c].astype(np.int64)
    for _, p in METRICS:
        stats[f"{p}_avg"] = stats[f"{p}_total"] / stats["calls"]
    stats = stats.reset_index()
    ops = ops_meta.merge(stats, on="op_index", how="inner")
    ops["using_tc"] = ops["using_tc"].astype(bool)
    ops["is_bad_data_type"] = ops["tc_eligible"] & ~ops["using_tc"] & ~ops["data_type"].fillna("").isin(HALF_PRECISION)
    kernel_time = (
        pd.concat([p["kernel_time"] for p in tc_parts]).groupby(level=0).sum() if tc_parts else pd.Series(dtype="int64")
    )
    ops["kernel_time"] = ops["op_index"].map(kernel_time).fillna(0).astype(np.int64)
    return ops.sort_values("first_start", kind="stable").reset_index(drop=True)


def op_type_statistics(ops: pd.DataFrame) -> pd.DataFrame:
    """Per op type: distinct ops, calls, and statistics over the calls (combined from the op statistics:
    the minimum over a type's calls is the minimum of its ops' minima, and so on)."""
    if len(ops) == 0:
        out = pd.DataFrame(
            {"op_type": pd.Series(dtype=object), "calls": pd.Series(dtype="int64"), "n_ops": pd.Series(dtype="int64")}
        )
        for _, p in METRICS:
            for s in ("total", "min", "max", "avg"):
                out[f"{p}_{s}"] = pd.Series(dtype="float64" if s == "avg" else "int64")
        return out
    g = ops.groupby("op_type", sort=False)
    cols = {"calls": g["calls"].sum(), "n_ops": g.size()}
    for _, p in METRICS:
        cols[f"{p}_total"] = g[f"{p}_total"].sum()
        cols[f"{p}_min"] = g[f"{p}_min"].min()
        cols[f"{p}_max"] = g[f"{p}_max"].max()
    out = pd.DataFrame(cols)
    for _, p in METRICS:
        out[f"{p}_avg"] = out[f"{p}_total"] / out["calls"]
    out = out.reset_index()
    return out.sort_values("op_type", kind="stable").reset_index(drop=True)


def with_launch_details(launches: pd.DataFrame, gpu: pd.DataFrame) -> pd.DataFrame:
    """Kernel launch rows with names, long names and grid/block sizes: what the iteration report of the
    branch point read (tests/test_reports.py runs that writer for its byte-for-byte comparison)."""
    out = launches.copy()
    rows = launches["activity_id"].to_numpy() if len(launches) else np.zeros(0, dtype=np.int64)
    for column in ("name", "long_name"):
        cats = gpu[column].cat.categories.to_numpy(dtype=object) if len(gpu) else np.zeros(0, dtype=object)
        out[column] = obj(cats[gpu[column].cat.codes.to_numpy()[rows]] if len(rows) else [], out.index)
    for c in LAUNCH_SHAPE:
        out[c] = gpu[c].to_numpy()[rows]
    return out


# ---------------------------------------------------------------------------- kernel launches

LAUNCH_COLUMNS = [
    "activity_id",
    "iteration",
    "instance",
    "op_index",
    "name_code",
    "device_id",
    "gpu_start",
    "gpu_duration",
    "api_row",
    "api_start",
    "api_duration",
    "uses_tc",
]


def _launch_rows(acts: pd.DataFrame, iteration: np.ndarray) -> pd.DataFrame:
    """One row per kernel launch: iteration, op, device, GPU and API times, Tensor Core use."""
    api_id = acts["api_id"].to_numpy(np.int64)
    has_api = api_id >= 0
    return make_frame(
        {
            "activity_id": acts["activity_id"].to_numpy(np.int64),
            "iteration": np.asarray(iteration, dtype=np.int64),
            "instance": acts["owner"].to_numpy(np.int64),
            "op_index": acts["owner_op"].to_numpy(np.int64),
            "name_code": acts["name_code"].to_numpy(np.int64),
            "device_id": acts["device_id"].to_numpy(np.int64),
            "gpu_start": acts["start"].to_numpy(np.int64),
            "gpu_duration": (acts["end"] - acts["start"]).to_numpy(np.int64),
            "api_row": api_id,
            "api_start": np.where(has_api, acts["launch"].to_numpy(np.int64), -1),
            "api_duration": np.where(has_api, acts["api_duration"].to_numpy(np.int64), -1),
            "uses_tc": acts["uses_tc"].to_numpy(dtype=bool),
        }
    )


def _kernel_partial(launches: pd.DataFrame) -> pd.DataFrame:
    g = launches.groupby(["name_code", "op_index"], sort=False)
    out = pd.DataFrame(
        {
            "count": g.size(),
            "uses_tc": g["uses_tc"].any(),
            "gpu_total": g["gpu_duration"].sum(),
            "gpu_min": g["gpu_duration"].min(),
            "gpu_max": g["gpu_duration"].max(),
            "first_start": g["gpu_start"].min(),
            "first_activity": g["activity_id"].min(),
        }
    )
    with_api = launches[launches["api_row"] >= 0]
    ga = with_api.groupby(["name_code", "op_index"], sort=False)["api_duration"]
    api = pd.DataFrame({"api_total": ga.sum(), "api_min": ga.min(), "api_max": ga.max(), "api_count": ga.size()})
    return out.join(api, how="left")


_COMBINE_KERNELS = {
    "count": "sum",
    "uses_tc": "any",
    "gpu_total": "sum",
    "gpu_min": "min",
    "gpu_max": "max",
    "first_start": "min",
    "first_activity": "min",
    "api_total": "sum",
    "api_min": "min",
    "api_max": "max",
    "api_count": "sum",
}


def kernel_table(parts: list[pd.DataFrame], names: tuple[np.ndarray, np.ndarray, np.ndarray]) -> pd.DataFrame:
    """Per (kernel name, op): GPU time and launching-API time statistics. `names`: (short names per code,
    long-name code per activity lookup function's table, ...) from the model."""
    if not parts:
        return pd.DataFrame(columns=["name", "op_index", "uses_tc", "count"])
    frame = pd.concat(parts)
    out = frame.groupby(level=[0, 1], sort=False).agg(_COMBINE_KERNELS) if len(parts) > 1 else frame
    out["gpu_avg"] = out["gpu_total"] / out["count"]
    out["api_avg"] = out["api_total"] / out["api_count"]
    for c in ("api_total", "api_min", "api_max", "api_count"):
        out[c] = out[c].fillna(0).astype(np.int64)
    out["api_avg"] = out["api_avg"].fillna(0.0)
    out = out.reset_index()
    short_names, long_name_of = names[0], names[1]
    out["name"] = obj(short_names[out["name_code"].to_numpy()], out.index)
    out["long_name"] = obj(long_name_of(out["first_activity"].to_numpy(np.int64)), out.index)
    return out.sort_values(["first_start", "name"], kind="stable").reset_index(drop=True)


def tensor_core_table(
    ops: pd.DataFrame, tc_parts: list[pd.DataFrame], name_parts: list[pd.DataFrame], short_names: np.ndarray
) -> pd.DataFrame:
    """Per TC-eligible op: kernel time split into TC and non-TC kernels, counts of distinct names."""
    eligible = ops[ops["tc_eligible"]]
    rows = eligible[["op_index", "op_id", "name", "direction", "op_type", "using_tc", "first_start"]].copy()
    if tc_parts:
        times = pd.concat(tc_parts).groupby(level=0).sum()
        total, tc = times["kernel_time"], times["tc_time"].fillna(0)
        pairs = pd.concat(name_parts).drop_duplicates()
        pairs = pairs[pairs["op_index"].isin(set(rows["op_index"]))]
        pairs = pairs.assign(name=short_names[pairs["name_code"].to_numpy()])

        def names(frame):
            return frame.groupby("op_index")["name"].agg(lambda s: sorted(set(s)))

        tc_names = names(pairs[pairs["uses_tc"]])
        other_names = names(pairs[~pairs["uses_tc"]])
    else:
        total = tc = pd.Series(dtype="int64")
        tc_names = other_names = pd.Series(dtype=object)
    rows["total_gpu_time"] = rows["op_index"].map(total).fillna(0).astype(np.int64)
    rows["tc_gpu_time"] = rows["op_index"].map(tc).fillna(0).astype(np.int64)
    rows["non_tc_gpu_time"] = rows["total_gpu_time"] - rows["tc_gpu_time"]
    rows["tc_utilization"] = np.where(
        rows["total_gpu_time"] > 0, 100.0 * rows["tc_gpu_time"] / rows["total_gpu_time"].clip(lower=1), 0.0
    )
    rows["tc_kernel_names"] = [v if isinstance(v, list) else [] for v in rows["op_index"].map(tc_names)]
    rows["non_tc_kernel_names"] = [v if isinstance(v, list) else [] for v in rows["op_index"].map(other_names)]
    rows["tc_kernel_count"] = rows["tc_kernel_names"].map(len).astype(np.int64)
    rows["non_tc_kernel_count"] = rows["non_tc_kernel_names"].map(len).astype(np.int64)
    rows["total_kernel_count"] = rows["tc_kernel_count"] + rows["non_tc_kernel_count"]
    return rows.sort_values("op_id", kind="stable").reset_index(drop=True)


# ---------------------------------------------------------------------------- group nodes


class GroupUnions:
    """Per group node and iteration: CPU time flattened over the node's op instances, GPU time flattened
    over their activities, GPU span, CPU overhead and calls. One tree level at a time: at a level an op
    belongs to at most one node, so the keys stay linear in the instances whatever the depth."""

    def __init__(self, op_names: np.ndarray, n_iterations: int):
        codes, names = group_prefix_codes(op_names)  # per op, not per instance
        self.depth = codes.shape[0]
        self.names = names + [COMPLETE_MODEL]
        self.prefix_code = np.vstack([codes, np.full((1, len(op_names)), len(names), dtype=np.int64)])
        self.n_iter = int(n_iterations) + 1
        self.cpu = StreamingUnion()
        self.gpu = StreamingUnion()
        self.overhead = pd.Series(dtype="int64")
        self.idle = pd.Series(dtype="int64")
        self.calls = pd.Series(dtype="int64")
        self.used_ops = np.zeros(len(op_names), dtype=bool)  # ops with calls in the aggregation

    def _keys(self, level: int, ops: np.ndarray, iteration: np.ndarray):
        g = self.prefix_code[level][ops]
        on = g >= 0
        return on, g[on] * self.n_iter + iteration[on]

    def add_instances(self, chosen: pd.DataFrame, iteration: np.ndarray) -> None:
        ops = chosen["op_index"].to_numpy(np.int64)
        s, e = chosen["start"].to_numpy(np.int64), chosen["end"].to_numpy(np.int64)
        overhead = chosen["cpu_overhead"].to_numpy(np.int64)
        idle = chosen["gpu_idle"].to_numpy(np.int64)
        self.used_ops[ops] = True
        is_call = chosen["is_call"].to_numpy(dtype=bool) if "is_call" in chosen else np.ones(len(chosen), dtype=bool)
        keys, over, idles, calls = [], [], [], []
        for level in range(self.depth + 1):
            on, key = self._keys(level, ops, iteration)
            self.cpu.add(key, s[on], e[on])
            keys.append(key)
            over.append(overhead[on])
            idles.append(idle[on])
            calls.append(is_call[on].astype(np.int64))
        # a group node's GPU idle is the sum of its member ops' (DLProf 1.8), not its span minus its busy time
        over, idles, calls = sums_by_key(
            np.concatenate(keys), np.concatenate(over), np.concatenate(idles), np.concatenate(calls)
        )
        self.overhead = _add_series(self.overhead, over)
        self.idle = _add_series(self.idle, idles)
        self.calls = _add_series(self.calls, calls)

    def add_activities(self, ops: np.ndarray, iteration: np.ndarray, s: np.ndarray, e: np.ndarray) -> None:
        for level in range(self.depth + 1):
            on, key = self._keys(level, ops, iteration)
            self.gpu.add(key, s[on], e[on])

    def flush(self, cut: int) -> None:
        """Everything still to come starts at or after `cut` (instances by start, activities by launch)."""
        self.cpu.flush(cut)
        self.gpu.flush(cut)

    def table(self, ops: pd.DataFrame, n_ops: int) -> pd.DataFrame:
        if len(self.calls) == 0:
            return pd.DataFrame(columns=["name", "level"])
        calls = self.calls.astype(np.int64)
        per = make_frame(
            {
                "cpu": self.cpu.totals().reindex(calls.index).fillna(0).astype(np.int64),
                "overhead": self.overhead.reindex(calls.index).fillna(0).astype(np.int64),
                "calls": calls,
            }
        )
        busy = self.gpu.totals()
        per["gpu"] = busy.reindex(per.index).fillna(0).astype(np.int64)
        per["idle"] = self.idle.reindex(per.index).fillna(0).astype(np.int64)
        per["g"] = per.index.to_numpy() // self.n_iter
        out = make_frame({"name": np.asarray(self.names, dtype=object)})
        g = per.groupby("g")
        for col in ("cpu", "gpu", "overhead", "idle"):
            out[f"{col}_total"] = g[col].sum().reindex(out.index).to_numpy()
            out[f"{col}_avg"] = g[col].mean().reindex(out.index).to_numpy()
            out[f"{col}_min"] = g[col].min().reindex(out.index).to_numpy()
            out[f"{col}_max"] = g[col].max().reindex(out.index).to_numpy()
        out["calls"] = g["calls"].sum().reindex(out.index).to_numpy()
        # distinct ops under each node, among the ops with calls in the aggregation
        flags = ops.set_index("op_index")[["tc_eligible", "using_tc"]].reindex(np.arange(n_ops))
        used = np.zeros(n_ops, dtype=bool)
        used[: self.used_ops.size] = self.used_ops[:n_ops]
        eligible = flags["tc_eligible"].fillna(False).to_numpy(dtype=bool) & used
        using = flags["using_tc"].fillna(False).to_numpy(dtype=bool) & used
        counts = {name: np.zeros(len(self.names), dtype=np.int64) for name in ("n_ops", "n_tc_eligible", "n_using_tc")}
        for level in range(self.depth + 1):
            codes = self.prefix_code[level]
            for name, mask in (("n_ops", used), ("n_tc_eligible", eligible), ("n_using_tc", using)):
                hit = (codes >= 0) & mask
                counts[name] += np.bincount(codes[hit], minlength=len(self.names))
        for name, values in counts.items():
            out[name] = values
        out = out[out["calls"].notna()]
        out["calls"] = out["calls"].astype(np.int64)
        out["level"] = [
            -1 if n == COMPLETE_MODEL else n.count("/") - (1 if n.startswith("/") else 0) for n in out["name"]
        ]
        complete = out["name"] == COMPLETE_MODEL
        return pd.concat([out[~complete].sort_values("name", kind="stable"), out[complete]], ignore_index=True)


# ---------------------------------------------------------------------------- time breakdown


class Breakdown:
    """Per GPU, the time each class is active while no earlier class is, in the aggregation window and in
    every iteration interval, accumulated chunk by chunk: each chunk's intervals are clipped to the chunk
    and the part of an interval reaching past the chunk is carried into the next one."""

    def __init__(self, model, iterations: Iterations, window_start: int, window_end: int):
        self.win_s = np.concatenate([[window_start], iterations.starts]).astype(np.int64)
        self.win_e = np.concatenate([[window_end], iterations.ends]).astype(np.int64)
        self.devices = model.device_ids()
        self.device_pids = model.device_pids()
        # averaged over the GPUs the profiled processes used; the machine's other GPUs are listed as idle
        self.used = [d for d in self.devices if d in self.device_pids]
        # no GPU ran anything: the averages are the host view (every process's CPU, data loading, I/O)
        self.targets = self.devices + ([None] if not self.used else [])
        self.times = {dev: np.zeros((self.win_s.size, len(CLASSES)), dtype=np.int64) for dev in self.targets}
        self.carry: dict = {}
        short, _ = model.kernel_names()
        self.comm_codes = communication_codes(short)
        # per GPU and window: busy time of computation, communication, memory, any, overlapped communication
        self.busy = {dev: np.zeros((self.win_s.size, len(BUSY)), dtype=np.int64) for dev in self.targets}

    def _carried(self, name: str, frame: dict, hi: int) -> dict:
        """The chunk's intervals plus those carried from earlier chunks; what reaches past `hi` is kept."""
        prev = self.carry.get(name)
        if prev is not None:
            frame = {k: np.concatenate([prev[k], frame[k]]) for k in frame}
        open_ = frame["end"] > hi
        self.carry[name] = {k: v[open_] for k, v in frame.items()}
        return frame

    def add(self, chunk) -> None:
        lo, hi = chunk.lo, chunk.hi
        run = chunk.running
        codes = run["name_code"].to_numpy(np.int64) if "name_code" in run else np.full(len(run), -1)
        gpu = self._carried(
            "gpu",
            {
                "start": run["start"].to_numpy(np.int64),
                "end": run["end"].to_numpy(np.int64),
                "device": run["device_id"].to_numpy(np.int64),
                "kernel": run["kind"].to_numpy() == KIND_KERNEL,
                "tc": run["uses_tc"].to_numpy(dtype=bool),
                "comm": self.comm_codes[np.where(codes >= 0, codes, self.comm_codes.size - 1)],
            },
            hi,
        )
        loader = self._carried("loader", _interval_cols(chunk.loader), hi)
        io = self._carried("io", _interval_cols(chunk.io), hi)
        inst = chunk.inst
        cpu_rows = np.isin(inst["kind"].to_numpy(), CPU_KINDS)
        cpu = self._carried("cpu", _interval_cols(inst[cpu_rows]), hi)
        win_s = np.clip(self.win_s, lo, hi)
        win_e = np.clip(self.win_e, lo, hi)
        for dev in self.targets:
            if dev is None:
                pids = None  # no GPU at all: classify the host's time
                gpu_classes = [(np.zeros(0, np.int64),) * 2] * 3
            else:
                pids = self.device_pids.get(dev, set())
                on = gpu["device"] == dev
                s, e = gpu["start"], gpu["end"]
                classes = (on & gpu["kernel"] & gpu["tc"], on & gpu["kernel"] & ~gpu["tc"], on & ~gpu["kernel"])
                gpu_classes = [(s[m], e[m]) for m in classes]
                kernel = on & gpu["kernel"]
                self.busy[dev] += busy_split(
                    np.clip(s[on], lo, hi),
                    np.clip(e[on], lo, hi),
                    (kernel & ~gpu["comm"])[on],
                    (kernel & gpu["comm"])[on],
                    (on & ~gpu["kernel"])[on],
                    win_s,
                    win_e,
                )

            def of_pids(frame):
                m = np.ones(frame["start"].size, dtype=bool) if pids is None else np.isin(frame["pid"], list(pids))
                return frame["start"][m], frame["end"][m]

            covered_prev = np.zeros(win_s.size, dtype=np.int64)
            seg_s, seg_e = np.zeros(0, np.int64), np.zeros(0, np.int64)
            times = self.times[dev]
            for c, (s, e) in enumerate(gpu_classes + [of_pids(loader), of_pids(io), of_pids(cpu)]):
                s, e = np.clip(s, lo, hi), np.clip(e, lo, hi)
                seg_s, seg_e = merge_intervals(np.concatenate([seg_s, s]), np.concatenate([seg_e, e]))
                covered = covered_length(seg_s, seg_e, win_s, win_e)
                times[:, c] += covered - covered_prev
                covered_prev = covered
            times[:, -1] += np.maximum(win_e - win_s, 0) - covered_prev

    def result(self) -> dict:
        listed = self.devices if self.devices else [None]
        rows = [(dev if dev is not None else -1, self.times[dev][0]) for dev in listed]
        averaged = self.used if self.used else [None]
        stack = np.stack([self.times[dev] for dev in averaged])  # devices x windows x classes
        mean = stack.mean(axis=0)  # average over the GPUs used
        dev_frame = make_frame({"device_id": [r[0] for r in rows]})
        wl = max(int(self.win_e[0] - self.win_s[0]), 0)
        for c, name in enumerate(CLASSES):
            dev_frame[f"{name}_time"] = [int(r[1][c]) for r in rows]
            dev_frame[f"{name}_pct"] = [100.0 * r[1][c] / wl if wl else 0.0 for r in rows]
        dev_frame["gpu_utilization"] = dev_frame[["tc_pct", "non_tc_pct", "memory_pct"]].sum(axis=1)
        dev_frame["used"] = [r[0] in self.device_pids for r in rows]
        if not self.devices:
            dev_frame["gpu_utilization"] = 0.0
        busy = [self.busy[dev if dev != -1 or self.devices else None][0] for dev, _ in rows]
        for c, name in enumerate(BUSY):
            dev_frame[f"{name}_busy"] = [int(b[c]) for b in busy]
        dev_frame["gpu_idle_time"] = wl - dev_frame["gpu_busy"]
        # the rank report's names for the same figures (DESIGN.md "GPU time breakdowns")
        dev_frame["communication_time"] = dev_frame["communication_busy"]
        dev_frame["overlapped_communication_time"] = dev_frame["overlapped_communication_busy"]
        busy_mean = np.stack([self.busy[dev] for dev in averaged]).mean(axis=0)
        return {
            "mean": mean,
            "busy_mean": busy_mean,
            "devices": dev_frame,
            "n_devices": len(self.used),
            "n_listed": len(self.devices),
        }


def sums_by_key(keys: np.ndarray, *columns: np.ndarray) -> list[pd.Series]:
    """Per distinct key (index sorted), the sum of each int64 column: `Series(column, index=keys)
    .groupby(level=0).sum()` for all columns with one factorizing of the keys."""
    codes, uniques = pd.factorize(keys, sort=True)
    out = []
    for column in columns:
        total = np.zeros(len(uniques), dtype=np.int64)
        np.add.at(total, codes, np.asarray(column, dtype=np.int64))
        out.append(pd.Series(total, index=uniques))
    return out


def _add_series(a: pd.Series, b: pd.Series) -> pd.Series:
    return b if len(a) == 0 else a.add(b, fill_value=0)


def _interval_cols(frame: pd.DataFrame) -> dict:
    return {
        "start": frame["start"].to_numpy(np.int64),
        "end": frame["end"].to_numpy(np.int64),
        "pid": frame["pid"].to_numpy(np.int64),
    }
