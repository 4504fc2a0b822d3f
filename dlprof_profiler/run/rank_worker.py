"""One rank of a multi-rank analysis, run in a worker process (local or on a Dask worker): the rank's profile is
analysed as a single profile is, its database (schema 3.0, `rank` = its rank, keys scoped by it) and its reports
(`<base>_<report>_rank<N>.<fmt>`) are written into the run's staging folder, and only small frames go back to
the parent: iteration times, GPU and communication figures, op and kernel totals for the straggler diagnosis.
A worker holds one rank's data at a time, whatever the number of ranks."""

from __future__ import annotations

import resource
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from dlprof_profiler import log
from dlprof_profiler.db import writer as database
from dlprof_profiler.engine.aggregate import COMMUNICATION_KERNEL
from dlprof_profiler.errors import DLProfError
from dlprof_profiler.ingest import nsys_report
from dlprof_profiler.options import RunOptions
from dlprof_profiler.outputs import graph_events
from dlprof_profiler.outputs.publish import Staging
from dlprof_profiler.run import analyse
from dlprof_profiler.run import outputs as run_outputs
from dlprof_profiler.run.reanalysis import reaggregated

# A rank's NVTX domains are numbered from (its position in the run) * DOMAINS_PER_RANK, so the domain-scoped keys
# of every rank's database are distinct and the parent merges them without renumbering (contract.ID_BITS).
DOMAINS_PER_RANK = 1024
RANK_DB_FOLDER = ".ranks"


@dataclass
class RankTask:
    """What a worker needs (picklable: it travels to another process or machine)."""

    rank: int
    index: int  # position among the run's ranks
    source: str
    options: RunOptions
    output_dir: str
    staging_root: str
    verbosity: int = log.INFO
    reaggregate: bool = False  # the rank of a DLProf database gets a new aggregation (no raw data rewritten)

    @property
    def database(self) -> Path:
        return Path(self.staging_root) / RANK_DB_FOLDER / f"rank_{self.rank}.sqlite"

    @property
    def suffix(self) -> str:
        return f"_rank{self.rank}"


@dataclass
class RankResult:
    """What goes back to the parent."""

    rank: int
    source: str
    database: str
    finals: list  # report files written into the staging folder (their final paths)
    profile: dict  # the rank's profile_info
    primary: str
    mode: str
    summary: dict  # figures of the primary domain's aggregation
    iterations: pd.DataFrame  # iteration, start, end, duration, aggregated
    ops: pd.DataFrame  # name, direction, calls, cpu_total, gpu_total (primary domain)
    kernels: pd.DataFrame  # name, count, gpu_total, communication
    findings: list  # the rank's own expert-system findings (primary domain)
    aggregation: object = None  # re-aggregation: the engine's frames the parent writes (rank, aggregations ...)
    graph: tuple | None = None  # serialized op graph of the primary domain (the TensorBoard run shows rank 0's)
    epoch_ns: int | None = None  # absolute time (Unix epoch ns) of the rank's time 0, when recorded
    host: str | None = None
    seconds: float = 0.0
    peak_rss_mb: float = 0.0
    timings: dict = field(default_factory=dict)


def analyze_rank(task: RankTask) -> RankResult:
    """Analyse one rank's profile into its own database and reports (see the module docstring)."""
    log.set_verbosity(task.verbosity)
    started = time.perf_counter()
    nsys_report.remember(task.options.nsys_reports)  # exports of reports: named after them
    if task.reaggregate:
        return _reaggregate_rank(task, started)
    options, source, rank = task.options, Path(task.source), task.rank
    staging = Staging.attach(Path(task.output_dir), Path(task.staging_root))
    sink = RankDatabase(task)
    with analyse.analysed(source, options, sink) as run:
        trace, result, profile = run.trace, run.result, run.profile
        run.database.start()  # the database is written while the reports are
        _write_rank_reports(task, trace, result, staging)
        domain_ids, offsets = run.database.finish()
        database.append_aggregation(
            task.database,
            result.aggregations,
            domain_ids,
            offsets,
            result.iterations,
            result.findings,
            time.perf_counter() - started,
            rank=rank,
        )
        graph = _rank_graph(task, result)
        return _result(task, result, profile, [str(m[1]) for m in staging.moves], graph, trace, started)


class RankDatabase(analyse.Sink):
    """A rank's own database in the run's staging folder (its NVTX domains numbered from the rank's position x
    DOMAINS_PER_RANK); the worker reads quietly, its warnings naming the rank. Out of core, the store is staged
    beside the rank databases, and the activity owners are written once the op model is complete."""

    writes_database = True
    owners_by_segment = False

    def __init__(self, task: RankTask):
        self.task, self.writer = task, None

    def reading(self, source: Path, out_of_core: bool):
        return nullcontext()

    def warn(self, text: str) -> None:
        log.warning(f"rank {self.task.rank}: {text}")

    def open(self, trace, domain_names: list, events: int | None = None):
        self.task.database.parent.mkdir(exist_ok=True)  # in the run's staging folder, which must exist
        self.writer = _rank_writer(self.task, trace, domain_names)
        return self.writer

    def discard(self) -> None:
        if self.writer is not None:
            self.writer.wait()

    def store_folder(self) -> Path:
        self.task.database.parent.mkdir(exist_ok=True)
        return self.task.database.parent / f"store_rank_{self.task.rank}"

    def output_folder(self) -> Path:
        return Path(self.task.output_dir)


def _rank_writer(task: RankTask, trace, names: list):
    """The rank's database writer, its NVTX domains numbered from the rank's position x DOMAINS_PER_RANK."""
    if len(names) >= DOMAINS_PER_RANK:
        raise DLProfError(
            f"{task.source}: {len(names)} NVTX domains; a rank of a multi-rank analysis may have at most "
            f"{DOMAINS_PER_RANK - 1}"
        )
    base = task.index * DOMAINS_PER_RANK
    header = database.Header.from_trace(trace, {name: base + i for i, name in enumerate(names)}, rank=task.rank)
    # the first rank's file becomes the run's database (its indexes kept up to date while appending); the others
    # are copied into it, which maintains them there; the random-key index is built once after the merge
    return database.DatabaseWriter(task.database, header, raw_indexes=task.index == 0, final_indexes=False)


def _write_rank_reports(task: RankTask, trace, result, staging) -> None:
    """The rank's reports (and model dump), with the rank's suffix in their names."""
    options, out = task.options, Path(task.output_dir)
    run_outputs.write_reports(
        options,
        out,
        trace,
        result.corr,
        result.aggregations,
        result.findings,
        result.primary,
        staging,
        rank_suffix=task.suffix,
    )
    if options.dump_model_data:
        run_outputs.dump_model(staging.path(out / f"{options.base_name}_model_data{task.suffix}.json"), result.corr)


def _rank_graph(task: RankTask, result):
    """The GRAPHS op graph: the lowest rank's only."""
    if task.index != 0:
        return None
    return graph_events.op_graph(result.corr.domains[result.primary], result.aggregations[result.primary])


def _reaggregate_rank(task: RankTask, started: float) -> RankResult:
    """A new aggregation of one rank of a multi-rank DLProf database: the engine's tables go back to the parent,
    which appends every rank's in one transaction; the rank's reports are written here."""
    options, source, rank = task.options, Path(task.source), task.rank
    again = reaggregated(source, options, rank)
    result, profile = again.result, again.profile
    trace, corr = result.trace, result.corr
    finals = []
    if task.output_dir:
        staging = Staging.attach(Path(task.output_dir), Path(task.staging_root))
        run_outputs.write_reports(
            options,
            Path(task.output_dir),
            trace,
            corr,
            result.aggregations,
            result.findings,
            result.primary,
            staging,
            rank_suffix=task.suffix,
        )
        finals = [str(m[1]) for m in staging.moves]
    for agg in result.aggregations.values():  # per-launch rows are for the reports only
        agg.kernel_launches, agg.launch_chunks = None, []
    out = _result(task, result, profile, finals, None, trace, started)
    out.aggregation = {
        "aggregations": result.aggregations,
        "domain_ids": again.domain_ids,
        "offsets": again.offsets,
        "iterations": result.iterations,
        "findings": result.findings,
    }
    return out


def _result(task: RankTask, result, profile: dict, finals: list, graph, trace, started: float) -> RankResult:
    agg = result.aggregations[result.primary]
    s = agg.summary
    it = agg.iterations[
        ["iteration", "start", "end", "duration", "aggregated", "complete", "gpu_utilization", "tc_kernel_time_per_gpu"]
    ].copy()
    ops = (
        agg.ops[["name", "direction", "calls", "cpu_total", "gpu_total"]].copy()
        if len(agg.ops)
        else pd.DataFrame(
            {
                c: pd.Series(dtype=t)
                for c, t in (
                    ("name", object),
                    ("direction", object),
                    ("calls", "int64"),
                    ("cpu_total", "int64"),
                    ("gpu_total", "int64"),
                )
            }
        )
    )
    kernels = _kernel_totals(agg.kernels, COMMUNICATION_KERNEL)
    devices = agg.devices
    used = devices[devices["used"].to_numpy(dtype=bool)] if len(devices) and "used" in devices else devices
    summary = {
        "gpus": int(s["n_visible_gpus"]),
        "gpu_utilization": float(s["gpu_utilization"]),
        "total_iterations": int(s["total_iterations"]),
        "aggregated_iterations": int(s["aggregated_iterations"]),
        "iter_start": int(s["iter_start"]),
        "iter_stop": int(s["iter_stop"]),
        "wall_time": int(s["wall_time"]),
        "communication_time": int(used["communication_time"].sum()) if len(used) else 0,
        "overlapped_communication_time": int(used["overlapped_communication_time"].sum()) if len(used) else 0,
        "key_node": s["key_node"],
        "key_found": bool(s["key_found"]),
    }
    meta, system = trace.meta, trace.system
    epoch = meta.get("session_start_ns") if meta.get("source_format") == "kineto" else meta.get("session_utc_epoch_ns")
    host = system.get("Hostname") or system.get("HostName")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1024.0 if sys.platform != "darwin" else 1024.0**2)
    return RankResult(
        rank=task.rank,
        source=str(nsys_report.shown(task.source)),
        database=str(task.database),
        finals=finals,
        profile=dict(profile),
        primary=result.primary,
        mode=result.corr.mode,
        summary=summary,
        iterations=it,
        ops=ops,
        kernels=kernels,
        findings=list(result.findings.get(result.primary, [])),
        graph=graph,
        epoch_ns=_int_or_none(epoch),
        host=str(host) if host else None,
        seconds=time.perf_counter() - started,
        peak_rss_mb=peak,
        timings=dict(result.timings),
    )


def _kernel_totals(kernels: pd.DataFrame, communication) -> pd.DataFrame:
    """Per kernel name: launches and accumulated GPU time, and whether it is a collective."""
    if kernels is None or len(kernels) == 0:
        return pd.DataFrame(
            {
                "name": pd.Series(dtype=object),
                "count": pd.Series(dtype="int64"),
                "gpu_total": pd.Series(dtype="int64"),
                "communication": pd.Series(dtype=bool),
            }
        )
    k = kernels.assign(name=kernels["name"].astype(object).astype(str))
    out = k.groupby("name", sort=False).agg(count=("count", "sum"), gpu_total=("gpu_total", "sum")).reset_index()
    out["communication"] = np.array([bool(communication.search(n)) for n in out["name"]], dtype=bool)
    return out


def _int_or_none(value) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None
