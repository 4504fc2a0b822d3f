"""The package structure, read from the code's own imports with `ast` (nothing is imported or run):

- no import cycle between the modules of dlprof_profiler/ and dlprof_plugin/ (imports at module top and inside
  functions both count, and `importlib.import_module("...")` with a literal name too);
- no private name (leading underscore) taken from another module: `from m import _name` or `m._name`;
- imports at the top of modules: an import inside a function only for an optional or heavy dependency
  (HEAVY) or a lazy import whose reason is stated in LAZY (LAZY_MODULES).

Each check is first run on a small package written here with the fault in it, so a check that cannot fail
fails its own test.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("dlprof_profiler", "dlprof_plugin")

# Third-party packages imported where they are used: optional (not installed everywhere) or heavy to load
# for the commands that do not need them.
HEAVY = {
    "torch",  # optional: the PyTorch instrumentation and the torch backend's startup hook
    "distributed",  # optional: dlprof --scheduler (Dask)
    "duckdb",  # the out-of-core store only
    "pyarrow",  # columnar readers and the out-of-core parts
    "adbc_driver_sqlite",
    "adbc_driver_manager",
    "selenium",  # tests only
    "tensorboard",  # the plugin's TensorBoard-side classes; the viewer runs without loading TensorBoard
    "waitress",  # dlprofviewer's server only
    "nvtx",  # optional at run time: the PyTorch instrumentation falls back to ctypes
}

# Lazy imports, each with its reason: (importing module, imported module) -> why.
_NEEDS_TORCH = "imports torch at its top: `dlprof_profiler.pytorch` itself imports without torch, init() needs it"
LAZY: dict[tuple[str, str], str] = {
    ("dlprof_profiler.pytorch", "dlprof_profiler.pytorch.metadata"): _NEEDS_TORCH,
    ("dlprof_profiler.pytorch", "dlprof_profiler.pytorch.patching"): _NEEDS_TORCH,
    ("dlprof_profiler.pytorch", "dlprof_profiler.pytorch.scopes"): _NEEDS_TORCH,
    ("dlprof_profiler.pytorch", "dlprof_profiler.pytorch.stack"): _NEEDS_TORCH,
    ("dlprof_profiler.pytorch", "dlprof_profiler.pytorch.backward"): _NEEDS_TORCH,
    ("dlprof_plugin.loader", "dlprof_plugin.plugin"): "TensorBoard imports every plugin's loader when it starts; the "
    "plugin's modules load only when TensorBoard loads the plugin, and a broken install disables the tab alone",
    ("dlprof_plugin.service", "dlprof_profiler.outputs.graph_events"): "the op graph's node names need the engine's "
    "graph module (pandas, pyarrow, TensorBoard's protos): loaded by the first op-details request, not the viewer",
}
# Modules whose imports inside functions are all deliberate: module -> why.
LAZY_MODULES: dict[str, str] = {
    "dlprof_profiler.capture.torch_startup.sitecustomize": "Python's startup hook in the profiled program: it "
    "imports what it needs when it first needs it, so that programs that never import torch pay nothing, and "
    "loads dlprof_profiler.pytorch by its path once torch is imported",
}


@dataclass(frozen=True)
class Import:
    module: str  # the importing module
    target: str  # the imported module (a module of the project, or a third-party top-level name)
    names: tuple  # the names taken (`from target import names`); () for `import target`
    line: int
    in_function: bool


def module_files(root: Path, packages=PACKAGES) -> dict[str, Path]:
    """{dotted module name: file} of every module of the packages."""
    out = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def _resolve_from(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(module: str, path: Path, modules: dict) -> list[Import]:
    """Every import of a module, resolved to project modules where it names one."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    is_package = path.name == "__init__.py"
    found: list[Import] = []

    def visit(node, in_function: bool):
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                for alias in child.names:
                    found.append(Import(module, alias.name, (), child.lineno, in_function))
            elif isinstance(child, ast.ImportFrom):
                source = _resolve_from(module, is_package, child)
                for alias in child.names:
                    submodule = f"{source}.{alias.name}"
                    if submodule in modules:  # `from package import module`
                        found.append(Import(module, submodule, (), child.lineno, in_function))
                    else:
                        found.append(Import(module, source, (alias.name,), child.lineno, in_function))
            elif (
                isinstance(child, ast.Call)
                and isinstance(child.func, ast.Attribute)
                and child.func.attr == "import_module"
                and child.args
                and isinstance(child.args[0], ast.Constant)
                and isinstance(child.args[0].value, str)
            ):
                found.append(Import(module, child.args[0].value, (), child.lineno, in_function))
            visit(child, inner)

    visit(tree, False)
    return found


def project_target(target: str, modules: dict) -> str | None:
    """The project module an import names (`import a.b.c` loads a.b.c), or None for a third-party one."""
    return target if target in modules else None


def import_graph(modules: dict) -> tuple[dict[str, set], list[Import]]:
    edges: dict[str, set] = {m: set() for m in modules}
    every: list[Import] = []
    for module, path in modules.items():
        for imp in imports_of(module, path, modules):
            every.append(imp)
            target = project_target(imp.target, modules)
            if target and target != module:
                edges[module].add(target)
    return edges, every


def cycles(edges: dict[str, set]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set = set()
    out = []
    counter = [0]

    def connect(v):
        # iterative: the graph is deep enough to matter for recursion limits in a large tree
        work = [(v, iter(sorted(edges[v])))]
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        while work:
            node, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                    break
                if w in on_stack:
                    low[node] = min(low[node], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        component.append(w)
                        if w == node:
                            break
                    if len(component) > 1:
                        out.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            connect(v)
    return out


def cycle_path(edges: dict[str, set], component: list[str]) -> list[str]:
    """One loop through a component, to show in the failure (a -> b -> ... -> a)."""
    members = set(component)
    start = component[0]
    parents = {start: None}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for w in sorted(edges[node] & members):
            if w == start:
                path = [node]
                while parents[path[-1]] is not None:
                    path.append(parents[path[-1]])
                return list(reversed(path)) + [start]
            if w not in parents:
                parents[w] = node
                queue.append(w)
    return component


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


@dataclass(frozen=True)
class PrivateUse:
    module: str  # the module that uses the name
    owner: str  # the module that defines it
    name: str
    line: int

    def __str__(self) -> str:
        return f"{self.module}:{self.line}: {self.owner}.{self.name}"


def private_uses(modules: dict, every: list[Import]) -> list[PrivateUse]:
    """`from m import _name` and `m._name` where m is another module of the project."""
    out = [
        PrivateUse(i.module, i.target, name, i.line)
        for i in every
        if project_target(i.target, modules) and i.target != i.module
        for name in i.names
        if _private(name)
    ]
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        bound = {}  # local name -> project module it stands for
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name in modules and alias.asname:
                        bound[alias.asname] = alias.name
            elif isinstance(node, ast.ImportFrom):
                source = _resolve_from(module, path.name == "__init__.py", node)
                for alias in node.names:
                    if f"{source}.{alias.name}" in modules:
                        bound[alias.asname or alias.name] = f"{source}.{alias.name}"
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and _private(node.attr)
                and isinstance(node.value, ast.Name)
                and bound.get(node.value.id, module) != module
            ):
                out.append(PrivateUse(module, bound[node.value.id], node.attr, node.lineno))
    return sorted(out, key=lambda u: (u.module, u.line, u.name))


def function_imports(
    modules: dict, every: list[Import], heavy=HEAVY, lazy=LAZY, lazy_modules=LAZY_MODULES
) -> list[str]:
    """Imports inside functions that are neither of a HEAVY package nor a LAZY case with its reason."""
    out = []
    for i in every:
        if not i.in_function:
            continue
        if i.target.split(".")[0] in heavy or (i.module, i.target) in lazy or i.module in lazy_modules:
            continue
        out.append(f"{i.module}:{i.line}: import of {i.target}{' (' + ', '.join(i.names) + ')' if i.names else ''}")
    return out


# ------------------------------------------------------------------------------------ the checks checked


@pytest.fixture(scope="module")
def faulty(tmp_path_factory) -> dict:
    """A package with one of each fault: a cycle a -> b -> a (b's import in a function), a private name taken
    both ways, and a function import of a module of its own."""
    root = tmp_path_factory.mktemp("faulty")
    pkg = root / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg import b\nfrom pkg.sub.c import _hidden\n\n\ndef f():\n    return b.g()\n")
    (pkg / "b.py").write_text("from . import sub\n\n\ndef g():\n    from pkg import a\n    return a.f\n")
    (pkg / "sub" / "c.py").write_text("import pkg.a as alias\n\n_hidden = 1\nx = alias._secret\n")
    (pkg / "d.py").write_text("import importlib\n\n\ndef h():\n    return importlib.import_module('pkg.sub.c')\n")
    return module_files(root, ("pkg",))


def test_the_checks_find_each_fault(faulty):
    edges, every = import_graph(faulty)
    assert cycles(edges) == [["pkg.a", "pkg.b", "pkg.sub.c"]]  # a -> b -> a, a -> c -> a
    assert "pkg.sub" in edges["pkg.b"]  # a relative `from . import sub` names the package
    privates = [(u.module, u.owner, u.name) for u in private_uses(faulty, every)]
    assert privates == [("pkg.a", "pkg.sub.c", "_hidden"), ("pkg.sub.c", "pkg.a", "_secret")]
    inside = function_imports(faulty, every, heavy=set(), lazy={})
    assert sorted(x.split(": ", 1)[1] for x in inside) == ["import of pkg.a", "import of pkg.sub.c"]
    reasons = {("pkg.b", "pkg.a"): "why", ("pkg.d", "pkg.sub.c"): "why"}
    assert function_imports(faulty, every, heavy=set(), lazy=reasons) == []


# ------------------------------------------------------------------------------------ the project's code


@pytest.fixture(scope="module")
def project():
    modules = module_files(ROOT)
    edges, every = import_graph(modules)
    return modules, edges, every


def test_no_import_cycle(project):
    modules, edges, _ = project
    found = cycles(edges)
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(cycle_path(edges, c)) for c in found)


def test_no_private_name_across_modules(project):
    modules, _, every = project
    found = private_uses(modules, every)
    assert not found, "private names used across modules:\n" + "\n".join(map(str, found))


def test_imports_at_the_top(project):
    modules, _, every = project
    found = function_imports(modules, every)
    assert not found, (
        f"{len(found)} imports inside functions (move them to the top, or state the reason in LAZY):\n"
        + ("\n".join(found))
    )


def test_the_stated_reasons_are_still_needed(project):
    """An entry of LAZY whose import was moved or removed is stale: remove it."""
    modules, _, every = project
    inside = {(i.module, i.target) for i in every if i.in_function}
    assert not set(LAZY) - inside
    assert not [m for m in LAZY_MODULES if m not in modules]
