"""Long GPU gaps: per GPU, idle intervals between GPU activities inside the aggregation window, each reported
with the CPU activity (NVTX ranges, CUDA API calls, OS I/O calls) of the processes driving that GPU during it,
so the user sees what starved the GPU."""

from __future__ import annotations

import numpy as np
import pandas as pd

from dlprof_profiler.experts.base import Context, finding, fmt_at, fmt_pct, fmt_time, short
from dlprof_profiler.experts.transfers import NSYS_GUIDE, SYNC_APIS

# A gap is reported when it lasts >= GAP_MIN_NS (1 ms) and >= GAP_MIN_ITERATION_FRACTION (5%) of the
# average iteration time. Below 1 ms, gaps are launch latency and Python overhead between kernels: each is
# not actionable by itself and together they show as low GPU utilization. A gap under 5% of the iteration
# cannot change the iteration time by more than 5%, so in long iterations only gaps that matter are listed.
GAP_MIN_NS = 1_000_000
GAP_MIN_ITERATION_FRACTION = 0.05
TOP_GAPS = 5  # gaps described per GPU (the longest)
RANGE_MIN_OVERLAP = 0.10  # a range is named when it covers >= 10% of the gap
MAX_CPU_ITEMS = 3  # ranges / API names / I/O names listed per gap
WARNING_PCT = 10.0  # gaps totalling >= 10% of the wall clock time: warning, else info


def gpu_gap_detector(ctx: Context) -> list[dict]:
    """Inputs: GPU activities (kernels, memcpys, memsets) per device, clipped to the aggregation window;
    NVTX ranges, CUDA API calls and OS I/O calls of the processes using that device. One finding per GPU with
    gaps >= max(GAP_MIN_NS, GAP_MIN_ITERATION_FRACTION x average iteration time)."""
    if ctx.wall <= 0:
        return []
    ws, we = int(ctx.agg.window_start), int(ctx.agg.window_end)
    threshold = int(max(GAP_MIN_NS, GAP_MIN_ITERATION_FRACTION * ctx.avg_iteration))
    gaps_frame = ctx.data.gpu_gaps(ws, we, threshold)
    out = []
    for d, per_device in gaps_frame.groupby("device_id", sort=True):
        gap_s = per_device["start"].to_numpy(np.int64)
        gap_e = per_device["end"].to_numpy(np.int64)
        length = gap_e - gap_s
        idx = np.argsort(-length, kind="stable")
        total = int(length.sum())
        top = idx[:TOP_GAPS]
        pids = per_device["pids"].iloc[0]
        cpu = _CpuActivity(ctx, pids, int(gap_s[top].min()), int(gap_e[top].max()))
        gaps = []
        for i in top:
            items = cpu.during(int(gap_s[i]), int(gap_e[i]))
            gaps.append({"start": int(gap_s[i]), "end": int(gap_e[i]), "duration": int(length[i]), "cpu": items})
        out.append(_gap_finding(ctx, int(d), threshold, int(idx.size), total, gaps))
    return out


def _gap_finding(ctx: Context, device: int, threshold: int, count: int, total: int, gaps: list) -> dict:
    pct = 100.0 * total / ctx.wall

    def describe(g):
        head = f"gap of {fmt_time(g['duration'])} on GPU {device} at {fmt_at(g['start'])}"
        if not g["cpu"]:
            return head + ": no NVTX range, CUDA API or I/O call on the CPU (host code outside the profiled ranges)"
        return (
            head
            + ": CPU in "
            + ", ".join(
                f"{short(c['name'], 70)}"
                + (f" x{c['count']}" if c.get("count", 1) > 1 else "")
                + f" ({fmt_time(c['overlap'])})"
                for c in g["cpu"]
            )
        )

    problem = (
        f"{ctx.device_label(device)} was idle in {count} gap{'s' if count > 1 else ''} of at least "
        f"{fmt_time(threshold)}, {fmt_time(total)} in total ({fmt_pct(pct)} of the wall clock time). "
        + ("Longest: " if count > 1 else "")
        + "; ".join(describe(g) for g in gaps)
        + (f"; and {count - len(gaps)} more" if count > len(gaps) else "")
    )
    return finding(
        "gpu_gap_detector",
        "warning" if pct >= WARNING_PCT else "info",
        problem,
        _advice(ctx, gaps),
        NSYS_GUIDE,
        {"device_id": device, "threshold": threshold, "count": count, "total": total, "pct": pct, "gaps": gaps},
    )


def _advice(ctx: Context, gaps: list) -> str:
    weight = {"dataloader": 0, "sync": 0, "io": 0}
    for g in gaps:
        for c in g["cpu"]:
            if c["category"] in weight:
                weight[c["category"]] += c["overlap"]
    span = sum(g["duration"] for g in gaps) or 1
    main = max(weight, key=weight.get)
    base = (
        "Keep the GPU fed during these gaps: move the host work listed for each gap off the training "
        "loop's critical path or overlap it with GPU work"
    )
    if weight[main] < 0.25 * span:
        return base + " (asynchronous execution, CUDA Graphs for launch-bound phases)"
    if main == "dataloader":
        return (
            "The GPU waits for data: load batches ahead of the GPU with DataLoader workers (num_workers > 0), "
            "prefetching and pinned memory, or NVIDIA DALI. " + base
        )
    if main == "sync":
        return (
            "The GPU waits behind host synchronizations: remove torch.cuda.synchronize(), .item(), .cpu() and "
            "similar calls from the training loop or do them every N iterations. " + base
        )
    return "The GPU waits for file I/O: cache the dataset in memory or read it in background workers. " + base


class _CpuActivity:
    """Ranges, API calls and I/O calls of some processes from a time on, to query what ran in a gap."""

    def __init__(self, ctx: Context, pids, t0: int, t1: int):
        activity = ctx.data.cpu_activity(pids, t0, t1)
        r = activity["ranges"]
        self.r_ok = len(r) > 0
        self.r_label = r["label"].to_numpy(dtype=object)
        self.r_s, self.r_e = r["start"].to_numpy(np.int64), r["end"].to_numpy(np.int64)
        self.r_tid = r["tid"].to_numpy(np.int64)
        self.r_loader = r["loader"].to_numpy(dtype=bool)
        a = activity["api"]
        self.a_name = a["name"].to_numpy(dtype=object)
        self.a_s, self.a_e = a["start"].to_numpy(np.int64), a["end"].to_numpy(np.int64)
        i = activity["io"]
        self.i_name = i["name"].to_numpy(dtype=object)
        self.i_s, self.i_e = i["start"].to_numpy(np.int64), i["end"].to_numpy(np.int64)

    def during(self, gs: int, ge: int) -> list[dict]:
        return (
            self._ranges(gs, ge)
            + self._grouped(self.a_name, self.a_s, self.a_e, gs, ge, "api")
            + self._grouped(self.i_name, self.i_s, self.i_e, gs, ge, "io")
        )

    def _ranges(self, gs: int, ge: int) -> list[dict]:
        """The most specific ranges active in the gap: single ranges covering >= RANGE_MIN_OVERLAP of it, and
        labels of shorter ranges that together do (`label x count`); a range enclosing another listed item
        on its thread is left out."""
        if not self.r_ok or self.r_s.size == 0:
            return []
        thr = RANGE_MIN_OVERLAP * (ge - gs)
        ov = np.minimum(self.r_e, ge) - np.maximum(self.r_s, gs)
        hit = np.flatnonzero(ov > 0)
        if hit.size == 0:
            return []
        big = hit[ov[hit] >= thr]
        big = big[np.argsort(-ov[big], kind="stable")][:200]
        big = big[np.lexsort((-self.r_e[big], self.r_s[big], self.r_tid[big]))]  # parents before children
        small = hit[ov[hit] < thr]
        groups = pd.DataFrame(
            {
                "name": self.r_label[small].astype(str),
                "ov": ov[small],
                "s": self.r_s[small],
                "e": self.r_e[small],
                "tid": self.r_tid[small],
                "loader": self.r_loader[small],
            }
        )
        groups = (
            groups.groupby("name", sort=False)
            .agg(
                ov=("ov", "sum"),
                count=("ov", "size"),
                s=("s", "min"),
                e=("e", "max"),
                tid=("tid", "min"),
                tids=("tid", "nunique"),
                loader=("loader", "any"),
            )
            .reset_index()
        )
        groups = groups[groups["ov"] >= thr]
        n_big = big.size
        items = pd.DataFrame(
            {
                "name": np.concatenate([self.r_label[big].astype(str), groups["name"].to_numpy(dtype=object)]),
                "ov": np.concatenate([ov[big], groups["ov"].to_numpy(np.int64)]),
                "count": np.concatenate([np.ones(n_big, np.int64), groups["count"].to_numpy(np.int64)]),
                "s": np.concatenate([self.r_s[big], groups["s"].to_numpy(np.int64)]),
                "e": np.concatenate([self.r_e[big], groups["e"].to_numpy(np.int64)]),
                "tid": np.concatenate(
                    [self.r_tid[big], np.where(groups["tids"].to_numpy() == 1, groups["tid"].to_numpy(np.int64), -1)]
                ),
                "loader": np.concatenate([self.r_loader[big], groups["loader"].to_numpy(dtype=bool)]),
            }
        )
        if items.empty:
            return []
        s, e, tid = items["s"].to_numpy(), items["e"].to_numpy(), items["tid"].to_numpy()
        n = len(items)
        encloses = (
            (tid[:, None] == tid[None, :])
            & (tid[:, None] >= 0)
            & (s[:, None] <= s[None, :])
            & (e[:, None] >= e[None, :])
            & ~np.eye(n, dtype=bool)
        )
        encloses[n_big:, :] = False  # a label group encloses nothing
        encloses[:n_big, :n_big] &= np.triu(np.ones((n_big, n_big), dtype=bool), 1)  # identical ranges: keep one
        items = items[~encloses.any(axis=1)].sort_values("ov", ascending=False, kind="stable").head(MAX_CPU_ITEMS)
        return [
            {
                "kind": "range",
                "name": str(r.name),
                "overlap": int(r.ov),
                "count": int(r.count),
                "category": "dataloader" if r.loader else "range",
            }
            for r in items.itertuples(index=False)
        ]

    @staticmethod
    def _grouped(names, starts, ends, gs: int, ge: int, kind: str) -> list[dict]:
        if starts.size == 0:
            return []
        ov = np.minimum(ends, ge) - np.maximum(starts, gs)
        hit = ov > 0
        if not hit.any():
            return []
        frame = pd.DataFrame({"name": names[hit].astype(str), "ov": ov[hit]})
        grouped = frame.groupby("name").agg(ov=("ov", "sum"), count=("ov", "size"))
        grouped = grouped.sort_values("ov", ascending=False).head(MAX_CPU_ITEMS)
        return [
            {
                "kind": kind,
                "name": str(k),
                "overlap": int(r.ov),
                "count": int(r["count"]),
                "category": ("sync" if kind == "api" and k in SYNC_APIS else kind),
            }
            for k, r in grouped.iterrows()
        ]
