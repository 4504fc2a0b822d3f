"""What both capture backends check and report about the user's command: the output folder, outputs already
there, the program to run, and how the command ended."""

from __future__ import annotations

import os
import shutil
import signal
from dataclasses import dataclass
from pathlib import Path

from dlprof_profiler.errors import DLProfError


@dataclass(frozen=True)
class Captured:
    """What a capture backend captured, for the CLI to analyse."""

    source: Path  # the SQLite export or the Kineto trace(s) to analyse
    info: dict  # how it was captured, recorded in the database's profile (profile_info["capture"])
    status: int  # the run's exit status when the analysis succeeds: the command's (128 + a signal passed on)


def output_dir(options) -> Path:
    """--output_path as an absolute path (nsys runs the program elsewhere than dlprof's folder)."""
    return Path(os.path.abspath(os.path.expanduser(options.output_path or ".")))


def check_output_path(path: Path) -> None:
    """--output_path must be a writable folder, or creatable; checked before anything is written."""
    path = Path(path)
    if path.exists():
        if not path.is_dir():
            raise DLProfError(f"--output_path {path}: exists and is not a folder")
        if not os.access(path, os.W_OK | os.X_OK):
            raise DLProfError(f"--output_path {path}: folder is not writable")
        return
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise DLProfError(f"--output_path {path}: cannot be created, {parent} is not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise DLProfError(f"--output_path {path}: cannot be created, {parent} is not writable")


def check_existing(paths, force: bool) -> None:
    """Existing outputs are an error unless --force."""
    existing = [Path(p) for p in paths if Path(p).exists()]
    if existing and not force:
        more = f" (and {len(existing) - 1} more outputs)" if len(existing) > 1 else ""
        raise DLProfError(f"{existing[0]}: already exists{more}; use --force to overwrite, or another --output_path")


def resolve_command(command: list) -> str:
    """Path of the program the command runs, or a one-line error (status 127/126 as a shell would)."""
    if not command:
        raise DLProfError("no command to profile", exit_code=2)
    program = command[0]
    path = program if os.sep in program else shutil.which(program)
    if not path or not os.path.exists(path):
        raise DLProfError(f"{program}: command not found", exit_code=127)
    if os.path.isdir(path) or not os.access(path, os.X_OK):
        raise DLProfError(f"{program}: not an executable program", exit_code=126)
    return path


def signal_name(signum: int) -> str:
    """SIGTERM for 15; "signal N" for a number Python does not name."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def read_status(path: Path) -> int | None:
    """The exit status the launcher recorded, or None."""
    try:
        return int(Path(path).read_text().strip())
    except (OSError, ValueError):
        return None


def describe_status(status: int | None) -> str:
    """An exit status as a shell user reads it ("exit status 143, ended by SIGTERM")."""
    if status is None:
        return "exit status unknown"
    if status > 128 and status - 128 < signal.NSIG:
        return f"exit status {status}, ended by {signal_name(status - 128)}"
    return f"exit status {status}"
