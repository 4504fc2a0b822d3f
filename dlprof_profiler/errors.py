"""The exception types that reach the user as a one-line message and a non-zero exit."""

import errno


class DLProfError(Exception):
    """A problem with the user's input or environment, phrased for the user."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code

    def __reduce__(self):  # raised in a worker process, re-raised in the parent with its exit code
        return (type(self), (str(self), self.exit_code))


class Interrupted(KeyboardInterrupt):
    """SIGTERM or SIGHUP received: the run unwinds as after Ctrl-C (staging removed, lock released)."""

    def __init__(self, signum: int, name: str):
        super().__init__(name)
        self.signum, self.name = signum, name


# Why a write failed, for the errors that are about the place written to rather than the data, and what to do
_NO_ROOM = {
    errno.ENOSPC: ("the disk is full (no space left on device)", "free space there or choose another --output_path"),
    errno.EDQUOT: ("the disk quota is exceeded", "free space within the quota or choose another --output_path"),
    errno.EFBIG: (
        "a file reached the file size limit (file too large)",
        "raise the limit (ulimit -f) or choose another --output_path",
    ),
}
_NO_ROOM_TEXTS = {
    "no space left on device": errno.ENOSPC,
    "disk quota exceeded": errno.EDQUOT,
    "file too large": errno.EFBIG,
}


def no_room_reason(exc: BaseException) -> tuple[str, str] | None:
    """(why, what to do) when a write failed for want of room in the folder (an OSError's errno, or the text
    of a library's error naming no file, such as DuckDB's when it spills); None for other failures."""
    code = getattr(exc, "errno", None)
    if code not in _NO_ROOM:
        text = str(exc).lower()
        code = next((c for t, c in _NO_ROOM_TEXTS.items() if t in text), None)
    return _NO_ROOM.get(code)
