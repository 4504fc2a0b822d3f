"""The analysis run: ingest -> correlate -> iterate -> aggregate -> detect -> write, for an nsys SQLite
export, a Kineto trace or a DLProf database (`dlprof --database`), and for what a capture returned (the CLI hands
it over); several profiles go to `ranks`. The analysis itself is `analyse.analysed` (as for a rank and the baseline);
this module writes its database into the run's folder (`RunDatabase`), its reports, diffs and event file. Everything
it is asked comes in one `RunOptions`."""

from __future__ import annotations

import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from dlprof_profiler import __version__, log
from dlprof_profiler.db import writer as database
from dlprof_profiler.engine import compare
from dlprof_profiler.engine.analysis import (
    Analysis,
)
from dlprof_profiler.errors import DLProfError
from dlprof_profiler.ingest import formats as ingest
from dlprof_profiler.ingest import nsys_report
from dlprof_profiler.ingest.sqlite_source import check_sqlite_file
from dlprof_profiler.options import RunOptions
from dlprof_profiler.outputs import event_files
from dlprof_profiler.outputs import graph_events
from dlprof_profiler.outputs import reports
from dlprof_profiler.outputs.publish import Staging, prepare_output_dir, refuse_existing
from dlprof_profiler.run import analyse
from dlprof_profiler.run import inputs as rank_inputs
from dlprof_profiler.run import outputs
from dlprof_profiler.run import ranks
from dlprof_profiler.run.reanalysis import reaggregated


def prepare_baseline(options: RunOptions) -> Analysis | None:
    """The --baseline profile, analysed before the run's long work, so a baseline that cannot be read (any
    format, damaged anywhere) fails the run at once with one line naming it; None without a baseline."""
    path = options.baseline_path
    if path is None:
        return None
    ingest.check_regular_file(path)
    if ingest.trace_format(path) == ingest.SQLITE:
        check_sqlite_file(path)
        if not database.is_dlprof_database(path):
            refuse_dlprof18_database(path)
    return analyze_baseline(options)


def analyze_baseline(options: RunOptions) -> Analysis:
    """The --baseline profile analysed with the run's options (mode, key node, iteration range, domain): an
    nsys export or Kineto trace from scratch, a DLProf database re-aggregated."""
    path = options.baseline_path
    log.info(f"Analysing the baseline {path}")
    if ingest.trace_format(path) == ingest.SQLITE and database.is_dlprof_database(path):
        return reaggregated(path, options).result
    with analyse.analysed(path, options, analyse.Sink()) as run:
        return run.result


def analyze_database(options: RunOptions) -> int:
    """`dlprof --database=FILE`: analyse an nsys export or Kineto trace, or re-aggregate a DLProf database;
    several profiles (a comma list, a directory, a glob) are the ranks of a multi-rank analysis (ranks.py).
    Nsight Systems reports (.nsys-rep, .qdrep; the baseline too) are exported to SQLite into a staging folder
    of the output folder first, and analysed as the export (nsys_report.py)."""
    with nsys_report.exporting(Path(options.output_path)):
        try:
            return _analyze_database(options)
        except DLProfError as exc:  # a message about an export names its report
            raise DLProfError(nsys_report.shown_text(str(exc)), exc.exit_code) from None


def _analyze_database(options: RunOptions) -> int:
    inputs = rank_inputs.resolve(options.database)  # (reports among several profiles are exported there)
    if options.baseline_path is not None:
        # a report fails here, before the long work, if it cannot be exported
        nsys_report.sqlite_of(options.baseline_path)
    if len(inputs) > 1:
        # the workers name the exports after their reports
        return ranks.analyze_ranks(inputs, options.but(nsys_reports=nsys_report.origins()))
    source = nsys_report.sqlite_of(Path(inputs[0].path))
    if ingest.trace_format(source) == ingest.SQLITE:
        check_sqlite_file(source)
        if database.is_dlprof_database(source):
            numbers = ranks.database_ranks(source)
            if len(numbers) > 1:
                return ranks.reaggregate_database(source, options, numbers)
            return reaggregate_database(source, options)
        refuse_dlprof18_database(source)
    return run_analysis(source, options)


DLPROF18_TABLES = {"dictionary", "metric", "read_only_kernels", "read_only_ops", "node_time_metrics"}


def refuse_dlprof18_database(path: Path) -> None:
    """NVIDIA DLProf 1.8's own database keeps ops, not the NVTX ranges and API calls this engine's op model is
    rebuilt from: say so, and which file to give instead."""
    try:
        con = sqlite3.connect(f"{Path(path).resolve().as_uri()}?mode=ro&immutable=1", uri=True)
        try:
            tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        finally:
            con.close()
    except sqlite3.Error:
        return
    if DLPROF18_TABLES <= tables:
        raise DLProfError(
            f"{path}: a database written by NVIDIA DLProf 1.x: dlprof reads Nsight Systems exports "
            "and databases it wrote itself; give it the nsys export DLProf profiled (the "
            "nsys_profile.sqlite next to this file) to analyse the same run"
        )


# ---------------------------------------------------------------------------- analysis of an nsys export


def run_analysis(source: Path, options: RunOptions, capture: dict | None = None) -> int:
    """Analyse an nsys SQLite export or Kineto trace and write every output; returns the exit status (0)."""
    started = time.perf_counter()
    out_dir = prepare_output_dir(Path(options.output_path))
    refuse_existing(outputs.planned_outputs(options), options.force)
    baseline = prepare_baseline(options)
    staging = Staging(out_dir)
    sink = RunDatabase(options, staging)
    with analyse.analysed(source, options, sink, capture) as run:
        return _write_outputs(
            options, out_dir, source, run.result, run.profile, staging, run.database, sink.writer, started, baseline
        )


class RunDatabase(analyse.Sink):
    """A single run's database: written into the run's staging folder, its indexes built once at the end; the
    run says what it reads."""

    writes_database = True
    announce = True

    def __init__(self, options: RunOptions, staging: Staging):
        self.options, self.staging, self.writer = options, staging, None

    def reading(self, source: Path, out_of_core: bool):
        if out_of_core:
            return log.stage(f"Reading {source} out of core (staged on disk in {self.staging.output_dir})")
        return log.stage(f"Reading {source}")

    def open(self, trace, domain_names: list, events: int | None = None):
        header = database.Header.from_trace(trace, database.domain_ids_for(domain_names))
        # every row comes at once: the indexes are cheaper built once, sorted, after them
        self.writer = database.DatabaseWriter(
            self.staging.path(self.options.database_path),
            header,
            deferred_indexes=True,
            page_size=database.page_size_for(events),
        )
        return self.writer

    def discard(self) -> None:
        self.staging.discard_after(self.writer)

    def store_folder(self) -> Path:
        return self.staging.root / "out_of_core"

    def output_folder(self) -> Path:
        return self.staging.output_dir


class _CopiedDatabase:
    """An existing DLProf database copied, to receive the new aggregation."""

    def __init__(self, source: Path, target: Path, profile: dict):
        self.source, self.target, self.profile = source, target, profile

    def start(self) -> None:
        outputs.copy_database(self.source, self.target)

    def finish(self) -> tuple[dict, dict]:
        return self.profile["_domain_ids"], self.profile["_offsets"]


def _write_outputs(
    options,
    out_dir: Path,
    source: Path,
    result: Analysis,
    profile: dict,
    staging: Staging,
    new_database,
    writer=None,
    started: float | None = None,
    baseline: Analysis | None = None,
) -> int:
    """Write the reports while the database is written (`new_database.start()`, then `.finish()` -> (domain
    ids, op index maps)), then its new aggregation and the event file, and put them all in place together."""
    trace, corr, aggregations, findings = result.trace, result.corr, result.aggregations, result.findings
    primary = result.primary
    try:
        with log.stage("Writing the DLProf database, reports and event files"):
            db_final = options.database_path
            db_staged = staging.path(db_final)
            new_database.start()
            # a new database takes the aggregation on its writer's thread, while the reports are written
            queue_aggregation = getattr(new_database, "add_aggregation", None)
            aggr_id = queue_aggregation(time.perf_counter() - started) if queue_aggregation else None
            written_reports = outputs.write_reports(
                options, out_dir, trace, corr, aggregations, findings, primary, staging
            )
            baselines = {}  # per domain, the baseline's side of the diff: kept in the run's database
            written_reports += _write_diffs(options, out_dir, source, result, staging, baseline, baselines)
            if options.dump_model_data:
                outputs.dump_model(staging.path(out_dir / f"{options.base_name}_model_data.json"), corr)
            domain_ids, offsets = new_database.finish()
            if aggr_id is not None:
                graph = graph_events.op_graph(corr.domains[primary], aggregations[primary])
            else:
                # appended to the finished file (one row per op: 10^6 in a profile without iterations) while the
                # op graph is built (SQLite and Arrow release the GIL for most of their work)
                with ThreadPoolExecutor(1, thread_name_prefix="dlprof-aggregation") as pool:
                    appended = pool.submit(
                        database.append_aggregation,
                        db_staged,
                        aggregations,
                        domain_ids,
                        offsets,
                        result.iterations,
                        findings,
                        time.perf_counter() - started,
                    )
                    graph = graph_events.op_graph(corr.domains[primary], aggregations[primary])
                    aggr_id = appended.result()
            database.write_baselines(db_staged, aggr_id, domain_ids, baselines)
            run_dir = event_files.run_directory(out_dir, options.profile_name)
            event_meta = {
                "database": outputs.relative_path(db_final, run_dir),
                "profile_name": options.profile_name,
                "aggr_id": aggr_id,
                "mode": corr.mode,
                "primary_domain": primary,
                "nsys_version": trace.meta.get("nsys_version"),
                "dlprof_version": __version__,
                "source_file": str(nsys_report.shown(source)),
            }
            event_files.write_event_file(
                staging.path(run_dir / event_files.event_file_name()),
                event_meta,
                aggregations[primary].iterations,
                graph=graph,
            )
        staging.commit(replacing=outputs.replaced_outputs(options))  # --force was given (checked first) if any exists
    except BaseException:
        staging.discard_after(writer)
        raise
    outputs.print_summary(aggregations[primary], db_final, written_reports)
    outputs.print_findings(findings.get(primary, []), db_final, options.profile_name, outputs.repeat_options(options))
    log.info(f"Done in {time.perf_counter() - started:.1f} s")
    return 0


def _write_diffs(
    options, out_dir: Path, source: Path, result: Analysis, staging: Staging, base: Analysis | None, sides: dict
) -> list[Path]:
    """The diff report against the analysed --baseline, per reported domain (the primary one, or each with
    --domain=all that the baseline has too); `sides` gets the baseline's side of each comparison."""
    if base is None:
        return []
    domains = list(result.aggregations) if options.domain == "all" else [result.primary]
    written = []
    for name in domains:
        if name not in base.aggregations:
            message = (
                f"{options.baseline_path}: the baseline has no NVTX domain '{name}' to compare with (its "
                f"domains: {', '.join(base.aggregations) or 'none'})"
            )
            if options.domain == "all":
                log.warning(message + "; no diff for that domain")
                continue
            raise DLProfError(message)
        comparison = compare.compare(
            compare.side_from_aggregation(result.aggregations[name], str(nsys_report.shown(source))),
            compare.side_from_aggregation(base.aggregations[name], str(options.baseline_path)),
        )
        sides[name] = comparison.baseline
        suffix = "" if name == result.primary else "_" + outputs.slug(name)
        written += reports.write_report(
            reports.diff_report(comparison), out_dir, options.base_name, options.formats, suffix, staging.path
        )
        _print_diff(comparison, name)
    return written


def _print_diff(comparison, domain: str) -> None:
    s = comparison.summary.set_index("key")
    log.info(
        f"Compared with the baseline (domain {domain}): average iteration time "
        f"{s.at['avg_iteration_time', 'baseline']:,.0f} -> {s.at['avg_iteration_time', 'after']:,.0f} ns, "
        f"GPU utilization {s.at['gpu_utilization', 'baseline']:.1f} -> {s.at['gpu_utilization', 'after']:.1f} %, "
        f"total GPU time {s.at['total_gpu_time', 'delta']:+,} ns"
    )


# ---------------------------------------------------------------------------- re-aggregation of a database


def reaggregate_database(source: Path, options: RunOptions) -> int:
    """`dlprof --database=dlprof_dldb.sqlite`: a new aggregation (key node, iteration range) and new reports;
    the input database is copied, never modified, except when the output database is the input (the run's
    own folder, with --force): that run is updated, its database replaced by the copy with the new
    aggregation appended."""
    started = time.perf_counter()
    out_dir = prepare_output_dir(Path(options.output_path))
    in_place = outputs.updates_in_place(source, options)
    refuse_existing(outputs.planned_outputs(options), options.force)
    baseline = prepare_baseline(options)
    if in_place:
        # the run's own folder and names (the command the expert systems propose): update that run
        log.info(
            f"{source}: updating this run: its database gets a new aggregation (earlier ones are kept); "
            "its reports and event file are replaced"
        )
    again = reaggregated(source, options)
    result = again.result
    if options.mode and options.mode != result.corr.mode:
        log.warning(f"--mode {options.mode} ignored: the database was built in {result.corr.mode} mode")
    profile = dict(again.profile, _domain_ids=again.domain_ids, _offsets=again.offsets)
    staging = Staging(out_dir)
    new_database = _CopiedDatabase(source, staging.path(options.database_path), profile)
    return _write_outputs(options, out_dir, source, result, profile, staging, new_database, None, started, baseline)


def reaggregate_in_place(
    db_path: Path, key_node: str | None = None, iter_start: int | None = None, iter_stop: int | None = None
) -> int:
    """A new aggregation appended to a DLProf database in one transaction (the viewer's Reaggregate);
    returns its aggr_id. Earlier aggregations are kept; a failure leaves the file as it was."""
    started = time.perf_counter()
    db_path = Path(db_path)
    options = RunOptions.reaggregation(key_node, iter_start, iter_stop)
    check_sqlite_file(db_path)
    if not database.is_dlprof_database(db_path):
        raise DLProfError(f"{db_path}: not a DLProf database")
    numbers = ranks.database_ranks(db_path)
    if len(numbers) > 1:
        return ranks.reaggregate_in_place(db_path, options, numbers)
    again = reaggregated(db_path, options)
    result = again.result
    return database.append_aggregation(
        db_path,
        result.aggregations,
        again.domain_ids,
        again.offsets,
        result.iterations,
        result.findings,
        time.perf_counter() - started,
    )
