"""The trace frames every ingest adapter produces and every later stage reads."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from dlprof_profiler.contract import KIND_KERNEL, KIND_MEMCPY, KIND_MEMSET  # noqa: F401 - GPU activity kinds

DEFAULT_DOMAIN = "default"
# Trace meta: starts of the `ProfilerStep#N` steps the capture knows to be partial, comma-separated (a capture by
# `dlprof --backend=torch` opens its first step when profiling starts, its last at the last optimizer step)
PARTIAL_STEPS = "partial_step_starts"

# A start or end time the source did not record (NULL in an export): ingest adapters write it so that
# sanitize.py can find and drop such rows; no later stage ever sees it.
MISSING_TIME = -(2**63)

RANGE_COLUMNS = ["range_id", "domain", "text", "start", "end", "global_tid", "pid", "event_type", "unclosed"]
LAUNCH_SHAPE = ["grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z"]  # a kernel launch's grid and block
API_COLUMNS = ["api_id", "name", "start", "end", "global_tid", "pid", "correlation_id", "event_class", "return_value"]
GPU_COLUMNS = [
    "activity_id",
    "kind",
    "name",
    "long_name",
    "start",
    "end",
    "device_id",
    "stream_id",
    "context_id",
    "pid",
    "correlation_id",
    *LAUNCH_SHAPE,
    "registers",
    "static_smem",
    "dynamic_smem",
    "bytes",
    "copy_kind",
    "src_kind",
    "dst_kind",
    "graph_node_id",
]
# allocations and frees of device (and host) memory: see memory.py for what each column holds
MEMORY_COLUMNS = [
    "start",
    "call_start",
    "global_tid",
    "pid",
    "device_type",
    "device_id",
    "address",
    "bytes",
    "allocated",
    "reserved",
]
DEVICE_COLUMNS = [
    "device_id",
    "name",
    "compute_major",
    "compute_minor",
    "sm_count",
    "total_memory",
    "bus_location",
    "chip_name",
    "uuid",
]


def pid_of(global_ids) -> np.ndarray:
    """Process id bits of nsys global thread/process ids."""
    return (np.asarray(global_ids, dtype=np.int64) >> 24) & 0xFFFFFF


def tid_of(global_ids) -> np.ndarray:
    return np.asarray(global_ids, dtype=np.int64) & 0xFFFFFF


def empty_frame(columns: list[str]) -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype="int64") for c in columns})


@dataclass
class Trace:
    """What a capture holds, in frames. Times are integer ns on the capture's session timeline."""

    source: Path
    meta: dict = field(default_factory=dict)  # exporter, schema version, export time ...
    system: dict = field(default_factory=dict)  # CPU model, driver and CUDA versions, host ...
    devices: pd.DataFrame = field(default_factory=lambda: empty_frame(DEVICE_COLUMNS))
    processes: pd.DataFrame = field(default_factory=lambda: empty_frame(["pid", "name"]))
    threads: pd.DataFrame = field(default_factory=lambda: empty_frame(["global_tid", "pid", "tid", "name"]))
    ranges: pd.DataFrame = field(default_factory=lambda: empty_frame(RANGE_COLUMNS))
    api_calls: pd.DataFrame = field(default_factory=lambda: empty_frame(API_COLUMNS))
    gpu: pd.DataFrame = field(default_factory=lambda: empty_frame(GPU_COLUMNS))
    syncs: pd.DataFrame = field(
        default_factory=lambda: empty_frame(
            ["start", "end", "device_id", "stream_id", "pid", "correlation_id", "sync_type"]
        )
    )
    io_calls: pd.DataFrame = field(default_factory=lambda: empty_frame(["start", "end", "global_tid", "pid", "name"]))
    memory: pd.DataFrame = field(default_factory=lambda: empty_frame(MEMORY_COLUMNS))  # memory.py
    domain_map: dict = field(default_factory=dict)  # (pid, NVTX domain handle) -> domain name
    warnings: list = field(default_factory=list)
    has_cuda_tables: bool = False
    has_nvtx: bool = False

    @property
    def profile_start(self) -> int:
        """Start of the first recorded event: where data collection began (the first iteration's start)."""
        frames = [f for f in (self.ranges, self.api_calls, self.gpu) if len(f)]
        return event_window([int(f["start"].min()) for f in frames], [], self.meta)[0]

    @property
    def profile_end(self) -> int:
        """Latest end of any event: the end of the last iteration interval."""
        frames = [f for f in (self.ranges, self.api_calls, self.gpu) if len(f)]
        return event_window([], [int(f["end"].max()) for f in frames], self.meta)[1]


def event_window(starts: list, ends: list, meta: dict) -> tuple[int, int]:
    """(first start, last end) of the recorded events (ranges, API calls, GPU activities); a capture that
    recorded none (a program without NVTX or CUDA) spans its own window, `capture_start` to `capture_end` in
    `meta` where the ingest found them (nsys: the session's analysis window), else nothing (0, 0)."""
    starts = [int(s) for s in starts if s is not None]
    ends = [int(e) for e in ends if e is not None]
    if starts or ends:
        return (min(starts) if starts else 0), max([0] + ends)
    start, end = meta.get("capture_start"), meta.get("capture_end")
    if isinstance(start, int) and isinstance(end, int) and end >= start:
        return start, end
    return 0, 0


def make_frame(columns: dict) -> pd.DataFrame:
    """A DataFrame from arrays that keeps object arrays as object columns (pandas 3 would infer its
    Arrow-backed string dtype and copy every string)."""
    return pd.DataFrame(
        {
            k: (pd.Series(v, dtype=object, copy=False) if isinstance(v, np.ndarray) and v.dtype == object else v)
            for k, v in columns.items()
        },
        copy=False,
    )


def same_objects(n: int, value) -> np.ndarray:
    """An object array of `n` references to the one `value` (np.full of a str makes a str object per row: 64
    bytes a row instead of 8)."""
    out = np.empty(n, dtype=object)
    out.fill(value)
    return out


def obj(values, index=None) -> pd.Series:
    """An object-dtype Series (to assign string arrays to frame columns without a str conversion)."""
    return pd.Series(np.asarray(values, dtype=object), index=index, dtype=object, copy=False)


def combined_codes(*arrays) -> np.ndarray:
    """One dense int64 code per distinct tuple of values across the arrays, numbered in order of first
    appearance (-1 values of pd.factorize, for missing values, take part as stepwise factorizing gives them)."""
    if not arrays:
        return np.zeros(0, dtype=np.int64)
    fast = _one_key(arrays)
    if fast is not None:
        key, radix = fast
        if radix <= max(4096, min(2 * key.size, 1 << 22)):  # few possible keys: a table in cache, no hashing
            return _first_appearance_codes(key, radix)
        return pd.factorize(key)[0].astype(np.int64, copy=False)
    codes = None
    for values in arrays:  # stepwise, so the mixed-radix products never overflow
        c, uniques = pd.factorize(np.asarray(values))
        if codes is None:
            codes = c.astype(np.int64)
        else:
            codes, _ = pd.factorize(codes * max(len(uniques), 1) + c)
            codes = codes.astype(np.int64)
    return codes


def _first_appearance_codes(key: np.ndarray, radix: int) -> np.ndarray:
    """pd.factorize(key)[0] for keys in [0, radix): dense codes in order of first appearance."""
    first = np.full(radix, -1, dtype=np.int64)
    first[key[::-1]] = np.arange(key.size - 1, -1, -1)  # the last write, the first row, wins
    present = np.flatnonzero(first >= 0)
    code_of = np.empty(radix, dtype=np.int64)
    code_of[present[np.argsort(first[present], kind="stable")]] = np.arange(present.size)
    return code_of[key]


def _one_key(arrays) -> tuple[np.ndarray, int] | None:
    """(key, radix): a single int64 key in [0, radix) per row that is distinct exactly where the tuples are
    (integer columns by their offset from their minimum, other columns by their factorized codes), or None
    when some column has missing values or the key would not fit in int64: numbering its values in order of
    first appearance numbers the tuples as the stepwise factorizing does."""
    key = None
    radix = 1
    for values in arrays:
        values = np.asarray(values)
        sparse = False
        if values.dtype.kind in "iub":
            values = values.astype(np.int64, copy=False)
            low = int(values.min()) if values.size else 0
            span = (int(values.max()) - low + 1) if values.size else 1
            digit = values - low if low else values
            sparse = span > 4 * values.size  # a few far-apart values (thread ids): number them instead
        if sparse or values.dtype.kind not in "iub":
            digit, uniques = pd.factorize(values)
            if values.size and (digit < 0).any():
                return None
            span = max(len(uniques), 1)
            digit = digit.astype(np.int64, copy=False)
        if radix * span >= 1 << 62:
            return None
        key = digit if key is None else key * span + digit
        radix *= span
    return key, radix


def rank_within(groups: np.ndarray, order_keys: list[np.ndarray]) -> np.ndarray:
    """0-based rank of each element inside its group, by the order keys (last key sorts first... as lexsort)."""
    order = np.lexsort(tuple(order_keys) + (groups,))
    g = groups[order]
    first = np.ones(g.size, dtype=bool)
    first[1:] = g[1:] != g[:-1]
    start_pos = np.maximum.accumulate(np.where(first, np.arange(g.size), 0))
    ranks = np.empty(g.size, dtype=np.int64)
    ranks[order] = np.arange(g.size) - start_pos
    return ranks
