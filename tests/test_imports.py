"""Every module of the product imports on its own: the everyday command (`pytest -m "not slow"`) touches each
one, so a module that no longer imports (a moved name, a missing dependency, a syntax error) fails there too."""

from __future__ import annotations

import importlib
import pkgutil
import runpy
import sys

import pytest

import dlprof_plugin
import dlprof_profiler


def module_names() -> list[str]:
    names = []
    for package in (dlprof_profiler, dlprof_plugin):
        names.append(package.__name__)
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            names.append(info.name)
    return sorted(names)


def test_every_package_is_found():
    names = module_names()
    # one module of each package of the layout, so a walk that stops early cannot pass
    for package in ("capture", "cli", "db", "engine", "experts", "ingest", "outputs", "pytorch", "run", "store"):
        assert any(n.startswith(f"dlprof_profiler.{package}.") for n in names), package
    assert "dlprof_plugin.plugin" in names and "dlprof_profiler.__main__" in names


@pytest.mark.parametrize("name", [n for n in module_names() if not n.endswith(".__main__")])
def test_module_imports(name):
    module = importlib.import_module(name)
    assert module.__name__ == name


def test_main_module_runs_the_cli(monkeypatch, capsys):
    """`python -m dlprof_profiler --version`: __main__ run as the interpreter runs it, in this process."""
    monkeypatch.setattr(sys, "argv", ["dlprof", "--version"])
    with pytest.raises(SystemExit) as done:
        runpy.run_module("dlprof_profiler", run_name="__main__", alter_sys=False)
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"dlprof {dlprof_profiler.__version__}"
