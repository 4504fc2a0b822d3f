"""Process-wide state shared by the wrappers, hooks and metadata of the PyTorch instrumentation."""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass
from typing import Any, List, Optional

from .backend import NullBackend

__all__ = ["Options", "STATE"]


@dataclass
class Options:
    enable_function_stack: bool = True  # funcStack in the trace marker
    record_shapes: bool = True  # tensor shapes in the argument marker
    link_backward: bool = True  # bprop ranges via autograd node hooks
    max_backward_nodes: int = 64  # autograd nodes hooked per forward op
    distinguish_instances: bool = False  # nn.Module objects called from one line get (2), (3)...
    wrap_dataloader: bool = True
    wrap_optimizer: bool = True
    wrap_rnn: bool = True


class _ThreadState(threading.local):
    depth = 0  # > 0 while inside a patched call: inner torch calls are not annotated

    def __init__(self) -> None:
        self.bwd: List[Any] = []  # backends pushed by backward pre-hooks, popped by post-hooks
        self.opt: List[Any] = []  # backends pushed by optimizer step pre-hooks


class _State:
    def __init__(self) -> None:
        self.installed = False
        self.active = False  # installed and backend.enabled: wrappers build markers
        self.forked_child = False  # this process is a fork() child (DataLoader worker): nothing is recorded
        self.backend: Any = NullBackend(enabled=False)
        self.options = Options()
        self.tls = _ThreadState()
        self.callids = itertools.count(1)
        self.stack: Optional[Any] = None
        self.config: Optional[Any] = None
        self.lock = threading.RLock()

    def next_callid(self) -> int:
        return next(self.callids)


STATE = _State()
