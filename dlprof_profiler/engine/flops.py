"""FLOPs of framework ops from their input shapes, achieved TFLOP/s and Model FLOPs Utilization (DESIGN.md
"FLOPs").

An op's FLOPs per call come from its first call (the call whose Input Shapes the detailed report shows): the
trace's own `flops` argument when the call carries one (Kineto, `parameters` text `flops=N`), else the formula
of its op type over its input (and output) shapes, else, for a backward (bprop) op, twice the FLOPs of the
forward op of its name. The formulas are pure functions over DLProf's shape texts (`<N:4, K:1024>; <M:32,
K:1024>; <32>`), evaluated once per distinct (op type, input shapes, output shapes, parameters), never per call.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from dlprof_profiler.engine import gpu_peaks

# A backward call computes the gradient of each input that requires it with GEMMs (convolutions) of the
# forward's size: for mm/linear/conv the input gradient and the weight gradient, for attention dQ, dK, dV and
# dP (the recomputation of QK^T in fused kernels is not counted: model FLOPs, as MFU defines them).
BACKWARD_FACTOR = 2
FIRST_CALL_COLUMNS = ("input_shapes", "output_shapes", "parameters")
INT64_MAX = int(np.iinfo(np.int64).max)
UNKNOWN = -1  # int64 stand-in for an unknown FLOPs figure inside this module

_TENSOR = re.compile(r"<([^<>]*)>")
_DIM = re.compile(r"(?:[A-Za-z_]\w*:)?\s*(-?\d+)")
_TRACE_FLOPS = re.compile(r"(?:^|,\s*)flops=(\d+)\s*(?:,|$)")


# ---------------------------------------------------------------------------- shape texts


def parse_shapes(text) -> list[list[int]]:
    """The tensors of a shape text, in order, 0-dimensional ones left out (Kineto's `Input Dims` drop them,
    so positions agree across sources): `<N:4, K:8>; <>; <8>` -> [[4, 8], [8]]."""
    if not isinstance(text, str) or not text:
        return []
    out = []
    for body in _TENSOR.findall(text):
        dims = [int(d) for d in _DIM.findall(body)]
        if dims:
            out.append(dims)
    return out


def trace_flops(parameters) -> int | None:
    """The profiler's own FLOPs figure of a call (`flops=N` in its parameters: Kineto's `flops` argument)."""
    if not isinstance(parameters, str) or "flops=" not in parameters:
        return None
    match = _TRACE_FLOPS.search(parameters)
    return int(match.group(1)) if match else None


def _prod(dims) -> int:
    out = 1
    for d in dims:
        out *= int(d)
    return out


def _valid(value: int) -> int | None:
    return value if 0 <= value <= INT64_MAX else None


# ---------------------------------------------------------------------------- formulas


def mm_flops(a: list[int], b: list[int]) -> int | None:
    """[m, k] x [k, n]: 2mkn (one multiply and one add per term of every output element)."""
    if len(a) != 2 or len(b) != 2 or a[1] != b[0]:
        return None
    return 2 * a[0] * a[1] * b[1]


def addmm_flops(shapes: list[list[int]]) -> int | None:
    """addmm(C, A[m, k], B[k, n]) = beta C + alpha AB: the product's 2mkn; the m x n scaled additions of C are
    not counted (elementwise work, as FlopCounterMode and the MFU convention leave it out). A 0-d C is not
    in the shapes (see parse_shapes)."""
    a, b = (shapes[1], shapes[2]) if len(shapes) >= 3 else (shapes[0], shapes[1]) if len(shapes) == 2 else (None, None)
    return mm_flops(a, b) if a is not None else None


def bmm_flops(a: list[int], b: list[int]) -> int | None:
    """[b, m, k] x [b, k, n]: 2bmkn."""
    if len(a) != 3 or len(b) != 3 or a[0] != b[0] or a[2] != b[1]:
        return None
    return 2 * a[0] * a[1] * a[2] * b[2]


def baddbmm_flops(shapes: list[list[int]]) -> int | None:
    """baddbmm(C, A[b, m, k], B[b, k, n]): the batched product's 2bmkn (C's additions not counted)."""
    a, b = (shapes[1], shapes[2]) if len(shapes) >= 3 else (shapes[0], shapes[1]) if len(shapes) == 2 else (None, None)
    return bmm_flops(a, b) if a is not None else None


def matmul_flops(a: list[int], b: list[int]) -> int | None:
    """torch.matmul: a 1-d operand is a row (left) or column (right) vector; leading dimensions broadcast:
    2 x (broadcast batch) x m x k x n."""
    if not a or not b:
        return None
    m, k = (1, a[0]) if len(a) == 1 else (a[-2], a[-1])
    k2, n = (b[0], 1) if len(b) == 1 else (b[-2], b[-1])
    if k != k2:
        return None
    batch_a, batch_b = a[:-2], b[:-2]
    width = max(len(batch_a), len(batch_b))
    batch_a = [1] * (width - len(batch_a)) + list(batch_a)
    batch_b = [1] * (width - len(batch_b)) + list(batch_b)
    batch = 1
    for x, y in zip(batch_a, batch_b):
        if x != y and 1 not in (x, y):
            return None
        batch *= max(x, y)
    return 2 * batch * m * k * n


def linear_flops(x: list[int], w: list[int]) -> int | None:
    """linear(x[..., k], W[n, k], b): 2 x (rows of x) x k x n (the bias additions not counted)."""
    if not x or len(w) != 2 or x[-1] != w[1]:
        return None
    return 2 * _prod(x[:-1]) * w[1] * w[0]


def conv_flops(nd: int, transposed: bool, x: list[int], w: list[int], out: list[int] | None) -> int | None:
    """Convolution of `nd` spatial dimensions, input x [N, C_in, *spatial] (or unbatched [C_in, *spatial]),
    weight [C_out, C_in / groups, *kernel] ([C_in, C_out / groups, *kernel] when transposed): every output
    element sums C_in / groups x prod(kernel) products, so 2 x prod(output) x prod(weight[1:]); transposed,
    every input element scatters into C_out / groups x prod(kernel) outputs: 2 x prod(input) x prod(weight[1:]).
    Groups need no parameter (the weight's second dimension holds them), strides, padding and dilation none
    either once the output shape is known (the markers compute it from them)."""
    if len(w) != nd + 2 or len(x) not in (nd + 1, nd + 2):
        return None
    channels = x[1] if len(x) == nd + 2 else x[0]
    if transposed:
        if channels != w[0]:
            return None
        return 2 * _prod(x) * _prod(w[1:])
    if w[1] <= 0 or channels % w[1] or not out or len(out) != len(x):
        return None
    if (out[1] if len(out) == nd + 2 else out[0]) != w[0]:
        return None
    return 2 * _prod(out) * _prod(w[1:])


def attention_flops(layout: str, q: list[int], k: list[int], v: list[int]) -> int | None:
    """Scaled dot-product attention, q [..., L, E], k [..., S, E], v [..., S, Ev] (layout "bhsd"; "bshd":
    [B, L, H, E], the layout of the flash/efficient kernels' own entry points): QK^T takes 2 x L x S x E and
    the product with V 2 x L x S x Ev per batch and head (softmax and scaling not counted; no discount for
    a causal mask, as FlopCounterMode and the PaLM MFU formula count it)."""
    if layout == "bshd":
        if len(q) != 4 or len(k) != 4 or len(v) != 4:
            return None
        batch_heads, seq_q, e, seq_k, ev = q[0] * q[2], q[1], q[3], k[1], v[3]
        if k[3] != e or v[1] != seq_k:
            return None
    else:
        if len(q) < 2 or len(k) < 2 or len(v) < 2:
            return None
        batch_heads, seq_q, e, seq_k, ev = _prod(q[:-2]), q[-2], q[-1], k[-2], v[-1]
        if k[-1] != e or v[-2] != seq_k:
            return None
    return 2 * batch_heads * seq_q * seq_k * (e + ev)


# op type (ATen name without `aten::`, torch.nn.functional and Tensor method names) -> its rule
_MM = ("mm", "_int_mm", "_scaled_mm")
_SDPA_BHSD = (
    "scaled_dot_product_attention",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_attention_math",
)
_SDPA_BSHD = ("_flash_attention_forward", "_efficient_attention_forward")
# the backward entry points, when an op of their own: (grad_out, q, k, v, ...) -> BACKWARD_FACTOR x forward
_SDPA_BACKWARD_BHSD = (
    "_scaled_dot_product_flash_attention_backward",
    "_scaled_dot_product_flash_attention_for_cpu_backward",
    "_scaled_dot_product_efficient_attention_backward",
    "_scaled_dot_product_cudnn_attention_backward",
)
_SDPA_BACKWARD_BSHD = ("_flash_attention_backward", "_efficient_attention_backward")
BACKWARD_TYPES = frozenset(_SDPA_BACKWARD_BHSD + _SDPA_BACKWARD_BSHD)
_CONV = re.compile(r"^conv(_transpose)?([123])d$")


def formula_flops(op_type, input_shapes, output_shapes=None) -> int | None:
    """FLOPs of one call of an op of this type from its first call's shape texts; None when the type has no
    formula or the shapes do not fit it."""
    if not isinstance(op_type, str):
        return None
    kind = _bare(op_type)
    s = parse_shapes(input_shapes)
    value = None
    if kind in _MM and len(s) >= 2:
        value = mm_flops(s[0], s[1])
    elif kind == "addmm":
        value = addmm_flops(s)
    elif kind == "bmm" and len(s) >= 2:
        value = bmm_flops(s[0], s[1])
    elif kind == "baddbmm":
        value = baddbmm_flops(s)
    elif kind in ("matmul", "__matmul__") and len(s) >= 2:
        value = matmul_flops(s[0], s[1])
    elif kind == "__rmatmul__" and len(s) >= 2:  # self.__rmatmul__(other) = other @ self
        value = matmul_flops(s[1], s[0])
    elif kind == "linear" and len(s) >= 2:
        value = linear_flops(s[0], s[1])
    elif kind in _SDPA_BHSD and len(s) >= 3:
        value = attention_flops("bhsd", s[0], s[1], s[2])
    elif kind in _SDPA_BSHD and len(s) >= 3:
        value = attention_flops("bshd", s[0], s[1], s[2])
    elif kind in _SDPA_BACKWARD_BHSD + _SDPA_BACKWARD_BSHD and len(s) >= 4:
        forward = attention_flops("bshd" if kind in _SDPA_BACKWARD_BSHD else "bhsd", s[1], s[2], s[3])
        value = None if forward is None else BACKWARD_FACTOR * forward
    else:
        match = _CONV.match(kind)
        if match and len(s) >= 2:
            out = parse_shapes(output_shapes)
            value = conv_flops(int(match.group(2)), bool(match.group(1)), s[0], s[1], out[0] if out else None)
    return None if value is None else _valid(value)


# ---------------------------------------------------------------------------- per op


def op_flops(ops: pd.DataFrame, first: dict) -> pd.Series:
    """FLOPs per call of every op (pandas Int64, <NA> where unknown; same index as `ops`). `first`: per row
    of `ops`, the FIRST_CALL_COLUMNS of its first call (arrays aligned with `ops`).

    Precedence: the first call's own `flops` figure (the trace's); else, for an fprop (or direction-less) op,
    the formula of its op type over its shapes; for a bprop op, the formula of a backward op type (the
    attention backward entry points), else BACKWARD_FACTOR x the FLOPs of the fprop op of its name (see
    `_backward_from_forward`): a bprop op's recorded shapes are the forward call's (dlprof's markers) or the
    gradients' (autograd nodes), neither of which says which gradients it computed."""
    n = len(ops)
    if n == 0:
        return pd.Series(pd.array([], dtype="Int64"), index=ops.index)
    keys = pd.DataFrame(
        {
            "op_type": ops["op_type"].to_numpy(dtype=object),
            **{c: pd.Series(first[c], dtype=object).to_numpy(dtype=object) for c in FIRST_CALL_COLUMNS},
        }
    ).fillna("")
    codes, distinct = pd.factorize(pd.MultiIndex.from_frame(keys))
    given = np.array([_or_unknown(trace_flops(params)) for _, _, _, params in distinct], dtype=np.int64)[codes]
    formula = np.array([_or_unknown(formula_flops(t, i, o)) for t, i, o, _ in distinct], dtype=np.int64)[codes]
    backward_type = np.array([_bare(t) in BACKWARD_TYPES for t, _, _, _ in distinct], dtype=bool)[codes]
    bprop = ops["direction"].fillna("").to_numpy(dtype=object) == "bprop"
    own = np.where(given >= 0, given, np.where(~bprop | backward_type, formula, UNKNOWN))
    value = np.where(bprop & (own < 0), _backward_from_forward(ops, own), own)
    return pd.Series(pd.arrays.IntegerArray(np.where(value >= 0, value, 0), value < 0), index=ops.index)


def _or_unknown(value) -> int:
    return UNKNOWN if value is None or _valid(value) is None else int(value)


def _bare(op_type) -> str:
    text = str(op_type)
    return text[6:] if text.startswith("aten::") else text


def _backward_from_forward(ops: pd.DataFrame, own: np.ndarray) -> np.ndarray:
    """Per op, BACKWARD_FACTOR x the FLOPs of the fprop op of its name (UNKNOWN where there is none): the one
    value of all fprop ops of that name when they agree; when they differ (the name's n-th calls have other
    shapes) and the name has as many bprop as fprop ops, the fprop op in reverse execution order (autograd
    runs a name's backward calls in the reverse order of its forward calls); else unknown."""
    frame = pd.DataFrame(
        {
            "name": ops["name"].to_numpy(dtype=object),
            "direction": ops["direction"].fillna("").to_numpy(dtype=object),
            "op_index": ops["op_index"].to_numpy(np.int64),
            "own": own,
            "row": np.arange(len(ops)),
        }
    ).sort_values("op_index", kind="stable")
    out = np.full(len(ops), UNKNOWN, dtype=np.int64)
    fwd = frame[frame["direction"] == "fprop"].copy()
    bwd = frame[frame["direction"] == "bprop"].copy()
    if fwd.empty or bwd.empty:
        return out
    fwd["k"] = fwd.groupby("name", sort=False).cumcount()
    fwd["known"] = fwd["own"] >= 0
    stats = fwd.groupby("name", sort=False).agg(
        n=("own", "size"), known=("known", "sum"), lo=("own", "min"), hi=("own", "max")
    )
    bwd["k"] = bwd.groupby("name", sort=False).cumcount()
    bwd["n_b"] = bwd.groupby("name", sort=False)["op_index"].transform("size")
    bwd = bwd.join(stats, on="name", how="inner")
    uniform = (bwd["known"] == bwd["n"]) & (bwd["lo"] == bwd["hi"])
    pairs = bwd.assign(k=(bwd["n"] - 1 - bwd["k"]).where(bwd["n"] == bwd["n_b"], -1))
    paired = pairs.merge(fwd[["name", "k", "own"]].rename(columns={"own": "fwd"}), on=["name", "k"], how="left")
    forward = np.where(
        uniform.to_numpy(),
        bwd["lo"].to_numpy(np.int64),
        paired["fwd"].fillna(UNKNOWN).to_numpy(np.int64),
    )
    ok = (forward >= 0) & (forward <= INT64_MAX // BACKWARD_FACTOR)
    out[bwd["row"].to_numpy(np.int64)] = np.where(ok, forward * BACKWARD_FACTOR, UNKNOWN)
    return out


def achieved_tflops(flops, gpu_ns) -> np.ndarray:
    """TFLOP/s of FLOPs done in GPU nanoseconds (1 FLOP/ns = 10^-3 TFLOP/s); NaN where either is unknown or
    the GPU time is 0."""
    f = pd.to_numeric(pd.Series(flops), errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    t = pd.to_numeric(pd.Series(gpu_ns), errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(t > 0, f / t / 1e3, np.nan)


def with_op_flops(ops: pd.DataFrame, flops_per_call: pd.Series, input_shapes: pd.Series | None = None) -> pd.DataFrame:
    """The aggregation's op table with `flops_per_call` (Int64; by op_index) and `achieved_tflops` (its calls'
    FLOPs over their total GPU time), and `input_shapes` of the first call when given (by op_index)."""
    out = ops.copy()
    idx = out["op_index"].to_numpy(np.int64)
    per_call = flops_per_call.reindex(idx)
    out["flops_per_call"] = pd.array(per_call.to_numpy(dtype=object), dtype="Int64")
    total = out["flops_per_call"].astype("Float64") * out["calls"].astype("Float64")
    out["achieved_tflops"] = achieved_tflops(total, out["gpu_total"])
    if input_shapes is not None:
        out["input_shapes"] = pd.Series(input_shapes.reindex(idx).to_numpy(dtype=object), index=out.index, dtype=object)
    return out


# ---------------------------------------------------------------------------- summary


_PRECISION_OF_TYPE = {
    "float16": "fp16",
    "half": "fp16",
    "fp16": "fp16",
    "bfloat16": "bf16",
    "bf16": "bf16",
    "int8": "int8",
    "uint8": "int8",
    "qint8": "int8",
    "quint8": "int8",
    "float32": "fp32",
    "float": "fp32",
    "fp32": "fp32",
    "tf32": "tf32",
}


def peak_precision(kernel_data_type, data_type, using_tc: bool, amp: bool | None) -> str | None:
    """The precision whose peak an op's FLOPs are measured against: the one its kernels' names show (what ran),
    else its markers' data type; FP32 on Tensor Cores is TF32; FP32 from the markers on Tensor Cores while
    AMP is on ran in autocast's 16-bit type (fp16 and bf16 peaks are equal wherever both exist); float8 types
    are fp8. None: no peak (FP64, unknown)."""
    shown = _type_name(kernel_data_type)
    given = _type_name(data_type)
    name = shown or given
    if not name:
        return None
    precision = "fp8" if name.startswith("float8") else _PRECISION_OF_TYPE.get(name)
    if precision == "fp32" and using_tc:
        return "fp16" if (not shown and amp) else "tf32"
    return precision


def _type_name(value) -> str:
    if value is None or (isinstance(value, float) and np.isnan(value)) or value is pd.NA:
        return ""
    text = str(value).strip().lower().replace("torch.", "")
    return text[3:] if text.startswith("dt_") else text


def summary_figures(ops: pd.DataFrame, devices: pd.DataFrame, wall_ns: int, n_gpus: int, amp) -> dict:
    """`achieved_tflops`: the FLOPs of the ops with known FLOPs and GPU time over that GPU time; `mfu_pct`:
    100 x sum over those ops of FLOPs / peak(op's GPU, op's precision), over the wall clock time x GPUs used,
    the ops without a peak left out; each None when nothing is known."""
    out = {"achieved_tflops": None, "mfu_pct": None}
    if ops is None or len(ops) == 0 or "flops_per_call" not in ops:
        return out
    per_call = ops["flops_per_call"].astype("Float64").to_numpy(dtype=np.float64, na_value=np.nan)
    total = per_call * ops["calls"].to_numpy(np.float64)
    gpu = ops["gpu_total"].to_numpy(np.float64)
    known = ~np.isnan(total) & (gpu > 0)
    if not known.any():
        return out
    out["achieved_tflops"] = float(achieved_tflops(total[known].sum(), gpu[known].sum())[0])
    if wall_ns <= 0 or n_gpus <= 0:
        return out
    names = {}
    if devices is not None and len(devices):
        names = dict(zip(devices["device_id"].to_numpy(np.int64).tolist(), devices["name"].tolist()))
    sub = ops[known]
    facts = pd.DataFrame(
        {
            "device": sub["device_id"].to_numpy(np.int64),
            "kernel_type": sub["kernel_data_type"].to_numpy(dtype=object) if "kernel_data_type" in sub else None,
            "data_type": sub["data_type"].to_numpy(dtype=object),
            "tc": sub["using_tc"].to_numpy(dtype=bool),
        }
    )
    codes, distinct = pd.factorize(pd.MultiIndex.from_frame(facts.astype(object).fillna("")))
    peak_of = np.array(
        [
            gpu_peaks.peak_tflops(names.get(int(d)), peak_precision(k, t, bool(c), amp)) or np.nan
            for d, k, t, c in distinct
        ]
        + [np.nan],
        dtype=np.float64,
    )
    peaks = peak_of[codes]
    has_peak = ~np.isnan(peaks)
    if not has_peak.any():
        return out
    ideal_ns = (total[known][has_peak] / (peaks[has_peak] * 1e3)).sum()  # ns at peak: FLOPs / (FLOP per ns)
    out["mfu_pct"] = float(100.0 * ideal_ns / (wall_ns * n_gpus))
    return out
