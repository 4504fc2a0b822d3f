"""Re-aggregation jobs: `python -m dlprof_profiler.run.reaggregate` in a background subprocess, one per database.

The request that starts a job returns at once; a watcher thread waits for the process and records its
outcome (the engine prints one JSON line). State lives in memory, per database real path:
idle -> running -> succeeded | failed. A second start while one runs raises `JobConflict` (HTTP 409).
The engine appends the aggregation in one transaction, so a failure leaves earlier aggregations intact; a
process that ends without its result line (killed) succeeded if the database holds its new aggregation.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time

from dlprof_plugin.replies import Conflict

JOB_TIMEOUT_S = 6 * 3600  # a job still running after this is killed and reported as failed
MAX_MESSAGE = 2000


class JobConflict(Conflict):
    """A re-aggregation of this database is already running (HTTP 409)."""


def _utc(t: float | None) -> str | None:
    if t is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


class Job:
    def __init__(self, database: str, key_node, iter_start, iter_stop):
        self.database = database
        self.key_node, self.iter_start, self.iter_stop = key_node, iter_start, iter_stop
        self.status = "running"
        self.message = "re-aggregation running"
        self.aggr_id = None
        self.started = time.time()
        self.finished = None
        self.proc: subprocess.Popen | None = None
        self.aggr_before = None  # newest aggregation id when the job started

    def to_json(self) -> dict:
        return {
            "status": self.status,
            "message": self.message,
            "aggr_id": self.aggr_id,
            "started": _utc(self.started),
            "finished": _utc(self.finished),
            "elapsed_seconds": round((self.finished or time.time()) - self.started, 3),
            "key_node": self.key_node,
            "iter_start": self.iter_start,
            "iter_stop": self.iter_stop,
        }


IDLE = {
    "status": "idle",
    "message": "",
    "aggr_id": None,
    "started": None,
    "finished": None,
    "elapsed_seconds": None,
    "key_node": None,
    "iter_start": None,
    "iter_stop": None,
}


def without_paths(message: str, database: str) -> str:
    """The engine's message as a browser may see it: the database's absolute path (and its directory) become
    its file name, as does the path of a file a suggested command names (`--database=`), so the server's file
    layout is not disclosed."""
    name = os.path.basename(database)
    for path in sorted({database, os.path.realpath(database), os.path.abspath(database)}, key=len, reverse=True):
        message = message.replace(path, name)
    for folder in sorted(
        {os.path.dirname(database), os.path.dirname(os.path.realpath(database))}, key=len, reverse=True
    ):
        if len(folder) > 1:
            message = message.replace(folder + os.sep, "").replace(folder, ".")
    # a command the engine suggests may name another file by its path (the export a database was made from)
    return re.sub(r"--database=('[^']*'|[^\s:)]+)", _file_name_only, message)


def _file_name_only(match: re.Match) -> str:
    try:
        path = shlex.split(match.group(1))[0]
    except ValueError:  # a quote the shell would not close: the text as it is
        path = match.group(1)
    return "--database=" + shlex.quote(os.path.basename(path))


def command(database: str, key_node, iter_start, iter_stop) -> list[str]:
    cmd = [sys.executable, "-m", "dlprof_profiler.run.reaggregate", f"--database={database}"]
    if key_node is not None:
        cmd.append(f"--key_node={key_node}")  # joined: a key node may start with '-'
    if iter_start is not None:
        cmd.append(f"--iter_start={int(iter_start)}")
    if iter_stop is not None:
        cmd.append(f"--iter_stop={int(iter_stop)}")
    return cmd


class JobManager:
    def __init__(self, on_finish=None, aggregations=None):
        """aggregations(database) -> its aggregations rows (aggr_id, key_node, iter_start, iter_stop), to
        recognize the work of an engine process that was killed after its commit."""
        self._lock = threading.Lock()
        self._jobs: dict[str, Job] = {}
        self._on_finish = on_finish
        self._aggregations = aggregations

    def _newest_id(self, database: str):
        rows = self._rows(database)
        return max((r["aggr_id"] for r in rows), default=None) if rows is not None else None

    def _rows(self, database: str):
        if self._aggregations is None:
            return None
        try:
            return list(self._aggregations(database))
        except Exception:  # noqa: BLE001 - unreadable now (a hot journal, say): nothing to recognize
            return None

    def _committed_by(self, job: Job):
        """The aggregation a job's engine added (it was killed after committing, before saying so), or None."""
        since = _utc(job.started - 1)  # created by this job: not before it started (ISO strings compare)
        for row in reversed(self._rows(job.database) or []):
            if job.aggr_before is not None and row["aggr_id"] <= job.aggr_before:
                break
            if str(row.get("created_utc") or "") < since:
                continue
            if all(
                want is None or row.get(name) == want
                for name, want in (
                    ("key_node", job.key_node),
                    ("iter_start", job.iter_start),
                    ("iter_stop", job.iter_stop),
                )
            ):
                return row["aggr_id"]
        return None

    def status(self, database: str) -> dict:
        with self._lock:
            job = self._jobs.get(database)
            return job.to_json() if job else dict(IDLE)

    def running(self, database: str) -> bool:
        with self._lock:
            job = self._jobs.get(database)
            return bool(job and job.status == "running")

    def start(self, database: str, key_node=None, iter_start=None, iter_stop=None) -> dict:
        with self._lock:
            current = self._jobs.get(database)
            if current and current.status == "running":
                raise JobConflict(
                    f"a re-aggregation of this database is already running (started "
                    f"{_utc(current.started)}); wait for it to finish"
                )
            job = Job(database, key_node, iter_start, iter_stop)
            job.aggr_before = self._newest_id(database)
            env = dict(os.environ, PYTHONUNBUFFERED="1")
            try:
                # own session: a Ctrl+C in the server's terminal does not interrupt the engine mid-write
                job.proc = subprocess.Popen(
                    command(database, key_node, iter_start, iter_stop),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    env=env,
                    cwd=os.path.dirname(database) or None,
                    start_new_session=(os.name == "posix"),
                )
            except OSError as exc:
                job.status, job.message, job.finished = (
                    "failed",
                    f"could not start the re-aggregation: {exc}",
                    time.time(),
                )
                self._jobs[database] = job
                return job.to_json()
            self._jobs[database] = job
            threading.Thread(target=self._watch, args=(job,), name="dlprof-reaggregate", daemon=True).start()
            return job.to_json()

    def _watch(self, job: Job) -> None:
        proc = job.proc
        try:
            out, err = proc.communicate(timeout=JOB_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            err = f"killed after {JOB_TIMEOUT_S} s\n" + (err or "")
        result = None
        for line in reversed((out or "").splitlines()):
            line = line.strip()
            if line.startswith("{"):
                try:
                    result = json.loads(line)
                    break
                except ValueError:
                    continue
        committed = None if result else self._committed_by(job)
        with self._lock:
            job.finished = time.time()
            if proc.returncode == 0 and result and result.get("status") == "succeeded":
                job.status = "succeeded"
                job.aggr_id = result.get("aggr_id")
                job.message = f"aggregation {job.aggr_id} added"
            elif committed is not None:
                job.status = "succeeded"
                job.aggr_id = committed
                job.message = (
                    f"aggregation {committed} added (the engine process ended with status "
                    f"{proc.returncode} after committing it)"
                )
            else:
                job.status = "failed"
                if result and result.get("message"):
                    message = str(result["message"])
                else:
                    tail = [ln for ln in (err or "").strip().splitlines() if ln.strip()][-3:]
                    message = " | ".join(tail) or f"re-aggregation exited with status {proc.returncode}"
                job.message = without_paths(message, job.database)[:MAX_MESSAGE]
        if self._on_finish:
            try:
                self._on_finish(job)
            except Exception:  # noqa: BLE001 - a callback must not kill the watcher
                pass

    def shutdown(self, timeout: float = 15.0) -> None:
        """Stop running jobs (the viewer's exit): SIGINT, so the engine's transaction is rolled back cleanly
        (a killed writer would leave a hot journal); kill only if it does not stop in time."""
        with self._lock:
            jobs = [j for j in self._jobs.values() if j.status == "running" and j.proc]
        for job in jobs:
            try:
                job.proc.send_signal(signal.SIGINT if os.name == "posix" else signal.SIGTERM)
            except OSError:
                pass
        deadline = time.monotonic() + timeout
        for job in jobs:
            try:
                job.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                job.proc.kill()
