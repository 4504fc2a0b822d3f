"""Iterate: split the profile into iterations at the ends of the key node's instances (DESIGN.md)."""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from dlprof_profiler import nvtx_markers as nm
from dlprof_profiler.errors import DLProfError
from dlprof_profiler.naming import first_rows
from dlprof_profiler.trace import combined_codes

NUMBER_SUFFIX = re.compile(r"#\d+$")
_TF_GLOBAL_STEP = re.compile(r"(?:^|/)global_step(?:/|$)")


@dataclass
class Iterations:
    """N key-node ends give N + 1 intervals [t0, s1), [s1, s2), ..., [sN, profile end), t0 being the first
    recorded event (the start of data collection, not the session's start: DESIGN.md "Iterations")."""

    key_node: str | None  # what was looked for ('' when nothing could be looked for)
    found: bool
    source: str  # 'user', 'default' or 'none'
    boundaries: np.ndarray  # s1 < s2 < ... < sN
    profile_end: int
    profile_start: int = 0

    @property
    def count(self) -> int:
        return len(self.boundaries) + 1

    @property
    def starts(self) -> np.ndarray:
        first = min(self.profile_start, int(self.boundaries[0])) if len(self.boundaries) else self.profile_start
        return np.concatenate([[first], self.boundaries]).astype(np.int64)

    @property
    def ends(self) -> np.ndarray:
        last = max(self.profile_end, int(self.boundaries[-1]) if len(self.boundaries) else 0)
        return np.concatenate([self.boundaries, [last]]).astype(np.int64)

    def of(self, times) -> np.ndarray:
        """Iteration number of each time (the interval containing it)."""
        return np.searchsorted(self.boundaries, np.asarray(times, dtype=np.int64), side="right")


def key_node_instances(
    ranges: pd.DataFrame, info: pd.DataFrame, key: str, op_instances: pd.DataFrame | None = None
) -> pd.DataFrame:
    """Ranges (any domain, scopes included) whose text or label is the key node; else op instances whose
    op name or Op ID is; else ranges whose label without its `#N` counter is."""
    cols = ["start", "end", "pid", "global_tid"]
    if len(ranges):
        hit = (ranges["text"] == key).to_numpy(dtype=bool) | (info["label"].to_numpy(dtype=object) == key)
        if hit.any():
            return outermost(ranges.loc[hit, cols])
    if op_instances is not None and len(op_instances):
        hit = (op_instances["name"].to_numpy(dtype=object) == key) | (
            op_instances["op_id"].to_numpy(dtype=object) == key
        )
        if hit.any():
            return outermost(op_instances.loc[hit, cols])
    if len(ranges):
        # per distinct label: the labels of millions of ranges share a few thousand string objects
        stripped = nm.per_unique(
            info["label"].to_numpy(dtype=object), lambda t: NUMBER_SUFFIX.sub("", t) if isinstance(t, str) else t
        )
        hit = stripped == NUMBER_SUFFIX.sub("", key)
        if hit.any():
            return outermost(ranges.loc[hit, cols])
    return pd.DataFrame({c: pd.Series(dtype="int64") for c in cols})


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


def boundaries_from_instances(instances: pd.DataFrame, thread_device: dict, process_device: dict) -> np.ndarray:
    """Multi-GPU rule: if every GPU has the same number N of key node instances, boundary k is the latest
    end among the k-th instances over GPUs; otherwise every instance on any GPU is a boundary."""
    if len(instances) == 0:
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
        frame = frame.sort_values(["dev", "end"])
        frame["k"] = frame.groupby("dev").cumcount()
        ends = frame.groupby("k")["end"].max().to_numpy(np.int64)
    elif (
        len(counts) > 1
        and frame.groupby("dev")["pid"].nunique().max() == 1
        and frame.groupby("pid")["dev"].nunique().max() == 1
    ):
        # a process per GPU (spawned workers) whose captured steps differ in number: each process's steps are
        # its own sequence, aligned with the others (not one interleaved sequence)
        ends = aligned_steps([np.sort(g.to_numpy(np.int64)) for _, g in frame.groupby("dev")["end"]])
    else:
        ends = frame["end"].to_numpy(np.int64)
    return np.unique(ends)


def aligned_steps(sequences: list[np.ndarray]) -> np.ndarray:
    """Step ends of several processes matched step by step: each sorted sequence keeps a window of the
    shortest one's length, the one whose ends lie closest to the shortest sequence's (the earliest on a tie);
    boundary k is the latest k-th end among the windows. Steps outside the windows (captured by one process
    only, at the start or end of the capture) fall into the first or last iteration."""
    n = min(len(s) for s in sequences)
    reference = next(s for s in sequences if len(s) == n)
    windows = []
    for seq in sequences:
        distance = [np.abs(seq[o : o + n] - reference).sum() for o in range(len(seq) - n + 1)]
        first = int(np.argmin(distance))
        windows.append(seq[first : first + n])
    return np.max(np.vstack(windows), axis=0)


def split_iterations(
    ranges: pd.DataFrame,
    info: pd.DataFrame,
    family: str | None,
    key_node: str | None,
    thread_device: dict,
    process_device: dict,
    profile_end: int,
    profile_start: int = 0,
    op_instances: pd.DataFrame | None = None,
    preferred: str | None = None,
) -> Iterations:
    """Iteration intervals for a user key node, else the default the input format prefers (`preferred`:
    ProfilerStep for torch.profiler traces, whose steps the user marked), else the framework default,
    else one iteration."""
    if key_node:
        source, key = "user", key_node
    else:
        key = preferred or default_key_node(ranges, info, family)
        source = "default" if key else "none"
    if not key:
        return Iterations(
            key_node="",
            found=False,
            source="none",
            boundaries=np.zeros(0, dtype=np.int64),
            profile_end=profile_end,
            profile_start=profile_start,
        )
    found = key_node_instances(ranges, info, key, op_instances)
    bounds = boundaries_from_instances(found, thread_device, process_device)
    return Iterations(
        key_node=key,
        found=len(found) > 0,
        source=source,
        boundaries=bounds,
        profile_end=profile_end,
        profile_start=profile_start,
    )


def naming_iterations(
    iterations: Iterations,
    ranges: pd.DataFrame,
    info: pd.DataFrame,
    family: str | None,
    thread_device: dict,
    process_device: dict,
    profile_end: int,
    profile_start: int = 0,
    preferred: str | None = None,
) -> Iterations:
    """The iterations top-level op names are numbered by: the key node's, else the default key node's (a
    key node given as an op name or Op ID exists only once ops are named)."""
    if iterations.found or iterations.source != "user":
        return iterations
    return split_iterations(
        ranges, info, family, None, thread_device, process_device, profile_end, profile_start, preferred=preferred
    )


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
