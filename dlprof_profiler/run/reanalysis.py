"""A DLProf database read back and aggregated anew with a run's options: the one way `dlprof --database=DB`,
a rank of a multi-rank database, a baseline database and the viewer's Reaggregate re-aggregate."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from dlprof_profiler import contract as K
from dlprof_profiler import log
from dlprof_profiler.db import writer as database
from dlprof_profiler.db.load import made_from, memory_to_read, rows_read_whole
from dlprof_profiler.engine.analysis import Analysis, reaggregation_iterations, reanalyze
from dlprof_profiler.errors import DLProfError
from dlprof_profiler.options import RunOptions
from dlprof_profiler.process_memory import available_memory


@dataclass
class Reaggregated:
    """The new aggregation, and what a database that receives it needs (profile, domain ids, op index maps)."""

    result: Analysis
    profile: dict
    domain_ids: dict
    offsets: dict


def reaggregated(source: Path, options: RunOptions, rank: int | None = None) -> Reaggregated:
    """A new aggregation of the op model of a DLProf database (of one rank of a multi-rank one): key node,
    iteration range and domain from `options`; with `options.require_key_node` (the viewer's Reaggregate) a key
    node that is not found fails it, before anything is aggregated."""
    rank_read = K.DEFAULT_RANK if rank is None else rank
    check_memory(source, rank_read)
    with log.stage(f"Reading DLProf database {source}"):
        trace, corr, profile, domain_ids, offsets = database.load_model(source, rank_read)
    iterations = reaggregation_iterations(trace, corr, options.key_node, profile)
    if options.require_key_node and options.key_node and not iterations.found:
        where = "" if rank is None else f" in rank {rank}"
        raise DLProfError(f"{source}: key node '{options.key_node}' not found{where}", exit_code=2)
    result = reanalyze(trace, corr, profile, options.analysis_config(), str(source), iterations=iterations)
    return Reaggregated(result, profile, domain_ids, offsets)


def check_memory(source: Path, rank: int) -> None:
    """Refuse, before reading anything, a re-analysis the memory left cannot hold: a database's op model is
    read whole (at 10^7 kernels about 15 GB), which would otherwise end in the kernel's out-of-memory kill,
    or in swapping, rather than in a message."""
    rows = rows_read_whole(source, rank)
    room = available_memory()
    if rows is None or room is None:
        return
    need = memory_to_read(rows)
    if need > room:
        origin = made_from(source, rank)
        if origin and origin[1].startswith("nsys") and Path(origin[0]).is_file():
            export = shlex.quote(origin[0])
            instead = f"analyse the export it was made from instead (dlprof --database={export} --out_of_core=on"
            instead += ": staged on disk, in about 2.5 GB)"
        else:
            instead = "analyse the profile it was made from instead (an Nsight Systems export is staged on disk)"
        raise DLProfError(
            f"{source}: re-analysing this database needs about {need / 2**30:.1f} GB of memory ({rows:,} ranges, "
            f"API calls, GPU activities and op instances are read whole), {room / 2**30:.1f} GB are available; "
            f"{instead}, or free memory"
        )
