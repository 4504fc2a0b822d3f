"""What the memory report costs: `dlprof --database --reports=summary,memory` on bench_engine's generated export
with and without CUDA memory events (CUDA_GPU_MEMORY_USAGE_EVENTS, as `nsys profile --cuda-memory-usage=true`
records them), side by side on the same machine.

    python benchmarks/bench_memory.py --kernels 1000000 --every 10 [--out_of_core on]

Every `--every`-th kernel slot gets a memory event linked to its launch call (same process and correlation id,
as the allocations of cudaMalloc are), on GPU 0 and GPU 1 in turn; on each GPU an allocation of 1 MiB and its
free alternate. It prints
wall seconds, peak RSS and the aggregation stage of both runs, and their ratios.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sqlite3
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_engine import generate_apart, run_measured  # noqa: E402

MEMORY_TABLE = """CREATE TABLE CUDA_GPU_MEMORY_USAGE_EVENTS (start INTEGER NOT NULL, globalPid INTEGER NOT NULL,
    deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, address INTEGER NOT NULL, pc INTEGER NOT NULL,
    bytes INTEGER NOT NULL, memKind INTEGER NOT NULL, memoryOperationType INTEGER NOT NULL, name TEXT,
    correlationId INTEGER)"""


def with_memory_events(base: Path, path: Path, every: int) -> int:
    """A copy of the export with a memory event per `every`-th launch call; returns how many."""
    shutil.copyfile(base, path)
    con = sqlite3.connect(path)
    try:
        con.execute(MEMORY_TABLE)
        con.execute(
            "INSERT INTO CUDA_GPU_MEMORY_USAGE_EVENTS SELECT start + 500, globalTid & ~16777215, "
            "((correlationId - 1) / ?) % 2, 1, 4096 * ((correlationId - 1) / (4 * ?)), 0, 1048576, 2, "
            "((correlationId - 1) / (2 * ?)) % 2, NULL, correlationId FROM CUPTI_ACTIVITY_KIND_RUNTIME "
            "WHERE (correlationId - 1) % ? = 0",
            (every, every, every, every),
        )
        con.commit()
        return con.execute("SELECT count(*) FROM CUDA_GPU_MEMORY_USAGE_EVENTS").fetchone()[0]
    finally:
        con.close()


def stage_seconds(log: str, stage: str) -> float | None:
    match = re.search(rf"{re.escape(stage)} done in ([\d.]+) s", log)
    return float(match.group(1)) if match else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kernels", type=int, default=1_000_000)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--out_of_core", default="auto")
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()))
    args = parser.parse_args()
    base = args.cache / f"dlprof_bench_{args.kernels}.sqlite"
    if not base.exists():
        generate_apart(base, args.kernels)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        events = with_memory_events(base, tmp / "with_memory.sqlite", args.every)
        results = {}
        for name, export in (("without", base), ("with", tmp / "with_memory.sqlite")):
            out = tmp / f"out_{name}"
            wall, rss, log, code = run_measured(
                [sys.executable, "-m", "dlprof_profiler", f"--database={export}", "--reports=summary,memory"]
                + [f"--output_path={out}", f"--out_of_core={args.out_of_core}"]
            )
            if code != 0:
                print(log)
                return code
            results[name] = (wall, rss, stage_seconds(log, "Aggregating"))
            if name == "with":
                print((out / "dlprof_memory.csv").read_text().split("\n\n")[0])
    print(f"{args.kernels:,} kernels, {events:,} memory events (out_of_core={args.out_of_core})")
    for name, (wall, rss, agg) in results.items():
        print(f"  {name:8s} memory events: {wall:6.1f} s, peak {rss / 1024:.2f} GB, aggregating {agg} s")
    (w0, r0, a0), (w1, r1, a1) = results["without"], results["with"]
    print(f"  ratio with/without: wall {w1 / w0:.2f}, peak memory {r1 / r0:.2f}, aggregating {a1 / a0:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
