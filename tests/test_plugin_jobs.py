"""Re-aggregation jobs (dlprof_plugin/jobs.py): what a failed job tells the browser names the database file, never
where it lives on the server."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dlprof_plugin.jobs import without_paths
from tests import test_plugin_checks as checks
from tests.profiles import make_logdir, training_profile
from tests.waiting import wait_until

pytestmark = pytest.mark.slow  # a dlprofviewer process running re-aggregation jobs


RUN = "dlprof_dldb"


def test_messages_lose_the_database_directory(tmp_path):
    db = str(tmp_path / "run" / "dlprof_dldb.sqlite")
    folder = os.path.dirname(db)
    assert (
        without_paths(f"{db}: iteration range 7..9 is outside the profile", db)
        == "dlprof_dldb.sqlite: iteration range 7..9 is outside the profile"
    )
    assert (
        without_paths(f"cannot write {folder}/dlprof_dldb.sqlite-journal in {folder}", db)
        == "cannot write dlprof_dldb.sqlite-journal in ."
    )
    # a symlinked directory: its real path goes too
    link = tmp_path / "link"
    os.symlink(tmp_path / "run", link)
    linked = str(link / "dlprof_dldb.sqlite")
    (tmp_path / "run").mkdir()
    Path(db).write_bytes(b"")
    assert without_paths(f"{os.path.realpath(linked)}: locked", linked) == "dlprof_dldb.sqlite: locked"
    assert without_paths("key node 'x' not found", db) == "key node 'x' not found"
    # the export a too large database was made from, suggested instead
    assert without_paths(
        f"{db}: re-analysing this database needs about 15.2 GB of memory (...), 3.0 GB are available; analyse the "
        "export it was made from instead (dlprof --database='/data/my runs/x y.sqlite' --out_of_core=on: staged on "
        "disk) or (dlprof --database=/data/x.sqlite: ...)",
        db,
    ) == (
        "dlprof_dldb.sqlite: re-analysing this database needs about 15.2 GB of memory (...), 3.0 GB are available; "
        "analyse the export it was made from instead (dlprof --database='x y.sqlite' --out_of_core=on: staged on "
        "disk) or (dlprof --database=x.sqlite: ...)"
    )
    assert without_paths("(dlprof --database=/data/it's.sqlite)", db) == "(dlprof --database='it'\"'\"'s.sqlite')"


@pytest.fixture(scope="module")
def viewer(tmp_path_factory):
    base = tmp_path_factory.mktemp("plugin_jobs")
    root = make_logdir(base / "out", {"jobs": training_profile(base / "training.sqlite")})
    db = root / "jobs" / "dlprof_dldb.sqlite"
    port = checks.free_port()
    exe = Path(sys.executable).parent / "dlprofviewer"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "dlprof_plugin.viewer"]
    log = open(base / "viewer.log", "w")
    proc = subprocess.Popen(
        cmd + [str(db), f"--port={port}", "--host=127.0.0.1", "--quiet"],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    api = checks.Api(f"http://127.0.0.1:{port}")
    try:
        wait_until(lambda: api.raw(api.url("runs"), timeout=5)[0] == 200, 30, "dlprofviewer to start", proc)
        yield {"api": api, "db": db}
    finally:
        checks.stop(proc)
        log.close()


def test_a_range_outside_the_profile_fails_without_the_server_path(viewer):
    api, db = viewer["api"], viewer["db"]
    api.post("reaggregate", {"run": RUN, "key_node": None, "iter_start": 40, "iter_stop": 50}, expect=202)
    job = wait_until(
        lambda: (j := api.get("reaggregate_status", run=RUN)["job"])["status"] != "running" and j, 120, "the job to end"
    )
    assert job["status"] == "failed"
    # the engine's reason, with the iterations the profile has (0..3), naming the file only
    assert job["message"] == (
        "dlprof_dldb.sqlite: iteration range 40..50 is outside the profile, which has "
        "iterations 0..3 (key node 'Optimizer.step#SGD.step')"
    )
    assert str(db.parent) not in job["message"] and "/" not in job["message"].split(":")[0]
    assert [a["aggr_id"] for a in api.get("aggregations", run=RUN)["aggregations"]] == [1]
