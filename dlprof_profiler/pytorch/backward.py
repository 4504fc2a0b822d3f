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
(``linear`` -> ``AddmmBackward0`` + ``TBackward0``, ``cross_entropy`` -> ``NllLossBackward0`` +
``LogSoftmaxBackward0``) has one bprop range per node, all with the same ``fwdCallid``, and all with the same
``callid``: the *backward call* id, new for each backward pass that runs the call's nodes (autograd's graph
task id tells passes apart; without it, a node running twice starts a new call). Its ranges need not be
adjacent (autograd interleaves the nodes of other ops), so one backward call is the set of bprop ranges with
one ``(process, callid)``: counting those, not the ranges, gives one bprop call per forward call and pass.
Backward call ids come from the counter of forward call ids, so the two never collide.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Dict, Iterator, List

from .markers import bprop_marker
from .runtime import STATE

__all__ = ["input_grad_fns", "attach", "iter_tensors", "supported", "BackwardCall"]

_TAG = "dlprof_callid"
_SENTINEL = -918273645  # placeholder callid of the bprop text template, replaced by the backward call id
_lock = threading.Lock()


def _find_graph_task_id() -> Callable[[], int] | None:
    import torch

    return getattr(torch._C, "_current_graph_task_id", None)


class BackwardCall:
    """The backward call id of one forward call's nodes: the same for every node that runs in one backward
    pass, a new one for the next pass (``retain_graph=True`` and a second ``backward()``)."""

    __slots__ = ("callid", "seen", "task")

    def __init__(self) -> None:
        self.task: int | None = None
        self.callid = -1
        self.seen: set = set()

    def callid_for(self, node_index: int, task: int | None) -> int:
        with _lock:
            if task is not None:
                new = self.callid < 0 or task != self.task
            else:  # no graph task id in this PyTorch: a node that runs again starts a new pass
                new = self.callid < 0 or node_index in self.seen
            if new:
                self.callid = STATE.next_callid()
                self.task = task
                self.seen = set()
            if task is None:
                self.seen.add(node_index)
            return self.callid


def supported() -> bool:
    import torch

    probe = torch.ones(1, requires_grad=True) * 1
    node = probe.grad_fn
    return hasattr(node, "register_prehook") and hasattr(node, "register_hook")


_graph_task_id = _find_graph_task_id()


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


def _make_hooks(trace_txt: str, bprop_txt: tuple[str, str], call: BackwardCall, node_index: int):
    state = STATE
    head, tail = bprop_txt
    graph_task_id = _graph_task_id

    def pre_hook(grad_outputs):
        stack = state.tls.bwd
        if state.active:
            backend = state.backend
            task = graph_task_id() if graph_task_id is not None else None
            backend.push(trace_txt)
            backend.push(head + str(call.callid_for(node_index, task)) + tail)
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


def attach(
    outputs: Any, stop_fns: List[Any], trace_txt: str, mod: str, op: str, callid: int, args: List[Dict[str, Any]]
) -> int:
    """Hook the autograd nodes created by one forward call; returns how many were hooked."""
    roots = []
    for t in iter_tensors(outputs):
        if t.requires_grad:
            fn = t.grad_fn
            if fn is not None:
                roots.append(fn)
    if not roots:
        return 0
    keep = list(stop_fns)  # hold references so ids stay unique during the walk
    call = BackwardCall()
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
            text = bprop_marker(mod, op, _SENTINEL, callid, name, args)
            head, _, tail = text.partition(str(_SENTINEL))
            pre_hook, post_hook = _make_hooks(trace_txt, (head, tail), call, hooked)
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
