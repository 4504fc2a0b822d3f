"""Ingest, format-neutral: choose the adapter by the file's content (never by its name) and read it into
trace frames. Nsight Systems SQLite exports go to `nsys.py`, Kineto / Chrome-trace JSON (gzipped or
not) to `kineto.py`; Nsight Systems reports (.nsys-rep, .qdrep) are exported to SQLite first
(`nsys_report`); DLProf databases are SQLite too and are told apart by `db.writer.is_dlprof_database`."""

from __future__ import annotations

import os
import re
from pathlib import Path

from dlprof_profiler.engine.trace import Trace
from dlprof_profiler.errors import DLProfError
from dlprof_profiler.ingest import nsys_report
from dlprof_profiler.ingest.files import check_regular_file
from dlprof_profiler.ingest.kineto import is_kineto_trace, merge_traces, read_kineto_trace
from dlprof_profiler.ingest.nsys import read_nsys_export
from dlprof_profiler.ingest.sqlite_source import SQLITE_MAGIC

SQLITE, KINETO, NSYS_REPORT = "sqlite", "kineto", "nsys_report"


def trace_format(path: Path) -> str:
    """`sqlite`, `kineto` or `nsys_report`, from the first bytes of the file (a folder of Kineto traces, one per
    process, is `kineto` too); a one-line error for anything else."""
    path = Path(path)
    check_regular_file(path)  # before anything opens it: a FIFO would block the run for ever
    if not path.exists():
        raise DLProfError(f"{path}: no such file")
    if path.is_dir():
        if kineto_files(path):
            return KINETO
        raise DLProfError(
            f"{path}: is a directory, not a profile file (nor a folder of Kineto traces *.pt.trace.json[.gz])"
        )
    if not os.access(path, os.R_OK):
        raise DLProfError(f"{path}: not readable (permission denied)")
    with open(path, "rb") as fh:
        head = fh.read(len(SQLITE_MAGIC))
    if not head:
        raise DLProfError(f"{path}: empty file, not a profile")
    if head.startswith(SQLITE_MAGIC):
        return SQLITE
    if nsys_report.is_report(path):
        return NSYS_REPORT
    if is_kineto_trace(path):
        return KINETO
    raise DLProfError(
        f"{path}: not an SQLite database (Nsight Systems export, DLProf database) nor a Kineto "
        "trace (torch.profiler JSON, optionally gzipped) nor an Nsight Systems report (.nsys-rep, .qdrep)"
    )


def kineto_files(folder: Path) -> list[Path]:
    """The Kineto traces of a folder (one per profiled process, as `dlprof --backend=torch` writes them)."""
    return sorted(
        p
        for p in Path(folder).iterdir()
        if p.is_file() and re.search(r"\.json(?:\.gz)?$", p.name) and ".partial." not in p.name
    )


def read_trace(path: Path) -> Trace:
    """Read a capture of any supported format into trace frames."""
    path = Path(path)
    if trace_format(path) == KINETO:
        if path.is_dir():
            return merge_traces([read_kineto_trace(p) for p in kineto_files(path)], path)
        return read_kineto_trace(path)
    export = nsys_report.sqlite_of(path)
    trace = read_nsys_export(export)
    if nsys_report.shown(export) != export:  # a report's export: named after the report
        trace.source = nsys_report.shown(export)
        trace.warnings = [nsys_report.shown_text(w) for w in trace.warnings]
    return trace
