"""Hardening catalogue (issue 14): hostile inputs and conditions, one test per case with a readable id.

Each command-line case states its input, the expected exit status and what the user is told; every case
also checks that the input file is unchanged (SHA-256 and mtime), that a failure leaves no output at all
(not even the output folder it created, a staging folder or a lock file) and that no traceback is shown.
The HTTP cases run a real dlprofviewer and a real TensorBoard (with --path_prefix) and state the expected
HTTP status; every refused request leaves the database byte-for-byte unchanged. Browser cases (a page of
another origin submitting a form and a fetch): tests/test_browser_security.py.
"""

from __future__ import annotations

import contextlib
import csv
import http.client
import io
import json
import os
import resource
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest

from dlprof_plugin import jobs as jobs_mod
from dlprof_plugin.security import REQUEST_HEADER
from dlprof_profiler import log
from dlprof_profiler.cli import main as cli
from dlprof_profiler.outputs.publish import LOCK_NAME, STAGING_PREFIX
from tests import profiles
from tests.damage import damaged_copy, sha256
from tests.nsys_builder import NsysExport
from tests.test_plugin_checks import free_port, stop
from tests.waiting import wait_until

T0 = profiles.BASE  # training_profile: iteration i starts at T0 + i * 100_000
BUSY_PER_ITERATION = 37_000  # its GPU busy time per iteration (no overlaps), 3 iterations
WALL = 290_000  # first recorded event (T0) to the last sync's end (T0 + 290_000)
ROOT = Path(__file__).resolve().parents[1]
HTML_OP = '<img src=x onerror="window.__xss=1">'
HTML_KERNEL = "<script>window.__xss=2</script>"
BAD_UTF8_KERNEL = b"k_\xff_kernel"  # written as TEXT: not valid UTF-8
NOT_NULL_TABLES = [
    "NVTX_EVENTS",
    "CUPTI_ACTIVITY_KIND_RUNTIME",
    "CUPTI_ACTIVITY_KIND_KERNEL",
    "CUPTI_ACTIVITY_KIND_MEMCPY",
]


# ---------------------------------------------------------------------------- inputs


def hostile_names_profile(path: Path) -> Path:
    """Three `step` scopes, each with a leaf range whose name is HTML (launching a kernel named with HTML) and a
    leaf range launching a kernel whose name is not valid UTF-8 (generic NVTX mode: leaves are ops)."""
    exp = NsysExport(schema="2022.4")
    exp.add_gpu(device_id=0)
    t = exp.add_thread(pid=100, tid=100, name="python", process_name="python")
    for i in range(3):
        base = T0 + i * 100_000
        exp.push_pop(t, base, base + 50_000, "step")
        exp.push_pop(t, base + 1000, base + 9000, HTML_OP)
        exp.launch(t, base + 2000, base + 3000, base + 4000, base + 8000, kernel=HTML_KERNEL)
        exp.push_pop(t, base + 10_000, base + 19_000, "bad_name_op")
        exp.launch(t, base + 11_000, base + 12_000, base + 13_000, base + 15_000, kernel="BAD_UTF8_KERNEL")
    exp.set_session(start_time=0)
    path = exp.write(path)
    con = sqlite3.connect(path)
    con.execute("UPDATE StringIds SET value = CAST(? AS TEXT) WHERE value = 'BAD_UTF8_KERNEL'", (BAD_UTF8_KERNEL,))
    con.commit()
    con.close()
    return path


def duplicate_ids_profile(path: Path) -> Path:
    """Process 100 reuses correlation id 5: calls [100, 200) and [1000, 1500); kernel A [300, 400) follows the
    first, kernel B [1600, 1700) the second (500 ns of launch-API time)."""
    exp = NsysExport(schema="2022.4")
    exp.add_gpu(device_id=0)
    t = exp.add_thread(pid=100, tid=100, name="python", process_name="python")
    exp.runtime(t, 100, 200, correlation_id=5)
    exp.runtime(t, 1000, 1500, correlation_id=5)
    exp.kernel(100, 5, 300, 400, "kernel_A")
    exp.kernel(100, 5, 1600, 1700, "kernel_B")
    exp.set_session(start_time=0)
    return exp.write(path)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """The shared, never written inputs: the training export, a DLProf database of it, hostile names."""
    root = tmp_path_factory.mktemp("hardening")
    export = profiles.training_profile(root / "training.sqlite")
    code, _ = run_cli(f"--database={export}", f"--output_path={root / 'db'}", "--reports=summary")
    assert code == 0
    hostile = hostile_names_profile(root / "hostile.sqlite")
    return {"root": root, "export": export, "db": root / "db" / "dlprof_dldb.sqlite", "hostile": hostile}


# ---------------------------------------------------------------------------- running the command line


def run_cli(*argv: str) -> tuple[int, str]:
    """`dlprof ARGS` in this process (the console script's entry point): (exit status, stderr)."""
    err, out = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            code = cli.main(list(argv))
    finally:
        log.set_verbosity(log.INFO)
    return code, err.getvalue()


def dlprof_process(*argv: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "dlprof_profiler", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        **kwargs,
    )


def error_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("[DLProf-") and " ERROR: " in lines[0], stderr
    return lines[0]


def tree(folder: Path) -> dict:
    """Every file below a folder with its hash (what 'unchanged' means for an output folder)."""
    if not folder.exists():
        return {}
    return {str(p.relative_to(folder)): (sha256(p) if p.is_file() else "dir") for p in sorted(folder.rglob("*"))}


def negative_cells(folder: Path) -> list:
    """Numbers below zero in any CSV report (durations, counts and percentages never are)."""
    found = []
    for report in folder.glob("*.csv"):
        for row in csv.reader(report.read_text(encoding="utf-8").splitlines()):
            for cell in row:
                try:
                    if float(cell.replace(",", "")) < 0:
                        found.append((report.name, row))
                except ValueError:
                    continue
    return found


def summary_value(folder: Path, label: str) -> str:
    for row in csv.reader((folder / "dlprof_summary.csv").read_text().splitlines()):
        if len(row) == 2 and row[0] == label:
            return row[1]
    raise KeyError(label)


# ---------------------------------------------------------------------------- command-line cases


@dataclass
class Case:
    id: str
    make: Callable  # make(work, base) -> (input to keep unchanged or None, extra args)
    exit: int
    says: tuple = ()  # in the one error line (failures) or in stderr (success)
    check: Callable | None = None  # check(output folder) for runs that succeed
    output_exists: bool = False  # the output folder exists before the run (then it must stay as it was)
    marks: list = field(default_factory=list)


def _copy(name, content=None, *, cut=None, garbage=False):
    def make(work, base):
        path = work / name
        if content is not None:
            path.write_bytes(content)
        elif cut is not None:
            path.write_bytes(base["export"].read_bytes()[: cut(base["export"].stat().st_size)])
        elif garbage:
            data = bytearray(base["export"].read_bytes())
            data[2 * 4096 : 8 * 4096] = b"\xff" * (6 * 4096)
            path.write_bytes(bytes(data))
        return path, [f"--database={path}"]

    return make


def _damaged(*statements, nullable=(), source="export", extra=()):
    def make(work, base):
        path = damaged_copy(base[source], work / "input.sqlite", *statements, nullable=nullable)
        return path, [f"--database={path}", *extra]

    return make


def _export(*extra, source="export"):
    def make(work, base):
        path = work / "input.sqlite"
        shutil.copy(base[source], path)
        return path, [f"--database={path}", *extra]

    return make


def _missing(work, base):
    return None, [f"--database={work / 'missing.sqlite'}"]


def _directory(work, base):
    (work / "adir.sqlite").mkdir()
    return None, [f"--database={work / 'adir.sqlite'}"]


def _foreign(work, base):
    path = work / "people.sqlite"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE people (name TEXT)")
    con.commit()
    con.close()
    return path, [f"--database={path}"]


def _duplicate_ids(work, base):
    path = duplicate_ids_profile(work / "dup.sqlite")
    return path, [f"--database={path}", "--reports=kernel"]


def _output_is_a_file(work, base):
    path, args = _export()(work, base)
    (work / "out").write_text("not a folder")
    return path, args


def _existing_outputs(work, base):
    path, args = _export("--reports=summary")(work, base)
    code, _ = run_cli(*args, f"--output_path={work / 'out'}")
    assert code == 0
    return path, args


def _output_replaces_input(work, base):
    (work / "out").mkdir()
    path = work / "out" / "dlprof_dldb.sqlite"
    shutil.copy(base["db"], path)
    return path, [f"--database={path}"]


def _gpu_utilization(expected: str):
    def check(out):
        assert summary_value(out, "GPU Utilization %") == expected
        assert summary_value(out, "Wall Clock Time (ns)") == str(WALL)

    return check


def _kernel_api_times(out):
    rows = list(csv.DictReader((out / "dlprof_kernel.csv").read_text().splitlines()[1:]))
    api = {r["Kernel Name"]: int(r["Total API Time (ns)"]) for r in rows}
    assert api == {"kernel_A": 100, "kernel_B": 500}, rows


def _hostile_names_verbatim(out):
    kernels = (out / "dlprof_kernel.csv").read_text(encoding="utf-8")
    assert HTML_KERNEL in kernels and "k_\ufffd_kernel" in kernels
    detail = json.loads((out / "dlprof_detailed.json").read_text(encoding="utf-8"))
    cells = [str(cell) for section in detail["sections"] for row in section["rows"] for cell in row]
    assert f"/step/{HTML_OP}" in cells and HTML_OP in cells


KERNEL_NULL = "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = NULL WHERE start = {}"
CASES = [
    Case("missing-file", _missing, 1, ("missing.sqlite: no such file",)),
    Case("directory", _directory, 1, ("is a directory",)),
    Case("empty-file", _copy("empty.sqlite", b""), 1, ("empty file",)),
    Case("text-file", _copy("notes.sqlite", b"these are notes, not a database\n" * 20), 1, ("not an SQLite database",)),
    Case("truncated-half", _copy("cut.sqlite", cut=lambda n: n // 2), 1, ("truncated SQLite file",)),
    Case("truncated-header", _copy("cut.sqlite", cut=lambda n: 60), 1, ("truncated SQLite file",)),
    Case("garbage-pages", _copy("garbage.sqlite", garbage=True), 1, ("damaged or truncated SQLite file",)),
    Case("foreign-sqlite", _foreign, 1, ("not an Nsight Systems export or DLProf database",)),
    Case(
        "export-without-StringIds",
        _damaged("DROP TABLE StringIds"),
        1,
        ("input.sqlite: damaged Nsight Systems export", "StringIds"),
    ),
    Case(
        "dlprof-db-missing-iteration_list",
        _damaged("DROP TABLE iteration_list", source="db"),
        1,
        ("input.sqlite: damaged DLProf database: table iteration_list missing",),
    ),
    Case(
        "dlprof-db-missing-raw-table",
        _damaged("DROP TABLE raw_gpu_activities", source="db"),
        1,
        ("input.sqlite: damaged DLProf database: table raw_gpu_activities missing",),
    ),
    Case(
        "dlprof-db-newer-schema",
        _damaged("UPDATE db_version SET current_version = '9.0'", source="db"),
        1,
        ("input.sqlite: DLProf database schema 9.0 is not supported",),
    ),
    Case(
        "nvtx-start-null",
        _damaged(
            f"UPDATE NVTX_EVENTS SET start = NULL WHERE start IN ({T0 + 6000}, {T0 + 21000})", nullable=NOT_NULL_TABLES
        ),
        0,
        ("dropped rows with impossible timestamps: 2 NVTX ranges (2 without a start or end time)",),
        _gpu_utilization(f"{100 * 3 * BUSY_PER_ITERATION / WALL:.1f}"),
    ),
    Case(
        "runtime-start-and-end-null",
        _damaged(
            f"UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET start = NULL WHERE start = {T0 + 12000}",
            f'UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET "end" = NULL WHERE start = {T0 + 22000}',
            nullable=NOT_NULL_TABLES,
        ),
        0,
        ("2 CUDA API calls (2 without a start or end time)",),
        _gpu_utilization(f"{100 * 3 * BUSY_PER_ITERATION / WALL:.1f}"),
    ),
    # busy time without the first TC_CONV kernel: 3 * 37_000 - 10_000 = 101_000 of 290_000 ns = 34.83 %
    Case(
        "kernel-start-null",
        _damaged(KERNEL_NULL.format(T0 + 14000), nullable=NOT_NULL_TABLES),
        0,
        ("1 GPU activities (1 without a start or end time)",),
        _gpu_utilization("34.8"),
    ),
    Case(
        "reversed-times",
        _damaged(
            f'UPDATE NVTX_EVENTS SET "end" = start - 1 WHERE start = {T0 + 21000}',
            f'UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET start = "end" + 500 WHERE start = {T0 + 22000}',
            f'UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET "end" = start - 2000 WHERE start = {T0 + 25000}',
        ),
        0,
        (
            (
                "1 NVTX ranges (1 ending before they start); 1 CUDA API calls (1 ending before they start); "
                "1 GPU activities (1 ending before they start)"
            ),
        ),
        _gpu_utilization(f"{100 * (3 * BUSY_PER_ITERATION - 2000) / WALL:.1f}"),
    ),
    Case(
        "every-timestamp-missing",
        _damaged(*(f"UPDATE {t} SET start = NULL" for t in NOT_NULL_TABLES), nullable=NOT_NULL_TABLES),
        1,
        ("input.sqlite: no usable events", "missing or reversed timestamp"),
    ),
    Case(
        "duplicate-correlation-ids",
        _duplicate_ids,
        0,
        ("1 correlation id(s) are used by more than one CUDA API call of the same process (2 calls)",),
        _kernel_api_times,
    ),
    Case(
        "key-node-not-found",
        _export("--key_node=NoSuchNode"),
        0,
        ("key node 'NoSuchNode' not found: the whole profile is one iteration",),
    ),
    Case(
        "reports-bogus-value", _export("--reports", "summary", "bogus", "--"), 2, ("--reports: unknown value 'bogus'",)
    ),
    Case("formats-bogus-value", _export("--formats=csv,pdf"), 2, ("unknown value 'pdf'",)),
    Case("iter-range-outside-profile", _export("--iter_start=7"), 2, ("outside the profile",)),
    Case("iter-stop-below-start", _export("--iter_start=2", "--iter_stop=1"), 2, ("below --iter_start 2",)),
    Case("base-name-path-traversal", _export("--base_name=../escape"), 2, ("invalid name '../escape'",)),
    Case(
        "output-path-is-a-file",
        _output_is_a_file,
        1,
        ("output path exists and is not a directory",),
        output_exists=True,
    ),
    Case("existing-outputs-without-force", _existing_outputs, 1, ("output file exists", "--force"), output_exists=True),
    Case(
        "output-would-replace-input",
        _output_replaces_input,
        2,
        ("the output database would replace the input",),
        output_exists=True,
    ),
    Case(
        "html-in-names",
        _export("--reports=kernel,detail", "--formats=csv,json", source="hostile"),
        0,
        check=_hostile_names_verbatim,
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_cli(case, base, tmp_path):
    work = tmp_path
    source, args = case.make(work, base)
    out = work / "out"
    before = (sha256(source), source.stat().st_mtime_ns) if source is not None and source.is_file() else None
    outputs_before = tree(out) if case.output_exists else None
    code, stderr = run_cli(*args, f"--output_path={out}", "-v", "minimal")
    assert code == case.exit, stderr
    assert "Traceback" not in stderr
    if before is not None:
        assert (sha256(source), source.stat().st_mtime_ns) == before, "the input was modified"
    if case.exit:
        line = error_line(stderr)
        for text in case.says:
            assert text in line, line
        assert ".dlprof-staging" not in line
        if case.output_exists:
            assert tree(out) == outputs_before, "a rejected run changed the output folder"
        else:
            assert not out.exists(), list(out.rglob("*"))
    else:
        for text in case.says:
            assert text in stderr, stderr
        assert not list(out.glob(f"{STAGING_PREFIX}*")) and not (out / LOCK_NAME).exists()
        assert (out / "dlprof_dldb.sqlite").is_file()
        assert negative_cells(out) == []
        if case.check:
            case.check(out)
    assert not list(work.glob(f"{source.name}-journal" if source else "*-journal"))


@pytest.mark.slow
def test_cli_dropped_rows_are_left_out_of_the_database_too(base, tmp_path):
    """The raw tables copied into the database hold the rows the analysis used (ids match), so re-aggregating
    the database gives the same figures."""
    path = damaged_copy(
        base["export"],
        tmp_path / "k.sqlite",
        KERNEL_NULL.format(T0 + 14000),
        f'UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET start = "end" + 1 WHERE start = {T0 + 22000}',
        nullable=NOT_NULL_TABLES,
    )
    assert run_cli(f"--database={path}", f"--output_path={tmp_path / 'a'}", "--reports=summary")[0] == 0
    db = tmp_path / "a" / "dlprof_dldb.sqlite"
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    gpu = con.execute(
        'SELECT count(*), min(activity_id), max(activity_id), min("end" - start) FROM read_only_gpu_activities'
    ).fetchone()
    api = con.execute('SELECT count(*), max(api_id), min("end" - start) FROM read_only_cuda_calls').fetchone()
    con.close()
    # per iteration 7 GPU activities and 8 API calls (memcpy, six launches, a synchronize); one of each dropped
    assert gpu == (3 * 7 - 1, 0, 3 * 7 - 2, 1000) and api == (3 * 8 - 1, 3 * 8 - 2, 1000)
    assert run_cli(f"--database={db}", f"--output_path={tmp_path / 'b'}", "--reports=summary")[0] == 0
    assert (
        summary_value(tmp_path / "b", "GPU Utilization %")
        == summary_value(tmp_path / "a", "GPU Utilization %")
        == "34.8"
    )


@pytest.mark.slow
def test_cli_report_write_failure_is_one_line_without_output(base, tmp_path, monkeypatch):
    """A write that fails mid-run (disk full on a report) names the final file, never the staging path."""
    from dlprof_profiler.outputs import reports

    def full(report, out_dir, base_name, formats, suffix, path_of):
        target = path_of(out_dir / f"{base_name}_summary.csv")
        raise OSError(28, "No space left on device", str(target))

    monkeypatch.setattr(reports, "write_report", full)
    out = tmp_path / "out"
    code, stderr = run_cli(f"--database={base['export']}", f"--output_path={out}")
    assert code == 1
    assert error_line(stderr).endswith(f"ERROR: {out / 'dlprof_summary.csv'}: No space left on device")
    assert not out.exists()


# ---------------------------------------------------------------------------- processes: kill, disk full, concurrency


@pytest.mark.slow
def test_cli_disk_full_file_size_limit(base, tmp_path):
    """RLIMIT_FSIZE (the run may not grow a file past 100 kB) stands in for a full disk."""

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))

    out = tmp_path / "out"
    before = sha256(base["export"])
    proc = dlprof_process(f"--database={base['export']}", f"--output_path={out}", "--reports=all", preexec_fn=limit)
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 1
    assert f"ERROR: {out / 'dlprof_dldb.sqlite'}: could not write the database" in error_line(stderr)
    assert not out.exists() and sha256(base["export"]) == before


@pytest.mark.slow
def test_cli_two_runs_into_one_folder(base, tmp_path):
    """The second run fails at once naming the folder and the first run's pid; the first completes."""
    out = tmp_path / "out"
    first = dlprof_process(f"--database={base['export']}", f"--output_path={out}", "--reports=all")
    wait_until(lambda: (out / LOCK_NAME).is_file() and (out / LOCK_NAME).read_text().strip(), 60, "the lock")
    first.send_signal(signal.SIGSTOP)  # held while it runs, however fast this machine analyses the export
    try:
        started = time.monotonic()
        second = dlprof_process(f"--database={base['export']}", f"--output_path={out}", "--force")
        _, stderr = second.communicate(timeout=60)
    finally:
        first.send_signal(signal.SIGCONT)
    assert second.returncode == 1 and time.monotonic() - started < 30
    assert f"ERROR: {out}: another dlprof run (pid {first.pid}) is writing to this output folder" in error_line(stderr)
    _, stderr = first.communicate(timeout=300)
    assert first.returncode == 0, stderr
    assert (out / "dlprof_iteration.csv").is_file() and not (out / LOCK_NAME).exists()


@pytest.mark.slow
def test_cli_kill_9_while_writing_then_the_next_run_cleans_up(base, tmp_path):
    """kill -9 while the database is being written: no output appears (only the killed run's staging folder
    and lock file); the next run removes them and succeeds."""
    export = profiles.training_profile(tmp_path / "long.sqlite", iterations=300)
    before = sha256(export)
    out = tmp_path / "out"
    proc = dlprof_process(f"--database={export}", f"--output_path={out}", "--reports=all")
    # the raw copy starts after ingest
    wait_until(lambda: list(out.glob(f"{STAGING_PREFIX}*/dlprof_dldb.sqlite")), 120, "the staged database", proc, 0.01)
    proc.kill()
    proc.wait(timeout=30)
    left = sorted(p.name for p in out.iterdir())
    assert len(left) == 2 and LOCK_NAME in left, left
    assert next(n for n in left if n != LOCK_NAME).startswith(f"{STAGING_PREFIX}{proc.pid}@"), left
    assert sha256(export) == before
    code, stderr = run_cli(f"--database={export}", f"--output_path={out}", "--reports=summary")
    assert code == 0, stderr
    assert sorted(p.name for p in out.iterdir()) == ["dlprof", "dlprof_dldb.sqlite", "dlprof_summary.csv"]


# ---------------------------------------------------------------------------- HTTP: dlprofviewer


def request(
    port: int, method: str, path: str, headers: dict | None = None, body: bytes | None = None, timeout: float = 30
) -> tuple[int, dict, bytes]:
    """One HTTP request with exactly these headers (Host included; None leaves a header out), raw path."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        hdrs = {"Host": f"127.0.0.1:{port}", **(headers or {})}
        conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        for name, value in hdrs.items():
            if value is not None:
                conn.putheader(name, value)
        if body is not None:
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def _viewer_command() -> list[str]:
    exe = Path(sys.executable).parent / "dlprofviewer"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "dlprof_plugin.viewer"]


@pytest.fixture(scope="module")
def viewer(base, tmp_path_factory):
    """dlprofviewer on two databases: `hostile_dldb` (hostile names; never written: its hash is checked) and
    `reagg_dldb` (the training profile, re-aggregated by the accepted requests)."""
    work = tmp_path_factory.mktemp("viewer")
    assert (
        run_cli(f"--database={base['hostile']}", f"--output_path={work}", "--base_name=hostile", "--reports=summary")[0]
        == 0
    )
    shutil.copy(base["db"], work / "reagg_dldb.sqlite")
    port = free_port()
    log_file = open(work / "viewer.log", "w")
    proc = subprocess.Popen(
        _viewer_command()
        + [
            str(work / "hostile_dldb.sqlite"),
            str(work / "reagg_dldb.sqlite"),
            f"--port={port}",
            "--host=127.0.0.1",
            "--allowed_hosts=viewer.test",
        ],
        stdout=log_file,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        cwd=ROOT,
    )
    try:
        wait_until(
            lambda: request(port, "GET", "/data/plugin/dlprof/runs", timeout=5)[0] == 200, 60, "dlprofviewer", proc
        )
        yield {
            "port": port,
            "hostile": work / "hostile_dldb.sqlite",
            "reagg": work / "reagg_dldb.sqlite",
            "log": work / "viewer.log",
        }
    finally:
        stop(proc)
        log_file.close()


API = "/data/plugin/dlprof/"
GOOD_BODY = json.dumps({"run": "hostile_dldb", "iter_start": 0, "iter_stop": 0}).encode()


def _same_origin(port):
    return {"Origin": f"http://127.0.0.1:{port}", REQUEST_HEADER: "1", "Content-Type": "application/json"}


# (id, method, path, headers(port), body, status)
CSRF_CASES = [
    (
        "form-text-plain",
        "POST",
        "reaggregate",
        lambda p: {"Content-Type": "text/plain", "Origin": "http://evil.example"},
        GOOD_BODY,
        403,
    ),
    (
        "form-urlencoded",
        "POST",
        "reaggregate",
        lambda p: {"Content-Type": "application/x-www-form-urlencoded", "Origin": "http://evil.example"},
        b"run=hostile_dldb&iter_start=0",
        403,
    ),
    (
        "form-multipart",
        "POST",
        "reaggregate",
        lambda p: {"Content-Type": "multipart/form-data; boundary=x", "Origin": "null"},
        b'--x\r\nContent-Disposition: form-data; name="run"\r\n\r\nhostile_dldb\r\n--x--\r\n',
        403,
    ),
    (
        "json-without-request-header",
        "POST",
        "reaggregate",
        lambda p: {"Content-Type": "application/json", "Origin": f"http://127.0.0.1:{p}"},
        GOOD_BODY,
        403,
    ),
    (
        "header-with-text-plain",
        "POST",
        "reaggregate",
        lambda p: {**_same_origin(p), "Content-Type": "text/plain"},
        GOOD_BODY,
        403,
    ),
    (
        "foreign-origin",
        "POST",
        "reaggregate",
        lambda p: {**_same_origin(p), "Origin": "http://evil.example"},
        GOOD_BODY,
        403,
    ),
    ("origin-null", "POST", "reaggregate", lambda p: {**_same_origin(p), "Origin": "null"}, GOOD_BODY, 403),
    (
        "origin-other-port",
        "POST",
        "reaggregate",
        lambda p: {**_same_origin(p), "Origin": f"http://127.0.0.1:{p + 1}"},
        GOOD_BODY,
        403,
    ),
    (
        "foreign-referer",
        "POST",
        "reaggregate",
        lambda p: {**_same_origin(p), "Origin": None, "Referer": "http://evil.example/attack.html"},
        GOOD_BODY,
        403,
    ),
    ("bare-route-form", "POST", "/reaggregate", lambda p: {"Content-Type": "text/plain"}, GOOD_BODY, 403),
    (
        "rebinding-post",
        "POST",
        "reaggregate",
        lambda p: {**_same_origin(p), "Host": f"attacker.example:{p}", "Origin": f"http://attacker.example:{p}"},
        GOOD_BODY,
        403,
    ),
    ("rebinding-get-runs", "GET", "runs", lambda p: {"Host": f"attacker.example:{p}"}, None, 403),
    ("rebinding-get-page", "GET", "/", lambda p: {"Host": f"attacker.example:{p}"}, None, 403),
    ("rebinding-get-static", "GET", "index.js", lambda p: {"Host": f"attacker.example:{p}"}, None, 403),
    (
        "rebinding-get-table",
        "GET",
        "table/ops?run=hostile_dldb",
        lambda p: {"Host": f"attacker.example:{p}"},
        None,
        403,
    ),
    ("rebinding-localhost-suffix", "GET", "runs", lambda p: {"Host": f"localhost.attacker.example:{p}"}, None, 403),
    ("host-localhost", "GET", "runs", lambda p: {"Host": f"localhost:{p}"}, None, 200),
    ("host-ipv6-loopback", "GET", "runs", lambda p: {"Host": f"[::1]:{p}"}, None, 200),
    ("host-allowed-by-flag", "GET", "runs", lambda p: {"Host": f"viewer.test:{p}"}, None, 200),
    ("no-host-header", "GET", "runs", lambda p: {"Host": None}, None, 200),
    ("nested-json-5000", "POST", "reaggregate", _same_origin, b"[" * 5000 + b"]" * 5000, 400),
    ("nested-json-in-field", "POST", "reaggregate", _same_origin, b'{"run": ' + b"[" * 5000 + b"]" * 5000 + b"}", 400),
    ("body-too-large", "POST", "reaggregate", _same_origin, b" " * (65 * 1024) + b"{}", 413),
    ("body-not-json", "POST", "reaggregate", _same_origin, b"run=hostile_dldb", 400),
    (
        "preflight-options",
        "OPTIONS",
        "reaggregate",
        lambda p: {"Origin": "http://evil.example", "Access-Control-Request-Method": "POST"},
        None,
        405,
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize("case", CSRF_CASES, ids=[c[0] for c in CSRF_CASES])
def test_viewer_request(case, viewer):
    _, method, route, headers, body, status = case
    port = viewer["port"]
    before = sha256(viewer["hostile"])
    path = route if route.startswith("/") else API + route
    code, resp_headers, payload = request(port, method, path, headers(port), body)
    assert code == status, payload[:300]
    if status != 200:
        assert resp_headers["content-type"].startswith("application/json")
        assert isinstance(json.loads(payload)["error"], str)
        assert not any(k.startswith("access-control-allow") for k in resp_headers)
    _, _, job = request(port, "GET", API + "reaggregate_status?run=hostile_dldb")
    assert json.loads(job)["job"]["status"] == "idle"
    assert sha256(viewer["hostile"]) == before


TRAVERSAL = [  # raw request paths: the API prefix, the viewer's bare routes, and the run/domain parameters
    API + "../../../etc/passwd",
    API + "..%2F..%2F..%2Fetc%2Fpasswd",
    API + "%2e%2e/%2e%2e/etc/passwd",
    API + "%252e%252e%252fetc%252fpasswd",
    API + "....//....//etc/passwd",
    API + "..\\..\\etc\\passwd",
    API + "..%5c..%5cetc%5cpasswd",
    API + "%2fetc%2fpasswd",
    API + "/etc/passwd",
    API + "index.js%00.png",
    API + "..;/..;/etc/passwd",
    API + ".%2e/.%2e/etc/passwd",
    API + "__init__.py",
    API + ".hidden.js",
    API + "%c0%ae%c0%ae/%c0%ae%c0%ae/etc/passwd",
    "/../../../etc/passwd",
    "/..%2f..%2fetc%2fpasswd",
    API + "runs?run=../../etc/passwd",
    API + "dashboard?run=..%2F..%2Fetc%2Fpasswd",
    API + "dashboard?run=/etc/passwd",
    API + "dashboard?run=C:%5CWindows%5Cwin.ini",
    API + "dashboard?run=%5C%5Cserver%5Cshare",
    API + "dashboard?run=hostile_dldb/../../x",
    API + "dashboard?run=%00",
    API + "table/ops?run=hostile_dldb&domain=../../x",
    API + "dashboard?run=hostile_dldb&domain=/etc/passwd",
]


@pytest.mark.slow
def test_viewer_path_traversal_in_routes_and_parameters(viewer):
    """27 forms (26 paths above and a POST naming a path as its run): 400 or 404, never a file's content."""
    port = viewer["port"]
    for path in TRAVERSAL:
        code, headers, body = request(port, "GET", path)
        if path.startswith(API + "runs?"):  # runs takes no run parameter: the listing, no file
            assert code == 200 and b"root:" not in body
            continue
        assert code in (400, 404), (path, code, body[:200])
        assert b"root:" not in body and headers["content-type"].startswith("application/json"), path
    code, _, body = request(
        port, "POST", API + "reaggregate", _same_origin(port), json.dumps({"run": "../../etc/passwd"}).encode()
    )
    assert code == 400 and b"root:" not in body
    assert len(TRAVERSAL) + 1 == 27


SQL_PAYLOADS = [
    "'",
    "' OR '1'='1",
    "1 OR 1=1",
    "1; DROP TABLE aggregations; --",
    '" OR ""="',
    "%' UNION SELECT name, sql FROM sqlite_master --",
    ") OR (1=1",
    "\\",
    "%",
]
SQL_ROUTES = {
    "dashboard": ["run", "aggr", "domain"],
    "gpus": ["aggr", "domain"],
    "iterations": ["aggr", "domain"],
    "expert_systems": ["aggr", "domain"],
    "op": ["op_index", "aggr", "domain"],
    "aggregations": ["run"],
    "domains": ["run"],
    "system": ["run"],
    "reaggregate_status": ["run"],
    "table/ops": [
        "run",
        "aggr",
        "domain",
        "sort",
        "order",
        "q",
        "offset",
        "limit",
        "format",
        "col.op_name",
        "col.gpu_total",
        "col.using_tc",
    ],
    "table/kernels": ["op_index", "q", "col.kernel_name"],
    "table/group_ops": ["parent"],
    "table/iteration_kernels": ["iteration", "sort"],
    "table/iteration_ops": ["iteration", "q"],
    "table/key_nodes": ["q", "col.name"],
    "table/expert_systems": ["q"],
}


@pytest.mark.slow
def test_viewer_sql_injection_in_every_route_parameter(viewer):
    """Every payload in every parameter of every route: answered (200, 400, 404), never 500; text searches
    match the payload literally (no op name contains it); the database is unchanged."""
    import urllib.parse

    port, db = viewer["port"], viewer["hostile"]
    before = sha256(db)
    defaults = {"run": "hostile_dldb", "op_index": "0", "iteration": "0"}
    count = 0
    for route, names in SQL_ROUTES.items():
        for name in names:
            for payload in SQL_PAYLOADS:
                params = {k: v for k, v in defaults.items() if k != name and (k == "run" or k in names)}
                params[name] = payload
                code, _, body = request(port, "GET", API + route + "?" + urllib.parse.urlencode(params))
                count += 1
                assert code in (200, 400, 404), (route, name, payload, code, body[:300])
                if (
                    code == 200
                    and name in ("q", "col.op_name", "col.kernel_name", "col.name")
                    and route != "table/expert_systems"
                ):  # its texts hold '%'; names hold no payload
                    assert json.loads(body)["filtered"] == 0, (route, name, payload)
    assert count > 300 and sha256(db) == before
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    assert con.execute("SELECT count(*) FROM aggregations").fetchone()[0] == 1
    con.close()


def test_viewer_html_names_are_json_text(viewer):
    """Names holding HTML come back as JSON strings, verbatim (the frontend sets them as text)."""
    port = viewer["port"]
    code, headers, body = request(port, "GET", API + "table/ops?run=hostile_dldb&limit=100")
    assert code == 200 and headers["content-type"].startswith("application/json")
    names = [r[[c["key"] for c in json.loads(body)["columns"]].index("op_name")] for r in json.loads(body)["rows"]]
    assert f"/step/{HTML_OP}" in names
    code, _, body = request(port, "GET", API + "table/kernels?run=hostile_dldb&limit=100")
    assert HTML_KERNEL in json.loads(body)["rows"].__repr__()


def test_viewer_invalid_utf8_names_are_decoded_with_replacement(viewer):
    port = viewer["port"]
    for route in (
        "table/iteration_kernels?run=hostile_dldb&iteration=0&limit=100",
        "table/iteration_op_kernels?run=hostile_dldb&iteration=0&op_index=1&limit=100",
        "table/kernels?run=hostile_dldb&limit=100",
    ):
        code, _, body = request(port, "GET", API + route)
        assert code == 200, body[:300]
        assert "k_\ufffd_kernel" in json.dumps(json.loads(body), ensure_ascii=False), route


@pytest.mark.slow
def test_viewer_accepted_reaggregation_with_concurrent_requests(viewer):
    """The frontend's request (same origin, JSON, X-DLProf-Request) is accepted; 1000 reads from 16 threads
    while it runs are all answered (200, or 503 + Retry-After while the commit holds the database)."""
    port = viewer["port"]
    body = json.dumps({"run": "reagg_dldb", "key_node": None, "iter_start": 1, "iter_stop": 2}).encode()
    code, _, payload = request(port, "POST", API + "reaggregate", _same_origin(port), body)
    assert code == 202, payload
    routes = [
        "dashboard?run=reagg_dldb&aggr=1",
        "table/ops?run=reagg_dldb&aggr=1&sort=op_name",
        "table/iteration_kernels?run=reagg_dldb&aggr=1&iteration=1",
        "aggregations?run=reagg_dldb",
        "table/key_nodes?run=reagg_dldb",
        "runs",
    ]
    statuses, lock = [], threading.Lock()

    def worker(k):
        for i in range(k, 1000, 16):
            code, headers, _ = request(port, "GET", API + routes[i % len(routes)], timeout=60)
            with lock:
                statuses.append(200 if code == 200 else (code, headers.get("retry-after")))

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert len(statuses) == 1000 and all(s == 200 or s == (503, "1") for s in statuses), [
        s for s in statuses if s != 200
    ][:5]

    def finished():
        job = json.loads(request(port, "GET", API + "reaggregate_status?run=reagg_dldb")[2])["job"]
        return job if job["status"] != "running" else None

    job = wait_until(finished, 120, "the re-aggregation")
    assert job["status"] == "succeeded" and job["aggr_id"] == 2, job


# ---------------------------------------------------------------------------- re-aggregation jobs killed


def _killed_job(monkeypatch, db: Path, script: str) -> dict:
    """Run a job whose engine process is `script` (it kills itself with SIGKILL), through the viewer's
    JobManager wired as the Service wires it; returns the finished job."""
    from dlprof_plugin.db import Registry

    registry = Registry()
    monkeypatch.setattr(jobs_mod, "command", lambda database, *a: [sys.executable, "-c", script, database])
    manager = jobs_mod.JobManager(aggregations=lambda database: registry.get(database).aggregations())
    manager.start(str(db), None, 1, 2)
    return wait_until(
        lambda: manager.status(str(db)) if manager.status(str(db))["status"] != "running" else None, 120, "the job"
    )


KILL_AFTER_COMMIT = """import os, signal, sys
from dlprof_profiler.run.single import reaggregate_in_place
reaggregate_in_place(sys.argv[1], None, 1, 2)
os.kill(os.getpid(), signal.SIGKILL)"""
KILL_BEFORE_COMMIT = """import os, signal, sqlite3, sys
con = sqlite3.connect(sys.argv[1])
con.execute("BEGIN IMMEDIATE")
con.execute("INSERT INTO aggregations (key_node, iter_start, iter_stop) VALUES ('x', 1, 2)")
con.execute("DELETE FROM op_nodes")
os.kill(os.getpid(), signal.SIGKILL)"""


@pytest.mark.slow
def test_job_killed_just_after_its_commit_is_reported_succeeded(base, tmp_path, monkeypatch):
    db = tmp_path / "dlprof_dldb.sqlite"
    shutil.copy(base["db"], db)
    job = _killed_job(monkeypatch, db, KILL_AFTER_COMMIT)
    assert job["status"] == "succeeded" and job["aggr_id"] == 2, job
    assert "after committing it" in job["message"]
    con = sqlite3.connect(db)
    assert con.execute("SELECT aggr_id, iter_start, iter_stop FROM aggregations ORDER BY aggr_id").fetchall()[-1] == (
        2,
        1,
        2,
    )
    con.close()


def test_job_killed_before_its_commit_is_reported_failed_and_rolled_back(base, tmp_path, monkeypatch):
    db = tmp_path / "dlprof_dldb.sqlite"
    shutil.copy(base["db"], db)
    con = sqlite3.connect(db)
    op_nodes = con.execute("SELECT count(*) FROM op_nodes").fetchone()[0]
    con.close()
    job = _killed_job(monkeypatch, db, KILL_BEFORE_COMMIT)
    assert job["status"] == "failed", job
    con = sqlite3.connect(db)  # a writable connection rolls the hot journal back
    assert con.execute("SELECT count(*) FROM aggregations").fetchone()[0] == 1
    assert con.execute("SELECT count(*) FROM op_nodes").fetchone()[0] == op_nodes > 0
    con.close()


# ---------------------------------------------------------------------------- HTTP: TensorBoard with --path_prefix


@pytest.fixture(scope="module")
def tensorboard(base, tmp_path_factory):
    """This module's own TensorBoard in place of the session's: started with --path_prefix."""
    logdir = tmp_path_factory.mktemp("tb_logdir")
    shutil.copytree(base["root"] / "db", logdir / "training")
    port = free_port()
    log_file = open(logdir.parent / f"{logdir.name}.log", "w")
    exe = Path(sys.executable).parent / "tensorboard"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "tensorboard.main"]
    proc = subprocess.Popen(
        cmd
        + [
            f"--logdir={logdir}",
            f"--port={port}",
            "--host=127.0.0.1",
            "--path_prefix=/pfx",
            "--reload_interval=1",
            "--dlprof_allowed_hosts=tb.test",
        ],
        stdout=log_file,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        cwd=ROOT,
    )

    def ready():
        code, _, body = request(port, "GET", "/pfx" + API + "runs", timeout=5)
        return code == 200 and json.loads(body)["runs"]

    try:
        wait_until(ready, 90, "TensorBoard with the DLPROF plugin", proc)
        yield {"port": port, "db": logdir / "training" / "dlprof_dldb.sqlite"}
    finally:
        stop(proc)
        log_file.close()


TB_CASES = [
    (
        "form-text-plain",
        "POST",
        "reaggregate",
        lambda p: {"Content-Type": "text/plain", "Origin": "http://evil.example"},
        403,
    ),
    (
        "json-without-request-header",
        "POST",
        "reaggregate",
        lambda p: {"Content-Type": "application/json", "Origin": f"http://127.0.0.1:{p}"},
        403,
    ),
    ("foreign-origin", "POST", "reaggregate", lambda p: {**_same_origin(p), "Origin": "http://evil.example"}, 403),
    ("origin-null", "POST", "reaggregate", lambda p: {**_same_origin(p), "Origin": "null"}, 403),
    ("rebinding-get-runs", "GET", "runs", lambda p: {"Host": f"attacker.example:{p}"}, 403),
    ("rebinding-get-static", "GET", "index.js", lambda p: {"Host": f"attacker.example:{p}"}, 403),
    ("host-localhost", "GET", "runs", lambda p: {"Host": f"localhost:{p}"}, 200),
    ("host-allowed-by-flag", "GET", "runs", lambda p: {"Host": f"tb.test:{p}"}, 200),
]


@pytest.mark.slow
@pytest.mark.parametrize("case", TB_CASES, ids=[c[0] for c in TB_CASES])
def test_tensorboard_request(case, tensorboard):
    _, method, route, headers, status = case
    port, db = tensorboard["port"], tensorboard["db"]
    before = sha256(db)
    body = (
        json.dumps({"run": "training/dlprof", "iter_start": 1, "iter_stop": 2}).encode() if method == "POST" else None
    )
    code, _, payload = request(port, method, "/pfx" + API + route, headers(port), body)
    assert code == status, payload[:300]
    if status == 403:
        assert isinstance(json.loads(payload)["error"], str)
    assert sha256(db) == before


@pytest.mark.slow
def test_tensorboard_accepts_the_frontends_reaggregation(tensorboard):
    port = tensorboard["port"]
    body = json.dumps({"run": "training/dlprof", "key_node": None, "iter_start": 1, "iter_stop": 2}).encode()
    code, _, payload = request(port, "POST", "/pfx" + API + "reaggregate", _same_origin(port), body)
    assert code == 202, payload

    def finished():
        job = json.loads(request(port, "GET", "/pfx" + API + "reaggregate_status?run=training/dlprof")[2])["job"]
        return job if job["status"] != "running" else None

    job = wait_until(finished, 120, "the re-aggregation")
    assert job["status"] == "succeeded" and job["aggr_id"] == 2, job


def test_the_frontend_sends_the_request_header():
    api_js = (ROOT / "frontend_static" / "api.js").read_text()
    assert f'REQUEST_HEADER = "{REQUEST_HEADER}"' in api_js and '[REQUEST_HEADER]: "1"' in api_js
    assert (
        os.path.isfile(ROOT / "frontend_static" / "jobs.js")
        and 'postJSON("reaggregate"' in (ROOT / "frontend_static" / "jobs.js").read_text()
    )


# ---- Kineto input (issue 25) ----


KINETO_T = 1_700_000_000_000_000_000  # ns since the epoch, as torch.profiler writes them (in microseconds)
GB = 1 << 30


def warning_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("[DLProf-") and " WARNING: " in lines[0], stderr
    return lines[0]


def kineto_steps():
    """Two ProfilerStep#N at epoch times, each with an op launching a 10 us kernel: the first step starts at
    KINETO_T, the last one ends at KINETO_T + 190_000 ns (the wall clock, the steps' span: 190,000 ns)."""
    from tests.kineto_builder import KinetoTrace

    k = KinetoTrace()
    k.device(0)
    k.span(KINETO_T - 1000, 300_000)
    for i in range(2):
        s = KINETO_T + i * 100_000
        k.annotation(10, s, 90_000, f"ProfilerStep#{i}")
        k.cpu_op(10, s + 1000, 20_000, "aten::mm", seq=i)
        k.kernel("volta_sgemm_128x64_nn", s + 5000, 10_000, k.runtime(10, s + 2000, 1000))
    return k


def gzip_bomb(path: Path, fill: bytes, size: int, lead: bytes = b"") -> Path:
    """A valid gzip file of one stream: `{"traceEvents": [`, `lead` and `size` bytes of `fill`, written from the
    deflate of one 16 MB block repeated (each block ends with a full flush, so its deflate bytes do not depend on
    what came before); the trailer's CRC is computed over the whole text, never held."""
    import zlib

    block = fill * (16 << 20)
    prefix, suffix = b'{"traceEvents": [' + lead, b"]}"
    deflate = zlib.compressobj(9, zlib.DEFLATED, 31)
    head = deflate.compress(prefix) + deflate.compress(block) + deflate.flush(zlib.Z_FULL_FLUSH)
    repeated = deflate.compress(block) + deflate.flush(zlib.Z_FULL_FLUSH)
    tail = (deflate.compress(suffix) + deflate.flush())[:-8]  # the trailer is recomputed for the whole text
    crc = zlib.crc32(prefix)
    for _ in range(size // len(block)):
        crc = zlib.crc32(block, crc)
    crc = zlib.crc32(suffix, crc)
    total = len(prefix) + size // len(block) * len(block) + len(suffix)
    with open(path, "wb") as fh:
        fh.write(head)
        for _ in range(size // len(block) - 1):
            fh.write(repeated)
        fh.write(tail + crc.to_bytes(4, "little") + (total % 2**32).to_bytes(4, "little"))
    return path


def dlprof_measured(tmp_path: Path, *argv: str) -> tuple[int, str, float]:
    """dlprof in a child process: exit status, stderr and the child's peak memory (GB)."""
    proc = dlprof_process(*argv, "-v", "minimal")
    _, status, usage = os.wait4(proc.pid, 0)
    stderr = proc.stderr.read()
    proc.stdout.close()
    proc.stderr.close()
    return os.waitstatus_to_exitcode(status), stderr, usage.ru_maxrss * 1024 / GB


def refused(tmp_path: Path, source: Path, *says: str, measured: bool = False) -> float:
    """The run on `source` exits 1 with one error line naming the file and saying `says`, leaves no output
    and the input unchanged; the child's peak memory when measured (else 0)."""
    out = tmp_path / "out"
    before = (sha256(source), source.stat().st_mtime_ns)
    if measured:
        code, stderr, peak = dlprof_measured(tmp_path, f"--database={source}", f"--output_path={out}")
    else:
        (code, stderr), peak = run_cli(f"--database={source}", f"--output_path={out}", "-v", "minimal"), 0.0
    assert code == 1 and "Traceback" not in stderr, stderr
    line = error_line(stderr)
    assert str(source) in line, line
    for text in says:
        assert text in line, line
    assert not out.exists(), list(out.rglob("*"))
    assert (sha256(source), source.stat().st_mtime_ns) == before
    return peak


@pytest.mark.slow
def test_kineto_gzip_bomb_of_whitespace_is_refused_in_bounded_memory(tmp_path):
    """3 GB of whitespace in 3 MB (deflate's largest ratio): refused after about 100 MB of text."""
    bomb = gzip_bomb(tmp_path / "bomb.json.gz", b" ", 3 * GB)
    assert bomb.stat().st_size < 4 << 20
    peak = refused(tmp_path, bomb, "the gzip data expands more than 256 times", "not a trace", measured=True)
    assert peak < 1.0, f"{peak:.2f} GB"


@pytest.mark.slow
def test_kineto_gzip_whitespace_run_behind_real_text_is_refused_in_bounded_memory(tmp_path):
    """8 MB of text that does not compress keep the ratio low; the 3 GB run of whitespace after it is refused."""
    lead = b'{"ph": "X", "name": "' + os.urandom(4 << 20).hex().encode() + b'"}, '
    bomb = gzip_bomb(tmp_path / "run.json.gz", b" ", 3 * GB, lead)
    peak = refused(tmp_path, bomb, "the text holds more than 64 MB of nothing but whitespace", measured=True)
    assert peak < 1.0, f"{peak:.2f} GB"


def test_kineto_args_nested_200000_levels(tmp_path):
    text = kineto_steps().text().encode()
    deep = text.replace(b'"args": {', b'"args": {"deep": ' + b"[" * 200_000 + b"]" * 200_000 + b", ", 1)
    path = tmp_path / "deep.json"
    path.write_bytes(deep)
    # levels: the document, traceEvents, the event, its args, then the brackets: the 509th opens level 513
    at = deep.index(b"[" * 1000) + 508
    refused(tmp_path, path, "the JSON nests too deeply to be read", f"more than 512 levels at byte {at:,}")


def test_kineto_name_with_bytes_that_are_not_utf8(tmp_path):
    """Decoded with replacement and counted in one warning; the run succeeds."""
    path = tmp_path / "names.json"
    path.write_bytes(kineto_steps().text().encode().replace(b'"aten::mm"', b'"aten::\xff\xfemm"'))
    out = tmp_path / "out"
    code, stderr = run_cli(f"--database={path}", f"--output_path={out}", "-v", "minimal")
    assert code == 0 and "Traceback" not in stderr, stderr
    assert warning_line(stderr).endswith(
        f"{path}: 2 events written as invalid JSON were repaired and read (2 with bytes that are not UTF-8)"
    )
    con = sqlite3.connect(out / "dlprof_dldb.sqlite")
    try:
        names = {row[0] for row in con.execute("SELECT value FROM strings")}
    finally:
        con.close()
    assert any("aten::\ufffd\ufffdmm" in str(name) for name in names), names


def test_kineto_gzip_followed_by_garbage(tmp_path):
    import gzip

    packed = gzip.compress(kineto_steps().text().encode())
    path = tmp_path / "trailing.json.gz"
    path.write_bytes(packed + b"this is not gzip")
    refused(tmp_path, path, f"16 bytes follow the end of the gzip data (from byte {len(packed):,} of the file)")


def test_kineto_two_gzip_members_are_one_text(tmp_path):
    """Concatenated gzip members are one text, as gunzip reads them (RFC 1952); NUL padding after them too."""
    import gzip

    text = kineto_steps().text().encode()
    path = tmp_path / "members.json.gz"
    path.write_bytes(gzip.compress(text[:1000]) + gzip.compress(text[1000:]) + b"\0" * 512)
    out = tmp_path / "out"
    code, stderr = run_cli(f"--database={path}", f"--output_path={out}", "-v", "minimal")
    assert code == 0 and stderr == "", stderr
    assert summary_value(out, "Wall Clock Time (ns)") == "190000"


def test_kineto_timestamp_far_outside_the_trace(tmp_path):
    """`ts` 1.0 us among epoch microseconds: that event is dropped with a warning, the wall clock is the trace's."""
    k = kineto_steps()
    k.raw('{"ph": "X", "cat": "cpu_op", "name": "aten::zero_", "pid": 4242, "tid": 10, "ts": 1.0, "dur": 2.0}')
    path = tmp_path / "far.json"
    k.write(path)
    out = tmp_path / "out"
    code, stderr = run_cli(f"--database={path}", f"--output_path={out}", "-v", "minimal")
    assert code == 0 and "Traceback" not in stderr, stderr
    assert warning_line(stderr).endswith(
        f"{path}: 1 events were dropped: their start or end lies more than a day from the trace's median time (a "
        "damaged timestamp, e.g. ts = 1.000 us)"
    )
    assert summary_value(out, "Wall Clock Time (ns)") == "190000"


# ---- Runs, outputs and errors (issue 25) ----


def _one_op_profile(path: Path, calls: int = 6, steps: int = 0) -> Path:
    """`calls` calls of aten::add (each launching a 1 us kernel) on one thread, no key node; with `steps`, the
    calls are spread evenly over that many `step` scope ranges (a training loop dlprof does not know)."""
    exp = NsysExport(schema="2022.4")
    exp.add_gpu(device_id=0)
    t = exp.add_thread(pid=100, tid=100, name="python", process_name="python")
    per_step = calls // max(steps, 1)
    for i in range(calls):
        base = T0 + i * 10_000 + (i // per_step) * 5_000
        if steps and i % per_step == 0:
            exp.push_pop(t, base - 1_000, base + per_step * 10_000 - 2_000, "step")
        exp.push_pop(t, base, base + 8_000, f"aten::add, seq = {i}, op_id = {i}")
        exp.launch(t, base + 1_000, base + 2_000, base + 3_000, base + 4_000, kernel="add_kernel")
    exp.set_session(start_time=0)
    return exp.write(path)


def _detailed_rows(out: Path) -> list[dict]:
    return list(csv.DictReader((out / "dlprof_detailed.csv").read_text(encoding="utf-8").splitlines()[1:]))


def _recommendations(out: Path) -> list[str]:
    rows = csv.DictReader((out / "dlprof_expert_systems.csv").read_text(encoding="utf-8").splitlines()[1:])
    return [r["Recommendation"] for r in rows]


def test_cli_one_op_called_many_times_without_key_node_is_an_op_per_call(tmp_path):
    """DLProf's op identity without a key node: the k-th call of a name in the one iteration is an op of its
    own (6 calls, 6 ops of 1 call, /aten::add, /aten::add[2] ...); the finding says why and that nothing
    repeats to split at."""
    path = _one_op_profile(tmp_path / "one_op.sqlite")
    code, stderr = run_cli(f"--database={path}", f"--output_path={tmp_path / 'out'}")
    assert code == 0, stderr
    rows = _detailed_rows(tmp_path / "out")
    assert sorted((r["Op Name"], r["Op ID"], r["No. Calls"]) for r in rows) == sorted(
        [("/aten::add", "ADD_1", "1")] + [(f"/aten::add[{k}]", f"ADD_{k}", "1") for k in range(2, 7)]
    )
    assert all(r["Total GPU Time (ns)"] == "1000" for r in rows)
    (advice,) = [r for r in _recommendations(tmp_path / "out") if r.startswith("Specify key op")]
    assert "no NVTX range of this profile repeats as a training step would" in advice
    assert advice.endswith("aten::add alone is 6 ops, 6 ops in all")


@pytest.mark.slow
def test_cli_one_op_without_key_node_the_finding_names_the_loop_that_splits_it(tmp_path):
    """12 calls in 3 `step` ranges, no key node: 12 ops of one call (/step/aten::add ... /step[3]/aten::add[4]);
    the finding proposes --key_op=step, which makes them 4 ops of 3 calls each."""
    path = _one_op_profile(tmp_path / "steps.sqlite", calls=12, steps=3)
    code, stderr = run_cli(f"--database={path}", f"--output_path={tmp_path / 'out'}")
    assert code == 0, stderr
    rows = _detailed_rows(tmp_path / "out")
    names = [f"/step{s}/aten::add{k}" for s in ("", "[2]", "[3]") for k in ("", "[2]", "[3]", "[4]")]
    assert sorted((r["Op Name"], r["No. Calls"]) for r in rows) == sorted((n, "1") for n in names)
    (advice,) = [r for r in _recommendations(tmp_path / "out") if r.startswith("Specify key op")]
    assert "ranges repeated in this profile: step (3 times): --key_op=step would split the run at its 3 ranges" in (
        advice
    )
    assert advice.endswith("aten::add alone is 12 ops, 12 ops in all")
    code, stderr = run_cli(f"--database={path}", f"--output_path={tmp_path / 'split'}", "--key_op=step")
    assert code == 0, stderr
    rows = _detailed_rows(tmp_path / "split")
    assert sorted((r["Op Name"], r["No. Calls"]) for r in rows) == [
        (f"/step/aten::add{k}", "3") for k in ("", "[2]", "[3]", "[4]")
    ]


SPECIAL_INPUTS = [
    ("fifo-as-database", "database", "fifo", "is a named pipe (FIFO), not a regular file"),
    ("fifo-as-baseline", "baseline", "fifo", "is a named pipe (FIFO), not a regular file"),
    ("fifo-in-a-list", "list", "fifo", "is a named pipe (FIFO), not a regular file"),
    ("character-device", "database", "/dev/zero", "is a character device, not a regular file"),
]


@pytest.mark.slow
@pytest.mark.parametrize("case", SPECIAL_INPUTS, ids=[c[0] for c in SPECIAL_INPUTS])
def test_cli_fifo_and_other_special_files_are_refused_at_once(case, base, tmp_path):
    """Opening a FIFO blocks until a writer comes (the run hung forever) and a device never ends: refused
    before anything is opened (a run that hangs fails the subprocess timeout)."""
    _, where, kind, says = case
    special = tmp_path / "profile.sqlite"
    if kind == "fifo":
        os.mkfifo(special)
    else:
        special = Path(kind)
    args = {
        "database": [f"--database={special}"],
        "baseline": [f"--database={base['export']}", f"--baseline={special}"],
        "list": [f"--database={base['export']},{special}"],
    }[where]
    out = tmp_path / "out"
    proc = dlprof_process(*args, f"--output_path={out}")
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 1
    assert error_line(stderr).endswith(f"ERROR: {special}: {says}; give a profile file (copy the data to a file first)")
    assert not out.exists()


def _interruptible_as_in_a_terminal():
    """In the child before exec: SIGINT handled as in a terminal's foreground job. A suite run as a background
    job (`./.ci/run &`) starts its processes with SIGINT ignored, and dlprof keeps a signal it starts ignored
    (as under nohup), so Ctrl-C would not reach it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_cli_sigterm_and_sigint_release_the_lock_and_remove_the_staging(signum, tmp_path):
    """A run ended by SIGTERM (as a job scheduler or `timeout` ends it) or Ctrl-C unwinds: one line, exit status
    128 + signal, no lock file, no staging folder, not even the output folder it created."""
    export = profiles.training_profile(tmp_path / "long.sqlite", iterations=300)
    out = tmp_path / "out"
    proc = dlprof_process(
        f"--database={export}", f"--output_path={out}", "--reports=all", preexec_fn=_interruptible_as_in_a_terminal
    )
    # mid-run: its staging is being written
    wait_until(lambda: list(out.glob(f"{STAGING_PREFIX}*/dlprof_dldb.sqlite")), 120, "the staged database", proc, 0.01)
    proc.send_signal(signum)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signum, stderr
    expected = "ended by SIGTERM" if signum == signal.SIGTERM else "interrupted"
    assert error_line(stderr).endswith(f"ERROR: {expected}")
    assert not out.exists(), list(out.iterdir())


def _size_limited_run(out: Path, export: Path, limit: int) -> subprocess.Popen:
    def limit_file_size():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return dlprof_process(
        f"--database={export}", f"--output_path={out}", "--out_of_core=on", preexec_fn=limit_file_size
    )


@pytest.mark.slow
def test_cli_file_size_limit_while_staging_out_of_core_names_the_folder(tmp_path):
    """Arrow's "Error writing bytes to file ... [errno 27]" names no file: the one line names the output folder
    the export is staged in, what ran out and what to do."""
    export = profiles.training_profile(tmp_path / "long.sqlite", iterations=300)
    out = tmp_path / "out"
    proc = _size_limited_run(out, export, 100_000)
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 1
    assert error_line(stderr).endswith(
        f"ERROR: {out}: a file reached the file size limit (file too large) while the export was staged out of "
        "core in this folder; raise the limit (ulimit -f) or choose another --output_path, or analyse in memory "
        "(--out_of_core=off)"
    )
    assert not out.exists()


def _can_mount_tmpfs() -> bool:
    if not shutil.which("unshare"):
        return False
    probe = subprocess.run(
        ["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"], capture_output=True, timeout=30
    )
    return probe.returncode == 0


@pytest.mark.slow
@pytest.mark.skipif(not _can_mount_tmpfs(), reason="no user namespaces here to mount a small tmpfs in")
def test_cli_disk_full_while_staging_out_of_core_names_the_folder(tmp_path):
    """A real full disk: a 64 KiB tmpfs, mounted in a user namespace of the run's own (no root needed)."""
    export = profiles.training_profile(tmp_path / "long.sqlite", iterations=300)
    disk = tmp_path / "disk"
    disk.mkdir()
    out = disk / "out"
    script = (
        f"mount -t tmpfs -o size=64k tmpfs {disk} && "
        f"{sys.executable} -m dlprof_profiler --database={export} --output_path={out} --out_of_core=on; "
        f'echo "status $?"; ls -A {disk}'
    )
    proc = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert error_line(proc.stderr).endswith(
        f"ERROR: {out}: the disk is full (no space left on device) while the export was staged out of core in this "
        "folder; free space there or choose another --output_path, or analyse in memory (--out_of_core=off)"
    )
    assert proc.stdout.splitlines()[-1] == "status 1"  # and `ls` found nothing left on the small disk


def _damaged_kineto(kind: str):
    def make(tmp_path: Path) -> Path:
        import gzip

        text = gzip.decompress((KINETO_DATA / "pytorch_cpu_only.pt.trace.json.gz").read_bytes())
        path = tmp_path / f"baseline_{kind}.pt.trace.json"
        if kind == "truncated-json":
            path.write_bytes(text[: len(text) // 2])
        elif kind == "truncated-gzip":
            path = path.with_suffix(".gz")
            packed = gzip.compress(text)
            path.write_bytes(packed[: len(packed) // 2])
        else:  # bytes overwritten in the middle of the events
            middle = len(text) // 2
            path.write_bytes(text[:middle] + b"@@@@@@@@" + text[middle + 8 :])
        return path

    return make


def _damaged_sqlite_baseline(tmp_path: Path) -> Path:
    export = profiles.training_profile(tmp_path / "export.sqlite")
    path = tmp_path / "baseline.sqlite"
    path.write_bytes(export.read_bytes()[:4096])
    return path


KINETO_DATA = ROOT / "tests" / "data" / "kineto"
DAMAGED_BASELINES = [
    ("kineto-truncated-json", _damaged_kineto("truncated-json"), "not an SQLite database"),
    ("kineto-truncated-gzip", _damaged_kineto("truncated-gzip"), "damaged or truncated gzip data"),
    ("kineto-invalid-json", _damaged_kineto("invalid-json"), "not valid JSON"),
    ("sqlite-truncated", _damaged_sqlite_baseline, "truncated SQLite file"),
]


@pytest.mark.parametrize("case", DAMAGED_BASELINES, ids=[c[0] for c in DAMAGED_BASELINES])
def test_cli_damaged_baseline_is_one_line_before_the_run_is_analysed(case, tmp_path):
    """The run (a CPU-only torch.profiler trace, whose reading warns that it has no GPU work) is not read at
    all: the baseline's error is the only line on stderr."""
    _, make, says = case
    baseline = make(tmp_path)
    before = sha256(baseline)
    run = KINETO_DATA / "pytorch_cpu_only.pt.trace.json.gz"
    out = tmp_path / "out"
    code, stderr = run_cli(f"--database={run}", f"--baseline={baseline}", f"--output_path={out}")
    assert code == 1
    line = error_line(stderr)
    assert f"ERROR: {baseline}: " in line and says in line, line
    assert not out.exists() and sha256(baseline) == before


FORGED = "\n[DLProf-12:00:00] ERROR: forged by a file name"
CONTROL_NAMES = [
    ("newline-in-missing-database", "missing" + FORGED + ".sqlite", None, "no file matches this pattern"),
    ("escape-sequence-in-empty-file", "empty\r\x1b[2K\t.sqlite", b"", "empty file, not a profile"),
    ("line-separator-in-text-file", "notes\u2028x.sqlite", b"not a profile\n" * 10, "not an SQLite database"),
]


@pytest.mark.parametrize("case", CONTROL_NAMES, ids=[c[0] for c in CONTROL_NAMES])
def test_cli_paths_with_control_characters_are_escaped_on_one_line(case, tmp_path):
    """A path is printed with its control characters escaped as repr() writes them: the error is one line and
    a file name cannot forge console lines."""
    _, name, content, says = case
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    out = tmp_path / "out"
    code, stderr = run_cli(f"--database={path}", f"--output_path={out}")
    assert code == 1
    shown = repr(str(path))[1:-1]
    assert f"ERROR: {shown}: {says}" in error_line(stderr), stderr
    assert not out.exists()


@pytest.mark.slow
def test_cli_a_run_on_a_path_with_a_newline_prints_every_message_on_one_line(base, tmp_path):
    folder = tmp_path / ("in" + FORGED)
    folder.mkdir()
    export = folder / "export.sqlite"
    shutil.copy(base["export"], export)
    proc = dlprof_process(f"--database={export}", f"--output_path={folder / 'out'}", "--reports=summary")
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr
    lines = (stdout + stderr).splitlines()
    assert lines and all(ln.startswith("[DLProf-") and "forged" not in ln.split("]", 1)[0] for ln in lines), lines
    assert any(f"Reading {repr(str(export))[1:-1]} ..." in ln for ln in lines), lines
    assert (folder / "out" / "dlprof_summary.csv").is_file()


def _files(folder: Path) -> set:
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()}


def _reports(folder: Path) -> dict:
    return {p.name: p.read_bytes() for p in folder.glob("dlprof_*.csv")} | {
        p.name: p.read_bytes() for p in folder.glob("dlprof_*.json")
    }


def _event_files(folder: Path) -> list[Path]:
    return sorted((folder / "dlprof").glob("events.out.tfevents.*"))


UPDATE = ["--force=true", "--iter_start=1", "--iter_stop=2", "--reports=summary,iteration", "--formats=csv"]


@pytest.mark.slow
def test_cli_killed_at_any_step_of_the_publication_the_next_run_completes_it(base, tmp_path):
    """A run updating a run's folder (re-aggregation in place, fewer reports) is killed with SIGKILL before each
    step of putting its outputs in place (its 4 renames, then the 6 removals of the previous reports and event
    file) and once after the last: meanwhile the viewer hides the run; the next run into the folder completes
    the publication, giving exactly the folder the uninterrupted update gives (reports byte for byte, the new
    database and event file, none of the previous ones)."""
    first = tmp_path / "first"
    code, stderr = run_cli(
        f"--database={base['export']}",
        f"--output_path={first}",
        "--reports=summary,detail,kernel",
        "--formats=csv,json",
    )
    assert code == 0, stderr
    reference = tmp_path / "reference"
    shutil.copytree(first, reference)
    code, stderr = run_cli(f"--database={reference / 'dlprof_dldb.sqlite'}", f"--output_path={reference}", *UPDATE)
    assert code == 0, stderr
    expected_reports = _reports(reference)
    assert sorted(expected_reports) == ["dlprof_iteration.csv", "dlprof_summary.csv"]
    from dlprof_plugin.runs import RunInfo, StaticRuns, half_published
    from dlprof_profiler.outputs.publish import KILL_AT_PUBLISH_STEP, OutputFolder

    steps = 4 + 6
    for step in range(steps + 1):
        out = tmp_path / f"killed_at_{step}"
        shutil.copytree(first, out)
        old_event = _event_files(out)
        proc = dlprof_process(
            f"--database={out / 'dlprof_dldb.sqlite'}",
            f"--output_path={out}",
            *UPDATE,
            env={**os.environ, KILL_AT_PUBLISH_STEP: str(step)},
        )
        proc.communicate(timeout=300)
        assert proc.returncode == -signal.SIGKILL, step
        db = out / "dlprof_dldb.sqlite"
        assert half_published(str(db)), step
        assert StaticRuns({"run": RunInfo("run", str(db), "dlprof_dldb.sqlite")}).runs() == {}
        with OutputFolder(out):  # what every run into the folder does first
            pass
        assert not half_published(str(db))
        assert _reports(out) == expected_reports, step
        assert _files(out) == {"dlprof_dldb.sqlite", "dlprof_iteration.csv", "dlprof_summary.csv"} | {
            str(p.relative_to(out)) for p in _event_files(out)
        }, step
        (event,) = _event_files(out)
        assert event not in old_event and event.name.endswith(f".{proc.pid}.dlprof"), step
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        ranges = con.execute("SELECT iter_start, iter_stop FROM aggregations ORDER BY aggr_id").fetchall()
        con.close()
        assert ranges == [(0, 3), (1, 2)], step


@pytest.mark.slow
def test_cli_a_killed_publication_is_hidden_by_the_viewer_until_the_next_run(base, tmp_path):
    """Killed midway (2 of its 4 renames done): dlprofviewer lists no run for the folder's database; the next
    run into the folder (here one that then fails on its input) completes it, and the viewer lists it again."""
    out = tmp_path / "out"
    assert run_cli(f"--database={base['export']}", f"--output_path={out}", "--reports=all")[0] == 0
    from dlprof_profiler.outputs.publish import KILL_AT_PUBLISH_STEP

    proc = dlprof_process(
        f"--database={out / 'dlprof_dldb.sqlite'}",
        f"--output_path={out}",
        *UPDATE,
        env={**os.environ, KILL_AT_PUBLISH_STEP: "2"},
    )
    proc.communicate(timeout=300)
    assert proc.returncode == -signal.SIGKILL
    port = free_port()
    viewer_proc = subprocess.Popen(
        _viewer_command() + [str(out / "dlprof_dldb.sqlite"), f"--port={port}", "--host=127.0.0.1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        cwd=ROOT,
    )
    try:
        wait_until(lambda: request(port, "GET", API + "runs", timeout=5)[0] == 200, 60, "dlprofviewer", viewer_proc)
        assert json.loads(request(port, "GET", API + "runs")[2])["runs"] == []
        code, stderr = run_cli(f"--database={tmp_path / 'missing.sqlite'}", f"--output_path={out}")
        assert code == 1 and "missing.sqlite: no such file" in error_line(stderr)
        assert sorted(p.name for p in out.glob("dlprof_*")) == [
            "dlprof_dldb.sqlite",
            "dlprof_iteration.csv",
            "dlprof_summary.csv",
        ]
        runs = json.loads(request(port, "GET", API + "runs")[2])["runs"]
        assert len(runs) == 1, runs
    finally:
        stop(viewer_proc)


@pytest.mark.slow
def test_cli_reaggregation_leaves_exactly_the_reports_it_writes(base, tmp_path):
    """Issue 21.7: the run's report set is what its last run wrote. Re-aggregating with fewer reports and
    formats removes the previous JSON and CSV reports with its publication; other runs' files stay."""
    out = tmp_path / "out"
    assert (
        run_cli(f"--database={base['export']}", f"--output_path={out}", "--reports=all", "--formats=csv,json")[0] == 0
    )
    assert run_cli(f"--database={base['export']}", f"--output_path={out}", "--base_name=dlprof_x")[0] == 0
    (out / "notes.csv").write_text("mine")
    (out / "other_summary.csv").write_text("another tool's")
    kept = {p.name for p in out.iterdir() if p.name.startswith(("dlprof_x", "notes", "other"))}
    assert "dlprof_x_summary.csv" in kept and len(kept) == 7, kept  # its reports, database and event folder
    code, stderr = run_cli(
        f"--database={out / 'dlprof_dldb.sqlite'}", f"--output_path={out}", "--force=true", "--reports=summary"
    )
    assert code == 0, stderr
    assert {p.name for p in out.iterdir()} == kept | {"dlprof_dldb.sqlite", "dlprof_summary.csv", "dlprof"}
    assert len(_event_files(out)) == 1


def test_cli_reports_of_a_previous_run_are_not_removed_without_force(base, tmp_path):
    """Removing a previous run's reports replaces them: without --force it is refused like any existing output
    (here the previous database was deleted, so only its reports are left)."""
    out = tmp_path / "out"
    assert run_cli(f"--database={base['export']}", f"--output_path={out}", "--reports=kernel")[0] == 0
    (out / "dlprof_dldb.sqlite").unlink()
    before = tree(out)
    code, stderr = run_cli(f"--database={base['export']}", f"--output_path={out}", "--reports=summary")
    assert code == 1
    assert f"ERROR: {out / 'dlprof_kernel.csv'}: output file exists (and 1 more); use --force=true" in error_line(
        stderr
    )
    assert tree(out) == before


@pytest.mark.slow
def test_cli_out_of_core_into_a_folder_whose_name_holds_quotes(base, tmp_path):
    """The staging folder is named to DuckDB in SQL text: a quote in the output path broke it (a 25-line
    traceback); quoted, the run succeeds."""
    out = tmp_path / 'it\'s "quoted"; DROP TABLE x; --'
    code, stderr = run_cli(f"--database={base['export']}", f"--output_path={out}", "--out_of_core=on")
    assert code == 0, stderr
    assert (out / "dlprof_summary.csv").is_file() and not list(out.glob(f"{STAGING_PREFIX}*"))


# ---- Viewer under load and oversized requests (issue 25) ----
# A client announcing or streaming a huge body gets a JSON 413 before the body is read, from dlprofviewer and from
# the TensorBoard plugin, and neither server's memory grows; dlprofviewer closes connections whose request
# arrives too slowly (slowloris) or that stay idle, while answering normal requests, and holds its connection
# limit. The load itself (2,000 requests and 4,000 drip-fed connections): benchmarks/bench_viewer_load.py.

import select  # noqa: E402
import socket  # noqa: E402

TERABYTE = 10**12
STREAM_CAP = 1 << 30  # the most a streaming client sends (the old viewer read all of it into memory)
MEMORY_SLACK_MB = 64


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmRSS:"))


def _tcp_table() -> list[tuple[int, str, int, int]]:
    """(local port, state, rx_queue, inode) of the IPv4 TCP sockets; a LISTEN (0A) socket's rx_queue is the
    number of connections waiting in its accept queue."""
    rows = []
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            parts = line.split()
            rows.append((int(parts[1].split(":")[1], 16), parts[3], int(parts[4].split(":")[1], 16), int(parts[9])))
    return rows


def _socket_inodes(pid: int) -> set[int]:
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
            if link.startswith("socket:["):
                inodes.add(int(link[8:-1]))
    return inodes


def _listener_pid(port: int) -> int:
    """The process listening on 127.0.0.1:port (TensorBoard's, whose fixture does not say)."""
    inode = next(i for p, state, _, i in _tcp_table() if p == port and state == "0A")
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            if inode in _socket_inodes(int(pid)):
                return int(pid)
    raise AssertionError(f"no process listens on port {port}")


def _connections(pid: int, port: int) -> tuple[int, int]:
    """(connections the server process holds on `port`, connections waiting in the port's accept queue)."""
    table, mine = _tcp_table(), _socket_inodes(pid)
    # /proc/net/tcp is read a page at a time, not as a snapshot: while other sockets open and close, a row can
    # be listed twice, so sockets are counted by inode
    held = {inode for p, state, _, inode in table if p == port and state == "01" and inode in mine}
    queued = {inode: rx for p, state, rx, inode in table if p == port and state == "0A"}
    return len(held), sum(queued.values())


def _start_viewer(db: Path, log_path: Path, *options: str) -> tuple[subprocess.Popen, int, object]:
    port = free_port()
    log_file = open(log_path, "w")
    proc = subprocess.Popen(
        _viewer_command() + [str(db), f"--port={port}", "--host=127.0.0.1", "--quiet", *options],
        stdout=log_file,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        cwd=ROOT,
    )
    wait_until(lambda: request(port, "GET", API + "runs", timeout=5)[0] == 200, 60, "dlprofviewer", proc)
    return proc, port, log_file


@pytest.fixture(scope="module")
def slow_viewer(base, tmp_path_factory):
    """dlprofviewer with short timeouts: a request must arrive within 1 s, an idle connection lasts 2 s."""
    work = tmp_path_factory.mktemp("slow_viewer")
    proc, port, log_file = _start_viewer(base["db"], work / "viewer.log", "--request_timeout=1", "--idle_timeout=2")
    try:
        yield {"port": port, "pid": proc.pid}
    finally:
        stop(proc)
        log_file.close()


@pytest.fixture(scope="module")
def limited_viewer(base, tmp_path_factory):
    """dlprofviewer serving at most 4 connections at once, with timeouts long enough to hold them."""
    work = tmp_path_factory.mktemp("limited_viewer")
    proc, port, log_file = _start_viewer(
        base["db"], work / "viewer.log", "--connection_limit=4", "--request_timeout=120", "--idle_timeout=120"
    )
    try:
        yield {"port": port, "pid": proc.pid}
    finally:
        stop(proc)
        log_file.close()


class StreamingUpload:
    """A POST whose headers are sent, then a body streamed from another thread (up to STREAM_CAP bytes) while
    this one reads the answer: what a client uploading a terabyte does."""

    def __init__(self, port: int, path: str, headers: dict, chunked: bool = False):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        lines = [f"POST {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", *(f"{k}: {v}" for k, v in headers.items())]
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        self.chunked, self.sent, self.error = chunked, 0, None
        self.pump = threading.Thread(target=self._send, daemon=True)
        self.pump.start()

    def _send(self):
        part = b" " * (1 << 20)
        if self.chunked:
            part = b"%x\r\n" % len(part) + part + b"\r\n"
        try:
            while self.sent < STREAM_CAP:
                self.sock.sendall(part)
                self.sent += len(part)
        except OSError as exc:
            self.error = exc

    def answer(self) -> tuple[int, dict, bytes, int]:
        """(status, headers, body, bytes of the body sent when the answer came)."""
        resp = http.client.HTTPResponse(self.sock)
        resp.begin()
        sent_then = self.sent
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read(), sent_then

    def finish(self) -> None:
        self.pump.join(120)
        self.sock.close()


UPLOAD_HEADERS = {"Content-Type": "application/json", REQUEST_HEADER: "1"}


@pytest.mark.slow
@pytest.mark.parametrize("chunked", [False, True], ids=["content-length-1tb", "chunked-endless"])
def test_viewer_refuses_a_huge_body_without_reading_it(slow_viewer, chunked):
    """dlprofviewer answers 413 (JSON) at once and closes the connection: the client cannot push more than the
    socket buffers hold, and the viewer's memory stays flat."""
    port, pid = slow_viewer["port"], slow_viewer["pid"]
    before = _rss_mb(pid)
    headers = {**UPLOAD_HEADERS, **({"Transfer-Encoding": "chunked"} if chunked else {"Content-Length": TERABYTE})}
    upload = StreamingUpload(port, API + "reaggregate", headers, chunked)
    try:
        status, resp_headers, body, _ = upload.answer()
        assert status == 413 and resp_headers["content-type"] == "application/json"
        assert "request body too large" in json.loads(body)["error"]
        upload.pump.join(120)
        assert isinstance(upload.error, (ConnectionResetError, BrokenPipeError)), upload.error
        assert upload.sent < 64 << 20, upload.sent  # what the sockets' buffers took, not the terabyte
    finally:
        upload.finish()
    assert _rss_mb(pid) - before < MEMORY_SLACK_MB
    assert request(port, "GET", API + "runs")[0] == 200


@pytest.mark.slow
@pytest.mark.parametrize("chunked", [False, True], ids=["content-length-1tb", "chunked-endless"])
def test_tensorboard_refuses_a_huge_body_without_reading_it(tensorboard, chunked):
    """The plugin answers 413 (JSON) before reading the body: the answer comes while the client still streams;
    TensorBoard's werkzeug server then discards what the client sends (in 10 MB reads, up to 10 GB) without
    keeping it: its memory stays flat over the 1 GiB sent."""
    port = tensorboard["port"]
    pid = _listener_pid(port)
    before = _rss_mb(pid)
    headers = {
        **_same_origin(port),
        **({"Transfer-Encoding": "chunked"} if chunked else {"Content-Length": TERABYTE}),
    }
    upload = StreamingUpload(port, "/pfx" + API + "reaggregate", headers, chunked)
    try:
        status, resp_headers, body, sent_then = upload.answer()
        assert status == 413 and resp_headers["content-type"] == "application/json"
        assert "request body too large" in json.loads(body)["error"]
        assert sent_then < STREAM_CAP // 2  # answered long before the client stopped sending
        upload.pump.join(300)
        assert not upload.pump.is_alive()
    finally:
        upload.finish()
    assert _rss_mb(pid) - before < MEMORY_SLACK_MB
    assert request(port, "GET", "/pfx" + API + "runs")[0] == 200


@pytest.mark.slow
def test_viewer_refuses_a_huge_body_announced_with_expect_100_continue(slow_viewer):
    """A client that waits for `100 Continue` before sending its body (curl does for large ones) gets the 413
    instead, and sends nothing."""
    port = slow_viewer["port"]
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        head = {**UPLOAD_HEADERS, "Content-Length": TERABYTE, "Expect": "100-continue"}
        lines = [f"POST {API}reaggregate HTTP/1.1", f"Host: 127.0.0.1:{port}", *(f"{k}: {v}" for k, v in head.items())]
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        first = sock.recv(12)
        assert first == b"HTTP/1.1 413", first


class Dripper:
    """A connection sending `head`, then one byte every 0.2 s (a slowloris client), until the server closes it."""

    def __init__(self, port: int, head: bytes, drip: bytes = b"X"):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.sock.sendall(head)
        self.opened = time.monotonic()
        self.drip, self.halt = drip, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        with contextlib.suppress(OSError):
            while not self.halt.is_set() and self.drip:
                self.sock.send(self.drip)
                self.halt.wait(0.2)  # the drip rate is the attack under test, not a wait for a condition

    def closed_by_server(self) -> bool:
        return _peek(self.sock) == b""

    def close(self):
        self.halt.set()
        self.thread.join(10)
        self.sock.close()


@pytest.mark.slow
def test_viewer_drops_slow_and_idle_connections_while_answering_others(slow_viewer):
    """--request_timeout=1: requests whose headers (or body) trickle in are closed after 1 s; --idle_timeout=2: a
    connection that sends nothing is closed after 2 s; meanwhile normal requests are answered."""
    port = slow_viewer["port"]
    head = f"GET {API}runs HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n".encode()
    body_head = (
        f"POST {API}reaggregate HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"{REQUEST_HEADER}: 1\r\nContent-Length: 1000\r\n\r\n{{"
    ).encode()
    headers = [Dripper(port, head) for _ in range(20)]
    body = Dripper(port, body_head, drip=b" ")
    idle = Dripper(port, b"", drip=b"")
    try:
        code, _, payload = request(port, "GET", API + "runs", timeout=10)
        assert code == 200 and json.loads(payload)["runs"]
        for slow, timeout in [*((d, 1.0) for d in headers), (body, 1.0), (idle, 2.0)]:
            wait_until(slow.closed_by_server, 30, "the server to close a slow connection")
            assert time.monotonic() - slow.opened >= timeout  # not before its time
        assert request(port, "GET", API + "runs", timeout=10)[0] == 200
    finally:
        for d in [*headers, body, idle]:
            d.close()


@pytest.mark.slow
def test_viewer_holds_its_connection_limit(limited_viewer):
    """--connection_limit=4: with 4 connections open, more wait in the kernel's accept queue, unanswered, while
    the held ones are served; each connection closed lets one waiting connection in."""
    port, pid = limited_viewer["port"], limited_viewer["pid"]
    head = f"GET {API}runs HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n".encode()
    held = [Dripper(port, head, drip=b"") for _ in range(4)]
    waiting = []
    try:
        wait_until(lambda: _connections(pid, port) == (4, 0), 30, "the viewer to hold 4 connections")
        for _ in range(3):
            sock = socket.create_connection(("127.0.0.1", port), timeout=30)
            sock.sendall(f"GET {API}runs HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n".encode())
            waiting.append(sock)
        wait_until(lambda: _connections(pid, port) == (4, 3), 30, "3 connections waiting to be accepted")
        # a held connection finishes its request and is answered: the server ran since the others arrived ...
        held[0].sock.sendall(b"\r\n")
        resp = http.client.HTTPResponse(held[0].sock)
        resp.begin()
        assert resp.status == 200 and json.loads(resp.read())["runs"]
        # ... and still has not accepted any of them
        assert _connections(pid, port) == (4, 3)
        assert _answered(waiting) == 0
        for d in held[1:3]:
            d.close()
        wait_until(lambda: _answered(waiting) >= 2, 30, "two waiting connections to be served")
        assert _connections(pid, port)[0] <= 4
        held[0].close()
        held[3].close()
        wait_until(lambda: _answered(waiting) == 3, 30, "every waiting connection to be served")
        for sock in waiting:
            resp = http.client.HTTPResponse(sock)
            resp.begin()
            assert resp.status == 200
    finally:
        for d in held:
            d.close()
        for sock in waiting:
            sock.close()


def _peek(sock: socket.socket) -> bytes | None:
    """What a connection has to read, without waiting: None (nothing yet), b"" (closed by the server), data."""
    if not select.select([sock], [], [], 0)[0]:
        return None
    try:
        return sock.recv(4096, socket.MSG_PEEK)
    except ConnectionResetError:
        return b""


def _answered(socks: list[socket.socket]) -> int:
    """How many of these connections have an answer waiting to be read."""
    return sum(bool(_peek(sock)) for sock in socks)


@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM"])
def test_a_signal_during_signals_held_acts_when_the_block_ends(signame):
    """Another thread that does not block the signal receives it while the main thread holds signals: Python
    still runs the handler on the main thread at once, which ended the run inside the block (the database
    writer being created). The interrupt must come after the (outermost) block, once."""
    script = textwrap.dedent(f"""
        import os, signal, threading, time
        from dlprof_profiler.cli.main import ended_by_signals
        from dlprof_profiler.outputs.publish import signals_held

        go = threading.Event()
        helper = threading.Thread(target=lambda: (go.wait(), os.kill(os.getpid(), signal.{signame})), daemon=True)
        helper.start()  # before the block: it does not block the signal, so the kernel may hand it the signal
        steps = []
        try:
            with ended_by_signals():
                with signals_held():
                    with signals_held():  # nested: the outer block's end acts
                        go.set()
                        helper.join()
                        for _ in range(50):  # bytecode runs: a pending Python handler would run now
                            time.sleep(0.01)
                        steps.append("inner block finished")
                    steps.append("outer block finished")
                steps.append("after the blocks")
        except KeyboardInterrupt as exc:
            steps.append(type(exc).__name__)
        print(steps)
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        preexec_fn=_interruptible_as_in_a_terminal,
    )
    expected = "KeyboardInterrupt" if signame == "SIGINT" else "Interrupted"
    assert done.stdout.strip() == str(["inner block finished", "outer block finished", expected]), done.stderr[-2000:]
