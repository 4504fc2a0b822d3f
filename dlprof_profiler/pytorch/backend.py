"""Where the instrumentation's ranges go: NVTX (the NVTX library through ctypes, else the ``nvtx`` package),
torch.profiler's own ranges (``record_function``), a recorder for tests, or nowhere.

Every backend has the same small interface:

``enabled``
    False when pushing ranges would be wasted work (no profiler attached, ``NVTX_DISABLE`` or
    ``DLPROF_DISABLE`` set). The wrappers then call straight through to torch.
``push(text)`` / ``pop()``
    A push/pop range in the *default* NVTX domain, message as a plain string, on the calling thread.

Detecting an attached profiler: the NVTX loader finds its tool through the environment variable
``NVTX_INJECTION64_PATH`` (``NVTX_INJECTION32_PATH`` on 32-bit hosts), which Nsight Systems, Nsight Compute
and DLProf set in the profiled process. Without it every NVTX call is a no-op, so the ``auto`` backend
switches itself off and the wrappers cost one attribute test. ``DLPROF_FORCE_NVTX=1`` overrides the check
(for a tool injected some other way).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

__all__ = [
    "NvtxBackend",
    "LibNvtxBackend",
    "RecordFunctionBackend",
    "RecordingBackend",
    "NullBackend",
    "Range",
    "profiler_attached",
    "disabled_by_env",
    "resolve_backend",
]

_TRUE = {"1", "true", "yes", "on"}


def _env_flag(name: str) -> bool:
    value = os.environ.get(name)
    return value is not None and value.strip().lower() in _TRUE


def disabled_by_env() -> bool:
    """True when the user switched annotations off (``NVTX_DISABLE`` as the nvtx package reads it, or
    ``DLPROF_DISABLE=1``)."""
    # The nvtx package treats any non-empty NVTX_DISABLE as "off"; do the same.
    if os.environ.get("NVTX_DISABLE"):
        return True
    return _env_flag("DLPROF_DISABLE")


def profiler_attached() -> bool:
    """True when an NVTX tool (Nsight Systems, DLProf) will receive our ranges."""
    if _env_flag("DLPROF_FORCE_NVTX"):
        return True
    return bool(os.environ.get("NVTX_INJECTION64_PATH") or os.environ.get("NVTX_INJECTION32_PATH"))


class NullBackend:
    """Accepts everything, records nothing. ``enabled`` decides whether wrappers build markers at all
    (``NullBackend(enabled=True)`` measures the cost of building markers without any NVTX call)."""

    name = "null"

    def __init__(self, enabled: bool = False) -> None:
        self.enabled = enabled

    def push(self, text: str) -> None:
        pass

    def pop(self) -> None:
        pass


class NvtxBackend:
    """Ranges through the ``nvtx`` PyPI package (any version >= 0.2.5), default domain.

    The nvtx package caches every message it sees as a registered string (``lru_cache`` without bound).
    Our argument markers carry a unique call id, so that cache would grow for ever; it is trimmed every
    ``trim_every`` pushes once it holds more than ``max_cached`` strings. Trimming is safe: NVTX copies
    the event attributes during the push, and registered-string handles stay valid in the tool.
    """

    name = "nvtx"

    def __init__(self, enabled: Optional[bool] = None, trim_every: int = 1024, max_cached: int = 4096) -> None:
        import nvtx  # the package is a dependency of dlprof-profiler

        self._nvtx = nvtx
        self._push = nvtx.push_range
        self._pop = nvtx.pop_range
        if enabled is None:
            nvtx_on = True
            probe = getattr(nvtx, "enabled", None)
            if callable(probe):
                try:
                    nvtx_on = bool(probe())
                except Exception:  # pragma: no cover - exotic nvtx builds
                    nvtx_on = True
            enabled = nvtx_on and not disabled_by_env() and profiler_attached()
        self.enabled = bool(enabled)
        self._trim_every = max(1, int(trim_every))
        self._max_cached = int(max_cached)
        self._count = 0
        self._caches = self._find_caches()

    def _find_caches(self) -> List[Any]:
        """The unbounded per-message caches of the nvtx package's Domain class (0.2.x: ``lru_cache`` on
        ``get_event_attributes`` and/or ``get_registered_string``)."""
        classes = []
        try:
            classes.append(type(self._nvtx.get_domain(None)))
        except Exception:
            pass
        classes.append(getattr(self._nvtx, "Domain", None))
        classes.append(getattr(getattr(self._nvtx, "_lib", None), "Domain", None))
        caches: List[Any] = []
        for cls in classes:
            if cls is None:
                continue
            for attr in ("get_event_attributes", "get_registered_string"):
                fn = getattr(cls, attr, None)
                if (
                    fn is not None
                    and hasattr(fn, "cache_clear")
                    and hasattr(fn, "cache_info")
                    and all(fn is not c for c in caches)
                ):
                    caches.append(fn)
        return caches

    def push(self, text: str) -> None:
        self._push(text)
        self._count += 1
        if self._caches and self._count % self._trim_every == 0:
            self._trim()

    def pop(self) -> None:
        self._pop()

    def _trim(self) -> None:
        for fn in self._caches:
            try:
                if fn.cache_info().currsize > self._max_cached:
                    fn.cache_clear()
            except Exception:  # pragma: no cover
                pass


class LibNvtxBackend:
    """Ranges through the NVTX C API itself: ``nvtxRangePushA``/``nvtxRangePop`` of ``libnvToolsExt.so.1``
    (ctypes), else of CUDA PyTorch's built-in NVTX (``torch._C._nvtx``). No Python package is needed, so it
    works in any interpreter the user's program runs in, and every Nsight Systems version records it (the
    ``nvtx`` package's releases after 0.2.11 are not recorded by nsys 2022.4). Raises ImportError when
    neither is there."""

    name = "libnvtx"
    LIBRARIES = ("libnvToolsExt.so.1", "libnvToolsExt.so")

    def __init__(self, enabled: Optional[bool] = None, library: Optional[str] = None) -> None:
        self.source, self._push, self._pop, self._bytes = _nvtx_entry_points(library)
        if enabled is None:
            enabled = not disabled_by_env() and profiler_attached()
        self.enabled = bool(enabled)

    def push(self, text: str) -> None:
        self._push(text.encode("utf-8", "replace") if self._bytes else text)

    def pop(self) -> None:
        self._pop()


def _nvtx_entry_points(library: Optional[str]) -> Tuple[str, Any, Any, bool]:
    """(where from, push, pop, whether push takes bytes) of the NVTX C API."""
    candidates = [library] if library else list(LibNvtxBackend.LIBRARIES)
    if not library:
        found = ctypes.util.find_library("nvToolsExt")
        if found and found not in candidates:
            candidates.append(found)
    for candidate in candidates:
        try:
            lib = ctypes.CDLL(candidate)
            push, pop = lib.nvtxRangePushA, lib.nvtxRangePop
        except (OSError, AttributeError):
            continue
        push.argtypes, push.restype = [ctypes.c_char_p], ctypes.c_int
        pop.argtypes, pop.restype = [], ctypes.c_int
        return candidate, push, pop, True
    if not library:
        torch_nvtx = getattr(getattr(sys.modules.get("torch"), "_C", None), "_nvtx", None)
        if torch_nvtx is not None and hasattr(torch_nvtx, "rangePushA"):
            return "torch._C._nvtx", torch_nvtx.rangePushA, torch_nvtx.rangePop, False
    raise ImportError("no NVTX library (%s) and no CUDA PyTorch NVTX" % ", ".join(candidates))


class RecordFunctionBackend:
    """Ranges recorded by torch.profiler: each push opens a ``record_function`` range named by the text, which
    the Kineto trace keeps as an event of that name. So a torch.profiler trace carries the very markers NVTX
    carries under Nsight Systems, and one set of marker rules reads both. ``_RecordFunctionFast`` (PyTorch >=
    2.2: about 2 us a range while profiling, 0.8 us when not) writes them as ``cpu_op`` events; older
    PyTorch goes through ``record_function``'s operators (``user_annotation`` events, about 15 us)."""

    name = "record_function"

    def __init__(self, enabled: bool = True) -> None:
        import torch

        self.enabled = bool(enabled)
        self._open = threading.local()
        fast = getattr(getattr(torch._C, "_profiler", None), "_RecordFunctionFast", None)
        if fast is not None:
            self.push = self._push_fast  # type: ignore[method-assign]
            self.pop = self._pop_fast  # type: ignore[method-assign]
            self._fast = fast
        else:
            self._enter = torch.ops.profiler._record_function_enter_new
            self._exit = torch.ops.profiler._record_function_exit._RecordFunction

    def _stack(self) -> List[Any]:
        stack = getattr(self._open, "stack", None)
        if stack is None:
            stack = self._open.stack = []
        return stack

    def _push_fast(self, text: str) -> None:
        handle = self._fast(text)
        handle.__enter__()
        self._stack().append(handle)

    def _pop_fast(self) -> None:
        stack = self._stack()
        if stack:
            stack.pop().__exit__(None, None, None)

    def push(self, text: str) -> None:
        self._stack().append(self._enter(text, None))

    def pop(self) -> None:
        stack = self._stack()
        if stack:
            self._exit(stack.pop())


class Range:
    """One reconstructed push/pop range of a :class:`RecordingBackend`."""

    __slots__ = ("text", "thread", "start", "end", "depth", "parent", "children", "index")

    def __init__(self, text: str, thread: int, start: int, depth: int, parent: Optional["Range"], index: int):
        self.text = text
        self.thread = thread
        self.start = start
        self.end: Optional[int] = None
        self.depth = depth
        self.parent = parent
        self.children: List["Range"] = []
        self.index = index

    def ancestors(self) -> List["Range"]:
        out = []
        node = self.parent
        while node is not None:
            out.append(node)
            node = node.parent
        return out

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return f"Range(depth={self.depth}, thread={self.thread}, text={self.text[:80]!r})"


class RecordingBackend:
    """Keeps every push/pop in memory, per thread, with ``perf_counter_ns`` times (for tests)."""

    name = "recording"

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.events: List[Tuple[str, int, Optional[str], int]] = []
        self._lock = threading.Lock()

    def push(self, text: str) -> None:
        if not isinstance(text, str):
            raise TypeError("NVTX message must be a str")
        self.events.append(("push", threading.get_ident(), text, time.perf_counter_ns()))

    def pop(self) -> None:
        self.events.append(("pop", threading.get_ident(), None, time.perf_counter_ns()))

    def clear(self) -> None:
        self.events.clear()

    def texts(self) -> List[str]:
        return [text for kind, _, text, _ in self.events if kind == "push"]

    def ranges(self, strict: bool = True) -> List[Range]:
        """Ranges in push order. ``strict`` raises on a pop without push or a range left open."""
        stacks: Dict[int, List[Range]] = {}
        out: List[Range] = []
        for kind, tid, text, ts in list(self.events):
            stack = stacks.setdefault(tid, [])
            if kind == "push":
                parent = stack[-1] if stack else None
                rng = Range(text, tid, ts, len(stack), parent, len(out))
                if parent is not None:
                    parent.children.append(rng)
                stack.append(rng)
                out.append(rng)
            else:
                if not stack:
                    if strict:
                        raise AssertionError("pop without matching push on thread %d" % tid)
                    continue
                stack.pop().end = ts
        if strict:
            for tid, stack in stacks.items():
                if stack:
                    raise AssertionError("%d range(s) left open on thread %d: %r" % (len(stack), tid, stack))
        return out


def resolve_backend(backend: Any = "auto") -> Any:
    """``"auto"`` (the NVTX C API, else the nvtx package; on only with a profiler attached), ``"nvtx"`` (the
    same, on unless disabled by the environment), ``"record_function"`` (torch.profiler), ``"recording"``,
    ``"null"``, or any object with ``enabled``, ``push`` and ``pop``."""
    if backend is None or backend in ("auto", "nvtx"):
        enabled = None if backend in (None, "auto") else not disabled_by_env()
        for kind in (LibNvtxBackend, NvtxBackend):
            try:
                return kind(enabled=enabled)
            except ImportError:
                continue
        if backend == "nvtx":
            raise ImportError("NVTX is not available: no libnvToolsExt.so.1, no CUDA PyTorch, no nvtx package")
        return NullBackend(enabled=False)
    if backend == "record_function":
        return RecordFunctionBackend(enabled=not disabled_by_env())
    if backend == "recording":
        return RecordingBackend()
    if backend == "null":
        return NullBackend(enabled=False)
    if isinstance(backend, str):
        raise ValueError("unknown backend %r (auto, nvtx, recording, null or an object)" % backend)
    for attr in ("push", "pop"):
        if not callable(getattr(backend, attr, None)):
            raise TypeError("backend object needs push(text) and pop()")
    if not hasattr(backend, "enabled"):
        try:
            backend.enabled = True
        except Exception as exc:
            raise TypeError("backend object needs an 'enabled' attribute") from exc
    return backend
