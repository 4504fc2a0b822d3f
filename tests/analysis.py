"""Run the engine's stages in-process on an export and give tests the frames to check."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from dlprof_profiler import correlate as C
from dlprof_profiler import iterate
from dlprof_profiler.aggregate import Aggregation, aggregate
from dlprof_profiler.ingest import read_trace
from dlprof_profiler.trace import Trace


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


def analyze(path: Path, key_node: str | None = None, mode: str | None = None, iter_start: int | None = None,
            iter_stop: int | None = None) -> Analysis:
    """ingest (any format) -> correlate -> iterate -> aggregate, as the pipeline runs them."""
    trace = read_trace(Path(path))
    classified = C.classify_trace(trace, mode)
    info, mode, family, _ = classified
    links = C.launch_links(trace)
    _gpu_api, thread_dev, process_dev = links
    preferred = trace.meta.get("key_node_default")
    iterations = iterate.split_iterations(trace.ranges, info, family, key_node, thread_dev, process_dev,
                                          trace.profile_end, preferred=preferred)
    naming = iterate.naming_iterations(iterations, trace.ranges, info, family, thread_dev, process_dev,
                                       trace.profile_end, preferred=preferred)
    corr = C.correlate(trace, mode, naming.boundaries, classified, links)
    if key_node and not iterations.found:
        from dlprof_profiler.pipeline import _key_node_from_ops
        iterations = _key_node_from_ops(trace, corr, key_node, iterations)
    start, stop = iterate.select_range(iterations, iter_start, iter_stop, str(path))
    aggs = {name: aggregate(trace, corr, dm, iterations, start, stop) for name, dm in corr.domains.items()}
    return Analysis(trace=trace, corr=corr, iterations=iterations, aggs=aggs)
