"""Output files of a run: where they go, refusing to overwrite without --force, and staging them so
they appear together or not at all."""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from dlprof_profiler.errors import DLProfError


def prepare_output_dir(path: Path) -> Path:
    """Create the output folder if needed and check it can be written."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise DLProfError(f"{path}: output path exists and is not a directory")
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
        self.root = Path(tempfile.mkdtemp(prefix=".dlprof-staging-", dir=self.output_dir))
        self.moves: list[tuple[Path, Path]] = []

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
