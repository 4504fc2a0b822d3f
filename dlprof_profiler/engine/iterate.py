"""Iterate: split the profile into iterations at the ends of the key node's instances, or into the steps
torch.profiler marked (DESIGN.md "Iterations")."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from dlprof_profiler.engine import markers as nm
from dlprof_profiler.errors import DLProfError
from dlprof_profiler.engine.naming import first_rows
from dlprof_profiler.engine.trace import PARTIAL_STEPS, Trace, combined_codes

NUMBER_SUFFIX = re.compile(r"#\d+$")
_TF_GLOBAL_STEP = re.compile(r"(?:^|/)global_step(?:/|$)")
STEP_MARKER = "ProfilerStep"  # torch.profiler's step ranges, `ProfilerStep#N`


def is_step_key(key: str | None) -> bool:
    """Whether a key node names torch.profiler's steps (`ProfilerStep`, `ProfilerStep#N`): their iterations
    are the steps' own spans."""
    return bool(key) and NUMBER_SUFFIX.sub("", str(key)) == STEP_MARKER


@dataclass
class Iterations:
    """The iterations of a profile (DESIGN.md "Iterations"), of one of two kinds.

    Key node intervals (`spans` None): N key-node ends give N + 1 intervals [t0, s1), [s1, s2), ..., [sN, profile
    end), t0 being the first recorded event (the start of data collection, not the session's start); iteration 0
    and the last are partial (what ran before the first key node, after the last one).
    Steps (`spans`: torch.profiler's `ProfilerStep#N`): each step's own span [start, end) is one complete
    iteration; what runs before the first step, between two or after the last belongs to none.
    `boundaries` are the key-node ends (for steps, the step ends): op names are numbered per interval between
    two of them, whatever the kind."""

    key_node: str | None  # what was looked for ('' when nothing could be looked for)
    found: bool
    source: str  # 'user', 'default' or 'none'
    boundaries: np.ndarray  # s1 < s2 < ... < sN
    profile_end: int
    profile_start: int = 0
    spans: np.ndarray | None = None  # (N, 2) int64: start, end of each step (steps only)
    partial_starts: tuple = ()  # starts of steps known to be partial (trace.PARTIAL_STEPS: dlprof's capture)

    @property
    def by_step(self) -> bool:
        return self.spans is not None

    @property
    def count(self) -> int:
        return len(self.spans) if self.by_step else len(self.boundaries) + 1

    @property
    def starts(self) -> np.ndarray:
        if self.by_step:
            return self.spans[:, 0].astype(np.int64)
        first = min(self.profile_start, int(self.boundaries[0])) if len(self.boundaries) else self.profile_start
        return np.concatenate([[first], self.boundaries]).astype(np.int64)

    @property
    def ends(self) -> np.ndarray:
        if self.by_step:
            return self.spans[:, 1].astype(np.int64)
        last = max(self.profile_end, int(self.boundaries[-1]) if len(self.boundaries) else 0)
        return np.concatenate([self.boundaries, [last]]).astype(np.int64)

    @property
    def complete(self) -> np.ndarray:
        """Per iteration, whether it holds one whole training iteration: every step; for key-node intervals all
        but iteration 0 and the last (the run before the first key node, and after the last one)."""
        flags = np.ones(self.count, dtype=bool)
        if not self.by_step:
            flags[[0, -1]] = False
        elif self.partial_starts:
            flags &= ~np.isin(self.spans[:, 0], np.asarray(self.partial_starts, dtype=np.int64))
        return flags

    def of(self, times) -> np.ndarray:
        """Iteration number of each time (the interval containing it); -1 outside every step."""
        times = np.asarray(times, dtype=np.int64)
        if not self.by_step:
            return np.searchsorted(self.boundaries, times, side="right")
        k = np.searchsorted(self.spans[:, 0], times, side="right") - 1
        inside = (k >= 0) & (times < self.spans[np.maximum(k, 0), 1])
        return np.where(inside, k, -1)

    def time_range(self, first: int, last: int) -> tuple[int, int]:
        """[lo, hi) holding every time of iterations first..last (key-node intervals reach out to the whole
        timeline at both ends of the profile; steps' gaps inside the range are in it: filter with `of`)."""
        if self.by_step:
            return int(self.spans[first, 0]), int(self.spans[last, 1])
        b = self.boundaries
        lo = int(b[first - 1]) if first >= 1 else -(1 << 62)
        hi = int(b[last]) if last < len(b) else 1 << 62
        return lo, hi


def with_partial_steps(iterations: Iterations, meta: dict) -> Iterations:
    """The iterations with the steps the capture marked partial (`dlprof --backend=torch` opens the first step
    when profiling starts and the last one at the last optimizer step: the run up to the first optimizer step
    and after the last one, as the first and last key-node intervals of an nsys capture)."""
    text = meta.get(PARTIAL_STEPS)
    if not iterations.by_step or not text:
        return iterations
    starts = tuple(int(t) for t in str(text).split(",") if t.strip())
    return dataclasses.replace(iterations, partial_starts=starts)


def no_iterations(profile_end: int, profile_start: int) -> Iterations:
    """Nothing to look for: the whole profile is one iteration."""
    return Iterations(
        key_node="",
        found=False,
        source="none",
        boundaries=np.zeros(0, dtype=np.int64),
        profile_end=profile_end,
        profile_start=profile_start,
    )


def iterations_of(
    key: str,
    source: str,
    found: pd.DataFrame,
    thread_device: dict,
    process_device: dict,
    profile_end: int,
    profile_start: int,
    occupied=None,
) -> Iterations:
    """The iterations the key node's instances (start, end, pid, global_tid; nested ones dropped) give.
    `occupied(spans)`: whether anything starts inside each step after the step itself (steps without are not
    iterations: torch.profiler's last step, opened by the last `prof.step()` and closed when profiling stops)."""
    groups = matched_instances(found, thread_device, process_device)
    ends = found["end"].to_numpy(np.int64)
    bounds = _group_extent(groups, ends, np.maximum) if len(found) else np.zeros(0, dtype=np.int64)
    spans = None
    if is_step_key(key) and len(found):
        spans = step_spans(groups, found["start"].to_numpy(np.int64), ends)
        if occupied is not None:
            spans = spans[np.asarray(occupied(spans), dtype=bool)]
        if len(spans) == 0:  # no step holds anything: as if no key node were found
            found, spans, bounds = found.iloc[:0], None, bounds[:0]
    return Iterations(
        key_node=key,
        found=len(found) > 0,
        source=source,
        boundaries=np.unique(bounds),
        profile_end=profile_end,
        profile_start=profile_start,
        spans=spans,
    )


# the columns `ranges_where` gives: the range's span and thread, and what tells a backward range
KEY_NODE_COLUMNS = ["start", "end", "pid", "global_tid"]
RANGE_MATCH_COLUMNS = KEY_NODE_COLUMNS + ["backward", "direction"]


def key_node_ranges(key: str, ranges_where) -> pd.DataFrame:
    """The key node's instances: forward ranges (any domain, scopes included) whose text or label is the key
    node, else forward ranges whose label without its `#N` counter is; nested ones dropped. Backward ranges
    (autograd nodes, bprop markers) carry the forward op's name or label but are not key node instances: the key
    node is the forward call. `ranges_where(label_test, text)`: the ranges (RANGE_MATCH_COLUMNS, in range
    order) whose label passes `label_test` (an object array of labels -> bools) or whose text is `text`."""
    found = forward_outermost(ranges_where(lambda labels: labels == key, key))
    if len(found):
        return found
    want = NUMBER_SUFFIX.sub("", key)
    return forward_outermost(ranges_where(lambda labels: without_counter(labels) == want, None))


def without_counter(labels: np.ndarray) -> np.ndarray:
    """Labels without their `#N` counter (per distinct label: millions of ranges share a few thousand)."""
    return nm.per_unique(labels, lambda t: NUMBER_SUFFIX.sub("", t) if isinstance(t, str) else t)


def forward_outermost(matches: pd.DataFrame) -> pd.DataFrame:
    """The forward ranges of `matches`, nested ones dropped (KEY_NODE_COLUMNS)."""
    forward = matches.loc[~backward_ranges(matches), KEY_NODE_COLUMNS]
    return outermost(forward) if len(forward) else forward.reset_index(drop=True)


# what the iteration rule reads of the classification (trace_ranges_where, default_key_node)
RANGE_INFO_READ = ["label", "kind", "text_code", "backward", "direction"]


def trace_ranges_where(ranges: pd.DataFrame, info: pd.DataFrame):
    """`ranges_where` (key_node_ranges) over an in-memory trace's ranges and their classification."""

    def ranges_where(label_test, text: str | None) -> pd.DataFrame:
        if len(ranges) == 0:
            return pd.DataFrame({c: pd.Series(dtype="int64") for c in RANGE_MATCH_COLUMNS})
        hit = np.asarray(label_test(info["label"].to_numpy(dtype=object)), dtype=bool)
        if text is not None:
            hit = hit | (ranges["text"] == text).to_numpy(dtype=bool)
        rows = np.flatnonzero(hit)  # looked at where the key matched only (ranges may be millions)
        frame = ranges.iloc[rows][KEY_NODE_COLUMNS].reset_index(drop=True)
        for column, absent in (("backward", False), ("direction", None)):
            frame[column] = info[column].to_numpy()[rows] if column in info else absent
        return frame

    return ranges_where


def key_ops(ops: pd.DataFrame, key: str) -> np.ndarray:
    """Which ops (or op instances) are the key node: forward ones whose op name or Op ID is `key`."""
    hit = (ops["name"].to_numpy(dtype=object) == key) | (ops["op_id"].to_numpy(dtype=object) == key)
    if "direction" in ops:
        hit &= ops["direction"].to_numpy(dtype=object) != "bprop"
    return hit


def backward_ranges(info: pd.DataFrame) -> np.ndarray:
    """Ranges of autograd's backward pass: backward nodes and bprop markers."""
    flags = info["backward"].to_numpy(dtype=bool) if "backward" in info else np.zeros(len(info), dtype=bool)
    if "direction" in info:
        flags = flags | (info["direction"].to_numpy(dtype=object) == "bprop")
    return flags


def outermost(frame: pd.DataFrame) -> pd.DataFrame:
    """Drop matches nested inside another match on the same thread (a key node counts once)."""
    frame = frame.sort_values(["global_tid", "start", "end"], ascending=[True, True, False], kind="stable")
    reach = frame.groupby("global_tid", sort=False)["end"].cummax()
    prev = reach.groupby(frame["global_tid"], sort=False).shift(1)
    nested = (frame["start"] < prev).fillna(False).to_numpy(dtype=bool)
    return frame[~nested].reset_index(drop=True)


def default_key_node(ranges: pd.DataFrame, info: pd.DataFrame, family: str | None) -> str | None:
    """The framework's default key node present in the profile, if any."""
    if len(ranges) == 0:
        return None
    kind = info["kind"].to_numpy()
    label = info["label"].to_numpy(dtype=object)
    if "text_code" in info:
        # a label is a function of the range's stripped text: count per (text, kind) code in integers, then
        # look at one row of each code (a few thousand labels, not millions of strings)
        codes = combined_codes(info["text_code"].to_numpy(), kind)
        first = first_rows(codes)
        counts = pd.DataFrame({"label": label[first], "kind": kind[first], "num_ranges": np.bincount(codes)})
    else:
        labels = pd.DataFrame({"label": label, "kind": kind})
        counts = labels.groupby(["label", "kind"], dropna=True).size().reset_index(name="num_ranges")
    return default_key_node_of_labels(counts, family)


def default_key_node_of_labels(labels: pd.DataFrame, family: str | None) -> str | None:
    """The default key node from a table of range labels (label, kind, num_ranges)."""
    if len(labels) == 0:
        return None
    counts = labels.groupby(["label", "kind"], dropna=True)["num_ranges"].sum().reset_index()
    text = counts["label"].astype(str)
    kinds = counts["kind"].to_numpy()

    def most_frequent(mask) -> str:
        per_label = counts[mask].groupby("label")["num_ranges"].sum()
        top = per_label[per_label == per_label.max()].index
        return str(sorted(top)[0])

    if family == "pytorch":
        hit = text.str.contains(r"^Optimizer\.step#", regex=True).to_numpy(dtype=bool)
        if hit.any():
            return most_frequent(hit)
        if text.str.contains(r"^ProfilerStep#\d+$", regex=True).any():
            return "ProfilerStep"  # matches every ProfilerStep#N through the counter-stripped label
        return None
    if family == "tensorflow":
        hit = (kinds == nm.TF_OP) & text.str.contains(_TF_GLOBAL_STEP).to_numpy(dtype=bool)
        return most_frequent(hit) if hit.any() else None
    if family == "tensorrt":
        hit = text.str.contains(r"^ExecutionContext::(?:execute|enqueue)", regex=True).to_numpy(dtype=bool)
        return most_frequent(hit) if hit.any() else None
    return None


def occupied_by(event_starts):
    """`occupied(spans)` over the events whose starts `event_starts()` yields (arrays, in any number and order):
    whether one starts inside each span after its start (the step's own range starts there)."""

    def occupied(spans: np.ndarray) -> np.ndarray:
        count = np.zeros(len(spans), dtype=np.int64)
        for times in event_starts():
            times = np.asarray(times, dtype=np.int64)
            if times.size > 1 and (times[1:] < times[:-1]).any():
                times = np.sort(times)
            after_start = np.searchsorted(times, spans[:, 0], side="right")
            count += np.searchsorted(times, spans[:, 1], side="left") - after_start
        return count > 0

    return occupied


def matched_instances(instances: pd.DataFrame, thread_device: dict, process_device: dict) -> np.ndarray:
    """Which iteration boundary each key node instance makes (instances of one group end the same iteration;
    -1: none). Multi-GPU rule: if every GPU has the same number N of instances, group k holds the k-th instance
    of every GPU; a process per GPU whose counts differ is matched step by step (`aligned_steps`); otherwise
    every instance is its own boundary (instances ending together are one)."""
    n = len(instances)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    device = pd.Series(instances["global_tid"].to_numpy()).map(thread_device)
    device = device.fillna(pd.Series(instances["pid"].to_numpy()).map(process_device)).fillna(-1)
    frame = pd.DataFrame(
        {
            "dev": device.to_numpy(np.int64),
            "end": instances["end"].to_numpy(np.int64),
            "pid": instances["pid"].to_numpy(np.int64),
        }
    )
    counts = frame.groupby("dev").size()
    if len(counts) > 1 and counts.nunique() == 1:
        ordered = frame.sort_values(["dev", "end"], kind="stable")
        groups = np.empty(n, dtype=np.int64)
        groups[ordered.index.to_numpy()] = ordered.groupby("dev").cumcount().to_numpy(np.int64)
        return groups
    if (
        len(counts) > 1
        and frame.groupby("dev")["pid"].nunique().max() == 1
        and frame.groupby("pid")["dev"].nunique().max() == 1
    ):
        # a process per GPU (spawned workers) whose captured steps differ in number: each process's steps are
        # its own sequence, aligned with the others (not one interleaved sequence)
        groups = np.full(n, -1, dtype=np.int64)
        rows = [g.sort_values(kind="stable").index.to_numpy() for _, g in frame.groupby("dev")["end"]]
        offsets = aligned_steps([frame["end"].to_numpy(np.int64)[r] for r in rows])
        length = min(len(r) for r in rows)
        for r, first in zip(rows, offsets):
            groups[r[first : first + length]] = np.arange(length)
        return groups
    return np.unique(frame["end"].to_numpy(np.int64), return_inverse=True)[1].astype(np.int64)


def aligned_steps(sequences: list[np.ndarray]) -> list[int]:
    """Step ends of several processes matched step by step: each sorted sequence keeps a window of the
    shortest one's length, the one whose ends lie closest to the shortest sequence's (the earliest on a tie);
    returns each window's first position. Boundary k is the latest k-th end among the windows; steps outside
    the windows (captured by one process only, at the start or end of the capture) fall into the first or last
    key-node interval, and are no iteration of their own when iterations are steps."""
    n = min(len(s) for s in sequences)
    reference = next(s for s in sequences if len(s) == n)
    offsets = []
    for seq in sequences:
        distance = [np.abs(seq[o : o + n] - reference).sum() for o in range(len(seq) - n + 1)]
        offsets.append(int(np.argmin(distance)))
    return offsets


def _group_extent(groups: np.ndarray, values: np.ndarray, ufunc) -> np.ndarray:
    """Per group (0..max), `ufunc` (np.maximum or np.minimum) over its instances' values."""
    keep = groups >= 0
    size = int(groups[keep].max()) + 1 if keep.any() else 0
    out = np.full(size, np.iinfo(np.int64).min if ufunc is np.maximum else np.iinfo(np.int64).max, dtype=np.int64)
    ufunc.at(out, groups[keep], values[keep])
    return out


def step_spans(groups: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Step iterations from matched key node instances: group k spans from its earliest start to its latest
    end, and starts no earlier than the previous one ends (so iterations never overlap)."""
    first = _group_extent(groups, starts, np.minimum)
    last = _group_extent(groups, ends, np.maximum)
    order = np.argsort(last, kind="stable")
    first, last = first[order], last[order]
    if first.size > 1:
        first[1:] = np.maximum(first[1:], last[:-1])
    return np.stack([first, last], axis=1).astype(np.int64)


@dataclass(frozen=True)
class IterationInputs:
    """What the iteration rule reads of a profile, from either engine (`trace_inputs` in memory,
    store.model.StoreAnalysis.iteration_inputs out of core)."""

    default_key: Callable[[], str | None]  # the key node to use when the user gives none (None: no iterations)
    ranges_where: Callable[[Callable, str | None], pd.DataFrame]  # the ranges a key node matches (key_node_ranges)
    event_starts: Callable[[], Iterable[np.ndarray]]  # the starts of every range and API call (occupied_by)
    thread_device: dict
    process_device: dict
    profile_end: int
    profile_start: int


def trace_inputs(
    ranges: pd.DataFrame,
    info: pd.DataFrame,
    family: str | None,
    thread_device: dict,
    process_device: dict,
    profile_end: int,
    profile_start: int = 0,
    preferred: str | None = None,
    api_starts: np.ndarray | None = None,
) -> IterationInputs:
    """The iteration rule's inputs from an in-memory trace. The default key node is the one the input format
    prefers (`preferred`: ProfilerStep for torch.profiler traces, whose steps the user marked), else the
    framework's; `api_starts`: the API calls' starts (a step in which no range or API call starts is no
    iteration)."""
    none = np.zeros(0, dtype=np.int64)
    starts = (ranges["start"].to_numpy(np.int64) if len(ranges) else none, none if api_starts is None else api_starts)
    return IterationInputs(
        default_key=lambda: preferred or default_key_node(ranges, info, family),
        ranges_where=trace_ranges_where(ranges, info),
        event_starts=lambda: starts,
        thread_device=thread_device,
        process_device=process_device,
        profile_end=profile_end,
        profile_start=profile_start,
    )


def whole_trace_inputs(trace: Trace, info: pd.DataFrame, family: str | None, thread_device: dict, process_device: dict):
    """trace_inputs of a whole trace: its ranges, window and API calls, and the key node its format prefers."""
    return trace_inputs(
        trace.ranges,
        info,
        family,
        thread_device,
        process_device,
        trace.profile_end,
        trace.profile_start,
        preferred=trace.meta.get("key_node_default"),  # an input format's own iteration marker (ProfilerStep)
        api_starts=trace.api_calls["start"].to_numpy(np.int64),
    )


def split_iterations(key_node: str | None, inputs: IterationInputs) -> Iterations:
    """Iteration intervals for a user key node, else the profile's default one, else one iteration."""
    key, source = chosen_key_node(key_node, inputs.default_key)
    if not key:
        return no_iterations(inputs.profile_end, inputs.profile_start)
    return iterations_of(
        key,
        source,
        key_node_ranges(key, inputs.ranges_where),
        inputs.thread_device,
        inputs.process_device,
        inputs.profile_end,
        inputs.profile_start,
        occupied_by(inputs.event_starts),
    )


def chosen_key_node(key_node: str | None, default) -> tuple[str | None, str]:
    """(key node, source): the user's, else the default (`default()`), else none."""
    if key_node:
        return key_node, "user"
    key = default()
    return key, ("default" if key else "none")


def naming_iterations(iterations: Iterations, inputs: IterationInputs) -> Iterations:
    """The iterations top-level op names are numbered by: the key node's, else the default key node's (a
    key node given as an op name or Op ID exists only once ops are named)."""
    if iterations.found or iterations.source != "user":
        return iterations
    return split_iterations(None, inputs)


def select_range(
    iterations: Iterations, iter_start: int | None, iter_stop: int | None, source_name: str
) -> tuple[int, int]:
    """The inclusive iteration range to aggregate; an error when it lies outside the profile."""
    last = iterations.count - 1
    start = 0 if iter_start is None else int(iter_start)
    stop = last if iter_stop is None else int(iter_stop)
    if start > last or stop > last:
        raise DLProfError(
            f"{source_name}: iteration range {start}..{stop} is outside the profile, which has "
            f"iterations 0..{last} (key node '{iterations.key_node}')",
            exit_code=2,
        )
    if stop < start:
        raise DLProfError(f"--iter_stop {stop} is below --iter_start {start}", exit_code=2)
    return start, stop
