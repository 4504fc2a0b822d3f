"""Waiting for a condition, never for a length of time: every wait of the suite polls what it waits for until
a deadline, and says what it waited for when the deadline passes.

    wait_until(lambda: path.exists(), 30, "the lock file", proc)
    lines = OutputLines(proc.stderr); lines.wait_for("interrupt twice more", 30)
"""

from __future__ import annotations

import threading
import time

POLL_S = 0.05  # between two looks at a condition (files, HTTP answers, a process's state)


def wait_until(predicate, timeout: float, what: str, proc=None, interval: float = POLL_S):
    """predicate()'s first true value; an AssertionError naming `what` (and the predicate's last error) after
    `timeout` seconds, or as soon as `proc` (a process being waited for) exits."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"{what}: the process exited with {proc.returncode}")
        try:
            value = predicate()
            if value:
                return value
        except (OSError, ValueError, KeyError, AssertionError) as exc:  # not ready yet (no file, no answer)
            last = exc
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what} (last error: {last})")
        time.sleep(interval)  # the poll interval: the condition is looked at again, not assumed


class OutputLines:
    """The lines of a text pipe (a subprocess's stdout or stderr), read by a thread as they come, so a test can
    wait for a line while the process runs. `text()` is everything read; `close()` waits for the end."""

    def __init__(self, pipe):
        self._lines: list[str] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._read, args=(pipe,), daemon=True)
        self._thread.start()

    def _read(self, pipe):
        for line in pipe:
            with self._lock:
                self._lines.append(line)

    def text(self) -> str:
        with self._lock:
            return "".join(self._lines)

    def wait_for(self, fragment: str, timeout: float, proc=None) -> str:
        """The first line holding `fragment`, once it has been written."""

        def seen():
            with self._lock:
                return next((line for line in self._lines if fragment in line), None)

        try:
            return wait_until(seen, timeout, f"{fragment!r} in the output", proc)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; the output so far: {self.text()[-500:]!r}") from None

    def close(self, timeout: float = 30.0) -> str:
        """Everything the pipe carried, after its end (the process closed it)."""
        self._thread.join(timeout)
        return self.text()
