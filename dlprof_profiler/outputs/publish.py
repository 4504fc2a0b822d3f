"""Output files of a run: where they go, refusing to overwrite without --force, staging them so they appear
together or not at all, and one run at a time per output folder (a lock held for the whole run).

Publication (`Staging.commit`) survives a kill at any instant: the list of renames and removals is written to
a journal in the output folder (fsync'd) before the first rename and removed after the last, and every file it
names is complete in the staging folder before that; the next run into the folder completes a journal left by
a killed run (`complete_publication`, rolling forward: renames only move complete files, so the set the
journal names can always be completed), and the viewer hides a run whose folder holds one.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import signal
import socket
import tempfile
import threading
import time
from pathlib import Path

from dlprof_profiler import log
from dlprof_profiler.contract import PUBLISH_JOURNAL
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
JOURNAL_VERSION = 1
# Tests kill the run between two steps of a publication (renames, then removals): SIGKILL before step N
KILL_AT_PUBLISH_STEP = "DLPROF_TEST_KILL_AT_PUBLISH_STEP"
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
        self.published = False  # the journal is written: publication has begun

    @classmethod
    def attach(cls, output_dir: Path, root: Path) -> "Staging":
        """The staging folder another process created (a rank's worker writes its files into the run's)."""
        staging = cls.__new__(cls)
        staging.output_dir, staging.root, staging.moves = Path(output_dir), Path(root), []
        staging.published = False
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

    def commit(self, replacing=()) -> list[Path]:
        """Put the staged files in place, and remove the files of `replacing` (the previous run's set) that
        this run did not write: all together, even across a kill (see the module docstring)."""
        moves = [(staged, final) for staged, final in self.moves if staged.exists()]
        finals = {os.path.abspath(final) for _, final in moves}
        removals = [Path(p) for p in dict.fromkeys(replacing) if os.path.abspath(p) not in finals]
        removals = [p for p in removals if os.path.lexists(p)]
        journal = {
            "version": JOURNAL_VERSION,
            "pid": os.getpid(),
            "staging": self.root.name,
            "moves": [str(staged.relative_to(self.root)) for staged, _ in moves],
            "removals": [os.path.relpath(p, self.output_dir) for p in removals],
        }
        with signals_held():  # a Ctrl-C or SIGTERM now ends the run once its outputs are in place
            _write_journal(self.output_dir, journal)
            self.published = True
            _publish(self.output_dir, journal)
        self.discard()
        return [final for _, final in moves]

    def discard(self) -> None:
        if self.published and publication_pending(self.output_dir):
            return  # a publication that failed midway: the next run into the folder completes it from here
        shutil.rmtree(self.root, ignore_errors=True)

    def discard_after(self, writer) -> None:
        """Discard once a background database writer (if any) has stopped touching the staged files."""
        if writer is not None:
            try:
                writer.wait()
            except BaseException:  # the original error is the one to report
                pass
        self.discard()


_HELD_SIGNALS = {getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n)}


_holding = {"depth": 0, "deferred": None}  # blocks of signals_held entered on the main thread, and what waits


class signals_held:
    """Interrupting signals wait until the block ends. They are blocked for this thread, and a Python handler
    that runs meanwhile defers its action (`defer_while_held`): a signal another thread receives still runs its
    Python handler on the main thread at once (an interrupt while the database writer was being created ended
    the run with the writer's thread writing into the staging folder as it was removed, leaving it behind)."""

    def __enter__(self):
        self.previous = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD_SIGNALS) if _HELD_SIGNALS else None
        self.main = threading.current_thread() is threading.main_thread()
        if self.main:
            _holding["depth"] += 1
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if self.previous is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, self.previous)
        if self.main:
            _holding["depth"] -= 1
            if _holding["depth"] == 0 and _holding["deferred"] is not None:  # (nested: the outer block's end)
                deferred, _holding["deferred"] = _holding["deferred"], None
                if exc_type is None:  # (an error already ending the run goes on alone)
                    deferred()


def defer_while_held(action) -> bool:
    """Called by a signal handler on the main thread: inside signals_held, keep `action` (the first one) for the
    block's end and return True; otherwise False (act now)."""
    if _holding["depth"] == 0:
        return False
    if _holding["deferred"] is None:
        _holding["deferred"] = action
    return True


def _write_journal(output_dir: Path, journal: dict) -> None:
    """The journal, complete and on disk, before the first rename (written aside, fsync'd, renamed, the
    folder fsync'd)."""
    path = Path(output_dir) / PUBLISH_JOURNAL
    tmp = path.with_name(f"{PUBLISH_JOURNAL}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(journal, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_folder(output_dir)


def _publish(output_dir: Path, journal: dict) -> None:
    """Carry out a journal: its renames (a staged file already moved is skipped), then its removals, then
    remove the journal. Done again after a kill, it completes what the killed run began."""
    output_dir = Path(output_dir)
    root = output_dir / journal["staging"]
    kill_at = os.environ.get(KILL_AT_PUBLISH_STEP)
    steps = [("move", rel) for rel in journal["moves"]] + [("remove", rel) for rel in journal["removals"]]
    for step, (what, rel) in enumerate(steps):
        if kill_at is not None and int(kill_at) == step:
            os.kill(os.getpid(), signal.SIGKILL)
        final = output_dir / rel
        if what == "move":
            staged = root / rel
            if staged.exists():
                final.parent.mkdir(parents=True, exist_ok=True)
                os.replace(staged, final)
        else:
            final.unlink(missing_ok=True)
    if kill_at is not None and int(kill_at) == len(steps):
        os.kill(os.getpid(), signal.SIGKILL)
    _fsync_folder(output_dir)
    (output_dir / PUBLISH_JOURNAL).unlink(missing_ok=True)


def _fsync_folder(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # not supported by every filesystem
        pass
    finally:
        os.close(fd)


def publication_pending(folder) -> bool:
    """Whether a run's outputs in this folder are being put in place, or were when the run was killed."""
    return os.path.lexists(os.path.join(folder, PUBLISH_JOURNAL))


def complete_publication(output_dir: Path) -> int:
    """Complete the publication a killed run left in this folder (the caller holds the folder's lock, so its
    writer is gone); returns the number of files it named (0: none pending)."""
    output_dir = Path(output_dir)
    path = output_dir / PUBLISH_JOURNAL
    if not os.path.lexists(path):
        return 0
    try:
        journal = json.loads(path.read_text(encoding="utf-8"))
        if journal.get("version") != JOURNAL_VERSION or not _safe_journal(journal):
            raise ValueError("unknown layout")
    except (OSError, ValueError, AttributeError) as exc:
        raise DLProfError(
            f"{path}: cannot complete the publication a killed run left in this folder ({exc}); "
            "remove this file and the staging folders beside it"
        ) from None
    _publish(output_dir, journal)
    shutil.rmtree(output_dir / journal["staging"], ignore_errors=True)
    return len(journal["moves"]) + len(journal["removals"])


def _safe_journal(journal: dict) -> bool:
    """Every path of a journal stays inside the output folder (it is read back from disk)."""
    staging = journal.get("staging")
    if not isinstance(staging, str) or not staging.startswith(STAGING_PREFIX) or "/" in staging:
        return False
    paths = journal.get("moves", []) + journal.get("removals", [])
    return all(
        isinstance(p, str) and p and not os.path.isabs(p) and ".." not in Path(p).parts and "\x00" not in p
        for p in paths
    )


def report_set(output_dir: Path, base_name: str, stems) -> list[Path]:
    """The files of the report set a run with this base name wrote into the folder: `<base>_<stem>[_<suffix>]
    .csv|json` for the report stems given, suffixes being domain and rank suffixes; a report of a run with a
    longer base name (`<base>_<x>_dldb.sqlite` beside it) is not counted. A run replaces the whole set: the
    reports it does not write again are removed with its publication (docs/DESIGN.md, "A run's report set")."""
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        return []
    stems = "|".join(re.escape(s) for s in stems)

    def reports_of(base: str):
        return re.compile(re.escape(base) + r"_(?:" + stems + r")(?:_[A-Za-z0-9_.-]+)?\.(?:csv|json)")

    others = [
        reports_of(p.name[: -len("_dldb.sqlite")])
        for p in output_dir.glob(f"{glob.escape(base_name)}_*_dldb.sqlite")
        if p.name != f"{base_name}_dldb.sqlite"
    ]
    ours = reports_of(base_name)
    return sorted(
        p
        for p in output_dir.iterdir()
        if ours.fullmatch(p.name) and not any(o.fullmatch(p.name) for o in others) and not p.is_dir()
    )


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
            completed = complete_publication(self.path)  # before its staging folder counts as stale
            if completed:
                log.info(f"{self.path}: completed the publication of a run killed while its outputs were put in place")
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
