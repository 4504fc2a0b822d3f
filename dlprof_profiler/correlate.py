"""Correlate: NVTX ranges x CUDA API calls x GPU activities -> op instances and ops, per NVTX domain.

DESIGN.md "Correlation": a GPU activity belongs to the API call with its (process, correlation id); an API
call to the op instance whose range encloses the call's start on the same thread; framework-op markers fold
nested markers into the outermost one; scope ranges give the name hierarchy; whatever no range covers
becomes an `unassociated_<name>` op, so every GPU activity belongs to exactly one op instance.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from dlprof_profiler import nvtx_markers as nm
from dlprof_profiler.intervals import covered_length, union_length_by_group
from dlprof_profiler.structure import (RangeForest, ThreadTimeKeys, levels, nearest_flagged_ancestor,
                                       outermost_flagged)
from dlprof_profiler.tensor_cores import kernel_uses_tc, op_tc_eligible
from dlprof_profiler.trace import KIND_KERNEL, Trace, combined_codes, make_frame, obj, rank_within

# Instance kinds
RANGE_OP, SCOPE_OP, UNASSOCIATED_API, UNASSOCIATED_GPU, BACKWARD_PASS = range(5)

INSTANCE_COLUMNS = ["instance_id", "op_index", "domain", "kind", "range_id", "api_id", "activity_id", "start",
                    "end", "pid", "global_tid", "device_id", "cpu_time", "cpu_overhead", "gpu_time",
                    "gpu_start", "gpu_end", "gpu_idle", "n_gpu", "n_kernels", "data_type",
                    "input_shapes", "output_shapes", "parameters", "stack_trace"]
OP_COLUMNS = ["op_index", "domain", "op_id", "name", "direction", "op_type", "tc_eligible", "data_type",
              "stack_trace", "device_id", "first_start", "n_instances"]


@dataclass
class DomainModel:
    """The op model of one NVTX domain: its op instances and ops, and who owns each API call / activity."""

    domain: str
    family: str | None
    has_markers: bool
    instances: pd.DataFrame
    ops: pd.DataFrame
    api_instance: np.ndarray   # per API call: row in instances
    gpu_instance: np.ndarray   # per GPU activity: row in instances
    n_ranges: int = 0


@dataclass
class Correlation:
    """Everything correlate derives from a trace: shared links plus one DomainModel per domain."""

    gpu_api: np.ndarray                    # per GPU activity: row in trace.api_calls, -1 if none
    uses_tc: np.ndarray                    # per GPU activity: kernel uses Tensor Cores
    tc_rule: np.ndarray                    # per GPU activity: id of the deciding rule
    range_info: pd.DataFrame               # per range: classification + parent/depth
    mode: str
    family: str | None
    thread_device: dict
    process_device: dict
    domains: dict[str, DomainModel] = field(default_factory=dict)
    config: dict = field(default_factory=dict)
    range_labels: pd.DataFrame | None = None  # per (domain, label): kind and number of ranges

    @property
    def range_counts(self) -> dict:
        """NVTX ranges per domain (op markers and scopes)."""
        return {name: int(dm.n_ranges) for name, dm in self.domains.items()}


# ---------------------------------------------------------------------------- entry points

def take(values: np.ndarray, idx: np.ndarray, default) -> np.ndarray:
    """values[idx] where idx >= 0, else default (also when values is empty)."""
    idx = np.asarray(idx, dtype=np.int64)
    if values.size == 0:
        return np.full(idx.shape, default, dtype=values.dtype if values.dtype != object else object)
    return np.where(idx >= 0, values[np.maximum(idx, 0)], default)


FAMILY_OF_MODE = {"pytorch": "pytorch", "tensorflow1": "tensorflow", "tensorflow2": "tensorflow",
                  "tensorrt": "tensorrt", "nvtx": None, "simple": None}


def classify_trace(trace: Trace, mode: str | None) -> tuple[pd.DataFrame, str, str | None, dict]:
    """Classify every range; return (range_info, mode, family, run config from config markers)."""
    ranges = trace.ranges
    if mode == "simple" or len(ranges) == 0:
        # no op analysis, but the ranges still say where data loading happens (summary breakdown)
        info = nm.classify_ranges(ranges["text"], ranges["domain"], set())
        return info, (mode or "simple"), None, {}
    families = None
    if mode in FAMILY_OF_MODE:
        fam = FAMILY_OF_MODE[mode]
        families = {fam} if fam else set()
    info = nm.classify_ranges(ranges["text"], ranges["domain"], families)
    _adopt_range_details(info, ranges)
    config = {}
    for entry in info.attrs.get("config", []):
        config.update(entry)
    kinds = info["kind"].to_numpy()
    if mode is None:
        if np.isin(kinds, (nm.PT_OP, nm.DL_ARG, nm.DL_TRACE)).any():
            mode = "pytorch"
        elif (kinds == nm.TF_OP).any():
            mode = "tensorflow2"
        elif (kinds == nm.TRT_LAYER).any():
            mode = "tensorrt"
        else:
            mode = "nvtx"
    return info, mode, FAMILY_OF_MODE.get(mode), config


RANGE_DETAIL_COLUMNS = ("data_type", "input_shapes", "stack_trace")


def _adopt_range_details(info: pd.DataFrame, ranges: pd.DataFrame) -> None:
    """Details an adapter pre-parsed for ranges (Kineto: input types, shapes, call stacks) fill what the
    range texts do not say."""
    for column in RANGE_DETAIL_COLUMNS:
        if column in ranges.columns:
            given = ranges[column].to_numpy(dtype=object)
            current = info[column].to_numpy(dtype=object)
            info[column] = obj(np.where(np.equal(current, None), given, current), info.index)


def domain_order(trace: Trace, mode: str | None) -> list[str]:
    """The NVTX domains that get an op model, in order of first appearance (just `default` when there
    are no ranges or in simple mode)."""
    if mode == "simple" or len(trace.ranges) == 0:
        return ["default"]
    return [str(d) for d in pd.unique(trace.ranges["domain"])]


def range_label_counts(ranges: pd.DataFrame, info: pd.DataFrame) -> pd.DataFrame:
    """How many ranges carry each label, per domain (counted on integer codes: labels are shared)."""
    if len(ranges) == 0:
        return pd.DataFrame({"domain": [], "label": [], "kind": [], "num_ranges": []})
    domain_code, domain_names = pd.factorize(ranges["domain"].to_numpy(dtype=object))
    text_code = info["text_code"].to_numpy() if "text_code" in info else \
        pd.factorize(info["label"].to_numpy(dtype=object))[0]
    codes = combined_codes(domain_code, text_code)
    counts = np.bincount(codes)
    first = np.full(counts.size, -1, dtype=np.int64)
    first[codes[::-1]] = np.arange(codes.size - 1, -1, -1)
    table = pd.DataFrame({"domain": np.asarray(domain_names, dtype=object)[domain_code[first]],
                          "label": info["label"].to_numpy(dtype=object)[first],
                          "kind": info["kind"].to_numpy().astype(np.int64)[first], "num_ranges": counts})
    return table.groupby(["domain", "label"], sort=False, as_index=False).agg(
        kind=("kind", "first"), num_ranges=("num_ranges", "sum"))


def link_gpu_to_api(trace: Trace) -> np.ndarray:
    """Row of the launching API call per GPU activity, keyed by (process, correlation id)."""
    gpu, api = trace.gpu, trace.api_calls
    if len(gpu) == 0:
        return np.zeros(0, dtype=np.int64)
    if len(api) == 0:
        return np.full(len(gpu), -1, dtype=np.int64)
    lookup = make_frame({"pid": api["pid"].to_numpy(), "corr": api["correlation_id"].to_numpy(),
                           "row": np.arange(len(api)), "start": api["start"].to_numpy()})
    lookup = lookup[lookup["corr"] >= 0].sort_values("start", kind="stable").drop_duplicates(["pid", "corr"])
    keys = make_frame({"pid": gpu["pid"].to_numpy(), "corr": gpu["correlation_id"].to_numpy()})
    merged = keys.merge(lookup[["pid", "corr", "row"]], on=["pid", "corr"], how="left", sort=False)
    return merged["row"].fillna(-1).to_numpy(np.int64)


def work_devices(trace: Trace, gpu_api: np.ndarray) -> tuple[dict, dict]:
    """The device each thread and each process launches most GPU time on."""
    gpu = trace.gpu
    if len(gpu) == 0:
        return {}, {}
    dur = (gpu["end"] - gpu["start"]).to_numpy()
    has_api = gpu_api >= 0
    tids = np.where(has_api, trace.api_calls["global_tid"].to_numpy()[np.maximum(gpu_api, 0)], -1)
    frame = make_frame({"tid": tids, "pid": gpu["pid"].to_numpy(), "dev": gpu["device_id"].to_numpy(),
                          "dur": dur + 1})

    def mode_of(key):
        sums = frame[frame[key] >= 0].groupby([key, "dev"])["dur"].sum().reset_index()
        best = sums.sort_values([key, "dur", "dev"], ascending=[True, False, True]).drop_duplicates(key)
        return dict(zip(best[key].astype(int), best["dev"].astype(int)))
    return mode_of("tid"), mode_of("pid")


def launch_links(trace: Trace) -> tuple[np.ndarray, dict, dict]:
    """GPU activity -> launching API call, and the device each thread and process launches most work on
    (computed once: iterations need them before correlation does)."""
    gpu_api = link_gpu_to_api(trace)
    thread_dev, process_dev = work_devices(trace, gpu_api)
    return gpu_api, thread_dev, process_dev


def correlate(trace: Trace, mode: str | None = None, naming_bounds: np.ndarray | None = None,
              classified: tuple | None = None, links: tuple | None = None) -> Correlation:
    """Build the op model of every domain. `naming_bounds` are iteration boundaries used only to number
    top-level ops per iteration (so the k-th call of an op in each iteration is the same op); `links` are
    launch_links(trace) when the caller already has them."""
    info, mode, family, config = classified or classify_trace(trace, mode)
    if "gpu_peak_memory" in trace.meta and not any(k in config for k in ("max_memory_reserved",
                                                                        "max_memory_allocated")):
        config = {**config, "peak_memory": int(trace.meta["gpu_peak_memory"])}  # nsys memory-usage events
    gpu_api, thread_dev, process_dev = links or launch_links(trace)
    uses_tc, tc_rule = _kernel_tc_flags(trace)
    bounds = np.zeros(0, dtype=np.int64) if naming_bounds is None else np.asarray(naming_bounds, np.int64)
    corr = Correlation(gpu_api=gpu_api, uses_tc=uses_tc, tc_rule=tc_rule, range_info=info, mode=mode,
                       family=family, thread_device=thread_dev, process_device=process_dev, config=config,
                       range_labels=range_label_counts(trace.ranges, info))
    ranges = trace.ranges
    for domain in domain_order(trace, mode):
        if mode == "simple" or len(ranges) == 0:
            rows = np.zeros(0, dtype=np.int64)
        else:
            rows = np.flatnonzero((ranges["domain"].to_numpy(dtype=object) == domain)
                                  & (info["kind"].to_numpy() != nm.CONFIG))
        corr.domains[domain] = build_domain(trace, corr, domain, rows, bounds)
    return corr


def _kernel_tc_flags(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    gpu = trace.gpu
    uses = np.zeros(len(gpu), dtype=bool)
    rules = np.full(len(gpu), "", dtype=object)
    kernels = (gpu["kind"].to_numpy() == KIND_KERNEL) if len(gpu) else np.zeros(0, dtype=bool)
    if kernels.any():
        u, r = kernel_uses_tc(gpu["name"].to_numpy(dtype=object)[kernels],
                              gpu["long_name"].to_numpy(dtype=object)[kernels])
        uses[kernels] = u
        rules[kernels] = r
    return uses, rules


# ---------------------------------------------------------------------------- one domain

def build_domain(trace: Trace, corr: Correlation, domain: str, rows: np.ndarray,
                 bounds: np.ndarray) -> DomainModel:
    """Op instances and ops of one domain from its ranges (`rows` index trace.ranges)."""
    everything = len(rows) == len(trace.ranges) and (len(rows) == 0 or rows[-1] == len(rows) - 1)
    ranges = trace.ranges if everything else trace.ranges.iloc[rows].reset_index(drop=True)
    info = corr.range_info if everything else corr.range_info.iloc[rows].reset_index(drop=True)
    api = trace.api_calls
    kinds = info["kind"].to_numpy().copy()
    has_markers = bool(np.isin(kinds, nm.OP_MARKERS).any())
    if not has_markers:
        kinds[np.isin(kinds, nm.WRAPPERS)] = nm.SCOPE  # wrappers without ops inside are plain scopes
    tids = ranges["global_tid"].to_numpy(np.int64)
    keys = ThreadTimeKeys([tids, api["global_tid"].to_numpy(np.int64)],
                          [ranges["start"].to_numpy(np.int64), ranges["end"].to_numpy(np.int64),
                           api["start"].to_numpy(np.int64)])
    forest = RangeForest(tids, ranges["start"].to_numpy(), ranges["end"].to_numpy(),
                         ranges["range_id"].to_numpy())
    parent, depth = forest.parent, forest.depth
    is_marker = np.isin(kinds, nm.OP_MARKERS)
    op_root = outermost_flagged(parent, depth, is_marker)
    n_children = np.bincount(parent[parent >= 0], minlength=len(ranges))
    if has_markers:
        is_instance = is_marker & (op_root == np.arange(len(ranges)))
    else:
        is_instance = (n_children == 0) & (kinds == nm.SCOPE)

    # API call -> innermost enclosing range on its thread -> op instance range
    innermost = forest.innermost_at(keys, api["global_tid"].to_numpy(np.int64), api["start"].to_numpy(np.int64))
    del forest, keys  # only the parent links and depths are needed from here on
    owner = np.full(len(api), -1, dtype=np.int64)
    inside = innermost >= 0
    root_of = take(op_root, innermost, -1)
    owner[inside] = np.where(root_of[inside] >= 0, root_of[inside], innermost[inside])
    scope_op = np.zeros(len(ranges), dtype=bool)
    direct = owner[inside & (root_of < 0)]
    scope_op[direct[~is_instance[direct]]] = True  # scope ranges launching API calls directly
    instance_range = is_instance | scope_op

    names = _range_names(trace, ranges, info, kinds, parent, depth, op_root, instance_range, bounds, corr.family)
    frames = [_range_instances(ranges, info, kinds, instance_range, scope_op, names, parent, depth, corr.family)]
    range_row_to_instance = np.full(len(ranges), -1, dtype=np.int64)
    range_row_to_instance[np.flatnonzero(instance_range)] = np.arange(int(instance_range.sum()))

    api_instance = take(range_row_to_instance, owner, -1)
    next_id = int(instance_range.sum())
    backward = _backward_pass_instances(trace, corr, ranges, info, api_instance, bounds, next_id)
    if backward is not None:
        frame, assigned = backward
        api_instance = np.where(assigned >= 0, assigned, api_instance)
        frames.append(frame)
        next_id += len(frame)
    unassoc_api = np.flatnonzero(api_instance < 0)
    frames.append(_unassociated_api_instances(api, unassoc_api, next_id))
    api_instance[unassoc_api] = next_id + np.arange(unassoc_api.size)
    next_id += unassoc_api.size

    gpu_api = corr.gpu_api
    gpu_instance = take(api_instance, gpu_api, -1)
    orphan = np.flatnonzero(gpu_instance < 0)
    frames.append(_unassociated_gpu_instances(trace.gpu, orphan, next_id))
    gpu_instance[orphan] = next_id + np.arange(orphan.size)

    instances = pd.concat([f for f in frames if len(f)] or [frames[0]], ignore_index=True)
    instances["instance_id"] = np.arange(len(instances), dtype=np.int64)
    instances["domain"] = domain
    _instance_metrics(trace, corr, instances, api_instance, gpu_instance)
    _link_backward(instances, info, ranges, op_root, instance_range, corr.family)
    ops = _op_table(instances, domain, corr.family)
    return DomainModel(domain=domain, family=corr.family, has_markers=has_markers, instances=instances,
                       ops=ops, api_instance=api_instance, gpu_instance=gpu_instance, n_ranges=len(ranges))


# ---------------------------------------------------------------------------- naming

FPROP, BPROP = "fprop", "bprop"
_TF_GRADIENT = re.compile(r"(?:^|/)(?:gradients|gradient_tape)(?:_\d+)?/")
_ANGLE = re.compile(r"<([^<>/]*)>")
_REPEAT = re.compile(r"\((\d+)\)(?=/|$)")


def func_stack_path(func_stack: str) -> str:
    """DLProf's op name from a funcStack: `<module>` -> `module`, `(N)` -> `[N]`."""
    text = _ANGLE.sub(r"\1", func_stack)
    text = _REPEAT.sub(r"[\1]", text)
    return text if text.startswith("/") else "/" + text


def _range_names(trace, ranges, info, kinds, parent, depth, op_root, instance_range, bounds, family):
    """Full op names of instance ranges (and of the scopes above them): scope path + '/' + label[k].

    Names are built as integer codes into a table of distinct strings, level by level down the range
    trees, so millions of instances share a few thousand string objects."""
    n = len(ranges)
    names = np.full(n, None, dtype=object)
    if n == 0:
        return names
    is_scope = (kinds == nm.SCOPE) & (op_root < 0)
    naming = is_scope | instance_range
    scope_parent = nearest_flagged_ancestor(parent, depth, is_scope)
    trace_anc = nearest_flagged_ancestor(parent, depth, kinds == nm.DL_TRACE)
    label_code, label_text = pd.factorize(_scope_labels(info["label"].to_numpy(dtype=object), is_scope))
    # DLProf markers: the trace marker around an argument marker names the op by its funcStack.
    fs_code, fs_text = pd.factorize(info["func_stack"].to_numpy(dtype=object))  # None -> -1
    stack = np.full(n, -1, dtype=np.int64)
    has_trace = (kinds == nm.DL_ARG) & (trace_anc >= 0)
    stack[has_trace] = fs_code[trace_anc[has_trace]]
    own_trace = kinds == nm.DL_TRACE
    stack[own_trace] = fs_code[own_trace]
    fs_text = np.asarray(fs_text, dtype=object)
    if fs_text.size:
        stack[(stack >= 0) & (fs_text[np.maximum(stack, 0)] == "")] = -1
    use_stack = (stack >= 0) & naming
    numbered = naming & ~use_stack & (kinds != nm.TF_OP)
    starts = ranges["start"].to_numpy(np.int64)
    k = np.zeros(n, dtype=np.int64)
    rows = np.flatnonzero(numbered)
    if rows.size:
        top = scope_parent[rows] < 0
        group = combined_codes(scope_parent[rows], np.where(top, ranges["global_tid"].to_numpy()[rows], -1),
                               np.where(top, np.searchsorted(bounds, starts[rows], side="right"), -1),
                               label_code[rows])
        rank = rank_within(group, [rows, starts[rows]]) + 1
        k[rows] = np.where(rank >= 2, rank, 0)
    label_text = np.asarray(label_text, dtype=object)
    # element of a name: a funcStack path, or a label with its [k] repeat number
    element_code = combined_codes(np.where(use_stack, stack, -1), np.where(use_stack, -1, label_code),
                                  np.where(use_stack, 0, k))
    element_text = _distinct_texts(element_code, lambda i: func_stack_path(fs_text[stack[i]]) if use_stack[i]
                                   else (f"{label_text[label_code[i]]}[{k[i]}]" if k[i] else label_text[label_code[i]]))
    slash_led = use_stack | ((kinds == nm.TF_OP) & (scope_parent < 0))
    name_code = np.full(n, -1, dtype=np.int64)
    table: list[str] = []
    for idx in levels(depth):
        idx = idx[naming[idx]]
        if idx.size == 0:
            continue
        sp = scope_parent[idx]
        base = np.where(sp >= 0, name_code[np.maximum(sp, 0)], -1)
        pair = combined_codes(base, slash_led[idx], element_code[idx])
        first = _first_rows(pair)
        offset = len(table)
        table.extend((table[base[i]] if base[i] >= 0 else "") + ("" if slash_led[idx[i]] else "/")
                     + element_text[element_code[idx[i]]] for i in first)
        name_code[idx] = offset + pair
    table_array = np.empty(len(table), dtype=object)
    table_array[:] = table
    named = name_code >= 0
    names[named] = table_array[name_code[named]]
    return names


_STEP_COUNTER = re.compile(r"#\d+$")


def _scope_labels(labels: np.ndarray, is_scope: np.ndarray) -> np.ndarray:
    """Scope labels without a trailing `#N` counter (ProfilerStep#5 -> ProfilerStep): the counter changes
    every iteration, so the names of the ops under it would never match across iterations."""
    if not is_scope.any():
        return labels
    out = labels.copy()
    out[is_scope] = nm.per_unique(labels[is_scope], lambda t: _STEP_COUNTER.sub("", t) if isinstance(t, str) else t)
    return out


def _first_rows(codes: np.ndarray) -> np.ndarray:
    """Index of the first element of each code (codes are dense 0..m-1)."""
    first = np.full(int(codes.max()) + 1 if codes.size else 0, -1, dtype=np.int64)
    first[codes[::-1]] = np.arange(codes.size - 1, -1, -1)
    return first


def _distinct_texts(codes: np.ndarray, text_of_row) -> np.ndarray:
    """Strings per dense code, computed from one representative row each."""
    out = np.empty(int(codes.max()) + 1 if codes.size else 0, dtype=object)
    out[:] = [text_of_row(i) for i in _first_rows(codes)]
    return out


def concat_distinct(*columns_and_fn) -> np.ndarray:
    """fn(*values) once per distinct tuple of the columns, spread back: rows that get the same string
    share one object (millions of instances, a few thousand distinct names)."""
    *columns, fn = columns_and_fn
    codes = combined_codes(*columns)
    if codes.size == 0:
        return np.zeros(0, dtype=object)
    return _distinct_texts(codes, lambda i: fn(*(np.asarray(c)[i] for c in columns)))[codes]


def _range_instances(ranges, info, kinds, instance_range, scope_op, names, parent, depth, family):
    rows = np.flatnonzero(instance_range)
    n = rows.size
    direction = np.full(n, "", dtype=object)  # shared string objects, not one per instance
    if family == "pytorch":
        marker_dir = info["direction"].to_numpy(dtype=object)[rows]
        direction[np.isin(kinds[rows], nm.OP_MARKERS)] = FPROP
        direction[info["backward"].to_numpy(dtype=bool)[rows]] = BPROP
        given = pd.notna(marker_dir)
        direction[given & (marker_dir == "bprop")] = BPROP
        direction[given & (marker_dir == "fprop")] = FPROP
    elif family == "tensorflow":
        lbl = info["label"].to_numpy(dtype=object)[rows]
        grad = nm.per_unique(lbl, lambda t: bool(_TF_GRADIENT.search(str(t))), bool)
        tf = kinds[rows] == nm.TF_OP
        direction[tf] = FPROP
        direction[tf & grad] = BPROP
    op_type = info["op_type"].to_numpy(dtype=object)[rows].copy()
    labels = info["label"].to_numpy(dtype=object)[rows]
    # A DLProf trace marker standing in as an op: its funcStack's last frame is the op.
    fs = info["func_stack"].to_numpy(dtype=object)[rows]
    trace_rows = kinds[rows] == nm.DL_TRACE
    if trace_rows.any():
        op_type[trace_rows] = [str(f).rstrip("/").split("/")[-1] or "trace" for f in fs[trace_rows]]
    return make_frame({
        "op_index": -1, "kind": np.where(scope_op[rows], SCOPE_OP, RANGE_OP).astype(np.int8),
        "range_id": ranges["range_id"].to_numpy(np.int64)[rows], "api_id": -1, "activity_id": -1,
        "start": ranges["start"].to_numpy(np.int64)[rows], "end": ranges["end"].to_numpy(np.int64)[rows],
        "pid": ranges["pid"].to_numpy(np.int64)[rows], "global_tid": ranges["global_tid"].to_numpy(np.int64)[rows],
        "data_type": info["data_type"].to_numpy(dtype=object)[rows],
        "input_shapes": info["input_shapes"].to_numpy(dtype=object)[rows],
        "output_shapes": info["output_shapes"].to_numpy(dtype=object)[rows],
        "parameters": info["parameters"].to_numpy(dtype=object)[rows],
        "stack_trace": _stack_traces(info, kinds, parent, depth)[rows],
        "name": names[rows], "label": labels, "op_type": op_type, "direction": direction,
        "range_row": rows,
    })


def _stack_traces(info, kinds, parent, depth) -> np.ndarray:
    trace_anc = nearest_flagged_ancestor(parent, depth, kinds == nm.DL_TRACE)
    st = info["stack_trace"].to_numpy(dtype=object)
    out = st.copy()
    has = (trace_anc >= 0) & pd.isna(st)
    out[has] = st[trace_anc[has]]
    return out


def _unassociated_api_instances(api: pd.DataFrame, rows: np.ndarray, first_id: int) -> pd.DataFrame:
    names = api["name"].astype(object).to_numpy(dtype=object)[rows]
    names = np.where(pd.isna(names), "<unknown api>", names)
    return make_frame({
        "op_index": -1, "kind": np.full(rows.size, UNASSOCIATED_API, dtype=np.int8), "range_id": -1,
        "api_id": rows.astype(np.int64), "activity_id": -1,
        "start": api["start"].to_numpy(np.int64)[rows], "end": api["end"].to_numpy(np.int64)[rows],
        "pid": api["pid"].to_numpy(np.int64)[rows], "global_tid": api["global_tid"].to_numpy(np.int64)[rows],
        "data_type": None, "input_shapes": None, "output_shapes": None, "parameters": None,
        "stack_trace": None, "name": concat_distinct(names, lambda name: f"unassociated_{name}"),
        "label": names, "op_type": names, "direction": "", "range_row": -1,
    })


def _unassociated_gpu_instances(gpu: pd.DataFrame, rows: np.ndarray, first_id: int) -> pd.DataFrame:
    names = gpu["name"].astype(object).to_numpy(dtype=object)[rows]
    return make_frame({
        "op_index": -1, "kind": np.full(rows.size, UNASSOCIATED_GPU, dtype=np.int8), "range_id": -1,
        "api_id": -1, "activity_id": rows.astype(np.int64),
        "start": gpu["start"].to_numpy(np.int64)[rows], "end": gpu["end"].to_numpy(np.int64)[rows],
        "pid": gpu["pid"].to_numpy(np.int64)[rows], "global_tid": np.full(rows.size, -1, dtype=np.int64),
        "data_type": None, "input_shapes": None, "output_shapes": None, "parameters": None,
        "stack_trace": None, "name": concat_distinct(names, lambda name: f"unassociated_{name}"),
        "label": names, "op_type": names, "direction": "", "range_row": -1,
    })


def _backward_pass_instances(trace, corr, ranges, info, api_instance, bounds, first_id):
    """Without markers that link backward ops to forward ops, API calls of the autograd threads (threads
    of a marked process with no marker of their own) form one `backward` op per thread and iteration."""
    if corr.family != "pytorch" or len(ranges) == 0:
        return None
    kinds = info["kind"].to_numpy()
    marked = np.isin(kinds, (nm.PT_OP, nm.DL_ARG))
    # Only DLProf/PyProf argument markers (recorded without emit_nvtx) leave the backward pass unmarked;
    # a PyTorch emit_nvtx profile marks backward nodes itself, so its unmarked threads are not backward.
    if not (kinds == nm.DL_ARG).any():
        return None
    has_backward_markers = (info["backward"].to_numpy(dtype=bool) | (info["direction"].to_numpy(dtype=object)
                                                                   == "bprop")) & marked
    pids_with_markers = set(np.unique(ranges["pid"].to_numpy()[kinds == nm.DL_ARG]).tolist())
    pids_with_backward = set(np.unique(ranges["pid"].to_numpy()[has_backward_markers]).tolist())
    marker_threads = set(np.unique(ranges["global_tid"].to_numpy()[marked]).tolist())
    api = trace.api_calls
    candidates = (api_instance < 0) & api["pid"].isin(pids_with_markers - pids_with_backward).to_numpy() \
        & ~api["global_tid"].isin(marker_threads).to_numpy()
    rows = np.flatnonzero(candidates)
    if rows.size == 0:
        return None
    starts = api["start"].to_numpy(np.int64)[rows]
    frame = make_frame({"row": rows, "tid": api["global_tid"].to_numpy()[rows],
                          "iter": np.searchsorted(bounds, starts, side="right"), "start": starts,
                          "end": api["end"].to_numpy(np.int64)[rows], "pid": api["pid"].to_numpy()[rows]})
    groups = frame.groupby(["tid", "iter"], sort=True)
    summary = groups.agg(start=("start", "min"), end=("end", "max"), pid=("pid", "first")).reset_index()
    summary["instance"] = first_id + np.arange(len(summary))
    frame = frame.merge(summary[["tid", "iter", "instance"]], on=["tid", "iter"], how="left")
    assigned = np.full(len(api), -1, dtype=np.int64)
    assigned[frame["row"].to_numpy()] = frame["instance"].to_numpy()
    m = len(summary)
    instances = make_frame({
        "op_index": -1, "kind": np.full(m, BACKWARD_PASS, dtype=np.int8), "range_id": -1, "api_id": -1,
        "activity_id": -1, "start": summary["start"].to_numpy(np.int64), "end": summary["end"].to_numpy(np.int64),
        "pid": summary["pid"].to_numpy(np.int64), "global_tid": summary["tid"].to_numpy(np.int64),
        "data_type": None, "input_shapes": None, "output_shapes": None, "parameters": None, "stack_trace": None,
        "name": "backward", "label": "backward", "op_type": "backward", "direction": "bprop", "range_row": -1,
    })
    return instances, assigned


# ---------------------------------------------------------------------------- metrics

def _instance_metrics(trace, corr, inst: pd.DataFrame, api_instance: np.ndarray, gpu_instance: np.ndarray):
    """CPU time, CPU overhead, GPU time (flattened), GPU idle and device of every instance."""
    n = len(inst)
    start = inst["start"].to_numpy(np.int64)
    end = inst["end"].to_numpy(np.int64)
    kind = inst["kind"].to_numpy()
    inst["cpu_time"] = np.where(kind == UNASSOCIATED_GPU, 0, end - start)
    inst["cpu_overhead"] = inst["cpu_time"].to_numpy() - _api_time_inside(trace.api_calls, inst)
    gpu = trace.gpu
    if len(gpu):
        g_start = gpu["start"].to_numpy(np.int64)
        g_end = gpu["end"].to_numpy(np.int64)
        busy = union_length_by_group(gpu_instance, g_start, g_end)
        frame = make_frame({"i": gpu_instance, "s": g_start, "e": g_end,
                              "k": (gpu["kind"].to_numpy() == KIND_KERNEL).astype(np.int64),
                              "dev": gpu["device_id"].to_numpy(), "d": g_end - g_start + 1})
        agg = frame.groupby("i").agg(s=("s", "min"), e=("e", "max"), n=("s", "size"), k=("k", "sum"))
        dev_time = frame.groupby(["i", "dev"])["d"].sum().reset_index()
        dev = dev_time.sort_values(["i", "d", "dev"], ascending=[True, False, True]).drop_duplicates("i")
        gpu_time = np.zeros(n, dtype=np.int64)
        gpu_time[busy.index.to_numpy()] = busy.to_numpy()
        gs = np.full(n, -1, dtype=np.int64)
        ge = np.full(n, -1, dtype=np.int64)
        ng = np.zeros(n, dtype=np.int64)
        nk = np.zeros(n, dtype=np.int64)
        gs[agg.index.to_numpy()] = agg["s"].to_numpy()
        ge[agg.index.to_numpy()] = agg["e"].to_numpy()
        ng[agg.index.to_numpy()] = agg["n"].to_numpy()
        nk[agg.index.to_numpy()] = agg["k"].to_numpy()
        device = np.full(n, -1, dtype=np.int64)
        device[dev["i"].to_numpy()] = dev["dev"].to_numpy()
    else:
        gpu_time = np.zeros(n, dtype=np.int64)
        gs = np.full(n, -1, dtype=np.int64)
        ge = np.full(n, -1, dtype=np.int64)
        ng = np.zeros(n, dtype=np.int64)
        nk = np.zeros(n, dtype=np.int64)
        device = np.full(n, -1, dtype=np.int64)
    # Ranges without GPU work take the device their thread, else their process, launches most work on.
    missing = device < 0
    if missing.any():
        by_thread = pd.Series(inst["global_tid"].to_numpy()[missing]).map(corr.thread_device)
        by_process = pd.Series(inst["pid"].to_numpy()[missing]).map(corr.process_device)
        device[missing] = by_thread.fillna(by_process).fillna(-1).to_numpy(np.int64)
    inst["gpu_time"] = gpu_time
    inst["gpu_start"] = gs
    inst["gpu_end"] = ge
    inst["gpu_idle"] = np.where(ng > 0, ge - gs - gpu_time, 0)
    inst["n_gpu"] = ng
    inst["n_kernels"] = nk
    inst["device_id"] = device


def _api_time_inside(api: pd.DataFrame, inst: pd.DataFrame) -> np.ndarray:
    """Flattened time of the CUDA API calls on each instance's thread inside its [start, end)."""
    n = len(inst)
    if len(api) == 0 or n == 0:
        return np.zeros(n, dtype=np.int64)
    keys = ThreadTimeKeys([api["global_tid"].to_numpy(), inst["global_tid"].to_numpy()],
                          [api["start"].to_numpy(), api["end"].to_numpy(), inst["start"].to_numpy(),
                           inst["end"].to_numpy()])
    tid = api["global_tid"].to_numpy(np.int64)
    a_start = keys.key(tid, api["start"].to_numpy())
    a_end = keys.key(tid, api["end"].to_numpy())
    from dlprof_profiler.intervals import merge_intervals
    seg_s, seg_e = merge_intervals(a_start, a_end)  # keys never cross threads, so one merge does all threads
    i_tid = inst["global_tid"].to_numpy(np.int64)
    valid = i_tid >= 0
    out = np.zeros(n, dtype=np.int64)
    out[valid] = covered_length(seg_s, seg_e, keys.key(i_tid[valid], inst["start"].to_numpy()[valid]),
                                keys.key(i_tid[valid], inst["end"].to_numpy()[valid]))
    return out


# ---------------------------------------------------------------------------- direction links

def _link_backward(inst: pd.DataFrame, info: pd.DataFrame, ranges: pd.DataFrame, op_root: np.ndarray,
                   instance_range: np.ndarray, family: str | None) -> None:
    """Backward ops take the name and type of the forward op that created them (PyTorch seq numbers, or
    the callids of dlprof_profiler.pytorch markers), differing only in direction."""
    if family != "pytorch" or len(ranges) == 0:
        return
    rr = inst["range_row"].to_numpy(np.int64)
    is_range = rr >= 0
    row_to_inst = np.full(len(ranges), -1, dtype=np.int64)
    row_to_inst[rr[is_range]] = np.flatnonzero(is_range)
    kinds = info["kind"].to_numpy()
    seq = info["seq"].to_numpy(np.int64)
    backward = info["backward"].to_numpy(dtype=bool)
    pid = ranges["pid"].to_numpy(np.int64)
    start = ranges["start"].to_numpy(np.int64)
    # forward side: every PyTorch op range with a seq, folded into its op instance
    fwd = (kinds == nm.PT_OP) & (seq >= 0) & ~backward & (op_root >= 0)
    fwd_inst = row_to_inst[op_root[fwd]]
    forward = make_frame({"pid": pid[fwd], "seq": seq[fwd], "start": start[fwd], "inst": fwd_inst})
    forward = forward[forward["inst"] >= 0]
    # backward side: the seq of the instance's own marker, else of the backward node folded inside it
    bwd_rows = (kinds == nm.PT_OP) & backward & (op_root >= 0) & (seq >= 0)
    node_seq = make_frame({"root": op_root[bwd_rows], "seq": seq[bwd_rows], "start": start[bwd_rows]})
    node_seq = node_seq.sort_values("start").drop_duplicates("root")
    inst_seq = np.full(len(inst), -1, dtype=np.int64)
    root_inst = row_to_inst[node_seq["root"].to_numpy()]
    ok = root_inst >= 0
    inst_seq[root_inst[ok]] = node_seq["seq"].to_numpy()[ok]
    is_bwd = (inst["direction"].to_numpy(dtype=object) == "bprop") & is_range
    targets = make_frame({"inst": np.flatnonzero(is_bwd & (inst_seq >= 0)),
                            })
    names = inst["name"].to_numpy(dtype=object).copy()
    types = inst["op_type"].to_numpy(dtype=object).copy()
    data_types = inst["data_type"].to_numpy(dtype=object).copy()
    stacks = inst["stack_trace"].to_numpy(dtype=object).copy()
    if len(targets) and len(forward):
        targets["pid"] = inst["pid"].to_numpy(np.int64)[targets["inst"]]
        targets["seq"] = inst_seq[targets["inst"]]
        targets["start"] = inst["start"].to_numpy(np.int64)[targets["inst"]]
        linked = pd.merge_asof(targets.sort_values("start"), forward.sort_values("start").rename(
            columns={"inst": "fwd"}), on="start", by=["pid", "seq"], direction="backward")
        linked = linked.dropna(subset=["fwd"])
        b = linked["inst"].to_numpy(np.int64)
        f = linked["fwd"].to_numpy(np.int64)
        names[b], types[b] = names[f], types[f]
        data_types[b] = np.where(pd.isna(data_types[b]), data_types[f], data_types[b])
        stacks[b] = np.where(pd.isna(stacks[b]), stacks[f], stacks[b])
    # dlprof_profiler.pytorch markers link explicitly: fwdCallid of a bprop marker = callid of the forward one
    callid = info["callid"].to_numpy(np.int64)
    fwd_callid = info["fwd_callid"].to_numpy(np.int64)
    has_call = (kinds == nm.DL_ARG) & (callid >= 0) & (row_to_inst >= 0)
    wants = (kinds == nm.DL_ARG) & (fwd_callid >= 0) & (row_to_inst >= 0)
    if has_call.any() and wants.any():
        by_callid = pd.Series(row_to_inst[has_call], index=pd.MultiIndex.from_arrays([pid[has_call], callid[has_call]]))
        by_callid = by_callid[~by_callid.index.duplicated(keep="last")]
        keys = pd.MultiIndex.from_arrays([pid[wants], fwd_callid[wants]])
        fwd_of = by_callid.reindex(keys).to_numpy()
        ok = ~pd.isna(fwd_of)
        b = row_to_inst[wants][ok]
        f = fwd_of[ok].astype(np.int64)
        names[b], types[b] = names[f], types[f]
    inst["name"] = obj(names, inst.index)
    inst["op_type"] = obj(types, inst.index)
    inst["data_type"] = obj(data_types, inst.index)
    inst["stack_trace"] = obj(stacks, inst.index)


# ---------------------------------------------------------------------------- ops

def _op_table(inst: pd.DataFrame, domain: str, family: str | None) -> pd.DataFrame:
    """Ops = instances sharing (name, direction); Op IDs per type in order of first execution."""
    if len(inst) == 0:
        empty = pd.DataFrame({c: pd.Series(dtype=object) for c in OP_COLUMNS + ["label"]})
        for c in ("op_index", "device_id", "first_start", "n_instances", "kind"):
            empty[c] = pd.Series(dtype="int64")
        empty["tc_eligible"] = pd.Series(dtype=bool)
        return empty
    op_index = combined_codes(inst["name"].to_numpy(dtype=object), inst["direction"].fillna("").to_numpy(dtype=object))
    inst["op_index"] = op_index
    # the first instance of each op in time, without sorting the whole instance frame
    by_time = np.lexsort((inst["instance_id"].to_numpy(), inst["start"].to_numpy()))
    first = by_time[_first_rows(op_index[by_time])]
    ops = make_frame({"op_index": np.arange(first.size, dtype=np.int64), "domain": domain,
                      "name": inst["name"].to_numpy(dtype=object)[first],
                      "direction": inst["direction"].fillna("").to_numpy(dtype=object)[first],
                      "op_type": inst["op_type"].to_numpy(dtype=object)[first],
                      "label": inst["label"].to_numpy(dtype=object)[first],
                      "first_start": inst["start"].to_numpy(np.int64)[first],
                      "kind": inst["kind"].to_numpy()[first],
                      "n_instances": np.bincount(op_index, minlength=first.size),
                      "data_type": _first_given(inst["data_type"].to_numpy(dtype=object), op_index, first.size),
                      "stack_trace": _first_given(inst["stack_trace"].to_numpy(dtype=object), op_index, first.size)})
    dev = pd.DataFrame({"op_index": op_index, "device_id": inst["device_id"].to_numpy()})
    dev = dev[dev["device_id"] >= 0].groupby(["op_index", "device_id"]).size().reset_index(name="c")
    dev = dev.sort_values(["op_index", "c", "device_id"], ascending=[True, False, True]).drop_duplicates("op_index")
    ops["device_id"] = pd.Series(dev["device_id"].to_numpy(), index=dev["op_index"].to_numpy()).reindex(
        ops["op_index"]).fillna(-1).to_numpy(np.int64)
    unassociated = ops["kind"].isin([UNASSOCIATED_API, UNASSOCIATED_GPU]).to_numpy()
    eligible = {(t, l): op_tc_eligible(str(t), str(l), family) for t, l in
                set(zip(ops["op_type"].to_numpy(dtype=object), ops["label"].to_numpy(dtype=object)))}
    ops["tc_eligible"] = [eligible[(t, l)] for t, l in zip(ops["op_type"], ops["label"])]
    ops.loc[unassociated, "tc_eligible"] = False
    # Op IDs as DLProf wrote them: upper-cased type and an ordinal per type in execution order.
    by_time = ops.sort_values(["first_start", "op_index"], kind="stable")
    type_key = by_time["op_type"].astype(str).map(_op_id_prefix)
    ordinal = by_time.groupby(type_key.to_numpy(), sort=False).cumcount().to_numpy() + 1
    ids = type_key.to_numpy(dtype=object) + "_" + pd.Series(ordinal).astype(str).to_numpy(dtype=object)
    ops["op_id"] = obj(pd.Series(ids, index=by_time.index, dtype=object).reindex(ops.index).to_numpy(dtype=object),
                       ops.index)
    return ops[OP_COLUMNS + ["label", "kind"]].reset_index(drop=True)


def _first_given(values: np.ndarray, groups: np.ndarray, n_groups: int) -> np.ndarray:
    """Per group, the first value (in row order) that is not missing; None where there is none."""
    out = np.full(n_groups, None, dtype=object)
    given = np.flatnonzero(pd.notna(values))
    if given.size:
        first = _first_rows(groups[given])
        has = first >= 0
        out[np.flatnonzero(has)] = values[given[first[has]]]
    return out


_NON_ID = re.compile(r"[^A-Z0-9_]+")


def _op_id_prefix(op_type: str) -> str:
    return _NON_ID.sub("_", op_type.upper()) or "OP"
