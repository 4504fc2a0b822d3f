"""Scope ranges the engine keys on: DataLoader batches and optimizer steps.

- ``enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__`` around each ``__next__`` of a DataLoader
  iterator (the name PyTorch's own ``record_function`` gives it), so the engine classes the time as data
  loading. Torch calls made while fetching the batch (collate) or creating the iterator
  (``DataLoader.__iter__``: sampler seed, worker start-up) are not annotated.
- ``Optimizer.step#SGD.step`` around each optimizer step (the engine's default PyTorch key node), through
  the global optimizer step pre/post hooks (PyTorch >= 2.0), else by wrapping ``step`` of the optimizers in
  ``torch.optim``.
"""

from __future__ import annotations

from typing import Any, Callable, List

import torch

from .runtime import STATE

__all__ = ["install_dataloader", "install_optimizer", "optimizer_text"]

_OPT_TEXTS: dict = {}


def optimizer_text(optimizer: Any) -> str:
    cls = type(optimizer)
    text = _OPT_TEXTS.get(cls)
    if text is None:
        text = _OPT_TEXTS.setdefault(cls, "Optimizer.step#%s.step" % cls.__name__)
    return text


def install_dataloader(patcher) -> bool:
    try:
        from torch.utils.data import dataloader as _dl
    except Exception:  # pragma: no cover
        return False
    cls = getattr(_dl, "_BaseDataLoaderIter", None)
    if cls is None or "__next__" not in cls.__dict__:
        return False
    orig = cls.__dict__["__next__"]
    state = STATE
    texts: dict = {}

    def __next__(self):
        config = state.config
        if not state.active:
            batch = orig(self)
            if config is not None and config.wants_loader:
                config.on_batch(self, batch)
            return batch
        kind = type(self)
        text = texts.get(kind)
        if text is None:
            text = getattr(self, "_profile_name", None) or "enumerate(DataLoader)#%s.__next__" % kind.__name__
            texts[kind] = text
        backend = state.backend
        tls = state.tls
        backend.push(text)
        tls.depth += 1
        try:
            batch = orig(self)
        finally:
            tls.depth -= 1
            backend.pop()
        if config is not None and config.wants_loader:
            config.on_batch(self, batch)
        return batch

    __next__.__dlprof_original__ = orig
    __next__.__wrapped__ = orig
    patcher.patch(cls, "__next__", __next__)

    loader = getattr(_dl, "DataLoader", None)
    if loader is not None and "__iter__" in loader.__dict__:
        orig_iter = loader.__dict__["__iter__"]

        def __iter__(self):
            # Creating the iterator (sampler seed, worker start-up) is data loading, not model ops:
            # leave it unannotated. Workers forked here inherit depth > 0 and stay unannotated too.
            if not state.active:
                return orig_iter(self)
            tls = state.tls
            tls.depth += 1
            try:
                return orig_iter(self)
            finally:
                tls.depth -= 1

        __iter__.__dlprof_original__ = orig_iter
        __iter__.__wrapped__ = orig_iter
        patcher.patch(loader, "__iter__", __iter__)
    return True


def _pre_step(optimizer, args=None, kwargs=None):
    state = STATE
    stack = state.tls.opt
    if not state.active:
        stack.append(None)
        return None
    config = state.config
    if config is not None:
        config.refresh()
    backend = state.backend
    backend.push(optimizer_text(optimizer))
    stack.append(backend)
    return None


def _post_step(optimizer, args=None, kwargs=None):
    stack = STATE.tls.opt
    if stack:
        backend = stack.pop()
        if backend is not None:
            backend.pop()
    return None


def install_optimizer(patcher, handles: List[Any]) -> str:
    """Returns ``hooks`` or ``wrapped`` (older PyTorch)."""
    try:
        from torch.optim import optimizer as _opt
    except Exception:  # pragma: no cover
        return ""
    pre = getattr(_opt, "register_optimizer_step_pre_hook", None)
    post = getattr(_opt, "register_optimizer_step_post_hook", None)
    if pre is not None and post is not None:
        handles.append(pre(_pre_step))
        handles.append(post(_post_step))
        return "hooks"
    # PyTorch < 2.0: wrap step of every optimizer class torch ships
    for name in dir(torch.optim):
        cls = getattr(torch.optim, name)
        if isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer) and "step" in cls.__dict__:
            patcher.patch(cls, "step", _wrap_step(cls.__dict__["step"]))
    return "wrapped"


def _wrap_step(orig: Callable) -> Callable:
    def step(self, *args, **kwargs):
        _pre_step(self)
        try:
            return orig(self, *args, **kwargs)
        finally:
            _post_step(self)

    step.__dlprof_original__ = orig
    step.__wrapped__ = orig
    return step
