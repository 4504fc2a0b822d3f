"""Marker texts in the nvidia_dlprof_pytorch_nvtx (PyProf) format.

Markers are Python ``repr`` of dicts holding only literals (parse with ``ast.literal_eval``). See ``docs`` in
the package ``__init__`` for the exact layout.

Every marker text is free of double quotes, backslashes and control characters (:func:`render`): Kineto
writes event names into its JSON without escaping them (a ``"`` there makes the whole trace invalid, a
``\\`` turns into ``/``, a line break disappears), and the same markers go to NVTX and to torch.profiler.
Strings holding such characters (a string argument with a quote or a line break, a file name with a
backslash) have them replaced: ``'`` and ``"`` by a backtick, ``\\`` by ``/``, others by a space.

Argument descriptions (the ``args`` list), one dict per argument, in call order, keyword arguments last
with their name:

- tensor: ``{'name': '', 'type': 'tensor', 'shape': (8, 3, 32, 32), 'dtype': 'float32'}`` (no ``shape`` when
  shapes are not recorded);
- numpy array: ``{'name': '', 'type': 'ndarray', 'shape': (4,), 'dtype': 'float64'}``;
- scalars: ``{'name': 'stride', 'type': 'int', 'value': 1}`` for int, float, bool, str, NoneType, complex
  (complex and non-finite floats as strings: ``'inf'``, ``'-inf'``, ``'nan'``);
- list/tuple of scalars: ``{'name': 'padding', 'type': 'tuple', 'value': (1, 1)}``;
- list/tuple holding tensors (``torch.cat([a, b])``): one entry per element, all with the list's name;
- ``torch.dtype`` / ``device`` / ``layout`` / ``memory_format``: ``{'type': 'dtype', 'value': 'float16'}``;
- ``slice``: ``{'type': 'slice', 'value': (start, stop, step)}``; ``...``: ``{'type': 'ellipsis', 'value': '...'}``;
- anything else: ``{'name': ..., 'type': <class name>}``.
"""

from __future__ import annotations

import inspect
import math
import re
import types
from typing import Any, Dict, List, Optional, Sequence

import torch

__all__ = [
    "dtype_name",
    "describe_args",
    "literal",
    "trace_marker",
    "module_marker",
    "arg_marker",
    "bprop_marker",
    "config_marker",
    "render",
    "safe_text",
]

MAX_ARGS = 64  # argument entries per marker
MAX_SEQ = 64  # elements kept of a list/tuple value
MAX_STR = 256  # characters kept of a string value

_DTYPE_NAMES: Dict[Any, str] = {}


def dtype_name(dtype: Any) -> str:
    """numpy-style dtype name: ``float32``, ``float16``, ``bfloat16``, ``int64``, ``bool``."""
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = str(dtype)
        if name.startswith("torch."):
            name = name[6:]
        _DTYPE_NAMES[dtype] = name
    return name


def _float(value: float) -> Any:
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return value


def literal(value: Any, _depth: int = 0) -> Any:
    """``value`` turned into something whose ``repr`` ``ast.literal_eval`` reads back."""
    t = type(value)
    if value is None or t is bool or t is int:
        return value
    if t is float:
        return _float(value)
    if t is str:
        return value if len(value) <= MAX_STR else value[:MAX_STR] + "..."
    if isinstance(value, (list, tuple)):  # torch.Size and named tuples included
        if _depth > 4:
            return "..."
        items = [literal(v, _depth + 1) for v in value[:MAX_SEQ]]
        if len(value) > MAX_SEQ:
            items.append("...")
        return items if isinstance(value, list) else tuple(items)
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return _float(float(value))
    if isinstance(value, complex):
        return str(value)
    if isinstance(value, torch.Tensor):
        if value.dim() == 0 and value.device.type == "cpu":
            try:
                return literal(value.item(), _depth + 1)
            except Exception:
                pass
        return "tensor%s" % (tuple(value.shape),)
    item = getattr(value, "item", None)  # numpy scalars
    if callable(item) and type(value).__module__ == "numpy":
        try:
            return literal(item(), _depth + 1)
        except Exception:
            pass
    text = str(value)
    return text if len(text) <= MAX_STR else text[:MAX_STR] + "..."


_SCALAR_TYPES = (bool, int, float, str, type(None), complex)
_TORCH_ENUMS = {
    torch.dtype: "dtype",
    torch.device: "device",
    torch.layout: "layout",
    torch.memory_format: "memory_format",
}


def _is_scalar_seq(seq: Sequence[Any], depth: int = 0) -> bool:
    """Judged on the first MAX_SEQ elements (``torch.tensor(huge_list)`` must stay cheap)."""
    for v in seq[:MAX_SEQ]:
        if isinstance(v, _SCALAR_TYPES):
            continue
        if isinstance(v, (list, tuple)) and depth < 3 and _is_scalar_seq(v, depth + 1):
            continue
        return False
    return True


def _describe(value: Any, name: str, out: List[Dict[str, Any]], tensors: Optional[list], shapes: bool) -> None:
    if len(out) >= MAX_ARGS:
        return
    if isinstance(value, torch.Tensor):
        entry: Dict[str, Any] = {"name": name, "type": "tensor"}
        if shapes:
            try:
                entry["shape"] = tuple(value.shape)
            except Exception:  # nested / exotic tensors
                entry["shape"] = ()
        entry["dtype"] = dtype_name(value.dtype)
        out.append(entry)
        if tensors is not None:
            tensors.append(value)
        return
    t = type(value)
    if value is None or t in (bool, int, float, str):
        out.append({"name": name, "type": t.__name__, "value": literal(value)})
        return
    if isinstance(value, (list, tuple)):
        kind = "list" if isinstance(value, list) else "tuple"
        if _is_scalar_seq(value):
            out.append({"name": name, "type": kind, "value": literal(value if kind == "list" else tuple(value))})
        else:
            for v in value[:MAX_ARGS]:
                _describe(v, name, out, tensors, shapes)
        return
    enum = _TORCH_ENUMS.get(t)
    if enum is not None:
        text = dtype_name(value) if enum == "dtype" else str(value)
        out.append({"name": name, "type": enum, "value": text})
        return
    if isinstance(value, _SCALAR_TYPES):  # subclasses (IntEnum, numpy bool...) and complex
        out.append(
            {
                "name": name,
                "type": t.__name__ if t is complex else type(literal(value)).__name__,
                "value": literal(value),
            }
        )
        return
    if t is slice:
        out.append(
            {"name": name, "type": "slice", "value": (literal(value.start), literal(value.stop), literal(value.step))}
        )
        return
    if value is Ellipsis:
        out.append({"name": name, "type": "ellipsis", "value": "..."})
        return
    if t.__module__ == "numpy":
        shape = getattr(value, "shape", None)
        if shape is not None and t.__name__ == "ndarray":
            entry = {"name": name, "type": "ndarray"}
            if shapes:
                entry["shape"] = tuple(int(d) for d in shape)
            entry["dtype"] = str(value.dtype)
            out.append(entry)
            return
        if shape == ():  # numpy scalar
            lit = literal(value)
            out.append({"name": name, "type": type(lit).__name__, "value": lit})
            return
    out.append({"name": name, "type": t.__name__})


def describe_args(
    args: Sequence[Any],
    kwargs: Dict[str, Any],
    shapes: bool = True,
    tensors: Optional[list] = None,
    names: Sequence[str] = (),
) -> List[Dict[str, Any]]:
    """Argument descriptions; tensors met are appended to ``tensors`` when given.

    ``names``: parameter names of the positional arguments (from :func:`positional_names`); non-tensor
    positional arguments carry them (``F.conv2d(x, w, b, (2, 2))`` -> ``{'name': 'stride', ...}``),
    tensors keep ``''`` as in PyProf."""
    out: List[Dict[str, Any]] = []
    n_names = len(names)
    for i, value in enumerate(args):
        name = ""
        if (
            i < n_names
            and not isinstance(value, torch.Tensor)
            and not (isinstance(value, (list, tuple)) and not _is_scalar_seq(value))
        ):
            name = names[i]
        _describe(value, name, out, tensors, shapes)
    if kwargs:
        for key, value in kwargs.items():
            _describe(value, key, out, tensors, shapes)
    return out


_SIGNATURE_LINE = re.compile(r"^\s*(?:[\w.]+\.)?(\w+)\((.*)\)\s*(?:->.*)?$")


def _split_params(text: str) -> List[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    if text[start:].strip():
        parts.append(text[start:].strip())
    return parts


def positional_names(func: Any, op: str, method: bool) -> List[str]:
    """Names of the positional parameters of ``func`` (``self`` first for methods), or [] when unsure.

    Python functions: their signature. Builtins: the signature line their docstring starts with
    (``conv2d(input, weight, bias=None, stride=1, ...) -> Tensor``), used only when the docstring holds a
    single signature for ``op`` and it reads as valid Python (``arange(start=0, end, ...)`` does not)."""
    target = getattr(func, "__wrapped__", func)
    if isinstance(target, types.FunctionType):
        try:
            params = inspect.signature(target).parameters.values()
        except (TypeError, ValueError):
            return []
        names = []
        for p in params:
            if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
                break
            names.append(p.name)
        return names
    doc = getattr(target, "__doc__", None) or ""
    sigs = []
    for line in doc.splitlines()[:40]:
        m = _SIGNATURE_LINE.match(line)
        if m and m.group(1) == op:
            sigs.append(m.group(2))
    if len(sigs) != 1:
        return []
    names = ["self"] if method else []
    seen_default = False
    for param in _split_params(sigs[0]):
        if not param or param.startswith("*"):
            break
        name, eq, _ = param.partition("=")
        name = name.split(":")[0].strip()
        if not name.isidentifier():
            return []
        if eq:
            seen_default = True
        elif seen_default:
            return []  # not valid Python: the doc describes overloads in one line
        names.append(name)
    return names


_UNSAFE_REPLACEMENT = {"'": "`", '"': "`", "\\": "/"}


def safe_text(text: str) -> str:
    """``text`` with quotes, backslashes and unprintable characters replaced (its ``repr`` then holds none)."""
    if text.isprintable() and "'" not in text and '"' not in text and "\\" not in text:
        return text
    return "".join(
        ch if ch.isprintable() and ch not in _UNSAFE_REPLACEMENT else _UNSAFE_REPLACEMENT.get(ch, " ") for ch in text
    )


def _safe(value: Any) -> Any:
    if isinstance(value, str):
        return safe_text(value)
    if isinstance(value, (list, tuple)):
        items = [_safe(v) for v in value]
        return items if isinstance(value, list) else tuple(items)
    if isinstance(value, dict):
        return {_safe(k): _safe(v) for k, v in value.items()}
    return value


def render(marker: Dict[str, Any]) -> str:
    """The marker's text: its ``repr``, with its strings made safe when the ``repr`` would hold a double
    quote or a backslash (escapes and control characters included). The check is two substring scans."""
    text = repr(marker)
    if '"' in text or "\\" in text:
        text = repr(_safe(marker))
    return text


def trace_marker(trace: List[str], func_stack: Optional[str], modules: Sequence[tuple[str, str]] = ()) -> str:
    """``{'traceMarker': [...], 'funcStack': '...', 'modules': [('model', 'Net'), ('conv1', 'Conv2d')]}``;
    ``modules``: the class of each module element of funcStack, outermost first (left out when empty)."""
    marker: Dict[str, Any] = {"traceMarker": trace}
    if func_stack is not None:
        marker["funcStack"] = func_stack
    if modules:
        marker["modules"] = list(modules)
    return render(marker)


def module_marker(mod: str, str_repr: str) -> str:
    return render({"mod": mod, "strRepr": literal(str_repr)})


def arg_marker(mod: str, op: str, callid: int, args: List[Dict[str, Any]]) -> str:
    return render({"mod": mod, "op": op, "callid": callid, "dir": "fprop", "args": args})


def bprop_marker(mod: str, op: str, bwd_callid: int, fwd_callid: int, node: str, args: List[Dict[str, Any]]) -> str:
    """Marker of one autograd node of a forward call: ``callid`` is the backward call (shared by the call's
    nodes in one backward pass), ``fwdCallid`` the forward call."""
    return render(
        {
            "mod": mod,
            "op": op,
            "callid": bwd_callid,
            "dir": "bprop",
            "fwdCallid": fwd_callid,
            "node": node,
            "args": args,
        }
    )


def config_marker(config: Dict[str, Any]) -> str:
    """``{'model_config': {...}}``: a Python literal like the other markers (DLProf wrote JSON; the engine reads
    both), since JSON's double quotes cannot go through torch.profiler."""
    return render({"model_config": {str(k): literal(v) for k, v in config.items()}})
