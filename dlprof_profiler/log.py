"""Console messages with DLProf's `[DLProf-HH:MM:SS]` prefix; errors and warnings on stderr."""
from __future__ import annotations

import sys
import time
from contextlib import contextmanager

QUIET, MINIMAL, INFO, DETAILED = 0, 1, 2, 3
LEVELS = {"quiet": QUIET, "minimal": MINIMAL, "info": INFO, "detailed": DETAILED}

_state = {"level": INFO}


def set_verbosity(level: int) -> None:
    """Set the console verbosity (QUIET .. DETAILED)."""
    _state["level"] = level


def verbosity() -> int:
    return _state["level"]


def _prefix() -> str:
    return time.strftime("[DLProf-%H:%M:%S]")


def _emit(stream, text: str) -> None:
    print(f"{_prefix()} {text}", file=stream, flush=True)


def error(text: str) -> None:
    """Errors are always shown, on stderr."""
    _emit(sys.stderr, f"ERROR: {text}")


def warning(text: str) -> None:
    if _state["level"] >= MINIMAL:
        _emit(sys.stderr, f"WARNING: {text}")


def info(text: str) -> None:
    if _state["level"] >= INFO:
        _emit(sys.stdout, text)


def detail(text: str) -> None:
    if _state["level"] >= DETAILED:
        _emit(sys.stdout, text)


@contextmanager
def stage(name: str):
    """Announce a stage of the data flow and how long it took."""
    started = time.perf_counter()
    info(f"{name} ...")
    yield
    info(f"{name} done in {time.perf_counter() - started:.2f} s")
