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

from dlprof_profiler.ingest import arrow_text as at

# Range kinds
SCOPE, PT_OP, DL_ARG, DL_TRACE, DL_MODULE, CONFIG, TF_OP, TRT_LAYER = range(8)
OP_MARKERS = (PT_OP, DL_ARG, TF_OP, TRT_LAYER)
WRAPPERS = (DL_TRACE, DL_MODULE)  # annotate the op marker inside them; neither ops nor scopes

FAMILY_PYTORCH, FAMILY_TENSORFLOW, FAMILY_TENSORRT = "pytorch", "tensorflow", "tensorrt"
# the marker family each --mode reads (None: markers of no framework)
FAMILY_OF_MODE = {
    "pytorch": FAMILY_PYTORCH,
    "tensorflow1": FAMILY_TENSORFLOW,
    "tensorflow2": FAMILY_TENSORFLOW,
    "tensorrt": FAMILY_TENSORRT,
    "nvtx": None,
    "simple": None,
}

MAX_DICT_TEXT = 200_000  # longer dict-like texts are not parsed (guard against pathological markers)

_PT_FIELDS = r", (?:seq|op_id|sizes|input_op_ids) = .*$"
_PT_OP_LABEL = re.compile(
    r"^(?:[A-Za-z_]\w*::[\w.]+|\w+Backward\d*|\w+_backward|"
    r"autograd::engine::evaluate_function: .+)$"
)
_BACKWARD_LABEL = re.compile(r"(?:Backward\d*|_backward)$")
EVALUATE_FN = "autograd::engine::evaluate_function: "
_TF_TEXT = r"^(?P<type>[A-Z][A-Za-z0-9_]*): (?P<node>\S*[A-Za-z_/]\S*)$"
_DATALOADER_PATTERN = (
    r"^enumerate\(DataLoader\)#|DataLoaderIter.*__next__|^DALI[ :]|^IteratorGetNext|"
    r"^MultiDeviceIteratorGetNextFromShard|^dataloader"
)
_DATALOADER_LABEL = re.compile(_DATALOADER_PATTERN, re.IGNORECASE)
_TF_DATALOADER_TYPES = {
    "IteratorGetNext",
    "IteratorGetNextSync",
    "MultiDeviceIteratorGetNextFromShard",
    "IteratorGetNextAsOptional",
}
_CALLID = r"'callid': (?P<v>-?\d+)"
_FWD_CALLID = r"'fwdCallid': (?P<v>-?\d+)"
_CALLID_FIELDS = r", '(?:callid|fwdCallid)': -?\d+|'(?:callid|fwdCallid)': -?\d+, "

COLUMNS = [
    "kind",
    "label",
    "op_type",
    "seq",
    "backward",
    "dataloader",
    "func_stack",
    "stack_trace",
    "data_type",
    "input_shapes",
    "output_shapes",
    "parameters",
    "direction",
    "callid",
    "fwd_callid",
]


def classify_ranges(texts, domains, families: set[str] | None = None) -> pd.DataFrame:
    """One row per range text: its kind and what it carries. `families` limits the marker families.

    Per-range work is columnar (Arrow kernels, numpy); Python touches each *distinct* text once, after
    the per-call fields (seq, op_id, sizes, callids) are stripped, so string columns share their objects.
    """
    arr = _arrow_strings(texts)
    # only compared with a name below: missing values need no replacing (the texts do)
    domain = domains.to_numpy(dtype=object) if isinstance(domains, pd.Series) else np.asarray(domains, dtype=object)
    n = len(arr)
    allowed = {FAMILY_PYTORCH, FAMILY_TENSORFLOW, FAMILY_TENSORRT} if families is None else families
    cols = _empty_columns(n)
    if n == 0:
        cols["text_code"] = np.zeros(0, dtype=np.int32)
        out = _frame(cols)
        out.attrs["config"] = []
        return out
    is_dict = _bools(pc.starts_with(arr, "{"))
    stripped, marker_at = _strip_call_fields(arr)
    if is_dict.any():
        dict_rows = pa.array(is_dict)
        dict_stripped = pc.replace_substring_regex(arr.filter(dict_rows), _CALLID_FIELDS, "")
        stripped = pc.replace_with_mask(stripped, dict_rows, dict_stripped.cast(stripped.type))
        del dict_stripped
    encoded = pc.dictionary_encode(stripped)
    del stripped  # the distinct texts and one code per range are all that is kept
    codes = np.asarray(encoded.indices.to_numpy(zero_copy_only=False), dtype=np.int64)
    uniq = encoded.dictionary
    del encoded
    u_text = _strings(uniq)
    u_dict = _bools(pc.starts_with(uniq, "{"))
    # per distinct stripped text: the default (scope) reading
    u_kind = np.full(len(u_text), SCOPE, dtype=np.int8)
    u_label = u_text.copy()
    u_type = u_text.copy()
    config = []
    u_fields = {}
    if u_dict.any():
        config = _parse_dict_uniques(np.flatnonzero(u_dict), u_text, u_kind, u_label, u_type, u_fields, allowed)
    kind = u_kind[codes]
    label = u_label[codes]
    op_type = u_type[codes]
    for field, values in u_fields.items():
        cols[field] = values[codes]
    cols["dataloader"] = u_fields.get("dataloader", np.zeros(len(u_text), dtype=bool))[codes]
    plain = ~is_dict
    if FAMILY_PYTORCH in allowed:
        _pytorch(arr, marker_at, plain, codes, uniq, u_text, kind, label, op_type, cols)
        if is_dict.any():
            for column, pattern in (("callid", _CALLID), ("fwd_callid", _FWD_CALLID)):
                cols[column] = _int_field(arr, pattern, is_dict)
    if FAMILY_TENSORRT in allowed:
        trt = plain & (domain == "TensorRT") & (kind == SCOPE)
        if trt.any():
            u_exec = _bools(pc.starts_with(uniq, "ExecutionContext::"))
            layer = trt & ~u_exec[codes]
            kind[layer] = TRT_LAYER
            u_trt_type = _lazy_per_unique(tensorrt_layer_type, u_text)
            op_type[layer] = u_trt_type(codes[layer])
    if FAMILY_TENSORFLOW in allowed:
        found = pc.extract_regex(uniq, _TF_TEXT)
        u_tf = _bools(pc.is_valid(found))
        tf = plain & (kind == SCOPE) & u_tf[codes]
        if tf.any():
            kind[tf] = TF_OP
            op_type[tf] = _strings(pc.struct_field(found, [0]))[codes[tf]]
            label[tf] = _strings(pc.struct_field(found, [1]))[codes[tf]]
            cols["dataloader"][tf] = np.isin(op_type[tf], list(_TF_DATALOADER_TYPES))
    scope = kind == SCOPE
    if scope.any():
        u_loader = _bools(pc.match_substring_regex(uniq, _DATALOADER_PATTERN, ignore_case=True))
        cols["dataloader"][scope] = u_loader[codes[scope]]
    cols["kind"], cols["label"], cols["op_type"] = kind, label, op_type
    cols["text_code"] = codes.astype(np.int32)  # ranges with equal codes have equal texts (fields stripped)
    out = _frame(cols)
    out.attrs["config"] = config
    return out


class RangeClassifier:
    """The classification of a profile's ranges under a --mode (None: detected), in one batch or in many (the
    out-of-core store's parts): `classify` each batch, then `outcome` gives the profile's mode, marker family
    and the run configuration its config markers carry."""

    def __init__(self, mode: str | None):
        self.mode = mode
        family = FAMILY_OF_MODE.get(mode, "any")
        self.families = None if family == "any" else ({family} if family else set())
        self.count = 0
        self.kinds = np.zeros(TRT_LAYER + 1, dtype=bool)
        self.config: dict = {}

    def classify(self, texts, domains) -> pd.DataFrame:
        """classify_ranges of a batch of ranges (their texts and domains)."""
        info = classify_ranges(texts, domains, set() if self.mode == "simple" else self.families)
        self.count += len(info)
        self.kinds[np.unique(info["kind"].to_numpy(np.int64))] = True
        for entry in info.attrs.get("config", []):
            self.config.update(entry)
        return info

    def outcome(self) -> tuple[str, str | None, dict]:
        """(mode, family, run config). Without ranges or in simple mode there is no op analysis: mode simple
        (or the one given), no family, no configuration. Otherwise the mode given, else the first family whose
        op markers are present (PyTorch, TensorFlow, TensorRT), else plain NVTX."""
        if self.mode == "simple" or self.count == 0:
            return self.mode or "simple", None, {}
        mode = self.mode
        if mode is None:
            if self.kinds[[PT_OP, DL_ARG, DL_TRACE]].any():
                mode = "pytorch"
            elif self.kinds[TF_OP]:
                mode = "tensorflow2"
            elif self.kinds[TRT_LAYER]:
                mode = "tensorrt"
            else:
                mode = "nvtx"
        return mode, FAMILY_OF_MODE.get(mode), dict(self.config)


SPARSE_COLUMNS = ("func_stack", "stack_trace", "data_type", "input_shapes", "output_shapes", "parameters", "direction")


def _empty_columns(n: int) -> dict:
    # The marker-only columns are empty in most profiles: they share one all-None array until written.
    nothing = np.full(n, None, dtype=object)
    cols = {
        "kind": np.full(n, SCOPE, dtype=np.int8),
        "label": np.full(n, None, dtype=object),
        "op_type": np.full(n, None, dtype=object),
        "seq": np.full(n, -1, dtype=np.int64),
        "backward": np.zeros(n, dtype=bool),
        "dataloader": np.zeros(n, dtype=bool),
        "callid": np.full(n, -1, dtype=np.int64),
        "fwd_callid": np.full(n, -1, dtype=np.int64),
    }
    cols.update({name: nothing for name in SPARSE_COLUMNS})
    return cols


def _frame(cols: dict) -> pd.DataFrame:
    return pd.DataFrame(
        {k: (pd.Series(v, dtype=object, copy=False) if v.dtype == object else v) for k, v in cols.items()}, copy=False
    )


def _arrow_strings(values) -> pa.Array:
    """Texts as one Arrow string array (no copy when they already are Arrow-backed)."""
    if isinstance(values, pd.Series) and isinstance(values.array, pd.arrays.ArrowStringArray):
        data = values.array._pa_array
        if isinstance(data, pa.ChunkedArray):
            data = data.chunk(0) if data.num_chunks == 1 else data.combine_chunks()
        return pc.fill_null(data, "") if data.null_count else data
    obj_values = _object_array(values)
    return pa.array(obj_values, type=pa.string()) if len(obj_values) else pa.array([], type=pa.string())


def _object_array(values) -> np.ndarray:
    if isinstance(values, pd.Series):
        values = values.to_numpy(dtype=object, na_value=None)
    out = np.asarray(values, dtype=object)
    if out.size and pd.isna(out).any():
        out = np.where(pd.isna(out), "", out)
    return out


def _bools(array) -> np.ndarray:
    return np.asarray(pc.fill_null(array, False).to_numpy(zero_copy_only=False), dtype=bool)


def _strings(array) -> np.ndarray:
    return np.asarray(array.to_numpy(zero_copy_only=False), dtype=object)


def _int_field(arr: pa.Array, pattern: str, mask: np.ndarray) -> np.ndarray:
    """An integer captured by a named-group regex, -1 where absent or outside the mask."""
    out = np.full(len(arr), -1, dtype=np.int64)
    idx = np.flatnonzero(mask)
    if idx.size:
        sub = arr.take(pa.array(idx)) if idx.size < len(arr) else arr
        found = pc.struct_field(pc.extract_regex(sub, pattern), [0])
        # more digits than int64 holds: no value (rather than an error that would stop the run)
        digits = pc.subtract(pc.binary_length(found), pc.cast(pc.starts_with(found, "-"), pa.int32()))
        found = pc.if_else(pc.less_equal(digits, at.MAX_DIGITS), found, pa.scalar(None, found.type))
        out[idx] = np.asarray(
            pc.fill_null(pc.cast(found, pa.int64()), -1).to_numpy(zero_copy_only=False), dtype=np.int64
        )
    return out


def _lazy_per_unique(fn, u_text: np.ndarray):
    """fn over the distinct texts actually asked for, spread back by their codes."""

    def apply(codes: np.ndarray) -> np.ndarray:
        results = np.empty(len(u_text), dtype=object)
        wanted = np.flatnonzero(np.bincount(codes, minlength=len(u_text)))  # no sort of the codes
        results[wanted] = [fn(u_text[c]) for c in wanted]
        return results[codes]

    return apply


# PyTorch's per-call fields (_PT_FIELDS): each text's shared part ends where the first of them begins
_PT_MARKERS = (", seq = ", ", op_id = ", ", sizes = ", ", input_op_ids = ")


def with_call_fields(labels: pa.Array, seq: pa.Array, op_id: pa.Array) -> pa.Array:
    """emit_nvtx's text of a call: its label, then `, seq = S` and `, op_id = O` where given (null: absent)."""

    def field(values, name):
        return pc.fill_null(pc.binary_join_element_wise(f", {name} = ", pc.cast(values, pa.string()), ""), "")

    return pc.binary_join_element_wise(pc.cast(labels, pa.string()), field(seq, "seq"), field(op_id, "op_id"), "")


def _strip_call_fields(arr: pa.Array) -> tuple[pa.Array, dict]:
    """The texts without PyTorch's per-call fields, exactly as `pc.replace_substring_regex(arr, _PT_FIELDS,
    "")`, and the byte position of each marker's first occurrence per text (-1: none). A text with a line
    break (the regex's `.*$` does not cross one) is left to the regex."""
    marker_at = {m: at.find(arr, m) for m in _PT_MARKERS}
    cut = np.full(len(arr), -1, dtype=np.int64)
    for pos in marker_at.values():
        cut = np.where((pos >= 0) & ((cut < 0) | (pos < cut)), pos, cut)
    odd = np.zeros(len(arr), dtype=bool)
    if at.anywhere(arr, b"\n"):
        odd = (cut >= 0) & (at.find(arr, "\n") >= 0)
        cut[odd] = -1
    stripped = at.prefixes(arr, np.where(cut >= 0, cut, np.iinfo(np.int64).max))
    if odd.any():
        rows = pa.array(odd)
        by_regex = pc.replace_substring_regex(arr.filter(rows), _PT_FIELDS, "")
        stripped = pc.replace_with_mask(stripped, rows, by_regex.cast(stripped.type))
    return stripped, marker_at


def _int_fields(arr: pa.Array, marker_at: dict, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(has, seq): whether `, seq = N` or `, op_id = N` occurs in each text (the regex
    `, (?:seq|op_id) = -?\\d+`), and the N of the first `, seq = N` (-1: none, outside `mask`, or more
    digits than int64 holds), from the markers' first positions; texts whose first marker is not followed by a
    number are left to the regexes."""
    seq_at, op_at = marker_at[", seq = "], marker_at[", op_id = "]
    seq_there, op_there = seq_at >= 0, op_at >= 0
    seq_value, seq_digits = at.ints_at(arr, np.where(seq_there, seq_at + len(", seq = "), -1))
    has = (seq_digits >= 1) | at.number_at(arr, np.where(op_there, op_at + len(", op_id = "), -1))
    unsure = ~has & (seq_there | op_there)
    if unsure.any():
        has[unsure] = _bools(pc.match_substring_regex(arr.filter(pa.array(unsure)), r", (?:seq|op_id) = -?\d+"))
    has &= mask
    seq = np.where(has & (seq_digits >= 1) & (seq_digits <= at.MAX_DIGITS), seq_value, -1)
    unsure = has & seq_there & (seq_digits < 1)  # a later `, seq = N` may follow
    if unsure.any():
        seq[unsure] = _int_field(arr, r", seq = (?P<seq>-?\d+)", unsure)[unsure]
    return has, seq


def per_unique(values: np.ndarray, fn, dtype=object) -> np.ndarray:
    """fn applied once per distinct value, spread back over all values (a missing one gets fn(None))."""
    codes, uniques = pd.factorize(np.asarray(values, dtype=object))
    results = [fn(u) for u in uniques] + ([fn(None)] if (codes < 0).any() else [])
    return np.array(results, dtype=dtype)[codes] if len(codes) else np.zeros(0, dtype=dtype)  # -1: the last


# ---------------------------------------------------------------- PyTorch emit_nvtx texts


def _pytorch(arr, marker_at, plain, codes, uniq, u_text, kind, label, op_type, cols) -> None:
    """PyTorch op markers: texts in emit_nvtx's grammar whose label is an op (namespace::name, a backward
    node, or any label with an autograd seq); other texts in that grammar are scopes (ProfilerStep#N,
    Optimizer.step#..., user record_function labels)."""
    has_fields, seq = _int_fields(arr, marker_at, plain)
    u_aten = _bools(pc.starts_with(uniq, "aten::"))
    u_op_like = _bools(pc.match_substring_regex(uniq, _PT_OP_LABEL.pattern))
    is_pt = has_fields | (u_aten[codes] & plain)
    if not is_pt.any():
        return
    cols["seq"][is_pt] = seq[is_pt]
    is_op = is_pt & (u_op_like[codes] | (seq >= 0))
    kind[is_op] = PT_OP
    u_inner, u_backward = backward_labels(uniq)
    label[is_op] = u_inner[codes[is_op]]
    cols["backward"][is_op] = u_backward[codes[is_op]]
    op_type[is_op] = _lazy_per_unique(pytorch_op_type, u_inner)(codes[is_op])
    has_sizes = (marker_at[", sizes = "] >= 0) & is_pt
    if has_sizes.any():
        sub = arr.filter(pa.array(has_sizes))
        sizes = pc.struct_field(pc.extract_regex(sub, r", sizes = (?P<sizes>\[\]|\[.*?\]\])"), [0])
        enc = pc.dictionary_encode(sizes)
        shapes = np.array([_shape_text(t) for t in _strings(enc.dictionary)], dtype=object)
        if any(cols["input_shapes"] is cols[other] for other in SPARSE_COLUMNS if other != "input_shapes"):
            cols["input_shapes"] = cols["input_shapes"].copy()  # stop sharing before writing
        cols["input_shapes"][np.flatnonzero(has_sizes)] = shapes[
            np.asarray(pc.fill_null(enc.indices, 0).to_numpy(zero_copy_only=False), dtype=np.int64)
        ]


def backward_labels(labels: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(label without `autograd::engine::evaluate_function: `, whether it is a backward op) of PyTorch op
    labels: backward nodes (`MmBackward0`, `..._backward`) and every op autograd's engine runs
    (`evaluate_function: X`, AccumulateGrad and CopySlices included)."""
    inner = _strings(pc.replace_substring_regex(labels, "^" + re.escape(EVALUATE_FN), ""))
    backward = _bools(pc.match_substring_regex(pa.array(inner, type=pa.string()), _BACKWARD_LABEL.pattern))
    return inner, backward | _bools(pc.starts_with(labels, EVALUATE_FN))


def pytorch_op_type(label: str) -> str:
    """DLProf-style op type: the ATen name without its namespace, other labels as they are."""
    return label[6:] if label.startswith("aten::") else label


# ---------------------------------------------------------------- dict markers (DLProf/PyProf, TF detailed)


def _parse_dict_uniques(rows: np.ndarray, u_text, u_kind, u_label, u_type, u_fields, allowed) -> list[dict]:
    """Parse each distinct dict text once (callids already stripped)."""
    parsed = [_parse_dict_text(u_text[i], allowed) for i in rows]
    size = len(u_text)
    for field in ("func_stack", "stack_trace", "data_type", "input_shapes", "output_shapes", "parameters", "direction"):
        values = np.full(size, None, dtype=object)
        values[rows] = [p.get(field) for p in parsed]
        u_fields[field] = values
    loader = np.zeros(size, dtype=bool)
    loader[rows] = [bool(p.get("dataloader")) for p in parsed]
    u_fields["dataloader"] = loader
    u_kind[rows] = [p["kind"] for p in parsed]
    for target, field in ((u_label, "label"), (u_type, "op_type")):
        values = [p.get(field) for p in parsed]
        keep = np.array([v is not None for v in values], dtype=bool)
        target[rows[keep]] = [v for v in values if v is not None]
    return [p["config"] for p in parsed if p.get("config") is not None]


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

_TRT_SUFFIX = re.compile(r"(?:_clone)?_\d+$")


def tensorrt_layer_type(name: str) -> str:
    """`onnx::Conv_239` -> Conv; fused `Conv_0 + Relu_1` -> Conv+Relu; ONNX paths `/backbone/conv1/Conv` -> Conv."""
    parts = []
    for part in name.split("+"):
        part = part.strip()
        part = part.rstrip("/").rsplit("/", 1)[-1] if "/" in part else part
        part = part.split("::", 1)[1] if "::" in part else part
        part = _TRT_SUFFIX.sub("", part)
        part = _TRT_SUFFIX.sub("", part)
        parts.append(part or name)
    return "+".join(parts)


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
        result.update(
            kind=DL_TRACE, func_stack=str(value.get("funcStack") or ""), stack_trace="\n".join(str(f) for f in trace)
        )
        return result
    if FAMILY_PYTORCH in allowed and "mod" in value and "op" in value:
        op = str(value.get("op"))
        shapes, dtypes, params = describe_args(value.get("args") or [])
        labels = _dimension_labels(op, shapes)
        direction = value.get("dir")
        result.update(
            kind=DL_ARG,
            label=op,
            op_type=op,
            data_type=(dtypes[0] if dtypes else None),
            input_shapes=format_shapes(shapes, labels),
            output_shapes=output_shape_text(op, shapes, params),
            parameters=", ".join(f"{k}={v}" for k, v in params) if params else "",
            direction=direction if direction in ("fprop", "bprop") else None,
            dataloader=bool(_DATALOADER_LABEL.search(op)) or "DataLoader" in str(value.get("mod")),
        )
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
        result.update(
            kind=TF_OP,
            label=str(value["name"]),
            op_type=str(value["op"]),
            data_type=dtype,
            input_shapes=format_shapes(shapes),
            dataloader=str(value["op"]) in _TF_DATALOADER_TYPES,
        )
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


def output_shape_text(op: str, shapes: list, params: list) -> str:
    """Output shape of conv and linear ops from their inputs and (name, value) parameters (stride, padding,
    dilation), as DLProf reported it; empty otherwise."""
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
            out = [(x[2 + i] + 2 * padding[i] - dilation[i] * (w[2 + i] - 1) - 1) // stride[i] + 1 for i in range(nd)]
        except (TypeError, ValueError, ZeroDivisionError):
            return ""
        labels = ["N", "K"] + {1: ["Q"], 2: ["P", "Q"], 3: ["O", "P", "Q"]}[nd]
        return format_shapes([[x[0], w[0]] + out], [labels])
    if op == "linear" and len(shapes) >= 2 and len(shapes[1]) == 2 and len(shapes[0]) >= 1:
        out = list(shapes[0][:-1]) + [shapes[1][0]]
        return format_shapes([out], [["N", "M"]] if len(out) == 2 else None)
    return ""
