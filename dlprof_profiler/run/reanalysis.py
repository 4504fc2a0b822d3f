"""A DLProf database read back and aggregated anew with a run's options: the one way `dlprof --database=DB`,
a rank of a multi-rank database, a baseline database and the viewer's Reaggregate re-aggregate."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dlprof_profiler import contract as K
from dlprof_profiler import log
from dlprof_profiler.db import writer as database
from dlprof_profiler.engine.analysis import Analysis, reaggregation_iterations, reanalyze
from dlprof_profiler.errors import DLProfError
from dlprof_profiler.options import RunOptions


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
    with log.stage(f"Reading DLProf database {source}"):
        trace, corr, profile, domain_ids, offsets = database.load_model(
            source, K.DEFAULT_RANK if rank is None else rank
        )
    iterations = reaggregation_iterations(trace, corr, options.key_node, profile)
    if options.require_key_node and options.key_node and not iterations.found:
        where = "" if rank is None else f" in rank {rank}"
        raise DLProfError(f"{source}: key node '{options.key_node}' not found{where}", exit_code=2)
    result = reanalyze(trace, corr, profile, options.analysis_config(), str(source), iterations=iterations)
    return Reaggregated(result, profile, domain_ids, offsets)
