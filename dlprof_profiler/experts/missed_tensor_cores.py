"""Tensor Core eligible ops left in FP32 (or FP64) on CUDA cores while other ops of the run use Tensor Cores: a
layer that fell out of autocast, an FP32 GEMM beside FP16 ones, matmuls without TF32 beside convolutions with
it. DLProf's amp_detector stays silent there by design (some eligible op does use 16-bit math)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from dlprof_profiler.experts.base import Context, finding, fmt_pct, fmt_time, short
from dlprof_profiler.experts.tensor_cores import (
    FP32_TYPES,
    HALF_TYPES,
    eligible_ops,
    half_kernel_ops,
    known_types,
    normalized_types,
)

MIXED_PRECISION_LINK = "https://pytorch.org/docs/stable/amp.html"
# Report when the flagged ops take at least this share of the GPU kernel time; warning from the second.
MIN_SHARE_PCT = 1.0
WARNING_SHARE_PCT = 10.0
WIDE_TYPES = FP32_TYPES | {"float64", "double", "fp64"}
SHOWN_OPS = 5  # ops named in the problem text (all of them in `data`)
SHOWN_KERNELS = 2  # kernel names per op in the text


def missed_tensor_cores_detector(ctx: Context) -> list[dict]:
    """Inputs: the aggregation's ops (Tensor Core eligibility, use of Tensor Core kernels, kernel time), their
    data types (markers, else kernel names) and kernels. Fires when Tensor Core eligible ops with kernels ran
    none on Tensor Cores in FP32/FP64 while at least one other op of the aggregation used Tensor Cores, and
    they take >= MIN_SHARE_PCT (1%) of the GPU kernel time; warning from WARNING_SHARE_PCT (10%). Silent
    without kernels (CPU-only runs) and when no op uses Tensor Cores (amp_detector's case)."""
    ops = ctx.agg.ops
    if ops is None or len(ops) == 0 or not ctx.kernel_time:
        return []
    tc_ops = ops[ops["using_tc"].to_numpy(dtype=bool) & (ops["kernel_time"].to_numpy() > 0)]
    if tc_ops.empty:
        return []
    elig = eligible_ops(ctx)
    cand = elig[~elig["using_tc"].to_numpy(dtype=bool)]
    if cand.empty:
        return []
    types = normalized_types(known_types(cand))
    wide = np.isin(types, list(WIDE_TYPES)) & ~cand["op_index"].isin(half_kernel_ops(ctx)).to_numpy()
    flagged = cand[wide].assign(dtype=types[wide])
    if flagged.empty:
        return []
    time = int(flagged["kernel_time"].sum())
    share = 100.0 * time / ctx.kernel_time
    if share < MIN_SHARE_PCT:
        return []
    flagged = flagged.sort_values(["kernel_time", "op_id"], ascending=[False, True], kind="stable")
    tc_types = _tc_precisions(ctx, tc_ops)
    kernels = _kernels_of(ctx, flagged["op_index"].to_numpy(np.int64))
    details, parts = [], []
    for r in flagged.itertuples(index=False):
        names = kernels.get(int(r.op_index), [])
        op_share = 100.0 * int(r.kernel_time) / ctx.kernel_time
        details.append(
            {
                "op_id": r.op_id,
                "name": r.name,
                "direction": r.direction,
                "data_type": r.dtype,
                "kernel_time": int(r.kernel_time),
                "kernel_share_pct": op_share,
                "kernels": [{"name": n, "gpu_time": t} for n, t in names],
            }
        )
        if len(parts) < SHOWN_OPS:
            shown = ", ".join(f"{short(n, 60)} {fmt_time(t)}" for n, t in names[:SHOWN_KERNELS])
            more = len(names) - SHOWN_KERNELS
            shown += f" and {more} more kernel{'s' if more > 1 else ''}" if more > 0 else ""
            direction = f" {r.direction}" if isinstance(r.direction, str) and r.direction else ""
            parts.append(f"{r.op_id} {short(r.name, 60)}{direction} ({r.dtype}; {shown}; {fmt_pct(op_share)})")
    n, m = len(flagged), len(tc_ops)
    rest = n - len(parts)
    precisions = ", ".join(tc_types) if tc_types else "precision not shown"
    wide_names = sorted({"FP64" if t in ("float64", "double", "fp64") else "FP32" for t in flagged["dtype"]})
    problem = (
        f"{n} Tensor Core eligible op{'s' if n > 1 else ''} ran in {'/'.join(wide_names)} without Tensor Cores "
        f"while {m} other op{'s' if m > 1 else ''} used Tensor Cores ({precisions}): {fmt_time(time)}, "
        f"{fmt_pct(share)} of the GPU kernel time: " + "; ".join(parts) + (f"; and {rest} more" if rest > 0 else "")
    )
    advice = []
    if set(tc_types) & HALF_TYPES:
        advice.append(
            "Run them in the 16-bit type of the other ops: with torch.autocast, call them inside the autocast "
            "region (a layer called outside `with torch.autocast(...)`, under `autocast(enabled=False)`, or fed "
            "tensors cast with .float() or .double() stays in full precision); with a model cast by .half() or "
            ".to(torch.bfloat16), cast these layers' weights and inputs too"
        )
    advice.append(
        "where they must stay in FP32, let them use TF32 Tensor Cores (Ampere and newer): "
        "torch.backends.cuda.matmul.allow_tf32 = True (or torch.set_float32_matmul_precision('high')) for "
        "matmuls and linear layers, torch.backends.cudnn.allow_tf32 = True for convolutions"
    )
    data = {
        "ops": details,
        "n_ops": n,
        "kernel_time": time,
        "kernel_share_pct": share,
        "tensor_core_ops": m,
        "tensor_core_precisions": tc_types,
        "op_ids": flagged["op_id"].head(100).tolist(),
    }
    severity = "warning" if share >= WARNING_SHARE_PCT else "info"
    return [
        finding(
            "missed_tensor_cores_detector",
            severity,
            problem,
            _sentence("; ".join(advice)),
            MIXED_PRECISION_LINK,
            data,
            {"type": "show_ops", "op_ids": data["op_ids"]},
        )
    ]


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:]


def _tc_precisions(ctx: Context, tc_ops: pd.DataFrame) -> list[str]:
    """The data types the Tensor Core ops ran in: what their kernels' names show, else their markers' type."""
    given = tc_ops["data_type"].to_numpy(dtype=object)
    shown = tc_ops["kernel_data_type"].to_numpy(dtype=object) if "kernel_data_type" in tc_ops else given
    types = normalized_types(np.where(pd.isna(shown), given, shown))
    return sorted(set(types.tolist()) - {""})


def _kernels_of(ctx: Context, op_indices: np.ndarray) -> dict:
    """Per op index: [(kernel name, accumulated time)], longest first."""
    k = ctx.kernels
    if len(k) == 0:
        return {}
    sub = k[np.isin(k["op_index"].to_numpy(np.int64), op_indices)]
    sub = sub.groupby(["op_index", "name"], sort=False)["gpu_total"].sum().reset_index()
    sub = sub.sort_values(["op_index", "gpu_total", "name"], ascending=[True, False, True], kind="stable")
    out: dict = {}
    for op, name, total in zip(sub["op_index"].tolist(), sub["name"].tolist(), sub["gpu_total"].tolist()):
        out.setdefault(int(op), []).append((str(name), int(total)))
    return out
