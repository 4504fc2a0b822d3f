"""PyTorch instrumentation: NVTX ranges that DLProf's engine turns into named, typed ops.

Usage, as with DLProf's ``nvidia_dlprof_pytorch_nvtx``::

    import dlprof_profiler.pytorch as dlprof_pytorch
    dlprof_pytorch.init()
    with torch.autograd.profiler.emit_nvtx(enabled=torch.cuda.is_available()):  # optional; CUDA PyTorch only
        train()

then profile with ``dlprof python train.py`` (or ``nsys profile -t cuda,nvtx ...``).
Without a profiler attached the wrappers call straight through (see :mod:`.backend` for the detection).

Markers per annotated call: nested push/pop ranges in the default NVTX domain, outermost first
(formats in :mod:`.markers`):

1. trace marker ``{'traceMarker': ['/path/train.py:57', '/path/model.py:30'], 'funcStack':
   '/<module>/main/model/conv1/conv2d', 'modules': [('model', 'Net'), ('conv1', 'Conv2d')]}`` (user frames
   only, script frame first; modules named by their attribute path, their classes in ``modules``; funcStack
   rules in :mod:`.stack`);
2. module marker ``{'mod': 'torch.nn.modules.rnn', 'strRepr': '16, 32, batch_first=True'}`` (RNN modules only);
3. argument marker ``{'mod': 'torch.nn.functional', 'op': 'conv2d', 'callid': 12, 'dir': 'fprop',
   'args': [{'name': '', 'type': 'tensor', 'shape': (8, 3, 32, 32), 'dtype': 'float32'}, ...]}``.

Backward (:mod:`.backward`): each autograd node created by an annotated call runs inside the call's trace
marker and ``{'mod': ..., 'op': ..., 'callid': 40, 'dir': 'bprop', 'fwdCallid': 12, 'node':
'ConvolutionBackward0', 'args': [...same as forward...]}`` (``callid``: the backward call, one per forward call
and backward pass, shared by its nodes). Scopes (:mod:`.scopes`): ``enumerate(DataLoader)#...__next__`` and
``Optimizer.step#SGD.step``. Config marker (:mod:`.metadata`): ``{'model_config': {...}}``.

``dlprof python train.py`` calls :func:`init` for an unmodified script when it imports torch (the startup hook,
``dlprof_profiler/torch_startup``); calling it in the script as well changes nothing.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator, Optional

from .backend import (
    LibNvtxBackend,
    NullBackend,
    NvtxBackend,
    Range,
    RecordFunctionBackend,
    RecordingBackend,
    profiler_attached,
    resolve_backend,
)
from .runtime import STATE, Options

__all__ = [
    "init",
    "uninstall",
    "instrumented",
    "is_installed",
    "is_active",
    "enable",
    "disable",
    "get_backend",
    "get_config",
    "NvtxBackend",
    "LibNvtxBackend",
    "RecordFunctionBackend",
    "RecordingBackend",
    "NullBackend",
    "Range",
    "profiler_attached",
]

_patcher: Any = None
_handles: list = []
_user_enabled = True


def _update_active() -> None:
    STATE.active = bool(
        STATE.installed and _user_enabled and not STATE.forked_child and getattr(STATE.backend, "enabled", False)
    )


def _after_fork_in_child() -> None:
    """A fork() child (DataLoader workers, multiprocessing with the fork start method) inherits the
    instrumentation, but Nsight Systems records it only with ``--trace-fork-before-exec=true``: annotation
    stops there, so workers spend nothing on markers nobody records. :func:`enable` turns it back on."""
    STATE.forked_child = True
    _update_active()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def init(
    enable_function_stack: Optional[bool] = None,
    record_shapes: Optional[bool] = None,
    *,
    backend: Any = None,
    link_backward: Optional[bool] = None,
    distinguish_instances: Optional[bool] = None,
    max_backward_nodes: Optional[int] = None,
    wrap_dataloader: Optional[bool] = None,
    wrap_optimizer: Optional[bool] = None,
    wrap_rnn: Optional[bool] = None,
) -> Any:
    """Patch torch so its calls emit DLProf markers. Returns the backend in use.

    ``backend``: ``"auto"`` (default: NVTX through the NVTX library, else the nvtx package; active only when
    a profiler is attached), ``"nvtx"`` (the same, always active unless ``NVTX_DISABLE``/``DLPROF_DISABLE``),
    ``"record_function"`` (torch.profiler ranges with the same texts), ``"recording"``, ``"null"``, or an
    object with ``enabled``, ``push(text)``, ``pop()``.

    Calling ``init()`` again is harmless: it changes only the options (and backend) given explicitly;
    the ``wrap_*`` options take effect only after :func:`uninstall`. Options left at ``None`` take the
    defaults of :class:`runtime.Options` on the first call. ``torch.jit.script`` runs with the original
    torch callables (scripted code is not annotated); ``torch.jit.trace`` and ``torch.compile`` see through
    the wrappers.
    """
    global _patcher
    import torch  # noqa: F401  - fail early with a clear ImportError

    from . import metadata as _metadata
    from . import patching as _patching
    from . import scopes as _scopes
    from .stack import StackCapture

    given = {
        "enable_function_stack": enable_function_stack,
        "record_shapes": record_shapes,
        "link_backward": link_backward,
        "distinguish_instances": distinguish_instances,
        "max_backward_nodes": max_backward_nodes,
        "wrap_dataloader": wrap_dataloader,
        "wrap_optimizer": wrap_optimizer,
        "wrap_rnn": wrap_rnn,
    }
    with STATE.lock:
        if STATE.installed:
            for key, value in given.items():
                if value is not None and key not in ("wrap_dataloader", "wrap_optimizer", "wrap_rnn"):
                    setattr(STATE.options, key, value)
            if STATE.stack is not None:
                STATE.stack.distinguish_instances = STATE.options.distinguish_instances
            if backend is not None:
                STATE.backend = resolve_backend(backend)
                _update_active()
                if STATE.config is not None:
                    STATE.config.emit(force=True)
            return STATE.backend

        options = Options()
        for key, value in given.items():
            if value is not None:
                setattr(options, key, value)
        if options.link_backward:
            from .backward import supported

            options.link_backward = supported()
        STATE.options = options
        STATE.backend = resolve_backend("auto" if backend is None else backend)
        STATE.stack = StackCapture(distinguish_instances=options.distinguish_instances)
        STATE.config = _metadata.ModelConfig()

        patcher = _patching.Patcher()
        persistent = _patching.Patcher()  # patches that stay while torch.jit.script suspends the others
        handles: list = []
        try:
            _patching.install_ops(patcher, wrap_rnn=options.wrap_rnn)
            if options.wrap_dataloader:
                _scopes.install_dataloader(patcher)
            if options.wrap_optimizer:
                _scopes.install_optimizer(patcher, handles)
            _metadata.install_metadata_patches(patcher, STATE.config, handles)
            _patching.install_jit_guard(persistent, patcher)
        except Exception:
            for handle in handles:
                handle.remove()
            persistent.restore_all()
            patcher.restore_all()
            STATE.config = None
            raise
        _patcher = (persistent, patcher)
        _handles[:] = handles
        STATE.installed = True
        _update_active()
        STATE.config.emit(force=True)
        return STATE.backend


def uninstall() -> None:
    """Put back every torch attribute init() replaced and remove its hooks. Harmless when not installed.

    Autograd nodes hooked before stay hooked until their graph is freed; their hooks do nothing now."""
    global _patcher
    with STATE.lock:
        if not STATE.installed:
            return
        STATE.installed = False
        _update_active()
        for handle in _handles:
            try:
                handle.remove()
            except Exception:  # pragma: no cover
                pass
        _handles.clear()
        if STATE.config is not None:
            STATE.config.batch_hook = None
        if _patcher is not None:
            for patcher in _patcher:
                patcher.restore_all()
        _patcher = None


@contextlib.contextmanager
def instrumented(**kwargs: Any) -> Iterator[Any]:
    """``with instrumented(backend=...) as backend:`` - init() on entry; on exit uninstall() if this block
    installed the instrumentation (a surrounding init() stays in force)."""
    was_installed = STATE.installed
    backend = init(**kwargs)
    try:
        yield backend
    finally:
        if not was_installed:
            uninstall()


def is_installed() -> bool:
    return STATE.installed


def is_active() -> bool:
    """True when wrappers build and send markers: installed, enabled, backend enabled, and not in a fork()
    child (where nothing is recorded unless :func:`enable` was called there)."""
    return STATE.active


def enable() -> None:
    """Resume annotation after :func:`disable` (e.g. to profile only some iterations). In a fork() child it
    switches annotation on (for ``nsys profile --trace-fork-before-exec=true``)."""
    global _user_enabled
    _user_enabled = True
    STATE.forked_child = False
    _update_active()
    if STATE.active and STATE.config is not None:
        STATE.config.emit()


def disable() -> None:
    """Stop annotating; wrappers stay installed and call straight through."""
    global _user_enabled
    _user_enabled = False
    _update_active()


def get_backend() -> Any:
    return STATE.backend


def get_config() -> Optional[dict]:
    """A copy of the current model_config values (None before init())."""
    return None if STATE.config is None else dict(STATE.config.values)
