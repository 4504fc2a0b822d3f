"""Cross-rank detectors of a multi-rank run: a straggler rank, load imbalance, exposed (non-overlapped)
communication, ranks with different iteration counts. They read the ranks' small result frames
(run.rank_worker.RankResult) and the cross-rank table (rank_report.rank_table), never the raw data; their findings
are stored with rank contract.ALL_RANKS and listed first in the run's dlprof_expert_systems.csv (Rank `all`).
See docs/expert_systems.md."""

from __future__ import annotations

import numpy as np
import pandas as pd

from dlprof_profiler import log
from dlprof_profiler.experts.base import DLPROF_GUIDE, finding, fmt_pct, fmt_time, short
from dlprof_profiler.outputs.rank_report import matched_iterations

DDP_NOTES = "https://pytorch.org/docs/stable/notes/ddp.html"

# straggler_rank_detector: a rank is a straggler when its average iteration time is at least STRAGGLER_FACTOR x
# the median rank's and its iterations are longer than the median of all ranks in at least CONSISTENT_SHARE of
# the iterations matched across ranks (one slow iteration, a checkpoint say, is not a straggler). 10 % is well
# above the run-to-run jitter of a training step.
STRAGGLER_FACTOR = 1.10
CONSISTENT_SHARE = 0.75
TOP_DIFFERENCES = 3
# load_imbalance_detector: the per-iteration GPU compute time (kernels other than collectives) of the busiest rank
# exceeds the least busy one's by at least IMBALANCE_SHARE of the busiest's: every collective waits for the
# busiest rank, so that share of the others' step is waiting.
IMBALANCE_SHARE = 0.10
# exposed_communication_detector: collective kernels with no compute kernel on the same GPU take at least
# EXPOSED_SHARE of a rank's GPU time (wall time x GPUs).
EXPOSED_SHARE = 0.10


class RankContext:
    """The ranks of one aggregation of a multi-rank run."""

    def __init__(self, results, table: pd.DataFrame):
        self.results = sorted(results, key=lambda r: r.rank)
        self.table = table.set_index("rank").sort_index()
        self.by_rank = {r.rank: r for r in self.results}

    @property
    def ranks(self) -> list[int]:
        return [r.rank for r in self.results]

    def median_rank(self, exclude: int | None = None) -> int:
        """The rank whose average iteration time is the median of the ranks' (the lower one of an even count)."""
        t = self.table if exclude is None else self.table.drop(index=exclude)
        order = t.sort_values("avg_iteration_time", kind="stable")  # ties: the lower rank first
        return int(order.index[(len(order) - 1) // 2])

    def per_iteration(self, rank: int, frame: pd.DataFrame, key, column: str) -> pd.Series:
        """A rank's totals of `column` by `key`, divided by its aggregated iterations."""
        n = max(int(self.table.loc[rank, "iterations"]), 1)
        if len(frame) == 0:
            return pd.Series(dtype=np.float64)
        return frame.groupby(key, sort=False)[column].sum().astype(np.float64) / n


def detect_ranks(results, table: pd.DataFrame) -> list[dict]:
    """Cross-rank findings of one aggregation (a detector that fails is a warning, as for the others)."""
    if len(results) < 2:
        return []
    ctx = RankContext(results, table)
    findings = []
    for name, detector in RANK_DETECTORS.items():
        try:
            findings += detector(ctx)
        except Exception as exc:  # noqa: BLE001 - one broken rule must not cost the user the whole analysis
            log.warning(f"expert system {name} failed: {type(exc).__name__}: {exc}")
    return findings


def iteration_count_detector(ctx: RankContext) -> list[dict]:
    """Inputs: every rank's iteration count. Fires when they differ: iterations are matched by index, so the
    cross-rank figures cover only the iterations every rank has."""
    counts = {int(r): int(ctx.table.loc[r, "total_iterations"]) for r in ctx.ranks}
    if len(set(counts.values())) <= 1:
        return []
    low = min(counts.values())
    listed = ", ".join(f"rank {r}: {n}" for r, n in counts.items())
    problem = (
        f"Ranks have different iteration counts ({listed}): iterations are matched across ranks by index, "
        f"so only iterations 0..{low - 1} compare like with like"
    )
    recommendation = (
        f"Profile the same training steps on every rank (the same --capture_iterations, delay or "
        f"nsys capture range), or aggregate the iterations all ranks have: --iter_stop {low - 1}"
    )
    action = {"type": "reaggregate", "iter_stop": low - 1, "command": f"dlprof --database=<db> --iter_stop {low - 1}"}
    return [
        finding(
            "rank_iteration_count_detector",
            "warning",
            problem,
            recommendation,
            DLPROF_GUIDE,
            {"iterations": {str(r): n for r, n in counts.items()}},
            action,
        )
    ]


def straggler_rank_detector(ctx: RankContext) -> list[dict]:
    """Inputs: the durations of the iterations matched across ranks, each rank's average iteration time, and the
    op and kernel totals of the straggler and of the median rank. Thresholds: STRAGGLER_FACTOR (1.10) x the median
    rank's average, longer than the per-iteration median in CONSISTENT_SHARE (75 %) of the matched iterations."""
    durations = matched_iterations(ctx.results)
    durations = durations[durations.notna().sum(axis=1) >= 2]
    if durations.empty:
        return []
    per_iteration_median = durations.median(axis=1)
    out = []
    for rank in ctx.table.sort_values("avg_iteration_time", ascending=False, kind="stable").index.tolist()[:3]:
        rank = int(rank)
        median_rank = ctx.median_rank(exclude=rank)
        avg, ref = (
            float(ctx.table.loc[rank, "avg_iteration_time"]),
            float(ctx.table.loc[median_rank, "avg_iteration_time"]),
        )
        if ref <= 0 or avg < STRAGGLER_FACTOR * ref:
            continue
        mine = durations[rank]
        present = mine.notna()
        slower = int((mine[present] > per_iteration_median[present]).sum())
        matched = int(present.sum())
        if matched == 0 or slower < CONSISTENT_SHARE * matched:
            continue
        out.append(_straggler(ctx, rank, median_rank, avg, ref, slower, matched))
    return out


def _straggler(
    ctx: RankContext, rank: int, median_rank: int, avg: float, ref: float, slower: int, matched: int
) -> dict:
    mine, theirs = ctx.by_rank[rank], ctx.by_rank[median_rank]
    key = ["name", "direction"]

    def differences(frame_a, frame_b, by, column):
        a = ctx.per_iteration(rank, frame_a, by, column)
        b = ctx.per_iteration(median_rank, frame_b, by, column)
        diff = a.sub(b, fill_value=0.0)
        diff = diff[diff > 0].sort_values(ascending=False, kind="stable").head(TOP_DIFFERENCES)
        return [(_label(k), float(v)) for k, v in diff.items()]

    ops_gpu = differences(mine.ops, theirs.ops, key, "gpu_total")
    ops_cpu = differences(mine.ops, theirs.ops, key, "cpu_total")
    kernels = differences(mine.kernels, theirs.kernels, "name", "gpu_total")

    def listed(items):
        return ", ".join(f"{short(name, 60)} (+{fmt_time(v)})" for name, v in items) or "none"

    problem = (
        f"Rank {rank} is a straggler: its iterations take {fmt_time(avg)} on average, {avg / ref:.2f}x the "
        f"median rank (rank {median_rank}: {fmt_time(ref)}), and it is slower than the median of the ranks in "
        f"{slower} of {matched} matched iterations. Where its extra time goes, per iteration against rank "
        f"{median_rank}: ops by GPU time: {listed(ops_gpu)}; ops by CPU time: {listed(ops_cpu)}; kernels: "
        f"{listed(kernels)}"
    )
    recommendation = (
        f"Compare rank {rank}'s own reports (*_rank{rank}.csv) with rank {median_rank}'s: larger inputs "
        f"on that rank (balance the data sharding, bucket sequence lengths), a slower or shared GPU "
        f"(clocks, thermal throttling, another process), or a busier host (CPU contention, data-loading "
        f"workers); every collective waits for the slowest rank"
    )
    data = {
        "rank": rank,
        "median_rank": median_rank,
        "avg_iteration_time": avg,
        "median_avg_iteration_time": ref,
        "ratio": avg / ref,
        "slower_iterations": slower,
        "matched_iterations": matched,
        "ops_gpu": ops_gpu,
        "ops_cpu": ops_cpu,
        "kernels": kernels,
    }
    return finding("straggler_rank_detector", "warning", problem, recommendation, DDP_NOTES, data)


def _label(key) -> str:
    if isinstance(key, tuple):
        name, direction = key
        return f"{name} ({direction})" if direction and direction != "fprop" else str(name)
    return str(key)


def load_imbalance_detector(ctx: RankContext) -> list[dict]:
    """Inputs: per rank, the accumulated time of its compute kernels (all but collectives) per aggregated
    iteration. Threshold: the busiest rank's exceeds the least busy one's by IMBALANCE_SHARE (10 %) of it."""
    work = {}
    for r in ctx.results:
        k = r.kernels
        compute = float(k.loc[~k["communication"].to_numpy(dtype=bool), "gpu_total"].sum()) if len(k) else 0.0
        work[r.rank] = compute / max(int(ctx.table.loc[r.rank, "iterations"]), 1)
    busiest = max(work, key=lambda r: (work[r], -r))
    idlest = min(work, key=lambda r: (work[r], r))
    top = work[busiest]
    if top <= 0 or (top - work[idlest]) < IMBALANCE_SHARE * top:
        return []
    share = (top - work[idlest]) / top
    listed = ", ".join(f"rank {r}: {fmt_time(v)}" for r, v in sorted(work.items())[:8])
    problem = (
        f"Load imbalance across ranks: per iteration, rank {busiest} runs {fmt_time(top)} of compute "
        f"kernels and rank {idlest} {fmt_time(work[idlest])} ({fmt_pct(100 * share)} less); the others wait "
        f"for rank {busiest} at every collective ({listed})"
    )
    recommendation = (
        "Give every rank the same work: shard the data evenly (drop_last, equal shard sizes), bucket "
        "variable-length samples, and balance the layers of pipeline stages"
    )
    return [
        finding(
            "load_imbalance_detector",
            "warning",
            problem,
            recommendation,
            DDP_NOTES,
            {
                "compute_per_iteration": {str(r): v for r, v in work.items()},
                "busiest": busiest,
                "idlest": idlest,
                "share": share,
            },
        )
    ]


def exposed_communication_detector(ctx: RankContext) -> list[dict]:
    """Inputs: per rank, collective kernel time and the part of it overlapped by compute kernels on the same GPU
    (aggregate.py), the GPUs used and the wall time. Threshold: the exposed part takes EXPOSED_SHARE (10 %) of
    the rank's GPU time (wall time x GPUs)."""
    rows = []
    for r in ctx.results:
        s = r.summary
        gpu_time = float(s["wall_time"]) * max(int(s["gpus"]), 1)
        exposed = int(s["communication_time"]) - int(s["overlapped_communication_time"])
        if gpu_time > 0 and exposed > 0:
            rows.append(
                (r.rank, exposed, exposed / gpu_time, exposed / max(int(ctx.table.loc[r.rank, "iterations"]), 1))
            )
    flagged = sorted((x for x in rows if x[2] >= EXPOSED_SHARE), key=lambda x: -x[2])
    if not flagged:
        return []
    listed = ", ".join(
        f"rank {r}: {fmt_time(per_it)} per iteration ({fmt_pct(100 * share)} of its GPU time)"
        for r, _, share, per_it in flagged[:8]
    )
    problem = (
        f"Exposed communication: collective (NCCL) kernels run with no compute kernel on the same GPU on "
        f"{len(flagged)} of {len(ctx.results)} ranks: {listed}"
    )
    recommendation = (
        "Overlap communication with compute: let DDP all-reduce gradients during the backward pass "
        "(bucket_cap_mb, gradient_as_bucket_view=True, no extra synchronization), prefetch FSDP "
        "all-gathers (forward_prefetch, backward_prefetch), and accumulate gradients over several "
        "micro-batches with no_sync() to communicate less often"
    )
    return [
        finding(
            "exposed_communication_detector",
            "warning",
            problem,
            recommendation,
            DDP_NOTES,
            {"exposed": {str(r): {"time": e, "share": s, "per_iteration": p} for r, e, s, p in flagged}},
        )
    ]


RANK_DETECTORS = {
    "rank_iteration_count_detector": iteration_count_detector,
    "straggler_rank_detector": straggler_rank_detector,
    "load_imbalance_detector": load_imbalance_detector,
    "exposed_communication_detector": exposed_communication_detector,
}
