"""Engine benchmark: generate an nsys export with N kernels, run every stage, print seconds and peak
memory per stage and the ratio to a bare SQLite scan of the columns the engine reads.

    python benchmarks/bench_engine.py --kernels 1000000 [--reports all] [--keep DIR]

The generated profile looks like a PyTorch emit_nvtx capture: per kernel an `aten::` op range holding a
nested ATen range and one cudaLaunchKernel, plus one op without GPU work; iterations end with an
`Optimizer.step#SGD.step` range. It is cached in --cache (default: the system temp folder).
"""
from __future__ import annotations

import argparse
import resource
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.nsys_builder import NsysExport  # noqa: E402

KERNELS_PER_ITERATION = 1000
OP_NAMES = ["aten::conv2d", "aten::addmm", "aten::relu", "aten::add", "aten::mul", "aten::mm", "aten::sum"]
KERNEL_NAMES = ["volta_fp16_s884cudnn_fp16_128x128_ldg8_relu_f2f_exp_small_nhwc_tn_v1",
                "sm80_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize128x128x32_stage4_warpsize2x2x1_tensor16x8x16",
                "vectorized_elementwise_kernel", "elementwise_kernel", "reduce_kernel", "volta_sgemm_32x32_sliced1x4_tn",
                "implicit_convolve_sgemm"]


def generate(path: Path, n_kernels: int, seed: int = 0) -> Path:
    """Write a synthetic export with n_kernels kernels (all vectorized)."""
    rng = np.random.default_rng(seed)
    exp = NsysExport(schema="2022.4")
    exp.add_gpu(device_id=0)
    tid = exp.add_thread(pid=4242, tid=4242, name="python", process_name="python")
    n = n_kernels
    # Time layout per kernel slot (ns): outer op [t, t+9000), inner op [t+1000, t+8000),
    # launch [t+2000, t+6000), a kernel-less op [t+9100, t+9600); slots 10 us apart; optimizer step
    # ranges of 5 us after every KERNELS_PER_ITERATION slots.
    slot = np.arange(n, dtype=np.int64)
    iteration = slot // KERNELS_PER_ITERATION
    t = 1_000_000 + slot * 10_000 + iteration * 20_000
    op = rng.integers(0, len(OP_NAMES), n)
    seq = slot
    op_names = np.array(OP_NAMES, dtype=object)[op]
    outer_text = op_names + ", seq = " + seq.astype(str).astype(object) + ", op_id = " + (3 * slot).astype(str).astype(object)
    inner_text = "aten::_inner_impl, op_id = " + (3 * slot + 1).astype(str).astype(object)
    empty_text = "aten::empty, op_id = " + (3 * slot + 2).astype(str).astype(object)
    n_iter = int(iteration.max()) + 1
    step_start = 1_000_000 + ((np.arange(n_iter) + 1) * KERNELS_PER_ITERATION) * 10_000 + np.arange(n_iter) * 20_000
    step_start = step_start.astype(np.int64)
    starts = np.concatenate([t, t + 1000, t + 9100, step_start])
    ends = np.concatenate([t + 9000, t + 8000, t + 9600, step_start + 5000])
    texts = np.concatenate([outer_text, inner_text, empty_text,
                            np.full(n_iter, "Optimizer.step#SGD.step, op_id = 0", dtype=object)])
    exp.push_pop_many(np.full(starts.size, tid), starts, ends, texts)
    corr = slot + 1
    exp.runtime_many(np.full(n, tid), t + 2000, t + 6000, np.full(n, "cudaLaunchKernel_v7000", dtype=object), corr)
    kernel = rng.integers(0, len(KERNEL_NAMES), n)
    gpu_start = t + 5000 + rng.integers(0, 3000, n)
    gpu_end = gpu_start + 2000 + rng.integers(0, 6000, n)
    exp.kernels_many(np.full(n, 4242), corr, gpu_start, gpu_end, np.array(KERNEL_NAMES, dtype=object)[kernel],
                     np.zeros(n, dtype=np.int64), np.full(n, 7, dtype=np.int64))
    return exp.write(path)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


SCAN_QUERIES = [
    "SELECT rowid, eventType, start, end, globalTid, domainId, textId, text FROM NVTX_EVENTS",
    "SELECT start, end, globalTid, correlationId, nameId, eventClass, returnValue FROM CUPTI_ACTIVITY_KIND_RUNTIME",
    "SELECT rowid, start, end, deviceId, streamId, contextId, globalPid, correlationId, gridX, gridY, gridZ, blockX, "
    "blockY, blockZ, registersPerThread, staticSharedMemory, dynamicSharedMemory, graphNodeId, shortName, "
    "demangledName FROM CUPTI_ACTIVITY_KIND_KERNEL",
]


def bare_scan(path: Path) -> float:
    """Seconds to read, with Python's sqlite3 module, the columns the engine reads."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    started = time.perf_counter()
    for sql in SCAN_QUERIES:
        cursor = con.execute(sql)
        while cursor.fetchmany(262_144):
            pass
    con.close()
    return time.perf_counter() - started


def run(path: Path, out_dir: Path, report_list: list[str]) -> list[tuple[str, float, float]]:
    from dlprof_profiler import correlate as C
    from dlprof_profiler import database, log, reports
    from dlprof_profiler.analysis import AnalysisConfig, analyze
    from dlprof_profiler.ingest_nsys import read_nsys_export
    from dlprof_profiler.sanitize import sanitize_trace
    log.set_verbosity(log.MINIMAL)
    stages = []

    def timed(name, fn):
        started = time.perf_counter()
        result = fn()
        stages.append((name, time.perf_counter() - started, peak_rss_mb()))
        return result
    trace = timed("ingest", lambda: read_nsys_export(path))
    trace = timed("sanitize", lambda: sanitize_trace(trace))
    db = out_dir / "bench_dldb.sqlite"
    db.unlink(missing_ok=True)
    # as the pipeline does: the raw tables are written on a background thread while the analysis runs
    writer = database.DatabaseWriter(db, trace, database.domain_ids_for(C.domain_order(trace, None))).start()
    result = timed("analyze (correlate, iterate, aggregate, detect)", lambda: analyze(trace, AnalysisConfig()))
    for name, seconds in result.timings.items():
        print(f"  {name}: {seconds:.2f} s")

    def write_db():
        ids = writer.finish(result.corr, result.primary, {"profile_name": "bench", "mode": result.mode})
        database.append_aggregation(db, result.aggregations, ids, database.op_index_offsets(result.corr),
                                    result.iterations, result.findings)
    timed("write database (after the background raw copy)", write_db)

    def write_reports():
        for name, agg in result.aggregations.items():
            for rep in reports.build_reports(report_list, agg, result.corr.domains[name], trace, result.corr.config,
                                             result.findings[name]):
                reports.write_report(rep, out_dir, "bench", ["csv"])
    timed(f"write reports ({','.join(report_list)})", write_reports)
    return stages


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kernels", type=int, default=100_000)
    parser.add_argument("--reports", default="summary,detail,kernel,tensor,op_type,group_node,expert_systems",
                        help="reports to write (the per-launch iteration report is the largest)")
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "dlprof-bench")
    args = parser.parse_args()
    args.cache.mkdir(parents=True, exist_ok=True)
    path = args.cache / f"bench_{args.kernels}.sqlite"
    if not path.exists():
        started = time.perf_counter()
        generate(path, args.kernels)
        print(f"generated {path} ({path.stat().st_size / 1e6:.0f} MB) in {time.perf_counter() - started:.1f} s")
    scan = bare_scan(path)
    report_list = [r.strip() for r in args.reports.split(",") if r.strip()]
    if "all" in report_list:
        from dlprof_profiler.cli import REPORT_NAMES
        report_list = [r for r in REPORT_NAMES if r != "all"]
    out_dir = args.cache / f"out_{args.kernels}"
    out_dir.mkdir(exist_ok=True)
    stages = run(path, out_dir, report_list)
    total = sum(s for _, s, _ in stages)
    print(f"\n{args.kernels:,} kernels; bare SQLite scan of the columns read: {scan:.2f} s")
    print(f"{'stage':<60}{'seconds':>10}{'peak RSS MB':>14}")
    for name, seconds, rss in stages:
        print(f"{name:<60}{seconds:>10.2f}{rss:>14.0f}")
    print(f"{'total':<60}{total:>10.2f}{max(r for _, _, r in stages):>14.0f}")
    print(f"ratio total / bare scan: {total / scan:.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
