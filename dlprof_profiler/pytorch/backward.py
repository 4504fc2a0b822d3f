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

Two kinds of nodes no forward call creates get the backward call of the op they belong to:

- ``AccumulateGrad`` (a parameter's gradient written into ``.grad``): its node lives as long as the
  parameter and serves every iteration, so it is hooked once and, when it runs, takes the backward call of
  the node that produced the gradient (autograd runs it right after that node: its post-hook hands the call
  over). Its range then belongs to the op that used the parameter (``linear``: ``AddmmBackward0`` +
  ``TBackward0`` + two ``AccumulateGrad``, one backward call).
- the ``AsStridedBackward0`` autograd makes afresh for a view whose base an in-place op changed (``flat``
  after ``flat[:, :8].relu_()``): it appears when a later op reads the view's ``grad_fn`` and leads to the
  in-place op's ``CopySlices``, so it joins that op's backward call.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Dict, Iterator, List

from .markers import bprop_marker
from .runtime import STATE

__all__ = ["input_grad_fns", "attach", "iter_tensors", "supported", "BackwardCall"]

_TAG = "dlprof_callid"  # node metadata: the forward call that created the node
_OWNER = "dlprof_owner"  # node metadata: its backward call (_Owner)
_ACC = "dlprof_accumulator"  # AccumulateGrad metadata: its hand-over holder (_Accumulator)
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
    """grad_fn of the input tensors, taken before the call (an in-place op replaces it). A view's grad_fn made
    afresh after an in-place op on its base joins that op's backward call (see the module's docstring)."""
    fns = []
    for t in tensors:
        if t.requires_grad:
            fn = t.grad_fn
            if fn is not None:
                fns.append(fn)
                if type(fn).__name__.startswith("AsStrided"):
                    _adopt_regenerated_view(fn)
    return fns


class _Owner:
    """One forward call's backward: its trace marker, its BackwardCall, and the bprop marker text of each
    node name (around the backward call id: head + id + tail)."""

    __slots__ = ("trace_txt", "call", "mod", "op", "callid", "args", "texts")

    def __init__(self, trace_txt: str, call: BackwardCall, mod: str, op: str, callid: int, args: list) -> None:
        self.trace_txt, self.call = trace_txt, call
        self.mod, self.op, self.callid, self.args = mod, op, callid, args
        self.texts: Dict[str, tuple] = {}

    def text(self, node: str) -> tuple:
        found = self.texts.get(node)
        if found is None:
            head, _, tail = bprop_marker(self.mod, self.op, _SENTINEL, self.callid, node, self.args).partition(
                str(_SENTINEL)
            )
            found = self.texts[node] = (head, tail)
        return found


class _Accumulator:
    """What an AccumulateGrad node's hooks read: the owner of the node that produced its gradient."""

    __slots__ = ("owner",)

    def __init__(self) -> None:
        self.owner: _Owner | None = None


def _push(owner: _Owner, node: str, key: Any) -> None:
    """Push an owner's trace marker and the bprop marker of one of its nodes on the calling thread."""
    state = STATE
    stack = state.tls.bwd
    if state.active:
        backend = state.backend
        task = _graph_task_id() if _graph_task_id is not None else None
        head, tail = owner.text(node)
        backend.push(owner.trace_txt)
        backend.push(head + str(owner.call.callid_for(key, task)) + tail)
        stack.append(backend)
    else:
        stack.append(None)


def _pop() -> None:
    stack = STATE.tls.bwd
    if stack:
        backend = stack.pop()
        if backend is not None:
            backend.pop()
            backend.pop()


def _make_hooks(owner: _Owner, node: str, node_index: int, accumulators: List[_Accumulator]):
    def pre_hook(grad_outputs):
        _push(owner, node, node_index)
        return None

    def post_hook(grad_inputs, grad_outputs):
        _pop()
        for acc in accumulators:  # the parameters' AccumulateGrad nodes run next, in this backward call
            acc.owner = owner
        return None

    return pre_hook, post_hook


def _accumulator(node: Any, meta: Any) -> _Accumulator | None:
    """The (once hooked) hand-over holder of an AccumulateGrad node."""
    if meta is None:
        return None
    acc = meta.get(_ACC)
    if acc is not None:
        return acc
    acc = _Accumulator()
    key = ("AccumulateGrad", id(acc))

    def pre_hook(grad_outputs):
        owner = acc.owner
        if owner is None:
            STATE.tls.bwd.append(None)
        else:
            _push(owner, "AccumulateGrad", key)
        return None

    def post_hook(grad_inputs, grad_outputs):
        _pop()
        acc.owner = None  # a later gradient without an annotated producer stays unattributed
        return None

    try:
        node.register_prehook(pre_hook)
        node.register_hook(post_hook)
    except Exception:
        return None
    meta[_ACC] = acc
    return acc


def _hook(node: Any, meta: Any, owner: _Owner, node_index: int, accumulators: List[_Accumulator]) -> bool:
    pre_hook, post_hook = _make_hooks(owner, type(node).__name__, node_index, accumulators)
    try:
        node.register_prehook(pre_hook)
        node.register_hook(post_hook)
    except Exception:
        return False
    if meta is not None:
        meta[_OWNER] = owner
    return True


def _adopt_regenerated_view(node: Any) -> None:
    try:
        meta = node.metadata
        if _TAG in meta:
            return
        base = node.next_functions[0][0] if node.next_functions else None
        owner = base.metadata.get(_OWNER) if base is not None else None
        if owner is None:
            return
        meta[_TAG] = -1
        _hook(node, meta, owner, -2, [])
    except Exception:  # never let annotation break the user's program
        pass


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
    stop = {id(fn) for fn in stop_fns}
    seen = set()
    todo = roots[::-1]
    hooked = 0
    owner = _Owner(trace_txt, BackwardCall(), mod, op, callid, args)
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
            continue  # handed over by the node that feeds it (its parent in this walk)
        try:
            meta = node.metadata
        except Exception:
            meta = None
        if meta is not None:
            if _TAG in meta:
                continue
            meta[_TAG] = callid
        accumulators: List[_Accumulator] = []
        try:
            owner.text(name)  # built now, while the forward call runs
        except Exception:
            continue
        if not _hook(node, meta, owner, hooked, accumulators):
            continue
        hooked += 1
        try:
            nexts = node.next_functions
        except Exception:
            nexts = ()
        for nxt, _ in reversed(nexts):
            if nxt is None:
                continue
            if type(nxt).__name__ == "AccumulateGrad":
                try:
                    acc = _accumulator(nxt, nxt.metadata)
                except Exception:
                    acc = None
                if acc is not None:
                    accumulators.append(acc)
            else:
                todo.append(nxt)
    return hooked
