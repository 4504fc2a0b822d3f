"""What a profile's path may be: a regular file or a folder (checked before anything opens it)."""

from __future__ import annotations

import os
import stat

from dlprof_profiler.errors import DLProfError

_SPECIAL_FILES = (
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def check_regular_file(path) -> None:
    """A profile is a regular file or a folder: a FIFO would block the run forever and a device never ends,
    so anything else is refused at once, naming it (a missing file is left to the reader's message)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise DLProfError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return
    kind = next((name for test, name in _SPECIAL_FILES if test(mode)), "a special file")
    raise DLProfError(f"{path}: is {kind}, not a regular file; give a profile file (copy the data to a file first)")
