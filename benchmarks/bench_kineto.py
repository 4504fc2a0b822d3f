"""Kineto ingest benchmark: a generated torch.profiler trace of N events (10^6 by default, ~350 MB of JSON in
Kineto's own layout), read by plain `json.load` and by dlprof, side by side, each in a fresh process, the
readers taking turns (so the load of a shared machine weighs on each alike); prints seconds (wall and CPU),
peak memory (max RSS), the ratios to json.load and the machine's load average.

    python benchmarks/bench_kineto.py [--events 1000000] [--repeat 3] [--gzip] [--no-end-to-end] [--like TRACE]
                                      [--no-reference]

Measured: `json.load` of the file (the reference), dlprof's ingest (file -> trace frames, what the engine
consumes: `read_kineto_trace`), and `dlprof --database=FILE` end to end (ingest, correlation,
iterations, aggregation, expert systems, database, default reports). The trace is cached in --cache.
`--no-reference` leaves `json.load` out: at 10^7 events (3.3 GB of JSON) it needs about 19 GB; the targets
there are absolute (end to end in at most 60 s and 2.5 GB), those at 10^6 a ratio (at most 0.5x json.load).

The generated training loop looks like the real traces in tests/data/kineto: per op block three
nested cpu_ops (the outer one with Sequence number, Input Dims/type/strides, Concrete Inputs), a kernel
launch (cuda_runtime + kernel + ac2g flow arrows) and a runtime call without GPU work; half of the blocks
are backward nodes on the autograd thread; every 1000 blocks a ProfilerStep#N and an optimizer step.
`--like TRACE` measures copies of a real trace instead (e.g. tests/data/kineto/pytorch_8xa100_rank3.json.gz,
whose events are a third flow arrows and carry fewer arguments).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EVENTS_PER_BLOCK = 8
BLOCKS_PER_STEP = 1000
OPS = [
    ("aten::linear", "aten::addmm", "[[64, 1024], [4096, 1024], [4096]]"),
    ("aten::conv2d", "aten::convolution", "[[32, 64, 56, 56], [64, 64, 3, 3], [64]]"),
    ("aten::layer_norm", "aten::native_layer_norm", "[[64, 1024], [1024], [1024]]"),
    ("aten::gelu", "aten::gelu", "[[64, 4096]]"),
]
KERNELS = [
    "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>"
    "(cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4::Params)",
    "void cudnn::engines_precompiled::nchwToNhwcKernel<float, float, float, false, true, "
    "(cudnnKernelDataType_t)2>(cudnn::engines_precompiled::nchw2nhwc_params_t<float>, float const*, float*)",
    "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float>(int, float, float "
    "const*, float const*, float const*, float*, float*, float*)",
    "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, "
    "at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#2}::operator()() const::{lambda(float)"
    "#1}, at::detail::Array<char*, 2> >(int, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, "
    "at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#2}::operator()() const::{lambda(float)"
    "#1}, at::detail::Array<char*, 2>)",
]
PID, MAIN, GRAD = 3113936, 3113936, 3126441
BASE_NS = 1_700_000_000_000_000_000


def us(ns: int) -> str:
    return f"{ns // 1000}.{ns % 1000:03d}"


def _x(cat, name, pid, tid, ts, dur, args) -> str:
    return (
        f'  {{\n    "ph": "X", "cat": "{cat}", "name": {json.dumps(name)}, "pid": {pid}, "tid": {tid},\n'
        f'    "ts": {us(ts)}, "dur": {us(dur)},\n    "args": {{\n      {args}\n    }}\n  }}'
    )


def _flow(ph, pid, tid, ts, ident) -> str:
    end = ', "bp": "e"' if ph == "f" else ""
    return (
        f'  {{\n    "ph": "{ph}", "id": {ident}, "pid": {pid}, "tid": {tid},\n    "ts": {us(ts)},\n'
        f'    "cat": "ac2g", "name": "ac2g"{end}\n  }}'
    )


def generate(path: Path, n_events: int) -> Path:
    """Write the trace (Kineto's layout, one event after the other, never all in memory)."""
    blocks = max(n_events // EVENTS_PER_BLOCK, 1)
    tmp = path.with_suffix(".partial")
    with open(tmp, "w") as out:
        out.write(
            '{\n  "schemaVersion": 1,\n  "deviceProperties": [{"id": 0, "name": "NVIDIA A100-SXM4-40GB", '
            '"totalGlobalMem": 42505273344, "computeMajor": 8, "computeMinor": 0, "numSms": 108}],\n'
            '  "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1},\n'
            f'  "displayTimeUnit": "ms",\n  "baseTimeNanoseconds": {BASE_NS},\n  "traceEvents": [\n'
        )
        events = []
        t = 1_000_000_007
        ext = corr = 1
        for b in range(blocks):
            if b % BLOCKS_PER_STEP == 0:
                step = b // BLOCKS_PER_STEP
                events.append(
                    _x(
                        "user_annotation",
                        f"ProfilerStep#{step}",
                        PID,
                        MAIN,
                        t,
                        BLOCKS_PER_STEP * 20_011,
                        f'"External id": {ext}, "Record function id": 0, "Ev Idx": {ext}',
                    )
                )
                ext += 1
            outer, inner, dims = OPS[b % len(OPS)]
            backward = (b // 50) % 2 == 1
            tid = GRAD if backward else MAIN
            seq = b // 2
            name = f"autograd::engine::evaluate_function: {outer[6:].capitalize()}Backward0" if backward else outer
            events.append(
                _x(
                    "cpu_op",
                    name,
                    PID,
                    tid,
                    t + 100,
                    15_003,
                    f'"External id": {ext},"Record function id": 0, "Sequence number": {seq}, '
                    f'"Fwd thread id": {1 if backward else 0}, "Concrete Inputs": ["", "", ""], '
                    f'"Input type": ["float", "float", "float"], "Input Strides": [[1024, 1], [1024, 1], '
                    f'[1]], "Input Dims": {dims}, "Ev Idx": {ext}',
                )
            )
            events.append(
                _x(
                    "cpu_op",
                    inner,
                    PID,
                    tid,
                    t + 1_100,
                    13_001,
                    f'"External id": {ext + 1},"Record function id": 0, "Concrete Inputs": ["", ""], '
                    f'"Input type": ["float", "float"], "Input Strides": [[1024, 1], [1]], '
                    f'"Input Dims": {dims}, "Ev Idx": {ext + 1}',
                )
            )
            events.append(
                _x(
                    "cpu_op",
                    "aten::empty",
                    PID,
                    tid,
                    t + 2_100,
                    505,
                    f'"External id": {ext + 2},"Record function id": 0, "Concrete Inputs": ["[64, 4096]", '
                    f'"6", "0", "", "False", ""], "Input type": ["ScalarList", "Scalar", "Scalar", "", '
                    f'"Scalar", ""], "Input Strides": [[], [], [], [], [], []], "Input Dims": [[], [], [], '
                    f'[], [], []], "Ev Idx": {ext + 2}',
                )
            )
            events.append(
                _x(
                    "cuda_runtime",
                    "cudaLaunchKernel",
                    PID,
                    tid,
                    t + 3_000,
                    4_013,
                    f'"External id": {ext + 1}, "cbid": 211, "correlation": {corr}',
                )
            )
            events.append(_flow("s", PID, tid, t + 3_000, corr))
            k_start = t + 6_000 + (b * 37) % 3000
            events.append(
                _x(
                    "kernel",
                    KERNELS[b % len(KERNELS)],
                    0,
                    7,
                    k_start,
                    4_000 + (b * 53) % 6000,
                    f'"External id": {ext + 1}, "queued": 0, "device": 0, "context": 1, "stream": 7, '
                    f'"correlation": {corr}, "registers per thread": 90, "shared memory": 49152, '
                    f'"blocks per SM": 0.5925926, "warps per SM": 2.3703704, "grid": [64, 1, 1], '
                    f'"block": [128, 1, 1], "est. achieved occupancy %": 4',
                )
            )
            events.append(_flow("f", 0, 7, k_start, corr))
            events.append(
                _x(
                    "cuda_runtime",
                    "cudaStreamIsCapturing",
                    PID,
                    tid,
                    t + 16_000,
                    1_002,
                    f'"External id": {ext + 2}, "cbid": 317, "correlation": {corr + 1}',
                )
            )
            ext += 3
            corr += 2
            t += 20_011
            if len(events) >= 50_000:
                out.write(",\n".join(events) + ",\n")
                events = []
        events.append(
            _x(
                "Trace",
                "PyTorch Profiler (0)",
                '"Spans"',
                '"PyTorch Profiler"',
                1_000_000_000,
                t - 1_000_000_000,
                '"Op count": 0',
            )
        )
        out.write(",\n".join(events) + "\n  ]\n}\n")
    os.replace(tmp, path)
    return path


def replicate(source: Path, path: Path, n_events: int) -> Path:
    """Write a trace of about n_events made of copies of a real one (e.g. a fixture): each copy shifted in
    time after the previous one, with its own correlation, External id, flow and Sequence numbers and
    ProfilerStep numbers; metadata events once. Numbers are written as the source's exact decimals."""
    import gzip
    from decimal import Decimal

    raw = source.read_bytes()
    doc = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw, parse_float=Decimal)
    events = doc.pop("traceEvents")
    times = [e["ts"] for e in events if isinstance(e.get("ts"), (int, Decimal))]
    span = max(times) - min(times) + 1000
    copies = max(1, -(-n_events // max(1, sum(1 for e in events if e.get("ph") != "M"))))
    exact = re.compile(r'"@(-?[0-9.Ee+-]+)@"')

    def dumps(value) -> str:
        return exact.sub(r"\1", json.dumps(value, default=lambda d: f"@{d}@"))

    tmp = path.with_suffix(".partial")
    with open(tmp, "w") as out:
        out.write(dumps(doc)[:-1] + (", " if doc else "") + '"traceEvents": [\n')
        for k in range(copies):
            shifted = []
            for e in events:
                if e.get("ph") == "M" and k:
                    continue
                e = dict(e)
                if isinstance(e.get("ts"), (int, Decimal)):
                    e["ts"] += k * span
                if isinstance(e.get("id"), int):
                    e["id"] += k * 10**8
                if isinstance(e.get("args"), dict):
                    e["args"] = dict(e["args"])
                    for key, step in (("correlation", 10**8), ("External id", 10**8), ("Sequence number", 10**7)):
                        if isinstance(e["args"].get(key), int):
                            e["args"][key] += k * step
                step = re.fullmatch(r"ProfilerStep#(\d+)", str(e.get("name", "")))
                if step:
                    e["name"] = f"ProfilerStep#{int(step.group(1)) + k * 1000}"
                shifted.append(dumps(e))
            out.write((",\n" if k else "") + ",\n".join(shifted))
        out.write("\n]}\n")
    os.replace(tmp, path)
    return path


# ---------------------------------------------------------------------------- measuring


def measure(kind: str, path: str) -> dict:
    """Run one reader in this process; report wall and CPU seconds and peak RSS."""
    if kind == "json":
        import gzip

        wall, cpu = time.perf_counter(), time.process_time()
        with gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb") as fh:
            doc = json.load(fh)
        n = len(doc["traceEvents"])
    else:
        sys.path.insert(0, str(ROOT))
        from dlprof_profiler.ingest.kineto import read_kineto_trace

        wall, cpu = time.perf_counter(), time.process_time()
        trace = read_kineto_trace(Path(path))
        n = len(trace.ranges) + len(trace.api_calls) + len(trace.gpu)
    helpers = resource.getrusage(resource.RUSAGE_CHILDREN)  # the processes that decoded parts of the file
    return {
        "wall": time.perf_counter() - wall,
        "cpu": time.process_time() - cpu + helpers.ru_utime + helpers.ru_stime,
        "items": n,
    }


def tree_rss(pid: int) -> int:
    """The resident memory of a process and all its descendants now, in bytes (0 once it is gone)."""
    total, pending = 0, [pid]
    while pending:
        current = pending.pop()
        try:
            with open(f"/proc/{current}/status") as fh:
                total += next((int(line.split()[1]) * 1024 for line in fh if line.startswith("VmRSS:")), 0)
            for task in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{task}/children") as fh:
                    pending += [int(child) for child in fh.read().split()]
        except (OSError, ValueError):
            continue
    return total


def in_child(args: list[str]) -> dict:
    """Run a command; its wall time, CPU time (with its processes' own children) and peak memory: the
    larger of the kernel's max RSS of its largest process and the sum over its process tree, sampled
    every 10 ms (dlprof decodes a large trace's parts in helper processes at the same time)."""
    started = time.perf_counter()
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    done, peak = threading.Event(), [0]

    def sample():
        while not done.wait(0.01):
            peak[0] = max(peak[0], tree_rss(proc.pid))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, status, usage = os.wait4(proc.pid, 0)
    done.set()
    sampler.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    out, err = proc.stdout.read(), proc.stderr.read()
    if proc.returncode:
        raise SystemExit(f"{args[:4]} failed ({proc.returncode}):\n{out}\n{err}")
    result = {
        "wall": time.perf_counter() - started,
        "cpu": usage.ru_utime + usage.ru_stime,
        "peak_mb": max(usage.ru_maxrss * 1024, peak[0]) / 2**20,
    }
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if lines:
        result.update(json.loads(lines[-1]))
    return result


def best(runs: list[dict]) -> dict:
    return min(runs, key=lambda r: r["wall"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=1_000_000)
    p.add_argument("--repeat", type=int, default=3, help="runs per reader; the fastest counts")
    p.add_argument("--gzip", action="store_true", help="benchmark the gzipped trace instead")
    p.add_argument(
        "--like",
        type=Path,
        metavar="TRACE",
        help="instead of the generated trace: copies of this real trace (e.g. a fixture) up to --events",
    )
    p.add_argument("--no-end-to-end", dest="end_to_end", action="store_false")
    p.add_argument("--no-reference", dest="reference", action="store_false", help="leave json.load out")
    p.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()))
    p.add_argument("--measure", nargs=2, metavar=("KIND", "FILE"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.measure:
        print(json.dumps(measure(*args.measure)))
        return
    like = f"_{args.like.name.split('.')[0]}" if args.like else ""
    path = args.cache / f"dlprof_bench_kineto{like}_{args.events}.pt.trace.json"
    if not path.exists():
        started = time.perf_counter()
        replicate(args.like, path, args.events) if args.like else generate(path, args.events)
        print(f"generated {path} ({path.stat().st_size / 1e6:.0f} MB) in {time.perf_counter() - started:.0f} s")
    if args.gzip:
        import gzip

        gz = path.with_suffix(".json.gz")
        if not gz.exists():
            gz.write_bytes(gzip.compress(path.read_bytes(), compresslevel=6))
        path = gz
    size = path.stat().st_size / 1e6
    me = [sys.executable, str(Path(__file__).resolve()), "--measure"]
    commands = {"json": me + ["json", str(path)]} if args.reference else {}
    commands["ingest"] = me + ["ingest", str(path)]
    out = tempfile.mkdtemp(prefix="dlprof_bench_kineto_")
    if args.end_to_end:
        commands["end to end"] = [
            sys.executable,
            "-m",
            "dlprof_profiler",
            f"--database={path}",
            f"--output_path={out}",
            "-f",
            "-v",
            "quiet",
        ]
        os.environ["PYTHONPATH"] = str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")
    # the readers take turns, so that the load of a shared machine weighs on each alike
    runs = {kind: [] for kind in commands}
    load_before = os.getloadavg()
    try:
        for _ in range(args.repeat):
            for kind, command in commands.items():
                runs[kind].append(in_child(command))
    finally:
        shutil.rmtree(out, ignore_errors=True)
    load_after = os.getloadavg()
    rows = {kind: best(r) for kind, r in runs.items()}
    ref = rows.get("json")
    print(
        f"\n{args.events:,} events, {size:.0f} MB {'gzipped ' if args.gzip else ''}JSON "
        f"(best of {args.repeat}, readers taking turns; wall and CPU seconds; peak = max RSS of the process tree)"
    )
    print(f"load average (1 min) {load_before[0]:.2f} before, {load_after[0]:.2f} after, on {os.cpu_count()} CPUs")
    print(f"{'':<34}{'wall s':>9}{'CPU s':>9}{'peak GB':>9}{'wall ratio':>12}{'CPU ratio':>11}")
    labels = {
        "json": "json.load (reference)",
        "ingest": "dlprof ingest (file -> frames)",
        "end to end": "dlprof --database (all stages)",
    }
    for kind, r in rows.items():
        ratios = f"{r['wall'] / ref['wall']:>12.2f}{r['cpu'] / ref['cpu']:>11.2f}" if ref else f"{'-':>12}{'-':>11}"
        print(f"{labels[kind]:<34}{r['wall']:>9.2f}{r['cpu']:>9.2f}{r['peak_mb'] / 1024:>9.2f}{ratios}")
    whole = rows.get("end to end")
    if whole:
        print(target_line(args.events, whole, ref) if not args.like else "targets: set for the generated trace")


def target_line(events: int, whole: dict, ref: dict | None) -> str:
    """The issue's targets for the end-to-end run: at most 0.5x json.load at 10^6 events, at most 60 s and
    2.5 GB at 10^7 events (other sizes: none)."""
    checks = []
    if events == 1_000_000 and ref:
        checks.append(("wall at most 0.5x json.load", whole["wall"] / ref["wall"] <= 0.5))
    if events == 10_000_000:
        checks.append(("at most 60 s", whole["wall"] <= 60))
        checks.append(("peak at most 2.5 GB", whole["peak_mb"] <= 2.5 * 1024))
    if not checks:
        return "targets: none at this size"
    return "targets: " + "; ".join(f"{what} {'met' if ok else 'MISSED'}" for what, ok in checks)


if __name__ == "__main__":
    main()
