"""What a run writes and prints, shared by the single-profile run, the rank workers and the multi-rank run: the
paths of its outputs, the profile's description in the database, the reports and the op model dump, and the
summary and findings printed at the end."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import time
from pathlib import Path


from dlprof_profiler import __version__, log
from dlprof_profiler.errors import DLProfError
from dlprof_profiler.experts import render_command
from dlprof_profiler.ingest import nsys_report
from dlprof_profiler.options import DEFAULT_REPORTS, RunOptions
from dlprof_profiler.outputs import event_files
from dlprof_profiler.outputs import publish
from dlprof_profiler.outputs import reports
from dlprof_profiler.outputs.reports import iteration_headline


def report_names(options: RunOptions, mode: str | None = None) -> list[str]:
    """The reports of the analysed profile (the diff, which needs the baseline too, is written apart)."""
    names = [r for r in options.reports if r != "diff"]
    if mode == "simple" or options.mode == "simple":
        names = [r for r in names if r in reports.SIMPLE_MODE_REPORTS]
    return names


def planned_outputs(options: RunOptions) -> list[Path]:
    """Every file the analysis will write or replace for these arguments (existing ones need --force)."""
    out = Path(options.output_path)
    files = [options.database_path]
    files += reports.report_paths(out, options.base_name, report_names(options), options.formats)
    if options.baseline_path:
        files += reports.report_paths(out, options.base_name, ["diff"], options.formats)
    if options.dump_model_data:
        files.append(out / f"{options.base_name}_model_data.json")
    return files + replaced_outputs(options)


# what a run's report set is made of besides the reports: the cross-rank report and the op model dump
REPORT_SET_STEMS = (*reports.REPORT_FILES.values(), "ranks", "model_data")


def replaced_outputs(options: RunOptions) -> list[Path]:
    """The files of the previous run in the output folder (same base and profile name) that this run
    replaces: its report set and its event files. Those this run does not write again are removed when its
    outputs are put in place, so the folder holds exactly the reports of the last run."""
    out = Path(options.output_path)
    return publish.report_set(out, options.base_name, REPORT_SET_STEMS) + event_files.existing_event_files(
        event_files.run_directory(out, options.profile_name)
    )


def updates_in_place(source: Path, options: RunOptions) -> bool:
    """Whether a re-aggregation's output database is its input (the run's own folder: updated in place, which
    takes --force; refused without it)."""
    in_place = options.database_path.resolve() == Path(source).resolve()
    if in_place and not options.force:
        raise DLProfError(
            f"{source}: the output database would replace the input: add --force=true to update "
            "this run in place (a new aggregation; its reports and event file are replaced), or "
            "choose another --output_path or --base_name",
            exit_code=2,
        )
    return in_place


def profile_info(
    options: RunOptions,
    source,
    trace,
    corr,
    capture: dict | None,
    profile_start: int | None = None,
    profile_end: int | None = None,
) -> dict:
    """The profile's description in the database (its names, source, versions, span and how it was captured)."""
    info = {
        "profile_name": options.profile_name,
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
        "base_name": options.base_name,
    }
    if capture:
        info["capture"] = capture
    return info


def relative_path(target: Path, start: Path) -> str:
    """`target` relative to `start` (both resolved): how an event file names its database."""
    return os.path.relpath(Path(target).resolve(), Path(start).resolve())


def copy_database(source: Path, target: Path) -> None:
    """Copy a DLProf database (consistently, even while another process appends to it)."""
    src = sqlite3.connect(f"{Path(source).resolve().as_uri()}?mode=ro", uri=True)
    dst = sqlite3.connect(target)
    try:
        src.backup(dst)
    finally:
        src.close()
        dst.close()


def write_reports(
    options: RunOptions, out_dir, trace, corr, aggregations, findings, primary, staging, rank_suffix: str = ""
) -> list[Path]:
    """The reports of each reported domain (the primary one, or every one with --domain=all), staged."""
    names = report_names(options, corr.mode)
    if corr.mode == "simple":
        skipped = [r for r in options.reports if r not in names and r != "diff"]
        if skipped:
            log.warning(f"simple mode writes only the summary and kernel reports; skipped: {', '.join(skipped)}")
    written = []
    domains = list(corr.domains) if options.domain == "all" else [primary]
    for name in domains:
        suffix = ("" if name == primary else "_" + slug(name)) + rank_suffix
        built = reports.build_reports(
            names, aggregations[name], corr.domains[name], trace, corr.config, findings.get(name, [])
        )
        for report in built:
            written += reports.write_report(report, out_dir, options.base_name, options.formats, suffix, staging.path)
    return written


def slug(name: str) -> str:
    """A domain name as it may appear in a file name."""
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


def dump_model(path: Path, corr) -> None:
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
            for chunk in instance_chunks(corr, dm):
                rows = json.loads(chunk[MODEL_INSTANCE_COLUMNS].to_json(orient="values"))
                if rows:
                    out.write(("" if first else ", ") + json.dumps(rows)[1:-1])
                    first = False
            out.write("]}}")
        out.write("}")


def instance_chunks(corr, dm, rows: int = 1 << 18):
    """A domain model's instances in start order, `rows` at a time (from the store when kept out of core)."""
    return dm.instance_chunks(MODEL_INSTANCE_COLUMNS, rows)


def repeat_options(options: RunOptions) -> list[str]:
    """The options of this run that a command updating it must repeat (its reports, formats, domain)."""
    words = []
    own = [r for r in options.reports if r != "diff"]  # --baseline (below) brings the diff back
    if own != list(DEFAULT_REPORTS):
        words.append("--reports=" + ",".join(own))
    if list(options.formats) != ["csv"]:
        words.append("--formats=" + ",".join(options.formats))
    if options.domain:
        words.append(f"--domain={options.domain}")
    if options.baseline_path:
        words.append(f"--baseline={options.baseline_path}")
    return words


def print_findings(
    findings: list[dict], db_path: Path, profile_name: str | None = None, options: tuple | list = ()
) -> None:
    """The expert systems' problems and what to change, with the command that applies a proposal."""
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


def print_summary(agg, db_path: Path, written: list[Path]) -> None:
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
