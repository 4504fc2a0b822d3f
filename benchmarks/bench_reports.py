"""Report-stage benchmark: the reports of a generated 10^N-kernel profile written by this tree's writer and by
the writer of an earlier commit (back to back, same process, same aggregation), the line-assembly
alternatives measured on the per-launch iteration report, and the memory of streaming the iteration report.

    python benchmarks/bench_reports.py --kernels 1000000 [--baseline REF] [--formats csv,json] [--repeat 2]
    python benchmarks/bench_reports.py --memory-rows 100000 1000000 --skip-stage --skip-backends

The profile is the one of bench_engine.py (cached in --cache). The machine may be shared: compare the ratios
(measured back to back) and the CPU seconds (process time, all threads) rather than wall-clock seconds.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

ALL_REPORTS = ["summary", "detail", "iteration", "kernel", "tensor", "op_type", "group_node", "expert_systems"]
BRANCH_POINT = "b371e0f"  # the writer before reports were formatted per distinct value


def peak_rss_mb() -> float:
    """Peak resident memory of this process image (Linux VmHWM: unlike ru_maxrss, not inherited over exec
    from the parent that started it)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def timed(fn):
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn()
    return time.perf_counter() - wall, time.process_time() - cpu, result


def analyse(path: Path):
    """ingest -> correlate -> iterate -> aggregate -> detect, as the pipeline runs them."""
    from dlprof_profiler.engine import correlate as C
    from dlprof_profiler import log
    from dlprof_profiler import experts as expert_systems
    from dlprof_profiler.engine import iterate
    from dlprof_profiler.engine.aggregate import aggregate
    from dlprof_profiler.ingest.nsys import read_nsys_export

    log.set_verbosity(log.MINIMAL)
    trace = read_nsys_export(path)
    classified = C.classify_trace(trace, None)
    info, mode, family, _ = classified
    links = C.launch_links(trace)
    _gpu_api, thread_dev, process_dev = links
    inputs = iterate.trace_inputs(trace.ranges, info, family, thread_dev, process_dev, trace.profile_end)
    iterations = iterate.split_iterations(None, inputs)
    corr = C.correlate(trace, mode, iterations.boundaries, classified, links)
    aggs = {n: aggregate(trace, corr, dm, iterations, 0, iterations.count - 1) for n, dm in corr.domains.items()}
    findings = {n: expert_systems.detect(trace, corr, corr.domains[n], a, iterations) for n, a in aggs.items()}
    return trace, corr, aggs, findings


def load_writer(ref: str, folder: Path):
    """reports.py as it was at `ref`, imported under another name."""
    source = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{ref}:dlprof_profiler/outputs/reports.py"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "reports_at_ref.py").write_text(source, encoding="utf-8")
    spec = importlib.util.spec_from_file_location("reports_at_ref", folder / "reports_at_ref.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["reports_at_ref"] = module
    spec.loader.exec_module(module)
    return module


def write_all(module, analysis, out: Path, names: list[str], formats: list[str]) -> None:
    trace, corr, aggs, findings = analysis
    for domain, agg in aggs.items():
        for report in module.build_reports(names, agg, corr.domains[domain], trace, corr.config, findings[domain]):
            module.write_report(report, out, "bench", formats)


def same_output(old: Path, new: Path) -> tuple[bool, str]:
    """Byte-identical, or (JSON only) identical once the old writer's `],[` between its 100,000-row chunks
    is written `], [` as everywhere else."""
    a, b = old.read_bytes(), new.read_bytes()
    if a == b:
        return True, "identical"
    if old.suffix == ".json" and a.replace(b"],[", b"], [") == b:
        return True, "identical but the old ',' between 100,000-row chunks"
    return False, "DIFFERENT"


def stage(analysis, baseline: str, formats: list[str], repeat: int, work: Path) -> None:
    from dlprof_profiler.outputs import reports as current

    old = load_writer(baseline, work / "writer")
    runs = {"before": [], "after": []}
    for _ in range(repeat):
        for label, module in (("before", old), ("after", current)):
            out = work / label
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir(parents=True)
            wall, cpu, _ = timed(lambda m=module, o=out: write_all(m, analysis, o, ALL_REPORTS, formats))
            runs[label].append((wall, cpu))
    print(f"\nreport stage, --reports=all, formats {','.join(formats)} (best of {repeat}, back to back)")
    best = {k: (min(w for w, _ in v), min(c for _, c in v)) for k, v in runs.items()}
    for label in ("before", "after"):
        print(
            f"  {label:<8} ({baseline if label == 'before' else 'this tree'}): wall {best[label][0]:7.2f} s   "
            f"cpu {best[label][1]:7.2f} s"
        )
    print(
        f"  after / before: wall {best['after'][0] / best['before'][0]:.3f}   "
        f"cpu {best['after'][1] / best['before'][1]:.3f}"
    )
    for path in sorted((work / "before").iterdir()):
        _same, how = same_output(path, work / "after" / path.name)
        print(f"  {path.name:<32} {path.stat().st_size / 1e6:9.1f} MB  {how}")


# ---------------------------------------------------------------------------- line-assembly alternatives


def _iteration_report(analysis):
    from dlprof_profiler.outputs import reports

    trace, corr, aggs, _findings = analysis
    domain = next(iter(aggs))
    return reports.iteration_report(aggs[domain], corr.domains[domain].instances, corr.domains[domain].ops, trace.gpu)


def _formatted_cells(table, target: str):
    """Per chunk, the formatted cells of every column as Arrow strings (the common first step)."""
    from dlprof_profiler.outputs import report_format as rf

    formatter = rf._Formatter(target, table.bare)
    for chunk in table.iter_chunks():
        yield [rf._cells_as_array(formatter.column(chunk[c], f)) for c, f in zip(table.columns, table.formats)]


def backend_pyarrow(table, fh) -> None:
    from dlprof_profiler.outputs import report_format as rf

    writer = rf._ChunkWriter(fh, rf.CSV, table.bare)
    for chunk in table.iter_chunks():
        writer.write([chunk[c] for c in table.columns], table.formats)


def backend_pyarrow_unmerged(table, fh) -> None:
    from dlprof_profiler.outputs import report_format as rf

    writer = rf._ChunkWriter(fh, rf.CSV, table.bare)
    writer._merge = lambda cells, n: cells
    for chunk in table.iter_chunks():
        writer.write([chunk[c] for c in table.columns], table.formats)


def backend_polars(table, fh) -> None:
    import polars as pl

    for cells in _formatted_cells(table, "csv"):
        frame = pl.DataFrame({str(i): pl.from_arrow(c) for i, c in enumerate(cells)})
        frame.write_csv(fh, include_header=False, quote_style="never")


def backend_duckdb(table, fh) -> None:
    """DuckDB formats the numbers and quotes: FORCE_QUOTE for always-quoted text, missing text as `""` there
    and as nothing in bare columns, yes/no by CASE. Rows go to a side file appended after the COPY."""
    import duckdb
    import pyarrow as pa

    names = [f"c{i}" for i in range(len(table.columns))]

    def batches():
        for chunk in table.iter_chunks():
            arrays = []
            for c in table.columns:
                v = chunk[c]
                if isinstance(v, pa.DictionaryArray):
                    v = v.dictionary.take(v.indices)
                arrays.append(pa.array(v) if not isinstance(v, pa.Array) else v)
            yield pa.RecordBatch.from_arrays(arrays, names=names)

    it = batches()
    head = next(it)  # the schema comes from the first batch
    reader = pa.RecordBatchReader.from_batches(head.schema, _chain(head, it))  # noqa: F841 (read by DuckDB's SQL)
    select = []
    forced = []
    for name, fmt in zip(names, table.formats):
        if fmt == "q":
            select.append(f"coalesce({name}, '') AS {name}")
            forced.append(name)
        elif fmt == "t":
            select.append(f"nullif({name}, '') AS {name}")
        elif fmt == "y":
            select.append(f"CASE WHEN {name} THEN 'yes' ELSE 'no' END AS {name}")
        else:
            select.append(name)
    side = Path(fh.name).with_suffix(".duckdb.csv")
    con = duckdb.connect()
    con.execute(
        f"COPY (SELECT {', '.join(select)} FROM reader) TO '{side}' (HEADER false, FORCE_QUOTE ({', '.join(forced)}))"
    )
    with open(side, "rb") as rows:
        shutil.copyfileobj(rows, fh, 1 << 24)
    side.unlink()


def _chain(first, rest):
    yield first
    yield from rest


def backends(analysis, work: Path, repeat: int) -> None:
    from dlprof_profiler.outputs import report_format as rf

    candidates = {
        "pyarrow: distinct values once, merged columns, binary_join (chosen)": backend_pyarrow,
        "pyarrow: same, without merging adjacent coded columns": backend_pyarrow_unmerged,
        "polars write_csv (quote_style=never) of the formatted cells": backend_polars,
        "DuckDB COPY (FORCE_QUOTE) of the raw values": backend_duckdb,
    }
    report = _iteration_report(analysis)
    table = report.sections[0]
    results = {}
    reference = None
    for label, fn in candidates.items():
        best = None
        for _ in range(repeat):
            path = work / f"backend_{len(results)}.csv"
            with open(path, "wb") as fh:
                fh.write((table.title + "\n" + rf.header_line(table) + "\n").encode())
                wall, cpu, _ = timed(lambda f=fn, h=fh: f(table, h))
            best = (wall, cpu) if best is None else (min(best[0], wall), min(best[1], cpu))
        data = path.read_bytes()
        reference = reference if reference is not None else data
        results[label] = (best, data == reference)
        path.unlink()
    print(f"\niteration report lines (CSV, {table.title}), best of {repeat}")
    for label, ((wall, cpu), same) in results.items():
        print(f"  {label:<70} wall {wall:6.2f} s  cpu {cpu:6.2f} s  {'byte-identical' if same else 'NOT identical'}")


# ---------------------------------------------------------------------------- memory of streaming


def stream_synthetic(rows: int, out: Path, formats: list[str]) -> None:
    """Write a synthetic iteration report of `rows` launches from chunks made on the fly."""
    import pyarrow as pa

    from dlprof_profiler.outputs import report_format
    from dlprof_profiler.outputs import reports

    step = report_format.CHUNK_ROWS
    n_ops, n_kernels = 2000, 50
    dicts = reports.LaunchDictionaries(
        op_id=pa.array([f"OP_{i}" for i in range(n_ops)]),
        op_name=pa.array([f"/model/layer{i}/op" for i in range(n_ops)]),
        direction=pa.array(["fprop", "bprop"] * (n_ops // 2)),
        op_type=pa.array([f"type{i % 20}" for i in range(n_ops)]),
        kernel_name=pa.array([f"kernel_{i}" for i in range(n_kernels)]),
        long_kernel_name=pa.array(
            [f"void kernel_{i}<float, 128>(float const*, float*, int)" for i in range(n_kernels)]
        ),
        data_type=pa.array(["float32", "float16"]),
        input_shapes=pa.array(["<N:8, C:3, H:64, W:64>", "<8, 16>"]),
        parameters=pa.array([""]),
        output_shapes=pa.array(["<N:8, K:16, P:62, Q:62>"]),
    )

    def chunks():
        rng = np.random.default_rng(0)
        for lo in range(0, rows, step):
            m = min(step, rows - lo)
            index = np.arange(lo, lo + m, dtype=np.int64)
            yield {
                "iteration": index // 1000,
                "op_index": rng.integers(0, n_ops, m),
                "kernel_name": rng.integers(0, n_kernels, m),
                "long_kernel_name": rng.integers(0, n_kernels, m),
                "device_id": np.zeros(m, np.int64),
                "gpu_start": 10**12 + index * 10_000,
                "gpu_duration": rng.integers(1000, 90_000, m),
                "api_start": 10**12 + index * 10_000 - 5000,
                "api_duration": rng.integers(1000, 9000, m),
                "uses_tc": rng.random(m) < 0.3,
                "grid_x": rng.integers(1, 512, m),
                "grid_y": np.ones(m, np.int64),
                "grid_z": np.ones(m, np.int64),
                "block_x": np.full(m, 256),
                "block_y": np.ones(m, np.int64),
                "block_z": np.ones(m, np.int64),
                "data_type": rng.integers(0, 2, m),
                "input_shapes": rng.integers(-1, 2, m),
                "parameters": np.full(m, -1),
                "output_shapes": rng.integers(-1, 1, m),
            }

    report = reports.iteration_report_from_chunks(chunks, dicts)
    before = peak_rss_mb()  # imports and dictionaries
    wall, cpu, _ = timed(lambda: reports.write_report(report, out, "synthetic", formats))
    size = sum((out / f"synthetic_iteration.{f}").stat().st_size for f in formats)
    print(
        json.dumps(
            {
                "rows": rows,
                "peak_rss_before_write_mb": round(before),
                "peak_rss_mb": round(peak_rss_mb()),
                "arrow_pool_peak_mb": round(pa.default_memory_pool().max_memory() / 2**20),
                "wall_s": round(wall, 2),
                "cpu_s": round(cpu, 2),
                "output_mb": round(size / 1e6),
            }
        )
    )


def memory(rows_list: list[int], formats: list[str], work: Path) -> None:
    print(f"\nstreamed iteration report, synthetic launch chunks ({','.join(formats)}), one process per size")
    for rows in rows_list:
        out = work / f"stream_{rows}"
        out.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            [sys.executable, __file__, "--stream-rows", str(rows), "--formats", ",".join(formats), "--work", str(out)],
            check=True,
            capture_output=True,
            text=True,
        )
        r = json.loads(done.stdout.strip().splitlines()[-1])
        print(
            f"  {r['rows']:>10,} rows: output {r['output_mb']:6} MB, "
            f"peak RSS before writing {r['peak_rss_before_write_mb']} MB,"
            f" peak RSS {r['peak_rss_mb']} MB, Arrow pool peak {r['arrow_pool_peak_mb']} MB,"
            f" wall {r['wall_s']} s, cpu {r['cpu_s']} s"
        )
        shutil.rmtree(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kernels", type=int, default=1_000_000)
    parser.add_argument("--baseline", default=BRANCH_POINT, help="git ref of the writer to compare with")
    parser.add_argument("--formats", default="csv,json")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "dlprof-bench")
    parser.add_argument("--work", type=Path, default=None, help="output folder (default: a temporary one)")
    parser.add_argument("--skip-stage", action="store_true")
    parser.add_argument("--skip-backends", action="store_true")
    parser.add_argument("--memory-rows", type=int, nargs="*", default=[100_000, 1_000_000])
    parser.add_argument("--stream-rows", type=int, help=argparse.SUPPRESS)  # the memory child process
    args = parser.parse_args()
    formats = [f for f in args.formats.split(",") if f]
    work = args.work or Path(tempfile.mkdtemp(prefix="dlprof-bench-reports-"))
    if args.stream_rows:
        stream_synthetic(args.stream_rows, work, formats)
        return 0
    try:
        if not (args.skip_stage and args.skip_backends):
            from bench_engine import generate

            args.cache.mkdir(parents=True, exist_ok=True)
            path = args.cache / f"bench_{args.kernels}.sqlite"
            if not path.exists():
                generate(path, args.kernels)
            wall, cpu, analysis = timed(lambda: analyse(path))
            print(
                f"{args.kernels:,} kernels: engine up to the reports {wall:.1f} s (cpu {cpu:.1f} s), "
                f"peak RSS {peak_rss_mb():.0f} MB"
            )
            if not args.skip_stage:
                stage(analysis, args.baseline, formats, args.repeat, work / "stage")
            if not args.skip_backends:
                backends(analysis, work, args.repeat)
            del analysis
        if args.memory_rows:
            memory(args.memory_rows, formats, work)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
