"""The engine's façade: `analyze(trace, config) -> Analysis` runs correlate -> iterate -> aggregate -> detect
in their order (with the key node retried against op names once ops exist); `reanalyze` does the same for
an op model read back from a DLProf database. Writing the outputs is `run/`'s job (`run/analyse.py`)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import partial

import numpy as np
import pandas as pd

from dlprof_profiler.engine import correlate as corr_mod
from dlprof_profiler import log
from dlprof_profiler.engine import iterate
from dlprof_profiler.engine.aggregate import Aggregation, aggregate, aggregate_model
from dlprof_profiler.engine.correlate import Correlation, DomainCorrelator, OpModel, feed_segments
from dlprof_profiler.errors import DLProfError
from dlprof_profiler.engine.trace import Trace
from dlprof_profiler import experts as expert_systems
from dlprof_profiler.experts.data import StoreData
from dlprof_profiler.store.model import LaunchSpill, StoreAnalysis, StoreCorrelation, StoreModel, StoreSink
from dlprof_profiler.process_memory import release_unused_memory


@dataclass(frozen=True)
class AnalysisConfig:
    """What the analysis is asked (the CLI's and the viewer's options)."""

    mode: str | None = None  # framework mode; None: detected from the markers
    key_node: str | None = None  # None: the framework default
    iter_start: int | None = None
    iter_stop: int | None = None
    domain: str | None = None  # primary domain of the reports; None: default / busiest; 'all'
    cuts: tuple | None = None  # time segments of the work (None: one); the results do not depend on them

    @classmethod
    def from_args(cls, args) -> "AnalysisConfig":
        return cls(
            mode=getattr(args, "mode", None),
            key_node=getattr(args, "key_node", None) or None,
            iter_start=getattr(args, "iter_start", None),
            iter_stop=getattr(args, "iter_stop", None),
            domain=getattr(args, "domain", None),
        )


@dataclass
class Analysis:
    """Everything the outputs are written from."""

    trace: Trace
    corr: OpModel  # correlate.Correlation in memory, store.model.StoreCorrelation out of core
    iterations: iterate.Iterations
    aggregations: dict[str, Aggregation]
    findings: dict[str, list]
    primary: str
    timings: dict = field(default_factory=dict)  # stage -> seconds

    @property
    def mode(self) -> str:
        return self.corr.mode

    @property
    def family(self) -> str | None:
        return self.corr.family


class _Stages:
    """Times the stages (for the benchmark) and shows them as progress."""

    def __init__(self):
        self.timings: dict = {}

    def run(self, name: str, fn, quiet: bool = False):
        started = time.perf_counter()
        if quiet:
            result = fn()
        else:
            with log.stage(name):
                result = fn()
        self.timings[name] = self.timings.get(name, 0.0) + time.perf_counter() - started
        return result


def analyze(
    trace: Trace,
    config: AnalysisConfig = AnalysisConfig(),
    source_name: str | None = None,
    on_correlated=None,
    handed_over: bool = False,
    on_owned=None,
) -> Analysis:
    """Correlate, iterate, aggregate and detect on a trace (raises DLProfError with a one-line reason).
    `on_correlated(corr)` is called as soon as the op model exists, before aggregation (run/analyse.py queues
    the model for the database writer there, so its thread writes while the analysis goes on), and
    `on_owned(gpu_api, {domain: gpu_instance})` earlier, once the GPU activities' owners are known. A trace
    `handed_over` is the analysis's own: what only classification and correlation read is dropped from it
    once they are done (`release_correlated`)."""
    source_name = source_name or str(trace.source)
    stages = _Stages()
    classified = stages.run("Classifying NVTX ranges", lambda: corr_mod.classify_trace(trace, config.mode), quiet=True)
    info, mode, family, _ = classified
    links = stages.run("Linking GPU activities to their launches", lambda: corr_mod.launch_links(trace), quiet=True)
    _gpu_api, thread_dev, process_dev = links
    inputs = iterate.whole_trace_inputs(trace, info, family, thread_dev, process_dev)
    iterations = iterate.split_iterations(config.key_node, inputs)
    naming = iterate.naming_iterations(iterations, inputs)
    corr = stages.run(
        "Correlating NVTX ranges, CUDA API calls and GPU activities",
        partial(corr_mod.correlate, trace, mode, naming.boundaries, classified, links, config.cuts, on_owned),
    )
    log.info(
        f"  mode {corr.mode}; {sum(len(d.ops) for d in corr.domains.values()):,} ops, "
        f"{sum(len(d.instances) for d in corr.domains.values()):,} op instances in {len(corr.domains)} "
        "NVTX domain(s)"
    )
    del classified, info, inputs, naming  # (they hold the whole classification)
    if handed_over:
        release_correlated(trace, corr)
    return _after_correlation(trace, corr, iterations, config, source_name, stages, on_correlated)


# what the stages after correlation read of the classification: data loading (model_chunks), labels (experts)
RANGE_INFO_AFTER_CORRELATION = ["label", "dataloader"]
# and what a re-analysis of a stored op model reads, which splits its iterations after loading it
RANGE_INFO_FOR_REANALYSIS = list(dict.fromkeys(RANGE_INFO_AFTER_CORRELATION + iterate.RANGE_INFO_READ))


def release_correlated(trace: Trace, corr: Correlation) -> None:
    """Drop what only classification and correlation read: the ranges' details (input types, shapes, stacks,
    now the op instances'), and the classification's columns but RANGE_INFO_AFTER_CORRELATION (at 10^7
    Kineto events, 0.3 GB the aggregation then has to spare)."""
    trace.ranges = trace.ranges.drop(columns=[c for c in corr_mod.RANGE_DETAIL_COLUMNS if c in trace.ranges])
    corr.range_info = corr.range_info[[c for c in RANGE_INFO_AFTER_CORRELATION if c in corr.range_info]]
    release_unused_memory()


def reanalyze(
    trace: Trace,
    corr: Correlation,
    profile: dict,
    config: AnalysisConfig,
    source_name: str,
    primary: str | None = None,
    iterations: iterate.Iterations | None = None,
) -> Analysis:
    """A new aggregation of an op model read back from a DLProf database (names stay as first given)."""
    stages = _Stages()
    if iterations is None:
        iterations = reaggregation_iterations(trace, corr, config.key_node, profile)
    if primary is None:
        primary = (
            choose_domain(corr, config.domain, source_name)
            if config.domain
            else profile.get("primary_domain", "default")
        )
    return _aggregate_and_detect(trace, corr, iterations, primary, config, source_name, stages)


def _after_correlation(trace, corr, iterations, config, source_name, stages, on_correlated, **engine) -> Analysis:
    """The stages after correlation, for either engine: the op model handed on (`on_correlated(corr)`), a key
    node given as an op name or Op ID looked for among the ops, the primary domain, then aggregation and the
    expert systems (`engine`: _aggregate_and_detect's reading of the model out of core)."""
    if on_correlated is not None:
        on_correlated(corr)
    if config.key_node and not iterations.found:
        iterations = key_node_from_ops(corr, config.key_node, iterations)
    primary = choose_domain(corr, config.domain, source_name)
    return _aggregate_and_detect(trace, corr, iterations, primary, config, source_name, stages, **engine)


def _aggregate_and_detect(
    trace, corr, iterations, primary, config, source_name, stages, aggregate_domain=None, data_of=None, detect=True
) -> Analysis:
    """The stages after correlation, for either engine: the partial steps, the iteration range, one
    aggregation per domain (`aggregate_domain(dm, iterations, iter_start, iter_stop)`; default: in memory),
    the expert systems (reading through `data_of(dm, agg, iterations)`; default: in memory)."""
    if aggregate_domain is None:

        def aggregate_domain(dm, iterations, iter_start, iter_stop):
            return aggregate(trace, corr, dm, iterations, iter_start, iter_stop, cuts=config.cuts)

    iterations = iterate.with_partial_steps(iterations, trace.meta)
    iter_start, iter_stop = _chosen_iterations(iterations, config, source_name)
    aggregations = stages.run(
        "Aggregating",
        lambda: {name: aggregate_domain(dm, iterations, iter_start, iter_stop) for name, dm in corr.domains.items()},
    )

    def findings_of(name, agg):
        dm = corr.domains[name]
        data = None if data_of is None else data_of(dm, agg, iterations)
        return expert_systems.detect(trace, corr, dm, agg, iterations, data=data)

    findings = stages.run(
        "Running expert systems",
        lambda: {name: findings_of(name, agg) if detect else [] for name, agg in aggregations.items()},
    )
    return Analysis(
        trace=trace,
        corr=corr,
        iterations=iterations,
        aggregations=aggregations,
        findings=findings,
        primary=primary,
        timings=stages.timings,
    )


def _chosen_iterations(iterations: iterate.Iterations, config: AnalysisConfig, source_name: str) -> tuple[int, int]:
    """The iteration range to aggregate (checked), said to the user with how the profile was split."""
    iter_start, iter_stop = iterate.select_range(iterations, config.iter_start, config.iter_stop, source_name)
    if not iterations.found:
        if iterations.key_node:
            log.warning(
                f"{source_name}: key node '{iterations.key_node}' not found: the whole profile is one "
                "iteration (give --key_op=NAME with an op name, Op ID or NVTX range text)"
            )
        else:
            log.warning(
                f"{source_name}: no key node found: the whole profile is one iteration "
                "(give --key_op=NAME to split it into iterations)"
            )
    else:
        log.info(
            f"  key node '{iterations.key_node}' ({iterations.source}): {iterations.count} iterations; "
            f"aggregating {iter_start}..{iter_stop}"
        )
    return iter_start, iter_stop


def choose_domain(corr: OpModel, requested: str | None, source_name: str) -> str:
    """The primary domain: the requested one, else the default domain, else the one with the most ranges."""
    names = list(corr.domains)
    if requested and requested != "all":
        if requested not in names:
            raise DLProfError(
                f"{source_name}: NVTX domain '{requested}' not found (domains: {', '.join(names)})", exit_code=2
            )
        return requested
    if not names:
        return "default"
    counts = corr.range_counts
    if counts.get("default", 0) > 0 or all(counts.get(n, 0) == 0 for n in names):
        return "default" if "default" in names else names[0]
    return max(names, key=lambda n: counts.get(n, 0))


def key_node_from_ops(corr: OpModel, key: str, iterations: iterate.Iterations) -> iterate.Iterations:
    """A key node given as an op name or Op ID (they exist only once ops are built), in either engine."""
    frames = []
    for dm in corr.domains.values():
        hit = dm.ops.loc[iterate.key_ops(dm.ops, key), "op_index"].to_numpy(np.int64)
        if hit.size:
            frames.append(dm.instances_of_ops(hit, ["start", "end", "pid", "global_tid"]))
    found = iterate.outermost(pd.concat(frames, ignore_index=True)) if frames else []
    if len(found) == 0:
        return iterations
    return iterate.iterations_of(
        key, "user", found, corr.thread_device, corr.process_device, iterations.profile_end, iterations.profile_start
    )


def reaggregation_iterations(trace: Trace, corr: Correlation, key_node: str | None, profile: dict):
    """Iterations for a new aggregation of a loaded model: the given key node, else the original one."""
    key = key_node or None
    start = profile.get("profile_start")
    inputs = iterate.trace_inputs(
        trace.ranges,
        corr.range_info,
        corr.family,
        corr.thread_device,
        corr.process_device,
        int(profile.get("profile_end") or trace.profile_end),
        int(start) if start not in (None, "") else trace.profile_start,
        preferred=profile.get("key_node_default") or None,
        api_starts=trace.api_calls["start"].to_numpy(np.int64),
    )
    iterations = iterate.split_iterations(key, inputs)
    if key and not iterations.found:
        iterations = key_node_from_ops(corr, key, iterations)
    return iterations


# ---------------------------------------------------------------------------- out of core

# about 10^6 events a segment: with glibc's heap kept through the analysis (run/analyse.py), at 10^7 kernels as
# fast as 2·10^6 and 0.2-0.4 GB lower at the peak
EVENTS_PER_SEGMENT = 1_000_000


def analyze_store(
    store,
    config: AnalysisConfig = AnalysisConfig(),
    source_name: str | None = None,
    events_per_segment: int = EVENTS_PER_SEGMENT,
    detect: bool = True,
    on_segment=None,
    on_correlated=None,
) -> Analysis:
    """The same analysis over a TraceStore, segment by segment: memory is bounded by a segment, not the
    profile (see store/model.py). `on_segment(k, {domain: StoreSink})` is called once time segment k is
    correlated (the database writer can take its GPU activity owners then), `on_correlated(corr)` once the op
    model is complete, before aggregation."""
    source_name = source_name or str(store.export)
    stages = _Stages()
    sa = StoreAnalysis(store)
    # the domains do not depend on the classification (only --mode simple or no ranges give one "default")
    domains = sa.domain_order(config.mode)
    mode, family, run_config = stages.run("Classifying NVTX ranges", lambda: sa.classify(config.mode))
    release_unused_memory()
    trace = store.trace
    thread_dev, process_dev = stages.run("Linking GPU activities to their launches", sa.link_launches)
    labels = sa.range_labels()
    inputs = sa.iteration_inputs(labels, family, thread_dev, process_dev, trace.meta.get("key_node_default"))
    iterations = iterate.split_iterations(config.key_node, inputs)
    naming = iterate.naming_iterations(iterations, inputs)
    cuts = config.cuts if config.cuts is not None else tuple(sa.plan_cuts(naming.boundaries, events_per_segment))
    correlators = {
        d: DomainCorrelator(
            d,
            family,
            sa.domain_facts(d, mode),
            naming.boundaries,
            thread_dev,
            process_dev,
            0,
            0,
            sink=StoreSink(sa, i, naming.boundaries, cuts),
        )
        for i, d in enumerate(domains)
    }

    def correlate_all():
        progress = log.Progress("time segments correlated", len(cuts) + 1)

        def after_segment(n):
            if on_segment is not None:
                on_segment(n - 1, {d: c.sink for d, c in correlators.items()})
            release_unused_memory()  # a segment's frees, before the next one's allocations
            progress.update(n)

        feed_segments(correlators, sa.segments(list(cuts)), mode, after_segment)
        return {d: c.sink.finish(c) for d, c in correlators.items()}

    models = stages.run(f"Correlating in {len(cuts) + 1} time segment(s)", correlate_all)
    corr = StoreCorrelation(
        mode=mode,
        family=family,
        thread_device=thread_dev,
        process_device=process_dev,
        domains=models,
        config=corr_mod.run_config(run_config, trace.meta),
        range_labels=labels,
        store=sa,
    )
    device_ids = trace.devices["device_id"].to_numpy(np.int64).tolist() if len(trace.devices) else []
    device_pids = sa.device_pids()

    def aggregate_domain(dm, iterations, iter_start, iter_stop):
        spill = LaunchSpill(dm.sink)  # the iteration report's rows, read back when it is written
        agg = aggregate_model(
            StoreModel(sa, dm, mode, device_ids, device_pids, trace.io_calls),
            iterations,
            iter_start,
            iter_stop,
            cuts,
            keep_launches=spill,
        )
        agg.launch_spill = spill
        return agg

    return _after_correlation(
        trace,
        corr,
        iterations,
        config,
        source_name,
        stages,
        on_correlated,
        aggregate_domain=aggregate_domain,
        data_of=partial(StoreData, sa),
        detect=detect,
    )
