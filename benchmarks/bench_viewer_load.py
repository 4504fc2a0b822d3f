"""Load benchmark of dlprofviewer (issue 25): while 2,000 concurrent requests (timeline, compare, tables) and
4,000 idle, slowly drip-fed connections (slowloris) hit the viewer, how fast does `/runs` answer and how much
memory does the viewer take? Targets: every `/runs` within 1 s; the viewer's peak RSS within 2x its idle RSS.

    python benchmarks/bench_viewer_load.py [--kernels 100000] [--requests 2000] [--idle 4000]
                                           [--server dlprofviewer|cheroot|werkzeug]

The viewer runs as its own process (`dlprofviewer DB --quiet`) on a DLProf database of a synthetic profile
(benchmarks/bench_plugin.build, cached in --cache). `--server cheroot` serves the same WSGI app with cheroot
(`pip install cheroot`; --cheroot_threads workers), `--server werkzeug` with werkzeug's threaded server (the
viewer's server before issue 25): the comparison that chose waitress (dlprof_plugin/http_server.py).

Phases: the viewer starts (RSS "start"); one request of each kind warms its caches (RSS "idle", the baseline);
the idle connections open, each sending a request line and then one header byte every --drip seconds, reopened
whenever the server closes them; then the requests are sent at once, each on its own connection, and read to
the end. Meanwhile the prober asks `/runs` every --probe seconds on a new connection (a page being opened) and
the viewer's RSS is sampled every 0.1 s. The idle connections stay until every request is answered. Exit status
0 when every target is met.

The client is one thread on epoll, and the `/runs` prober a process of its own (the client's work must not delay
it), on the same 2 cores as the viewer: the load average is printed before and after, since other work on the
machine slows them all. The open-file limit is raised for the sockets (the viewer raises its own).
"""

from __future__ import annotations

import argparse
import errno
import heapq
import http.client
import json
import os
import resource
import selectors
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RUNS_TARGET_S = 1.0
RSS_TARGET_RATIO = 2.0
HEADER_DRIP = b"X-Slow: drip\r\n"  # repeated byte by byte: the request's headers never end


# ---------------------------------------------------------------------------- the servers compared


def serve_other(kind: str, database: str, port: int, threads: int) -> None:
    """Child process of --server cheroot|werkzeug: the viewer's WSGI app on that server."""
    from dlprof_plugin.viewer import build_app

    app = build_app([database])
    if kind == "cheroot":
        from cheroot import wsgi

        server = wsgi.Server(("127.0.0.1", port), app, numthreads=threads, request_queue_size=4096, timeout=10)
        print(f"cheroot on {port} with {threads} threads", flush=True)
        server.safe_start()
    else:
        from werkzeug.serving import make_server

        server = make_server("127.0.0.1", port, app, threaded=True)
        print(f"werkzeug on {port}", flush=True)
        server.serve_forever()


def start_server(args, database: Path, port: int) -> subprocess.Popen:
    if args.server == "dlprofviewer":
        cmd = [sys.executable, "-m", "dlprof_plugin.viewer", str(database), f"--port={port}", "--quiet"]
    else:
        cmd = [sys.executable, __file__, f"--serve={args.server}", f"--database={database}", f"--port={port}"]
        cmd.append(f"--cheroot_threads={args.cheroot_threads}")
    return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=sys.stderr)


# ---------------------------------------------------------------------------- measuring


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def get(port: int, path: str, timeout: float = 30) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


class Sampler(threading.Thread):
    """The server's RSS every 0.1 s: the peak."""

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.pid, self.peak, self.stop = pid, 0.0, threading.Event()

    def run(self):
        while not self.stop.is_set():
            try:
                self.peak = max(self.peak, rss_mb(self.pid))
            except OSError:
                return
            self.stop.wait(0.1)


def probe(port: int, interval: float) -> None:
    """Child process of the benchmark (its own interpreter: the load client's work must not delay it): `GET /runs`
    on a new connection every `interval` s until stdin closes; prints `start seconds error` per request."""
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    while not stop.is_set():
        at, started = time.time(), time.perf_counter()
        try:
            status, body = get(port, "/runs", timeout=30)
            error = "" if status == 200 and json.loads(body)["runs"] else f"status_{status}"
        except (OSError, http.client.HTTPException, ValueError) as exc:
            error = type(exc).__name__
        print(f"{at:.6f} {time.perf_counter() - started:.6f} {error}", flush=True)
        stop.wait(max(0.0, interval - (time.perf_counter() - started)))


class Prober:
    """The `/runs` prober process: (phase, seconds, error) of each request once stopped."""

    def __init__(self, port: int, interval: float):
        self.proc = subprocess.Popen(
            [sys.executable, __file__, f"--probe_port={port}", f"--probe={interval}"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.phases: list[tuple[float, str]] = [(time.time(), "idle connections")]
        self.results: list[tuple[str, float | None, str]] = []

    def phase(self, name: str) -> None:
        self.phases.append((time.time(), name))

    def stop(self) -> None:
        out, _ = self.proc.communicate("", timeout=60)
        for line in out.splitlines():
            at, seconds, *error = line.split()
            phase = [name for t, name in self.phases if t <= float(at)]
            if phase:
                self.results.append((phase[-1], float(seconds), error[0] if error else ""))


# ---------------------------------------------------------------------------- the clients


@dataclass
class Conn:
    sock: socket.socket
    kind: str  # "idle" or "load"
    url: str = ""
    out: bytes = b""
    received: bytearray = field(default_factory=bytearray)
    connected: bool = False
    drip: int = 0
    started: float = 0.0


class Swarm:
    """Idle drip-fed connections and concurrent requests on one epoll loop."""

    def __init__(self, port: int, drip_s: float):
        self.port, self.drip_s = port, drip_s
        self.sel = selectors.DefaultSelector()
        self.drips: list[tuple[float, int, Conn]] = []  # (when, seq, conn) heap of the next byte to send
        self.seq = 0
        self.idle_open = 0
        self.idle_target = 0
        self.idle_dropped = 0  # closed by the server (its request timeout), then reopened
        self.idle_failed = 0  # could not connect
        self.load: list[Conn] = []
        self.load_done: list[tuple[str, int | str, float]] = []  # (url, status or error, seconds)
        self.head = f"GET /runs HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n".encode()

    def _open(self, kind: str, url: str = "") -> Conn:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.connect_ex(("127.0.0.1", self.port))
        conn = Conn(sock, kind, url=url, started=time.perf_counter())
        if kind == "load":
            conn.out = f"GET {url} HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\nConnection: close\r\n\r\n".encode()
        else:
            conn.out = self.head
        self.sel.register(sock, selectors.EVENT_WRITE, conn)
        return conn

    def open_idle(self, n: int) -> None:
        self.idle_target += n
        for _ in range(n):
            self._open("idle")
            self.idle_open += 1

    def send_requests(self, urls: list[str]) -> None:
        for url in urls:
            self.load.append(self._open("load", url))

    def _close(self, conn: Conn) -> None:
        try:
            self.sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()

    def _idle_lost(self, conn: Conn, by_server: bool) -> None:
        self._close(conn)
        conn.sock = None
        self.idle_open -= 1
        if by_server:
            self.idle_dropped += 1
        else:
            self.idle_failed += 1
        if self.idle_open < self.idle_target:
            self._open("idle")
            self.idle_open += 1

    def _load_finished(self, conn: Conn, outcome) -> None:
        self._close(conn)
        self.load_done.append((conn.url, outcome, time.perf_counter() - conn.started))

    def _failed(self, conn: Conn, err: int, connected: bool) -> None:
        if conn.kind == "idle":
            self._idle_lost(conn, by_server=connected)
        else:
            self._load_finished(conn, errno.errorcode.get(err, str(err)))

    def _writable(self, conn: Conn) -> None:
        err = conn.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if err:
            self._failed(conn, err, connected=False)
            return
        conn.connected = True
        try:
            conn.sock.send(conn.out)  # small: fits the socket buffer at once
        except OSError as exc:
            self._failed(conn, exc.errno, connected=True)
            return
        self.sel.modify(conn.sock, selectors.EVENT_READ, conn)
        if conn.kind == "idle":
            self.seq += 1
            heapq.heappush(self.drips, (time.perf_counter() + self.drip_s, self.seq, conn))

    def _readable(self, conn: Conn) -> None:
        try:
            data = conn.sock.recv(65536)
        except OSError as exc:
            self._failed(conn, exc.errno, connected=True)
            return
        if conn.kind == "idle":
            if not data:  # closed by the server (an answer to an unfinished request is ignored)
                self._idle_lost(conn, by_server=True)
            return
        if data:
            conn.received += data
            return
        line = bytes(conn.received[: conn.received.find(b"\r\n")]).split()
        self._load_finished(conn, int(line[1]) if len(line) > 1 and line[1].isdigit() else "no answer")

    def _drip(self, now: float) -> None:
        while self.drips and self.drips[0][0] <= now:
            _, _, conn = heapq.heappop(self.drips)
            if conn.sock is None:
                continue
            try:
                conn.sock.send(HEADER_DRIP[conn.drip % len(HEADER_DRIP) : conn.drip % len(HEADER_DRIP) + 1])
                conn.drip += 1
            except BlockingIOError:
                pass
            except OSError:
                self._idle_lost(conn, by_server=True)
                continue
            self.seq += 1
            heapq.heappush(self.drips, (now + self.drip_s, self.seq, conn))

    def run_until(self, done, deadline: float) -> None:
        while not done() and time.perf_counter() < deadline:
            for key, events in self.sel.select(timeout=0.05):
                conn = key.data
                if conn.sock is None or conn.sock.fileno() < 0:
                    continue
                if events & selectors.EVENT_WRITE and not conn.connected:
                    self._writable(conn)
                elif events & selectors.EVENT_READ:
                    self._readable(conn)
            self._drip(time.perf_counter())

    def idle_connected(self) -> int:
        return sum(1 for _, _, c in self.drips if c.sock is not None)

    def close_all(self) -> None:
        for key in list(self.sel.get_map().values()):
            key.data.sock.close()
        self.sel.close()


# ---------------------------------------------------------------------------- the request mix


def request_mix(port: int, run: str) -> list[str]:
    """Timeline, compare and table requests, as the views send them."""
    q = f"run={run}"
    status, body = get(port, f"/iterations?{q}", timeout=120)
    iterations = json.loads(body)["iterations"]
    it = iterations[len(iterations) // 2]
    ten = iterations[min(len(iterations) - 1, len(iterations) // 2 + 9)]["end"]
    mid = it["start"] + (it["end"] - it["start"]) // 2
    return [
        f"/timeline?{q}&iteration={it['iteration']}&width=1600",
        f"/timeline?{q}&t0={it['start']}&t1={ten}&width=1600",
        f"/timeline?{q}&t0={mid}&t1={mid + 100_000}&width=1600",
        f"/compare?{q}",
        f"/table/compare_ops?{q}",
        f"/table/ops?{q}",
        f"/table/kernels?{q}&sort=api_max&limit=1000",
        f"/table/iteration_kernels?{q}&iteration={it['iteration']}",
        f"/table/iteration_ops?{q}&iteration={it['iteration']}&sort=op_name",
        f"/table/ops?{q}&q=conv",
    ]


def raise_open_files(need: int) -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        soft = need if hard == resource.RLIM_INFINITY else min(need, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return soft


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kernels", type=int, default=100_000)
    parser.add_argument("--requests", type=int, default=2000, help="concurrent requests (timeline, compare, tables)")
    parser.add_argument("--idle", type=int, default=4000, help="idle, slowly drip-fed connections")
    parser.add_argument("--drip", type=float, default=2.0, help="seconds between two bytes of an idle connection")
    parser.add_argument("--probe", type=float, default=0.2, help="seconds between two /runs requests")
    parser.add_argument("--server", choices=("dlprofviewer", "cheroot", "werkzeug"), default="dlprofviewer")
    parser.add_argument("--cheroot_threads", type=int, default=10, help="cheroot's worker threads (its default: 10)")
    parser.add_argument("--timeout", type=float, default=600, help="give up waiting for the requests after this")
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "dlprof-bench")
    parser.add_argument("--database", type=Path, help="use this DLProf database instead of building one")
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--probe_port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.probe_port:
        probe(args.probe_port, args.probe)
        return 0
    if args.serve:
        serve_other(args.serve, str(args.database), args.port, args.cheroot_threads)
        return 0

    from benchmarks.bench_plugin import build
    from tests.test_plugin_checks import free_port

    db = args.database or build(args.cache, args.kernels)
    limit = raise_open_files(args.requests + args.idle + 256)
    if limit < args.requests + args.idle + 64:
        print(f"the open-file limit ({limit}) is too low for {args.requests + args.idle} sockets", file=sys.stderr)
        return 2
    port = free_port()
    load_before = os.getloadavg()
    proc = start_server(args, db, port)
    try:
        deadline = time.perf_counter() + 120
        while True:
            try:
                if get(port, "/runs", timeout=5)[0] == 200:
                    break
            except OSError:
                pass
            if proc.poll() is not None or time.perf_counter() > deadline:
                print("the server did not start", file=sys.stderr)
                return 1
            time.sleep(0.2)
        rss_start = rss_mb(proc.pid)
        run = json.loads(get(port, "/runs")[1])["runs"][0]["run"]
        urls = request_mix(port, run)
        warm = {}
        for url in urls:
            started = time.perf_counter()
            warm[url] = (get(port, url, timeout=120)[0], time.perf_counter() - started)
        time.sleep(1.0)  # let the allocator settle after the warm-up
        rss_idle = rss_mb(proc.pid)

        sampler, prober = Sampler(proc.pid), Prober(port, args.probe)
        sampler.start()
        swarm = Swarm(port, args.drip)
        t0 = time.perf_counter()
        swarm.open_idle(args.idle)
        swarm.run_until(lambda: swarm.idle_connected() >= args.idle, t0 + 120)
        opened_s = time.perf_counter() - t0
        swarm.run_until(lambda: False, time.perf_counter() + 2 * args.drip)  # the server holds them a while
        prober.phase("load")
        t1 = time.perf_counter()
        swarm.send_requests([urls[i % len(urls)] for i in range(args.requests)])
        swarm.run_until(lambda: len(swarm.load_done) >= args.requests, t1 + args.timeout)
        load_s = time.perf_counter() - t1
        idle_end = swarm.idle_connected()
        prober.stop()
        sampler.stop.set()
        sampler.join(5)
        swarm.close_all()
        load_after = os.getloadavg()
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()

    statuses: dict = {}
    for _, outcome, _ in swarm.load_done:
        statuses[outcome] = statuses.get(outcome, 0) + 1
    unanswered = args.requests - len(swarm.load_done)
    answered = [s for _, o, s in swarm.load_done if isinstance(o, int)]
    print(f"\nserver: {args.server}; database {db} ({args.kernels:,} kernels, {db.stat().st_size / 1e6:.0f} MB)")
    print(
        f"load average (1, 5, 15 min) before: {', '.join(f'{x:.2f}' for x in load_before)}; after: "
        f"{', '.join(f'{x:.2f}' for x in load_after)} ({os.cpu_count()} cores)"
    )
    print("warm-up (one of each request, ms): " + ", ".join(f"{s * 1000:.0f}" for _, s in warm.values()))
    print(
        f"idle connections: {args.idle} opened in {opened_s:.1f} s, drip-fed one byte every {args.drip:g} s; "
        f"{swarm.idle_dropped} closed by the server and reopened, {swarm.idle_failed} failed to connect; "
        f"{idle_end} open at the end"
    )
    print(
        f"requests: {args.requests} at once (timeline, compare, tables; {len(urls)} kinds): "
        + ", ".join(f"{k}: {v}" for k, v in sorted(statuses.items(), key=str))
        + f"; {unanswered} unanswered after {load_s:.1f} s"
        + (f"; latency p50 {percentile(answered, 0.5):.1f} s, max {max(answered):.1f} s" if answered else "")
    )
    ok_runs = True
    for phase in ("idle connections", "load"):
        lat = [s for p, s, e in prober.results if p == phase and not e]
        failed = [e for p, s, e in prober.results if p == phase and e]
        over = sum(x > RUNS_TARGET_S for x in lat)
        ok_runs &= not failed and not over and bool(lat)
        if lat:
            print(
                f"/runs during {phase}: {len(lat) + len(failed)} requests, p50 {percentile(lat, 0.5) * 1000:.0f} ms, "
                f"p90 {percentile(lat, 0.9) * 1000:.0f} ms, p99 {percentile(lat, 0.99) * 1000:.0f} ms, "
                f"max {max(lat) * 1000:.0f} ms; {over} over {RUNS_TARGET_S:g} s, {len(failed)} failed"
                + (f" ({', '.join(sorted(set(failed)))})" if failed else "")
            )
        else:
            print(f"/runs during {phase}: no answer ({len(failed)} failed: {', '.join(sorted(set(failed)))})")
    ratio = sampler.peak / rss_idle if rss_idle else float("inf")
    print(
        f"viewer RSS: start {rss_start:.0f} MB, idle after warm-up {rss_idle:.0f} MB, peak under load "
        f"{sampler.peak:.0f} MB = {ratio:.2f}x idle"
    )
    errors = sum(v for k, v in statuses.items() if k != 200) + unanswered
    print(
        f"targets: /runs within {RUNS_TARGET_S:g} s: {'PASS' if ok_runs else 'FAIL'}; peak RSS within "
        f"{RSS_TARGET_RATIO:g}x idle: {'PASS' if ratio <= RSS_TARGET_RATIO else 'FAIL'}; "
        f"requests not answered 200: {errors}"
    )
    return 0 if ok_runs and ratio <= RSS_TARGET_RATIO and not errors else 1


if __name__ == "__main__":
    sys.exit(main())
