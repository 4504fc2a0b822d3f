"""What every detector shares: the run context (lazily computed, vectorized views of the trace restricted to
the aggregation), the finding constructor and the text formatting of figures.

A detector is a function `detector(ctx: Context) -> list[dict]`. It reads only the engine's frames
(trace, correlation, domain model, aggregation, iterations) through the context, never files; it loops at
most per GPU or per finding, never per kernel, API call or range (profiles hold 10^6 kernels).
"""
from __future__ import annotations

import math
import re
from functools import cached_property

import numpy as np
import pandas as pd

SEVERITIES = ("error", "warning", "info")

# DLProf's documentation and the references quoted by the recommendations.
DLPROF_GUIDE = "https://docs.nvidia.com/deeplearning/frameworks/dlprof-user-guide/index.html"
TUNING_GUIDE = "https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html"

_API_SUFFIX = re.compile(r"(?:_ptsz|_ptds)?(?:_v\d+)?$")


# ---------------------------------------------------------------------------- findings

def finding(exp_sys_id: str, severity: str, problem: str, recommendation: str, link: str,
            data: dict | None = None, action: dict | None = None) -> dict:
    """One expert-system finding as the engine stores it (expert_systems_feedback, CSV, viewer)."""
    assert severity in SEVERITIES, severity
    assert link.startswith("https://"), link
    return {"id": exp_sys_id, "severity": severity, "problem": problem, "recommendation": recommendation,
            "link": link, "action": plain(action) if action is not None else None, "data": plain(data or {})}


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
    return text if len(text) <= limit else "..." + text[-(limit - 3):]


def counted(items: list[tuple[str, int]], limit: int = 3) -> str:
    """`a (3), b (2) and 4 more`."""
    shown = ", ".join(f"{short(name, 60)} ({count})" for name, count in items[:limit])
    rest = len(items) - limit
    return shown + (f" and {rest} more" if rest > 0 else "")


def api_base_name(name) -> str:
    """CUDA API name without its version and per-thread-stream suffixes: `cudaMemcpyAsync_ptsz_v7000`
    -> `cudaMemcpyAsync`, `cuMemcpyHtoD_v2` -> `cuMemcpyHtoD`."""
    return _API_SUFFIX.sub("", str(name)) if name is not None else ""


def codes_and_categories(series: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """Integer codes and their distinct values (object array) of a name column, categorical or not."""
    if isinstance(series.dtype, pd.CategoricalDtype):
        return series.cat.codes.to_numpy(np.int64), series.cat.categories.to_numpy(dtype=object)
    codes, uniques = pd.factorize(series.to_numpy(dtype=object))
    return codes.astype(np.int64), np.asarray(uniques, dtype=object)


# ---------------------------------------------------------------------------- context

class Context:
    """One aggregation of one domain, with the derived arrays several detectors need (each computed once)."""

    def __init__(self, trace, corr, dm, agg, iterations):
        self.trace, self.corr, self.dm, self.agg, self.iterations = trace, corr, dm, agg, iterations
        self.config = dict(getattr(corr, "config", None) or {})
        self.silent: list[tuple[str, str]] = []   # (detector id, unknown fact) for --verbosity=detailed

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

    @cached_property
    def act_in(self) -> np.ndarray:
        """Per GPU activity: in the aggregated iterations (the iteration of its launching API call)."""
        from dlprof_profiler.aggregate import activity_iterations
        it = activity_iterations(self.trace, self.corr, self.iterations)
        return (it >= self.agg.iter_start) & (it <= self.agg.iter_stop)

    @cached_property
    def api_in(self) -> np.ndarray:
        """Per CUDA API call: starts in the aggregated iterations."""
        api = self.trace.api_calls
        if len(api) == 0:
            return np.zeros(0, dtype=bool)
        it = self.iterations.of(api["start"].to_numpy(np.int64))
        return (it >= self.agg.iter_start) & (it <= self.agg.iter_stop)

    # -- names -----------------------------------------------------------------------------------------
    @cached_property
    def api_names(self) -> tuple[np.ndarray, np.ndarray]:
        """(code per API call, base name per code): names without version suffixes."""
        api = self.trace.api_calls
        if len(api) == 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=object)
        codes, cats = codes_and_categories(api["name"])
        base = np.array([api_base_name(c) for c in cats], dtype=object)
        return codes, base

    def api_base(self, rows: np.ndarray) -> np.ndarray:
        """Base API names of some API call rows (-1 rows: '')."""
        codes, base = self.api_names
        rows = np.asarray(rows, dtype=np.int64)
        out = np.full(rows.size, "", dtype=object)
        ok = rows >= 0
        if ok.any() and base.size:
            c = codes[rows[ok]]
            out[ok] = np.where(c >= 0, base[np.maximum(c, 0)], "")
        return out

    def api_rows_matching(self, predicate) -> np.ndarray:
        """Per API call: whether its base name satisfies `predicate(name)` (evaluated once per name)."""
        codes, base = self.api_names
        if codes.size == 0:
            return np.zeros(0, dtype=bool)
        hit = np.array([bool(predicate(b)) for b in base] + [False], dtype=bool)
        return hit[np.where(codes >= 0, codes, base.size)]

    @cached_property
    def gpu_names(self) -> tuple[np.ndarray, np.ndarray]:
        gpu = self.trace.gpu
        if len(gpu) == 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=object)
        return codes_and_categories(gpu["name"])

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

    def op_names_of_instances(self, inst_rows: np.ndarray) -> np.ndarray:
        inst_rows = np.asarray(inst_rows, dtype=np.int64)
        out = np.full(inst_rows.size, "", dtype=object)
        inst = self.dm.instances
        ok = (inst_rows >= 0) & (inst_rows < len(inst))
        if ok.any() and self.op_name_of_index.size:
            op_index = inst["op_index"].to_numpy(np.int64)[inst_rows[ok]]
            good = (op_index >= 0) & (op_index < self.op_name_of_index.size)
            names = np.full(op_index.size, "", dtype=object)
            names[good] = self.op_name_of_index[op_index[good]]
            out[ok] = names
        return out

    def top_ops_of_gpu(self, rows: np.ndarray, weights: np.ndarray | None = None, limit: int = 3) -> list:
        """[(op name, count or weight)] of the ops owning some GPU activity rows, largest first."""
        if rows.size == 0 or len(self.dm.gpu_instance) == 0:
            return []
        return _top(self.op_names_of_instances(self.dm.gpu_instance[rows]), weights, limit)

    def top_ops_of_api(self, rows: np.ndarray, weights: np.ndarray | None = None, limit: int = 3) -> list:
        if rows.size == 0 or len(self.dm.api_instance) == 0:
            return []
        return _top(self.op_names_of_instances(self.dm.api_instance[rows]), weights, limit)

    # -- devices ---------------------------------------------------------------------------------------
    def device_label(self, device_id: int) -> str:
        devices = self.trace.devices
        name = None
        if len(devices):
            hit = devices[devices["device_id"].to_numpy() == device_id]
            if len(hit):
                name = hit["name"].iloc[0]
        return f"GPU {device_id}" + (f" ({name})" if name is not None and not pd.isna(name) and name else "")

    @cached_property
    def busy_segments(self) -> dict:
        """Per device: merged busy intervals of all its GPU activities (whole profile)."""
        from dlprof_profiler.intervals import merge_intervals
        gpu = self.trace.gpu
        out = {}
        if len(gpu) == 0:
            return out
        dev = gpu["device_id"].to_numpy(np.int64)
        s, e = gpu["start"].to_numpy(np.int64), gpu["end"].to_numpy(np.int64)
        for d in np.unique(dev).tolist():
            m = dev == d
            out[int(d)] = merge_intervals(s[m], e[m])
        return out

    def device_of_threads(self, tids: np.ndarray, pids: np.ndarray) -> np.ndarray:
        """The device each thread (else its process) launches most work on; -1 if none."""
        by_tid = pd.Series(np.asarray(tids, dtype=np.int64)).map(self.corr.thread_device)
        by_pid = pd.Series(np.asarray(pids, dtype=np.int64)).map(self.corr.process_device)
        return by_tid.fillna(by_pid).fillna(-1).to_numpy(np.int64)

    @cached_property
    def kernel_time(self) -> int:
        """Accumulated duration of the aggregation's kernel launches."""
        k = self.agg.kernel_launches
        return int(k["gpu_duration"].sum()) if k is not None and len(k) else 0


def _top(names: np.ndarray, weights, limit: int) -> list:
    frame = pd.DataFrame({"n": names, "w": 1 if weights is None else np.asarray(weights)})
    frame = frame[frame["n"] != ""]
    if frame.empty:
        return []
    sums = frame.groupby("n", sort=False)["w"].sum().sort_values(ascending=False, kind="stable")
    return [(str(k), v.item() if hasattr(v, "item") else v) for k, v in sums.head(limit).items()]
