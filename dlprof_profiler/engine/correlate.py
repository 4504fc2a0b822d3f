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

from dlprof_profiler.engine import markers as nm
from dlprof_profiler.contract import api_display_name
from dlprof_profiler.engine.intervals import covered_length, union_length_by_group
from dlprof_profiler.engine.model_chunks import TIME_MAX, first_calls, first_given_values
from dlprof_profiler.engine.naming import NamingCarry, distinct_texts, first_rows, range_names
from dlprof_profiler.engine.structure import RangeForest, ThreadTimeKeys, nearest_flagged_ancestor, outermost_flagged
from dlprof_profiler.engine.tensor_cores import kernel_uses_tc, op_tc_eligible
from dlprof_profiler.engine.trace import KIND_KERNEL, Trace, combined_codes, make_frame, obj, rank_within
from dlprof_profiler.engine.intervals import merge_intervals
from dlprof_profiler.engine.model_chunks import chunk_bounds, launch_times
from dlprof_profiler.process_memory import release_unused_memory

# Instance kinds
RANGE_OP, SCOPE_OP, UNASSOCIATED_API, UNASSOCIATED_GPU, BACKWARD_PASS = range(5)

INSTANCE_COLUMNS = [
    "instance_id",
    "op_index",
    "domain",
    "kind",
    "range_id",
    "api_id",
    "activity_id",
    "start",
    "end",
    "pid",
    "global_tid",
    "device_id",
    "cpu_time",
    "cpu_overhead",
    "gpu_time",
    "gpu_start",
    "gpu_end",
    "gpu_idle",
    "n_gpu",
    "n_kernels",
    "data_type",
    "input_shapes",
    "output_shapes",
    "parameters",
    "stack_trace",
]
OP_COLUMNS = [
    "op_index",
    "domain",
    "op_id",
    "name",
    "direction",
    "op_type",
    "tc_eligible",
    "data_type",
    "stack_trace",
    "device_id",
    "first_start",
    "n_instances",
]


@dataclass
class DomainModel:
    """The op model of one NVTX domain held in memory: its op instances and ops, and who owns each API call /
    activity. The outputs read instances through the methods below, which the out-of-core model
    (store.model.StoreDomainModel) has too."""

    domain: str
    family: str | None
    has_markers: bool
    instances: pd.DataFrame
    ops: pd.DataFrame
    api_instance: np.ndarray  # per API call: instance id (= row in instances)
    gpu_instance: np.ndarray  # per GPU activity: instance id (= row in instances)
    n_ranges: int = 0

    def first_call_values(self, column: str, op_index) -> np.ndarray:
        """Per op of `op_index`, `column` of its first call (earliest start, then lowest instance id)."""
        return first_calls(self.instances, [column], op_index)[column]

    def first_given_values(self, column: str) -> pd.Series:
        """Per op_index, the first non-empty `column` value of its instances in start order."""
        return first_given_values(self.instances, column)

    def instances_of_ops(self, op_index, columns) -> pd.DataFrame:
        """The `columns` of the instances of some ops (in instance id order)."""
        inst = self.instances
        return inst.loc[np.isin(inst["op_index"].to_numpy(np.int64), op_index), columns].reset_index(drop=True)

    def instance_chunks(self, columns, rows: int):
        """The instances' `columns` in start order, `rows` at a time."""
        for lo in range(0, len(self.instances), rows):
            yield self.instances.iloc[lo : lo + rows][columns]


@dataclass(kw_only=True)
class OpModel:
    """What every op model has, in memory or out of core: the mode, the devices of threads and processes, one
    domain model per NVTX domain (DomainModel or store.model.StoreDomainModel: the same read methods)."""

    mode: str
    family: str | None
    thread_device: dict
    process_device: dict
    domains: dict = field(default_factory=dict)
    config: dict = field(default_factory=dict)
    range_labels: pd.DataFrame | None = None  # per (domain, label): kind and number of ranges

    @property
    def range_counts(self) -> dict:
        """NVTX ranges per domain (op markers and scopes)."""
        return {name: int(dm.n_ranges) for name, dm in self.domains.items()}


@dataclass(kw_only=True)
class Correlation(OpModel):
    """Everything correlate derives from a trace held in memory: per-activity links plus one DomainModel per
    domain (the out-of-core counterpart is store.model.StoreCorrelation)."""

    gpu_api: np.ndarray  # per GPU activity: row in trace.api_calls, -1 if none
    uses_tc: np.ndarray  # per GPU activity: kernel uses Tensor Cores
    tc_rule: np.ndarray  # per GPU activity: id of the deciding rule
    range_info: pd.DataFrame  # per range: classification + parent/depth


# ---------------------------------------------------------------------------- entry points


def take(values: np.ndarray, idx: np.ndarray, default) -> np.ndarray:
    """values[idx] where idx >= 0, else default (also when values is empty)."""
    idx = np.asarray(idx, dtype=np.int64)
    if values.size == 0:
        return np.full(idx.shape, default, dtype=values.dtype if values.dtype != object else object)
    return np.where(idx >= 0, values[np.maximum(idx, 0)], default)


def classify_trace(trace: Trace, mode: str | None) -> tuple[pd.DataFrame, str, str | None, dict]:
    """Classify every range; return (range_info, mode, family, run config from config markers)."""
    ranges = trace.ranges
    classifier = nm.RangeClassifier(mode)
    info = classifier.classify(ranges["text"], ranges["domain"])
    if mode != "simple" and len(ranges):  # no op analysis otherwise: the ranges only say where data loads
        _adopt_range_details(info, ranges)
    return (info, *classifier.outcome())


def run_config(marked: dict, meta: dict) -> dict:
    """The run configuration: what the config markers say (`marked`), with the GPU memory peak the trace's
    memory events give (`meta`) where the markers give none."""
    if "gpu_peak_memory" in meta and not any(k in marked for k in ("max_memory_reserved", "max_memory_allocated")):
        return {**marked, "peak_memory": int(meta["gpu_peak_memory"])}  # nsys memory-usage events, Kineto's
    return marked


RANGE_DETAIL_COLUMNS = ("data_type", "input_shapes", "stack_trace", "parameters", "output_shapes")


def _adopt_range_details(info: pd.DataFrame, ranges: pd.DataFrame) -> None:
    """Details an adapter pre-parsed for ranges (Kineto: input types, shapes, call stacks) fill what the
    range texts do not say."""
    for column in RANGE_DETAIL_COLUMNS:
        if column in ranges.columns:
            given = ranges[column].to_numpy(dtype=object)
            missing = np.equal(info[column].to_numpy(dtype=object), None)
            # where the texts say nothing (a Kineto trace's texts never do), the ranges' own column is shared
            details = given if missing.all() else np.where(missing, given, info[column].to_numpy(dtype=object))
            info[column] = obj(details, info.index)


def domain_order(trace: Trace, mode: str | None) -> list[str]:
    """The NVTX domains that get an op model, in order of first appearance (just `default` when there
    are no ranges or in simple mode)."""
    if mode == "simple" or len(trace.ranges) == 0:
        return ["default"]
    return [str(d) for d in pd.unique(trace.ranges["domain"])]


def range_label_counts(ranges: pd.DataFrame, info: pd.DataFrame) -> pd.DataFrame:
    """Ranges per (domain, label): kind (of the first), count, data loading, total duration (counted on
    integer codes: labels are shared)."""
    if len(ranges) == 0:
        return pd.DataFrame(
            {"domain": [], "label": [], "kind": [], "num_ranges": [], "dataloader": [], "total_time": []}
        )
    domain_code, domain_names = pd.factorize(ranges["domain"].to_numpy(dtype=object))
    text_code = (
        info["text_code"].to_numpy() if "text_code" in info else pd.factorize(info["label"].to_numpy(dtype=object))[0]
    )
    codes = combined_codes(domain_code, text_code)
    counts = np.bincount(codes)
    duration = (ranges["end"].to_numpy(np.int64) - ranges["start"].to_numpy(np.int64)).astype(np.float64)
    total = np.bincount(codes, weights=duration)
    loader = np.bincount(codes, weights=info["dataloader"].to_numpy(dtype=bool).astype(np.float64)) > 0
    first = np.full(counts.size, -1, dtype=np.int64)
    first[codes[::-1]] = np.arange(codes.size - 1, -1, -1)
    table = pd.DataFrame(
        {
            "domain": np.asarray(domain_names, dtype=object)[domain_code[first]],
            "label": info["label"].to_numpy(dtype=object)[first],
            "kind": info["kind"].to_numpy().astype(np.int64)[first],
            "num_ranges": counts,
            "dataloader": loader,
            "total_time": total,
        }
    )
    out = table.groupby(["domain", "label"], sort=False, as_index=False).agg(
        kind=("kind", "first"),
        num_ranges=("num_ranges", "sum"),
        dataloader=("dataloader", "any"),
        total_time=("total_time", "sum"),
    )
    out["total_time"] = out["total_time"].round().astype(np.int64)
    return out


def link_gpu_to_api(trace: Trace) -> np.ndarray:
    """Row of the launching API call per GPU activity, keyed by (process, correlation id), -1 if none.
    When a process reuses a correlation id, an activity takes the nearest call of that key starting at or
    before its own start (as nsys attributes them), else the key's earliest call; equal starts: the later row."""
    gpu, api = trace.gpu, trace.api_calls
    return launch_rows(
        api["pid"].to_numpy(np.int64),
        api["correlation_id"].to_numpy(np.int64),
        api["start"].to_numpy(np.int64),
        gpu["pid"].to_numpy(np.int64),
        gpu["correlation_id"].to_numpy(np.int64),
        gpu["start"].to_numpy(np.int64),
    )


def launch_rows(api_pid, api_corr, api_start, gpu_pid, gpu_corr, gpu_start) -> np.ndarray:
    """link_gpu_to_api over columns: the API calls' and the GPU activities' process, correlation id and start
    (the calls in their order: ties go to the later row)."""
    out = np.full(len(gpu_pid), -1, dtype=np.int64)
    if len(gpu_pid) == 0 or len(api_pid) == 0:
        return out
    if (
        max(api_pid.max(), gpu_pid.max()) < 1 << 24
        and min(api_pid.min(), gpu_pid.min()) >= 0
        and max(api_corr.max(), gpu_corr.max()) < 1 << 38
    ):
        api_key, gpu_key = (api_pid << 38) | np.maximum(api_corr, 0), (gpu_pid << 38) | np.maximum(gpu_corr, 0)
    else:  # ids beyond the packed range: dense codes of the pairs
        codes = combined_codes(np.concatenate([api_pid, gpu_pid]), np.concatenate([api_corr, gpu_corr]))
        api_key, gpu_key = codes[: len(api_pid)], codes[len(api_pid) :]
    api_key[api_corr < 0] = -1  # no correlation id: never linked (a new array in both cases above)
    order = np.argsort(api_key, kind="stable")
    sorted_keys = api_key[order]
    # each activity's key looked up by binary search in the sorted keys, the activities in key order (numpy's
    # search starts each from the last: keys out of order were 4x slower than the hash table of 10^7 keys this
    # replaces, which held 0.4 GB more at the peak of staging an export out of core)
    by_key = np.argsort(gpu_key)
    first_call = np.empty(gpu_key.size, dtype=np.int64)
    first_call[by_key] = np.searchsorted(sorted_keys, gpu_key[by_key])
    del by_key
    np.minimum(first_call, sorted_keys.size - 1, out=first_call)
    found = (sorted_keys[first_call] == gpu_key) & (gpu_corr >= 0)
    repeated = np.zeros(sorted_keys.size, dtype=bool)  # the next call in key order has the same key
    np.equal(sorted_keys[1:], sorted_keys[:-1], out=repeated[:-1])
    del sorted_keys
    several = repeated[first_call]
    single = found & ~several  # the usual case: one call per key
    out[single] = order[first_call[single]]
    shared = np.flatnonzero(found & several)
    if shared.size:
        in_shared = np.isin(api_key, np.unique(gpu_key[shared])) & (api_corr >= 0)
        rows = np.flatnonzero(in_shared)
        pick = _nearest_call(api_key[rows], api_start[rows], gpu_key[shared], gpu_start[shared])
        out[shared] = np.where(pick >= 0, rows[np.maximum(pick, 0)], -1)
    return out


def _nearest_call(call_keys, call_times, act_keys, act_times) -> np.ndarray:
    """Per activity: index of the last call with its key at or before its time, else the key's first call,
    else -1. One sweep over (key, time) with calls before activities at equal times; ties: the later call."""
    n_calls = call_keys.size
    keys = np.concatenate([call_keys, act_keys])
    is_act = np.concatenate([np.zeros(n_calls, np.int8), np.ones(act_keys.size, np.int8)])
    order = np.lexsort((is_act, np.concatenate([call_times, act_times]), keys))
    sorted_keys, is_call = keys[order], is_act[order] == 0
    pos = np.arange(order.size)
    before = np.maximum.accumulate(np.where(is_call, pos, -1))
    after = np.minimum.accumulate(np.where(is_call, pos, order.size)[::-1])[::-1]
    act_pos = np.flatnonzero(~is_call)
    prev, nxt, own = before[act_pos], after[act_pos], sorted_keys[act_pos]
    prev_ok = (prev >= 0) & (sorted_keys[np.maximum(prev, 0)] == own)
    next_ok = (nxt < order.size) & (sorted_keys[np.minimum(nxt, order.size - 1)] == own)
    chosen = np.where(prev_ok, prev, np.where(next_ok, nxt, -1))
    result = np.full(act_keys.size, -1, dtype=np.int64)
    found = chosen >= 0
    result[order[act_pos[found]] - n_calls] = order[chosen[found]]
    return result


def work_devices(trace: Trace, gpu_api: np.ndarray) -> tuple[dict, dict]:
    """The device each thread and each process launches most GPU time on."""
    gpu = trace.gpu
    if len(gpu) == 0:
        return {}, {}
    dur = (gpu["end"] - gpu["start"]).to_numpy()
    has_api = gpu_api >= 0
    tids = np.where(has_api, trace.api_calls["global_tid"].to_numpy()[np.maximum(gpu_api, 0)], -1)
    frame = make_frame({"tid": tids, "pid": gpu["pid"].to_numpy(), "dev": gpu["device_id"].to_numpy(), "dur": dur + 1})

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


@dataclass
class Segment:
    """The part of a trace that one correlation step sees: the ranges starting in [lo, hi) plus the ranges
    still open at `lo` (context: `context` is True), the API calls starting in [lo, hi) and the GPU
    activities launched in [lo, hi) (`gpu_api`: row in `api` of each one's launching call, -1 if none)."""

    lo: int
    hi: int
    ranges: pd.DataFrame
    info: pd.DataFrame
    api: pd.DataFrame
    gpu: pd.DataFrame
    gpu_api: np.ndarray


def trace_segments(trace: Trace, info: pd.DataFrame, gpu_api: np.ndarray, cuts=None):
    """Segments of an in-memory trace split at `cuts` (one segment when none)."""
    bounds = chunk_bounds(cuts)
    ranges, api, gpu = trace.ranges, trace.api_calls, trace.gpu
    if len(bounds) == 1:
        lo, hi = bounds[0]
        context = np.zeros(len(ranges), dtype=bool)
        yield Segment(lo, hi, ranges.assign(context=context), info, api, gpu, np.asarray(gpu_api, dtype=np.int64))
        return
    r_start, r_end = ranges["start"].to_numpy(np.int64), ranges["end"].to_numpy(np.int64)
    a_start = api["start"].to_numpy(np.int64)
    launch = launch_times(trace, gpu_api) if len(gpu) else np.zeros(0, np.int64)
    for lo, hi in bounds:
        own = (r_start >= lo) & (r_start < hi)
        context = (r_start < lo) & (r_end > lo)
        rows = np.flatnonzero(own | context)
        a_rows = np.flatnonzero((a_start >= lo) & (a_start < hi))
        g_rows = np.flatnonzero((launch >= lo) & (launch < hi))
        seg_ranges = ranges.iloc[rows].reset_index(drop=True).assign(context=context[rows])
        g_api = np.asarray(gpu_api, dtype=np.int64)[g_rows]
        local = np.searchsorted(a_rows, g_api)
        ok = (g_api >= 0) & (local < a_rows.size)
        ok[ok] = a_rows[local[ok]] == g_api[ok]
        yield Segment(
            lo,
            hi,
            seg_ranges,
            info.iloc[rows].reset_index(drop=True),
            api.iloc[a_rows].reset_index(drop=True),
            gpu.iloc[g_rows].reset_index(drop=True),
            np.where(ok, local, -1).astype(np.int64),
        )


def correlate(
    trace: Trace,
    mode: str | None = None,
    naming_bounds: np.ndarray | None = None,
    classified: tuple | None = None,
    links: tuple | None = None,
    cuts=None,
    on_owned=None,
) -> Correlation:
    """Build the op model of every domain. `naming_bounds` are iteration boundaries used only to number
    top-level ops per iteration (so the k-th call of an op in each iteration is the same op); `links` are
    launch_links(trace) when the caller already has them; `cuts` split the work into time segments (the
    model does not depend on them). `on_owned(gpu_api, {domain: gpu_instance})` is called once every GPU
    activity's owner is known, before the instances are completed and the op tables built."""
    info, mode, family, config = classified or classify_trace(trace, mode)
    config = run_config(config, trace.meta)
    gpu_api, thread_dev, process_dev = links or launch_links(trace)
    uses_tc, tc_rule = _kernel_tc_flags(trace)
    bounds = np.zeros(0, dtype=np.int64) if naming_bounds is None else np.asarray(naming_bounds, np.int64)
    corr = Correlation(
        gpu_api=gpu_api,
        uses_tc=uses_tc,
        tc_rule=tc_rule,
        range_info=info,
        mode=mode,
        family=family,
        thread_device=thread_dev,
        process_device=process_dev,
        config=config,
        range_labels=range_label_counts(trace.ranges, info),
    )
    correlators = {
        domain: DomainCorrelator(
            domain,
            family,
            domain_facts(trace.ranges, info, domain, mode),
            bounds,
            thread_dev,
            process_dev,
            len(trace.api_calls),
            len(trace.gpu),
        )
        for domain in domain_order(trace, mode)
    }
    feed_segments(correlators, trace_segments(trace, info, gpu_api, cuts), mode)
    if on_owned is not None:
        on_owned(gpu_api, {domain: c.gpu_instance for domain, c in correlators.items()})
    for domain, c in correlators.items():
        corr.domains[domain] = c.finish(trace, gpu_api)
    return corr


def feed_segments(correlators: dict, segments, mode: str | None, after_segment=None) -> None:
    """Add each time segment, in order, to the correlator of every domain (`correlators`: domain -> its
    DomainCorrelator) with the segment's rows of that domain; `after_segment(n)` runs after the n-th (from 1),
    once this loop holds the segment no longer."""
    for n, segment in enumerate(segments, 1):
        for domain, c in correlators.items():
            c.add(segment, segment_rows(segment, domain, mode))
        del segment
        if after_segment is not None:
            after_segment(n)


def segment_rows(segment: Segment, domain: str, mode: str | None) -> np.ndarray:
    """Rows of a segment's ranges that belong to a domain's op model."""
    ranges, info = segment.ranges, segment.info
    if mode == "simple" or len(ranges) == 0:
        return np.zeros(0, dtype=np.int64)
    return np.flatnonzero((ranges["domain"].to_numpy(dtype=object) == domain) & (info["kind"].to_numpy() != nm.CONFIG))


@dataclass
class DomainFacts:
    """Whole-profile facts about one domain that every segment's correlation needs."""

    n_ranges: int
    has_markers: bool
    dl_args: bool  # DLProf/PyProf argument markers present
    unmarked_backward_pids: set  # processes with argument markers but no backward markers
    marker_threads: set  # threads carrying op markers
    linked_pids: set = field(default_factory=set)  # processes with dlprof_profiler.pytorch bprop argument markers


def domain_facts(ranges: pd.DataFrame, info: pd.DataFrame, domain: str, mode: str | None) -> DomainFacts:
    if mode == "simple" or len(ranges) == 0:
        return DomainFacts(0, False, False, set(), set())
    rows = np.flatnonzero((ranges["domain"].to_numpy(dtype=object) == domain) & (info["kind"].to_numpy() != nm.CONFIG))
    kinds = info["kind"].to_numpy()[rows]
    pids = ranges["pid"].to_numpy()[rows]
    marked = np.isin(kinds, (nm.PT_OP, nm.DL_ARG))
    bprop_marker = info["direction"].to_numpy(dtype=object)[rows] == "bprop"
    has_backward = (info["backward"].to_numpy(dtype=bool)[rows] | bprop_marker) & marked
    return DomainFacts(
        n_ranges=int(rows.size),
        has_markers=bool(np.isin(kinds, nm.OP_MARKERS).any()),
        dl_args=bool((kinds == nm.DL_ARG).any()),
        unmarked_backward_pids=set(np.unique(pids[kinds == nm.DL_ARG]).tolist())
        - set(np.unique(pids[has_backward]).tolist()),
        marker_threads=set(np.unique(ranges["global_tid"].to_numpy()[rows][marked]).tolist()),
        linked_pids=set(np.unique(pids[(kinds == nm.DL_ARG) & bprop_marker]).tolist()),
    )


# A segment of at least this many ranges hands what its steps freed back to the system on the way: its arrays of
# tens of MB, of many sizes and lifetimes, leave the heap's free blocks resident and fragmented otherwise
RELEASE_RANGES = 1_000_000


class DomainCorrelator:
    """Op instances of one domain, built one time segment at a time.

    Instance ids are global and dense (allocated as instances appear). A range still open at a segment's
    end keeps its instance id and name for the next segments; an instance whose range or API calls cross a
    segment boundary is *partial*: its metrics are recomputed over the whole trace in `finish`."""

    def __init__(
        self,
        domain: str,
        family: str | None,
        facts: DomainFacts,
        bounds: np.ndarray,
        thread_device: dict,
        process_device: dict,
        n_api: int,
        n_gpu: int,
        sink=None,
    ):
        self.domain, self.family, self.facts, self.bounds = domain, family, facts, bounds
        self.thread_device, self.process_device = thread_device, process_device
        self.sink = sink  # None: the model is kept in memory; else written out segment by segment
        self.api_instance = np.full(n_api if sink is None else 0, -1, dtype=np.int64)
        self.gpu_instance = np.full(n_gpu if sink is None else 0, -1, dtype=np.int64)
        self.chunks: list[pd.DataFrame] = []
        self.next_id = 0
        self.naming = NamingCarry()
        self.open_instance: dict = {}  # range_id -> (instance id, range end)
        self.open_attrs: dict = {}  # range_id -> (name, op type, data type, stack) of an open instance
        self.open_child: dict = {}  # range_id -> (has a child range, range end): leaves decided at their end
        self.backward_groups: dict = {}  # (thread, iteration) -> instance id of the backward pass
        self.partial: set = set()
        self.kind_of: dict = {}  # instance id -> its kind, when only its last segment can tell
        self.forward = _empty_forward()
        self.callids = _empty_callids()
        self.backward_calls = _empty_backward_calls()

    # -- one segment -----------------------------------------------------------------------------------
    def add(self, seg: Segment, rows: np.ndarray) -> None:
        lo, hi = seg.lo, seg.hi
        everything = len(rows) == len(seg.ranges) and (len(rows) == 0 or rows[-1] == len(rows) - 1)
        ranges = seg.ranges if everything else seg.ranges.iloc[rows].reset_index(drop=True)
        info = seg.info if everything else seg.info.iloc[rows].reset_index(drop=True)
        api = seg.api
        n = len(ranges)
        kinds = info["kind"].to_numpy().copy()
        if not self.facts.has_markers:
            kinds[np.isin(kinds, nm.WRAPPERS)] = nm.SCOPE  # wrappers without ops inside are plain scopes
        if self.facts.linked_pids:
            # dlprof_profiler.pytorch marks every op call and every backward node it links: in its processes
            # PyTorch's own op ranges (emit_nvtx's, torch.profiler's cpu_ops) are scopes, so the same ops come
            # out of an nsys capture with or without emit_nvtx and of a torch.profiler trace
            own = (kinds == nm.PT_OP) & ranges["pid"].isin(self.facts.linked_pids).to_numpy()
            kinds[own] = nm.SCOPE
        context = ranges["context"].to_numpy(dtype=bool)
        range_id = ranges["range_id"].to_numpy(np.int64)
        ends = ranges["end"].to_numpy(np.int64)
        still_open = ends > hi
        tids = ranges["global_tid"].to_numpy(np.int64)
        keys = ThreadTimeKeys(
            [tids, api["global_tid"].to_numpy(np.int64)],
            [ranges["start"].to_numpy(np.int64), ends, api["start"].to_numpy(np.int64)],
        )
        forest = RangeForest(tids, ranges["start"].to_numpy(), ends, range_id)
        parent, depth = forest.parent, forest.depth
        is_marker = np.isin(kinds, nm.OP_MARKERS)
        op_root = outermost_flagged(parent, depth, is_marker)
        if self.facts.has_markers:
            is_instance = is_marker & (op_root == np.arange(n))
        else:
            # a leaf range is an op; a range open across segments is a leaf only if no segment saw a child
            has_child = np.bincount(parent[parent >= 0], minlength=n) > 0
            if self.open_child:
                has_child |= (
                    np.array([self.open_child.get(int(r), (False, 0))[0] for r in range_id], dtype=bool) & context
                )
            candidate = ~has_child & (kinds == nm.SCOPE)
            is_instance = candidate & ~still_open
            self.open_child = {r: v for r, v in self.open_child.items() if v[1] > hi}
            for row in np.flatnonzero((kinds == nm.SCOPE) & still_open):
                self.open_child[int(range_id[row])] = (bool(has_child[row]), int(ends[row]))

        # API call -> innermost enclosing range on its thread -> op instance range
        innermost = forest.innermost_at(keys, api["global_tid"].to_numpy(np.int64), api["start"].to_numpy(np.int64))
        del forest, keys
        owner = np.full(len(api), -1, dtype=np.int64)
        inside = innermost >= 0
        root_of = take(op_root, innermost, -1)
        owner[inside] = np.where(root_of[inside] >= 0, root_of[inside], innermost[inside])
        scope_op = np.zeros(n, dtype=bool)
        direct = owner[inside & (root_of < 0)]
        scope_op[direct[~is_instance[direct]]] = True  # scope ranges launching API calls directly
        instance_range = is_instance | scope_op

        # instance ids: ranges that already have one keep it; new instances get the next ids
        row_instance = np.full(n, -1, dtype=np.int64)
        if self.open_instance:
            row_instance[context] = [self.open_instance.get(int(r), (-1, 0))[0] for r in range_id[context]]
        new_rows = np.flatnonzero(instance_range & (row_instance < 0))
        row_instance[new_rows] = self.next_id + np.arange(new_rows.size)
        self.next_id += new_rows.size
        if not self.facts.has_markers:
            # a range that launched API calls before it was known to be a leaf is a leaf op after all
            closing = np.flatnonzero(context & ~still_open & (row_instance >= 0) & ~new_mask_of(new_rows, n))
            for row in closing:
                self.kind_of[int(row_instance[row])] = RANGE_OP if is_instance[row] else SCOPE_OP
        self.open_instance = {r: v for r, v in self.open_instance.items() if v[1] > hi}
        for row in np.flatnonzero(instance_range & still_open):
            self.open_instance[int(range_id[row])] = (int(row_instance[row]), int(ends[row]))
        # instances crossing the segment's bounds get their metrics from the whole trace at the end
        spans = instance_range & (context | still_open)
        self.partial.update(row_instance[spans].tolist())

        names = range_names(
            ranges, info, kinds, parent, depth, op_root, instance_range, self.bounds, context, lo, hi, self.naming
        )
        new_mask = new_mask_of(new_rows, n)
        frames = [_range_instances(ranges, info, kinds, new_mask, scope_op, names, parent, depth, self.family)]
        frames[0]["instance_id"] = row_instance[new_rows]
        release_if_large = release_unused_memory if n >= RELEASE_RANGES else lambda: None
        del names, parent, depth, new_mask  # (per range: 10^7 events have 4·10^6 ranges)
        release_if_large()

        api_instance = take(row_instance, owner, -1)
        del owner, innermost, root_of
        backward = self._backward_pass(seg, api, api_instance)
        if backward is not None:
            frame, assigned = backward
            api_instance = np.where(assigned >= 0, assigned, api_instance)
            frames.append(frame)
        unassoc_api = np.flatnonzero(api_instance < 0)
        frame = _unassociated_api_instances(api, unassoc_api)
        frame["instance_id"] = self.next_id + np.arange(unassoc_api.size)
        api_instance[unassoc_api] = frame["instance_id"].to_numpy()
        self.next_id += unassoc_api.size
        frames.append(frame)

        gpu_instance = take(api_instance, seg.gpu_api, -1)
        orphan = np.flatnonzero(gpu_instance < 0)
        frame = _unassociated_gpu_instances(seg.gpu, orphan)
        frame["instance_id"] = self.next_id + np.arange(orphan.size)
        gpu_instance[orphan] = frame["instance_id"].to_numpy()
        self.next_id += orphan.size
        frames.append(frame)

        instances = pd.concat([f for f in frames if len(f)] or [frames[0]], ignore_index=True)
        del frames, frame  # the concatenation copied them
        release_if_large()
        instances["domain"] = self.domain
        instances["call_id"] = instances["instance_id"].to_numpy(np.int64)
        instance_metrics(instances, api, seg.gpu, gpu_instance, self.thread_device, self.process_device)
        release_if_large()
        self._link_backward(instances, info, kinds, ranges, op_root, row_instance, hi)
        release_if_large()
        self._remember_open(instances, hi)
        if self.sink is not None:
            self.sink.add(seg, instances, api_instance, gpu_instance)
            return
        self.chunks.append(instances)
        self.api_instance[api["api_id"].to_numpy(np.int64)] = api_instance
        self.gpu_instance[seg.gpu["activity_id"].to_numpy(np.int64)] = gpu_instance

    def _remember_open(self, instances: pd.DataFrame, hi: int) -> None:
        """Names and types of the range instances still open after this segment (forward ops for linking)."""
        self.open_attrs = {r: v for r, v in self.open_attrs.items() if r in self.open_instance}
        if hi >= TIME_MAX:
            return
        rid = instances["range_id"].to_numpy(np.int64)
        rows = np.flatnonzero((rid >= 0) & (instances["end"].to_numpy(np.int64) > hi))
        cols = [instances[c].to_numpy(dtype=object) for c in ("name", "op_type", "data_type", "stack_trace")]
        ids = instances["instance_id"].to_numpy(np.int64)
        for row in rows:
            self.open_attrs[int(rid[row])] = tuple(c[row] for c in cols) + (int(ids[row]),)

    def _backward_pass(self, seg: Segment, api: pd.DataFrame, api_instance: np.ndarray):
        """Without markers that link backward ops to forward ops, API calls of the autograd threads (threads
        of a marked process with no marker of their own) form one `backward` op per thread and iteration."""
        facts = self.facts
        # Only DLProf/PyProf argument markers (recorded without emit_nvtx) leave the backward pass unmarked;
        # a PyTorch emit_nvtx profile marks backward nodes itself, so its unmarked threads are not backward.
        if self.family != "pytorch" or not facts.dl_args or not facts.unmarked_backward_pids:
            return None
        candidates = (
            (api_instance < 0)
            & api["pid"].isin(facts.unmarked_backward_pids).to_numpy()
            & ~api["global_tid"].isin(facts.marker_threads).to_numpy()
        )
        rows = np.flatnonzero(candidates)
        if rows.size == 0:
            return None
        starts = api["start"].to_numpy(np.int64)[rows]
        frame = make_frame(
            {
                "row": rows,
                "tid": api["global_tid"].to_numpy()[rows],
                "iter": np.searchsorted(self.bounds, starts, side="right"),
                "start": starts,
                "end": api["end"].to_numpy(np.int64)[rows],
                "pid": api["pid"].to_numpy()[rows],
            }
        )
        summary = (
            frame.groupby(["tid", "iter"], sort=True)
            .agg(start=("start", "min"), end=("end", "max"), pid=("pid", "first"))
            .reset_index()
        )
        known = [self.backward_groups.get((int(t), int(i)), -1) for t, i in zip(summary["tid"], summary["iter"])]
        summary["instance"] = np.asarray(known, dtype=np.int64)
        fresh = summary["instance"].to_numpy() < 0
        summary.loc[fresh, "instance"] = self.next_id + np.arange(int(fresh.sum()))
        self.next_id += int(fresh.sum())
        # a backward pass may go on in the next segment: its span and metrics are completed at the end
        hi_iteration = int(np.searchsorted(self.bounds, seg.hi, side="right"))
        for t, i, inst, is_fresh in zip(summary["tid"], summary["iter"], summary["instance"], fresh):
            if not is_fresh or (i >= hi_iteration and seg.hi < TIME_MAX):
                self.backward_groups[(int(t), int(i))] = int(inst)
                self.partial.add(int(inst))
        self.backward_groups = {k: v for k, v in self.backward_groups.items() if k[1] >= hi_iteration}
        frame = frame.merge(summary[["tid", "iter", "instance"]], on=["tid", "iter"], how="left")
        assigned = np.full(len(api), -1, dtype=np.int64)
        assigned[frame["row"].to_numpy()] = frame["instance"].to_numpy()
        summary = summary[fresh]
        m = len(summary)
        instances = make_frame(
            {
                "instance_id": summary["instance"].to_numpy(np.int64),
                "op_index": -1,
                "kind": np.full(m, BACKWARD_PASS, dtype=np.int8),
                "range_id": -1,
                "api_id": -1,
                "activity_id": -1,
                "start": summary["start"].to_numpy(np.int64),
                "end": summary["end"].to_numpy(np.int64),
                "pid": summary["pid"].to_numpy(np.int64),
                "global_tid": summary["tid"].to_numpy(np.int64),
                "data_type": None,
                "input_shapes": None,
                "output_shapes": None,
                "parameters": None,
                "stack_trace": None,
                "name": "backward",
                "label": "backward",
                "op_type": "backward",
                "direction": "bprop",
                "range_row": -1,
            }
        )
        return instances, assigned

    # -- direction links -------------------------------------------------------------------------------
    def _link_backward(
        self,
        inst: pd.DataFrame,
        info: pd.DataFrame,
        kinds: np.ndarray,
        ranges: pd.DataFrame,
        op_root: np.ndarray,
        row_instance: np.ndarray,
        hi: int,
    ) -> None:
        """Backward ops take the name and type of the forward op that created them (PyTorch seq numbers, or
        the callids of dlprof_profiler.pytorch markers), differing only in direction. Forward ops of earlier
        segments are remembered for the current and the previous iteration."""
        if self.family != "pytorch" or len(ranges) == 0:
            return
        rr = inst["range_row"].to_numpy(np.int64)
        is_range = rr >= 0
        # rows of this segment's new instances (context ranges' instances were built in earlier segments)
        row_to_inst = np.full(len(ranges), -1, dtype=np.int64)
        row_to_inst[rr[is_range]] = np.flatnonzero(is_range)
        seq = info["seq"].to_numpy(np.int64)
        backward = info["backward"].to_numpy(dtype=bool)
        pid = ranges["pid"].to_numpy(np.int64)
        start = ranges["start"].to_numpy(np.int64)
        context = ranges["context"].to_numpy(dtype=bool)
        names = inst["name"].to_numpy(dtype=object).copy()
        types = inst["op_type"].to_numpy(dtype=object).copy()
        data_types = inst["data_type"].to_numpy(dtype=object).copy()
        stacks = inst["stack_trace"].to_numpy(dtype=object).copy()
        # forward side: every PyTorch op range with a seq, folded into its op instance
        fwd = (kinds == nm.PT_OP) & (seq >= 0) & ~backward & (op_root >= 0) & ~context
        fwd_rows = np.flatnonzero(fwd)
        fwd_inst = take(row_to_inst, op_root[fwd_rows], -1)
        ok = fwd_inst >= 0
        inst_ids = inst["instance_id"].to_numpy(np.int64)
        attrs = [
            names[fwd_inst[ok]],
            types[fwd_inst[ok]],
            data_types[fwd_inst[ok]],
            stacks[fwd_inst[ok]],
            inst_ids[fwd_inst[ok]],
        ]
        rows_with_attrs = fwd_rows[ok]
        # forward markers inside an instance that began in an earlier segment take its remembered names
        outer = fwd_rows[~ok]
        if outer.size and self.open_attrs:
            carried = [self.open_attrs.get(int(r)) for r in ranges["range_id"].to_numpy(np.int64)[op_root[outer]]]
            known = np.array([c is not None for c in carried], dtype=bool)
            if known.any():
                found = [c for c in carried if c is not None]
                attrs = [
                    np.concatenate([a, np.array([c[i] for c in found], dtype=a.dtype)]) for i, a in enumerate(attrs)
                ]
                rows_with_attrs = np.concatenate([rows_with_attrs, outer[known]])
        local_forward = make_frame(
            {
                "pid": pid[rows_with_attrs],
                "seq": seq[rows_with_attrs],
                "start": start[rows_with_attrs],
                "name": attrs[0],
                "op_type": attrs[1],
                "data_type": attrs[2],
                "stack_trace": attrs[3],
                "fwd_id": attrs[4],
            }
        )
        forward = pd.concat([self.forward, local_forward], ignore_index=True) if len(self.forward) else local_forward
        # backward side: the seq of the instance's own marker, else of the backward node folded inside it
        bwd_rows = (kinds == nm.PT_OP) & backward & (op_root >= 0) & (seq >= 0)
        node_seq = make_frame({"root": op_root[bwd_rows], "seq": seq[bwd_rows], "start": start[bwd_rows]})
        node_seq = node_seq.sort_values("start").drop_duplicates("root")
        inst_seq = np.full(len(inst), -1, dtype=np.int64)
        root_inst = row_to_inst[node_seq["root"].to_numpy()]
        good = root_inst >= 0
        inst_seq[root_inst[good]] = node_seq["seq"].to_numpy()[good]
        is_bwd = (inst["direction"].to_numpy(dtype=object) == "bprop") & is_range
        targets = make_frame({"inst": np.flatnonzero(is_bwd & (inst_seq >= 0))})
        if len(targets) and len(forward):
            targets["pid"] = inst["pid"].to_numpy(np.int64)[targets["inst"]]
            targets["seq"] = inst_seq[targets["inst"]]
            targets["start"] = inst["start"].to_numpy(np.int64)[targets["inst"]]
            linked = pd.merge_asof(
                targets.sort_values("start"),
                forward.sort_values("start", kind="stable"),
                on="start",
                by=["pid", "seq"],
                direction="backward",
            )
            linked = linked.dropna(subset=["name"])
            b = linked["inst"].to_numpy(np.int64)
            names[b] = linked["name"].to_numpy(dtype=object)
            types[b] = linked["op_type"].to_numpy(dtype=object)
            f_dt = linked["data_type"].to_numpy(dtype=object)
            f_st = linked["stack_trace"].to_numpy(dtype=object)
            data_types[b] = np.where(pd.isna(data_types[b]), f_dt, data_types[b])
            stacks[b] = np.where(pd.isna(stacks[b]), f_st, stacks[b])
            # the autograd nodes of one forward call are one backward call
            self._group_calls(inst, b, linked["fwd_id"].to_numpy(np.int64))
        # dlprof_profiler.pytorch markers link explicitly: fwdCallid of a bprop marker = callid of the forward one
        callid = info["callid"].to_numpy(np.int64)
        fwd_callid = info["fwd_callid"].to_numpy(np.int64)
        has_call = (kinds == nm.DL_ARG) & (callid >= 0) & (row_to_inst >= 0)
        local_calls = make_frame(
            {
                "pid": pid[has_call],
                "callid": callid[has_call],
                "name": names[row_to_inst[has_call]],
                "op_type": types[row_to_inst[has_call]],
                "start": start[has_call],
            }
        )
        calls = pd.concat([self.callids, local_calls], ignore_index=True) if len(self.callids) else local_calls
        wants = (kinds == nm.DL_ARG) & (fwd_callid >= 0) & (row_to_inst >= 0)
        if len(calls) and wants.any():
            by_callid = calls.drop_duplicates(["pid", "callid"], keep="last").set_index(["pid", "callid"])
            found = by_callid.reindex(pd.MultiIndex.from_arrays([pid[wants], fwd_callid[wants]]))
            ok = found["name"].notna().to_numpy()
            b = row_to_inst[wants][ok]
            names[b] = found["name"].to_numpy(dtype=object)[ok]
            types[b] = found["op_type"].to_numpy(dtype=object)[ok]
            # markers carry the backward call's id (one per forward call and backward pass): its nodes are one call
            own = callid[wants][ok]
            has_own = own >= 0
            if has_own.any():
                keys = -1 - ((pid[wants][ok][has_own] << 40) | own[has_own])
                self._group_calls(inst, b[has_own], keys)
        inst["name"] = obj(names, inst.index)
        inst["op_type"] = obj(types, inst.index)
        inst["data_type"] = obj(data_types, inst.index)
        inst["stack_trace"] = obj(stacks, inst.index)
        # remember the forward ops of the current and the previous iteration for the next segments
        if hi < TIME_MAX:
            it_hi = int(np.searchsorted(self.bounds, hi, side="right"))
            if it_hi >= 2:
                keep_from = int(self.bounds[it_hi - 2])
                forward, calls = forward[forward["start"] >= keep_from], calls[calls["start"] >= keep_from]
                self.backward_calls = self.backward_calls[self.backward_calls["start"] >= keep_from]
            self.forward, self.callids = forward, calls

    def _group_calls(self, inst: pd.DataFrame, rows: np.ndarray, keys: np.ndarray) -> None:
        """Backward instances with the same key (the forward call they belong to) share one call id: the
        instance id of the first of them in time, also across segments."""
        if rows.size == 0:
            return
        ids = inst["instance_id"].to_numpy(np.int64)
        starts = inst["start"].to_numpy(np.int64)
        frame = pd.DataFrame({"row": rows, "key": keys, "start": starts[rows], "id": ids[rows]})
        frame = frame.sort_values(["start", "id"], kind="stable")
        first = frame.drop_duplicates("key")
        known = self.backward_calls.drop_duplicates("key").set_index("key")["call"]
        call = known.reindex(first["key"].to_numpy()).to_numpy()
        call = np.where(pd.isna(call), first["id"].to_numpy(), call).astype(np.int64)
        by_key = pd.Series(call, index=first["key"].to_numpy())
        call_id = inst["call_id"].to_numpy(np.int64).copy()
        call_id[frame["row"].to_numpy()] = by_key.reindex(frame["key"].to_numpy()).to_numpy(np.int64)
        inst["call_id"] = call_id
        fresh = ~first["key"].isin(known.index).to_numpy()
        if fresh.any():
            self.backward_calls = pd.concat(
                [
                    self.backward_calls,
                    pd.DataFrame(
                        {
                            "key": first["key"].to_numpy()[fresh],
                            "call": call[fresh],
                            "start": first["start"].to_numpy()[fresh],
                        }
                    ),
                ],
                ignore_index=True,
            )

    # -- the whole domain ------------------------------------------------------------------------------
    def finish(self, trace: Trace, gpu_api: np.ndarray) -> DomainModel:
        """Concatenate the segments' instances, complete the partial ones, build the op table."""
        instances = pd.concat(self.chunks, ignore_index=True) if len(self.chunks) > 1 else self.chunks[0]
        self.chunks = []  # (the concatenation copied them)
        ids = instances["instance_id"].to_numpy(np.int64)
        if ids.size and (ids[1:] < ids[:-1]).any():  # one segment's instances come in id order: no copy then
            instances = instances.sort_values("instance_id", kind="stable")
        instances = instances.reset_index(drop=True)
        if self.partial:
            self._complete(instances, trace, gpu_api)
        if self.kind_of:
            ids = np.fromiter(self.kind_of, dtype=np.int64)
            kinds = instances["kind"].to_numpy().copy()
            kinds[ids] = np.fromiter(self.kind_of.values(), dtype=np.int64)
            instances["kind"] = kinds
        ops = op_table(instances, self.domain, self.family, self.bounds)
        return DomainModel(
            domain=self.domain,
            family=self.family,
            has_markers=self.facts.has_markers,
            instances=instances,
            ops=ops,
            api_instance=self.api_instance,
            gpu_instance=self.gpu_instance,
            n_ranges=self.facts.n_ranges,
        )

    def _complete(self, instances: pd.DataFrame, trace: Trace, gpu_api: np.ndarray) -> None:
        """Metrics of the instances that crossed segment bounds, over all their API calls and activities."""
        ids = np.array(sorted(self.partial), dtype=np.int64)
        rows = ids  # instance ids are dense row numbers
        api = trace.api_calls
        owned = pd.DataFrame(
            {"i": self.api_instance, "s": api["start"].to_numpy(np.int64), "e": api["end"].to_numpy(np.int64)}
        )
        span = owned[owned["i"].isin(set(ids.tolist()))].groupby("i").agg(s=("s", "min"), e=("e", "max"))
        part = backward_pass_spans(instances.iloc[rows], span)
        g_rows = np.flatnonzero(np.isin(self.gpu_instance, ids))
        gpu = trace.gpu.iloc[g_rows].reset_index(drop=True)
        instance_metrics(part, api, gpu, self.gpu_instance[g_rows], self.thread_device, self.process_device)
        for column in (
            "start",
            "end",
            "cpu_time",
            "cpu_overhead",
            "gpu_time",
            "gpu_start",
            "gpu_end",
            "gpu_idle",
            "n_gpu",
            "n_kernels",
            "device_id",
        ):
            values = instances[column].to_numpy().copy()
            values[rows] = part[column].to_numpy()
            instances[column] = values


def new_mask_of(rows: np.ndarray, n: int) -> np.ndarray:
    mask = np.zeros(n, dtype=bool)
    mask[rows] = True
    return mask


def _empty_forward() -> pd.DataFrame:
    return make_frame(
        {
            "pid": np.zeros(0, np.int64),
            "seq": np.zeros(0, np.int64),
            "start": np.zeros(0, np.int64),
            "name": np.zeros(0, object),
            "op_type": np.zeros(0, object),
            "data_type": np.zeros(0, object),
            "stack_trace": np.zeros(0, object),
            "fwd_id": np.zeros(0, np.int64),
        }
    )


def _empty_backward_calls() -> pd.DataFrame:
    return pd.DataFrame({"key": np.zeros(0, np.int64), "call": np.zeros(0, np.int64), "start": np.zeros(0, np.int64)})


def _empty_callids() -> pd.DataFrame:
    return make_frame(
        {
            "pid": np.zeros(0, np.int64),
            "callid": np.zeros(0, np.int64),
            "name": np.zeros(0, object),
            "op_type": np.zeros(0, object),
            "start": np.zeros(0, np.int64),
        }
    )


def _kernel_tc_flags(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    gpu = trace.gpu
    uses = np.zeros(len(gpu), dtype=bool)
    rules = np.full(len(gpu), "", dtype=object)
    kernels = (gpu["kind"].to_numpy() == KIND_KERNEL) if len(gpu) else np.zeros(0, dtype=bool)
    if kernels.any():
        u, r = kernel_uses_tc(gpu["name"].array[kernels], gpu["long_name"].array[kernels])
        uses[kernels] = u
        rules[kernels] = r
    return uses, rules


# ---------------------------------------------------------------------------- instances

FPROP, BPROP = "fprop", "bprop"
_TF_GRADIENT = re.compile(r"(?:^|/)(?:gradients|gradient_tape)(?:_\d+)?/")


def concat_distinct(*columns_and_fn) -> np.ndarray:
    """fn(*values) once per distinct tuple of the columns, spread back: rows that get the same string
    share one object (millions of instances, a few thousand distinct names)."""
    *columns, fn = columns_and_fn
    codes = combined_codes(*columns)
    if codes.size == 0:
        return np.zeros(0, dtype=object)
    return distinct_texts(codes, lambda i: fn(*(np.asarray(c)[i] for c in columns)))[codes]


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
    return make_frame(
        {
            "op_index": -1,
            "kind": np.where(scope_op[rows], SCOPE_OP, RANGE_OP).astype(np.int8),
            "range_id": ranges["range_id"].to_numpy(np.int64)[rows],
            "api_id": -1,
            "activity_id": -1,
            "start": ranges["start"].to_numpy(np.int64)[rows],
            "end": ranges["end"].to_numpy(np.int64)[rows],
            "pid": ranges["pid"].to_numpy(np.int64)[rows],
            "global_tid": ranges["global_tid"].to_numpy(np.int64)[rows],
            "data_type": info["data_type"].to_numpy(dtype=object)[rows],
            "input_shapes": info["input_shapes"].to_numpy(dtype=object)[rows],
            "output_shapes": info["output_shapes"].to_numpy(dtype=object)[rows],
            "parameters": info["parameters"].to_numpy(dtype=object)[rows],
            "stack_trace": _stack_traces(info, kinds, parent, depth)[rows],
            "name": names[rows],
            "label": labels,
            "op_type": op_type,
            "direction": direction,
            "range_row": rows,
        }
    )


def _stack_traces(info, kinds, parent, depth) -> np.ndarray:
    trace_anc = nearest_flagged_ancestor(parent, depth, kinds == nm.DL_TRACE)
    st = info["stack_trace"].to_numpy(dtype=object)
    out = st.copy()
    has = (trace_anc >= 0) & pd.isna(st)
    out[has] = st[trace_anc[has]]
    return out


def _unassociated_api_instances(api: pd.DataFrame, rows: np.ndarray) -> pd.DataFrame:
    names = api["name"].astype(object).to_numpy(dtype=object)[rows]
    names = np.where(pd.isna(names), "<unknown api>", names)
    names = concat_distinct(names, api_display_name)  # the op is named as users write the API
    api_ids = api["api_id"].to_numpy(np.int64)[rows]
    return _unassociated_instances(UNASSOCIATED_API, api, rows, names, api_ids, -1, api["global_tid"])


def _unassociated_gpu_instances(gpu: pd.DataFrame, rows: np.ndarray) -> pd.DataFrame:
    names = gpu["name"].astype(object).to_numpy(dtype=object)[rows]
    activity_ids = gpu["activity_id"].to_numpy(np.int64)[rows]
    return _unassociated_instances(UNASSOCIATED_GPU, gpu, rows, names, -1, activity_ids, None)


def _unassociated_instances(kind, events, rows, names, api_id, activity_id, global_tid) -> pd.DataFrame:
    """One op instance per API call or GPU activity outside every range, named `unassociated_<name>`
    (`global_tid` None: no CPU thread)."""
    tids = np.full(rows.size, -1, dtype=np.int64) if global_tid is None else global_tid.to_numpy(np.int64)[rows]
    return make_frame(
        {
            "op_index": -1,
            "kind": np.full(rows.size, kind, dtype=np.int8),
            "range_id": -1,
            "api_id": api_id,
            "activity_id": activity_id,
            "start": events["start"].to_numpy(np.int64)[rows],
            "end": events["end"].to_numpy(np.int64)[rows],
            "pid": events["pid"].to_numpy(np.int64)[rows],
            "global_tid": tids,
            "data_type": None,
            "input_shapes": None,
            "output_shapes": None,
            "parameters": None,
            "stack_trace": None,
            "name": concat_distinct(names, lambda name: f"unassociated_{name}"),
            "label": names,
            "op_type": names,
            "direction": "",
            "range_row": -1,
        }
    )


def backward_pass_spans(part: pd.DataFrame, api_span: pd.DataFrame) -> pd.DataFrame:
    """The instances of `part` (completed after the segments: they crossed a segment bound) with a backward
    pass spanning the API calls it owns (`api_span`: per instance id, s and e: first start and last end of its
    calls); the other instances as they are. A copy, in `part`'s order, ready for instance_metrics."""
    part = part.reset_index(drop=True).copy()
    backward = part["kind"].to_numpy() == BACKWARD_PASS
    if backward.any() and len(api_span):
        ids = part.loc[backward, "instance_id"].to_numpy(np.int64)
        for column, key in (("start", "s"), ("end", "e")):
            own = part.loc[backward, column].to_numpy(np.int64)
            part.loc[backward, column] = api_span[key].reindex(ids).fillna(pd.Series(own, index=ids)).to_numpy(np.int64)
    return part


def instance_metrics(
    inst: pd.DataFrame,
    api: pd.DataFrame,
    gpu: pd.DataFrame,
    gpu_owner: np.ndarray,
    thread_device: dict,
    process_device: dict,
) -> None:
    """CPU time, CPU overhead, GPU time (flattened), GPU idle and device of every instance of `inst`, from
    the API calls on their threads and the GPU activities they own (`gpu_owner`: instance id per row of
    `gpu`; activities of instances outside `inst` are ignored)."""
    n = len(inst)
    start = inst["start"].to_numpy(np.int64)
    end = inst["end"].to_numpy(np.int64)
    kind = inst["kind"].to_numpy()
    inst["cpu_time"] = np.where(kind == UNASSOCIATED_GPU, 0, end - start)
    inst["cpu_overhead"] = inst["cpu_time"].to_numpy() - _api_time_inside(api, inst)
    gpu_time = np.zeros(n, dtype=np.int64)
    gs = np.full(n, -1, dtype=np.int64)
    ge = np.full(n, -1, dtype=np.int64)
    ng = np.zeros(n, dtype=np.int64)
    nk = np.zeros(n, dtype=np.int64)
    device = np.full(n, -1, dtype=np.int64)
    if len(gpu) and n:
        ids = inst["instance_id"].to_numpy(np.int64)
        order = np.argsort(ids, kind="stable")
        pos = np.clip(np.searchsorted(ids[order], gpu_owner), 0, max(n - 1, 0))
        found = ids[order][pos] == gpu_owner
        owner = np.where(found, order[pos], -1)
        mine = owner >= 0
        owner = owner[mine]
        g_start = gpu["start"].to_numpy(np.int64)[mine]
        g_end = gpu["end"].to_numpy(np.int64)[mine]
        if owner.size:
            busy = union_length_by_group(owner, g_start, g_end)
            gpu_time[busy.index.to_numpy()] = busy.to_numpy()
            _gpu_extent(
                owner,
                g_start,
                g_end,
                gpu["kind"].to_numpy()[mine] == KIND_KERNEL,
                gpu["device_id"].to_numpy(np.int64)[mine],
                gs,
                ge,
                ng,
                nk,
                device,
            )
    # Ranges without GPU work take the device their thread, else their process, launches most work on.
    missing = device < 0
    if missing.any():
        by_thread = pd.Series(inst["global_tid"].to_numpy()[missing]).map(thread_device)
        by_process = pd.Series(inst["pid"].to_numpy()[missing]).map(process_device)
        device[missing] = by_thread.fillna(by_process).fillna(-1).to_numpy(np.int64)
    inst["gpu_time"] = gpu_time
    inst["gpu_start"] = gs
    inst["gpu_end"] = ge
    inst["gpu_idle"] = np.where(ng > 0, ge - gs - gpu_time, 0)
    inst["n_gpu"] = ng
    inst["n_kernels"] = nk
    inst["device_id"] = device


def _gpu_extent(owner, start, end, is_kernel, dev, gs, ge, ng, nk, device) -> None:
    """Per owning instance (row `owner` of each activity): first start, last end, number of activities and
    of kernels, and the device with the most GPU time (ties: the lower id), written into the arrays given."""
    n = gs.size
    ng[:] = np.bincount(owner, minlength=n)
    nk[:] = np.bincount(owner[is_kernel], minlength=n)
    has = ng > 0
    first = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(first, owner, start)
    last = np.full(n, np.iinfo(np.int64).min, dtype=np.int64)
    np.maximum.at(last, owner, end)
    gs[has], ge[has] = first[has], last[has]
    low = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(low, owner, dev)
    high = np.full(n, np.iinfo(np.int64).min, dtype=np.int64)
    np.maximum.at(high, owner, dev)
    one = has & (low == high)  # the usual case: all of an instance's work on one device
    device[one] = low[one]
    mixed = has & ~one
    if mixed.any():
        rows = np.flatnonzero(mixed[owner])
        frame = pd.DataFrame({"i": owner[rows], "dev": dev[rows], "d": end[rows] - start[rows] + 1})
        dev_time = frame.groupby(["i", "dev"])["d"].sum().reset_index()
        best = dev_time.sort_values(["i", "d", "dev"], ascending=[True, False, True]).drop_duplicates("i")
        device[best["i"].to_numpy()] = best["dev"].to_numpy()


def _api_time_inside(api: pd.DataFrame, inst: pd.DataFrame) -> np.ndarray:
    """Flattened time of the CUDA API calls on each instance's thread inside its [start, end)."""
    n = len(inst)
    if len(api) == 0 or n == 0:
        return np.zeros(n, dtype=np.int64)
    keys = ThreadTimeKeys(
        [api["global_tid"].to_numpy(), inst["global_tid"].to_numpy()],
        [api["start"].to_numpy(), api["end"].to_numpy(), inst["start"].to_numpy(), inst["end"].to_numpy()],
    )
    tid = api["global_tid"].to_numpy(np.int64)
    a_start = keys.key(tid, api["start"].to_numpy())
    a_end = keys.key(tid, api["end"].to_numpy())
    seg_s, seg_e = merge_intervals(a_start, a_end)  # keys never cross threads, so one merge does all threads
    i_tid = inst["global_tid"].to_numpy(np.int64)
    valid = i_tid >= 0
    out = np.zeros(n, dtype=np.int64)
    out[valid] = covered_length(
        seg_s,
        seg_e,
        keys.key(i_tid[valid], inst["start"].to_numpy()[valid]),
        keys.key(i_tid[valid], inst["end"].to_numpy()[valid]),
    )
    return out


# ---------------------------------------------------------------------------- direction links


def op_table(inst: pd.DataFrame, domain: str, family: str | None, bounds=None) -> pd.DataFrame:
    """Ops, as in DLProf 1.8: the n-th instance of a (name, direction) within an iteration on its thread is
    the same op in every iteration (`bounds`: the iteration boundaries the names were given with). Sets
    each instance's op_index (see `finish_op_table`)."""
    if len(inst) == 0:
        empty = pd.DataFrame({c: pd.Series(dtype=object) for c in OP_COLUMNS + ["label"]})
        for c in ("op_index", "device_id", "first_start", "n_instances", "kind"):
            empty[c] = pd.Series(dtype="int64")
        empty["tc_eligible"] = pd.Series(dtype=bool)
        return empty
    if "call_id" not in inst:
        inst["call_id"] = inst["instance_id"].to_numpy(np.int64)
    call_metrics(inst)
    # ops are made of calls: the first instance of each call stands for it (backward nodes of one forward
    # call are one call)
    calls = np.flatnonzero(inst["is_call"].to_numpy(dtype=bool))
    read = ["instance_id", "start", "global_tid", "name", "direction", "device_id", *OP_FIRST, *OP_GIVEN]
    # the columns read, not every instance column; copied only when some instances are not calls
    head = inst[read] if calls.size == len(inst) else inst[read].iloc[calls]
    ids = head["instance_id"].to_numpy(np.int64)
    names = head["name"].to_numpy(dtype=object)
    directions = head["direction"].fillna("").to_numpy(dtype=object)
    grouper = OpGrouper(bounds)
    codes = grouper.add(
        ids,
        head["start"].to_numpy(np.int64),
        head["global_tid"].to_numpy(np.int64),
        names,
        directions,
        head["device_id"].to_numpy(np.int64),
        {c: head[c].to_numpy() if c == "kind" else head[c].to_numpy(dtype=object) for c in OP_FIRST + OP_GIVEN},
    )
    groups = grouper.table()
    ops, op_index_of_group = finish_op_table(groups, domain, family)
    op_of_call = pd.Series(op_index_of_group[codes], index=ids)
    inst["op_index"] = op_of_call.reindex(inst["call_id"].to_numpy(np.int64)).to_numpy(np.int64)
    return ops


def _dense_codes(values: np.ndarray) -> np.ndarray:
    """Values as their pd.factorize codes (numbered in order of first appearance, so combined_codes numbers
    tuples of them as it numbers tuples of the values); values with a missing one are returned as they are
    (combined_codes gives missing values its own numbering)."""
    codes = pd.factorize(values)[0]
    return values if codes.size and codes.min() < 0 else codes.astype(np.int64, copy=False)


OP_FIRST = ("op_type", "label", "kind")  # an op's, from its first call
OP_GIVEN = ("data_type", "stack_trace")  # an op's, the first value in time that is not missing
OP_GROUP_COLUMNS = ["name", "direction", "nth", "op_type", "label", "first_start", "kind", "n_instances"] + [
    "data_type",
    "stack_trace",
    "device_id",
]


class OpGrouper:
    """Ops, as in DLProf 1.8: the n-th call of a (name, direction) within an iteration on its thread is the same
    op in every iteration (`bounds`: the iteration boundaries the names were given with). Calls come in
    batches in (start, instance id) order (in memory: one batch; out of core: the store's calls streamed, so
    memory holds one batch and the ops, not every call); names and directions as values or as codes. An op's
    first call is the earliest (then lowest id) and gives it OP_FIRST; OP_GIVEN take the first value in time
    that is not missing (None, or a negative code); its device is the one most calls ran on (lowest on ties)."""

    def __init__(self, bounds):
        self.bounds = np.zeros(0, np.int64) if bounds is None else np.asarray(bounds, np.int64)
        self.carry = None  # calls so far per (iteration, thread, name, direction) of the last iteration seen
        self.keys = None  # (name, direction, nth) -> gid of every op so far
        self.ops = None  # one row per op, in gid order
        self.devices: list[pd.DataFrame] = []

    def add(self, ids, start, tid, names, directions, device_id, values: dict) -> np.ndarray:
        """One batch of calls (`values`: OP_FIRST and OP_GIVEN per call); returns each call's op (gid)."""
        ids, start, tid = np.asarray(ids, np.int64), np.asarray(start, np.int64), np.asarray(tid, np.int64)
        if ids.size == 0:
            return np.zeros(0, np.int64)
        it = np.searchsorted(self.bounds, start, side="right")
        name_key, direction_key = _dense_codes(names), _dense_codes(directions)  # hashed once for both keys
        key = combined_codes(it, tid, name_key, direction_key)
        heads = first_rows(key)
        columns = {"it": it[heads], "tid": tid[heads], "name": names[heads], "direction": directions[heads]}
        before = np.zeros(heads.size, np.int64)
        if self.carry is not None:
            found = pd.DataFrame(columns).merge(self.carry, on=["it", "tid", "name", "direction"], how="left")
            before = found["calls"].fillna(0).to_numpy(np.int64)
        nth = rank_within(key, [ids, start]) + 1 + before[key]
        # later batches start no earlier: only the counters of this batch's last iteration can go on
        last = columns["it"] == it.max()
        calls = before + np.bincount(key, minlength=heads.size)
        self.carry = pd.DataFrame({c: v[last] for c, v in columns.items()} | {"calls": calls[last]})
        code = combined_codes(name_key, direction_key, nth)
        by_time = np.lexsort((ids, start))
        first = by_time[first_rows(code[by_time])]
        batch = pd.DataFrame({"name": names[first], "direction": directions[first], "nth": nth[first]})
        gid = np.full(first.size, -1, np.int64)
        if self.keys is not None:
            gid = batch.merge(self.keys, on=["name", "direction", "nth"], how="left")["gid"].fillna(-1)
            gid = gid.to_numpy(np.int64, copy=True)
        new = gid < 0
        n_before = 0 if self.ops is None else len(self.ops)
        gid[new] = n_before + np.arange(int(new.sum()))
        opened = batch[new].reset_index(drop=True)
        opened["gid"] = gid[new]
        self.keys = (
            opened[["name", "direction", "nth", "gid"]]
            if self.keys is None
            else pd.concat([self.keys, opened[["name", "direction", "nth", "gid"]]], ignore_index=True)
        )
        for c in OP_FIRST:
            opened[c] = np.asarray(values[c])[first][new]
        opened["first_start"] = start[first][new]
        opened["n_instances"] = np.zeros(int(new.sum()), np.int64)
        for c in OP_GIVEN:
            opened[c] = np.full(int(new.sum()), None, dtype=object)
        self.ops = opened if self.ops is None else pd.concat([self.ops, opened], ignore_index=True)
        n = self.ops["n_instances"].to_numpy(np.int64).copy()
        np.add.at(n, gid, np.bincount(code, minlength=first.size))
        self.ops["n_instances"] = n
        for c in OP_GIVEN:
            self._give(c, np.asarray(values[c]), code, by_time, gid)
        device_id = np.asarray(device_id, np.int64)
        keep = device_id >= 0
        self.devices.append(
            pd.DataFrame({"gid": gid[code[keep]], "device_id": device_id[keep]})
            .groupby(["gid", "device_id"])
            .size()
            .reset_index(name="c")
        )
        return gid[code]

    def _give(self, column: str, values: np.ndarray, code: np.ndarray, by_time: np.ndarray, gid: np.ndarray) -> None:
        """The first value in time that is not missing, for the ops without one yet."""
        given = pd.notna(values[by_time])
        if values.dtype.kind in "iu":
            given &= values[by_time] >= 0
        ordered = by_time[given]
        if ordered.size == 0:
            return
        first = first_rows(code[ordered])
        has = np.flatnonzero(first >= 0)
        column_values = self.ops[column].to_numpy(dtype=object).copy()
        at = gid[has]
        empty = pd.isna(column_values[at])
        column_values[at[empty]] = values[ordered[first[has]]][empty]
        self.ops[column] = column_values

    def table(self) -> pd.DataFrame:
        """One row per op, in gid order (OP_GROUP_COLUMNS)."""
        dev = pd.concat(self.devices, ignore_index=True).groupby(["gid", "device_id"])["c"].sum().reset_index()
        dev = dev.sort_values(["gid", "c", "device_id"], ascending=[True, False, True]).drop_duplicates("gid")
        device = pd.Series(dev["device_id"].to_numpy(), index=dev["gid"].to_numpy())
        table = self.ops.copy()
        table["device_id"] = device.reindex(np.arange(len(table))).fillna(-1).to_numpy(np.int64)
        return table[OP_GROUP_COLUMNS]


CALL_METRICS = ("cpu_time", "cpu_overhead", "gpu_time", "gpu_idle", "n_kernels")


def call_metrics(inst: pd.DataFrame) -> None:
    """`is_call` (the instance opens a call) and `call_<metric>`: the call's metrics summed over its
    instances (the autograd nodes of one forward call form one backward call); 0 on the other instances."""
    ids = inst["instance_id"].to_numpy(np.int64)
    call = inst["call_id"].to_numpy(np.int64)
    primary = call == ids
    inst["is_call"] = primary
    if primary.all():
        for m in CALL_METRICS:
            inst[f"call_{m}"] = inst[m].to_numpy()
        return
    # summed into the row of the instance that opens each call, in numpy: a groupby over the frame copied its
    # columns into one block first (0.3 GB at 1.9*10^6 instances, the peak of reading a database back)
    at = pd.Index(ids).get_indexer(call)
    counted = at >= 0
    at = at[counted]
    for m in CALL_METRICS:
        sums = np.zeros(ids.size, dtype=np.int64)
        np.add.at(sums, at, inst[m].to_numpy(np.int64)[counted])
        inst[f"call_{m}"] = np.where(primary, sums, 0)


def finish_op_table(groups: pd.DataFrame, domain: str, family: str | None) -> tuple[pd.DataFrame, np.ndarray]:
    """The op table from one row per op (name, direction, nth; first start, type, label, kind, instances, data
    type, stack trace, device): op_index orders ops by first execution (then name, direction, nth); Op IDs
    count per type in execution order. Returns (ops, op_index of each row of `groups`)."""
    order = np.lexsort(
        (
            groups["nth"].to_numpy(np.int64),
            _sort_rank(groups["direction"].to_numpy(dtype=object)),
            _sort_rank(groups["name"].to_numpy(dtype=object)),
            groups["first_start"].to_numpy(np.int64),
        )
    )
    rank = np.empty(order.size, dtype=np.int64)
    rank[order] = np.arange(order.size)
    ops = groups.iloc[order].reset_index(drop=True)
    ops.insert(0, "op_index", np.arange(len(ops), dtype=np.int64))
    ops.insert(1, "domain", domain)
    unassociated = ops["kind"].isin([UNASSOCIATED_API, UNASSOCIATED_GPU]).to_numpy()
    # per distinct type and label, not per op: a profile without a key node can have 10^6 ops of one type
    op_type = ops["op_type"].to_numpy(dtype=object)
    labels = ops["label"].to_numpy(dtype=object)
    type_label = combined_codes(
        pd.factorize(op_type, use_na_sentinel=False)[0], pd.factorize(labels, use_na_sentinel=False)[0]
    )
    first = first_rows(type_label)
    eligible = np.array(
        [op_tc_eligible(str(t), str(lb), family) for t, lb in zip(op_type[first], labels[first])],
        dtype=bool,
    )
    ops["tc_eligible"] = eligible[type_label] if len(ops) else np.zeros(0, dtype=bool)
    ops.loc[unassociated, "tc_eligible"] = False
    # Op IDs as DLProf wrote them: upper-cased type and an ordinal per type in execution order.
    type_code, types = pd.factorize(pd.Series(op_type, dtype=object).astype(str).to_numpy(dtype=object))
    prefixes = np.empty(len(types), dtype=object)
    prefixes[:] = [_op_id_prefix(t) for t in types]
    prefix_code, _ = pd.factorize(prefixes)
    type_key = prefixes[type_code]
    ordinal = pd.Series(prefix_code[type_code]).groupby(prefix_code[type_code], sort=False).cumcount().to_numpy() + 1
    ops["op_id"] = obj(type_key + "_" + ordinal.astype(str).astype(object), ops.index)
    return ops[OP_COLUMNS + ["label", "kind"]].reset_index(drop=True), rank


def _sort_rank(values: np.ndarray) -> np.ndarray:
    """Each string's dense rank among the distinct strings (their order as str: Arrow compares UTF-8 bytes,
    which is code point order), to sort rows by it."""
    import pyarrow as pa
    import pyarrow.compute as pc

    try:
        text = pc.fill_null(pa.array(values, pa.string()), "None")
    except (pa.ArrowInvalid, pa.ArrowTypeError):  # not all str
        text = pa.array([str(v) for v in values], pa.string())
    if len(text) == 0:
        return np.zeros(0, dtype=np.int64)
    return pc.rank(text, sort_keys="ascending", tiebreaker="dense").to_numpy().astype(np.int64) - 1


_NON_ID = re.compile(r"[^A-Z0-9_]+")


OP_ID_PREFIX_MAX = 48  # DLProf's Op IDs were short types (CONV2D_1); a long label keeps its last characters


def _op_id_prefix(op_type: str) -> str:
    prefix = _NON_ID.sub("_", op_type.upper())
    if len(prefix) > OP_ID_PREFIX_MAX:
        prefix = prefix[-OP_ID_PREFIX_MAX:]
        prefix = prefix.split("_", 1)[1] if "_" in prefix else prefix  # whole words only
    return prefix.lstrip("_") or "OP"
