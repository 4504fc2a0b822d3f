"""DLProf database writer benchmark: size of the database against the input export, time of the writer
(its own thread and what the analysis thread waits for) and its memory, on the synthetic N-kernel profile.

    python benchmarks/bench_database.py [--kernels 1000000] [--cache DIR]

Two runs on the same trace and correlation: `alone` (add_raw, the op model and finish back to back: the
writer's whole cost) and `overlapped` (add_raw right after ingest, the op model after correlation, finish
after aggregation, as the pipeline calls them: what the analysis thread still waits for). The export is
benchmarks/bench_engine.generate's, cached in --cache. Sizes are also given per table (SQLite's dbstat).
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


class PeakRss:
    """Highest resident memory seen while the block runs (sampled every 20 ms)."""

    def __enter__(self):
        self.start = self.peak = rss_mb()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self):
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, rss_mb())

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_mb())


def table_sizes(path: Path) -> list[tuple[str, float]]:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return [
            (n, s / 1e6)
            for n, s in con.execute("SELECT name, sum(pgsize) FROM dbstat GROUP BY name ORDER BY 2 DESC LIMIT 12")
        ]
    finally:
        con.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kernels", type=int, default=1_000_000)
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "dlprof-bench")
    args = parser.parse_args()
    args.cache.mkdir(parents=True, exist_ok=True)
    export = args.cache / f"bench_{args.kernels}.sqlite"
    if not export.exists():
        from benchmarks.bench_engine import generate

        generate(export, args.kernels)
    from dlprof_profiler.engine import correlate as C
    from dlprof_profiler import log
    from dlprof_profiler.db import writer as database
    from dlprof_profiler.engine import iterate
    from dlprof_profiler.engine.aggregate import aggregate
    from dlprof_profiler.ingest.nsys import read_nsys_export

    log.set_verbosity(log.MINIMAL)
    out = Path(tempfile.mkdtemp(prefix="dlprof-bench-db-"))

    trace = read_nsys_export(export)
    ids = database.domain_ids_for(C.domain_order(trace, None))

    def analyse():
        classified = C.classify_trace(trace, None)
        info, mode, family, _ = classified
        links = C.launch_links(trace)
        inputs = iterate.trace_inputs(trace.ranges, info, family, links[1], links[2], trace.profile_end)
        iterations = iterate.split_iterations(None, inputs)
        return mode, iterations, C.correlate(trace, mode, iterations.boundaries, classified, links)

    # the writer alone
    mode, iterations, corr = analyse()
    profile = {"profile_name": "bench", "mode": mode, "profile_end": trace.profile_end}
    path = out / "alone.sqlite"
    with PeakRss() as mem:
        started = time.perf_counter()
        writer = database.DatabaseWriter(path, database.Header.from_trace(trace, ids))
        writer.add_raw(trace)
        database.finish_analysis(writer, trace, corr, "default", profile)
        alone = time.perf_counter() - started
    stats_alone = dict(writer.stats)
    del writer, corr

    # overlapped with the analysis, as the pipeline runs it
    path2 = out / "overlapped.sqlite"
    fg = 0.0
    started = time.perf_counter()
    t = time.perf_counter()
    writer = database.DatabaseWriter(path2, database.Header.from_trace(trace, ids))
    writer.add_raw(trace)
    fg += time.perf_counter() - t
    mode, iterations, corr = analyse()
    t = time.perf_counter()
    database.write_correlation(writer, trace, corr)
    fg += time.perf_counter() - t
    aggs = {n: aggregate(trace, corr, dm, iterations, 0, iterations.count - 1) for n, dm in corr.domains.items()}
    t = time.perf_counter()
    domain_ids = database.finish_analysis(writer, trace, corr, "default", profile)
    finish_wait = time.perf_counter() - t
    fg += finish_wait
    t = time.perf_counter()
    database.append_aggregation(path2, aggs, domain_ids, writer.op_index_maps(), iterations)
    append = time.perf_counter() - t
    total = time.perf_counter() - started

    size, source = path2.stat().st_size, export.stat().st_size
    print(
        f"\n{args.kernels:,} kernels: input {source / 1e6:.1f} MB, database {size / 1e6:.1f} MB "
        f"= {size / source:.2f}x the input"
    )
    st = stats_alone
    print(
        f"writer alone: {alone:.1f} s wall; its thread busy {st['seconds_busy']:.1f} s, CPU: encoding "
        f"{st['encode_cpu']:.1f} s, inserting (in-order indexes included) {st['insert_cpu']:.1f} s ({st['rows']:,} "
        f"rows), final index {st['index_cpu']:.1f} s; peak memory +{mem.peak - mem.start:.0f} MB over the trace "
        f"({mem.start:.0f} MB before)"
    )
    print(
        f"overlapped: analysis thread waited {fg:.1f} s in the writer's calls (finish {finish_wait:.1f} s); "
        f"append_aggregation {append:.1f} s; run {total:.1f} s"
    )
    print("largest tables and indexes (MB):")
    for name, mb in table_sizes(path2):
        print(f"  {name:<40}{mb:>8.1f}")
    for p in (path, path2):
        p.unlink()
    out.rmdir()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
