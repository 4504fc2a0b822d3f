"""Tensor Core detectors: AMP not used (DLProf's amp_detector); eligible ops kept off Tensor Cores by their
dimensions or data type (bad_tensor_shape_detector)."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from dlprof_profiler.experts.base import Context, finding, fmt_pct, fmt_time, short

AMP_LINK = "https://developer.nvidia.com/automatic-mixed-precision"
SHAPE_LINK = "https://docs.nvidia.com/deeplearning/performance/dl-performance-matrix-multiplication/index.html"

HALF_TYPES = {"float16", "half", "fp16", "bfloat16", "bf16", "float8_e4m3fn", "float8_e5m2", "fp8"}
INT8_TYPES = {"int8", "qint8", "uint8", "quint8"}
FP32_TYPES = {"float32", "float", "fp32", "single", "tf32"}
# Kernel names that show 16-bit math (cuDNN/cuBLAS/CUTLASS/xmma naming): positive evidence of FP16/BF16.
HALF_KERNEL = re.compile(r"f16|half|hmma|h884|h1688|h16816|bf16", re.IGNORECASE)

# bad_tensor_shape_detector: report when the flagged ops take at least this share of the kernel time.
MIN_SHARE_PCT = 1.0
WARNING_SHARE_PCT = 10.0
# Dimension multiples cuBLAS/cuDNN need to pick Tensor Core kernels (NVIDIA's matrix multiplication guide).
MULTIPLE_16BIT, MULTIPLE_INT8 = 8, 16
_GEMM_LABELS = {"N", "C", "K", "M"}  # batch, input channels / inner dim, output channels / outer dim
_TENSOR = re.compile(r"<([^<>]*)>")
_DIM = re.compile(r"(?:(\w+):)?\s*(-?\d+)")


def normalized_types(values) -> np.ndarray:
    """Lower-case data type names without TF's `DT_` prefix ('' when unknown)."""
    out = []
    for v in values:
        if v is None or (isinstance(v, float) and np.isnan(v)):
            out.append("")
        else:
            t = str(v).strip().lower()
            out.append(t[3:] if t.startswith("dt_") else t.replace("torch.", ""))
    return np.array(out, dtype=object)


def half_kernel_ops(ctx: Context) -> set:
    """Op indices with a kernel whose name shows 16-bit math."""
    k = ctx.kernels
    if len(k) == 0:
        return set()
    hit = ctx.kernel_name_flags(lambda name: HALF_KERNEL.search(name))
    return set(np.unique(k["op_index"].to_numpy(np.int64)[hit]).tolist())


def known_types(ops: pd.DataFrame) -> np.ndarray:
    """Each op's data type: from its markers, else the one its kernels' names show (sgemm: float32)."""
    given = ops["data_type"].to_numpy(dtype=object)
    if "kernel_data_type" not in ops:
        return given
    shown = ops["kernel_data_type"].to_numpy(dtype=object)
    return np.where(pd.isna(given), shown, given)


def eligible_ops(ctx: Context) -> pd.DataFrame:
    ops = ctx.agg.ops
    if ops is None or len(ops) == 0:
        return pd.DataFrame()
    return ops[ops["tc_eligible"].to_numpy(dtype=bool) & (ops["kernel_time"].to_numpy() > 0)]


def amp_detector(ctx: Context) -> list[dict]:
    """Inputs: TC-eligible ops with kernels in the aggregation, their data types and kernel names, and the
    run metadata amp_enabled / autocast. Fires when no eligible op shows FP16/BF16 (data type or kernel
    name) and AMP is known to be off, or, with AMP unknown, the eligible ops' known data types are all wider
    (backward ops often carry none)."""
    elig = eligible_ops(ctx)
    if elig.empty:
        return []
    types = normalized_types(known_types(elig))
    half_ops = half_kernel_ops(ctx)
    if np.isin(types, list(HALF_TYPES)).any() or half_ops & set(elig["op_index"].tolist()):
        return []
    amp = ctx.cfg_bool("amp_enabled", "autocast")
    if amp is True:
        return []
    if amp is None:
        known = sorted(set(types.tolist()) - {""})
        if not known:
            ctx.unknown(
                "amp_detector", "whether AMP is used (model_config amp_enabled; the eligible ops carry no data type)"
            )
            return []
        reason = "data types " + ", ".join(known)
    else:
        reason = "model_config amp_enabled = false"
    n = len(elig)
    time = int(elig["kernel_time"].sum())
    share = 100.0 * time / ctx.kernel_time if ctx.kernel_time else 0.0
    problem = (
        f"{n} ops were eligible to use tensor cores but none are using FP16 "
        f"({fmt_time(time)}, {fmt_pct(share)} of the GPU kernel time)"
    )
    recommendation = (
        "Try enabling AMP (Automatic Mixed Precision). For more information: "
        "https://developer.nvidia.com/automatic-mixed-precision"
    )
    order = elig.sort_values("kernel_time", ascending=False, kind="stable")
    data = {
        "eligible_ops": n,
        "kernel_time": time,
        "kernel_share_pct": share,
        "evidence": reason,
        "op_ids": order["op_id"].head(100).tolist(),
    }
    return [
        finding(
            "amp_detector",
            "warning",
            problem,
            recommendation,
            AMP_LINK,
            data,
            {"type": "show_ops", "filter": "is_bad_data_type", "op_ids": data["op_ids"]},
        )
    ]


def bad_dims(shapes: str, multiple: int) -> list[str]:
    """Dimensions of an op's input shapes that are not multiples of `multiple`: labelled batch/channel/GEMM
    dims (N, C, K, M), or the last dimension of the first two tensors when unlabelled."""
    out = []
    for i, tensor in enumerate(_TENSOR.findall(shapes or "")[:3]):
        dims = _DIM.findall(tensor)
        if not dims:
            continue
        labelled = any(label for label, _ in dims)
        for j, (label, value) in enumerate(dims):
            v = int(value)
            check = (label in _GEMM_LABELS) if labelled else (i < 2 and j == len(dims) - 1)
            if check and v > 0 and v % multiple:
                text = f"{label}:{v}" if label else str(v)
                if text not in out:
                    out.append(text)
    return out


def bad_tensor_shape_detector(ctx: Context) -> list[dict]:
    """Inputs: TC-eligible ops with kernels but no Tensor Core kernel, their data types, input shapes and
    kernel names, and amp_enabled. An op is flagged when it runs in FP16/BF16/INT8 (data type or kernel
    names) - its dimensions then keep it off Tensor Cores -, or in FP64/integer types, or in FP32 while AMP
    is on (it runs outside autocast); FP32 and FP64 ops are left to missed_tensor_cores_detector when other
    ops use Tensor Cores. Threshold: the flagged ops take >= MIN_SHARE_PCT (1%) of the kernel time; warning
    from WARNING_SHARE_PCT (10%)."""
    elig = eligible_ops(ctx)
    if elig.empty:
        return []
    cand = elig[~elig["using_tc"].to_numpy(dtype=bool)]
    if cand.empty:
        return []
    types = normalized_types(known_types(cand))
    half_ops = half_kernel_ops(ctx)
    amp = ctx.cfg_bool("amp_enabled", "autocast")
    is_half = np.isin(types, list(HALF_TYPES)) | cand["op_index"].isin(half_ops).to_numpy()
    is_int8 = np.isin(types, list(INT8_TYPES)) & ~is_half
    is_fp32 = np.isin(types, list(FP32_TYPES)) & ~is_half
    unknown = (types == "") & ~is_half
    other = ~(is_half | is_int8 | is_fp32 | unknown)
    cause = np.full(len(cand), "", dtype=object)
    cause[is_half] = "dims"
    cause[is_int8] = "dims"
    cause[other] = "dtype"
    if amp is True:
        cause[is_fp32] = "dtype"
        cause[unknown] = "dims or dtype"
    if ctx.agg.ops["using_tc"].to_numpy(dtype=bool).any():  # reported by missed_tensor_cores_detector
        cause[is_fp32 | (other & np.isin(types, ["float64", "double", "fp64"]))] = ""
    flagged = cand[cause != ""].assign(
        cause=cause[cause != ""],
        dtype=types[cause != ""],
        multiple=np.where(is_int8[cause != ""], MULTIPLE_INT8, MULTIPLE_16BIT),
    )
    if amp is None and unknown.any():
        ctx.unknown(
            "bad_tensor_shape_detector",
            f"the data type of {int(unknown.sum())} eligible op(s) without "
            "Tensor Core kernels (op data types; model_config amp_enabled)",
        )
    if flagged.empty:
        return []
    time = int(flagged["kernel_time"].sum())
    share = 100.0 * time / ctx.kernel_time if ctx.kernel_time else 0.0
    if share < MIN_SHARE_PCT:
        return []
    flagged = flagged.sort_values("kernel_time", ascending=False, kind="stable")
    shapes = ctx.data.first_shapes(flagged["op_index"].head(5).to_numpy(np.int64))
    parts, details = [], []
    for r in flagged.head(5).itertuples(index=False):
        shape = shapes.get(int(r.op_index), "")
        dims = bad_dims(shape, int(r.multiple)) if "dims" in r.cause else []
        what = [r.dtype or "data type unknown", fmt_time(r.kernel_time)]
        if dims:
            what.append(f"{', '.join(dims)} not a multiple of {int(r.multiple)}")
        elif shape and "dims" in r.cause:
            what.append(f"shapes {short(shape, 60)}")
        parts.append(f"{r.op_id} {short(r.name, 60)} ({'; '.join(what)})")
        details.append(
            {
                "op_id": r.op_id,
                "name": r.name,
                "data_type": r.dtype,
                "kernel_time": int(r.kernel_time),
                "cause": r.cause,
                "input_shapes": shape,
                "bad_dims": dims,
            }
        )
    more = len(flagged) - 5
    problem = (
        f"{len(flagged)} Tensor Core eligible op{'s' if len(flagged) > 1 else ''} ran without Tensor Core "
        f"kernels ({fmt_time(time)}, {fmt_pct(share)} of the GPU kernel time): "
        + ", ".join(parts)
        + (f" and {more} more" if more > 0 else "")
    )
    causes = set(flagged["cause"].tolist())
    advice = []
    if causes & {"dims", "dims or dtype"}:
        advice.append(
            "Make their dimensions multiples of 8 for FP16/BF16 (16 for INT8): pad input and output "
            "channels, hidden and vocabulary sizes, and use batch sizes that are multiples of 8, so "
            "cuBLAS and cuDNN can pick Tensor Core kernels"
        )
    if causes & {"dtype", "dims or dtype"}:
        advice.append(
            "Run them in FP16/BF16: keep them inside the autocast region and feed them half-precision "
            "tensors (FP32 and FP64 inputs keep them off Tensor Cores)"
        )
    data = {
        "ops": details,
        "n_ops": len(flagged),
        "kernel_time": time,
        "kernel_share_pct": share,
        "op_ids": flagged["op_id"].head(100).tolist(),
    }
    severity = "warning" if share >= WARNING_SHARE_PCT else "info"
    return [
        finding(
            "bad_tensor_shape_detector",
            severity,
            problem,
            "; ".join(advice),
            SHAPE_LINK,
            data,
            {"type": "show_ops", "op_ids": data["op_ids"]},
        )
    ]
