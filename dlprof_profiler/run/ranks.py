"""Multi-rank analysis (`dlprof --database=r0.sqlite,r1.sqlite,...`, a directory or a glob; docs/DESIGN.md
"Multi-rank analysis"): every rank is analysed as a single profile is, in parallel on local worker processes or,
with `--scheduler=ADDRESS`, on a Dask distributed cluster; each worker writes its rank's database and reports into
the run's staging folder and sends back only small frames. This process merges the ranks' databases into one,
writes the cross-rank report `<base>_ranks.csv`, the findings across ranks and the TensorBoard run, and renames
every output into place together.

Re-aggregating a multi-rank database (`dlprof --database=<run>/dlprof_dldb.sqlite`, the viewer's Reaggregate)
re-aggregates every rank the same way and appends one aggregation holding them all.
"""

from __future__ import annotations

import multiprocessing
import os
import sqlite3
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from pathlib import Path

from dlprof_profiler import __version__, log
from dlprof_profiler import contract as K
from dlprof_profiler.db import writer as database
from dlprof_profiler.db.merge import MergedDatabase, write_cross_rank
from dlprof_profiler.errors import DLProfError
from dlprof_profiler.experts.ranks import detect_ranks
from dlprof_profiler.ingest import nsys_report
from dlprof_profiler.options import RunOptions
from dlprof_profiler.outputs import event_files
from dlprof_profiler.outputs import rank_report
from dlprof_profiler.outputs import reports
from dlprof_profiler.outputs.publish import Staging, prepare_output_dir, refuse_existing
from dlprof_profiler.outputs.rank_report import rank_table
from dlprof_profiler.outputs.report_format import Table
from dlprof_profiler.run import outputs as run_outputs
from dlprof_profiler.run.inputs import RankInput
from dlprof_profiler.run.rank_worker import RankResult, RankTask, analyze_rank

DASK_PACKAGE = "distributed"


# ---------------------------------------------------------------------------- running the ranks


class LocalRunner:
    """Ranks on worker processes of this machine: at most min(ranks, CPU cores) at a time by default; each
    process analyses one rank and exits (its memory goes back to the system before the next rank starts)."""

    def __init__(self, workers: int | None = None):
        self.workers = workers

    def run(self, tasks: list[RankTask]):
        """Results in the order they complete (DLProfError of a rank re-raised here, the other ranks stopped)."""
        n = max(1, min(len(tasks), self.workers or os.cpu_count() or 1))
        limits = {"max_tasks_per_child": 1} if sys.version_info >= (3, 11) else {}
        # spawn: a fresh interpreter per worker, no copy of this process's memory or threads
        executor = ProcessPoolExecutor(n, mp_context=multiprocessing.get_context("spawn"), **limits)
        log.info(f"Analysing {len(tasks)} ranks on {n} local worker process(es)")
        try:
            pending = {executor.submit(analyze_rank, t) for t in tasks}
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    yield future.result()
        except BaseException:
            _stop(executor)
            raise
        executor.shutdown(wait=True)


def _stop(executor) -> None:
    """Stop the workers at once (a failed rank fails the run; the others' work would be thrown away)."""
    processes = list((getattr(executor, "_processes", None) or {}).values())  # no public way before 3.14
    for process in processes:
        try:
            process.terminate()
        except Exception:  # noqa: BLE001 - already gone
            pass
    executor.shutdown(wait=True, cancel_futures=True)


class DaskRunner:
    """Ranks as tasks of a running Dask distributed cluster (each worker reads its rank's file and writes into
    the run's staging folder, which must be on a filesystem the workers share)."""

    def __init__(self, address: str):
        try:
            from distributed import Client
        except ImportError:
            raise DLProfError(
                f"--scheduler needs the Python package '{DASK_PACKAGE}': pip install 'dlprof-profiler[dask]'",
                exit_code=2,
            ) from None
        try:
            # waits as long as Dask's own setting says (distributed.comm.timeouts.connect, 30 s by default)
            self.client = Client(address)
        except Exception as exc:  # noqa: BLE001 - OSError, TimeoutError, ValueError for a bad address
            raise DLProfError(
                f"--scheduler={address}: cannot connect to the Dask scheduler "
                f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})",
                exit_code=2,
            ) from None
        self.address = address

    def check_shared(self, folder: Path) -> None:
        """Every worker must see the staging folder (a file written here is read there)."""
        probe = Path(folder) / ".dlprof-probe"
        probe.write_text(str(os.getpid()))
        try:
            seen = self.client.run(_sees, str(probe))
        finally:
            probe.unlink()
        if not seen:
            raise DLProfError(f"--scheduler={self.address}: the Dask cluster has no worker")
        blind = sorted(worker for worker, ok in seen.items() if not ok)
        if blind:
            raise DLProfError(
                f"{folder.parent}: Dask worker {blind[0]} cannot see the output folder; give an "
                "--output_path on a filesystem every worker shares (and the profiles too)"
            )

    def run(self, tasks: list[RankTask]):
        from distributed import as_completed

        log.info(
            f"Analysing {len(tasks)} ranks on the Dask cluster at {self.address} "
            f"({len(self.client.scheduler_info().get('workers', {}))} worker(s))"
        )
        futures = self.client.map(analyze_rank, tasks, pure=False)
        try:
            for future in as_completed(futures):
                yield future.result()
        except BaseException:
            self.client.cancel(futures)
            raise

    def close(self) -> None:
        self.client.close()


def _sees(path: str) -> bool:
    return os.path.isfile(path)


def runner(options: RunOptions):
    address = options.scheduler
    return DaskRunner(address) if address else LocalRunner(options.workers)


def _results_in_order(run, tasks):
    """Results in rank order as soon as each and its predecessors are done (the merge is deterministic)."""
    order = [t.rank for t in tasks]
    waiting: dict[int, RankResult] = {}
    nxt = 0
    for result in run.run(tasks):
        waiting[result.rank] = result
        log.info(
            f"  rank {result.rank}: analysed in {result.seconds:.1f} s (worker peak memory "
            f"{result.peak_rss_mb / 1024:.2f} GB)"
        )
        while nxt < len(order) and order[nxt] in waiting:
            yield waiting.pop(order[nxt])
            nxt += 1


# ---------------------------------------------------------------------------- outputs


def planned_outputs(options: RunOptions, ranks: list[int]) -> list[Path]:
    """Every file a multi-rank run writes (existing ones need --force)."""
    out = Path(options.output_path)
    files = [options.database_path]
    for rank in ranks:
        files += reports.report_paths(out, options.base_name, list(options.reports), options.formats, f"_rank{rank}")
        if options.dump_model_data:
            files.append(out / f"{options.base_name}_model_data_rank{rank}.json")
    files += [out / f"{options.base_name}_{rank_report.REPORT_NAME}.{f}" for f in options.formats]
    if "expert_systems" in options.reports:
        files += reports.report_paths(out, options.base_name, ["expert_systems"], options.formats)
    return files + run_outputs.replaced_outputs(options)  # the previous run's report set and event files


def _tasks(inputs, options, out_dir: Path, staging: Staging, reaggregate: bool = False) -> list[RankTask]:
    return [
        RankTask(
            rank=i.rank,
            index=n,
            source=str(Path(i.path).resolve()),
            options=options,
            output_dir=str(out_dir.resolve()) if out_dir else "",
            staging_root=str(staging.root.resolve()) if staging else "",
            verbosity=min(log.verbosity(), log.MINIMAL),
            reaggregate=reaggregate,
        )
        for n, i in enumerate(inputs)
    ]


def analyze_ranks(inputs: list[RankInput], options: RunOptions) -> int:
    """`dlprof --database=<several profiles>`: every output of a multi-rank run; returns the exit status."""
    started = time.perf_counter()
    out_dir = prepare_output_dir(Path(options.output_path))
    ranks = [i.rank for i in inputs]
    refuse_existing(planned_outputs(options, ranks), options.force)
    log.info(
        f"{len(inputs)} ranks: "
        + ", ".join(
            f"rank {i.rank} {nsys_report.shown(i.path)}{'' if i.recorded else ' (rank by order)'}" for i in inputs
        )
    )
    staging = Staging(out_dir)
    run = None
    try:
        run = runner(options)
        if isinstance(run, DaskRunner):
            run.check_shared(staging.root)
        tasks = _tasks(inputs, options, out_dir, staging)
        merged = MergedDatabase(staging.path(options.database_path))
        results = []
        with log.stage("Analysing the ranks and merging their databases"):
            for result in _results_in_order(run, tasks):
                merged.add(Path(result.database), result.rank)
                for final in result.finals:
                    staging.path(Path(final))
                results.append(result)
        table, findings = _cross_rank(results)
        merged.finish(
            _run_profile(options, results, inputs),
            _run_aggregation(results, time.perf_counter() - started),
            table,
            findings,
        )
        written = _write_run_outputs(options, out_dir, staging, results, table, findings, aggr_id=1)
        staging.commit(
            replacing=run_outputs.replaced_outputs(options)
        )  # --force was given (checked before) if any exists
    except BaseException:
        staging.discard()
        raise
    finally:
        if isinstance(run, DaskRunner):
            run.close()
    _print_run(options, results, table, findings, written, started)
    return 0


def _cross_rank(results: list[RankResult]):
    table = rank_table(results)
    return table, detect_ranks(results, table)


def _run_profile(options, results: list[RankResult], inputs=None) -> dict:
    """The run's profile_info: the first rank's, with the run's names and its ranks."""
    first = results[0].profile
    profile = dict(first)
    profile.update(
        profile_name=options.profile_name,
        base_name=options.base_name,
        ranks=[r.rank for r in results],
        rank_count=len(results),
        source_file=",".join(str(r.source) for r in results),
        created_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        dlprof_version=__version__,
    )
    versions = sorted({str(r.profile.get("nsys_version")) for r in results if r.profile.get("nsys_version")})
    if len(versions) > 1:
        profile["nsys_version"] = ", ".join(versions)
    return profile


def _run_aggregation(results: list[RankResult], elapsed: float) -> dict:
    """The aggregations row of a multi-rank run: the iteration range and count spanning the ranks'."""
    s = [r.summary for r in results]
    return {
        "iter_start": min(x["iter_start"] for x in s),
        "iter_stop": max(x["iter_stop"] for x in s),
        "total_iterations": max(x["total_iterations"] for x in s),
        "elapsed_seconds": float(elapsed),
    }


def _write_run_outputs(options, out_dir: Path, staging: Staging, results, table, findings, aggr_id: int) -> list[Path]:
    """The run-level files: the cross-rank report, the expert systems of the whole run and the event file."""
    written = rank_report.write_report(table, out_dir, options.base_name, options.formats, staging.path)
    if "expert_systems" in options.reports:
        rows = [("all", f) for f in findings] + [(str(r.rank), f) for r in results for f in r.findings]
        data = {
            "Rank": [r for r, _ in rows],
            "Problem": [f.get("problem", "") for _, f in rows],
            "Recommendation": [f.get("recommendation", "") for _, f in rows],
        }
        report = reports.Report(
            "expert_systems",
            [Table("Expert Systems Feedback", ["Rank", "Problem", "Recommendation"], ["t", "q", "q"], data)],
        )
        written += reports.write_report(report, out_dir, options.base_name, options.formats, "", staging.path)
    run_dir = event_files.run_directory(out_dir, options.profile_name)
    first = results[0]
    meta = {
        "database": os.path.relpath(options.database_path.resolve(), run_dir.resolve()),
        "profile_name": options.profile_name,
        "aggr_id": aggr_id,
        "mode": first.mode,
        "primary_domain": first.primary,
        "nsys_version": first.profile.get("nsys_version"),
        "dlprof_version": __version__,
        "source_file": ",".join(r.source for r in results),
        "ranks": [r.rank for r in results],
    }
    scalars = [
        (int(row.iteration), f"dlprof/rank{r.rank}/iteration_time_ms", row.duration / 1e6)
        for r in results
        for row in r.iterations.itertuples(index=False)
    ]
    event_files.write_event_file(
        staging.path(run_dir / event_files.event_file_name()),
        meta,
        first.iterations,
        graph=first.graph,
        extra_scalars=scalars,
    )
    return written


def _print_run(options, results, table, findings, written, started) -> None:
    db = options.database_path
    log.info("Ranks (iteration times over the aggregated iterations):")
    for row in table.to_dict("records"):
        log.info(
            f"  rank {row['rank']}: {row['iterations']} iterations, avg {row['avg_iteration_time'] / 1e6:,.3f} "
            f"ms, max {row['max_iteration_time'] / 1e6:,.3f} ms; GPU utilization {row['gpu_utilization']:.1f} %; "
            f"communication {row['communication_time'] / 1e6:,.3f} ms, "
            f"{row['overlapped_communication_pct']:.1f} % overlapped; slowest in {row['times_slowest']} "
            "iteration(s)"
        )
    log.info(f"Database: {db}")
    if written:
        log.info(f"Cross-rank report: {written[0]}; per-rank reports *_rank<N>.* in {written[0].parent}")
    run_outputs.print_findings(findings, db, options.profile_name, run_outputs.repeat_options(options))
    log.info(f"Done in {time.perf_counter() - started:.1f} s")


# ---------------------------------------------------------------------------- multi-rank databases


def database_ranks(path: Path) -> list[int]:
    """The ranks of a DLProf database (schema 3.0; [0] for a single-rank or 2.0 file)."""
    try:
        con = sqlite3.connect(f"{Path(path).resolve().as_uri()}?mode=ro", uri=True)
        try:
            names = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if K.RANKS not in names:
                return [K.DEFAULT_RANK]
            ranks = [int(r[0]) for r in con.execute(f"SELECT rank FROM {K.RANKS} ORDER BY rank")]
        finally:
            con.close()
    except sqlite3.Error:
        return [K.DEFAULT_RANK]
    return ranks or [K.DEFAULT_RANK]


def _reaggregated(source: Path, options: RunOptions, ranks: list[int], out_dir: Path | None, staging: Staging | None):
    """Every rank of a multi-rank database re-aggregated on the workers (reports written when out_dir is given)."""
    inputs = [RankInput(Path(source), r, "dlprof", True) for r in ranks]
    tasks = _tasks(inputs, options, out_dir, staging, reaggregate=True)
    run = runner(options)
    try:
        if isinstance(run, DaskRunner) and staging is not None:
            run.check_shared(staging.root)
        return list(_results_in_order(run, tasks))
    finally:
        if isinstance(run, DaskRunner):
            run.close()


def _append(db: Path, results: list[RankResult], started: float) -> tuple[int, object, list]:
    table, findings = _cross_rank(results)
    ranks = [dict(rank=r.rank, **r.aggregation) for r in results]
    aggr_id = database.append_rank_aggregations(
        db, ranks, time.perf_counter() - started, extra=lambda con, aggr: write_cross_rank(con, aggr, table, findings)
    )
    return aggr_id, table, findings


def reaggregate_database(source: Path, options: RunOptions, ranks: list[int]) -> int:
    """`dlprof --database=<multi-rank database>`: a new aggregation of every rank, with every output of a
    multi-rank run; the input is copied, never modified, unless the run's own folder is updated (--force)."""
    started = time.perf_counter()
    out_dir = prepare_output_dir(Path(options.output_path))
    run_outputs.updates_in_place(source, options)  # the input as output is refused without --force
    refuse_existing(planned_outputs(options, ranks), options.force)
    log.info(f"{source}: a multi-rank database (ranks {', '.join(map(str, ranks))}): re-aggregating every rank")
    staging = Staging(out_dir)
    try:
        results = _reaggregated(Path(source), options, ranks, out_dir, staging)
        for r in results:
            for final in r.finals:
                staging.path(Path(final))
        staged = staging.path(options.database_path)
        run_outputs.copy_database(Path(source), staged)
        aggr_id, table, findings = _append(staged, results, started)
        written = _write_run_outputs(options, out_dir, staging, results, table, findings, aggr_id)
        staging.commit(
            replacing=run_outputs.replaced_outputs(options)
        )  # --force was given (checked before) if any exists
    except BaseException:
        staging.discard()
        raise
    _print_run(options, results, table, findings, written, started)
    return 0


def reaggregate_in_place(db_path: Path, options: RunOptions, ranks: list[int]) -> int:
    """The viewer's Reaggregate of a multi-rank database: one new aggregation of every rank, appended in one
    transaction (the file is unchanged if any rank fails); returns its aggr_id."""
    started = time.perf_counter()
    results = _reaggregated(Path(db_path), options, ranks, None, None)
    return _append(Path(db_path), results, started)[0]
