"""Nsight Systems reports as they come (`.nsys-rep`, `.qdrep`): recognised by their first bytes, exported to
SQLite with the `nsys` on PATH (`nsys export --type sqlite`, as nsys_tool.export_sqlite runs it) into the run's
staging folder, never beside the input, and analysed as the export. The export keeps the report's name for
the user: `shown(path)` gives the report a staged export stands for, in messages and in what the outputs
record as the source file.
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

from dlprof_profiler import log
from dlprof_profiler import nsys_tool
from dlprof_profiler.errors import DLProfError
from dlprof_profiler.ingest.files import check_regular_file
from dlprof_profiler.outputs.publish import Staging, prepare_output_dir

REPORT_MAGIC = b"NVIDIA Tegra Profiler Report"  # the first bytes of every .nsys-rep and .qdrep
REPORT_SUFFIXES = (".nsys-rep", ".qdrep")
# the version of the nsys that wrote the report, in its first line since about 2023: "Report 2026@4@1@191-…v0."
_WRITER_VERSION = re.compile(rb"Report (\d{4})@(\d+)@(\d+)@(\d+)")
HEAD_BYTES = 256

_origins: dict[str, str] = {}  # staged export (absolute path) -> the report it was exported from (as given)
_current: "Exports | None" = None


def is_report(path: Path) -> bool:
    """Whether a file is an Nsight Systems report, by its first bytes."""
    try:
        with open(path, "rb") as fh:
            return fh.read(len(REPORT_MAGIC)) == REPORT_MAGIC
    except OSError:
        return False


def writer_version(path: Path) -> tuple | None:
    """(year, minor, patch, build) of the nsys that wrote the report, when its first line says (None otherwise)."""
    try:
        with open(path, "rb") as fh:
            match = _WRITER_VERSION.search(fh.read(HEAD_BYTES))
    except OSError:
        return None
    return tuple(int(g) for g in match.groups()) if match else None


def _forms(path) -> list[str]:
    """The ways a path may be written: as given, absolute, resolved."""
    return list(dict.fromkeys([str(path), os.path.abspath(str(path)), os.path.realpath(str(path))]))


def shown(path) -> Path:
    """The report a staged export stands for (any other path as it is)."""
    return Path(_origins.get(os.path.realpath(str(path)), str(path)))


def shown_text(text: str) -> str:
    """A message with the staged exports' paths replaced by the reports they stand for (longest first: a
    relative form is the end of an absolute one)."""
    pairs = sorted(
        ((form, report) for export, report in _origins.items() for form in _forms(export)), key=lambda p: -len(p[0])
    )
    for form, report in pairs:
        text = text.replace(form, report)
    return text


def origins() -> dict:
    """{staged export: report} of this process (passed to the workers of a multi-rank run: `remember`)."""
    return dict(_origins)


def remember(mapping: dict | None) -> None:
    """Name the exports another process made after their reports (a multi-rank run's worker)."""
    _origins.update(mapping or {})


class Exports:
    """The exports of one run's reports, in a staging folder of its output folder (outputs.Staging: removed at
    the end, and by the next run if this one is killed); each report is exported once."""

    def __init__(self, output_dir: Path):
        self.output_dir = Path(output_dir)
        self.staging = None
        self.done: dict[str, Path] = {}

    def sqlite(self, report: Path) -> Path:
        """The SQLite export of a report (exported on first use)."""
        key = os.path.realpath(report)
        if key in self.done:
            return self.done[key]
        if self.staging is None:
            self.staging = Staging(prepare_output_dir(self.output_dir))
        folder = self.staging.root / "nsys_exports" / str(len(self.done))
        folder.mkdir(parents=True)
        target = folder / (Path(report).name + ".sqlite")
        export_report(Path(report), target)
        _origins[os.path.realpath(str(target))] = str(report)
        self.done[key] = target
        return target

    def close(self) -> None:
        if self.staging is not None:
            self.staging.discard()
            self.staging = None
        for target in self.done.values():
            _origins.pop(os.path.realpath(str(target)), None)
        self.done.clear()


@contextmanager
def exporting(output_dir: Path):
    """Reports met while the block runs are exported into a staging folder of `output_dir`, removed after it."""
    global _current
    previous, _current = _current, Exports(output_dir)
    try:
        yield _current
    finally:
        exports, _current = _current, previous
        exports.close()


def sqlite_of(path: Path) -> Path:
    """The file to read for `path`: the SQLite export of an Nsight Systems report, the path itself otherwise.
    Outside an `exporting` block (a library call), reports are exported into a temporary folder."""
    path = Path(path)
    check_regular_file(path)  # is_report opens it: a FIFO would block for ever
    if path.is_dir() or not is_report(path):
        return path
    exports = _current if _current is not None else _process_exports()
    return exports.sqlite(path)


_fallback: Exports | None = None


def _process_exports() -> Exports:
    global _fallback
    if _fallback is None:
        folder = Path(tempfile.mkdtemp(prefix="dlprof-nsys-exports-"))
        _fallback = Exports(folder)
        atexit.register(lambda: (_fallback.close(), shutil.rmtree(folder, ignore_errors=True)))
    return _fallback


def export_report(report: Path, target: Path) -> Path:
    """`nsys export --type sqlite` of one report; one line naming the report when nsys is missing, too old for
    the report, or fails."""
    path = shutil.which("nsys")
    if not path:
        raise DLProfError(
            f"{report}: an Nsight Systems report; exporting it to SQLite needs `nsys`, which is not on PATH: "
            f"{nsys_tool.INSTALL_HINT} (or export it yourself: nsys export --type sqlite {report})"
        )
    version = nsys_tool.nsys_version(path)
    wrote = writer_version(report)
    mine = nsys_tool.version_tuple(version)
    if wrote is not None and mine[:2] < wrote[:2]:
        needed = ".".join(map(str, wrote[:3]))
        raise DLProfError(
            f"{report}: written by Nsight Systems {needed}; the nsys on PATH ({path}) is {version}, too old to "
            f"export it: install Nsight Systems {needed} or newer and put its `nsys` on PATH "
            "(https://developer.nvidia.com/nsight-systems)"
        )
    with log.stage(f"Exporting the Nsight Systems report {report} to SQLite (nsys {version})"):
        try:
            nsys_tool.export_sqlite(report, target, nsys_tool.NsysInfo(path=path, version=version))
        except DLProfError as exc:  # "exporting <report> to SQLite failed (...)"
            raise DLProfError(
                f"{exc}; the report is damaged, or was written by a newer Nsight Systems than this nsys ({version}): "
                "then install that version or newer (https://developer.nvidia.com/nsight-systems)"
            ) from None
    return target
