"""Which profiles `--database` names and which rank each one is: a comma list, a directory or a glob of files,
one rank per file (docs/DESIGN.md "Multi-rank analysis"). A rank is taken from the profile where it is
recorded (Kineto `distributedInfo`; the launcher's RANK in an nsys export's environment), else the files get
the lowest free rank numbers in the order given (natural name order for a directory or a glob).

Everything here reads only file heads and small tables, so a bad input list fails at once, before any
analysis starts.
"""

from __future__ import annotations

import glob
import gzip
import os
import re
import sqlite3
import zlib
from dataclasses import dataclass
from pathlib import Path

from dlprof_profiler import contract as K
from dlprof_profiler import log
from dlprof_profiler.db.writer import is_dlprof_database
from dlprof_profiler.ingest import formats as ingest
from dlprof_profiler.ingest import nsys_report
from dlprof_profiler.errors import DLProfError

MAX_RANK = (1 << (63 - K.ID_BITS)) - 1  # rank << ID_BITS keys a rank's API calls and GPU activities
HEAD_BYTES = 4 << 20  # Kineto writes distributedInfo before traceEvents
# Environment variables of the usual launchers holding the global rank, most specific first
RANK_VARIABLES = ("RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "MV2_COMM_WORLD_RANK", "SLURM_PROCID")
_DIST_RANK = re.compile(rb'"distributedInfo"\s*:\s*\{[^{}]*?"rank"\s*:\s*(\d+)')
_GLOB_CHARS = re.compile(r"[*?\[]")
_PROFILE_NAME = re.compile(r"\.(?:sqlite|db|json|json\.gz|nsys-rep|qdrep)$", re.IGNORECASE)


@dataclass(frozen=True)
class RankInput:
    """One profile of a multi-rank analysis."""

    path: Path
    rank: int
    kind: str  # ingest.SQLITE or ingest.KINETO (an Nsight Systems report is given as its SQLite export)
    recorded: bool  # the rank number comes from the profile itself


def natural_key(path: Path) -> list:
    """Name order with numbers compared as numbers (report_2 before report_10)."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", str(path))]


def resolve(spec: str) -> list[RankInput]:
    """The profiles of a `--database` value, with their ranks. One entry: a single-profile analysis
    (a file, or a folder of Kineto traces of one capture) as before; several: a multi-rank analysis."""
    spec = str(spec)
    if os.path.lexists(spec) and not Path(spec).is_dir():
        ingest.check_regular_file(spec)
        return [RankInput(Path(spec), 0, "", False)]
    if "," in spec and not os.path.lexists(spec):
        files = [Path(p.strip()) for p in spec.split(",") if p.strip()]
        if not files:
            raise DLProfError(f"{spec}: no file named")
    elif Path(spec).is_dir():
        return _directory(Path(spec))
    elif _GLOB_CHARS.search(spec):
        files = sorted((Path(p) for p in glob.glob(spec)), key=natural_key)
        files = [p for p in files if p.is_file()]
        if not files:
            raise DLProfError(f"{spec}: no file matches this pattern")
    else:
        return [RankInput(Path(spec), 0, "", False)]  # missing: the single-file path names the problem
    if len(files) == 1:
        ingest.check_regular_file(files[0])
        return [RankInput(files[0], 0, "", False)]
    return assign_ranks(files)


def _directory(folder: Path) -> list[RankInput]:
    """A folder: its nsys exports and Kineto traces. Kineto traces of which fewer than two record a rank are
    one capture of several processes (what `--backend=torch` writes), as before; where ranks are recorded, the
    traces without one (the launcher, say) are left out."""
    files = sorted(
        (
            p
            for p in folder.iterdir()
            if p.is_file() and _PROFILE_NAME.search(p.name) and ".partial." not in p.name and not p.name.startswith(".")
        ),
        key=natural_key,
    )
    kinds = {}
    for path in files:
        try:
            kinds[path] = ingest.trace_format(path)
        except DLProfError:
            continue  # not a profile (a note, a damaged leftover): a folder is taken for what it holds
    kinds = _exported(kinds, beside=True)

    profiles = [p for p, k in kinds.items() if not (k == ingest.SQLITE and is_dlprof_database(p))]
    kineto = [p for p in profiles if kinds[p] == ingest.KINETO]
    ranked = {p: kineto_rank(p) for p in kineto}
    if not [p for p in profiles if kinds[p] == ingest.SQLITE] and sum(r is not None for r in ranked.values()) < 2:
        if kineto:
            return [RankInput(folder, 0, ingest.KINETO, False)]  # one capture, read as before
        raise DLProfError(
            f"{folder}: is a directory without profiles (nsys SQLite exports or reports, Kineto traces *.json[.gz])"
        )
    left_out = [p for p in kineto if ranked[p] is None and any(r is not None for r in ranked.values())]
    if left_out:
        log.warning(
            f"{folder}: {len(left_out)} Kineto trace(s) without a rank (distributedInfo) left out, as "
            f"processes outside the process group: {', '.join(p.name for p in left_out[:5])}"
            + (" ..." if len(left_out) > 5 else "")
        )
    chosen = [p for p in profiles if p not in left_out]
    if len(chosen) == 1:
        return [RankInput(chosen[0], 0, kinds[chosen[0]], False)]
    return assign_ranks(chosen, kinds)


def assign_ranks(files: list[Path], kinds: dict | None = None) -> list[RankInput]:
    """Check the files (present, readable, profiles, each once) and number them: recorded ranks first, the
    others the lowest free numbers in the order given; two files claiming one rank are an error."""
    kinds = dict(kinds or {})
    seen: dict = {}
    for path in files:
        if not path.exists():
            raise DLProfError(f"{path}: no such file")
        ingest.check_regular_file(path)
        if path.is_dir():
            raise DLProfError(
                f"{path}: is a directory; list the profile files of a multi-rank analysis (or give the directory alone)"
            )
        real = os.path.realpath(path)
        if real in seen:
            raise DLProfError(f"{path}: given twice (also as {seen[real]}); each file is one rank")
        seen[real] = path
        if path not in kinds:
            kinds[path] = ingest.trace_format(path)
        if kinds[path] == ingest.SQLITE:
            if is_dlprof_database(path):
                raise DLProfError(
                    f"{path}: a DLProf database cannot be one rank of a multi-rank analysis; give "
                    "the nsys exports or Kineto traces of the ranks (or this database alone)"
                )
    exported = _exported({p: kinds[p] for p in files})
    files = list(exported)
    kinds = exported
    recorded = {p: recorded_rank(p, kinds[p]) for p in files}
    owners: dict = {}
    for path, rank in recorded.items():
        if rank is None:
            continue
        if rank > MAX_RANK:
            raise DLProfError(f"{path}: rank {rank} is larger than the {MAX_RANK} this database can number")
        if rank in owners:
            raise DLProfError(f"{path}: records rank {rank}, as {owners[rank]} does; each rank must be given once")
        owners[rank] = path
    free = (r for r in range(MAX_RANK + 1) if r not in owners)
    out = []
    for path in files:
        rank = recorded[path]
        out.append(RankInput(path, next(free) if rank is None else rank, kinds[path], rank is not None))
    return sorted(out, key=lambda r: r.rank)


def _exported(kinds: dict, beside: bool = False) -> dict:
    """{path: kind} with each Nsight Systems report replaced by its SQLite export (nsys_report), in order. With
    `beside` (a folder's files), a report whose export nsys wrote beside it (`report.sqlite`) is left out."""
    out = {}
    for path, kind in kinds.items():
        if kind != ingest.NSYS_REPORT:
            out[path] = kind
        elif not (beside and kinds.get(path.with_suffix(".sqlite")) == ingest.SQLITE):
            out[nsys_report.sqlite_of(path)] = ingest.SQLITE
    return out


def recorded_rank(path: Path, kind: str) -> int | None:
    """The rank a profile records, or None."""
    if kind == ingest.KINETO:
        return kineto_rank(path)
    return nsys_rank(path)


def kineto_rank(path: Path) -> int | None:
    """`distributedInfo.rank` from the head of a Kineto trace (torch.profiler writes it before the events)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(HEAD_BYTES)
        if head.startswith(b"\x1f\x8b"):
            try:
                head = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(head, HEAD_BYTES)
            except zlib.error:
                with gzip.open(path, "rb") as fh:
                    head = fh.read(HEAD_BYTES)
    except (OSError, EOFError, zlib.error):
        return None
    match = _DIST_RANK.search(head)
    return int(match.group(1)) if match else None


def nsys_rank(path: Path) -> int | None:
    """The global rank in the environment nsys recorded (`nsys profile` started by a launcher per rank, as in
    `srun nsys profile -o report_%q{RANK} ...`): TARGET_INFO_SYSTEM_ENV's DeviceEnvironment."""
    try:
        con = sqlite3.connect(f"{Path(path).resolve().as_uri()}?mode=ro&immutable=1", uri=True)
        con.text_factory = lambda raw: raw.decode("utf-8", "replace")
        try:
            rows = con.execute("SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'DeviceEnvironment'").fetchall()
        finally:
            con.close()
    except sqlite3.Error:
        return None
    for (text,) in rows:
        rank = rank_from_environment(str(text or ""))
        if rank is not None:
            return rank
    return None


def rank_from_environment(text: str) -> int | None:
    """The rank in an environment listing `NAME=value;NAME=value...` (RANK_VARIABLES, first found)."""
    values = {}
    for item in text.split(";"):
        name, sep, value = item.partition("=")
        if sep and name.strip() in RANK_VARIABLES and value.strip().isdigit():
            values.setdefault(name.strip(), int(value.strip()))
    for name in RANK_VARIABLES:
        if name in values:
            return values[name]
    return None
