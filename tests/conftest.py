"""Session-wide fixtures: what several test modules would otherwise each start or compute again.

- `tensorboard`: one TensorBoard process over a session logdir; a module moves its runs in with
  `tensorboard.publish(name, logdir)` (its run `x/dlprof` is then `<name>/x/dlprof`). A module that changes
  TensorBoard's flags, or whose tests need to see exactly its own runs, keeps a private one and says why.
- `browser`: one headless Chromium; `browser.fresh(width, height)` gives a module a clean window.
- `training_export`, `training_run`: tests/profiles.py's training profile, and that profile analysed once
  (`--reports=summary`) into a run folder, which `profiles.make_logdir` copies where a module names it
  instead of an export.

Markers: `slow` (browser, TensorBoard, real captures, big traces, the CLI run many times) is left out of the
everyday command `pytest -m "not slow"`; `tests/test_imports.py` keeps every module of the product imported
there.
"""

from __future__ import annotations

import compileall
from pathlib import Path

import pytest

from dlprof_profiler import log
from tests import profiles
from tests.browser import Browser, TensorBoard, browser_missing_reason


ROOT = Path(__file__).resolve().parents[1]


def pytest_configure(config):
    """The tree's bytecode compiled once, before any test (or pytest-xdist worker) starts, as pip compiles an
    installed package: under PYTHONDONTWRITEBYTECODE, every dlprof, TensorBoard, viewer and rank-worker process
    the suite starts would otherwise compile the ~250 modules from source again (~0.45 s of CPU each)."""
    if not hasattr(config, "workerinput"):  # the workers start after this
        for package in ("dlprof_profiler", "dlprof_plugin", "tests"):
            compileall.compile_dir(ROOT / package, quiet=1)


@pytest.fixture(autouse=True)
def default_verbosity():
    """Each test starts at the default console verbosity: a test that runs the CLI in this process with `-v
    quiet` would otherwise hide the warnings a later test of the same worker expects on stderr."""
    yield
    log.set_verbosity(log.INFO)


@pytest.fixture(scope="session")
def tensorboard(tmp_path_factory):
    """One TensorBoard for the session (reload every second, so a published run appears quickly)."""
    logdir = tmp_path_factory.mktemp("session_tensorboard") / "logdir"
    logdir.mkdir()
    with TensorBoard(logdir, extra_args=["--reload_interval", "1"], empty=True) as tb:
        yield tb


@pytest.fixture(scope="session")
def browser():
    """One headless Chromium for the session; modules start from `browser.fresh(...)`."""
    reason = browser_missing_reason()
    if reason:
        pytest.skip(reason)
    with Browser() as b:
        yield b


@pytest.fixture(scope="session")
def training_export(tmp_path_factory) -> Path:
    """tests/profiles.py's training profile (3 iterations) as an nsys export, written once."""
    return profiles.training_profile(tmp_path_factory.mktemp("training_export") / "training.sqlite")


@pytest.fixture(scope="session")
def training_run(tmp_path_factory, training_export) -> Path:
    """The training profile analysed once (`--reports=summary`): a run folder to copy, never to change."""
    out = tmp_path_factory.mktemp("training_run") / "training"
    profiles.run_dlprof(f"--database={training_export}", f"--output_path={out}", "--reports=summary", "-v", "quiet")
    return out


# What makes a test slow whatever its module: a real browser, TensorBoard or nsys capture. Other slow tests
# (torch captures among them: in-process torch tests are fast) carry `pytest.mark.slow` themselves.
SLOW_MARKERS = ("browser", "nsys")
SLOW_FIXTURES = ("tensorboard", "browser")


# The modules that take longest (seconds of a serial run on two cores), handed out first to pytest-xdist's
# workers (`--dist loadfile --no-loadscope-reorder`, pyproject.toml), so that none of them starts last and
# keeps the others waiting.
LONGEST_MODULES = (
    "test_ranks.py",  # 135-180 s
    "test_store.py",  # 85-105 s
    "test_ingest_kineto.py",  # 90-140 s
    "test_hardening.py",  # 85-90 s
    "test_browser_usability.py",  # 60-75 s
    "test_capture_torch.py",  # 60-65 s
)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if any(item.get_closest_marker(m) for m in SLOW_MARKERS) or set(SLOW_FIXTURES) & set(item.fixturenames):
            item.add_marker(pytest.mark.slow)
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: the order modules are handed out in
        first = {name: rank for rank, name in enumerate(LONGEST_MODULES)}
        items.sort(key=lambda item: first.get(item.path.name, len(first)))  # stable: the rest keep their order


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """Captured output with lone surrogates (undecodable file names a test logs on purpose) written as
    `\\udcff`: pytest-xdist sends each report from its worker as UTF-8, and such a report would crash the
    worker (pytest-dev/pytest-xdist#843)."""
    report = yield
    report.sections = [(name, text.encode("utf-8", "backslashreplace").decode()) for name, text in report.sections]
    return report
