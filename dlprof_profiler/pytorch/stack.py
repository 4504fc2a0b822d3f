"""Call hierarchy (funcStack) and user stack trace (traceMarker) of a patched call.

Frames are sorted into kinds by their file:

- ``OURS``: this package (the wrappers and hooks) - never shown;
- ``STDLIB``: the Python standard library and frozen modules (runpy, threading, contextlib) - never shown;
- ``TORCH``: the torch package - shown in funcStack (``Conv2d::_call_impl``, ``Conv2d::forward``), not in
  the stack trace;
- ``THIRD``: other installed packages (site-packages / dist-packages) - shown in funcStack below the first
  user frame, not in the stack trace;
- ``USER``: everything else (the script, the user's modules).

funcStack starts at the outermost user frame (``<module>`` for a script; the test function under pytest)
and lists every shown frame down to the call, then the op name. A frame is ``Class::method`` when its first
argument is ``self`` (``Class`` = the runtime class of ``self``), else the function name (``<module>``,
``<lambda>``). ``Module._wrapped_call_impl`` (PyTorch >= 2.0) and the ``inner`` closure ``_call_impl`` uses
when hooks are registered are left out, and calls made by ``_call_impl`` count as one call site, so
names do not depend on hooks and read as in DLProf 1.x:
``/<module>/Net::_call_impl/Net::forward/Conv2d::_call_impl/Conv2d::forward/Conv2d::_conv_forward/conv2d``.

Repeat numbering: an element is keyed by (numbered path of its parent, element name); each distinct call
site (file and line of the nearest shown caller frame) under that key gets the next number, written
``name(N)`` for N >= 2. So the same call site always gets the same name (iteration k of a training loop
does not get a new number), while a second call site of the same function under the same parent gets
``(2)``. With ``distinguish_instances`` the ``self`` object of an ``nn.Module`` frame is part of the call
site too, so modules called from one line in a loop (``nn.Sequential``) get ``(2)``, ``(3)``...

traceMarker lists the user frames as ``file:line``, outermost (script) frame first, innermost last.
"""
from __future__ import annotations

import os
import site
import sys
import sysconfig
import threading
from typing import Dict, List, Optional, Tuple

__all__ = ["StackCapture", "OURS", "STDLIB", "TORCH", "THIRD", "USER"]

OURS, STDLIB, TORCH, THIRD, USER = range(5)
_SHOWN = TORCH  # kinds >= TORCH appear in funcStack

_MAX_INSTANCES_PER_SITE = 256
# nn.Module call plumbing left out of funcStack (torch/nn/modules/module.py only): the wrapper PyTorch 2.x
# puts around _call_impl, and the closure _call_impl runs through when hooks are registered.
_SKIPPED_NAMES = frozenset(("_wrapped_call_impl", "inner"))


def _norm_dir(path: str) -> str:
    path = os.path.normcase(os.path.realpath(path))
    return path if path.endswith(os.sep) else path + os.sep


def _site_dirs() -> List[str]:
    dirs = set()
    try:
        dirs.update(site.getsitepackages())
    except Exception:  # virtualenv's old site.py
        pass
    try:
        dirs.add(site.getusersitepackages())
    except Exception:
        pass
    for key in ("purelib", "platlib"):
        try:
            dirs.add(sysconfig.get_paths()[key])
        except Exception:
            pass
    return sorted(_norm_dir(d) for d in dirs if d)


class StackCapture:
    def __init__(self, distinguish_instances: bool = False) -> None:
        import torch

        self.distinguish_instances = distinguish_instances
        self._ours = _norm_dir(os.path.dirname(os.path.abspath(__file__)))
        self._torch = _norm_dir(os.path.dirname(os.path.abspath(torch.__file__)))
        self._module_py = os.path.normcase(os.path.realpath(sys.modules["torch.nn.modules.module"].__file__))
        self._module_cls = torch.nn.Module
        self._sites = _site_dirs()
        self._stdlib = [_norm_dir(os.path.dirname(os.path.abspath(os.__file__)))]
        for key in ("stdlib", "platstdlib"):
            try:
                self._stdlib.append(_norm_dir(sysconfig.get_paths(vars={
                    "base": sys.base_prefix, "platbase": sys.base_exec_prefix,
                    "installed_base": sys.base_prefix, "installed_platbase": sys.base_exec_prefix})[key]))
            except Exception:
                pass
        self._kinds: Dict[str, int] = {}
        self._skip_files: Dict[str, bool] = {}
        self._root = _Node("")
        self._lock = threading.RLock()

    # -- classification -------------------------------------------------------------------------
    def kind_of(self, filename: str) -> int:
        kind = self._kinds.get(filename)
        if kind is None:
            kind = self._classify(filename)
            self._kinds[filename] = kind
        return kind

    def _classify(self, filename: str) -> int:
        if filename.startswith("<"):
            return STDLIB if filename.startswith("<frozen") else USER
        path = os.path.normcase(os.path.realpath(os.path.abspath(filename)))
        if path.startswith(self._ours):
            return OURS
        if path.startswith(self._torch):
            return TORCH
        for d in self._sites:
            if path.startswith(d):
                return THIRD
        parts = path.split(os.sep)
        if "site-packages" in parts or "dist-packages" in parts:
            return THIRD
        for d in self._stdlib:
            if path.startswith(d):
                return STDLIB
        return USER

    def _skip(self, code) -> bool:
        """Is this frame in torch/nn/modules/module.py (called only with co_name already matched)."""
        filename = code.co_filename
        skip = self._skip_files.get(filename)
        if skip is None:
            skip = os.path.normcase(os.path.realpath(filename)) == self._module_py
            self._skip_files[filename] = skip
        return skip

    # -- capture ------------------------------------------------------------------------------
    def frames(self, frame) -> List[Tuple[object, object, int]]:
        """Shown frames (frame, code, kind), outermost first, starting at the outermost user frame."""
        shown = []
        append = shown.append
        kinds = self._kinds
        f = frame
        first_user = -1
        while f is not None:
            code = f.f_code
            filename = code.co_filename
            kind = kinds.get(filename)
            if kind is None:
                kind = self.kind_of(filename)
            if kind >= _SHOWN:
                if kind == USER:
                    first_user = len(shown)
                elif kind == TORCH and code.co_name in _SKIPPED_NAMES and self._skip(code):
                    f = f.f_back
                    continue
                append((f, code, kind))
            f = f.f_back
        if first_user >= 0:
            del shown[first_user + 1:]
        shown.reverse()
        return shown

    def _child(self, node: "_Node", name: str, filename, lineno, ident) -> "_Node":
        """The numbered child ``name`` of ``node`` called from ``filename:lineno`` (slow path)."""
        with self._lock:
            key = (name, filename, lineno, ident)
            kid = node.kids.get(key)
            if kid is not None:
                return kid
            if ident is not None:
                per_site = node.instances.get((name, filename, lineno), 0)
                if per_site >= _MAX_INSTANCES_PER_SITE:
                    # many short-lived module objects at one call site: stop counting instances
                    return self._child(node, name, filename, lineno, None)
                node.instances[(name, filename, lineno)] = per_site + 1
            n = node.counts.get(name, 0) + 1
            node.counts[name] = n
            kid = _Node(node.path + "/" + name if n == 1 else "%s/%s(%d)" % (node.path, name, n))
            node.kids[key] = kid
            return kid

    def capture(self, frame, label: str, want_stack: bool = True) -> Tuple[Optional[str], List[str]]:
        """(funcStack ending with ``label``, traceMarker) for a call made in ``frame``."""
        shown = self.frames(frame)
        trace = ["%s:%d" % (code.co_filename, f.f_lineno or 0) for f, code, kind in shown if kind == USER]
        if not want_stack:
            return None, trace
        node = self._root
        filename = lineno = None
        module_cls = self._module_cls
        distinguish = self.distinguish_instances
        for f, code, kind in shown:
            name = code.co_name
            ident = None
            if code.co_argcount and code.co_varnames[0] == "self":
                try:
                    obj = f.f_locals.get("self")
                except Exception:
                    obj = None
                if obj is not None:
                    name = type(obj).__name__ + "::" + name
                    if distinguish and isinstance(obj, module_cls):
                        ident = id(obj)
            kid = node.kids.get((name, filename, lineno, ident))
            node = kid if kid is not None else self._child(node, name, filename, lineno, ident)
            filename = code.co_filename
            # Module._call_impl reaches forward on different lines with and without hooks: one site
            lineno = 0 if kind == TORCH and code.co_name == "_call_impl" and self._skip(code) else f.f_lineno
        kid = node.kids.get((label, filename, lineno, None))
        node = kid if kid is not None else self._child(node, label, filename, lineno, None)
        return node.path, trace

    def reset_numbering(self) -> None:
        with self._lock:
            self._root = _Node("")


class _Node:
    """One numbered funcStack prefix; children keyed by (name, caller file, caller line, instance)."""

    __slots__ = ("path", "kids", "counts", "instances")

    def __init__(self, path: str) -> None:
        self.path = path
        self.kids: Dict[tuple, "_Node"] = {}
        self.counts: Dict[str, int] = {}
        self.instances: Dict[tuple, int] = {}
