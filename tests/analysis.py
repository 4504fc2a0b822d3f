"""Run the engine in-process on an export and give tests the frames to check."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from dlprof_profiler.engine import correlate as C
from dlprof_profiler.engine import iterate
from dlprof_profiler.engine.aggregate import Aggregation
from dlprof_profiler.engine.analysis import AnalysisConfig
from dlprof_profiler.engine.analysis import analyze as engine_analyze
from dlprof_profiler.ingest.formats import read_trace
from dlprof_profiler.ingest.sanitize import sanitize_trace
from dlprof_profiler.engine.trace import Trace


@dataclass
class Analysis:
    trace: Trace
    corr: C.Correlation
    iterations: iterate.Iterations
    aggs: dict

    def domain(self, name: str = "default") -> C.DomainModel:
        return self.corr.domains[name]

    def agg(self, name: str = "default") -> Aggregation:
        return self.aggs[name]

    def ops(self, name: str = "default") -> pd.DataFrame:
        """The aggregation's op table, one row per op, keyed by (name, direction)."""
        return self.aggs[name].ops

    def op(self, op_name: str, direction: str | None = None, domain: str = "default") -> pd.Series:
        ops = self.ops(domain)
        hit = ops[(ops["name"] == op_name) & ((ops["direction"] == direction) if direction is not None else True)]
        assert len(hit) == 1, f"expected one op {op_name!r} {direction!r}, found {len(hit)}: {list(ops['name'])}"
        return hit.iloc[0]

    def op_names(self, domain: str = "default") -> set:
        return set(self.ops(domain)["name"])


def analyze(
    path: Path,
    key_node: str | None = None,
    mode: str | None = None,
    iter_start: int | None = None,
    iter_stop: int | None = None,
) -> Analysis:
    """ingest (any format) -> correlate -> iterate -> aggregate, through the engine's façade."""
    trace = sanitize_trace(read_trace(Path(path)))
    config = AnalysisConfig(mode=mode, key_node=key_node, iter_start=iter_start, iter_stop=iter_stop)
    result = engine_analyze(trace, config, str(path))
    return Analysis(trace=trace, corr=result.corr, iterations=result.iterations, aggs=result.aggregations)
