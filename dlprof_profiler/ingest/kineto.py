"""Ingest: a torch.profiler (Kineto) Chrome-trace JSON file (`*.pt.trace.json[.gz]`) into trace frames.

The frames are those `ingest.nsys` produces from an Nsight Systems export, so every later stage runs
unchanged. Mapping (DESIGN.md, "Kineto input: what differs from nsys"):

- `cpu_op` (2021: `Operator`): an NVTX-like range whose text follows PyTorch's `emit_nvtx` grammar,
  `aten::mm, seq = 12, op_id = 3` (seq from `Sequence number`, op_id from `External id`), so PyTorch's
  marker rules apply as for nsys input; `Input Dims`/`Input type`/`Call stack` become the pre-parsed
  range columns `input_shapes`, `data_type`, `stack_trace`, `parameters` (`flops=N`: the `flops` argument),
  `output_shapes` (of convolutions, from `Concrete Inputs`).
- `user_annotation` (`ProfilerStep#N`, `Optimizer.step#SGD.step`, `record_function` labels): scope ranges.
- `python_function`: module frames `nn.Module: Linear_0` are scope ranges named `Linear_0`; the other
  Python frames only give the stack trace of the ops they enclose.
- `cuda_runtime`/`cuda_driver` (2021: `Runtime`; other devices: `*_runtime`/`*_driver`): API calls.
- `kernel`/`gpu_memcpy`/`gpu_memset` (2021: `Kernel`/`Memcpy`/`Memset`; MTIA: `mtia_ccp_events`): GPU
  activities, linked to their API call by `correlation` (else by the `ac2g` flow arrows).
- `cuda_sync`: synchronisations; `[memory]` instant events: memory allocations and frees (memory.py);
  `deviceProperties`: GPUs; `distributedInfo`: rank and world size; `process_name`/`thread_name` metadata: names.

Times are integer ns (parsed exactly from the JSON decimals), relative to the start of collection (the
`PyTorch Profiler` span, else the first event); the absolute start is kept in meta.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pandas.api.types import union_categoricals

from dlprof_profiler.ingest import kineto_decode as kd
from dlprof_profiler.engine import markers as nm
from dlprof_profiler.errors import DLProfError
from dlprof_profiler.ingest.kineto_repair import describe as describe_repairs
from dlprof_profiler.process_memory import available_memory, release_unused_memory
from dlprof_profiler.engine.memory import empty_memory_frame, gpu_peak, memory_frame, merge_frames
from dlprof_profiler.ingest.nsys import COPY_KIND_LABELS, MEMSET_LABEL, copy_kind_label
from dlprof_profiler.engine.markers import format_shapes, output_shape_text
from dlprof_profiler.engine.structure import RangeForest, levels, nearest_flagged_ancestor, outermost_flagged
from dlprof_profiler.engine.trace import (
    PARTIAL_STEPS,
    DEVICE_COLUMNS,
    API_COLUMNS,
    DEFAULT_DOMAIN,
    GPU_COLUMNS,
    KIND_KERNEL,
    KIND_MEMCPY,
    KIND_MEMSET,
    RANGE_COLUMNS,
    Trace,
    combined_codes,
    same_objects,
)

NVTX_PUSH_POP = 59  # the nsys eventType of push/pop ranges: Kineto ranges nest per thread
MODULE_PREFIX = "nn.Module: "
PROFILER_STEP = re.compile(r"^ProfilerStep#\d+$")
PARTIAL_STEPS_KEY = "dlprof_partial_steps"  # written by dlprof's torch capture (torch_startup/sitecustomize.py)
COPY_KINDS = {v.split(" ")[-1].rstrip("]"): k for k, v in COPY_KIND_LABELS.items() if k <= 10}  # HtoD -> 1
SYNC_TYPES = {"event sync": 1, "stream wait event": 2, "stream sync": 3, "context sync": 4}
CPU_GROUPS = (kd.OP, kd.ANNOTATION, kd.PYTHON, kd.API)
TIMED_GROUPS = CPU_GROUPS + kd.GPU_GROUPS + (kd.SYNC,)
CORRELATION_FLOWS = ("ac2g", "async", "async_cpu_to_gpu")
FAR_OFF_NS = 86_400 * 10**9  # no profile lasts a day: an event this far from the others has a damaged time
FAR_OFF_SPREADS = 1000  # ... nor this many times the median distance of the events to their median time
ANALYSIS_BASE_BYTES = 250 << 20  # memory_to_analyse
ANALYSIS_BYTES_PER_TEXT_BYTE = 0.75


def is_kineto_trace(path: Path) -> bool:
    """Whether a file is a Kineto / Chrome-trace JSON file (gzipped or not), judged by its content."""
    return kd.looks_like_trace(Path(path))


def read_kineto_trace(path: Path) -> Trace:
    """Read a Kineto trace into a Trace (raises DLProfError with a one-line reason naming the file)."""
    check_memory(Path(path))
    trace = build_trace(kd.decode(Path(path)))
    release_unused_memory()  # what building freed (the decoded columns, its temporaries) goes back here
    return trace


def memory_to_analyse(text_bytes: int) -> int:
    """About the peak memory, in bytes, of analysing a trace of `text_bytes` of JSON (a torch.profiler trace is
    analysed in memory). Measured with `dlprof --database` (all stages) on bench_kineto.py's traces: 0.43 GB at
    10^6 events (328 MB), 2.28 GB at 10^7 (3.3 GB), 2.25 GB for copies of a real trace at 10^7 (2.9 GB); this
    gives 0.48, 2.55 and 2.27 GB."""
    return ANALYSIS_BASE_BYTES + int(ANALYSIS_BYTES_PER_TEXT_BYTE * text_bytes)


def check_memory(path: Path) -> None:
    """Refuse, before decoding, a plain JSON trace the memory left cannot analyse (it would end in the kernel's
    out-of-memory kill, or in swapping, rather than in a message). A gzipped trace's text size is known once
    inflated: kineto_decode refuses a text larger than the memory there."""
    try:
        with open(path, "rb") as fh:
            if fh.read(2) == kd.GZIP_MAGIC:
                return
            size = os.fstat(fh.fileno()).st_size
    except OSError:
        return  # (the decoder names what is wrong with the file)
    room = available_memory()
    need = memory_to_analyse(size)
    if room is not None and need > room:
        raise DLProfError(
            f"{path}: analysing this trace needs about {need / 2**30:.1f} GB of memory ({size / 2**30:.1f} GB of "
            f"JSON; a torch.profiler trace is analysed in memory), {room / 2**30:.1f} GB are available; free "
            "memory, or record fewer steps (torch.profiler.schedule's active=)"
        )


# ---------------------------------------------------------------------------- the whole trace


class _Events:
    """The decoded columns with the lookups the frame builders share."""

    def __init__(self, decoded: kd.Decoded):
        self.path = decoded.path
        self.meta = decoded.meta
        self.c = decoded.columns
        self.strings = self.c.string_array()
        self.code = {s: i for i, s in enumerate(self.c.strings)}
        self.raws = self.c.raw_array()

    def is_ph(self, ph: str) -> np.ndarray:
        code = self.code.get(ph)
        return self.c.ph == code if code is not None else np.zeros(self.c.n, dtype=bool)

    def text(self, codes: np.ndarray) -> np.ndarray:
        """Strings for codes (None for -1)."""
        out = np.full(codes.size, None, dtype=object)
        ok = codes >= 0
        out[ok] = self.strings[codes[ok]]
        return out


def build_trace(decoded: kd.Decoded) -> Trace:
    """Trace frames from decoded Kineto columns."""
    ev = _Events(decoded)
    c = ev.c
    path = ev.path
    if c.n == 0:
        raise DLProfError(f"{path}: the trace holds no events (traceEvents is empty)")
    trace = Trace(source=path)
    warnings = trace.warnings
    _record_functions_as_annotations(ev)
    complete = ev.is_ph("X")
    timed = complete & np.isin(c.group, TIMED_GROUPS)
    usable = timed & c.ts_ok & c.dur_ok & (c.dur >= 0)
    _warn_repaired(ev, warnings)
    _warn_dropped(ev, timed, warnings)
    _warn_unknown_categories(ev, warnings)
    far = _far_off(ev, usable, warnings)
    usable &= ~far
    origin = _origin(ev, usable, far)
    start = c.ts - origin
    end = start + c.dur
    cpu = usable & c.pid_numeric & c.tid_numeric
    n_cpu_less = int((usable & np.isin(c.group, CPU_GROUPS) & ~cpu).sum())
    if n_cpu_less:
        warnings.append(f"{path}: {n_cpu_less} CPU events without a numeric process or thread id were skipped")
    gtid, pid_col = _thread_ids(c.pid, c.tid, cpu & np.isin(c.group, CPU_GROUPS), warnings, path)
    correlation = _correlations(ev, usable, start)
    c.let_go("ts", "dur", "flow_id", "ph", "cat")  # times are `start`/`end` now; phases, categories: `group`
    del complete, timed, far

    # the transients of each frame are handed back before the next is built: at 10^7 events the allocators
    # otherwise keep ~0.8 GB that the next steps' large arrays (mapped apart) cannot reuse
    seq = _backward_seqs(ev, cpu & (c.group == kd.OP), start, end, gtid, pid_col)
    release_unused_memory()
    trace.ranges, has_steps = _ranges(ev, cpu, start, end, gtid, pid_col, seq)
    del seq
    release_unused_memory()
    trace.api_calls = _api_calls(ev, cpu & (c.group == kd.API), start, end, gtid, pid_col, correlation)
    main_pid = _main_pid(trace)
    trace.gpu = _gpu_activities(
        ev, usable & np.isin(c.group, kd.GPU_GROUPS), start, end, correlation, trace.api_calls, main_pid, warnings
    )
    release_unused_memory()
    trace.syncs = _syncs(ev, usable & (c.group == kd.SYNC), start, end, correlation, main_pid)
    trace.devices = _devices(ev.meta.get("deviceProperties"), trace.gpu)
    cpu_events = cpu & np.isin(c.group, CPU_GROUPS)
    trace.processes, trace.threads = _processes_threads(ev, trace, cpu_events, gtid, pid_col)
    trace.has_cuda_tables = len(trace.api_calls) > 0 or len(trace.gpu) > 0
    trace.has_nvtx = len(trace.ranges) > 0
    trace.meta, trace.system = _meta(ev, origin, trace, has_steps)
    trace.memory = _memory_events(ev, start, cpu_events, gtid, pid_col, trace, warnings)
    peak = gpu_peak(trace.memory)
    if peak is not None:
        trace.meta["gpu_peak_memory"] = peak
    if len(trace.gpu) == 0:
        warnings.append(
            f"{path}: no GPU activities (kernels, memcpys, memsets): a CPU-only trace, every GPU figure is zero"
        )
    if len(trace.ranges) == 0:
        warnings.append(
            f"{path}: no cpu_op or user_annotation events: ops cannot be named, every GPU activity "
            "is reported under the API call that launched it"
        )
    return trace


def _record_functions_as_annotations(ev: _Events) -> None:
    """`record_function` ranges written as op events become annotations, as newer traces write them:
    - old traces (2021) record `record_function` labels as `Operator` events, like ops: PyTorch's own
      labels have the form `Label#detail` (`ProfilerStep#5`, `Optimizer.step#SGD.step`,
      `enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__`), which no op name has (ops are
      `namespace::name` or autograd nodes);
    - dlprof_profiler.pytorch's markers (`{'traceMarker': ...}`, `{'mod': ...}`: Python dict literals) that
      `_RecordFunctionFast` writes as `cpu_op` events."""
    c = ev.c
    labels = pd.Series(ev.strings, dtype=object)
    is_label = np.zeros(len(ev.strings) + 1, dtype=bool)  # the extra last entry: code -1 (no name)
    is_label[:-1] = (
        (labels.str.contains("#", regex=False, na=False) & ~labels.str.contains("::", regex=False, na=False))
        | labels.str.startswith("{'", na=False)
    ).to_numpy(dtype=bool)
    relabel = (c.group == kd.OP) & is_label[c.name]
    if relabel.any():
        c.group[relabel] = kd.ANNOTATION


def _warn_repaired(ev: _Events, warnings: list) -> None:
    if ev.c.repaired_events:
        warnings.append(
            f"{ev.path}: {ev.c.repaired_events:,} events written as invalid JSON were repaired and read "
            f"({describe_repairs(ev.c.repairs)})"
        )


def _far_off(ev: _Events, usable: np.ndarray, warnings: list) -> np.ndarray:
    """Events whose start or end lies far outside the trace's own span (a damaged `ts`: 1.0 among epoch
    microseconds), with a warning counting them: farther from the median start of the usable events than
    FAR_OFF_NS or FAR_OFF_SPREADS times the median distance to it, whichever is larger. Never half the events
    or more (then no time is the trace's own)."""
    c = ev.c
    span = ev.is_ph("X") & (c.group == kd.SPAN) & c.ts_ok  # the profiler span gives time zero too
    checked = usable | span
    if usable.sum() < 2:
        return np.zeros(c.n, dtype=bool)
    start = c.ts.astype(np.float64)
    median = float(np.median(start[usable]))
    spread = float(np.median(np.abs(start[usable] - median)))
    horizon = max(FAR_OFF_NS, FAR_OFF_SPREADS * spread)
    end = start + np.where(c.dur_ok, c.dur, 0)
    far = checked & ((np.abs(start - median) > horizon) | (np.abs(end - median) > horizon))
    n_far = int((far & usable).sum())
    if n_far * 2 >= int(usable.sum()):
        return np.zeros(c.n, dtype=bool)
    if far.any():
        example = int(c.ts[np.flatnonzero(far)[0]])
        days = horizon / FAR_OFF_NS
        span_text = "a day" if days == 1 else f"{days:,.1f}".rstrip("0").rstrip(".") + " days"
        warnings.append(
            f"{ev.path}: {int(far.sum()):,} events were dropped: their start or end lies more than {span_text} "
            f"from the trace's median time (a damaged timestamp, e.g. ts = {example / 1000:.3f} us)"
        )
    return far


def _warn_dropped(ev: _Events, timed: np.ndarray, warnings: list) -> None:
    c = ev.c
    no_time = timed & ~(c.ts_ok & c.dur_ok)
    negative = timed & c.ts_ok & c.dur_ok & (c.dur < 0)
    if no_time.any():
        warnings.append(f"{ev.path}: {int(no_time.sum())} events without a numeric ts or dur were skipped")
    if negative.any():
        warnings.append(f"{ev.path}: {int(negative.sum())} events with a negative duration were skipped")


def _warn_unknown_categories(ev: _Events, warnings: list) -> None:
    unknown = ev.c.group == kd.UNKNOWN
    if unknown.any():
        codes, counts = np.unique(ev.c.cat[unknown], return_counts=True)
        listed = ", ".join(f"{ev.strings[k]} ({n})" for k, n in zip(codes.tolist(), counts.tolist()))
        warnings.append(f"{ev.path}: events of unknown categories were ignored: {listed}")


def _origin(ev: _Events, usable: np.ndarray, far: np.ndarray) -> int:
    """Time zero: the start of collection (the profiler span or the first event, whichever is first)."""
    c = ev.c
    candidates = []
    if usable.any():
        candidates.append(int(c.ts[usable].min()))
    span = ev.is_ph("X") & (c.group == kd.SPAN) & c.ts_ok & ~far
    if span.any():
        candidates.append(int(c.ts[span].min()))
    if not candidates:
        raise DLProfError(f"{ev.path}: no event has a usable time (ts and dur)")
    return min(candidates)


def _thread_ids(pid: np.ndarray, tid: np.ndarray, cpu: np.ndarray, warnings: list, path: Path):
    """nsys-style global thread ids, (pid << 24) | tid, and the pid column. Kineto writes some thread ids
    truncated to 32 bits (negative) or larger than 24 bits: those get free numbers at the top of the
    24-bit range (real Linux thread ids stay below 2**22); the thread table keeps the original ids."""
    gtid = np.full(pid.size, -1, dtype=np.int64)
    pids = pid  # copied only where ids are renumbered (the caller never writes to it)
    if not cpu.any():
        return gtid, pids
    p, t = pid[cpu], tid[cpu]
    limit = 1 << 24
    bad_pid = (p < 0) | (p >= limit)
    if bad_pid.any():
        codes, _ = pd.factorize(p[bad_pid])
        p = p.copy()
        p[bad_pid] = limit - 1 - codes
        warnings.append(f"{path}: process ids outside 0..2**24 were renumbered from {limit - 1} down")
        pids = pid.copy()
        pids[cpu] = p
    bad_tid = (t < 0) | (t >= limit)
    if bad_tid.any():
        t = t.copy()
        t[bad_tid] = limit - 1 - combined_codes(p[bad_tid], t[bad_tid])
    gtid[cpu] = (p << 24) | t
    return gtid, pids


def _main_pid(trace: Trace) -> int:
    """The process that launches most GPU work (else has most ranges): owner of activities with no call."""
    for frame in (trace.api_calls, trace.ranges):
        if len(frame):
            return int(frame["pid"].value_counts().idxmax())
    return 0


# ---------------------------------------------------------------------------- correlation ids


def _correlations(ev: _Events, usable: np.ndarray, start: np.ndarray) -> np.ndarray:
    """Correlation id per event: args `correlation`, else the id of the flow arrow (ac2g) that starts or
    ends at the event (same process/device row, thread/stream row and time)."""
    c = ev.c
    corr = c.args["correlation"].copy()
    wants = usable & np.isin(c.group, (kd.API,) + kd.GPU_GROUPS) & (corr < 0)
    if not wants.any():
        return corr
    flow_codes = [ev.code[k] for k in ev.code if k.lower() in CORRELATION_FLOWS]
    flows = (c.group == kd.FLOW) & np.isin(c.cat, flow_codes) & (c.flow_id >= 0) & c.ts_ok
    if not flows.any():
        return corr

    def keys(rows):
        return pd.DataFrame(
            {
                "pid": c.pid[rows],
                "pn": c.pid_numeric[rows],
                "tid": c.tid[rows],
                "tn": c.tid_numeric[rows],
                "ts": start[rows],  # (ts - origin: equal where ts is)
            }
        )

    on = ["pid", "pn", "tid", "tn", "ts"]
    table = keys(flows).assign(flow=c.flow_id[flows]).drop_duplicates(on, keep="first")
    rows = np.flatnonzero(wants)
    found = keys(rows).merge(table, on=on, how="left")["flow"].to_numpy()
    ok = ~pd.isna(found)
    corr[rows[ok]] = found[ok].astype(np.int64)
    return corr


# ---------------------------------------------------------------------------- ranges


def _backward_seqs(ev: _Events, op_mask: np.ndarray, start, end, gtid, pid) -> np.ndarray:
    """Sequence numbers of the op events, with the backward nodes that the trace leaves without a forward op
    linked as far as it records (DESIGN.md "Kineto input", Direction):
    - a node whose seq no forward op of its process has (CopySlices: an in-place op on a view made it just
      after its own node) takes the seq of a linked node nested in it (CopySlices runs the in-place op's
      node inside it), else of the forward op with the greatest lower seq in its process (the op running
      when the node was made: AsStridedBackward0 is made when an op reads a view rebased by an in-place op);
    - AccumulateGrad, which has no seq, takes the seq of the node autograd ran just before it on its thread
      (the one that produced the parameter's gradient: autograd runs AccumulateGrad right after it)."""
    c = ev.c
    seq = c.args["seq"].copy()
    rows = np.flatnonzero(op_mask)
    if rows.size == 0:
        return seq
    names = pa.array(ev.strings, type=pa.string())
    inner, backward = nm.backward_labels(names)
    evaluate = np.asarray(pc.fill_null(pc.starts_with(names, nm.EVALUATE_FN), False), dtype=bool)
    accumulate = np.asarray(
        pc.fill_null(pc.ends_with(pa.array(inner, type=pa.string()), "AccumulateGrad"), False), dtype=bool
    )
    code = c.name[rows]
    known = code >= 0
    is_bwd = np.where(known, backward[np.maximum(code, 0)], False)
    is_eval = np.where(known, evaluate[np.maximum(code, 0)], False)
    is_acc = is_eval & np.where(known, accumulate[np.maximum(code, 0)], False)
    r_seq, r_pid = seq[rows], pid[rows]
    forest = RangeForest(gtid[rows], start[rows], end[rows], np.arange(rows.size))
    # forward ops: not run by autograd's engine (`torch::autograd::CopySlices` inside its evaluate_function
    # carries the node's seq but is no forward op)
    in_engine = outermost_flagged(forest.parent, forest.depth, is_eval) >= 0
    forward = ~is_bwd & ~in_engine & (r_seq >= 0)
    fwd_keys = np.unique((r_pid[forward] << 40) | r_seq[forward])
    keys = (r_pid << 40) | np.maximum(r_seq, 0)
    unmatched = is_bwd & (r_seq >= 0) & ~np.isin(keys, fwd_keys)
    if unmatched.any():
        root = outermost_flagged(forest.parent, forest.depth, unmatched)
        donor = np.flatnonzero(is_bwd & (r_seq >= 0) & ~unmatched & (root >= 0))
        donor = donor[np.argsort(start[rows][donor], kind="stable")]
        given = np.full(rows.size, -1, dtype=np.int64)
        first = np.unique(root[donor], return_index=True)[1]
        given[root[donor][first]] = r_seq[donor][first]
        taker = np.flatnonzero(unmatched)
        from_nested = given[root[taker]]
        r_seq = r_seq.copy()
        r_seq[taker] = np.where(from_nested >= 0, from_nested, r_seq[taker])
        rest = taker[from_nested < 0]
        if rest.size and fwd_keys.size:
            below = np.searchsorted(fwd_keys, keys[rest], side="left") - 1
            hit = (below >= 0) & ((fwd_keys[np.maximum(below, 0)] >> 40) == r_pid[rest])
            r_seq[rest[hit]] = fwd_keys[below[hit]] & ((1 << 40) - 1)
    acc = np.flatnonzero(is_acc & (r_seq < 0))
    if acc.size:
        evals = np.flatnonzero(is_eval)
        evals = evals[np.lexsort((start[rows][evals], gtid[rows][evals]))]
        producer_pos = np.maximum.accumulate(np.where(~is_acc[evals], np.arange(evals.size), -1))
        pos_of = np.full(rows.size, -1, dtype=np.int64)
        pos_of[evals] = np.arange(evals.size)
        prev = producer_pos[pos_of[acc]]
        producer = evals[np.maximum(prev, 0)]
        ok = (prev >= 0) & (gtid[rows][producer] == gtid[rows][acc])
        r_seq[acc[ok]] = r_seq[producer[ok]]
    seq[rows] = r_seq
    return seq


def _ranges(ev: _Events, cpu: np.ndarray, start, end, gtid, pid, seq) -> pd.DataFrame:
    """cpu_op, user_annotation and nn.Module ranges, ordered by start (outer ranges first on ties)."""
    c = ev.c
    is_module_code = np.zeros(len(ev.strings) + 1, dtype=bool)
    module_names = np.flatnonzero(
        pd.Series(ev.strings, dtype=object).str.startswith(MODULE_PREFIX, na=False).to_numpy(dtype=bool)
    )
    is_module_code[module_names] = True
    module = (c.group == kd.PYTHON) & is_module_code[c.name]
    op = cpu & (c.group == kd.OP)
    keep = cpu & (op | (c.group == kd.ANNOTATION) | module)
    rows = np.flatnonzero(keep)
    # on equal start and end the enclosing range must come first: module < annotation < op, then file order
    tie = np.select([module[rows], c.group[rows] == kd.ANNOTATION], [0, 1], 2)
    order = np.lexsort((rows, tie, -end[rows], start[rows]))
    rows = rows[order]
    n = rows.size
    text, labels = _range_texts(ev, rows, op[rows], module[rows], seq[rows])
    release_unused_memory()  # the Arrow pool keeps the texts' intermediates (0.25 GB at 10^7 events) otherwise
    step_label = np.array([bool(PROFILER_STEP.match(s)) for s in labels], dtype=bool)  # per distinct label
    scope_codes = c.name[rows[~op[rows]]]
    has_steps = bool(step_label[np.where(scope_codes >= 0, scope_codes, len(labels) - 1)].any())
    frame = pd.DataFrame(
        {
            "range_id": np.arange(1, n + 1, dtype=np.int64),
            "domain": pd.Series(same_objects(n, DEFAULT_DOMAIN), dtype=object, copy=False),
            "text": pd.Series(text, dtype="str"),
            "start": start[rows],
            "end": end[rows],
            "global_tid": gtid[rows],
            "pid": pid[rows],
            "event_type": np.full(n, NVTX_PUSH_POP, dtype=np.int8),
            "unclosed": np.zeros(n, dtype=bool),
        },
        copy=False,
    )[RANGE_COLUMNS]
    details = _op_details(ev, rows, op[rows], start, end, gtid, cpu)
    for name, values in details.items():
        frame[name] = pd.Series(values, dtype=object, copy=False)
    return frame, has_steps


def _range_texts(
    ev: _Events, rows: np.ndarray, op: np.ndarray, module: np.ndarray, seq: np.ndarray
) -> tuple[pa.Array, list]:
    """emit_nvtx-style texts for ops (`name, seq = S, op_id = E`), labels for scopes (in Arrow); and the
    labels by name code (the last one for events without a name)."""
    c = ev.c
    names = ev.strings.copy()
    module_codes = np.unique(c.name[rows[module]])
    names[module_codes] = [s[len(MODULE_PREFIX) :] for s in ev.strings[module_codes]]
    labels = names.tolist() + [""]
    dictionary = pa.array(labels, type=pa.string())
    name_codes = c.name[rows]
    label = dictionary.take(pa.array(np.where(name_codes >= 0, name_codes, len(names))))
    ext = c.args.at("external_id", rows)
    op_id = np.where(ext >= 0, ext, rows)
    texts = nm.with_call_fields(label, pa.array(seq, mask=~(op & (seq >= 0))), pa.array(op_id, mask=~op))
    return texts, labels


def _op_details(ev: _Events, rows: np.ndarray, op: np.ndarray, start, end, gtid, cpu) -> dict:
    """Pre-parsed columns of op ranges: data type (first tensor input type), input shapes, stack trace."""
    c = ev.c
    out = {}
    n = rows.size
    for column, arg, parse in (("data_type", "input_type", _data_type), ("input_shapes", "input_dims", _shapes)):
        codes = c.args.at(arg, rows)
        values = np.full(n, None, dtype=object)
        has = op & (codes >= 0)
        if has.any():
            inverse, used = pd.factorize(codes[has])  # hashing, not sorting
            parsed = np.empty(used.size, dtype=object)
            parsed[:] = [parse(ev.raws[k]) for k in used.tolist()]  # once per distinct raw value
            values[has] = parsed[inverse]
        out[column] = values
    out["stack_trace"] = _stack_traces(ev, rows, op, start, end, gtid, cpu)
    out["output_shapes"] = _conv_output_shapes(ev, rows, op)
    # the profiler's own FLOPs figure of a call, as a parameter (flops.py reads it; it wins over the formulas)
    flops = c.args.at("flops", rows)
    given = op & (flops >= 0)
    parameters = np.full(n, None, dtype=object)
    if given.any():
        inverse, used = pd.factorize(flops[given])
        parameters[given] = np.array([f"flops={int(v)}" for v in used], dtype=object)[inverse]
    out["parameters"] = parameters
    return out


# convolutions whose output shape follows from Input Dims and Concrete Inputs (positions of stride, padding,
# dilation in aten::conv{1,2,3}d(input, weight, bias, stride, padding, dilation, groups))
_CONV_OPS = {name: name[len("aten::") :] for name in kd.RAW_ARG_OPS["concrete_inputs"]}
_CONV_PARAMETERS = ((3, "stride"), (4, "padding"), (5, "dilation"))


def _conv_output_shapes(ev: _Events, rows: np.ndarray, op: np.ndarray) -> np.ndarray:
    """The output shape of convolution ops (DLProf's text, as the markers give it; flops.py needs it), from their
    `Input Dims` and `Concrete Inputs` (recorded by PyTorch 2.x); None elsewhere. Once per distinct value."""
    c = ev.c
    out = np.full(rows.size, None, dtype=object)
    conv_codes = [ev.code[name] for name in _CONV_OPS if name in ev.code]
    if not conv_codes:
        return out
    names = c.name[rows]
    dims, concrete = c.args.at("input_dims", rows), c.args.at("concrete_inputs", rows)
    has = op & np.isin(names, conv_codes) & (dims >= 0) & (concrete >= 0)
    if has.any():
        keys = pd.MultiIndex.from_arrays([names[has], dims[has], concrete[has]])
        inverse, used = pd.factorize(keys)
        texts = np.empty(len(used), dtype=object)
        texts[:] = [_conv_output(ev.strings[n], ev.raws[d], ev.raws[k]) for n, d, k in used]
        out[has] = texts[inverse]
    return out


def _conv_output(name: str, dims_raw: str, concrete_raw: str) -> str | None:
    try:
        dims, concrete = json.loads(dims_raw), json.loads(concrete_raw)
    except ValueError:
        return None
    if not isinstance(dims, list) or len(dims) < 2 or not isinstance(concrete, list):
        return None
    params = []
    for position, key in _CONV_PARAMETERS:
        if position < len(concrete) and isinstance(concrete[position], str) and concrete[position]:
            try:
                params.append((key, json.loads(concrete[position])))
            except ValueError:
                params.append((key, concrete[position]))  # padding="same"/"valid": no output shape
    return output_shape_text(_CONV_OPS[name], [dims[0], dims[1]], params) or None


def _data_type(raw: str) -> str | None:
    """`["float", "Scalar", ""]` -> float: the first tensor type (c10 scalar type names, lower-cased as
    PyTorch's dtypes are: c10::Half -> half)."""
    try:
        types = json.loads(raw)
    except ValueError:
        return None
    for t in types if isinstance(types, list) else []:
        if (
            isinstance(t, str)
            and t
            and t
            not in (
                "Scalar",
                "ScalarList",
                "TensorList",
                "GenericList",
                "Int",
                "Bool",
                "Float",
                "Double",
                "Long",
                "String",
                "Device",
                "Layout",
                "ScalarType",
                "MemoryFormat",
                "None",
            )
        ):
            t = t.replace("c10::", "")
            return {"Half": "float16", "BFloat16": "bfloat16", "c10::BFloat16": "bfloat16"}.get(t, t.lower())
    return None


def _shapes(raw: str) -> str | None:
    """`[[8, 16], [32, 16], []]` -> `<8, 16>; <32, 16>` (tensor lists are flattened)."""
    try:
        dims = json.loads(raw)
    except ValueError:
        return None
    shapes = []
    for d in dims if isinstance(dims, list) else []:
        if isinstance(d, list) and d and all(isinstance(x, list) for x in d):
            shapes += [x for x in d if x]
        elif isinstance(d, list) and d and all(isinstance(x, int) for x in d):
            shapes.append(d)
    return format_shapes(shapes) if shapes else None


# ---------------------------------------------------------------------------- stack traces

_NOT_USER_FRAME = re.compile(
    r"^<|^nn\.Module: |^torch/|/site-packages/|/dist-packages/|/lib/python\d|"
    r"(?:^|/)dlprof_profiler/|^sitecustomize\.py\("
)


def _user_frames(frames: list[str]) -> list[str]:
    return [f for f in frames if f and not _NOT_USER_FRAME.search(f)]


def _call_stack_text(raw: str) -> str | None:
    """2021 `Call stack` (innermost first, `;`-separated) -> user frames, outermost first, one per line."""
    frames = _user_frames([f.strip() for f in reversed(raw.split(";"))])
    return "\n".join(frames) if frames else None


def _stack_traces(ev: _Events, rows: np.ndarray, op: np.ndarray, start, end, gtid, cpu) -> np.ndarray:
    """Per range: the user Python frames enclosing the op, outermost first (from the `Call stack` arg of
    old traces, else from the `python_function` events around it)."""
    c = ev.c
    out = np.full(rows.size, None, dtype=object)
    stacks = c.args.at("call_stack", rows)
    has = op & (stacks >= 0)
    if has.any():
        inverse, used = pd.factorize(stacks[has])
        texts = np.empty(used.size, dtype=object)
        texts[:] = [_call_stack_text(ev.strings[k]) for k in used.tolist()]
        out[has] = texts[inverse]
    python = np.flatnonzero(cpu & (c.group == kd.PYTHON))
    ops = np.flatnonzero(op & ~has)
    if python.size == 0 or ops.size == 0:
        return out
    # one forest over Python frames and ops: an op's stack is that of its nearest enclosing user frame
    frame_names = ev.strings[c.name[python]] if python.size else np.zeros(0, dtype=object)
    is_user = ~pd.Series(frame_names, dtype=object).str.contains(_NOT_USER_FRAME, na=True).to_numpy(dtype=bool)
    members = np.concatenate([python, rows[ops]])
    forest = RangeForest(gtid[members], start[members], end[members], np.arange(members.size))
    flagged = np.zeros(members.size, dtype=bool)
    flagged[: python.size] = is_user
    anchor = nearest_flagged_ancestor(forest.parent, forest.depth, flagged)
    # stack text of every user frame, level by level: parent's stack + "\n" + own name (shared strings)
    user_parent = np.where(flagged, anchor, -1)
    text_code = np.full(members.size, -1, dtype=np.int64)
    table: list[str] = []
    for idx in levels(forest.depth):
        idx = idx[flagged[idx]]
        if idx.size == 0:
            continue
        parent = user_parent[idx]
        base = np.where(parent >= 0, text_code[np.maximum(parent, 0)], -1)
        name_code = c.name[members[idx]].astype(np.int64)
        pair = combined_codes(base, name_code)
        first = np.full(int(pair.max()) + 1, -1, dtype=np.int64)
        first[pair[::-1]] = np.arange(pair.size - 1, -1, -1)
        offset = len(table)
        table.extend((table[base[i]] + "\n" if base[i] >= 0 else "") + ev.strings[name_code[i]] for i in first)
        text_code[idx] = offset + pair
    texts = np.empty(len(table), dtype=object)
    texts[:] = table
    op_anchor = anchor[python.size :]
    code = np.where(op_anchor >= 0, text_code[np.maximum(op_anchor, 0)], -1)
    ok = code >= 0
    out[ops[ok]] = texts[code[ok]]
    return out


# ---------------------------------------------------------------------------- API calls and GPU activities


def _api_calls(ev: _Events, rows_mask, start, end, gtid, pid, correlation) -> pd.DataFrame:
    c = ev.c
    rows = np.flatnonzero(rows_mask)
    rows = rows[np.lexsort((rows, start[rows]))]  # api_id = position in start order
    n = rows.size
    frame = pd.DataFrame(
        {
            "api_id": np.arange(n, dtype=np.int64),
            "name": _categorical(ev, c.name[rows]),
            "start": start[rows],
            "end": end[rows],
            "global_tid": gtid[rows],
            "pid": pid[rows],
            "correlation_id": correlation[rows],
            "event_class": np.zeros(n, dtype=np.int64),
            "return_value": np.zeros(n, dtype=np.int64),
        },
        copy=False,
    )
    return frame[API_COLUMNS]


def _categorical(ev: _Events, codes: np.ndarray, names: np.ndarray | None = None) -> pd.Categorical:
    """A Categorical over the distinct strings the codes use (-1 -> '<unknown>')."""
    names = ev.strings if names is None else names
    inverse, used = pd.factorize(codes)
    texts = np.array([names[k] if k >= 0 else "<unknown>" for k in used.tolist()], dtype=object)
    distinct, remap = np.unique(texts.astype(str), return_inverse=True)
    return pd.Categorical.from_codes(
        remap[inverse.reshape(-1)].astype(np.int64), categories=pd.Index(distinct.astype(object), dtype=object)
    )


# Parts of a demangled name whose brackets are not brackets: anonymous namespaces (`(anonymous namespace)`
# from Kineto's demangler, `<unnamed>` from nsys') and operator names (`operator()`, `operator<<`).
_OPAQUE = re.compile(
    r"\(anonymous namespace\)|<unnamed>|\boperator(?:\s*(?:\(\)|\[\]|<=>|<<=|>>=|->\*?|<<|>>|<=|>=|&&|\|\||\+\+|--"
    r"|new(?:\[\])?|delete(?:\[\])?|[-+*/%^&|~!=<>,]=?)|\s+[\w:]+[\s*&]*?(?=\())"
)
_TRAILING_QUALIFIERS = re.compile(r"(?:\s+(?:const|volatile|noexcept|&&|&)|\s*\[clone [^\]]*\])+$")
_OPENERS = {")": "(", "]": "[", "}": "{"}


def short_kernel_name(name: str) -> str:
    """The kernel function's own name, as nsys' shortName: the last component of the qualified name before
    the parameter list and the template arguments, after the return type.
    `void at::native::vectorized_elementwise_kernel<4, ...>(int, ...)` -> vectorized_elementwise_kernel;
    `std::enable_if<!(false), void>::type internal::gemvx::kernel<...>(...)` -> kernel."""
    opaque: list[str] = []

    def hide(match):  # one private-use character per opaque part, so its brackets are not counted
        opaque.append(match.group(0))
        return chr(0xE000 + len(opaque) - 1)

    text = _TRAILING_QUALIFIERS.sub("", _OPAQUE.sub(hide, name.strip()))
    # one scan (per distinct kernel name, never per launch): where each bracket group opens, and which spaces
    # and `::` lie outside every group. `<` `>` are tolerated unbalanced (comparisons inside parentheses).
    stack: list[tuple[str, int]] = []
    opened_at: dict[int, int] = {}
    cuts: list[int] = []  # top-level space or `::`: the return type and the scopes end there
    for i, ch in enumerate(text):
        if ch in "([{<":
            stack.append((ch, i))
        elif ch in ")]}":
            while stack:
                opener, at = stack.pop()
                if opener == _OPENERS[ch]:
                    opened_at[i] = at
                    break
        elif ch == ">":
            if stack and stack[-1][0] == "<":
                opened_at[i] = stack.pop()[1]
        elif not stack and (ch == " " or (ch == ":" and text[i - 1 : i] == ":")):
            cuts.append(i)
    end = len(text)
    for closer in (")", ">"):  # the parameter list, then the template arguments
        if end and text[end - 1] == closer and end - 1 in opened_at:
            end = opened_at[end - 1]
            while end and text[end - 1] == " ":
                end -= 1
    begin = max([c + 1 for c in cuts if c < end], default=0)
    short = re.sub("[\ue000-\uefff]", lambda m: opaque[ord(m.group(0)) - 0xE000], text[begin:end]).strip()
    return short or name


def _gpu_activities(
    ev: _Events, rows_mask, start, end, correlation, api: pd.DataFrame, main_pid: int, warnings: list
) -> pd.DataFrame:
    c = ev.c
    rows = np.flatnonzero(rows_mask)
    kind = np.select(
        [c.group[rows] == kd.MEMCPY, c.group[rows] == kd.MEMSET], [KIND_MEMCPY, KIND_MEMSET], KIND_KERNEL
    ).astype(np.int8)
    order = np.lexsort((rows, kind, start[rows]))  # activity_id = position in (start, kind) order
    rows, kind = rows[order], kind[order]
    n = rows.size
    a = c.args
    row_device = np.where(c.pid_numeric[rows] & (c.pid[rows] >= 0), c.pid[rows], -1)
    row_stream = np.where(c.tid_numeric[rows] & (c.tid[rows] >= 0), c.tid[rows], -1)
    device = np.where(a.at("device", rows) >= 0, a.at("device", rows), row_device)
    stream = np.where(a.at("stream", rows) >= 0, a.at("stream", rows), row_stream)
    corr = correlation[rows]
    # GPU rows carry the device as pid: the process is the one whose API call has the correlation id
    pid = np.full(n, main_pid, dtype=np.int64)
    if len(api):
        lookup = pd.DataFrame({"corr": api["correlation_id"].to_numpy(), "pid": api["pid"].to_numpy()})
        lookup = lookup[lookup["corr"] >= 0].drop_duplicates("corr")
        found = pd.Series(corr).map(lookup.set_index("corr")["pid"]).to_numpy()
        ok = ~pd.isna(found)
        pid[ok] = found[ok].astype(np.int64)
    unmatched = int((~pd.Series(corr).isin(api["correlation_id"].to_numpy())).sum()) if n else 0
    if unmatched and len(api):
        warnings.append(
            f"{ev.path}: {unmatched} GPU activities have no launching API call in the trace; they "
            "are reported as unassociated"
        )
    name_codes = c.name[rows]
    long_names, short_names = _gpu_names(ev, name_codes, kind, a.at("kind", rows))
    grid = _triples(ev, a.at("grid", rows))
    block = _triples(ev, a.at("block", rows))
    frame = {
        "activity_id": np.arange(n, dtype=np.int64),
        "kind": kind,
        "name": short_names,
        "long_name": long_names,
        "start": start[rows],
        "end": end[rows],
        "device_id": device,
        "stream_id": stream,
        "context_id": a.at("context", rows),
        "pid": pid,
        "correlation_id": corr,
        "grid_x": grid[0],
        "grid_y": grid[1],
        "grid_z": grid[2],
        "block_x": block[0],
        "block_y": block[1],
        "block_z": block[2],
        "registers": a.at("registers", rows),
        "static_smem": a.at("shared_memory", rows),
        "dynamic_smem": np.full(n, -1, dtype=np.int64),
        "bytes": a.at("bytes", rows),
        "copy_kind": _copy_kinds(ev, name_codes, kind, a.at("kind", rows)),
        "src_kind": np.full(n, -1, dtype=np.int64),
        "dst_kind": np.full(n, -1, dtype=np.int64),
        "graph_node_id": np.full(n, -1, dtype=np.int64),
    }
    return pd.DataFrame(frame, copy=False)[GPU_COLUMNS]


_MEMCPY_DIRECTION = re.compile(r"\b([HDAP])to([HDAP])\b")


def _copy_kind_of(text: str | None) -> int:
    match = _MEMCPY_DIRECTION.search(text or "")
    return COPY_KINDS.get(f"{match.group(1)}to{match.group(2)}", 0) if match else 0


def _copy_kinds(ev: _Events, name_codes, kind, arg_kind) -> np.ndarray:
    """CUPTI copy kind of memcpys from their name (`Memcpy HtoD (Pageable -> Device)`) or `kind` arg."""
    out = np.full(name_codes.size, -1, dtype=np.int64)
    memcpy = kind == KIND_MEMCPY
    if memcpy.any():
        key = combined_codes(name_codes[memcpy], arg_kind[memcpy])
        first = pd.Series(np.arange(key.size)).groupby(key).first().to_numpy()
        values = np.array(
            [
                _copy_kind_of(ev.strings[name_codes[memcpy][i]])
                or _copy_kind_of(ev.strings[arg_kind[memcpy][i]] if arg_kind[memcpy][i] >= 0 else "")
                for i in first
            ],
            dtype=np.int64,
        )
        out[memcpy] = values[key]
    return out


def _gpu_names(ev: _Events, name_codes, kind, arg_kind) -> tuple[pd.Categorical, pd.Categorical]:
    """(short, long) names: kernels get nsys' shortName from the demangled name; memcpys and memsets get
    nsys' labels (`[CUDA memcpy HtoD]`, `[CUDA memset]`) and keep Kineto's name as the long name."""
    key = combined_codes(name_codes, kind, arg_kind)
    first = pd.Series(np.arange(key.size)).groupby(key).first().to_numpy() if key.size else np.zeros(0, np.int64)
    long_text = np.empty(first.size, dtype=object)
    short_text = np.empty(first.size, dtype=object)
    for j, i in enumerate(first.tolist()):  # once per distinct (name, kind)
        name = ev.strings[name_codes[i]] if name_codes[i] >= 0 else "<unknown kernel>"
        long_text[j] = name
        if kind[i] == KIND_KERNEL:
            short_text[j] = short_kernel_name(name)
        elif kind[i] == KIND_MEMSET:
            short_text[j] = MEMSET_LABEL
        else:
            code = _copy_kind_of(name) or _copy_kind_of(ev.strings[arg_kind[i]] if arg_kind[i] >= 0 else "")
            short_text[j] = copy_kind_label(code)

    def categorical(texts):
        distinct, remap = np.unique(texts.astype(str), return_inverse=True)
        return pd.Categorical.from_codes(
            remap.reshape(-1)[key].astype(np.int64), categories=pd.Index(distinct.astype(object), dtype=object)
        )

    if key.size == 0:
        return pd.Categorical([]), pd.Categorical([])
    return categorical(long_text), categorical(short_text)


def _triples(ev: _Events, codes: np.ndarray) -> list[np.ndarray]:
    """`[64, 1, 1]` raw values -> three int64 columns (-1 when absent)."""
    out = [np.full(codes.size, -1, dtype=np.int64) for _ in range(3)]
    has = codes >= 0
    if has.any():
        inverse, used = pd.factorize(codes[has])
        parsed = np.full((used.size, 3), -1, dtype=np.int64)
        for j, k in enumerate(used.tolist()):
            values = re.findall(r"-?\d+", ev.raws[k] or "")[:3]
            parsed[j, : len(values)] = [int(v) for v in values]
        for axis in range(3):
            out[axis][has] = parsed[inverse.reshape(-1), axis]
    return out


def _syncs(ev: _Events, rows_mask, start, end, correlation, main_pid: int) -> pd.DataFrame:
    c = ev.c
    rows = np.flatnonzero(rows_mask)
    kinds = ev.text(c.args.at("sync_kind", rows))
    sync_type = np.array([SYNC_TYPES.get(str(k).lower(), 0) for k in pd.unique(kinds)], dtype=np.int64)
    sync_type = sync_type[pd.factorize(kinds)[0]] if rows.size else np.zeros(0, dtype=np.int64)
    return pd.DataFrame(
        {
            "start": start[rows],
            "end": end[rows],
            "device_id": c.args.at("device", rows),
            "stream_id": c.args.at("stream", rows),
            "pid": np.full(rows.size, main_pid, dtype=np.int64),
            "correlation_id": correlation[rows],
            "sync_type": sync_type,
        }
    )


# ---------------------------------------------------------------------------- devices, processes, meta


def _devices(props, gpu: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for p in props if isinstance(props, list) else []:
        if isinstance(p, dict) and isinstance(p.get("id"), int):
            rows.append(
                {
                    "device_id": p["id"],
                    "name": p.get("name"),
                    "compute_major": p.get("computeMajor"),
                    "compute_minor": p.get("computeMinor"),
                    "sm_count": p.get("numSms"),
                    "total_memory": p.get("totalGlobalMem"),
                    "bus_location": None,
                    "chip_name": None,
                    "uuid": p.get("uuid"),
                }
            )
    devices = pd.DataFrame(
        rows,
        columns=list(DEVICE_COLUMNS),
    )
    devices = devices.drop_duplicates("device_id")
    seen = set(np.unique(gpu["device_id"].to_numpy()).tolist()) - {-1} if len(gpu) else set()
    missing = sorted(seen - set(devices["device_id"].astype(int).tolist()))
    if missing:
        extra = pd.DataFrame({"device_id": missing, "name": [f"GPU {d}" for d in missing]})
        devices = (
            pd.concat([devices, extra], ignore_index=True) if len(devices) else extra.reindex(columns=devices.columns)
        )
    devices["device_id"] = devices["device_id"].astype(np.int64)
    for col in ("compute_major", "compute_minor", "sm_count", "total_memory"):
        devices[col] = pd.to_numeric(devices[col], errors="coerce").astype("Int64")
    for col in ("name", "bus_location", "chip_name", "uuid"):
        devices[col] = devices[col].astype(object)
    return devices.sort_values("device_id").reset_index(drop=True)


def _processes_threads(ev: _Events, trace: Trace, cpu: np.ndarray, gtid: np.ndarray, pid: np.ndarray):
    """Processes and threads with their names from the `process_name`/`thread_name` metadata events; the
    thread table keeps Kineto's own thread ids."""
    c = ev.c
    meta = np.flatnonzero((c.group == kd.METADATA) & c.pid_numeric)
    names = ev.text(c.name[meta])
    values = ev.text(c.args.at("name", meta))
    rows = np.flatnonzero(cpu)
    rows = rows[~pd.Series(gtid[rows]).duplicated().to_numpy()]  # the first event of each thread
    threads = pd.DataFrame({"global_tid": gtid[rows], "pid": pid[rows], "tid": c.tid[rows], "kpid": c.pid[rows]})
    is_thread = (names == "thread_name") & c.tid_numeric[meta]
    thread_names = pd.DataFrame(
        {
            "kpid": c.pid[meta][is_thread],
            "tid": c.tid[meta][is_thread],
            "name": [_thread_label(v) for v in values[is_thread]],
        }
    )
    threads = threads.merge(thread_names.drop_duplicates(["kpid", "tid"], keep="last"), on=["kpid", "tid"], how="left")
    threads["name"] = threads["name"].astype(object).where(threads["name"].notna(), None)
    is_process = names == "process_name"
    process_names = pd.DataFrame({"kpid": c.pid[meta][is_process], "name": values[is_process]})
    processes = (
        threads[["pid", "kpid"]]
        .drop_duplicates("pid")
        .merge(process_names.drop_duplicates("kpid", keep="last"), on="kpid", how="left")
    )
    processes["name"] = processes["name"].astype(object).where(processes["name"].notna(), None)
    return (
        processes[["pid", "name"]].sort_values("pid").reset_index(drop=True),
        threads[["global_tid", "pid", "tid", "name"]].sort_values("global_tid").reset_index(drop=True),
    )


_THREAD_LABEL = re.compile(r"^thread -?\d+ \((.*)\)$")


def _thread_label(text):
    """`thread 598009 (pt_autograd_0)` -> pt_autograd_0."""
    match = _THREAD_LABEL.match(text or "")
    return match.group(1) if match else text


def _meta(ev: _Events, origin: int, trace: Trace, has_steps: bool) -> tuple[dict, dict]:
    m = ev.meta
    base = m.get("baseTimeNanoseconds") if isinstance(m.get("baseTimeNanoseconds"), int) else 0
    meta = {
        "source_format": "kineto",
        "nsys_version": "none (torch.profiler trace)",
        "schema_version": str(m.get("schemaVersion", "unknown")),
        "kineto_display_time_unit": m.get("displayTimeUnit"),
        "session_start_ns": int(base + origin),
        "capture_end": int(trace.profile_end),
    }
    dist = m.get("distributedInfo")
    if isinstance(dist, dict):
        for key in ("rank", "world_size", "backend"):
            if key in dist:
                meta[f"distributed_{key}"] = dist[key]
    for key in ("trace_id", "traceName"):
        if isinstance(m.get(key), str):
            meta[key] = m[key]
    if has_steps:
        meta["key_node_default"] = "ProfilerStep"
        partial = _partial_step_starts(ev, m.get(PARTIAL_STEPS_KEY), trace.ranges)
        if partial:
            meta[PARTIAL_STEPS] = ",".join(str(t) for t in partial)
    system = {}
    if isinstance(m.get("host_name"), str):
        system["HostName"] = m["host_name"]
    return meta, system


def _partial_step_starts(ev: _Events, numbers, ranges: pd.DataFrame) -> list[int]:
    """Starts of the `ProfilerStep#N` ranges whose numbers the capture listed as partial (`dlprof --backend=torch`
    writes PARTIAL_STEPS_KEY: the step open from the start of profiling to the first optimizer step, and the one
    open from the last optimizer step to the end)."""
    if not isinstance(numbers, list) or not all(isinstance(n, int) for n in numbers) or not len(ranges):
        return []
    wanted = {f"ProfilerStep#{n}" for n in numbers}
    rows = np.flatnonzero(ranges["text"].isin(list(wanted)).to_numpy(dtype=bool))  # (no string object per range)
    return sorted(set(ranges["start"].to_numpy(np.int64)[rows].tolist()))


def _memory_events(ev: _Events, start, cpu_events, gtid, pid_col, trace: Trace, warnings: list) -> pd.DataFrame:
    """`[memory]` instant events (profile_memory=True) as the memory frame (memory.py): `Bytes` (negative for a
    free), `Device Type`/`Device Id`, `Addr`, `Total Allocated`/`Total Reserved` where written (2021 traces
    have neither); the thread of the op that allocated (numbered as the CPU events' threads). Events whose time
    lies more than a day outside the trace's other events are dropped, as far-off timestamps are."""
    c = ev.c
    rows = np.flatnonzero((c.group == kd.MEMORY) & c.ts_ok)
    if rows.size == 0:
        return empty_memory_frame()
    t = start[rows]
    far = (t < trace.profile_start - FAR_OFF_NS) | (t > trace.profile_end + FAR_OFF_NS)
    if far.any():
        warnings.append(
            f"{ev.path}: {int(far.sum()):,} memory events were dropped: their time lies more than a day outside "
            "the trace's other events (a damaged ts)"
        )
        rows, t = rows[~far], t[~far]
    # the thread and process numbers the CPU events got (_thread_ids renumbers ids outside 24 bits)
    known = pd.DataFrame(
        {"pid": c.pid[cpu_events], "tid": c.tid[cpu_events], "g": gtid[cpu_events], "p": pid_col[cpu_events]}
    )
    known = known.drop_duplicates(["pid", "tid"])
    asked = pd.DataFrame({"pid": c.pid[rows], "tid": c.tid[rows]})
    found = asked.merge(known, on=["pid", "tid"], how="left")
    numeric = c.pid_numeric[rows] & c.tid_numeric[rows]
    plain = numeric & (asked["pid"].to_numpy() >= 0) & (asked["pid"].to_numpy() < 1 << 24)
    plain &= (asked["tid"].to_numpy() >= 0) & (asked["tid"].to_numpy() < 1 << 24)
    own_gtid = np.where(plain, (asked["pid"].to_numpy() << 24) | np.maximum(asked["tid"].to_numpy(), 0), -1)
    g = found["g"].to_numpy(dtype=np.float64)
    thread = np.where(np.isnan(g), own_gtid, np.nan_to_num(g, nan=-1)).astype(np.int64)
    p = found["p"].to_numpy(dtype=np.float64)
    pid = np.where(np.isnan(p), c.pid[rows], np.nan_to_num(p, nan=0)).astype(np.int64)
    args = c.args
    return memory_frame(
        t,
        args.at("alloc_bytes", rows),
        args.at("device_type", rows),
        args.at("device_id", rows),
        pid,
        global_tid=thread,
        address=args.at("addr", rows),
        total_allocated=args.at("total_allocated", rows),
        total_reserved=args.at("total_reserved", rows),
    )


# ---------------------------------------------------------------------------- several processes


def merge_traces(traces: list[Trace], source: Path) -> Trace:
    """One Trace from the Kineto traces of several processes (one file per process or rank), on a common
    clock: each trace's times are shifted by the difference of its absolute start to the earliest."""
    if len(traces) == 1:
        return traces[0]
    origin = min(int(t.meta["session_start_ns"]) for t in traces)
    shifts = [int(t.meta["session_start_ns"]) - origin for t in traces]

    def stacked(name, time_columns):
        frames = []
        for t, shift in zip(traces, shifts):
            frame = getattr(t, name).copy()
            for column in time_columns:
                frame[column] = frame[column] + shift
            frames.append(frame)
        return frames

    merged = Trace(source=Path(source))
    ranges = pd.concat(stacked("ranges", ("start", "end")), ignore_index=True)
    ranges["range_id"] = np.arange(1, len(ranges) + 1, dtype=np.int64)
    merged.ranges = ranges
    merged.api_calls = _renumber(stacked("api_calls", ("start", "end")), ["name"], "api_id", ["start"])
    merged.gpu = _renumber(stacked("gpu", ("start", "end")), ["name", "long_name"], "activity_id", ["start", "kind"])
    merged.syncs = pd.concat(stacked("syncs", ("start", "end")), ignore_index=True)
    devices = pd.concat([t.devices for t in traces if len(t.devices)] or [traces[0].devices], ignore_index=True)
    merged.devices = devices.drop_duplicates("device_id").sort_values("device_id").reset_index(drop=True)
    merged.processes = pd.concat([t.processes for t in traces], ignore_index=True).drop_duplicates("pid")
    merged.threads = pd.concat([t.threads for t in traces], ignore_index=True).drop_duplicates("global_tid")
    merged.has_cuda_tables = any(t.has_cuda_tables for t in traces)
    merged.has_nvtx = any(t.has_nvtx for t in traces)
    merged.warnings = [w for t in traces for w in t.warnings]
    meta = dict(traces[0].meta)
    meta.update(session_start_ns=origin, capture_end=int(merged.profile_end), processes=len(traces))
    meta.pop("distributed_rank", None)
    merged.memory = merge_frames([t.memory for t in traces], shifts)
    meta.pop("gpu_peak_memory", None)
    peak = gpu_peak(merged.memory)
    if peak is not None:
        meta["gpu_peak_memory"] = peak
    if any(t.meta.get("key_node_default") for t in traces):
        meta["key_node_default"] = "ProfilerStep"
    partial = sorted(
        int(start) + shift
        for t, shift in zip(traces, shifts)
        for start in str(t.meta.get(PARTIAL_STEPS) or "").split(",")
        if start.strip()
    )
    meta.pop(PARTIAL_STEPS, None)
    if partial:
        meta[PARTIAL_STEPS] = ",".join(map(str, partial))
    merged.meta = meta
    merged.system = dict(traces[0].system)
    return merged


def _renumber(frames: list[pd.DataFrame], categorical: list[str], id_column: str, order: list[str]) -> pd.DataFrame:
    """Concatenated frames with united categoricals, in `order`, ids = positions."""
    columns = list(frames[0].columns)
    united = {c: union_categoricals([pd.Categorical(f[c]) for f in frames], ignore_order=True) for c in categorical}
    frame = pd.concat([f.drop(columns=categorical) for f in frames], ignore_index=True)
    for c in categorical:
        frame[c] = united[c]
    frame = frame.sort_values(order, kind="stable").reset_index(drop=True)
    frame[id_column] = np.arange(len(frame), dtype=np.int64)
    return frame[columns]
