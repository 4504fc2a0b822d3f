"""Tensor Core detection: kernel-name rules and op-type eligibility (reference/tensor_cores.md).

Rules are ordered, negatives first; the id of the deciding rule is kept so reports are auditable. The
established PyProf/Kineto substring list is the baseline; Hopper/Blackwell patterns are a separate,
versioned heuristic set.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

RULESET_VERSION = "2026.1"

# Substrings from NVIDIA PyProf's TC list (also Kineto's), plus XProf's i16832.
BASELINE_SUBSTRINGS = (
    "h884",
    "s884",
    "h1688",
    "s1688",
    "hmma",
    "i8816",
    "16816",
    "c1688",
    "i16832",
    "dgrad_1x1_stride_2x2",
    "first_layer_wgrad_kernel",
    "conv1x1",
    "conv2d_c1_k1",
    "direct_group",
    "xmma_implicit_gemm",
    "xmma_sparse_conv",
    "xmma_warp_specialized_implicit_gemm",
    "xmma_gemm",
    "xmma_sparse_gemm",
)

# (rule id, regex, uses TC). Checked in order on the short and the demangled name; first match decides.
RULES = (
    ("neg:ffma", re.compile(r"_ffma_|ffma_"), False),
    (
        "neg:simt-gemm",
        re.compile(
            r"(?<!tensorop_)(?<![hsi])sgemm(?!.*tensorop)|scudnn|gcgemm|gemv|gemmSN|fft2d|"
            r"winograd(?!.*fused)"
        ),
        False,
    ),
    ("tc:mma-shape", re.compile(r"tensor\d+x\d+x\d+"), True),
    ("tc:mma-code", re.compile(r"(?:^|_)[hsic]?(?:884|1688|16816|16832|8816)|hmma|imma|bmma|dmma"), True),
    ("tc:cutlass-tensorop", re.compile(r"cutlass.*tensorop|cutlass3x_sm\d+_tensorop"), True),
    ("tc:xmma-conv", re.compile(r"xmma_(?:implicit_gemm|fprop|dgrad|wgrad)"), True),
    ("tc:baseline", re.compile("|".join(re.escape(s) for s in BASELINE_SUBSTRINGS)), True),
    ("tc:nvjet", re.compile(r"^nvjet_"), True),
    ("tc:gmma", re.compile(r"gmma|UMMA|tcgen05|SM90_\d+x\d+x\d+_F|SM100_MMA", re.IGNORECASE), True),
    ("tc:attention", re.compile(r"flash_fwd|flash_bwd|fmha|cutlass::fmha|efficient_attention"), True),
)

PYTORCH_ELIGIBLE = {
    "_convolution",
    "_convolution_nogroup",
    "conv1d",
    "conv2d",
    "conv3d",
    "conv_tbc",
    "conv_transpose1d",
    "conv_transpose2d",
    "conv_transpose3d",
    "convolution",
    "cudnn_convolution",
    "cudnn_convolution_transpose",
    "prelu",
    "addmm",
    "addmv",
    "addr",
    "matmul",
    "mm",
    "mv",
    "linear",
    "addbmm",
    "baddbmm",
    "bmm",
    "chain_matmul",
    "linalg_multi_dot",
    "_thnn_fused_lstm_cell",
    "_thnn_fused_gru_cell",
    "lstm_cell",
    "gru_cell",
    "rnn_tanh_cell",
    "rnn_relu_cell",
    "addmm_",
    "cudnn_convolution_backward",
    "cudnn_convolution_backward_input",
    "cudnn_convolution_backward_weight",
    "cudnn_convolution_transpose_backward",
    "cudnn_convolution_transpose_backward_input",
    "cudnn_convolution_transpose_backward_weight",
    "convolution_backward",
    "scaled_dot_product_attention",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
    "_flash_attention_forward",
    "_flash_attention_backward",
    "_efficient_attention_forward",
    "_efficient_attention_backward",
    "_scaled_mm",
    "_int_mm",
    "lstm",
    "gru",
    "rnn_tanh",
    "rnn_relu",
    "_cudnn_rnn",
    "_cudnn_rnn_backward",
    "einsum",
    "tensordot",
    # backward nodes, compared after stripping the trailing version digit
    "CudnnConvolutionBackward",
    "CudnnConvolutionTransposeBackward",
    "ConvolutionBackward",
    "BmmBackward",
    "MmBackward",
    "AddmmBackward",
    "AddmvBackward",
    "MvBackward",
    "AddbmmBackward",
    "BaddbmmBackward",
    "ScaledDotProductFlashAttentionBackward",
    "ScaledDotProductEfficientAttentionBackward",
    "LinearBackward",
    "CudnnRnnBackward",
    # functional / module names used by DLProf markers
    "Linear",
    "Conv1d",
    "Conv2d",
    "Conv3d",
    "LSTM",
    "GRU",
    "RNN",
    "MultiheadAttention",
}
TENSORFLOW_ELIGIBLE = {
    "Conv2D",
    "Conv2DBackpropInput",
    "Conv2DBackpropFilter",
    "Conv3D",
    "Conv3DBackpropInputV2",
    "Conv3DBackpropFilterV2",
    "DepthwiseConv2dNative",
    "DepthwiseConv2dNativeBackpropInput",
    "DepthwiseConv2dNativeBackpropFilter",
    "MatMul",
    "BatchMatMul",
    "BatchMatMulV2",
    "BatchMatMulV3",
    "_FusedConv2D",
    "_FusedMatMul",
    "CudnnRNN",
    "CudnnRNNV2",
    "CudnnRNNV3",
    "CudnnRNNBackprop",
    "CudnnRNNBackpropV2",
    "CudnnRNNBackpropV3",
    "BlockLSTM",
    "BlockLSTMV2",
    "BlockLSTMGrad",
    "Einsum",
    "XlaDot",
}
TENSORRT_ELIGIBLE_PATTERN = re.compile(r"conv|gemm|matmul|fullyconnected|fc|attention|deconv", re.IGNORECASE)
_TRAILING_DIGITS = re.compile(r"\d+$")


def kernel_tc_rule(name: str, long_name: str | None = None) -> str | None:
    """Id of the rule deciding a kernel name, or None when no rule matches (no Tensor Cores)."""
    for rule_id, pattern, _ in RULES:
        if pattern.search(name) or (long_name and long_name != name and pattern.search(long_name)):
            return rule_id
    return None


def _name_codes(values) -> tuple[np.ndarray, np.ndarray]:
    """(code per row, distinct names) with missing names as "": a categorical's own codes (no string per
    row), other arrays factorized."""
    if isinstance(getattr(values, "dtype", None), pd.CategoricalDtype):
        cat = pd.Categorical(values)
        codes = np.asarray(cat.codes, dtype=np.int64)
        names = np.append(cat.categories.to_numpy(dtype=object), "")
        return np.where(codes >= 0, codes, names.size - 1), names
    codes, uniques = pd.factorize(pd.Series(values, dtype=object).fillna("").to_numpy(dtype=object))
    return codes, np.asarray(uniques, dtype=object)


def kernel_uses_tc(names, long_names) -> tuple[np.ndarray, np.ndarray]:
    """Uses-TC flags and deciding rule ids for arrays of kernel names, plain or categorical (each distinct
    pair evaluated once)."""
    if len(names) == 0:
        return np.zeros(0, dtype=bool), np.zeros(0, dtype=object)
    name_codes, name_values = _name_codes(names)
    long_codes, long_values = _name_codes(long_names)
    codes, uniques = pd.factorize(name_codes.astype(np.int64) * max(len(long_values), 1) + long_codes)
    width = max(len(long_values), 1)
    rules = [kernel_tc_rule(name_values[u // width], long_values[u % width]) for u in uniques]
    decided = {rid: uses for rid, _, uses in RULES}
    uses = np.array([decided.get(r, False) if r else False for r in rules], dtype=bool)
    rule_ids = np.array([r or "" for r in rules], dtype=object)
    return uses[codes], rule_ids[codes]


def op_tc_eligible(op_type: str, label: str, family: str | None) -> bool:
    """Whether an op of this type could use Tensor Cores in its framework."""
    if family == "tensorflow":
        base = op_type.split("/")[-1]
        return base in TENSORFLOW_ELIGIBLE or base.startswith("BatchMatMul") or base.startswith("CudnnRNN")
    if family == "tensorrt":
        return bool(TENSORRT_ELIGIBLE_PATTERN.search(op_type))
    if family == "pytorch":
        for candidate in (op_type, label):
            if not candidate:
                continue
            bare = candidate[6:] if candidate.startswith("aten::") else candidate
            if bare in PYTORCH_ELIGIBLE or _TRAILING_DIGITS.sub("", bare) in PYTORCH_ELIGIBLE:
                return True
        return False
    return False


# Precision a kernel's name shows (cuBLAS/cuDNN/CUTLASS/xmma/ATen naming), checked in order: bf16 before f16.
KERNEL_PRECISION = (
    ("bfloat16", re.compile(r"bf16|bfloat16", re.IGNORECASE)),
    ("float16", re.compile(r"f16|fp16|half|hmma|h884|h1688|h16816|__half", re.IGNORECASE)),
    ("int8", re.compile(r"(?:^|_)i8|int8|imma|i8816|i16832|s8", re.IGNORECASE)),
    ("float64", re.compile(r"dgemm|fp64|f64|double|dmma", re.IGNORECASE)),
    ("float32", re.compile(r"sgemm|fp32|f32|tf32|<float|float>|scudnn|s884|s1688|s16816", re.IGNORECASE)),
)


def kernel_precision(name: str) -> str | None:
    """The data type a kernel's name shows (`volta_sgemm_...` float32, `..._h884...` float16), or None."""
    for dtype, pattern in KERNEL_PRECISION:
        if pattern.search(name or ""):
            return dtype
    return None


def precision_by_op(kernels: pd.DataFrame) -> pd.Series:
    """Per op_index, the data type its kernels' names show, weighted by kernel time (kernels: the
    aggregation's per (kernel name, op) table with name, op_index, gpu_total)."""
    if len(kernels) == 0:
        return pd.Series(dtype=object)
    names = kernels["name"].to_numpy(dtype=object)
    codes, uniques = pd.factorize(names)
    precision = np.array([kernel_precision(str(u)) for u in uniques] + [None], dtype=object)
    frame = pd.DataFrame(
        {
            "op": kernels["op_index"].to_numpy(np.int64),
            "dtype": precision[np.where(codes >= 0, codes, len(uniques))],
            "time": kernels["gpu_total"].to_numpy(np.int64),
        }
    )
    frame = frame[frame["dtype"].notna()]
    if frame.empty:
        return pd.Series(dtype=object)
    per = frame.groupby(["op", "dtype"])["time"].sum().reset_index()
    per = per.sort_values(["op", "time", "dtype"], ascending=[True, False, True]).drop_duplicates("op")
    return pd.Series(per["dtype"].to_numpy(dtype=object), index=per["op"].to_numpy(np.int64))
