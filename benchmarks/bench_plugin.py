"""Plugin benchmark: time every HTTP route (and sorts, filters, deep pages, exports, the timeline's windows) on a
DLProf database built from a synthetic N-kernel profile; target < 200 ms per route at 10^6 kernels (the timeline:
an iteration opens in < 1 s; wider windows read every event in them and merge those under a pixel).

    python benchmarks/bench_plugin.py [--kernels 1000000] [--repeat 3] [--reaggregate]

The nsys export comes from benchmarks/bench_engine.generate and the database from the dlprof CLI; both are
cached in --cache (default: <tmp>/dlprof-bench). Requests go in-process through the viewer's WSGI app (the
same Service the TensorBoard plugin uses), cold (first request) and warm (best of --repeat).
--reaggregate also starts a re-aggregation and measures how long readers wait while it runs and commits.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TARGET_MS = 200.0
TIMELINE_TARGET_MS = 1000.0  # the timeline opens an iteration in under 1 s
EXPECTED_413 = "(413 expected)"  # a window of more events than a request reads


def target_ms(label: str) -> float:
    return TIMELINE_TARGET_MS if label.startswith("timeline") else TARGET_MS


def build(cache: Path, n_kernels: int) -> Path:
    """The DLProf database of the synthetic profile (built once, then reused)."""
    cache.mkdir(parents=True, exist_ok=True)
    export = cache / f"bench_{n_kernels}.sqlite"
    if not export.exists():
        from benchmarks.bench_engine import generate

        started = time.perf_counter()
        generate(export, n_kernels)
        print(f"generated {export} in {time.perf_counter() - started:.1f} s", flush=True)
    out = cache / f"plugin_logdir_{n_kernels}" / "big"
    db = out / "dlprof_dldb.sqlite"
    if not db.exists():
        started = time.perf_counter()
        subprocess.run(
            [
                sys.executable,
                "-m",
                "dlprof_profiler",
                f"--database={export}",
                f"--output_path={out}",
                "--reports=summary",
                "-v",
                "quiet",
                "--force",
            ],
            check=True,
        )
        print(f"dlprof wrote {db} in {time.perf_counter() - started:.1f} s", flush=True)
    return db


def requests_for(client, run: str) -> list[tuple[str, str]]:
    """(label, url) of every route plus typical table interactions."""
    q = f"run={run}"
    top = client.get(f"/table/ops?{q}&limit=1").get_json()["rows"][0][0]
    mid_iter = client.get(f"/iterations?{q}").get_json()["iterations"]
    it = mid_iter[len(mid_iter) // 2]["iteration"]
    urls = [
        ("runs", "/runs"),
        ("aggregations", f"/aggregations?{q}"),
        ("domains", f"/domains?{q}"),
        ("dashboard", f"/dashboard?{q}"),
        ("system", f"/system?{q}"),
        ("gpus", f"/gpus?{q}"),
        ("iterations", f"/iterations?{q}"),
        ("op", f"/op?{q}&op_index={top}"),
        ("expert_systems", f"/expert_systems?{q}"),
        ("reaggregate_status", f"/reaggregate_status?{q}"),
    ]
    for t in ("ops", "kernels", "op_types", "tensor_core", "group_ops", "iterations", "key_nodes", "expert_systems"):
        urls.append((f"table/{t}", f"/table/{t}?{q}"))
    urls += [
        ("table/kernels op_index", f"/table/kernels?{q}&op_index={top}"),
        ("table/group_ops parent=''", f"/table/group_ops?{q}&parent="),
        ("table/iteration_kernels", f"/table/iteration_kernels?{q}&iteration={it}"),
        ("table/iteration_ops", f"/table/iteration_ops?{q}&iteration={it}"),
        ("table/iteration_op_kernels", f"/table/iteration_op_kernels?{q}&iteration={it}&op_index={top}"),
        ("ops sort op_name asc", f"/table/ops?{q}&sort=op_name&order=asc"),
        ("ops q=conv", f"/table/ops?{q}&q=conv"),
        ("ops col.gpu_total>1e6 + col.op_type", f"/table/ops?{q}&col.gpu_total=%3E1000000&col.op_type=add"),
        ("ops last page (1000 rows)", f"/table/ops?{q}&offset=2000&limit=1000"),
        ("kernels sort api_max, 1000 rows", f"/table/kernels?{q}&sort=api_max&limit=1000"),
        ("kernels q=gemm page 5", f"/table/kernels?{q}&q=gemm&offset=100"),
        ("kernels col.kernel_name + uses_tc", f"/table/kernels?{q}&col.kernel_name=xmma&col.uses_tc=yes"),
        ("iterations sort duration desc", f"/table/iterations?{q}&sort=duration&order=desc&limit=1000"),
        ("iteration_kernels sort gpu_duration", f"/table/iteration_kernels?{q}&iteration={it}&sort=gpu_duration"),
        ("iteration_kernels q=relu limit 1000", f"/table/iteration_kernels?{q}&iteration={it}&q=relu&limit=1000"),
        ("iteration_kernels last iteration", f"/table/iteration_kernels?{q}&iteration={mid_iter[-1]['iteration']}"),
        ("iteration_ops sort op_name", f"/table/iteration_ops?{q}&iteration={it}&sort=op_name"),
        ("key_nodes q=Optimizer", f"/table/key_nodes?{q}&q=Optimizer"),
        ("ops format=csv (all rows)", f"/table/ops?{q}&format=csv"),
        ("ops format=xlsx (all rows)", f"/table/ops?{q}&format=xlsx"),
        ("kernels format=json_all", f"/table/kernels?{q}&format=json_all"),
        ("kernels format=xlsx", f"/table/kernels?{q}&format=xlsx"),
    ]
    urls += timeline_requests(q, mid_iter)
    urls += [
        ("compare (with its own aggregation)", f"/compare?{q}"),
        ("table/compare_ops", f"/table/compare_ops?{q}"),
        ("table/compare_kernels sort delta", f"/table/compare_kernels?{q}&sort=delta"),
    ]
    return urls


def timeline_requests(q: str, iterations: list[dict]) -> list[tuple[str, str]]:
    """The Timeline view's requests: an iteration as it opens (1600 px), zoomed in, ten iterations and the
    whole profile (events under a pixel merged), and a GPU gap's CPU activity."""
    it = iterations[len(iterations) // 2]
    start, end = it["start"], it["end"]
    first, last = iterations[0]["start"], iterations[-1]["end"]
    ten = iterations[min(len(iterations) - 1, len(iterations) // 2 + 9)]["end"]
    many = iterations[min(len(iterations) - 1, len(iterations) // 2 + 239)]["end"]
    return [
        ("timeline iteration (opening)", f"/timeline?{q}&iteration={it['iteration']}&width=1600"),
        (
            "timeline 100 us of it",
            f"/timeline?{q}&t0={start + (end - start) // 2}&t1={start + (end - start) // 2 + 100_000}&width=1600",
        ),
        ("timeline 10 iterations", f"/timeline?{q}&t0={start}&t1={ten}&width=1600"),
        ("timeline 240 iterations", f"/timeline?{q}&t0={start}&t1={many}&width=1600"),
        (f"timeline whole profile {EXPECTED_413}", f"/timeline?{q}&t0={first}&t1={last}&width=1600"),
        ("timeline_gap (an iteration)", f"/timeline_gap?{q}&t0={start}&t1={end}"),
    ]


def time_routes(app, run: str, repeat: int) -> list[tuple[str, float, float, int, int]]:
    from werkzeug.test import Client

    client = Client(app)
    results = []
    for label, url in requests_for(client, run):
        times = []
        status = size = 0
        for _ in range(repeat + 1):
            started = time.perf_counter()
            r = client.get(url)
            data = r.get_data()
            times.append((time.perf_counter() - started) * 1000)
            status, size = r.status_code, len(data)
        results.append((label, times[0], min(times[1:]) if repeat else times[0], status, size))
    return results


def prime_key_nodes(app, run: str) -> tuple:
    """The first key_nodes request of a large profile answers at once with ops only ("partial") and starts
    counting NVTX range labels in the background; wait for that count so it does not skew later timings."""
    from werkzeug.test import Client

    client = Client(app)
    started = time.perf_counter()
    r = client.get(f"/table/key_nodes?run={run}")
    first = (time.perf_counter() - started) * 1000
    partial = bool(r.get_json().get("partial"))
    while r.get_json().get("partial"):
        time.sleep(0.2)
        r = client.get(f"/table/key_nodes?run={run}")
    print(
        f"key_nodes: first answer {first:.1f} ms (partial={partial}); NVTX range labels counted in the "
        f"background in {time.perf_counter() - started:.1f} s",
        flush=True,
    )
    return (
        "table/key_nodes (first, partial)" if partial else "table/key_nodes (first)",
        first,
        first,
        r.status_code,
        len(r.get_data()),
    )


def measure_reaggregation(app, run: str) -> None:
    """Start a re-aggregation; meanwhile issue reader requests back to back and report the slowest."""
    from werkzeug.test import Client

    client = Client(app)
    r = client.post("/reaggregate", data=json.dumps({"run": run}))
    print(f"\nPOST reaggregate -> {r.status_code} {r.get_json()}")
    if r.status_code != 202:
        return
    worst = []  # (ms, url, at)
    started = time.perf_counter()
    urls = [
        f"/table/ops?run={run}",
        f"/dashboard?run={run}&aggr=1",
        f"/aggregations?run={run}",
        f"/table/kernels?run={run}&aggr=1&sort=gpu_max",
    ]
    n = 0
    while True:
        for url in urls:
            t0 = time.perf_counter()
            resp = client.get(url)
            ms = (time.perf_counter() - t0) * 1000
            n += 1
            worst.append((ms, url, time.perf_counter() - started, resp.status_code))
        status = client.get(f"/reaggregate_status?run={run}").get_json()["job"]
        if status["status"] != "running":
            break
        time.sleep(0.02)
    worst.sort(reverse=True)
    lat = sorted(w[0] for w in worst)
    pct = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))]  # noqa: E731
    print(f"job {status['status']} after {status['elapsed_seconds']} s: {status['message']}")
    print(
        f"{n} reader requests while it ran: p50 {pct(0.5):.1f} ms, p99 {pct(0.99):.1f} ms, max {lat[-1]:.1f} ms, "
        f"{sum(x > TARGET_MS for x in lat)} over {TARGET_MS:.0f} ms, "
        f"{sum(w[3] != 200 for w in worst)} not 200; slowest:"
    )
    for ms, url, at, code in worst[:5]:
        print(f"  {ms:8.1f} ms  {code}  at t={at:6.1f} s  {url}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kernels", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "dlprof-bench")
    parser.add_argument("--reaggregate", action="store_true", help="also measure readers during a re-aggregation")
    parser.add_argument("--database", type=Path, help="use this DLProf database instead of building one")
    args = parser.parse_args()
    db = args.database or build(args.cache, args.kernels)
    from dlprof_plugin.viewer import build_app

    app = build_app([str(db)])
    run = next(iter(app.service.run_source.runs()))
    results = [prime_key_nodes(app, run)]
    results += time_routes(app, run, args.repeat)
    print(
        f"\n{args.kernels:,} kernels, database {db.stat().st_size / 1e6:.0f} MB; ms per request "
        f"(cold = first, warm = best of {args.repeat})"
    )
    print(f"{'request':<44}{'cold ms':>10}{'warm ms':>10}{'status':>8}{'bytes':>11}")
    for label, cold, warm, status, size in results:
        flag = "  <-- over target" if cold > target_ms(label) else ""
        print(f"{label:<44}{cold:>10.1f}{warm:>10.1f}{status:>8}{size:>11,}{flag}")
    slowest = max(results, key=lambda r: r[1])
    print(
        f"\nslowest (cold): {slowest[0]} {slowest[1]:.1f} ms; "
        f"{sum(r[1] > target_ms(r[0]) for r in results)} request(s) over their target ({TARGET_MS:.0f} ms; "
        f"timeline {TIMELINE_TARGET_MS:.0f} ms)"
    )
    bad = [r for r in results if r[3] != (413 if r[0].endswith(EXPECTED_413) else 200)]
    if bad:
        print("non-200 answers:", [(r[0], r[3]) for r in bad])
    if args.reaggregate:
        measure_reaggregation(app, run)
    return 0 if not bad else 1


if __name__ == "__main__":
    raise SystemExit(main())
