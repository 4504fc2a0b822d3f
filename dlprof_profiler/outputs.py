"""Output files of a run: where they go, refusing to overwrite without --force, staging them so they appear
together or not at all, and one run at a time per output folder (a lock held for the whole run)."""

from __future__ import annotations

import os
import re
import shutil
import socket
import tempfile
import time
from pathlib import Path

from dlprof_profiler import log
from dlprof_profiler.errors import DLProfError

try:
    import fcntl
except ImportError:  # not POSIX: runs are not serialized
    fcntl = None

LOCK_NAME = ".dlprof.lock"
STAGING_PREFIX = ".dlprof-staging-"
# .dlprof-staging-<pid>@<host>.<random>; folders of older versions carry no owner
_STAGING_OWNER = re.compile(r"^\.dlprof-staging-(\d+)@(.*)\.[^.]+$")
LEGACY_STAGING_AGE_S = 3600  # ownerless staging folders untouched this long are left by killed runs
_staged_roots: dict[str, str] = {}  # staging folder -> its output folder, to name final paths in messages


def prepare_output_dir(path: Path) -> Path:
    """Create the output folder if needed and check it can be written."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise DLProfError(f"{path}: output path exists and is not a directory")
    parent = path.parent
    while not os.path.lexists(parent) and parent != parent.parent:
        parent = parent.parent
    if not path.exists() and not parent.is_dir():
        raise DLProfError(f"{path}: cannot create the output directory: {parent} is not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DLProfError(f"{path}: cannot create the output directory ({exc.strerror or exc})") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise DLProfError(f"{path}: output directory is not writable")
    return path


def refuse_existing(paths: list[Path], force: bool) -> None:
    """Existing outputs are an error unless --force."""
    if force:
        return
    existing = [p for p in paths if p.exists()]
    if existing:
        more = f" (and {len(existing) - 1} more)" if len(existing) > 1 else ""
        raise DLProfError(f"{existing[0]}: output file exists{more}; use --force=true to overwrite", exit_code=1)


class Staging:
    """Files are written under a hidden folder inside the output folder, then renamed into place."""

    def __init__(self, output_dir: Path):
        self.output_dir = Path(output_dir)
        self.root = Path(tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{os.getpid()}@{_host()}.", dir=self.output_dir))
        _staged_roots[str(self.root)] = str(self.output_dir)
        self.moves: list[tuple[Path, Path]] = []

    @classmethod
    def attach(cls, output_dir: Path, root: Path) -> "Staging":
        """The staging folder another process created (a rank's worker writes its files into the run's)."""
        staging = cls.__new__(cls)
        staging.output_dir, staging.root, staging.moves = Path(output_dir), Path(root), []
        _staged_roots[str(staging.root)] = str(staging.output_dir)
        return staging

    def path(self, final: Path) -> Path:
        """Where to write the file that will become `final`."""
        rel = Path(final).resolve().relative_to(self.output_dir.resolve())
        staged = self.root / rel
        staged.parent.mkdir(parents=True, exist_ok=True)
        if (staged, Path(final)) not in self.moves:
            self.moves.append((staged, Path(final)))
        return staged

    def commit(self) -> list[Path]:
        done = []
        for staged, final in self.moves:
            if staged.exists():
                final.parent.mkdir(parents=True, exist_ok=True)
                os.replace(staged, final)
                done.append(final)
        self.discard()
        return done

    def discard(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    def discard_after(self, writer) -> None:
        """Discard once a background database writer (if any) has stopped touching the staged files."""
        if writer is not None:
            try:
                writer.wait()
            except BaseException:  # the original error is the one to report
                pass
        self.discard()


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9.-]", "_", socket.gethostname()) or "localhost"


def unstaged(text: str) -> str:
    """A message with staging paths replaced by the final paths they stand for (users never see staging)."""
    for root, final in _staged_roots.items():
        text = text.replace(root + os.sep, "" if final == "." else final + os.sep)
    return text


def _process_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # exists, owned by someone else
        return False
    return False


def _newest_mtime(folder: Path) -> float:
    newest = folder.stat().st_mtime
    for dirpath, _dirs, files in os.walk(folder):
        for name in files:
            try:
                newest = max(newest, os.stat(os.path.join(dirpath, name)).st_mtime)
            except OSError:
                pass
    return newest


def stale_staging(output_dir: Path, now: float | None = None) -> list[Path]:
    """Staging folders in output_dir left by runs that are gone: owned by a process of this host that no
    longer exists, or (older versions, no owner recorded) untouched for LEGACY_STAGING_AGE_S."""
    now = time.time() if now is None else now
    stale = []
    for entry in Path(output_dir).glob(f"{STAGING_PREFIX}*"):
        if not entry.is_dir() or entry.is_symlink():
            continue
        match = _STAGING_OWNER.match(entry.name)
        try:
            if match:
                if match.group(2) == _host() and _process_gone(int(match.group(1))):
                    stale.append(entry)
            elif now - _newest_mtime(entry) > LEGACY_STAGING_AGE_S:
                stale.append(entry)
        except OSError:
            continue
    return stale


class OutputFolder:
    """The output folder of one run, as a context manager: created if missing, locked for the whole run
    (a second run into it fails at once, naming the folder and the first run's pid), cleaned of staging
    folders left by killed runs; folders it created are removed again if the run leaves them empty."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.created: list[Path] = []
        self._fd: int | None = None

    def __enter__(self):
        self._create()
        try:
            self._lock()
            self._remove_stale_staging()
        except BaseException:
            self._remove_created()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self._unlock()
        self._remove_created()

    def _create(self) -> None:
        missing = []
        for folder in [self.path, *self.path.parents]:
            if os.path.lexists(folder):
                break
            missing.append(folder)
        self.created = missing[::-1]  # outermost first
        try:
            prepare_output_dir(self.path)
        except BaseException:
            self._remove_created()
            raise

    def _remove_created(self) -> None:
        for folder in reversed(self.created):
            if not os.path.lexists(folder):
                continue
            try:
                folder.rmdir()
            except OSError:  # holds outputs (or someone else's files): kept
                break

    def _lock(self) -> None:
        if fcntl is None:
            return
        lock_path = self.path / LOCK_NAME
        while True:
            try:
                fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
            except OSError as exc:
                raise DLProfError(f"{self.path}: cannot lock the output folder ({exc.strerror or exc})") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                owner = _read_owner(fd)
                os.close(fd)
                raise DLProfError(
                    f"{self.path}: another dlprof run{owner} is writing to this output folder; "
                    "wait for it to end or choose another --output_path"
                ) from None
            # the previous holder removes the file as it leaves: a lock on a removed file locks nothing
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(lock_path))
            except OSError:
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()} {_host()}\n".encode())
        self._fd = fd

    def _unlock(self) -> None:
        if self._fd is None:
            return
        try:
            os.unlink(self.path / LOCK_NAME)  # while still holding it (see _lock)
        except OSError:
            pass
        os.close(self._fd)
        self._fd = None

    def _remove_stale_staging(self) -> None:
        stale = stale_staging(self.path)
        for folder in stale:
            shutil.rmtree(folder, ignore_errors=True)
        if stale:
            log.info(f"removed {len(stale)} staging folder(s) left in {self.path} by runs that were killed")


def _read_owner(fd: int) -> str:
    try:
        text = os.pread(fd, 200, 0).decode("utf-8", "replace").split()
    except OSError:
        return ""
    if text and text[0].isdigit():
        host = f" on {text[1]}" if len(text) > 1 and text[1] != _host() else ""
        return f" (pid {text[0]}{host})"
    return ""
