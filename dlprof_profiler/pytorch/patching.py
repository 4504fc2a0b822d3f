"""Wrapping torch callables so each call pushes the trace and argument markers.

Patched (see :func:`select_targets`):

- ``torch.<f>``: the public ATen functions of the ``torch`` namespace (``torch.conv2d``, ``torch.matmul``,
  ``torch.cat``, ``torch.zeros``...) and the Python functions of ``torch.functional`` (``torch.einsum``,
  ``torch.split``...), without configuration and query functions (``is_*``, ``get_*``, ``set_*``, ...);
  marker ``mod`` = ``torch``;
- ``torch.Tensor.<m>``: public tensor methods and the operator dunders (``__add__``, ``__matmul__``,
  ``__getitem__``, ...), without metadata queries (``size``, ``dim``, ``is_*``, ``data_ptr``...) and autograd
  plumbing (``backward``, ``register_hook``...); ``mod`` = ``Tensor``;
- ``torch._foreach_<f>``: the multi-tensor ops of the ``foreach`` optimizers (AdamW, SGD... with
  ``foreach=True``, their default on GPU) and of ``clip_grad_norm_``; ``mod`` = ``torch``, ``op`` =
  ``_foreach_add_``...;
- ``torch.linalg.<f>``: every function; ``mod`` = ``torch.linalg``, ``op`` = ATen's name
  (``linalg_vector_norm``), so ``torch.linalg.norm`` and ``torch.norm`` stay different op types;
- ``torch.nn.functional.<f>``: public functions; ``mod`` = ``torch.nn.functional``;
- ``forward`` of ``nn.RNN/LSTM/GRU`` and their cells, whose work runs in ``torch._VF`` calls nothing else
  sees; ``mod`` = the module path (``torch.nn.modules.rnn``), ``op`` = the class (``LSTM``), with a module
  marker holding ``extra_repr()``.

Only the outermost patched call of a thread is annotated: calls torch makes inside it (``F.relu`` calling
``torch.relu``) run unannotated, so every op gets one marker set and PyTorch's ``aten::`` ranges nest inside.

Cost with no profiler: the wrapper tests ``STATE.active`` and calls the original.
"""

from __future__ import annotations

import functools
import inspect
import sys
import threading
import types
from typing import Any, Callable, List, Sequence, Tuple

import torch

from . import backward as _backward
from .markers import arg_marker, describe_args, module_marker, positional_names, trace_marker
from .runtime import STATE

__all__ = [
    "Patcher",
    "select_targets",
    "op_name",
    "make_wrapper",
    "make_module_wrapper",
    "install_ops",
    "install_jit_guard",
]

_MISSING = object()


class Patcher:
    """Replaces attributes and puts back exactly what was there (own attribute or inherited)."""

    def __init__(self) -> None:
        # (owner, name, raw own attribute or _MISSING, replacement)
        self.records: List[Tuple[Any, str, Any, Any]] = []

    def patch(self, owner: Any, name: str, new: Any) -> None:
        raw = owner.__dict__.get(name, _MISSING) if hasattr(owner, "__dict__") else _MISSING
        setattr(owner, name, new)
        self.records.append((owner, name, raw, new))

    @staticmethod
    def _put_back(owner: Any, name: str, raw: Any) -> None:
        try:
            if raw is _MISSING:
                delattr(owner, name)
            else:
                setattr(owner, name, raw)
        except Exception:  # pragma: no cover - keep restoring the rest
            pass

    def restore_all(self) -> None:
        while self.records:
            owner, name, raw, _ = self.records.pop()
            self._put_back(owner, name, raw)

    def suspend(self) -> None:
        """Put the originals back for a while (keeps the records for :meth:`resume`)."""
        for owner, name, raw, _ in reversed(self.records):
            self._put_back(owner, name, raw)

    def resume(self) -> None:
        for owner, name, _, new in self.records:
            setattr(owner, name, new)

    def __len__(self) -> int:
        return len(self.records)


# -- selection --------------------------------------------------------------------------------------

_TORCH_SKIP_PREFIXES = (
    "is_",
    "get_",
    "set_",
    "can_",
    "autocast_",
    "clear_autocast",
    "parse_",
    "import_ir_module",
    "fbgemm_",
    "q_",
    "sym_",
    "unify_",
    "merge_type",
    "init_num",
    "vitals",
    "read_vitals",
    "use_deterministic",
    "are_deterministic",
    "compiled_with",
)
_TORCH_SKIP = {
    "promote_types",
    "result_type",
    "wait",
    "fork",
    "numel",
    "cudnn_is_acceptable",
    "from_file",
    "broadcast_shapes",
    "typename",
    "compile",
    "cond",
    "vmap",
    "load",
    "save",
    "manual_seed",
    "seed",
    "initial_seed",
}

_FUNCTIONAL_SKIP = {
    "assert_int_or_pair",
    "has_torch_function",
    "has_torch_function_unary",
    "has_torch_function_variadic",
    "handle_torch_function",
    "boolean_dispatch",
}

TENSOR_DUNDERS = (
    "__add__",
    "__radd__",
    "__iadd__",
    "__sub__",
    "__rsub__",
    "__isub__",
    "__mul__",
    "__rmul__",
    "__imul__",
    "__matmul__",
    "__rmatmul__",
    "__imatmul__",
    "__truediv__",
    "__rtruediv__",
    "__itruediv__",
    "__div__",
    "__rdiv__",
    "__idiv__",
    "__floordiv__",
    "__rfloordiv__",
    "__ifloordiv__",
    "__mod__",
    "__rmod__",
    "__imod__",
    "__pow__",
    "__rpow__",
    "__ipow__",
    "__neg__",
    "__pos__",
    "__abs__",
    "__invert__",
    "__and__",
    "__rand__",
    "__iand__",
    "__or__",
    "__ror__",
    "__ior__",
    "__xor__",
    "__rxor__",
    "__ixor__",
    "__lshift__",
    "__rlshift__",
    "__ilshift__",
    "__rshift__",
    "__rrshift__",
    "__irshift__",
    "__lt__",
    "__le__",
    "__gt__",
    "__ge__",
    "__eq__",
    "__ne__",
    "__getitem__",
    "__setitem__",
)
_TENSOR_SKIP = {
    # metadata queries, no work
    "size",
    "dim",
    "ndimension",
    "numel",
    "nelement",
    "stride",
    "storage_offset",
    "data_ptr",
    "element_size",
    "get_device",
    "type",
    "dense_dim",
    "sparse_dim",
    "has_names",
    "dim_order",
    "untyped_storage",
    "storage",
    "storage_type",
    "tolist",
    "numpy",
    "nbytes",
    "itemsize",
    # autograd / module plumbing
    "backward",
    "register_hook",
    "register_post_accumulate_grad_hook",
    "retain_grad",
    "requires_grad_",
    "module_load",
    "share_memory_",
    "apply_",
    "map_",
    "map2_",
    "reinforce",
    "as_subclass",
    "_make_subclass",
    "new_tensor",
}
_TENSOR_SKIP_PREFIXES = ("is_", "_")


def _public_builtin(obj: Any) -> bool:
    return isinstance(obj, types.BuiltinFunctionType)


def select_targets() -> List[Tuple[Any, str, str]]:
    """(owner, attribute, marker mod) for every torch callable to wrap."""
    import torch.nn.functional as F

    targets: List[Tuple[Any, str, str]] = []
    for name, obj in sorted(vars(torch).items()):
        if name.startswith("_foreach_"):
            if _public_builtin(obj):
                targets.append((torch, name, "torch"))
            continue
        if name.startswith("_") or name in _TORCH_SKIP or name.startswith(_TORCH_SKIP_PREFIXES):
            continue
        if _public_builtin(obj) and getattr(obj, "__module__", None) == "torch":
            targets.append((torch, name, "torch"))
        elif isinstance(obj, types.FunctionType) and obj.__module__ == "torch.functional":
            targets.append((torch, name, "torch"))

    linalg = getattr(torch, "linalg", None)
    for name, obj in sorted(vars(linalg).items()) if linalg is not None else ():
        if name.startswith("_") or inspect.isclass(obj):
            continue
        if _public_builtin(obj) or (isinstance(obj, types.FunctionType) and obj.__module__.startswith("torch")):
            targets.append((linalg, name, "torch.linalg"))

    for name, obj in sorted(vars(F).items()):
        if name.startswith("_") or name in _FUNCTIONAL_SKIP or inspect.isclass(obj):
            continue
        if isinstance(obj, types.FunctionType) and obj.__module__ == "torch.nn.functional":
            targets.append((F, name, "torch.nn.functional"))
        elif _public_builtin(obj) and getattr(obj, "__module__", None) in ("torch", "torch._C._nn"):
            targets.append((F, name, "torch.nn.functional"))

    tensor = torch.Tensor
    for name in sorted(dir(tensor)):
        if name.startswith("__"):
            if name not in TENSOR_DUNDERS:
                continue
        elif name.startswith(_TENSOR_SKIP_PREFIXES) or name in _TENSOR_SKIP:
            continue
        try:
            raw = inspect.getattr_static(tensor, name)
        except AttributeError:
            continue
        if isinstance(raw, (staticmethod, classmethod, property)) or not callable(raw):
            continue
        if type(raw).__name__ in ("getset_descriptor", "member_descriptor", "classmethod_descriptor"):
            continue
        targets.append((tensor, name, "Tensor"))
    return targets


def _rnn_classes() -> List[type]:
    nn = torch.nn
    names = ("RNN", "LSTM", "GRU", "RNNCell", "LSTMCell", "GRUCell")
    return [getattr(nn, n) for n in names if hasattr(nn, n) and "forward" in getattr(nn, n).__dict__]


# -- the annotated call --------------------------------------------------------------------------------

_tracing_state = getattr(torch._C, "_get_tracing_state", lambda: None)


def _find_is_compiling() -> Callable[[], bool]:
    compiler = getattr(torch, "compiler", None)
    fn = getattr(compiler, "is_compiling", None)
    if fn is None:
        try:
            from torch._dynamo import is_compiling as fn  # PyTorch 2.0, 2.1
        except Exception:
            fn = None
    return fn if fn is not None else (lambda: False)


# torch.compile traces through the wrappers: when annotation is on they step aside while compiling
# (checked only on the active path, so it costs nothing without a profiler).
_is_compiling = _find_is_compiling()


def _call(
    orig: Callable,
    mod: str,
    op: str,
    label: str,
    args: tuple,
    kwargs: dict,
    frame,
    module_obj: Any = None,
    names: Sequence[str] = (),
) -> Any:
    """Run ``orig`` inside the trace + (module) + argument markers; hook its autograd nodes."""
    state = STATE
    if _tracing_state() is not None:  # torch.jit.trace records the ATen calls; leave them alone
        return orig(*args, **kwargs)
    opts = state.options
    tls = state.tls
    backend = state.backend
    try:
        func_stack, trace, modules = state.stack.capture(frame, label, opts.enable_function_stack)
        tensors: List[Any] = []
        desc = describe_args(args if module_obj is None else args[1:], kwargs, opts.record_shapes, tensors, names)
        callid = state.next_callid()
        trace_txt = trace_marker(trace, func_stack, modules)
        texts = [trace_txt]
        if module_obj is not None:
            try:
                extra = module_obj.extra_repr()
            except Exception:
                extra = ""
            texts.append(module_marker(mod, extra))
        texts.append(arg_marker(mod, op, callid, desc))
        link = opts.link_backward and tensors and torch.is_grad_enabled()
        stop = _backward.input_grad_fns(tensors) if link else None
    except Exception:  # never let annotation break the user's program
        return orig(*args, **kwargs)
    for text in texts:
        backend.push(text)
    tls.depth += 1
    try:
        out = orig(*args, **kwargs)
    finally:
        tls.depth -= 1
        for _ in texts:
            backend.pop()
    if link:
        try:
            _backward.attach(out, stop, trace_txt, mod, op, callid, desc)
        except Exception:  # pragma: no cover
            pass
    return out


def _copy_meta(wrapper: Callable, orig: Callable, name: str) -> Callable:
    try:
        functools.update_wrapper(wrapper, orig)
    except Exception:  # pragma: no cover
        pass
    wrapper.__name__ = name
    wrapper.__dlprof_original__ = orig
    return wrapper


def op_name(mod: str, attr: str, orig: Callable) -> str:
    """The marker's ``op`` of ``<mod>.<attr>``: the attribute name, but ATen's name for ``torch.linalg``
    (``linalg_vector_norm``)."""
    if mod == "torch.linalg":
        name = getattr(orig, "__name__", "")
        return name if isinstance(name, str) and name.startswith("linalg_") else "linalg_" + attr
    return attr


def make_wrapper(orig: Callable, mod: str, op: str, attr: str = "") -> Callable:
    """Wrapper for a function or an unbound method (``self`` arrives as the first argument). ``attr``: the
    attribute name the callable is reached by, when it differs from ``op`` (read in its docstring)."""
    state = STATE
    getframe = sys._getframe
    names: List[Any] = []  # positional parameter names, found on the first annotated call

    def wrapper(*args, **kwargs):
        if not state.active or _is_compiling() or state.tls.depth:
            return orig(*args, **kwargs)
        if not names:
            try:
                names.append(tuple(positional_names(orig, attr or op, method=mod == "Tensor")))
            except Exception:
                names.append(())
        return _call(orig, mod, op, op, args, kwargs, getframe(1), names=names[0])

    return _copy_meta(wrapper, orig, attr or op)


def make_module_wrapper(orig_forward: Callable, cls: type) -> Callable:
    """Wrapper for ``cls.forward`` of a module whose work nothing else annotates (RNNs)."""
    state = STATE
    getframe = sys._getframe
    mod = cls.__module__
    op = cls.__name__

    def forward(self, *args, **kwargs):
        if not state.active or _is_compiling() or state.tls.depth:
            return orig_forward(self, *args, **kwargs)
        return _call(orig_forward, mod, op, op, (self,) + args, kwargs, getframe(1), module_obj=self)

    return _copy_meta(forward, orig_forward, "forward")


def install_ops(patcher: Patcher, wrap_rnn: bool = True) -> int:
    count = 0
    for owner, name, mod in select_targets():
        orig = getattr(owner, name)
        if getattr(orig, "__dlprof_original__", None) is not None:
            continue  # already ours (should not happen: install is guarded)
        patcher.patch(owner, name, make_wrapper(orig, mod, op_name(mod, name, orig), name))
        count += 1
    if wrap_rnn:
        for cls in _rnn_classes():
            orig = cls.__dict__["forward"]
            patcher.patch(cls, "forward", make_module_wrapper(orig, cls))
            count += 1
    return count


def install_jit_guard(persistent: Patcher, patched: Patcher) -> None:
    """``torch.jit.script`` compiles Python source and cannot compile the wrappers: while it runs (nested
    calls included) the original torch callables are put back. Scripted code then runs without our
    markers (``emit_nvtx`` still annotates its ATen ops)."""
    jit = getattr(torch, "jit", None)
    orig = getattr(jit, "script", None)
    if orig is None:
        return
    lock = threading.RLock()
    depth = [0]

    def script(*args, **kwargs):
        with lock:
            if depth[0] == 0:
                patched.suspend()
            depth[0] += 1
            try:
                return orig(*args, **kwargs)
            finally:
                depth[0] -= 1
                if depth[0] == 0 and STATE.installed:
                    patched.resume()

    _copy_meta(script, orig, "script")
    persistent.patch(jit, "script", script)
