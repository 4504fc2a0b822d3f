"""Classify NVTX range texts: framework-op markers (PyTorch, DLProf/PyProf dicts, TensorFlow, TensorRT)
versus scope ranges, and parse what the markers carry (label, type, seq, shapes, dtypes, stack traces).

Texts are parsed column-wise with Arrow compute kernels; the few texts that need Python parsing (dict
markers, shape lists) are parsed once per distinct text, never once per range.
"""
from __future__ import annotations

import ast
import json
import re

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

# Range kinds
SCOPE, PT_OP, DL_ARG, DL_TRACE, DL_MODULE, CONFIG, TF_OP, TRT_LAYER = range(8)
OP_MARKERS = (PT_OP, DL_ARG, TF_OP, TRT_LAYER)
WRAPPERS = (DL_TRACE, DL_MODULE)  # annotate the op marker inside them; neither ops nor scopes

FAMILY_PYTORCH, FAMILY_TENSORFLOW, FAMILY_TENSORRT = "pytorch", "tensorflow", "tensorrt"

MAX_DICT_TEXT = 200_000  # longer dict-like texts are not parsed (guard against pathological markers)

_PT_FIELDS = r", (?:seq|op_id|sizes|input_op_ids) = .*$"
_PT_OP_LABEL = re.compile(r"^(?:[A-Za-z_]\w*::[\w.]+|\w+Backward\d*|\w+_backward|"
                          r"autograd::engine::evaluate_function: .+)$")
_BACKWARD_LABEL = re.compile(r"(?:Backward\d*|_backward)$")
_EVALUATE_FN = "autograd::engine::evaluate_function: "
_TF_TEXT = r"^(?P<type>[A-Z][A-Za-z0-9_]*): (?P<node>\S*[A-Za-z_/]\S*)$"
_DATALOADER_LABEL = re.compile(r"^enumerate\(DataLoader\)#|DataLoaderIter.*__next__|^DALI[ :]|"
                               r"^IteratorGetNext|^MultiDeviceIteratorGetNextFromShard|^dataloader",
                               re.IGNORECASE)
_TF_DATALOADER_TYPES = {"IteratorGetNext", "IteratorGetNextSync", "MultiDeviceIteratorGetNextFromShard",
                        "IteratorGetNextAsOptional"}
_CALLID = r"'callid': (?P<v>-?\d+)"
_FWD_CALLID = r"'fwdCallid': (?P<v>-?\d+)"
_CALLID_FIELDS = r", '(?:callid|fwdCallid)': -?\d+|'(?:callid|fwdCallid)': -?\d+, "

COLUMNS = ["kind", "label", "op_type", "seq", "backward", "dataloader", "func_stack", "stack_trace",
           "data_type", "input_shapes", "output_shapes", "parameters", "direction", "callid", "fwd_callid"]


def classify_ranges(texts, domains, families: set[str] | None = None) -> pd.DataFrame:
    """One row per range text: its kind and what it carries. `families` limits the marker families."""
    text = _object_array(texts)
    domain = _object_array(domains)
    n = text.size
    allowed = {FAMILY_PYTORCH, FAMILY_TENSORFLOW, FAMILY_TENSORRT} if families is None else families
    cols = {
        "kind": np.full(n, SCOPE, dtype=np.int8),
        "label": text.copy(),
        "op_type": text.copy(),
        "seq": np.full(n, -1, dtype=np.int64),
        "backward": np.zeros(n, dtype=bool),
        "dataloader": np.zeros(n, dtype=bool),
        "func_stack": np.full(n, None, dtype=object),
        "stack_trace": np.full(n, None, dtype=object),
        "data_type": np.full(n, None, dtype=object),
        "input_shapes": np.full(n, None, dtype=object),
        "output_shapes": np.full(n, None, dtype=object),
        "parameters": np.full(n, None, dtype=object),
        "direction": np.full(n, None, dtype=object),
        "callid": np.full(n, -1, dtype=np.int64),
        "fwd_callid": np.full(n, -1, dtype=np.int64),
    }
    config = []
    if n:
        arr = pa.array(text, type=pa.string())
        is_dict = _bools(pc.starts_with(arr, "{"))
        if is_dict.any():
            config = _classify_dicts(np.flatnonzero(is_dict), arr, cols, allowed)
        plain = ~is_dict
        if FAMILY_PYTORCH in allowed and plain.any():
            _classify_pytorch(arr, plain, cols)
        if FAMILY_TENSORRT in allowed:
            trt = plain & (domain == "TensorRT") & (cols["kind"] == SCOPE)
            if trt.any():
                _classify_tensorrt(text, trt, cols)
        if FAMILY_TENSORFLOW in allowed:
            candidates = plain & (cols["kind"] == SCOPE)
            if candidates.any():
                _classify_tensorflow_text(arr, candidates, cols)
        scope = cols["kind"] == SCOPE
        if scope.any():
            cols["dataloader"][scope] = per_unique(cols["label"][scope], lambda t: bool(_DATALOADER_LABEL.search(t)),
                                                   bool)
        tf = cols["kind"] == TF_OP
        if tf.any():
            cols["dataloader"][tf] = per_unique(cols["op_type"][tf], lambda t: t in _TF_DATALOADER_TYPES, bool)
    out = pd.DataFrame({k: (pd.Series(v, dtype=object) if v.dtype == object else v) for k, v in cols.items()})
    out.attrs["config"] = config
    return out


def _object_array(values) -> np.ndarray:
    if isinstance(values, pd.Series):
        values = values.to_numpy(dtype=object, na_value=None)
    out = np.asarray(values, dtype=object)
    if out.size and pd.isna(out).any():
        out = np.where(pd.isna(out), "", out)
    return out


def _bools(array) -> np.ndarray:
    return np.asarray(array.to_numpy(zero_copy_only=False), dtype=bool)


def _strings(array) -> np.ndarray:
    return np.asarray(array.to_numpy(zero_copy_only=False), dtype=object)


def per_unique(values: np.ndarray, fn, dtype=object) -> np.ndarray:
    """fn applied once per distinct value, spread back over all values."""
    codes, uniques = pd.factorize(np.asarray(values, dtype=object))
    results = np.array([fn(u) for u in uniques], dtype=dtype) if len(uniques) else np.zeros(0, dtype=dtype)
    return results[codes] if len(codes) else np.zeros(0, dtype=dtype)


# ---------------------------------------------------------------- PyTorch emit_nvtx texts

def _classify_pytorch(arr: pa.Array, mask: np.ndarray, cols: dict) -> None:
    idx = np.flatnonzero(mask)
    sub = arr.take(pa.array(idx)) if idx.size < len(arr) else arr
    has_fields = _bools(pc.match_substring_regex(sub, r", (?:seq|op_id) = -?\d+"))
    names = _strings(pc.replace_substring_regex(sub, _PT_FIELDS, "")) if has_fields.any() else _strings(sub)
    seq = np.full(idx.size, -1, dtype=np.int64)
    if has_fields.any():
        found = pc.struct_field(pc.extract_regex(sub, r", seq = (?P<seq>-?\d+)"), [0])
        seq = np.asarray(pc.fill_null(pc.cast(found, pa.int64()), -1).to_numpy(zero_copy_only=False), dtype=np.int64)
    aten_bare = _bools(pc.starts_with(sub, "aten::"))
    op_like = per_unique(names, lambda nm: bool(_PT_OP_LABEL.match(nm)), bool)
    is_pt = has_fields | aten_bare
    is_op = is_pt & (op_like | (seq >= 0))
    # Ranges in PyTorch's grammar that are not ops (ProfilerStep#N, Optimizer.step#..., user
    # record_function labels) are scopes, with their fields stripped from the label.
    pt_rows = idx[is_pt]
    cols["label"][pt_rows] = names[is_pt]
    cols["op_type"][pt_rows] = names[is_pt]
    cols["seq"][pt_rows] = seq[is_pt]
    op_rows = idx[is_op]
    cols["kind"][op_rows] = PT_OP
    inner = per_unique(names[is_op], lambda nm: nm[len(_EVALUATE_FN):] if nm.startswith(_EVALUATE_FN) else nm)
    cols["label"][op_rows] = inner
    cols["backward"][op_rows] = per_unique(inner, lambda nm: bool(_BACKWARD_LABEL.search(nm)), bool)
    cols["op_type"][op_rows] = per_unique(inner, pytorch_op_type)
    has_sizes = _bools(pc.match_substring(sub, ", sizes = "))
    if has_sizes.any():
        sizes = _strings(pc.struct_field(pc.extract_regex(sub.filter(pa.array(has_sizes)),
                                                          r", sizes = (?P<sizes>\[\]|\[.*?\]\])"), [0]))
        cols["input_shapes"][idx[has_sizes]] = per_unique(sizes, _shape_text)


def pytorch_op_type(label: str) -> str:
    """DLProf-style op type: the ATen name without its namespace, other labels as they are."""
    return label[6:] if label.startswith("aten::") else label


def _shape_text(text) -> str | None:
    """`[[8, 3], [], [64]]` (emit_nvtx sizes) -> `<8, 3>; <64>`."""
    try:
        shapes = json.loads(text) if text else []
    except (TypeError, ValueError):
        return None
    return format_shapes([s for s in shapes if isinstance(s, list) and s])


def format_shapes(shapes: list, labels: list | None = None) -> str:
    """DLProf's shape text: one `<d0, d1>` per tensor joined by '; ' (dimension labels when known)."""
    parts = []
    for i, shape in enumerate(shapes):
        dims = [str(d) for d in shape]
        names = labels[i] if labels and i < len(labels) and labels[i] and len(labels[i]) == len(dims) else None
        parts.append("<" + ", ".join(f"{n}:{d}" if names else d for n, d in zip(names or dims, dims)) + ">")
    return "; ".join(parts)


# ---------------------------------------------------------------- TensorFlow and TensorRT

def _classify_tensorflow_text(arr: pa.Array, mask: np.ndarray, cols: dict) -> None:
    idx = np.flatnonzero(mask)
    sub = arr.take(pa.array(idx))
    found = pc.extract_regex(sub, _TF_TEXT)
    valid = _bools(pc.is_valid(found))
    if not valid.any():
        return
    rows = idx[valid]
    cols["kind"][rows] = TF_OP
    cols["op_type"][rows] = _strings(pc.struct_field(found, [0]))[valid]
    cols["label"][rows] = _strings(pc.struct_field(found, [1]))[valid]


_TRT_SUFFIX = re.compile(r"(?:_clone)?_\d+$")


def tensorrt_layer_type(name: str) -> str:
    """`onnx::Conv_239` -> Conv; fused `Conv_0 + Relu_1` -> Conv+Relu."""
    parts = []
    for part in name.split("+"):
        part = part.strip()
        part = part.split("::", 1)[1] if "::" in part else part
        part = _TRT_SUFFIX.sub("", part)
        part = _TRT_SUFFIX.sub("", part)
        parts.append(part or name)
    return "+".join(parts)


def _classify_tensorrt(text: np.ndarray, mask: np.ndarray, cols: dict) -> None:
    rows = np.flatnonzero(mask)
    layer = ~per_unique(text[rows], lambda t: t.startswith("ExecutionContext::"), bool)
    rows = rows[layer]
    cols["kind"][rows] = TRT_LAYER
    cols["op_type"][rows] = per_unique(text[rows], tensorrt_layer_type)


# ---------------------------------------------------------------- dict markers (DLProf/PyProf, TF detailed)

def _classify_dicts(idx: np.ndarray, arr: pa.Array, cols: dict, allowed: set[str]) -> list[dict]:
    """Parse each distinct dict text once; callids (unique per call) are read column-wise first."""
    sub = arr.take(pa.array(idx))
    for column, pattern in (("callid", _CALLID), ("fwd_callid", _FWD_CALLID)):
        found = pc.struct_field(pc.extract_regex(sub, pattern), [0])
        cols[column][idx] = np.asarray(pc.fill_null(pc.cast(found, pa.int64()), -1)
                                       .to_numpy(zero_copy_only=False), dtype=np.int64)
    stripped = _strings(pc.replace_substring_regex(sub, _CALLID_FIELDS, ""))
    codes, uniques = pd.factorize(stripped)
    parsed = [_parse_dict_text(t, allowed) for t in uniques]
    for field in ("kind", "label", "op_type", "func_stack", "stack_trace", "data_type", "input_shapes",
                  "output_shapes", "parameters", "direction", "dataloader"):
        values = np.array([p.get(field) for p in parsed], dtype=object)[codes]
        if field == "kind":
            cols["kind"][idx] = values.astype(np.int8)
        elif field == "dataloader":
            cols["dataloader"][idx] = values.astype(bool)
        elif field in ("label", "op_type"):
            keep = pd.notna(values)
            cols[field][idx[keep]] = values[keep]
        else:
            cols[field][idx] = values
    return [parsed[c]["config"] for c in np.unique(codes) if parsed[c].get("config") is not None]


def _parse_dict_text(text: str, allowed: set[str]) -> dict:
    result = {"kind": SCOPE, "label": None, "op_type": None, "dataloader": False}
    if len(text) > MAX_DICT_TEXT:
        return result
    value = None
    if text.startswith('{"'):
        try:
            value = json.loads(text)
        except ValueError:
            value = None
    if value is None:
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
            return result
    if not isinstance(value, dict):
        return result
    if "model_config" in value:
        result.update(kind=CONFIG, config=value["model_config"] if isinstance(value["model_config"], dict) else {})
        return result
    if FAMILY_PYTORCH in allowed and "traceMarker" in value:
        trace = value.get("traceMarker") or []
        if isinstance(trace, str):
            trace = [trace]
        result.update(kind=DL_TRACE, func_stack=str(value.get("funcStack") or ""),
                      stack_trace="\n".join(str(f) for f in trace))
        return result
    if FAMILY_PYTORCH in allowed and "mod" in value and "op" in value:
        op = str(value.get("op"))
        shapes, dtypes, params = describe_args(value.get("args") or [])
        labels = _dimension_labels(op, shapes)
        direction = value.get("dir")
        result.update(kind=DL_ARG, label=op, op_type=op, data_type=(dtypes[0] if dtypes else None),
                      input_shapes=format_shapes(shapes, labels),
                      output_shapes=_output_shape_text(op, shapes, params),
                      parameters=", ".join(f"{k}={v}" for k, v in params) if params else "",
                      direction=direction if direction in ("fprop", "bprop") else None,
                      dataloader=bool(_DATALOADER_LABEL.search(op)) or "DataLoader" in str(value.get("mod")))
        return result
    if FAMILY_PYTORCH in allowed and "strRepr" in value:
        result.update(kind=DL_MODULE)
        return result
    if FAMILY_TENSORFLOW in allowed and "op" in value and "name" in value:
        shapes = [a.get("shape") for a in (value.get("args") or []) if isinstance(a, dict)]
        shapes = [s for s in shapes if isinstance(s, list)]
        attrs = value.get("attrs") if isinstance(value.get("attrs"), dict) else {}
        dtype = attrs.get("T")
        if dtype == "bfloat32":  # NVIDIA TF spells bfloat16 this way
            dtype = "bfloat16"
        result.update(kind=TF_OP, label=str(value["name"]), op_type=str(value["op"]),
                      data_type=dtype, input_shapes=format_shapes(shapes),
                      dataloader=str(value["op"]) in _TF_DATALOADER_TYPES)
        return result
    return result


def describe_args(args: list) -> tuple[list, list, list]:
    """Tensor shapes, tensor dtypes and scalar parameters of a DLProf argument marker."""
    shapes, dtypes, params = [], [], []
    for arg in args:
        if not isinstance(arg, dict):
            continue
        kind = arg.get("type")
        if kind in ("tensor", "ndarray"):
            shape = arg.get("shape")
            shapes.append(list(shape) if isinstance(shape, (list, tuple)) else [])
            if arg.get("dtype") is not None:
                dtypes.append(str(arg["dtype"]).replace("torch.", ""))
        elif kind in ("int", "float", "bool", "str", "NoneType", "list", "tuple", "dtype", "device"):
            name = arg.get("name") or f"arg{len(params)}"
            params.append((name, arg.get("value")))
    return shapes, dtypes, params


_CONV = re.compile(r"^conv(?:_transpose)?([123])d$")


def _dimension_labels(op: str, shapes: list) -> list | None:
    """DLProf labelled conv and linear shapes (N, C, H, W / K, C, R, S; N, K / M, K)."""
    match = _CONV.match(op)
    if match and len(shapes) >= 2:
        spatial = {"1": ["W"], "2": ["H", "W"], "3": ["D", "H", "W"]}[match.group(1)]
        kernel = {"1": ["S"], "2": ["R", "S"], "3": ["T", "R", "S"]}[match.group(1)]
        return [["N", "C"] + spatial, ["K", "C"] + kernel]
    if op == "linear" and len(shapes) >= 2 and len(shapes[0]) == 2 and len(shapes[1]) == 2:
        return [["N", "K"], ["M", "K"]]
    return None


def _output_shape_text(op: str, shapes: list, params: list) -> str:
    """Output shape of conv and linear ops from their inputs, as DLProf reported it; empty otherwise."""
    match = _CONV.match(op)
    named = dict(params)
    if match and not op.startswith("conv_transpose") and len(shapes) >= 2:
        nd = int(match.group(1))
        x, w = shapes[0], shapes[1]
        if len(x) != nd + 2 or len(w) != nd + 2:
            return ""

        def per_dim(value, default):
            if value is None:
                return [default] * nd
            if isinstance(value, (list, tuple)):
                return list(value) if len(value) == nd else [value[0]] * nd
            return [value] * nd
        try:
            stride = per_dim(named.get("stride"), 1)
            padding = per_dim(named.get("padding"), 0)
            dilation = per_dim(named.get("dilation"), 1)
            if any(isinstance(p, str) for p in padding):
                return ""
            out = [(x[2 + i] + 2 * padding[i] - dilation[i] * (w[2 + i] - 1) - 1) // stride[i] + 1
                   for i in range(nd)]
        except (TypeError, ValueError, ZeroDivisionError):
            return ""
        labels = ["N", "K"] + {1: ["Q"], 2: ["P", "Q"], 3: ["O", "P", "Q"]}[nd]
        return format_shapes([[x[0], w[0]] + out], [labels])
    if op == "linear" and len(shapes) >= 2 and len(shapes[1]) == 2 and len(shapes[0]) >= 1:
        out = list(shapes[0][:-1]) + [shapes[1][0]]
        return format_shapes([out], [["N", "M"]] if len(out) == 2 else None)
    return ""
