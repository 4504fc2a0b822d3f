"""The DLPROF TensorBoard plugin over HTTP: a real `tensorboard` subprocess per data-server mode (the Rust
data server with the default --load_fast=auto, and the Python multiplexer with --load_fast=false), every
route checked against the database (sqlite3) and the hand-computed training profile."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from tests import test_plugin_checks as checks
from tests.profiles import make_logdir, training_profile
from tests.waiting import wait_until

pytestmark = (
    pytest.mark.slow
)  # TensorBoard processes of its own in both data-server modes; test_plugin_routes.py has the fast checks


RUNS = ("training", "other", "reagg")


def _tensorboard() -> list[str]:
    exe = Path(sys.executable).parent / "tensorboard"
    if exe.exists():
        return [str(exe)]
    return [sys.executable, "-m", "tensorboard.main"]


def _forged_run(root: Path, name: str, database: str) -> None:
    """A run directory whose dlprof event file names `database` (relative to the run directory)."""
    from dlprof_profiler.outputs import event_files

    run_dir = root / name / "dlprof"
    run_dir.mkdir(parents=True)
    meta = {
        "database": database,
        "profile_name": "dlprof",
        "aggr_id": 1,
        "mode": "pytorch",
        "primary_domain": "default",
        "nsys_version": "x",
        "dlprof_version": "x",
        "source_file": "",
    }
    empty = pd.DataFrame({"iteration": [], "duration": [], "gpu_utilization": [], "tc_kernel_time_per_gpu": []})
    event_files.write_event_file(run_dir / event_files.event_file_name(), meta, empty)


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    base = tmp_path_factory.mktemp("plugin_http")
    export = training_profile(base / "training.sqlite")
    other = training_profile(base / "other.sqlite", iterations=2)
    root = make_logdir(base / "logdir", {"training": export, "other": other, "reagg": export})
    # runs whose database lies outside the logdir must not be served
    outside = base / "outside"
    outside.mkdir()
    shutil.copy(root / "training" / "dlprof_dldb.sqlite", outside / "dlprof_dldb.sqlite")
    _forged_run(root, "escape", "../../../outside/dlprof_dldb.sqlite")
    _forged_run(root, "absolute", str(outside / "dlprof_dldb.sqlite"))
    _forged_run(root, "linked", "../dlprof_dldb.sqlite")
    os.symlink(outside / "dlprof_dldb.sqlite", root / "linked" / "dlprof_dldb.sqlite")
    _forged_run(root, "missing", "../nothing_here.sqlite")
    return root


@pytest.fixture(scope="module", params=["auto", "false"], ids=["load_fast_auto", "load_fast_false"])
def tb(request, logdir, tmp_path_factory):
    port = checks.free_port()
    log_path = tmp_path_factory.mktemp("tb_log") / "tensorboard.log"
    log = open(log_path, "w")
    proc = subprocess.Popen(
        _tensorboard()
        + [
            f"--logdir={logdir}",
            f"--port={port}",
            "--host=127.0.0.1",
            f"--load_fast={request.param}",
            "--reload_interval=1",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    api = checks.Api(f"http://127.0.0.1:{port}")

    def ready():
        status, _, body = api.raw(f"{api.base}/data/plugins_listing", timeout=5)
        if status != 200 or not json.loads(body).get("dlprof", {}).get("enabled"):
            return False
        runs = {r["run"] for r in api.get("runs")["runs"]}
        return runs >= {f"{r}/dlprof" for r in RUNS}

    try:
        wait_until(ready, 60, "TensorBoard to list the dlprof runs", proc)
        yield {"api": api, "mode": request.param, "log": log_path, "logdir": logdir}
    finally:
        checks.stop(proc)
        log.close()


def _db(tb, run: str) -> Path:
    return tb["logdir"] / run / "dlprof_dldb.sqlite"


def test_plugin_listed_and_data_server_mode(tb):
    status, _, body = tb["api"].raw(f"{tb['api'].base}/data/plugins_listing")
    entry = json.loads(body)["dlprof"]
    assert entry["enabled"] is True and entry["tab_name"] == "DLPROF" and entry["disable_reload"] is True
    assert entry["loading_mechanism"] == {"type": "IFRAME", "module_path": "/data/plugin/dlprof/index.js"}
    text = tb["log"].read_text()
    if tb["mode"] == "auto":  # the Rust data server is really in use (context.multiplexer is None)
        assert "fast data loading" in text, text[-2000:]
    else:
        assert "fast data loading" not in text


def test_runs_listed_and_escapes_refused(tb):
    api = tb["api"]
    checks.check_runs(api, {f"{r}/dlprof": _db(tb, r) for r in RUNS})
    assert api.get("runs")["runs"][0]["database"] == "other/dlprof_dldb.sqlite"
    for forged in ("escape", "absolute", "linked", "missing"):
        api.get("dashboard", expect=404, run=f"{forged}/dlprof")
        api.get("table/ops", expect=404, run=f"{forged}/dlprof")
    status, doc = api.post("reaggregate", {"run": "linked/dlprof"})
    assert status == 404


def test_metadata_routes(tb):
    checks.check_metadata_routes(tb["api"], "training/dlprof", _db(tb, "training"))


def test_dashboard(tb):
    checks.check_dashboard(tb["api"], "training/dlprof", _db(tb, "training"))
    other = tb["api"].get("dashboard", run="other/dlprof")["summary"]
    assert other["iter_total"] == 3 and other["wall_time"] == 190_000  # 2 training iterations from 1_000_000


def test_tables(tb):
    checks.check_tables(tb["api"], "training/dlprof", _db(tb, "training"))


def test_exports(tb):
    checks.check_exports(tb["api"], "training/dlprof")


def test_terms(tb):
    checks.check_terms(tb["api"], "training/dlprof")


def test_bad_requests(tb):
    checks.check_bad_requests(tb["api"], "training/dlprof")


def test_static_files(tb):
    checks.check_static(tb["api"])


def test_concurrent_requests(tb):
    checks.check_concurrency(tb["api"], "training/dlprof")


def test_reaggregation(tb, tmp_path):
    checks.check_reaggregation(tb["api"], "reagg/dlprof", _db(tb, "reagg"), tmp_path)
