"""What every detector shares: the run context (lazily computed, vectorized views of the trace restricted to
the aggregation), the finding constructor and the text formatting of figures.

A detector is a function `detector(ctx: Context) -> list[dict]`. It reads only the engine's frames
(trace, correlation, domain model, aggregation, iterations) through the context, never files; it loops at
most per GPU or per finding, never per kernel, API call or range (profiles hold 10^6 kernels).
"""

from __future__ import annotations

import math
from functools import cached_property

from dlprof_profiler.experts.data import MemoryData
from dlprof_profiler.experts.data import api_base_name  # noqa: F401 - re-exported for the detectors

import numpy as np
import pandas as pd

SEVERITIES = ("error", "warning", "info")

# DLProf's documentation and the references quoted by the recommendations.
DLPROF_GUIDE = "https://docs.nvidia.com/deeplearning/frameworks/dlprof-user-guide/index.html"
TUNING_GUIDE = "https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html"


# ---------------------------------------------------------------------------- findings


def finding(
    exp_sys_id: str,
    severity: str,
    problem: str,
    recommendation: str,
    link: str,
    data: dict | None = None,
    action: dict | None = None,
) -> dict:
    """One expert-system finding as the engine stores it (expert_systems_feedback, CSV, viewer)."""
    assert severity in SEVERITIES, severity
    assert link.startswith("https://"), link
    return {
        "id": exp_sys_id,
        "severity": severity,
        "problem": problem,
        "recommendation": recommendation,
        "link": link,
        "action": plain(action) if action is not None else None,
        "data": plain(data or {}),
    }


def plain(value):
    """JSON-ready copy: numpy scalars and arrays to Python numbers and lists."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, np.ndarray):
        return [plain(v) for v in value.tolist()]
    if isinstance(value, (np.bool_,)):
        return bool(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        v = float(value)
        return v if math.isfinite(v) else None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


# ---------------------------------------------------------------------------- formatting


def fmt_time(ns) -> str:
    """A duration: `850 ns`, `12.5 us`, `12.3 ms`, `1.234 s` (ASCII units: the CSV is read by spreadsheets)."""
    ns = float(ns)
    if ns >= 1e9:
        return f"{ns / 1e9:.3f} s"
    if ns >= 1e6:
        return f"{ns / 1e6:.1f} ms"
    if ns >= 1e3:
        return f"{ns / 1e3:.1f} us"
    return f"{ns:.0f} ns"


def fmt_at(ns) -> str:
    """A timestamp on the session timeline: `1.234 s`, `12.345 ms`, `45.0 us`."""
    ns = float(ns)
    if ns >= 1e9:
        return f"{ns / 1e9:.3f} s"
    if ns >= 1e6:
        return f"{ns / 1e6:.3f} ms"
    return f"{ns / 1e3:.1f} us"


def fmt_pct(x) -> str:
    return f"{float(x):.1f}%"


def fmt_bytes(n) -> str:
    n = float(n)
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def short(text, limit: int = 80) -> str:
    """A label cut to `limit` characters, keeping its end (op names are paths: the leaf matters)."""
    text = "" if text is None or (isinstance(text, float) and math.isnan(text)) else str(text)
    text = " ".join(text.split())
    return text if len(text) <= limit else "..." + text[-(limit - 3) :]


def counted(items: list[tuple[str, int]], limit: int = 3) -> str:
    """`a (3), b (2) and 4 more`."""
    shown = ", ".join(f"{short(name, 60)} ({count})" for name, count in items[:limit])
    rest = len(items) - limit
    return shown + (f" and {rest} more" if rest > 0 else "")


# ---------------------------------------------------------------------------- context


class Context:
    """One aggregation of one domain, with the derived facts several detectors need (each computed once).
    Reads beyond the aggregation tables go through `data` (experts/data.py): in memory or from the store."""

    def __init__(self, trace, corr, dm, agg, iterations, data=None):
        self.trace, self.corr, self.dm, self.agg, self.iterations = trace, corr, dm, agg, iterations
        self.data = data if data is not None else MemoryData(trace, corr, dm, agg, iterations)
        self.config = dict(corr.config)
        self.silent: list[tuple[str, str]] = []  # (detector id, unknown fact) for --verbosity=detailed

    # -- facts -----------------------------------------------------------------------------------------
    def unknown(self, exp_sys_id: str, fact: str) -> None:
        """Record that a detector stayed silent because `fact` is unknown."""
        self.silent.append((exp_sys_id, fact))

    def cfg(self, *keys):
        """The first known run-metadata value among `keys` (None: unknown)."""
        for key in keys:
            value = self.config.get(key)
            if value is not None:
                return value
        return None

    def cfg_bool(self, *keys) -> bool | None:
        value = self.cfg(*keys)
        if value is None:
            return None
        if isinstance(value, str):
            return value.strip().lower() in ("1", "true", "yes", "on")
        return bool(value)

    @property
    def is_pytorch(self) -> bool:
        return self.corr.family == "pytorch"

    @property
    def range_labels(self) -> pd.DataFrame:
        """Ranges per (domain, label): kind, count, data loading, total duration."""
        labels = self.corr.range_labels
        if labels is None:
            return pd.DataFrame(
                {"domain": [], "label": [], "kind": [], "num_ranges": [], "dataloader": [], "total_time": []}
            )
        return labels

    # -- aggregation window ----------------------------------------------------------------------------
    @property
    def wall(self) -> int:
        return int(self.agg.window_end - self.agg.window_start)

    @property
    def n_iterations(self) -> int:
        return int(self.agg.iter_stop - self.agg.iter_start + 1)

    @property
    def avg_iteration(self) -> float:
        return self.wall / max(self.n_iterations, 1)

    # -- names -----------------------------------------------------------------------------------------
    @cached_property
    def op_name_of_index(self) -> np.ndarray:
        """Op name per op_index (object array; '' for unknown indices)."""
        ops = self.dm.ops
        if len(ops) == 0:
            return np.zeros(0, dtype=object)
        idx = ops["op_index"].to_numpy(np.int64)
        out = np.full(int(idx.max()) + 1, "", dtype=object)
        out[idx] = ops["name"].to_numpy(dtype=object)
        return out

    def op_names(self, op_indices) -> np.ndarray:
        """Op names of some op indices ('' for -1)."""
        op_indices = np.asarray(op_indices, dtype=np.int64)
        out = np.full(op_indices.size, "", dtype=object)
        ok = (op_indices >= 0) & (op_indices < self.op_name_of_index.size)
        out[ok] = self.op_name_of_index[op_indices[ok]]
        return out

    def top_ops(self, op_indices, weights=None, limit: int = 3) -> list:
        """[(op name, count or weight)] of some op indices, largest first."""
        op_indices = np.asarray(op_indices, dtype=np.int64)
        if op_indices.size == 0:
            return []
        return _top(self.op_names(op_indices), weights, limit)

    # -- devices ---------------------------------------------------------------------------------------
    def device_label(self, device_id: int) -> str:
        devices = self.trace.devices
        name = None
        if len(devices):
            hit = devices[devices["device_id"].to_numpy() == device_id]
            if len(hit):
                name = hit["name"].iloc[0]
        return f"GPU {device_id}" + (f" ({name})" if name is not None and not pd.isna(name) and name else "")

    def device_of_threads(self, tids: np.ndarray, pids: np.ndarray) -> np.ndarray:
        """The device each thread (else its process) launches most work on; -1 if none."""
        by_tid = pd.Series(np.asarray(tids, dtype=np.int64)).map(self.corr.thread_device)
        by_pid = pd.Series(np.asarray(pids, dtype=np.int64)).map(self.corr.process_device)
        return by_tid.fillna(by_pid).fillna(-1).to_numpy(np.int64)

    # -- kernels ---------------------------------------------------------------------------------------
    @cached_property
    def kernels(self) -> pd.DataFrame:
        """Per (kernel name, op) of the aggregation: name, op_index, count, gpu_total."""
        k = self.agg.kernels
        if k is None or len(k) == 0 or "gpu_total" not in k.columns:
            return pd.DataFrame(
                {
                    "name": pd.Series(dtype=object),
                    "op_index": pd.Series(dtype="int64"),
                    "count": pd.Series(dtype="int64"),
                    "gpu_total": pd.Series(dtype="int64"),
                }
            )
        return k

    @cached_property
    def kernel_time(self) -> int:
        """Accumulated duration of the aggregation's kernel launches."""
        return int(self.kernels["gpu_total"].sum())

    def kernel_name_flags(self, predicate) -> np.ndarray:
        """Per row of `kernels`: whether its name satisfies `predicate(name)` (evaluated once per name)."""
        names = self.kernels["name"].to_numpy(dtype=object)
        codes, uniques = pd.factorize(names)
        flags = np.array([bool(predicate(str(u))) for u in uniques], dtype=bool)
        return flags[codes] if codes.size else np.zeros(0, dtype=bool)


def _top(names: np.ndarray, weights, limit: int) -> list:
    frame = pd.DataFrame({"n": names, "w": 1 if weights is None else np.asarray(weights)})
    frame = frame[frame["n"] != ""]
    if frame.empty:
        return []
    sums = frame.groupby("n", sort=False)["w"].sum().sort_values(ascending=False, kind="stable")
    return [(str(k), v.item() if hasattr(v, "item") else v) for k, v in sums.head(limit).items()]
