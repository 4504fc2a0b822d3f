"""Direction: backward ranges linked to the forward op that built the autograd nodes.

After an annotated forward call whose outputs need gradients, the autograd nodes the call created are
found by walking from the outputs' ``grad_fn`` through ``next_functions``, stopping at the inputs'
``grad_fn`` (nodes of earlier ops), at ``AccumulateGrad`` (leaves), at nodes already claimed by another
call (tagged in ``node.metadata['dlprof_callid']``) and after ``max_backward_nodes`` nodes.

Each such node gets a pre-hook (``register_prehook``) that pushes the forward op's trace marker and a
``bprop`` argument marker, and a post-hook (``register_hook``) that pops both. Node hooks run on the thread
that executes the node (the caller's thread for CPU work, an autograd device thread for CUDA work)
right around the node's ``apply``, so the range encloses the node's work, including PyTorch's own
``emit_nvtx`` range for the node (``MmBackward0, seq = N``). A forward op that built several nodes
(``cross_entropy`` -> ``NllLossBackward0`` + ``LogSoftmaxBackward0``) has one bprop range per node, all with
the same ``fwdCallid``.
"""
from __future__ import annotations

from typing import Any, Dict, Iterator, List

from .markers import bprop_marker
from .runtime import STATE

__all__ = ["input_grad_fns", "attach", "iter_tensors", "supported"]

_TAG = "dlprof_callid"


def supported() -> bool:
    import torch

    probe = torch.ones(1, requires_grad=True) * 1
    node = probe.grad_fn
    return hasattr(node, "register_prehook") and hasattr(node, "register_hook")


def iter_tensors(value: Any, depth: int = 0) -> Iterator[Any]:
    import torch

    if isinstance(value, torch.Tensor):
        yield value
    elif depth < 3 and isinstance(value, (list, tuple)):
        for v in value[:64]:
            yield from iter_tensors(v, depth + 1)
    elif depth < 3 and isinstance(value, dict):
        for v in list(value.values())[:64]:
            yield from iter_tensors(v, depth + 1)


def input_grad_fns(tensors: List[Any]) -> List[Any]:
    """grad_fn of the input tensors, taken before the call (an in-place op replaces it)."""
    fns = []
    for t in tensors:
        if t.requires_grad:
            fn = t.grad_fn
            if fn is not None:
                fns.append(fn)
    return fns


def _make_hooks(trace_txt: str, bprop_txt: str):
    state = STATE

    def pre_hook(grad_outputs):
        stack = state.tls.bwd
        if state.active:
            backend = state.backend
            backend.push(trace_txt)
            backend.push(bprop_txt)
            stack.append(backend)
        else:
            stack.append(None)
        return None

    def post_hook(grad_inputs, grad_outputs):
        stack = state.tls.bwd
        if stack:
            backend = stack.pop()
            if backend is not None:
                backend.pop()
                backend.pop()
        return None

    return pre_hook, post_hook


def attach(outputs: Any, stop_fns: List[Any], trace_txt: str, mod: str, op: str, callid: int,
           args: List[Dict[str, Any]]) -> int:
    """Hook the autograd nodes created by one forward call; returns how many were hooked."""
    roots = []
    for t in iter_tensors(outputs):
        if t.requires_grad:
            fn = t.grad_fn
            if fn is not None:
                roots.append(fn)
    if not roots:
        return 0
    keep = list(stop_fns)          # hold references so ids stay unique during the walk
    stop = {id(fn) for fn in stop_fns}
    seen = set()
    todo = roots[::-1]
    hooked = 0
    limit = STATE.options.max_backward_nodes
    while todo and hooked < limit:
        node = todo.pop()
        nid = id(node)
        if nid in seen or nid in stop:
            continue
        seen.add(nid)
        keep.append(node)
        name = type(node).__name__
        if name == "AccumulateGrad":
            continue
        try:
            meta = node.metadata
        except Exception:
            meta = None
        if meta is not None:
            if _TAG in meta:
                continue
            meta[_TAG] = callid
        try:
            pre_hook, post_hook = _make_hooks(trace_txt, bprop_marker(mod, op, callid, name, args))
            node.register_prehook(pre_hook)
            node.register_hook(post_hook)
        except Exception:
            continue
        hooked += 1
        try:
            nexts = node.next_functions
        except Exception:
            nexts = ()
        for nxt, _ in reversed(nexts):
            if nxt is not None:
                todo.append(nxt)
    return hooked
