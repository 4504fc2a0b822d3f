"""The one analysis sequence every run goes through: read the source, start its new database, analyse it (in
memory, or out of core for a large nsys export: engine_choice.py), and hand back the trace, the analysis, the
profile's facts and the database being written. A single profile, a rank worker and the baseline call it; what
differs between them is a `Sink`: where the database goes (none for the baseline) and what is said on the way.
The outputs are written inside `with analysed(...)`: an out-of-core store is read until its database is done."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from dlprof_profiler import log
from dlprof_profiler.db import writer as database
from dlprof_profiler.engine import correlate as corr_mod
from dlprof_profiler.engine.analysis import Analysis, analyze, analyze_store
from dlprof_profiler.errors import DLProfError, no_room_reason
from dlprof_profiler.ingest import formats as ingest
from dlprof_profiler.ingest.sanitize import sanitize_trace
from dlprof_profiler.options import RunOptions
from dlprof_profiler.outputs.publish import signals_held
from dlprof_profiler.run import engine_choice
from dlprof_profiler.run import outputs
from dlprof_profiler.store.model import DatabaseFeed
from dlprof_profiler.process_memory import (
    avoid_huge_pages,
    freed_memory_kept,
    release_unused_memory,
    reuse_freed_memory,
)
from dlprof_profiler.store.trace_store import TraceStore


class Sink:
    """Where an analysis's new database goes (this base: nowhere, as for the baseline) and what the run says
    while reading. Subclasses writing a database override `open`, `discard` and `store_folder`."""

    writes_database = False
    announce = False  # log the counts of what was read
    owners_by_segment = True  # out of core: write each segment's activity owners once it is correlated
    writer = None  # the database writer `open` started (kept here, see `discard`)

    def reading(self, source: Path, out_of_core: bool):
        """The progress stage around reading the source."""
        return log.stage(f"Reading {source}")

    def warn(self, text: str) -> None:
        log.warning(text)

    def open(self, trace, domain_names: list, events: int | None = None):
        """The database writer for `trace`, its NVTX domains in the order `domain_names`; `events`: how many
        ranges, calls and activities the trace holds (None: not counted, staged out of core)."""
        return None

    def discard(self) -> None:
        """The analysis or its outputs failed: stop the writer this sink opened (if any) and drop what was
        staged. The sink keeps its writer itself: an interrupt can come after the writer started and before
        `open` returned it, and its thread must stop before the staged files go."""

    def store_folder(self) -> Path:
        """An empty folder to stage an out-of-core store in."""
        raise NotImplementedError

    def output_folder(self) -> Path:
        """The folder a user frees room in when the store does not fit."""
        raise NotImplementedError


@dataclass
class Analysed:
    """What `analysed` hands over: `database.start()` then `.finish()` -> (domain ids, op index maps) complete
    the new database (None without one)."""

    trace: object
    result: Analysis
    profile: dict
    database: object


class InMemoryDatabase:
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


def analysed(source: Path, options: RunOptions, sink: Sink, capture: dict | None = None):
    """Analyse `source` (an nsys export or Kineto trace) with `options`, feeding `sink`'s database as it goes;
    a context manager yielding an `Analysed`, inside which the outputs are written."""
    if sink.writes_database and engine_choice.out_of_core(source, options):
        return _out_of_core(source, options, sink, capture)
    return _in_memory(source, options, sink, capture)


def _stamp_capture(trace, capture: dict | None) -> None:
    """Record the nsys that captured the trace, with its build suffix (the export's metadata lacks it)."""
    if capture and capture.get("nsys_build"):
        trace.meta["nsys_build"] = capture["nsys_build"]


@contextmanager
def _in_memory(source: Path, options: RunOptions, sink: Sink, capture: dict | None):
    if sink.writes_database:
        avoid_huge_pages()  # its large short-lived arrays fault in faster as ordinary pages (process_memory.py)
        reuse_freed_memory()  # and fault in once, not again after every free (process_memory.py)
    writer = None
    try:
        with sink.reading(source, False):
            trace = sanitize_trace(ingest.read_trace(source))  # the one place rows of impossible times are dropped
        if sink.announce:
            kineto = trace.meta.get("source_format") == "kineto"
            log.info(
                f"  {len(trace.ranges):,} {'op and annotation' if kineto else 'NVTX'} ranges, "
                f"{len(trace.api_calls):,} CUDA API calls, {len(trace.gpu):,} GPU activities, "
                f"{len(trace.devices)} GPUs; "
                f"{'Kineto trace (torch.profiler)' if kineto else 'nsys ' + str(trace.meta.get('nsys_version'))}"
            )
        for text in trace.warnings:
            sink.warn(text)
        _stamp_capture(trace, capture)
        with signals_held():  # an interrupt waits until the sink holds the writer it must stop (`discard`)
            events = len(trace.ranges) + len(trace.api_calls) + len(trace.gpu)
            writer = sink.open(trace, corr_mod.domain_order(trace, options.mode), events)
        on_correlated = on_owned = None
        if writer is not None:
            writer.add_raw(trace)  # written on the writer's thread while the analysis goes on
            on_owned = lambda gpu_api, owners: database.write_owners(writer, trace, gpu_api, owners)  # noqa: E731
            on_correlated = lambda corr: database.write_correlation(writer, trace, corr)  # noqa: E731
        # a profile the engine choice bounds in size keeps what it frees for reuse (process_memory.py)
        with freed_memory_kept(sink.writes_database and engine_choice.size_bounded(source, options)):
            result = analyze(
                trace,
                options.analysis_config(),
                str(source),
                on_correlated=on_correlated,
                handed_over=True,
                on_owned=on_owned,
            )
            profile = outputs.profile_info(options, source, trace, result.corr, capture)
            new_database = None if writer is None else InMemoryDatabase(writer, result, profile)
            yield Analysed(trace, result, profile, new_database)
    except BaseException:
        sink.discard()
        raise


@contextmanager
def _out_of_core(source: Path, options: RunOptions, sink: Sink, capture: dict | None):
    """The export staged in a DuckDB store in the sink's folder (removed at the end) and analysed, written and
    reported a segment or chunk at a time."""
    store = writer = feed = None
    try:
        store = TraceStore(source, sink.store_folder())

        def start_database(trace):
            # the raw facts are written from the store while the rest is staged and analysed (as the in-memory
            # path writes them while it analyses)
            nonlocal writer, feed
            _stamp_capture(trace, capture)
            with signals_held():  # (as in memory)
                writer = sink.open(trace, store.domain_order(options.mode))
            feed = DatabaseFeed(writer, store)
            feed.raw_ranges()

        def staged(trace):
            if sink.announce:
                log.info(
                    f"  {store.counts['ranges']:,} NVTX ranges, {store.counts['api']:,} CUDA API calls, "
                    f"{store.counts['gpu']:,} GPU activities, {len(trace.devices)} GPUs; "
                    f"nsys {trace.meta.get('nsys_version')}"
                )
            for text in trace.warnings:
                sink.warn(text)

        store.on_staged = staged
        with sink.reading(source, True):
            trace = store.load(on_read=start_database)
        feed.raw_calls()  # (written once staged: the ranges are classified meanwhile)
        # the op model is written once complete (while the analysis aggregates: the writer is the last to finish),
        # and each segment's GPU activity owners once it is correlated where the sink wants them so
        hooks = {"on_segment": feed.owners} if sink.owners_by_segment else {}
        # what reading the export freed goes back (its threads' arenas); from here on glibc's heap is kept: the
        # classification (while a thread still stages the API calls and GPU activities: its last release keeps
        # the heap too), then one segment or chunk of about the same shape after another (process_memory.py)
        release_unused_memory()
        reuse_freed_memory()
        with freed_memory_kept():
            result = analyze_store(store, options.analysis_config(), str(source), on_correlated=feed.model, **hooks)
        profile = outputs.profile_info(
            options, source, trace, result.corr, capture, store.profile_start, store.profile_end
        )
        feed.set_final(result.primary, profile)
        yield Analysed(trace, result, profile, feed)
    except BaseException as exc:
        if feed is not None:
            feed.cancel()
        sink.discard()
        no_room = None if isinstance(exc, DLProfError) else no_room_reason(exc)
        if no_room:  # Arrow and DuckDB name no file: the folder is what the user can act on
            raise DLProfError(
                f"{sink.output_folder()}: {no_room[0]} while the export was staged out of core in this folder; "
                f"{no_room[1]}, or analyse in memory (--out_of_core=off)"
            ) from None
        raise
    finally:
        if feed is not None:
            feed.cancel()  # (no-op once the model was fed)
            feed.join()  # the feeding thread reads the store: it stops once the writer is closed
        if store is not None:
            store.close()
