"""Aggregate: one aggregation (domain, key node, iteration range) -> op, op-type, kernel, Tensor Core,
group-node, iteration, device and summary tables (DESIGN.md "Per op instance", "Iterations",
"Tensor Cores", "Summary time breakdown")."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from dlprof_profiler.correlate import (BACKWARD_PASS, RANGE_OP, SCOPE_OP, UNASSOCIATED_API, Correlation,
                                       DomainModel)
from dlprof_profiler.intervals import covered_length, merge_intervals, union_length_by_group
from dlprof_profiler.iterate import Iterations
from dlprof_profiler.trace import KIND_KERNEL, Trace, make_frame, obj

CLASSES = ("tc", "non_tc", "memory", "dataloader", "io", "cpu", "other")
COMPLETE_MODEL = "_CompleteModel_"


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
    iterations: pd.DataFrame = None      # every iteration of the profile
    ops: pd.DataFrame = None             # per op with calls in the aggregation
    op_types: pd.DataFrame = None
    kernels: pd.DataFrame = None         # per (kernel name, op)
    tensor_core: pd.DataFrame = None     # per TC-eligible op
    groups: pd.DataFrame = None          # per group node of the op-name tree
    devices: pd.DataFrame = None         # per visible GPU: time breakdown
    kernel_launches: pd.DataFrame = None  # per kernel launch in the aggregation (iteration report)

    @property
    def wall_time(self) -> int:
        return self.window_end - self.window_start


def aggregate(trace: Trace, corr: Correlation, dm: DomainModel, iterations: Iterations, iter_start: int,
              iter_stop: int) -> Aggregation:
    """Compute every table of one aggregation of one domain."""
    inst = dm.instances
    gpu = trace.gpu
    inst_iter = iterations.of(inst["start"].to_numpy(np.int64))
    act_iter = activity_iterations(trace, corr, iterations)
    sel_inst = (inst_iter >= iter_start) & (inst_iter <= iter_stop)
    sel_act = (act_iter >= iter_start) & (act_iter <= iter_stop)
    window_start = int(iterations.starts[iter_start])
    ends = [int(inst["end"].to_numpy()[sel_inst].max()) if sel_inst.any() else None,
            int(gpu["end"].to_numpy()[sel_act].max()) if sel_act.any() else None]
    ends = [e for e in ends if e is not None]
    window_end = max(ends) if ends else int(iterations.ends[iter_stop])
    window_end = max(window_end, window_start)
    agg = Aggregation(domain=dm.domain, family=dm.family, mode=corr.mode, key_node=iterations.key_node or "",
                      key_found=iterations.found, key_source=iterations.source, iter_start=iter_start,
                      iter_stop=iter_stop, total_iterations=iterations.count, window_start=window_start,
                      window_end=window_end)

    kernel_mask = (gpu["kind"].to_numpy() == KIND_KERNEL) if len(gpu) else np.zeros(0, dtype=bool)
    launches = kernel_launch_frame(trace, corr, dm, act_iter)
    agg.kernel_launches = launches[sel_act[kernel_mask]].reset_index(drop=True) if len(launches) else launches
    agg.ops = op_statistics(inst, dm, sel_inst, corr.uses_tc & kernel_mask, launches[sel_act[kernel_mask]])
    agg.op_types = op_type_statistics(inst[sel_inst], dm.ops)
    agg.kernels = kernel_statistics(agg.kernel_launches, gpu)
    agg.tensor_core = tensor_core_statistics(agg.ops, agg.kernel_launches, gpu)
    agg.groups = group_statistics(inst, inst_iter, sel_inst, dm, gpu, agg.ops)
    breakdown = time_breakdown(trace, corr, dm, iterations, window_start, window_end)
    agg.devices = breakdown["devices"]
    agg.iterations = iteration_table(iterations, act_iter, kernel_mask, corr.uses_tc, gpu, breakdown,
                                     iter_start, iter_stop)
    agg.summary = summary(agg, trace, corr, sel_act, kernel_mask, breakdown)
    return agg


def activity_iterations(trace: Trace, corr: Correlation, iterations: Iterations) -> np.ndarray:
    """A GPU activity belongs to the iteration of the API call that launched it (own start if none)."""
    gpu, api = trace.gpu, trace.api_calls
    if len(gpu) == 0:
        return np.zeros(0, dtype=np.int64)
    launch = gpu["start"].to_numpy(np.int64).copy()
    has = corr.gpu_api >= 0
    if has.any():
        launch[has] = api["start"].to_numpy(np.int64)[corr.gpu_api[has]]
    return iterations.of(launch)


def kernel_launch_frame(trace: Trace, corr: Correlation, dm: DomainModel, act_iter: np.ndarray) -> pd.DataFrame:
    """One row per kernel launch: iteration, op, device, GPU and API times, Tensor Core use."""
    gpu, api = trace.gpu, trace.api_calls
    kernels = np.flatnonzero(gpu["kind"].to_numpy() == KIND_KERNEL) if len(gpu) else np.zeros(0, dtype=np.int64)
    api_row = corr.gpu_api[kernels]
    has_api = api_row >= 0
    safe = np.maximum(api_row, 0)
    inst_row = dm.gpu_instance[kernels]
    return make_frame({
        "activity_id": gpu["activity_id"].to_numpy(np.int64)[kernels],
        "iteration": act_iter[kernels],
        "instance": inst_row,
        "op_index": dm.instances["op_index"].to_numpy(np.int64)[inst_row] if len(kernels) else np.zeros(0, np.int64),
        "name_code": _codes(gpu["name"])[kernels],
        "device_id": gpu["device_id"].to_numpy(np.int64)[kernels],
        "gpu_start": gpu["start"].to_numpy(np.int64)[kernels],
        "gpu_duration": (gpu["end"] - gpu["start"]).to_numpy(np.int64)[kernels],
        "api_row": api_row,
        "api_start": np.where(has_api, api["start"].to_numpy(np.int64)[safe] if len(api) else 0, -1),
        "api_duration": np.where(has_api, (api["end"] - api["start"]).to_numpy(np.int64)[safe] if len(api) else 0, -1),
        "uses_tc": corr.uses_tc[kernels],
    })


def _codes(names: pd.Series) -> np.ndarray:
    """Integer codes of a categorical name column (so grouping never hashes strings)."""
    return names.cat.codes.to_numpy(np.int64) if isinstance(names.dtype, pd.CategoricalDtype) \
        else pd.factorize(names.to_numpy(dtype=object))[0].astype(np.int64)


def with_names(launches: pd.DataFrame, gpu: pd.DataFrame) -> pd.DataFrame:
    """Kernel launch rows with their short and long kernel names as text columns."""
    cats = gpu["name"].cat.categories.to_numpy(dtype=object) if len(gpu) else np.zeros(0, dtype=object)
    long_cats = gpu["long_name"].cat.categories.to_numpy(dtype=object) if len(gpu) else np.zeros(0, dtype=object)
    out = launches.copy()
    out["name"] = obj(cats[launches["name_code"].to_numpy()] if len(launches) else [], out.index)
    if "long_code" in launches:
        out["long_name"] = obj(long_cats[launches["long_code"].to_numpy()] if len(launches) else [], out.index)
    return out


def with_launch_details(launches: pd.DataFrame, gpu: pd.DataFrame) -> pd.DataFrame:
    """Kernel launch rows with names, long names and grid/block sizes (for the iteration report)."""
    out = with_names(launches, gpu)
    rows = launches["activity_id"].to_numpy() if len(launches) else np.zeros(0, dtype=np.int64)
    long_cats = gpu["long_name"].cat.categories.to_numpy(dtype=object) if len(gpu) else np.zeros(0, dtype=object)
    out["long_name"] = obj(long_cats[gpu["long_name"].cat.codes.to_numpy()[rows]] if len(rows) else [], out.index)
    for c in ("grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z"):
        out[c] = gpu[c].to_numpy()[rows]
    return out


def _stats(frame: pd.DataFrame, by, column: str, prefix: str) -> pd.DataFrame:
    g = frame.groupby(by, sort=False)[column]
    out = make_frame({f"{prefix}_total": g.sum(), f"{prefix}_min": g.min(), f"{prefix}_max": g.max()})
    out[f"{prefix}_avg"] = out[f"{prefix}_total"] / g.size()
    return out


def op_statistics(inst: pd.DataFrame, dm: DomainModel, sel_inst: np.ndarray, tc_activity: np.ndarray,
                  launches: pd.DataFrame) -> pd.DataFrame:
    """Per op with calls in the aggregation: calls and total/avg/min/max of the four instance metrics."""
    chosen = inst[sel_inst]
    parts = [_stats(chosen, "op_index", c, p) for c, p in
             (("cpu_time", "cpu"), ("gpu_time", "gpu"), ("cpu_overhead", "overhead"), ("gpu_idle", "idle"))]
    stats = pd.concat(parts, axis=1)
    stats["calls"] = chosen.groupby("op_index", sort=False).size()
    stats["kernel_calls"] = chosen.groupby("op_index", sort=False)["n_kernels"].sum()
    # An op uses Tensor Cores when any kernel of its aggregated instances does.
    selected_instances = np.zeros(len(inst), dtype=bool)
    selected_instances[chosen["instance_id"].to_numpy()] = True
    tc_inst = np.flatnonzero(tc_activity)
    tc_ops = set()
    if tc_inst.size:
        owner = dm.gpu_instance[tc_inst]
        owner = owner[selected_instances[owner]]
        tc_ops = set(np.unique(inst["op_index"].to_numpy()[owner]).tolist())
    stats = stats.reset_index().rename(columns={"index": "op_index"})
    ops = dm.ops.merge(stats, on="op_index", how="inner")
    ops["using_tc"] = ops["op_index"].isin(tc_ops)
    ops["is_bad_data_type"] = ops["tc_eligible"] & ~ops["using_tc"] & \
        ~ops["data_type"].fillna("").isin(["float16", "half", "bfloat16", "float8_e4m3fn", "float8_e5m2"])
    kernel_time = launches.groupby("op_index")["gpu_duration"].sum() if len(launches) else pd.Series(dtype="int64")
    ops["kernel_time"] = ops["op_index"].map(kernel_time).fillna(0).astype(np.int64)
    return ops.sort_values("first_start", kind="stable").reset_index(drop=True)


def op_type_statistics(chosen: pd.DataFrame, ops: pd.DataFrame) -> pd.DataFrame:
    """Per op type: distinct ops, calls, and statistics over the calls."""
    frame = chosen.merge(ops[["op_index", "op_type"]].rename(columns={"op_type": "type"}), on="op_index")
    parts = [_stats(frame, "type", c, p) for c, p in
             (("cpu_time", "cpu"), ("gpu_time", "gpu"), ("cpu_overhead", "overhead"), ("gpu_idle", "idle"))]
    out = pd.concat(parts, axis=1)
    out["calls"] = frame.groupby("type", sort=False).size()
    out["n_ops"] = frame.groupby("type", sort=False)["op_index"].nunique()
    out = out.reset_index().rename(columns={"type": "op_type", "index": "op_type"})
    return out.sort_values("op_type", kind="stable").reset_index(drop=True)


def kernel_statistics(launches: pd.DataFrame, gpu: pd.DataFrame) -> pd.DataFrame:
    """Per (kernel name, op): GPU time and launching-API time statistics."""
    if len(launches) == 0:
        return pd.DataFrame(columns=["name", "op_index", "uses_tc", "count"])
    g = launches.groupby(["name_code", "op_index"], sort=False)
    out = make_frame({
        "count": g.size(), "uses_tc": g["uses_tc"].any(),
        "gpu_total": g["gpu_duration"].sum(), "gpu_min": g["gpu_duration"].min(),
        "gpu_max": g["gpu_duration"].max(), "first_start": g["gpu_start"].min(),
        "first_activity": g["activity_id"].min(),
    })
    out["gpu_avg"] = out["gpu_total"] / out["count"]
    with_api = launches[launches["api_row"] >= 0]
    ga = with_api.groupby(["name_code", "op_index"], sort=False)["api_duration"]
    api = make_frame({"api_total": ga.sum(), "api_min": ga.min(), "api_max": ga.max(), "api_count": ga.size()})
    out = out.join(api, how="left")
    out["api_avg"] = out["api_total"] / out["api_count"]
    for c in ("api_total", "api_min", "api_max", "api_count"):
        out[c] = out[c].fillna(0).astype(np.int64)
    out["api_avg"] = out["api_avg"].fillna(0.0)
    out = with_names(out.reset_index(), gpu)
    long_cats = gpu["long_name"].cat.categories.to_numpy(dtype=object)
    out["long_name"] = obj(long_cats[gpu["long_name"].cat.codes.to_numpy()[out["first_activity"].to_numpy()]],
                           out.index)
    return out.sort_values(["first_start", "name"], kind="stable").reset_index(drop=True)


def tensor_core_statistics(ops: pd.DataFrame, launches: pd.DataFrame, gpu: pd.DataFrame) -> pd.DataFrame:
    """Per TC-eligible op: kernel time split into TC and non-TC kernels, counts of distinct names."""
    eligible = ops[ops["tc_eligible"]]
    rows = eligible[["op_index", "op_id", "name", "direction", "op_type", "using_tc", "first_start"]].copy()
    k = launches[launches["op_index"].isin(set(rows["op_index"]))] if len(launches) else launches
    if len(k):
        total = k.groupby("op_index")["gpu_duration"].sum()
        tc = k[k["uses_tc"]].groupby("op_index")["gpu_duration"].sum()

        cats = gpu["name"].cat.categories.to_numpy(dtype=object)

        def names(frame):
            pairs = frame[["op_index", "name_code"]].drop_duplicates()
            pairs = pairs.assign(name=cats[pairs["name_code"].to_numpy()])
            return pairs.groupby("op_index")["name"].agg(lambda s: sorted(s))
        tc_names = names(k[k["uses_tc"]])
        other_names = names(k[~k["uses_tc"]])
    else:
        total = tc = pd.Series(dtype="int64")
        tc_names = other_names = pd.Series(dtype=object)
    rows["total_gpu_time"] = rows["op_index"].map(total).fillna(0).astype(np.int64)
    rows["tc_gpu_time"] = rows["op_index"].map(tc).fillna(0).astype(np.int64)
    rows["non_tc_gpu_time"] = rows["total_gpu_time"] - rows["tc_gpu_time"]
    rows["tc_utilization"] = np.where(rows["total_gpu_time"] > 0,
                                      100.0 * rows["tc_gpu_time"] / rows["total_gpu_time"].clip(lower=1), 0.0)
    empty = [[] for _ in range(len(rows))]
    rows["tc_kernel_names"] = rows["op_index"].map(tc_names)
    rows["non_tc_kernel_names"] = rows["op_index"].map(other_names)
    rows["tc_kernel_names"] = [v if isinstance(v, list) else [] for v in rows["tc_kernel_names"]] if len(rows) else empty
    rows["non_tc_kernel_names"] = [v if isinstance(v, list) else [] for v in rows["non_tc_kernel_names"]] if len(rows) else empty
    rows["tc_kernel_count"] = rows["tc_kernel_names"].map(len).astype(np.int64) if len(rows) else 0
    rows["non_tc_kernel_count"] = rows["non_tc_kernel_names"].map(len).astype(np.int64) if len(rows) else 0
    rows["total_kernel_count"] = rows["tc_kernel_count"] + rows["non_tc_kernel_count"]
    return rows.sort_values("op_id", kind="stable").reset_index(drop=True)


def group_prefixes(name: str) -> list[str]:
    """Interior nodes of the op-name tree above an op: '/a/b/c' -> ['/', '/a/', '/a/b/']."""
    parts = name.split("/")
    if len(parts) < 2:
        return []
    return ["/".join(parts[:i]) + "/" for i in range(1, len(parts))]


def group_statistics(inst, inst_iter, sel_inst, dm: DomainModel, gpu: pd.DataFrame, ops: pd.DataFrame) -> pd.DataFrame:
    """Per group node (and _CompleteModel_): times flattened over its ops per iteration, then statistics
    over the aggregated iterations. Computed one tree level at a time: at each level an instance belongs
    to at most one node, so memory stays linear in the instances whatever the depth."""
    chosen = np.flatnonzero(sel_inst)
    if chosen.size == 0:
        return pd.DataFrame(columns=["name", "level"])
    op_names = dm.ops["name"].to_numpy(dtype=object)
    n_ops = len(op_names)
    prefixes = [group_prefixes(str(name)) for name in op_names]  # per op, not per instance
    depth = max((len(p) for p in prefixes), default=0)
    group_names: list[str] = []
    group_index: dict[str, int] = {}
    # prefix_code[level][op] = the op's group node at that level (-1: none); the last level is the complete model
    prefix_code = np.full((depth + 1, n_ops), -1, dtype=np.int64)
    for op, groups in enumerate(prefixes):
        for level, name in enumerate(groups):
            prefix_code[level, op] = group_index.setdefault(name, len(group_index))
    for name in group_index:
        group_names.append(name)
    group_names.append(COMPLETE_MODEL)
    prefix_code[depth, :] = len(group_names) - 1
    n_iter = int(inst_iter.max()) + 2
    inst_op = inst["op_index"].to_numpy()[chosen]
    it = inst_iter[chosen]
    s, e = inst["start"].to_numpy()[chosen], inst["end"].to_numpy()[chosen]
    overhead = inst["cpu_overhead"].to_numpy()[chosen]
    if len(gpu):
        in_chosen = np.zeros(len(inst), dtype=bool)
        in_chosen[chosen] = True
        act = np.flatnonzero(in_chosen[dm.gpu_instance])
        owner = dm.gpu_instance[act]
        act_op, act_it = inst["op_index"].to_numpy()[owner], inst_iter[owner]
        gs, ge = gpu["start"].to_numpy()[act], gpu["end"].to_numpy()[act]
    parts = []
    for level in range(depth + 1):
        g = prefix_code[level][inst_op]
        on = g >= 0
        key = g[on] * n_iter + it[on]
        per = make_frame({"cpu": union_length_by_group(key, s[on], e[on]),
                          "overhead": pd.Series(overhead[on], index=key).groupby(level=0).sum(),
                          "calls": pd.Series(1, index=key).groupby(level=0).sum()})
        per["gpu"] = 0
        per["idle"] = 0
        if len(gpu) and act.size:
            ga = prefix_code[level][act_op]
            aon = ga >= 0
            gkey = ga[aon] * n_iter + act_it[aon]
            busy = union_length_by_group(gkey, gs[aon], ge[aon])
            span = pd.DataFrame({"s": gs[aon], "e": ge[aon]}, index=gkey).groupby(level=0).agg(s=("s", "min"),
                                                                                                e=("e", "max"))
            per["gpu"] = busy.reindex(per.index).fillna(0).astype(np.int64)
            per["idle"] = ((span["e"] - span["s"]).reindex(per.index).fillna(0).astype(np.int64)
                           - per["gpu"]).clip(lower=0)
        per["g"] = per.index.to_numpy() // n_iter
        parts.append(per)
    per = pd.concat(parts)
    out = make_frame({"name": np.asarray(group_names, dtype=object)})
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
    used[np.unique(inst_op)] = True
    eligible = flags["tc_eligible"].fillna(False).to_numpy(dtype=bool) & used
    using = flags["using_tc"].fillna(False).to_numpy(dtype=bool) & used
    counts = {name: np.zeros(len(group_names), dtype=np.int64) for name in ("n_ops", "n_tc_eligible", "n_using_tc")}
    for level in range(depth + 1):
        codes = prefix_code[level]
        for name, mask in (("n_ops", used), ("n_tc_eligible", eligible), ("n_using_tc", using)):
            hit = (codes >= 0) & mask
            counts[name] += np.bincount(codes[hit], minlength=len(group_names))
    for name, values in counts.items():
        out[name] = values
    out = out[out["calls"].notna()]
    out["calls"] = out["calls"].astype(np.int64)
    out["level"] = [-1 if n == COMPLETE_MODEL else n.count("/") - (1 if n.startswith("/") else 0) for n in out["name"]]
    complete = out["name"] == COMPLETE_MODEL
    return pd.concat([out[~complete].sort_values("name", kind="stable"), out[complete]], ignore_index=True)


# ---------------------------------------------------------------------------- time breakdown

def _class_intervals(trace: Trace, corr: Correlation, dm: DomainModel, pids: set | None, device: int | None):
    """The seven classes' raw intervals for one GPU (pids: the processes driving it)."""
    gpu = trace.gpu
    empty = (np.zeros(0, np.int64), np.zeros(0, np.int64))
    if device is not None and len(gpu):
        on = gpu["device_id"].to_numpy() == device
        kernel = gpu["kind"].to_numpy() == KIND_KERNEL
        s, e = gpu["start"].to_numpy(np.int64), gpu["end"].to_numpy(np.int64)
        tc = on & kernel & corr.uses_tc
        non_tc = on & kernel & ~corr.uses_tc
        mem = on & ~kernel
        gpu_classes = [(s[tc], e[tc]), (s[non_tc], e[non_tc]), (s[mem], e[mem])]
    else:
        gpu_classes = [empty, empty, empty]

    def of_pids(frame, mask=None):
        if len(frame) == 0:
            return empty
        m = np.ones(len(frame), dtype=bool) if mask is None else mask
        if pids is not None:
            m = m & frame["pid"].isin(pids).to_numpy()
        return frame["start"].to_numpy(np.int64)[m], frame["end"].to_numpy(np.int64)[m]
    ranges = trace.ranges
    loader = corr.range_info["dataloader"].to_numpy(dtype=bool) if len(ranges) else None
    inst = dm.instances
    cpu_kinds = np.isin(inst["kind"].to_numpy(), (RANGE_OP, SCOPE_OP, BACKWARD_PASS, UNASSOCIATED_API))
    return gpu_classes + [of_pids(ranges, loader), of_pids(trace.io_calls), of_pids(inst, cpu_kinds)]


def time_breakdown(trace: Trace, corr: Correlation, dm: DomainModel, iterations: Iterations,
                   window_start: int, window_end: int) -> dict:
    """Per GPU, the time each class is active while no earlier class is, in the aggregation window and in
    every iteration interval; then the average over all visible GPUs."""
    win_s = np.concatenate([[window_start], iterations.starts])
    win_e = np.concatenate([[window_end], iterations.ends])
    devices = trace.devices["device_id"].to_numpy(np.int64).tolist() if len(trace.devices) else []
    gpu = trace.gpu
    rows = []
    per_device = []
    targets = devices if devices else [None]
    for dev in targets:
        if dev is None:
            pids = None  # no GPU at all: classify the host's time
        else:
            pids = set(np.unique(gpu["pid"].to_numpy()[gpu["device_id"].to_numpy() == dev]).tolist()) if len(gpu) else set()
        classes = _class_intervals(trace, corr, dm, pids, dev)
        covered_prev = np.zeros(win_s.size, dtype=np.int64)
        seg_s, seg_e = np.zeros(0, np.int64), np.zeros(0, np.int64)
        times = np.zeros((win_s.size, len(CLASSES)), dtype=np.int64)
        for c, (s, e) in enumerate(classes):
            seg_s, seg_e = merge_intervals(np.concatenate([seg_s, s]), np.concatenate([seg_e, e]))
            covered = covered_length(seg_s, seg_e, win_s, win_e)
            times[:, c] = covered - covered_prev
            covered_prev = covered
        times[:, -1] = np.maximum(win_e - win_s, 0) - covered_prev
        per_device.append(times)
        rows.append((dev if dev is not None else -1, times[0]))
    stack = np.stack(per_device)              # devices x windows x classes
    mean = stack.mean(axis=0)                 # average over visible GPUs
    length = np.maximum(win_e - win_s, 0)
    dev_frame = make_frame({"device_id": [r[0] for r in rows]})
    wl = max(window_end - window_start, 0)
    for c, name in enumerate(CLASSES):
        dev_frame[f"{name}_time"] = [int(r[1][c]) for r in rows]
        dev_frame[f"{name}_pct"] = [100.0 * r[1][c] / wl if wl else 0.0 for r in rows]
    dev_frame["gpu_utilization"] = dev_frame[["tc_pct", "non_tc_pct", "memory_pct"]].sum(axis=1)
    if not devices:
        dev_frame["gpu_utilization"] = 0.0
    return {"mean": mean, "length": length, "devices": dev_frame, "n_devices": len(devices)}


def iteration_table(iterations: Iterations, act_iter, kernel_mask, uses_tc, gpu, breakdown, iter_start,
                    iter_stop) -> pd.DataFrame:
    """Every iteration: interval, kernels, Tensor Core kernels, GPU time per GPU, class times (GPU average)."""
    n = iterations.count
    starts, ends = iterations.starts, iterations.ends
    frame = make_frame({"iteration": np.arange(n), "start": starts, "end": ends, "duration": ends - starts})
    frame["aggregated"] = (frame["iteration"] >= iter_start) & (frame["iteration"] <= iter_stop)
    dur = (gpu["end"] - gpu["start"]).to_numpy(np.int64) if len(gpu) else np.zeros(0, np.int64)
    k = kernel_mask
    frame["kernels"] = np.bincount(act_iter[k], minlength=n)[:n] if k.any() else 0
    frame["tc_kernels"] = np.bincount(act_iter[k & uses_tc], minlength=n)[:n] if (k & uses_tc).any() else 0
    n_dev = max(breakdown["n_devices"], 1)
    frame["kernel_time_per_gpu"] = (np.bincount(act_iter[k], weights=dur[k], minlength=n)[:n] / n_dev) \
        if k.any() else 0.0
    frame["tc_kernel_time_per_gpu"] = (np.bincount(act_iter[k & uses_tc], weights=dur[k & uses_tc],
                                                   minlength=n)[:n] / n_dev) if (k & uses_tc).any() else 0.0
    mean = breakdown["mean"][1:]  # row 0 is the aggregation window
    for c, name in enumerate(CLASSES):
        frame[f"{name}_time"] = mean[:, c]
    length = np.maximum(frame["duration"].to_numpy(), 1)
    frame["gpu_utilization"] = 100.0 * (mean[:, 0] + mean[:, 1] + mean[:, 2]) / length \
        if breakdown["n_devices"] else 0.0
    return frame


def summary(agg: Aggregation, trace: Trace, corr: Correlation, sel_act, kernel_mask, breakdown) -> dict:
    """The summary report's numbers."""
    wall = agg.wall_time
    mean = breakdown["mean"][0]
    pct = {name: (100.0 * mean[c] / wall if wall else 0.0) for c, name in enumerate(CLASSES)}
    gpu_util = (pct["tc"] + pct["non_tc"] + pct["memory"]) if breakdown["n_devices"] else 0.0
    ops = agg.ops
    launches = agg.kernel_launches
    eligible_ops = set(ops.loc[ops["tc_eligible"], "op_index"]) if len(ops) else set()
    in_eligible = launches["op_index"].isin(eligible_ops).to_numpy() if len(launches) else np.zeros(0, bool)
    elig_time = int(launches["gpu_duration"].to_numpy()[in_eligible].sum()) if len(launches) else 0
    elig_tc = int(launches["gpu_duration"].to_numpy()[in_eligible & launches["uses_tc"].to_numpy()].sum()) \
        if len(launches) else 0
    it = agg.iterations
    chosen = it[it["aggregated"]]
    durations = chosen["duration"].to_numpy(np.float64)
    aggregated = agg.iter_stop - agg.iter_start + 1
    std = float(np.std(durations, ddof=1)) if durations.size > 1 else 0.0

    def op_row(mask):
        sub = ops[mask] if len(ops) else ops
        return {"gpu_time": int(sub["gpu_total"].sum()) if len(sub) else 0,
                "cpu_time": int(sub["cpu_total"].sum()) if len(sub) else 0, "count": int(len(sub))}
    if len(ops):
        using = ops["using_tc"].to_numpy(dtype=bool)
        elig = ops["tc_eligible"].to_numpy(dtype=bool)
    else:
        using = elig = np.zeros(0, dtype=bool)
    gpu, api = trace.gpu, trace.api_calls
    all_rows = np.flatnonzero(sel_act)
    kinds = {"all": all_rows, "tc": all_rows[kernel_mask[all_rows] & corr.uses_tc[all_rows]],
             "memory": all_rows[~kernel_mask[all_rows]],
             "other": all_rows[kernel_mask[all_rows] & ~corr.uses_tc[all_rows]]}

    name_codes = _codes(gpu["name"]) if len(gpu) else np.zeros(0, dtype=np.int64)

    def kernel_row(rows):
        if rows.size == 0:
            return {"gpu_time": 0, "cpu_time": 0, "count": 0}
        dur = (gpu["end"].to_numpy(np.int64) - gpu["start"].to_numpy(np.int64))[rows]
        api_rows = np.unique(corr.gpu_api[rows])
        api_rows = api_rows[api_rows >= 0]
        api_time = int((api["end"].to_numpy(np.int64) - api["start"].to_numpy(np.int64))[api_rows].sum()) \
            if api_rows.size else 0
        return {"gpu_time": int(dur.sum()), "cpu_time": api_time, "count": int(np.unique(name_codes[rows]).size)}
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
        "ops": {"all": op_row(np.ones(len(ops), dtype=bool)), "using_tc": op_row(using),
                "eligible_not_using": op_row(elig & ~using), "other": op_row(~elig & ~using)},
        "kernels": {k: kernel_row(v) for k, v in kinds.items()},
        "key_node": agg.key_node, "key_found": bool(agg.key_found),
        "n_visible_gpus": int(breakdown["n_devices"]),
    }
