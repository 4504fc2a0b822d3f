"""`dlprofviewer` over HTTP: the same routes and checks as the TensorBoard plugin, served without TensorBoard
at /data/plugin/dlprof/<route> and at /<route>, plus the page at / that loads the frontend module."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests import test_plugin_checks as checks
from tests.profiles import make_logdir, training_profile
from tests.waiting import wait_until

pytestmark = pytest.mark.slow  # dlprofviewer processes; test_plugin_routes.py runs the same checks in-process


RUN = "dlprof_dldb"


def _viewer() -> list[str]:
    exe = Path(sys.executable).parent / "dlprofviewer"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "dlprof_plugin.viewer"]


@contextlib.contextmanager
def running_viewer(db: Path, *options: str, log=subprocess.DEVNULL):
    """A dlprofviewer on `db` (127.0.0.1, a free port) until the block ends: its checks.Api."""
    port = checks.free_port()
    proc = subprocess.Popen(
        _viewer() + [str(db), f"--port={port}", "--host=127.0.0.1", *options],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    api = checks.Api(f"http://127.0.0.1:{port}")
    try:
        wait_until(lambda: api.raw(api.url("runs"), timeout=5)[0] == 200, 30, "dlprofviewer to start", proc)
        yield api
    finally:
        checks.stop(proc)


@pytest.fixture(scope="module")
def viewer(tmp_path_factory):
    base = tmp_path_factory.mktemp("plugin_viewer")
    root = make_logdir(base / "out", {"viewer": training_profile(base / "training.sqlite")})
    db = root / "viewer" / "dlprof_dldb.sqlite"
    log_path = base / "viewer.log"
    with open(log_path, "w") as log, running_viewer(db, "--quiet", log=log) as api:
        yield {"api": api, "db": db, "log": log_path}


def test_page_loads_the_frontend_module(viewer):
    api = viewer["api"]
    status, headers, body = api.raw(f"{api.base}/")
    page = body.decode()
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    assert '<base href="data/plugin/dlprof/">' in page and 'import("./index.js")' in page and "m.render()" in page
    csp = headers["Content-Security-Policy"]
    assert "default-src 'self'" in csp and "'sha256-" in csp  # only this inline script may run


def test_routes_at_both_prefixes(viewer):
    api = viewer["api"]
    bare = checks.Api(api.base, prefix="/")
    assert api.get("runs") == bare.get("runs")
    assert api.get("dashboard", run=RUN, aggr=1) == bare.get("dashboard", run=RUN, aggr=1)
    assert bare.table("ops", run=RUN, aggr=1)[0]["total"] == checks.N_OPS
    status, headers, body = bare.raw(bare.url("index.js"))
    assert status == 200 and headers["Content-Type"].startswith("text/javascript")


@pytest.mark.parametrize("check", list(checks.route_checks(RUN)))
def test_routes(viewer, check):
    checks.route_checks(RUN)[check](viewer["api"], viewer["db"])


def test_concurrent_requests(viewer):
    checks.check_concurrency(viewer["api"], RUN)


def test_reaggregation(viewer, tmp_path):
    checks.check_reaggregation(viewer["api"], RUN, viewer["db"], tmp_path)


def test_refuses_what_is_not_a_dlprof_database(tmp_path):
    plain = tmp_path / "plain.sqlite"
    sqlite3.connect(plain).execute("CREATE TABLE t (x)").connection.close()
    for args in ([str(tmp_path / "missing.sqlite")], [str(plain)]):
        proc = subprocess.run(_viewer() + args + ["--port=0"], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and "dlprofviewer:" in proc.stderr, (proc.returncode, proc.stderr)


def test_viewer_json_errors_are_json(viewer):
    api = viewer["api"]
    status, headers, body = api.raw(f"{api.base}/data/plugin/dlprof/table/ops?run=nope")
    assert status == 404 and json.loads(body) == {"error": "unknown run 'nope'"}


def test_recovers_from_an_interrupted_write(viewer):
    """A writer killed mid-transaction leaves a hot journal that read-only connections cannot roll back;
    the server rolls it back once (as any read-write SQLite connection would) and answers as before."""
    api, db = viewer["api"], viewer["db"]
    before = api.get("dashboard", run=RUN, aggr=1)["summary"]
    writer = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import signal, sqlite3\n"
                f"con = sqlite3.connect({str(db)!r})\n"
                "con.execute('PRAGMA cache_size = 1')\n"
                "con.execute('BEGIN IMMEDIATE')\n"
                "con.execute('UPDATE model_summary SET wall_time = wall_time + 1')\n"
                "con.execute('UPDATE raw_gpu_activities SET start = start + 1')\n"
                "print('written', flush=True)\n"
                "signal.pause()\n"  # the transaction stays open until the test kills the writer
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert writer.stdout.readline().strip() == "written"
    finally:
        writer.kill()
        writer.wait(timeout=10)
    journal = Path(str(db) + "-journal")
    assert journal.exists() and journal.stat().st_size > 0
    assert api.get("dashboard", run=RUN, aggr=1)["summary"] == before
    assert not journal.exists()
    assert api.table("ops", run=RUN, aggr=1)[0]["total"] == checks.N_OPS


def test_torch_profiler_trace_database(tmp_path):
    """The DLPROF views of a database made from a real torch.profiler trace (DDP on 2 GPUs): the iterations
    follow its ProfilerStep#N ranges and every kernel launch of the JSON is counted with its exact time."""
    from tests.profiles import run_dlprof
    from tests.test_ingest_kineto import FIXTURES, expected_steps, load_json

    trace = FIXTURES / "pytorch_ddp_2gpu_nccl.json.gz"
    want = expected_steps(load_json(trace))  # the steps, and the GPU work launched inside them
    kernels = [v for k, v in want["gpu"].items() if k[0] == 0]
    out = tmp_path / "out"
    run_dlprof(f"--database={trace}", f"--output_path={out}", "--reports=summary", "-v", "quiet")
    with running_viewer(out / "dlprof_dldb.sqlite", "--quiet") as api:
        assert api.get("runs")["runs"][0]["nsys_version"] == "none (torch.profiler trace)"
        iterations = api.get("iterations", run=RUN)
        assert iterations["key_node"] == "ProfilerStep" and len(iterations["iterations"]) == len(want["spans"])
        assert all(i["complete"] for i in iterations["iterations"])
        assert sum(i["kernels"] for i in iterations["iterations"]) == sum(c for c, _ in kernels)
        _, rows = api.table("kernels", run=RUN, format="json_all", limit=-1)
        assert sum(r["num_calls"] for r in rows) == sum(c for c, _ in kernels)
        assert sum(r["gpu_total"] for r in rows) == sum(t for _, t in kernels)


def test_light_routes_are_those_that_read_no_profile(viewer):
    """The light lane of the server (http_server.py): the page, static files and the run list, never a route that
    reads a profile (which could keep a worker busy for seconds)."""
    from dlprof_plugin.viewer import build_app

    is_light = build_app([str(viewer["db"])]).is_light
    for path in (
        "/",
        "/index.html",
        "/favicon.ico",
        "/index.js",
        "/runs",
        "/data/plugin/dlprof/runs",
        "/data/plugin/dlprof/aggregations",
        "/reaggregate",
        "/reaggregate_status",
        "/data/plugin/dlprof/x.css",
    ):
        assert is_light(path), path
    for path in (
        "/timeline",
        "/data/plugin/dlprof/timeline_gap",
        "/compare",
        "/dashboard",
        "/table/ops",
        "/data/plugin/dlprof/table/kernels",
        "/table",
        "/iterations",
        "/op",
        "/system",
    ):
        assert not is_light(path), path


def test_each_request_is_logged_unless_quiet(viewer, tmp_path):
    """One common-log-format line per request on stderr (tests/test_browser_security.py reads them)."""
    log_path = tmp_path / "viewer.log"
    with open(log_path, "w") as log, running_viewer(viewer["db"], log=log) as api:
        assert api.raw(api.url("table/ops", run="nope"))[0] == 404
        wait_until(
            lambda: '"GET /data/plugin/dlprof/table/ops?run=nope HTTP/1.1" 404 -' in log_path.read_text(),
            30,
            "the request to be logged",
        )
        assert '"GET /data/plugin/dlprof/runs HTTP/1.1" 200 -' in log_path.read_text()


@pytest.mark.parametrize("option", ["--connection_limit=0", "--request_timeout=0", "--idle_timeout=-1"])
def test_limits_must_be_positive(viewer, option):
    proc = subprocess.run(
        _viewer() + [str(viewer["db"]), option, "--port=0"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2 and "must be positive" in proc.stderr, proc.stderr
