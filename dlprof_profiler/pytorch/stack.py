"""Call hierarchy (funcStack) and user stack trace (traceMarker) of a patched call.

Frames are sorted into kinds by their file:

- ``OURS``: dlprof_profiler (the wrappers and hooks, the startup hook's optimizer-step wrapper) - never shown;
- ``STDLIB``: the Python standard library and frozen modules (runpy, threading, contextlib) - never shown;
- ``TORCH``: the torch package - shown in funcStack (module attribute names, ``SGD::step``,
  ``clip_grad_norm_``), not in the stack trace;
- ``THIRD``: other installed packages (site-packages / dist-packages) - shown in funcStack below the first
  user frame, not in the stack trace;
- ``USER``: everything else (the script, the user's modules).

funcStack starts at the outermost user frame (``<module>`` for a script; the test function under pytest)
and lists the shown frames down to the call, then the op name:

- a module call (the ``_call_impl`` or ``forward`` frame of an ``nn.Module``) gives the module's *attribute
  path*, as torch.profiler's module hierarchy does: a module called inside another module is named by its
  qualified attribute name in that module
  (``encoder``, ``layers.0``, ``self_attn``; ``0``, ``1`` in an ``nn.Sequential``), so two ``Linear`` layers
  are distinct by default. A module called from code outside any module (the root) is named by the variable
  or attribute the caller holds it in (``model``, ``criterion``, ``self.model`` -> ``model``), else by its
  class name; so is a module that is not a submodule of the enclosing one (a module kept in a plain list).
  The frames of the called module itself (``_call_impl``, ``forward``, helper methods such as ``_sa_block``
  or ``_conv_forward``) add nothing: ``/<module>/main/model/encoder/layers.0/self_attn/multi_head_attention_forward``.
- other frames are ``Class::method`` when their first argument is ``self`` (``SGD::step``, and methods of
  modules that are not being called: ``Net::__init__``), else the function name (``<module>``, ``train``,
  ``<lambda>``).

:meth:`StackCapture.capture` also returns the class of each module element (``(('model', 'Net'),
('conv1', 'Conv2d'))``): class names stay available to the op's details, out of its name. ``Module._wrapped_call_impl``
and the ``inner`` closure ``_call_impl`` runs through when hooks are registered are left out, so names do not
depend on hooks.

Repeat numbering: an element is keyed by (numbered path of its parent, element name); each distinct call
site (file and line of the nearest shown caller frame) under that key gets the next number, written
``name(N)`` for N >= 2. So the same call site always gets the same name (iteration k of a training loop
does not get a new number), while a second call site of the same function or module under the same parent
gets ``(2)``. Module elements are also keyed by class, so a different module class met under the same name
and site gets a number. With ``distinguish_instances`` the module object is part of the key for modules named
without an attribute path (root modules, modules in plain lists), so such modules called from one line in a
loop get ``(2)``, ``(3)``...

traceMarker lists the user frames as ``file:line``, outermost (script) frame first, innermost last.
"""

from __future__ import annotations

import os
import site
import sys
import sysconfig
import threading
import weakref
from typing import Any, Dict, List, Tuple

__all__ = ["StackCapture", "OURS", "STDLIB", "TORCH", "THIRD", "USER"]

OURS, STDLIB, TORCH, THIRD, USER = range(5)
_SHOWN = TORCH  # kinds >= TORCH appear in funcStack

_MAX_INSTANCES_PER_SITE = 256
# nn.Module call plumbing left out of funcStack (torch/nn/modules/module.py only): the wrapper PyTorch 2.x
# puts around _call_impl, and the closure _call_impl runs through when hooks are registered.
_SKIPPED_NAMES = frozenset(("_wrapped_call_impl", "inner"))
_MAX_CACHED = 4096  # cached module name entries before those of dead modules are purged


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
        self._ours = _norm_dir(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        self._torch = _norm_dir(os.path.dirname(os.path.abspath(torch.__file__)))
        self._module_py = os.path.normcase(os.path.realpath(sys.modules["torch.nn.modules.module"].__file__))
        self._module_cls = torch.nn.Module
        self._sites = _site_dirs()
        self._stdlib = [_norm_dir(os.path.dirname(os.path.abspath(os.__file__)))]
        for key in ("stdlib", "platstdlib"):
            try:
                self._stdlib.append(
                    _norm_dir(
                        sysconfig.get_paths(
                            vars={
                                "base": sys.base_prefix,
                                "platbase": sys.base_exec_prefix,
                                "installed_base": sys.base_prefix,
                                "installed_platbase": sys.base_exec_prefix,
                            }
                        )[key]
                    )
                )
            except Exception:
                pass
        self._kinds: Dict[str, int] = {}
        self._skip_files: Dict[str, bool] = {}
        self._root = _Node("", ())
        self._lock = threading.RLock()
        # id(module) -> (weak reference to it, {id(submodule): qualified attribute name or None})
        self._paths: dict[int, tuple[Any, dict[int, str | None]]] = {}
        # (id(module), caller code, caller line) -> (weak reference to the module, name)
        self._roots: dict[tuple, tuple[Any, str]] = {}

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
            del shown[first_user + 1 :]
        shown.reverse()
        return shown

    def _child(self, node: _Node, name: str, filename, lineno, ident, modules: tuple) -> _Node:
        """The numbered child ``name`` of ``node`` called from ``filename:lineno`` (slow path).

        ``ident``: None for plain elements; for modules, their class, or (class, id) to tell instances apart."""
        with self._lock:
            key = (name, filename, lineno, ident)
            kid = node.kids.get(key)
            if kid is not None:
                return kid
            if isinstance(ident, tuple):
                per_site = node.instances.get((name, filename, lineno), 0)
                if per_site >= _MAX_INSTANCES_PER_SITE:
                    # many short-lived module objects at one call site: stop counting instances
                    return self._child(node, name, filename, lineno, ident[0], modules)
                node.instances[(name, filename, lineno)] = per_site + 1
            n = node.counts.get(name, 0) + 1
            node.counts[name] = n
            element = name if n == 1 else "%s(%d)" % (name, n)
            if ident is not None:
                cls = ident[0] if isinstance(ident, tuple) else ident
                modules = modules + ((element, cls.__name__),)
            kid = _Node(node.path + "/" + element, modules)
            node.kids[key] = kid
            return kid

    # -- module names ---------------------------------------------------------------------------
    def _attribute_path(self, parent: Any, child: Any) -> str | None:
        """Qualified attribute name of ``child`` inside ``parent`` (``layers.0``), None when it is not one of
        its submodules. The names of a parent are read once (again when a module is met that was not there)."""
        entry = self._paths.get(id(parent))
        if entry is not None and entry[0]() is parent:
            found = entry[1].get(id(child), _UNKNOWN)
            if found is not _UNKNOWN:
                return found
        with self._lock:
            try:
                names = {id(m): _element(n) for n, m in parent.named_modules() if n}
            except Exception:  # noqa: BLE001 - a broken user module must not break the user's program
                names = {}
            if id(child) not in names:
                names[id(child)] = None  # not a submodule: remembered, so a plain list of modules costs one scan
            if len(self._paths) >= _MAX_CACHED:
                self._paths = {k: v for k, v in self._paths.items() if v[0]() is not None}
            # keyed by id with a weak reference (modules may be unhashable: __eq__ without __hash__)
            self._paths[id(parent)] = (weakref.ref(parent), names)
        return names[id(child)]

    def _outside_name(self, frame, module: Any) -> str:
        """Name of a module called from outside any module (or from a module it does not belong to): the
        variable or attribute of the calling frame that holds it, else its class name."""
        caller = frame.f_back
        while caller is not None:
            code = caller.f_code
            if not (code.co_name in _SKIPPED_NAMES and self._skip(code)):
                try:
                    if caller.f_locals.get("self") is not module:
                        break
                except Exception:  # noqa: BLE001 - exotic frames (f_locals of C-level proxies)
                    break
            caller = caller.f_back
        key = (id(module), None if caller is None else caller.f_code, 0 if caller is None else caller.f_lineno)
        cached = self._roots.get(key)
        if cached is not None and cached[0]() is module:
            return cached[1]
        name = _holder_name(caller, module) or type(module).__name__
        with self._lock:
            if len(self._roots) >= _MAX_CACHED:
                self._roots = {k: v for k, v in self._roots.items() if v[0]() is not None}
            self._roots[key] = (weakref.ref(module), name)
        return name

    def _module_element(self, enclosing: Any, module: Any, frame) -> tuple[str, Any]:
        """(element name, ident) of a module met below ``enclosing`` (None at the top)."""
        cls = type(module)
        name = self._attribute_path(enclosing, module) if enclosing is not None else None
        if name is not None:
            return name, cls
        name = self._outside_name(frame, module)
        return name, ((cls, id(module)) if self.distinguish_instances else cls)

    def capture(self, frame, label: str, want_stack: bool = True) -> tuple[str | None, list[str], tuple]:
        """(funcStack ending with ``label``, traceMarker, module classes) for a call made in ``frame``.

        The module classes are ``(element, class name)`` pairs, outermost first, one per module element of
        funcStack (``(('model', 'Net'), ('conv1', 'Conv2d'))``); empty without funcStack."""
        shown = self.frames(frame)
        trace = ["%s:%d" % (code.co_filename, f.f_lineno or 0) for f, code, kind in shown if kind == USER]
        if not want_stack:
            return None, trace, ()
        node = self._root
        filename = lineno = None
        module_cls = self._module_cls
        module = None  # innermost module of the path
        for f, code, kind in shown:
            obj = None
            if code.co_argcount and code.co_varnames[0] == "self":
                try:
                    obj = f.f_locals.get("self")
                except Exception:
                    obj = None
            is_module = obj is not None and isinstance(obj, module_cls)
            if is_module and obj is module:
                pass  # frames of the module being called (_call_impl, forward, helper methods) add no element
            elif is_module and (code.co_name == "forward" or (code.co_name == "_call_impl" and self._skip(code))):
                name, ident = self._module_element(module, obj, f)  # a module call: its attribute path
                kid = node.kids.get((name, filename, lineno, ident))
                node = kid if kid is not None else self._child(node, name, filename, lineno, ident, node.modules)
                module = obj
            else:  # functions, and methods of other objects (of modules not being called: Net::__init__)
                name = code.co_name if obj is None else type(obj).__name__ + "::" + code.co_name
                kid = node.kids.get((name, filename, lineno, None))
                node = kid if kid is not None else self._child(node, name, filename, lineno, None, node.modules)
            filename = code.co_filename
            # Module._call_impl reaches forward on different lines with and without hooks: one site
            lineno = 0 if kind == TORCH and code.co_name == "_call_impl" and self._skip(code) else f.f_lineno
        kid = node.kids.get((label, filename, lineno, None))
        node = kid if kid is not None else self._child(node, label, filename, lineno, None, node.modules)
        return node.path, trace, node.modules

    def reset_numbering(self) -> None:
        with self._lock:
            self._root = _Node("", ())


_UNKNOWN = object()


def _element(name: str) -> str:
    """A name as a funcStack element: '/' separates elements, and a backslash would become one in the marker
    text (markers.safe_text)."""
    return name.replace("/", "_").replace("\\", "_")


def _holder_name(frame, module: Any) -> str | None:
    """The local variable of ``frame`` holding ``module`` (``model``), else the attribute of its ``self``
    (``self.model`` -> ``model``)."""
    if frame is None:
        return None
    try:
        local = dict(frame.f_locals)
    except Exception:  # noqa: BLE001 - exotic frames
        return None
    for key, value in local.items():
        if value is module and key != "self" and isinstance(key, str):
            return key
    owner = local.get("self")
    attrs = getattr(owner, "__dict__", None)
    if isinstance(attrs, dict):
        children = attrs.get("_modules")  # a module's submodules live in _modules, not in __dict__
        for items in (attrs, children if isinstance(children, dict) else {}):
            for key, value in list(items.items()):
                if value is module and isinstance(key, str):
                    return _element(key)
    return None


class _Node:
    """One numbered funcStack prefix; children keyed by (name, caller file, caller line, module ident)."""

    __slots__ = ("path", "modules", "kids", "counts", "instances")

    def __init__(self, path: str, modules: tuple) -> None:
        self.path = path
        self.modules = modules  # (element, class name) of the module elements of the path
        self.kids: Dict[tuple, "_Node"] = {}
        self.counts: Dict[str, int] = {}
        self.instances: Dict[tuple, int] = {}
