"""Console messages through the standard `logging` module, in DLProf's format: `[DLProf-HH:MM:SS] text`.
Errors and warnings go to stderr, information to stdout. Applications embedding the engine can attach
their own handlers to the `dlprof` logger; the CLI's verbosity levels map onto logging levels."""

from __future__ import annotations

import logging
import re
import sys
import time
from contextlib import contextmanager

QUIET, MINIMAL, INFO, DETAILED = 0, 1, 2, 3
LEVELS = {"quiet": QUIET, "minimal": MINIMAL, "info": INFO, "detailed": DETAILED}
# verbosity -> the lowest logging level shown (errors are always shown)
_THRESHOLD = {QUIET: logging.ERROR, MINIMAL: logging.WARNING, INFO: logging.INFO, DETAILED: logging.DEBUG}

logger = logging.getLogger("dlprof")
_state = {"level": INFO}


# Characters that would end a console line, redraw it or not print at all: C0 and C1 controls, DEL, Unicode
# line and paragraph separators, and lone surrogates (undecodable bytes of a file name)
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")


def escaped(text: str) -> str:
    """Text with its control characters written as Python escapes (`\\n`, `\\x1b`, `\\udcff`), as repr()
    writes them: a message is one line, and a file or op name cannot forge console lines."""
    return _UNPRINTABLE.sub(lambda m: repr(m.group())[1:-1], text)


class _Formatter(logging.Formatter):
    """Every message, whatever it holds (paths, names read from a trace), on one line of its own."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("[DLProf-%H:%M:%S]", time.localtime(record.created))
        prefix = {logging.ERROR: "ERROR: ", logging.WARNING: "WARNING: "}.get(record.levelno, "")
        return f"{stamp} {prefix}{escaped(record.getMessage())}"


class _StreamHandler(logging.Handler):
    """Writes to the sys.stdout / sys.stderr of the moment (tests and embedders replace them)."""

    def emit(self, record: logging.LogRecord) -> None:
        stream = sys.stderr if record.levelno >= logging.WARNING else sys.stdout
        try:
            stream.write(self.format(record) + "\n")
            stream.flush()
        except Exception:  # noqa: BLE001 - logging must never break the analysis
            self.handleError(record)


def _setup() -> None:
    if not any(isinstance(h, _StreamHandler) for h in logger.handlers):
        handler = _StreamHandler()
        handler.setFormatter(_Formatter())
        logger.addHandler(handler)
    logger.propagate = False
    logger.setLevel(_THRESHOLD[_state["level"]])


_setup()


def set_verbosity(level: int) -> None:
    """Set the console verbosity (QUIET .. DETAILED)."""
    _state["level"] = level
    logger.setLevel(_THRESHOLD.get(level, logging.INFO))


def verbosity() -> int:
    return _state["level"]


def error(text: str) -> None:
    """Errors are always shown, on stderr."""
    logger.error(text)


def warning(text: str) -> None:
    logger.warning(text)


def info(text: str) -> None:
    logger.info(text)


def detail(text: str) -> None:
    logger.debug(text)


@contextmanager
def stage(name: str):
    """Announce a stage of the data flow and how long it took."""
    started = time.perf_counter()
    info(f"{name} ...")
    yield
    info(f"{name} done in {time.perf_counter() - started:.2f} s")


class Progress:
    """Progress of a long stage: a line at most every `every` seconds (so a 10^7-event analysis never sits
    silent for minutes), and one at the end."""

    def __init__(self, what: str, total: int, every: float = 10.0):
        self.what, self.total, self.every = what, max(int(total), 1), every
        self.started = self.last = time.perf_counter()

    def update(self, done: int) -> None:
        now = time.perf_counter()
        if now - self.last >= self.every and done < self.total:
            self.last = now
            info(
                f"  {self.what}: {done:,}/{self.total:,} ({100.0 * done / self.total:.0f} %, "
                f"{now - self.started:.0f} s)"
            )
