"""The analysis run: ingest -> correlate -> iterate -> aggregate -> detect -> write, for an nsys SQLite
export or a DLProf database (`dlprof --database`), and for a fresh capture."""
from __future__ import annotations

import json
import sqlite3
import time
from argparse import Namespace
from pathlib import Path


from dlprof_profiler import __version__, log
from dlprof_profiler import correlate as corr_mod
from dlprof_profiler import database, event_files, graph_events, ingest, reports
from dlprof_profiler.analysis import (Analysis, AnalysisConfig, analyze, key_node_from_ops, reaggregation_iterations,
                                      reanalyze)
from dlprof_profiler.errors import DLProfError
from dlprof_profiler.outputs import Staging, prepare_output_dir, refuse_existing
from dlprof_profiler.sanitize import sanitize_trace
from dlprof_profiler.sqlite_source import check_sqlite_file


def database_path(args: Namespace) -> Path:
    return Path(args.output_path) / f"{args.base_name}_dldb.sqlite"


def report_names(args: Namespace, mode: str | None = None) -> list[str]:
    names = list(args.reports)
    if mode == "simple" or getattr(args, "mode", None) == "simple":
        names = [r for r in names if r in reports.SIMPLE_MODE_REPORTS]
    return names


def planned_outputs(args: Namespace) -> list[Path]:
    """Every file the analysis will write for these arguments (existing ones need --force)."""
    out = Path(args.output_path)
    files = [database_path(args)]
    files += reports.report_paths(out, args.base_name, report_names(args), args.formats)
    if args.dump_model_data:
        files.append(out / f"{args.base_name}_model_data.json")
    files += event_files.existing_event_files(event_files.run_directory(out, args.profile_name))
    return files


def analyze_database(args: Namespace) -> int:
    """`dlprof --database=FILE`: analyse an nsys export or Kineto trace, or re-aggregate a DLProf database;
    several profiles (a comma list, a directory, a glob) are the ranks of a multi-rank analysis (ranks.py)."""
    from dlprof_profiler import rank_inputs, ranks
    inputs = rank_inputs.resolve(args.database)
    if len(inputs) > 1:
        return ranks.analyze_ranks(inputs, args)
    source = Path(inputs[0].path)
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
        raise DLProfError(f"{path}: a database written by NVIDIA DLProf 1.x: dlprof reads Nsight Systems exports "
                          "and databases it wrote itself; give it the nsys export DLProf profiled (the "
                          "nsys_profile.sqlite next to this file) to analyse the same run")


# ---------------------------------------------------------------------------- analysis of an nsys export

def run_analysis(source: Path, args: Namespace, capture: dict | None = None) -> int:
    """Analyse an nsys SQLite export and write every output; returns the exit status (0)."""
    started = time.perf_counter()
    out_dir = prepare_output_dir(Path(args.output_path))
    refuse_existing(planned_outputs(args), args.force)
    with log.stage(f"Reading {source}"):
        trace = sanitize_trace(ingest.read_trace(source))   # the one place rows of impossible times are dropped
    kineto = trace.meta.get("source_format") == "kineto"
    log.info(f"  {len(trace.ranges):,} {'op and annotation' if kineto else 'NVTX'} ranges, "
             f"{len(trace.api_calls):,} CUDA API calls, {len(trace.gpu):,} GPU activities, {len(trace.devices)} "
             f"GPUs; {'Kineto trace (torch.profiler)' if kineto else 'nsys ' + str(trace.meta.get('nsys_version'))}")
    for text in trace.warnings:
        log.warning(text)
    if capture and capture.get("nsys_build"):
        trace.meta["nsys_build"] = capture["nsys_build"]   # the nsys that captured it, with its build suffix
    staging = Staging(out_dir)
    writer = None
    try:
        header = database.Header.from_trace(trace, database.domain_ids_for(corr_mod.domain_order(trace, args.mode)))
        writer = database.DatabaseWriter(staging.path(database_path(args)), header)
        writer.add_raw(trace)   # written on the writer's thread while the analysis goes on
        result = analyze(trace, AnalysisConfig.from_args(args), str(source))
        profile = _profile_info(args, source, trace, result.corr, capture)
        return _write_outputs(args, out_dir, source, result, profile, None, started, staging, writer)
    except BaseException:
        staging.discard_after(writer)
        raise


def _key_node_from_ops(trace, corr, key: str, iterations):
    """A key node given as an op name or Op ID (kept for callers of the old entry point)."""
    return key_node_from_ops(corr, key, iterations)


def _profile_info(args, source, trace, corr, capture) -> dict:
    info = {"profile_name": args.profile_name, "source_file": str(Path(source).resolve()),
            "source_kind": {"kineto": "kineto_json"}.get(trace.meta.get("source_format"), "nsys_sqlite"),
            "nsys_version": trace.meta.get("nsys_version"), "key_node_default": trace.meta.get("key_node_default"),
            "schema_version": trace.meta.get("schema_version"), "mode": corr.mode, "family": corr.family or "",
            "dlprof_version": __version__, "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "profile_start": trace.profile_start, "profile_end": trace.profile_end, "base_name": args.base_name}
    if capture:
        info["capture"] = capture
    return info


def _write_outputs(args, out_dir: Path, source: Path, result: Analysis, profile: dict, existing_db: Path | None,
                   started: float, staging: Staging | None = None, writer=None) -> int:
    trace, corr, aggregations, findings = result.trace, result.corr, result.aggregations, result.findings
    primary = result.primary
    staging = staging or Staging(out_dir)
    try:
        with log.stage("Writing the DLProf database, reports and event files"):
            db_final = database_path(args)
            db_staged = staging.path(db_final)
            if existing_db is None:
                domain_ids = database.finish_analysis(writer, trace, corr, primary, profile)
                offsets = writer.op_index_maps()
            else:
                _copy_database(existing_db, db_staged)
                domain_ids, offsets = profile["_domain_ids"], profile["_offsets"]
            aggr_id = database.append_aggregation(db_staged, aggregations, domain_ids, offsets, result.iterations,
                                                  findings, time.perf_counter() - started)
            written_reports = _write_reports(args, out_dir, trace, corr, aggregations, findings, primary, staging)
            if args.dump_model_data:
                _dump_model(staging.path(out_dir / f"{args.base_name}_model_data.json"), corr)
            run_dir = event_files.run_directory(out_dir, args.profile_name)
            for old in event_files.existing_event_files(run_dir):
                old.unlink()  # --force was given (checked above): this run replaces them
            event_meta = {"database": _relative(db_final, run_dir), "profile_name": args.profile_name,
                          "aggr_id": aggr_id, "mode": corr.mode, "primary_domain": primary,
                          "nsys_version": trace.meta.get("nsys_version"), "dlprof_version": __version__,
                          "source_file": str(source)}
            event_files.write_event_file(staging.path(run_dir / event_files.event_file_name()), event_meta,
                                         aggregations[primary].iterations,
                                         graph=graph_events.op_graph(corr.domains[primary], aggregations[primary]))
        staging.commit()
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


def _write_reports(args, out_dir, trace, corr, aggregations, findings, primary, staging,
                   rank_suffix: str = "") -> list[Path]:
    names = report_names(args, corr.mode)
    if corr.mode == "simple":
        skipped = [r for r in args.reports if r not in names]
        if skipped:
            log.warning(f"simple mode writes only the summary and kernel reports; skipped: {', '.join(skipped)}")
    written = []
    domains = list(corr.domains) if args.domain == "all" else [primary]
    for name in domains:
        suffix = ("" if name == primary else "_" + _slug(name)) + rank_suffix
        built = reports.build_reports(names, aggregations[name], corr.domains[name], trace, corr.config,
                                      findings.get(name, []))
        for report in built:
            written += reports.write_report(report, out_dir, args.base_name, args.formats, suffix, staging.path)
    return written


def _slug(name: str) -> str:
    import re
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") or "domain"


def _dump_model(path: Path, corr) -> None:
    doc = {}
    for name, dm in corr.domains.items():
        ops = dm.ops.drop(columns=[c for c in ("kind",) if c in dm.ops.columns])
        inst = dm.instances[["instance_id", "op_index", "start", "end", "pid", "global_tid", "device_id", "cpu_time",
                             "cpu_overhead", "gpu_time", "gpu_idle", "n_kernels"]]
        doc[name] = {"ops": json.loads(ops.to_json(orient="records")),
                     "instances": json.loads(inst.to_json(orient="split", index=False))}
    path.write_text(json.dumps(doc), encoding="utf-8")


def _run_options(args) -> list[str]:
    """The options of this run that a command updating it must repeat (its reports, formats, domain)."""
    from dlprof_profiler.cli import DEFAULT_REPORTS
    options = []
    if list(args.reports) != list(DEFAULT_REPORTS):
        options.append("--reports=" + ",".join(args.reports))
    if list(args.formats) != ["csv"]:
        options.append("--formats=" + ",".join(args.formats))
    if args.domain:
        options.append(f"--domain={args.domain}")
    return options


def _print_findings(findings: list[dict], db_path: Path, profile_name: str | None = None,
                    options: tuple | list = ()) -> None:
    """The expert systems' problems and what to change, with the command that applies a proposal."""
    from dlprof_profiler.expert_systems import render_command
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
    s = agg.summary
    log.info(f"Wall clock time {s['wall_time']:,} ns over {s['aggregated_iterations']} iteration(s); "
             f"GPU utilization {s['gpu_utilization']:.1f} %, Tensor Core kernel utilization "
             f"{s['tc_utilization']:.1f} %")
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
        raise DLProfError(f"{source}: the output database would replace the input: add --force=true to update "
                          "this run in place (a new aggregation; its reports and event file are replaced), or "
                          "choose another --output_path or --base_name", exit_code=2)
    refuse_existing(planned_outputs(args), args.force)
    if in_place:
        # the run's own folder and names (the command the expert systems propose): update that run
        log.info(f"{source}: updating this run: its database gets a new aggregation (earlier ones are kept); "
                 "its reports and event file are replaced")
    with log.stage(f"Reading DLProf database {source}"):
        trace, corr, profile, domain_ids, offsets = database.load_model(source)
    if args.mode and args.mode != corr.mode:
        log.warning(f"--mode {args.mode} ignored: the database was built in {corr.mode} mode")
    result = reanalyze(trace, corr, profile, AnalysisConfig.from_args(args), str(source))
    profile = dict(profile, _domain_ids=domain_ids, _offsets=offsets)
    return _write_outputs(args, out_dir, source, result, profile, source, started)


def reaggregate_in_place(db_path: Path, key_node: str | None = None, iter_start: int | None = None,
                         iter_stop: int | None = None) -> int:
    """A new aggregation appended to a DLProf database in one transaction (the viewer's Reaggregate);
    returns its aggr_id. Earlier aggregations are kept; a failure leaves the file as it was."""
    started = time.perf_counter()
    db_path = Path(db_path)
    check_sqlite_file(db_path)
    if not database.is_dlprof_database(db_path):
        raise DLProfError(f"{db_path}: not a DLProf database")
    from dlprof_profiler import ranks
    numbers = ranks.database_ranks(db_path)
    if len(numbers) > 1:
        return ranks.reaggregate_in_place(db_path, key_node, iter_start, iter_stop, numbers)
    trace, corr, profile, domain_ids, offsets = database.load_model(db_path)
    config = AnalysisConfig(key_node=key_node, iter_start=iter_start, iter_stop=iter_stop)
    iterations = reaggregation_iterations(trace, corr, key_node, profile)
    if key_node and not iterations.found:
        raise DLProfError(f"{db_path}: key node '{key_node}' not found", exit_code=2)
    result = reanalyze(trace, corr, profile, config, str(db_path), primary=profile.get("primary_domain", "default"),
                       iterations=iterations)
    return database.append_aggregation(db_path, result.aggregations, domain_ids, offsets, result.iterations,
                                       result.findings, time.perf_counter() - started)
