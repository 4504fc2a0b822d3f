"""The analysis run: ingest -> correlate -> iterate -> aggregate -> detect -> write, for an nsys SQLite
export or a DLProf database (`dlprof --database`), and for a fresh capture."""

from __future__ import annotations

import json
import sqlite3
import time
from argparse import Namespace
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


from dlprof_profiler import __version__, log
from dlprof_profiler.engine import compare
from dlprof_profiler.db import writer as database
from dlprof_profiler.outputs import event_files
from dlprof_profiler.outputs import graph_events
from dlprof_profiler.ingest import formats as ingest
from dlprof_profiler.ingest import nsys_report
from dlprof_profiler.outputs import publish as outputs
from dlprof_profiler.outputs import reports
from dlprof_profiler.engine import correlate as corr_mod
from dlprof_profiler.engine.analysis import (
    Analysis,
    AnalysisConfig,
    analyze,
    reaggregation_iterations,
    reanalyze,
)
from dlprof_profiler.errors import DLProfError, no_room_reason
from dlprof_profiler.store.process_memory import avoid_huge_pages, reuse_freed_memory
from dlprof_profiler.outputs.publish import Staging, prepare_output_dir, refuse_existing
from dlprof_profiler.ingest.sanitize import sanitize_trace
from dlprof_profiler.ingest.sqlite_source import check_sqlite_file


def database_path(args: Namespace) -> Path:
    return Path(args.output_path) / f"{args.base_name}_dldb.sqlite"


def report_names(args: Namespace, mode: str | None = None) -> list[str]:
    """The reports of the analysed profile (the diff, which needs the baseline too, is written apart)."""
    names = [r for r in args.reports if r != "diff"]
    if mode == "simple" or getattr(args, "mode", None) == "simple":
        names = [r for r in names if r in reports.SIMPLE_MODE_REPORTS]
    return names


def planned_outputs(args: Namespace) -> list[Path]:
    """Every file the analysis will write or replace for these arguments (existing ones need --force)."""
    out = Path(args.output_path)
    files = [database_path(args)]
    files += reports.report_paths(out, args.base_name, report_names(args), args.formats)
    if baseline_of(args):
        files += reports.report_paths(out, args.base_name, ["diff"], args.formats)
    if args.dump_model_data:
        files.append(out / f"{args.base_name}_model_data.json")
    return files + replaced_outputs(args)


# what a run's report set is made of besides the reports: the cross-rank report and the op model dump
REPORT_SET_STEMS = (*reports.REPORT_FILES.values(), "ranks", "model_data")


def replaced_outputs(args: Namespace) -> list[Path]:
    """The files of the previous run in the output folder (same base and profile name) that this run
    replaces: its report set and its event files. Those this run does not write again are removed when its
    outputs are put in place, so the folder holds exactly the reports of the last run."""
    out = Path(args.output_path)
    return outputs.report_set(out, args.base_name, REPORT_SET_STEMS) + event_files.existing_event_files(
        event_files.run_directory(out, args.profile_name)
    )


def baseline_of(args: Namespace) -> Path | None:
    """The --baseline file, if one was given."""
    value = getattr(args, "baseline", None)
    return Path(value) if value else None


def prepare_baseline(args: Namespace) -> Analysis | None:
    """The --baseline profile, analysed before the run's long work, so a baseline that cannot be read (any
    format, damaged anywhere) fails the run at once with one line naming it; None without a baseline."""
    path = baseline_of(args)
    if path is None:
        return None
    ingest.check_regular_file(path)
    if ingest.trace_format(path) == ingest.SQLITE:
        check_sqlite_file(path)
        if not database.is_dlprof_database(path):
            refuse_dlprof18_database(path)
    return analyze_baseline(args)


def analyze_baseline(args: Namespace) -> Analysis:
    """The --baseline profile analysed with the run's options (mode, key node, iteration range, domain): an
    nsys export or Kineto trace from scratch, a DLProf database re-aggregated."""
    path = baseline_of(args)
    config = AnalysisConfig.from_args(args)
    log.info(f"Analysing the baseline {path}")
    if ingest.trace_format(path) == ingest.SQLITE and database.is_dlprof_database(path):
        with log.stage(f"Reading DLProf database {path}"):
            trace, corr, profile, _, _ = database.load_model(path)
        return reanalyze(trace, corr, profile, config, str(path))
    with log.stage(f"Reading {path}"):
        trace = sanitize_trace(ingest.read_trace(path))
    for text in trace.warnings:
        log.warning(text)
    return analyze(trace, config, str(path))


def analyze_database(args: Namespace) -> int:
    """`dlprof --database=FILE`: analyse an nsys export or Kineto trace, or re-aggregate a DLProf database;
    several profiles (a comma list, a directory, a glob) are the ranks of a multi-rank analysis (ranks.py).
    Nsight Systems reports (.nsys-rep, .qdrep; the baseline too) are exported to SQLite into a staging folder
    of the output folder first, and analysed as the export (nsys_report.py)."""
    with nsys_report.exporting(Path(args.output_path)):
        try:
            return _analyze_database(args)
        except DLProfError as exc:  # a message about an export names its report
            raise DLProfError(nsys_report.shown_text(str(exc)), exc.exit_code) from None


def _analyze_database(args: Namespace) -> int:
    from dlprof_profiler.run import inputs as rank_inputs
    from dlprof_profiler.run import ranks

    inputs = rank_inputs.resolve(args.database)  # (reports among several profiles are exported there)
    if baseline_of(args) is not None:
        nsys_report.sqlite_of(baseline_of(args))  # a report fails here, before the long work, if it cannot be exported
    if len(inputs) > 1:
        args.nsys_reports = nsys_report.origins()  # the workers name the exports after their reports
        return ranks.analyze_ranks(inputs, args)
    source = nsys_report.sqlite_of(Path(inputs[0].path))
    if ingest.trace_format(source) == ingest.SQLITE:
        check_sqlite_file(source)
        if database.is_dlprof_database(source):
            numbers = ranks.database_ranks(source)
            if len(numbers) > 1:
                return ranks.reaggregate_database(source, args, numbers)
            return reaggregate_database(source, args)
        refuse_dlprof18_database(source)
    return run_analysis(source, args)


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


def run_analysis(source: Path, args: Namespace, capture: dict | None = None) -> int:
    """Analyse an nsys SQLite export or Kineto trace and write every output; returns the exit status (0)."""
    if out_of_core(source, args):
        return run_store_analysis(source, args, capture)
    avoid_huge_pages()  # its large short-lived arrays fault in faster as ordinary pages (process_memory.py)
    reuse_freed_memory()  # and fault in once, not again after every free (process_memory.py)
    started = time.perf_counter()
    out_dir = prepare_output_dir(Path(args.output_path))
    refuse_existing(planned_outputs(args), args.force)
    baseline = prepare_baseline(args)
    with log.stage(f"Reading {source}"):
        trace = sanitize_trace(ingest.read_trace(source))  # the one place rows of impossible times are dropped
    kineto = trace.meta.get("source_format") == "kineto"
    log.info(
        f"  {len(trace.ranges):,} {'op and annotation' if kineto else 'NVTX'} ranges, "
        f"{len(trace.api_calls):,} CUDA API calls, {len(trace.gpu):,} GPU activities, {len(trace.devices)} "
        f"GPUs; {'Kineto trace (torch.profiler)' if kineto else 'nsys ' + str(trace.meta.get('nsys_version'))}"
    )
    for text in trace.warnings:
        log.warning(text)
    _stamp_capture(trace, capture)
    staging = Staging(out_dir)
    writer = None
    try:
        header = database.Header.from_trace(trace, database.domain_ids_for(corr_mod.domain_order(trace, args.mode)))
        writer = database.DatabaseWriter(staging.path(database_path(args)), header, deferred_indexes=True)
        writer.add_raw(trace)  # written on the writer's thread while the analysis goes on
        result = analyze(
            trace,
            AnalysisConfig.from_args(args),
            str(source),
            on_correlated=lambda corr: database.write_correlation(writer, trace, corr),
        )
        profile = _profile_info(args, source, trace, result.corr, capture)
        new_database = _InMemoryDatabase(writer, result, profile)
        return _write_outputs(args, out_dir, source, result, profile, staging, new_database, writer, started, baseline)
    except BaseException:
        staging.discard_after(writer)
        raise


def _stamp_capture(trace, capture: dict | None) -> None:
    """Record the nsys that captured the trace, with its build suffix (the export's metadata lacks it)."""
    if capture and capture.get("nsys_build"):
        trace.meta["nsys_build"] = capture["nsys_build"]


def out_of_core(source: Path, args: Namespace) -> bool:
    """Whether to analyse an nsys export out of core (--out_of_core; auto: by its number of events)."""
    from dlprof_profiler.cli.main import OUT_OF_CORE_EVENTS

    choice = getattr(args, "out_of_core", "auto") or "auto"
    if choice == "off" or ingest.trace_format(source) != ingest.SQLITE:
        if choice == "on":
            log.warning(f"{source}: --out_of_core applies to Nsight Systems exports; this trace is read in memory")
        return False
    return choice == "on" or export_events(source) >= OUT_OF_CORE_EVENTS


def export_events(source: Path) -> int:
    """About how many NVTX ranges, CUDA API calls and GPU activities an nsys export holds (the largest rowid
    of each table: no table scan)."""
    from dlprof_profiler.ingest.sqlite_source import SqliteSource

    src = SqliteSource(source, immutable=True)
    try:
        return sum(
            int(src.query_scalar(f"SELECT coalesce(max(rowid), 0) FROM {t}") or 0)
            for t in (
                "NVTX_EVENTS",
                "CUPTI_ACTIVITY_KIND_RUNTIME",
                "CUPTI_ACTIVITY_KIND_KERNEL",
                "CUPTI_ACTIVITY_KIND_MEMCPY",
                "CUPTI_ACTIVITY_KIND_MEMSET",
            )
            if src.has(t)
        )
    finally:
        src.close()


def run_store_analysis(source: Path, args: Namespace, capture: dict | None = None) -> int:
    """The same analysis and outputs, out of core: the export is staged in a DuckDB store inside the run's
    staging folder (removed at the end) and analysed, written and reported a segment or chunk at a time."""
    from dlprof_profiler.engine.analysis import analyze_store
    from dlprof_profiler.store.trace_store import TraceStore
    from dlprof_profiler.store.model import DatabaseFeed

    started = time.perf_counter()
    out_dir = prepare_output_dir(Path(args.output_path))
    refuse_existing(planned_outputs(args), args.force)
    baseline = prepare_baseline(args)
    staging = Staging(out_dir)
    store = writer = feed = None
    try:
        store = TraceStore(source, staging.root / "out_of_core")

        def start_database(trace):
            # the raw facts are written from the store while the rest is staged and analysed (as the in-memory
            # path writes them while it analyses)
            nonlocal writer, feed
            _stamp_capture(trace, capture)
            header = database.Header.from_trace(trace, database.domain_ids_for(store.domain_order(args.mode)))
            # every row comes at once from the store: the indexes are cheaper built once, sorted, after them
            writer = database.DatabaseWriter(staging.path(database_path(args)), header, deferred_indexes=True)
            feed = DatabaseFeed(writer, store)
            feed.raw_ranges()

        def staged(trace):
            log.info(
                f"  {store.counts['ranges']:,} NVTX ranges, {store.counts['api']:,} CUDA API calls, "
                f"{store.counts['gpu']:,} GPU activities, {len(trace.devices)} GPUs; "
                f"nsys {trace.meta.get('nsys_version')}"
            )
            for text in trace.warnings:
                log.warning(text)

        store.on_staged = staged
        with log.stage(f"Reading {source} out of core (staged on disk in {out_dir})"):
            trace = store.load(on_read=start_database)
        feed.raw_calls()  # (written once staged: the ranges are classified meanwhile)
        # each segment's GPU activity owners are written once it is correlated, the op model once complete
        # (while the analysis aggregates: the writer is the last to finish)
        result = analyze_store(
            store, AnalysisConfig.from_args(args), str(source), on_segment=feed.owners, on_correlated=feed.model
        )
        profile = _profile_info(args, source, trace, result.corr, capture, store.profile_start, store.profile_end)
        feed.set_final(result.primary, profile)
        return _write_outputs(args, out_dir, source, result, profile, staging, feed, writer, started, baseline)
    except BaseException as exc:
        if feed is not None:
            feed.cancel()
        staging.discard_after(writer)
        no_room = None if isinstance(exc, DLProfError) else no_room_reason(exc)
        if no_room:  # Arrow and DuckDB name no file: the folder is what the user can act on
            raise DLProfError(
                f"{out_dir}: {no_room[0]} while the export was staged out of core in this folder; {no_room[1]}, "
                "or analyse in memory (--out_of_core=off)"
            ) from None
        raise
    finally:
        if feed is not None:
            feed.cancel()  # (no-op once the model was fed)
            feed.join()  # the feeding thread reads the store: it stops once the writer is closed
        if store is not None:
            store.close()


def _profile_info(
    args, source, trace, corr, capture, profile_start: int | None = None, profile_end: int | None = None
) -> dict:
    info = {
        "profile_name": args.profile_name,
        "source_file": str(nsys_report.shown(Path(source).resolve())),  # a report, not its staged export
        "source_kind": {"kineto": "kineto_json"}.get(trace.meta.get("source_format"), "nsys_sqlite"),
        "nsys_version": trace.meta.get("nsys_version"),
        "key_node_default": trace.meta.get("key_node_default"),
        "schema_version": trace.meta.get("schema_version"),
        "mode": corr.mode,
        "family": corr.family or "",
        "dlprof_version": __version__,
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "profile_start": trace.profile_start if profile_start is None else profile_start,
        "profile_end": trace.profile_end if profile_end is None else profile_end,
        "base_name": args.base_name,
    }
    if capture:
        info["capture"] = capture
    return info


class _InMemoryDatabase:
    """A new database written from the in-memory model (its raw facts were queued when the trace was read)."""

    def __init__(self, writer, result: Analysis, profile: dict):
        self.writer, self.result, self.profile = writer, result, profile

    def start(self) -> None:
        database.write_correlation(self.writer, self.result.trace, self.result.corr)  # queued, not waited for

    def add_aggregation(self, elapsed: float) -> int:
        """Queued after the op model, ingested on the writer's thread; returns its aggr_id."""
        r = self.result
        return self.writer.add_aggregation(r.aggregations, r.iterations, r.findings, elapsed)

    def finish(self) -> tuple[dict, dict]:
        r = self.result
        return database.finish_analysis(
            self.writer, r.trace, r.corr, r.primary, self.profile
        ), self.writer.op_index_maps()


class _CopiedDatabase:
    """An existing DLProf database copied, to receive the new aggregation."""

    def __init__(self, source: Path, target: Path, profile: dict):
        self.source, self.target, self.profile = source, target, profile

    def start(self) -> None:
        _copy_database(self.source, self.target)

    def finish(self) -> tuple[dict, dict]:
        return self.profile["_domain_ids"], self.profile["_offsets"]


def _write_outputs(
    args,
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
            db_final = database_path(args)
            db_staged = staging.path(db_final)
            new_database.start()
            # a new database takes the aggregation on its writer's thread, while the reports are written
            queue_aggregation = getattr(new_database, "add_aggregation", None)
            aggr_id = queue_aggregation(time.perf_counter() - started) if queue_aggregation else None
            written_reports = _write_reports(args, out_dir, trace, corr, aggregations, findings, primary, staging)
            baselines = {}  # per domain, the baseline's side of the diff: kept in the run's database
            written_reports += _write_diffs(args, out_dir, source, result, staging, baseline, baselines)
            if args.dump_model_data:
                _dump_model(staging.path(out_dir / f"{args.base_name}_model_data.json"), corr)
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
            run_dir = event_files.run_directory(out_dir, args.profile_name)
            event_meta = {
                "database": _relative(db_final, run_dir),
                "profile_name": args.profile_name,
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
        staging.commit(replacing=replaced_outputs(args))  # --force was given (checked first) if any exists
    except BaseException:
        staging.discard_after(writer)
        raise
    _print_summary(aggregations[primary], db_final, written_reports)
    _print_findings(findings.get(primary, []), db_final, args.profile_name, _run_options(args))
    log.info(f"Done in {time.perf_counter() - started:.1f} s")
    return 0


def _relative(target: Path, start: Path) -> str:
    import os

    return os.path.relpath(Path(target).resolve(), Path(start).resolve())


def _copy_database(source: Path, target: Path) -> None:
    """Copy a DLProf database (consistently, even while another process appends to it)."""
    src = sqlite3.connect(f"{Path(source).resolve().as_uri()}?mode=ro", uri=True)
    dst = sqlite3.connect(target)
    try:
        src.backup(dst)
    finally:
        src.close()
        dst.close()


def _write_reports(
    args, out_dir, trace, corr, aggregations, findings, primary, staging, rank_suffix: str = ""
) -> list[Path]:
    names = report_names(args, corr.mode)
    if corr.mode == "simple":
        skipped = [r for r in args.reports if r not in names and r != "diff"]
        if skipped:
            log.warning(f"simple mode writes only the summary and kernel reports; skipped: {', '.join(skipped)}")
    written = []
    domains = list(corr.domains) if args.domain == "all" else [primary]
    for name in domains:
        suffix = ("" if name == primary else "_" + _slug(name)) + rank_suffix
        built = reports.build_reports(
            names, aggregations[name], corr.domains[name], trace, corr.config, findings.get(name, [])
        )
        for report in built:
            written += reports.write_report(report, out_dir, args.base_name, args.formats, suffix, staging.path)
    return written


def _write_diffs(
    args, out_dir: Path, source: Path, result: Analysis, staging: Staging, base: Analysis | None, sides: dict
) -> list[Path]:
    """The diff report against the analysed --baseline, per reported domain (the primary one, or each with
    --domain=all that the baseline has too); `sides` gets the baseline's side of each comparison."""
    if base is None:
        return []
    domains = list(result.aggregations) if args.domain == "all" else [result.primary]
    written = []
    for name in domains:
        if name not in base.aggregations:
            message = (
                f"{baseline_of(args)}: the baseline has no NVTX domain '{name}' to compare with (its "
                f"domains: {', '.join(base.aggregations) or 'none'})"
            )
            if args.domain == "all":
                log.warning(message + "; no diff for that domain")
                continue
            raise DLProfError(message)
        comparison = compare.compare(
            compare.side_from_aggregation(result.aggregations[name], str(nsys_report.shown(source))),
            compare.side_from_aggregation(base.aggregations[name], str(baseline_of(args))),
        )
        sides[name] = comparison.baseline
        suffix = "" if name == result.primary else "_" + _slug(name)
        written += reports.write_report(
            reports.diff_report(comparison), out_dir, args.base_name, args.formats, suffix, staging.path
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


def _slug(name: str) -> str:
    import re

    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") or "domain"


MODEL_INSTANCE_COLUMNS = [
    "instance_id",
    "op_index",
    "start",
    "end",
    "pid",
    "global_tid",
    "device_id",
    "cpu_time",
    "cpu_overhead",
    "gpu_time",
    "gpu_idle",
    "n_kernels",
]


def _dump_model(path: Path, corr) -> None:
    """The op model as JSON: per domain its ops and its instances (columns and rows), written a chunk of
    instances at a time."""
    with open(path, "w", encoding="utf-8") as out:
        out.write("{")
        for d, (name, dm) in enumerate(corr.domains.items()):
            ops = dm.ops.drop(columns=[c for c in ("kind",) if c in dm.ops.columns])
            out.write(
                ("" if d == 0 else ", ")
                + json.dumps(name)
                + ': {"ops": '
                + ops.to_json(orient="records")
                + ', "instances": {"columns": '
                + json.dumps(MODEL_INSTANCE_COLUMNS)
                + ', "data": ['
            )
            first = True
            for chunk in _instance_chunks(corr, dm):
                rows = json.loads(chunk[MODEL_INSTANCE_COLUMNS].to_json(orient="values"))
                if rows:
                    out.write(("" if first else ", ") + json.dumps(rows)[1:-1])
                    first = False
            out.write("]}}")
        out.write("}")


def _instance_chunks(corr, dm, rows: int = 1 << 18):
    """A domain model's instances in start order, `rows` at a time (from the store when kept out of core)."""
    return dm.instance_chunks(MODEL_INSTANCE_COLUMNS, rows)


def _run_options(args) -> list[str]:
    """The options of this run that a command updating it must repeat (its reports, formats, domain)."""
    from dlprof_profiler.cli.main import DEFAULT_REPORTS

    options = []
    own = [r for r in args.reports if r != "diff"]  # --baseline (below) brings the diff back
    if own != list(DEFAULT_REPORTS):
        options.append("--reports=" + ",".join(own))
    if list(args.formats) != ["csv"]:
        options.append("--formats=" + ",".join(args.formats))
    if args.domain:
        options.append(f"--domain={args.domain}")
    if baseline_of(args):
        options.append(f"--baseline={baseline_of(args)}")
    return options


def _print_findings(
    findings: list[dict], db_path: Path, profile_name: str | None = None, options: tuple | list = ()
) -> None:
    """The expert systems' problems and what to change, with the command that applies a proposal."""
    from dlprof_profiler.experts import render_command

    if not findings:
        log.info("Expert systems: no problems found")
        return
    log.info(f"Expert systems: {len(findings)} finding(s)")
    for f in findings:
        log.info(f"  [{f.get('severity', 'info')}] {f.get('problem', '')}")
        log.info(f"      -> {f.get('recommendation', '')}")
        command = render_command(f.get("action"), db_path, profile_name, options)
        if command:
            log.info(f"      apply with: {command}")


def _print_summary(agg, db_path: Path, written: list[Path]) -> None:
    from dlprof_profiler.outputs.reports import iteration_headline

    s = agg.summary
    log.info(iteration_headline(s))
    log.info(
        f"Wall clock time {s['wall_time']:,} ns; GPU utilization {s['gpu_utilization']:.1f} %, "
        f"Tensor Core kernel utilization {s['tc_utilization']:.1f} %"
    )
    log.info(f"Database: {db_path}")
    for path in written:
        log.detail(f"Report: {path}")
    if written:
        log.info(f"{len(written)} report file(s) in {written[0].parent}")


# ---------------------------------------------------------------------------- re-aggregation of a database


def reaggregate_database(source: Path, args: Namespace) -> int:
    """`dlprof --database=dlprof_dldb.sqlite`: a new aggregation (key node, iteration range) and new reports;
    the input database is copied, never modified, except when the output database is the input (the run's
    own folder, with --force): that run is updated, its database replaced by the copy with the new
    aggregation appended."""
    started = time.perf_counter()
    out_dir = prepare_output_dir(Path(args.output_path))
    in_place = database_path(args).resolve() == source.resolve()
    if in_place and not args.force:
        raise DLProfError(
            f"{source}: the output database would replace the input: add --force=true to update "
            "this run in place (a new aggregation; its reports and event file are replaced), or "
            "choose another --output_path or --base_name",
            exit_code=2,
        )
    refuse_existing(planned_outputs(args), args.force)
    baseline = prepare_baseline(args)
    if in_place:
        # the run's own folder and names (the command the expert systems propose): update that run
        log.info(
            f"{source}: updating this run: its database gets a new aggregation (earlier ones are kept); "
            "its reports and event file are replaced"
        )
    with log.stage(f"Reading DLProf database {source}"):
        trace, corr, profile, domain_ids, offsets = database.load_model(source)
    if args.mode and args.mode != corr.mode:
        log.warning(f"--mode {args.mode} ignored: the database was built in {corr.mode} mode")
    result = reanalyze(trace, corr, profile, AnalysisConfig.from_args(args), str(source))
    profile = dict(profile, _domain_ids=domain_ids, _offsets=offsets)
    staging = Staging(out_dir)
    new_database = _CopiedDatabase(source, staging.path(database_path(args)), profile)
    return _write_outputs(args, out_dir, source, result, profile, staging, new_database, None, started, baseline)


def reaggregate_in_place(
    db_path: Path, key_node: str | None = None, iter_start: int | None = None, iter_stop: int | None = None
) -> int:
    """A new aggregation appended to a DLProf database in one transaction (the viewer's Reaggregate);
    returns its aggr_id. Earlier aggregations are kept; a failure leaves the file as it was."""
    started = time.perf_counter()
    db_path = Path(db_path)
    check_sqlite_file(db_path)
    if not database.is_dlprof_database(db_path):
        raise DLProfError(f"{db_path}: not a DLProf database")
    from dlprof_profiler.run import ranks

    numbers = ranks.database_ranks(db_path)
    if len(numbers) > 1:
        return ranks.reaggregate_in_place(db_path, key_node, iter_start, iter_stop, numbers)
    trace, corr, profile, domain_ids, offsets = database.load_model(db_path)
    config = AnalysisConfig(key_node=key_node, iter_start=iter_start, iter_stop=iter_stop)
    iterations = reaggregation_iterations(trace, corr, key_node, profile)
    if key_node and not iterations.found:
        raise DLProfError(f"{db_path}: key node '{key_node}' not found", exit_code=2)
    result = reanalyze(
        trace,
        corr,
        profile,
        config,
        str(db_path),
        primary=profile.get("primary_domain", "default"),
        iterations=iterations,
    )
    return database.append_aggregation(
        db_path,
        result.aggregations,
        domain_ids,
        offsets,
        result.iterations,
        result.findings,
        time.perf_counter() - started,
    )
