"""Kernel launches: short kernels, which run for less time than the CPU takes to launch them, so the GPU
cannot run ahead of the host. Input: the aggregation's launch delays (engine/breakdowns.py)."""

from __future__ import annotations

from dlprof_profiler.experts.base import Context, finding, fmt_pct, fmt_time, short

# short_kernels_detector: short kernels (shorter than their launch call) are >= SHORT_KERNEL_SHARE_PCT of the
# kernel launches of the aggregated iterations, with >= SHORT_KERNEL_MIN_LAUNCHES launches; warning from
# SHORT_KERNEL_WARNING_PCT.
SHORT_KERNEL_SHARE_PCT = 30.0
SHORT_KERNEL_WARNING_PCT = 50.0
SHORT_KERNEL_MIN_LAUNCHES = 100
NAMED_KERNELS = 3


def short_kernels_detector(ctx: Context) -> list[dict]:
    """Inputs: per kernel name its launches and short kernels (breakdowns.GpuBreakdowns), and the idle time's
    host wait per GPU. Fires when short kernels are >= SHORT_KERNEL_SHARE_PCT of >= SHORT_KERNEL_MIN_LAUNCHES
    kernel launches."""
    gb = ctx.agg.gpu_breakdowns
    if not gb or gb["launches_total"] < SHORT_KERNEL_MIN_LAUNCHES:
        return []
    total, shorts = gb["launches_total"], gb["short_kernels"]
    share = 100.0 * shorts / total
    if share < SHORT_KERNEL_SHARE_PCT:
        return []
    table = gb["launches"].sort_values("short_kernels", ascending=False, kind="stable")
    top = table[table["short_kernels"] > 0].head(NAMED_KERNELS)
    named = ", ".join(f"{short(r.name, 60)} ({int(r.short_kernels)} of {int(r.launches)})" for r in top.itertuples())
    host = int(gb["gpus"]["host_wait"].sum())
    host_text = f"; the GPUs waited {fmt_time(host)} for the host to launch work" if host else ""
    return [
        finding(
            "short_kernels_detector",
            "warning" if share >= SHORT_KERNEL_WARNING_PCT else "info",
            f"{shorts} of {total} kernel launches ({fmt_pct(share)}) ran for less time than their launch call "
            f"took on the CPU: {named}{host_text}",
            "Launch fewer, larger kernels: capture the step in a CUDA Graph (torch.cuda.graphs, "
            "torch.compile(mode='reduce-overhead')), fuse elementwise ops (torch.compile), use fused or foreach "
            "optimizers, or increase the batch size",
            "https://pytorch.org/docs/stable/notes/cuda.html#cuda-graphs",
            {
                "short_kernels": shorts,
                "launches": total,
                "share_pct": share,
                "host_wait": host,
                "kernels": [
                    {"name": r.name, "short_kernels": int(r.short_kernels), "launches": int(r.launches)}
                    for r in top.itertuples()
                ],
            },
        )
    ]
