"""The dashboard's guidance: what to try first, from the aggregation's summary and Tensor Core figures (the
thresholds are the expert systems', contract.py), with a link to read further."""

from __future__ import annotations

from dlprof_profiler import contract as K

GUIDANCE_LINKS = {
    "amp": "https://developer.nvidia.com/automatic-mixed-precision",
    "tc": "https://docs.nvidia.com/deeplearning/performance/mixed-precision-training/index.html",
    "dali": "https://developer.nvidia.com/DALI",
    "perf": "https://docs.nvidia.com/deeplearning/performance/index.html",
}


def dashboard_guidance(summary: dict, tc: dict) -> list[dict]:
    """[{title, text, link}]: a key node to set, Tensor Cores to use, an idle GPU, slow data loading; the
    performance guide when none applies."""

    out = []
    pct = lambda k: summary.get(k) or 0.0  # noqa: E731
    # no GPU ran anything: no GPU advice (docs/DESIGN.md "Clarifications", GPUs)
    gpu_work = summary.get("n_visible_gpus") != 0
    if not summary.get("key_found"):
        out.append(
            {
                "title": "Set a key node",
                "text": "No key node was found, so the whole profile is one "
                "iteration. Choose an op or NVTX range that runs once per training step in Reaggregate "
                "(or pass --key_node) to get per-iteration statistics.",
                "link": "",
            }
        )
    if gpu_work and tc.get("eligible_not_using_ops"):
        out.append(
            {
                "title": "Use Tensor Cores",
                "text": f"{tc['eligible_not_using_ops']} op(s) could use "
                "Tensor Cores but do not. Enable automatic mixed precision (FP16/BF16) and keep tensor "
                "dimensions multiples of 8.",
                "link": GUIDANCE_LINKS["amp"],
            }
        )
    if gpu_work and pct("gpu_utilization") < K.GPU_UTILIZATION_PCT:
        out.append(
            {
                "title": "Keep the GPU busy",
                "text": f"The GPU is busy {pct('gpu_utilization'):.1f} % of "
                "the time. Look at the CPU and idle gaps of the top ops; larger batches, fewer "
                "synchronizations and CUDA graphs reduce launch overhead.",
                "link": GUIDANCE_LINKS["perf"],
            }
        )
    if gpu_work and pct("dataloader_duration_pct") > K.DATALOADER_PCT:
        out.append(
            {
                "title": "Speed up data loading",
                "text": f"Data loading takes "
                f"{pct('dataloader_duration_pct'):.1f} % of the time. Use more DataLoader workers, pinned "
                "memory or NVIDIA DALI.",
                "link": GUIDANCE_LINKS["dali"],
            }
        )
    if not out:
        out.append(
            {
                "title": "Performance guide",
                "text": "The profile shows no obvious problem; the deep "
                "learning performance guide lists further optimizations.",
                "link": GUIDANCE_LINKS["perf"],
            }
        )
    return out
