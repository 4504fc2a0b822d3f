"""`dlprof --database` from the command line: good runs, bad input, outputs that appear whole or not at all."""

import hashlib
import os
import sqlite3

import pytest

from tests import profiles
from tests.nsys_builder import NsysExport
from tests.profiles import run_dlprof


def sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def error_line(proc):
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert "ERROR: " in lines[0] and lines[0].startswith("[DLProf-")
    return lines[0]


def assert_nothing_written(out_dir):
    assert not out_dir.exists() or not [p for p in out_dir.rglob("*")], list(out_dir.rglob("*"))


@pytest.fixture
def export(tmp_path):
    return profiles.training_profile(tmp_path / "t.sqlite")


def test_version_and_help():
    assert run_dlprof("--version").stdout.startswith("dlprof ")
    helptext = run_dlprof("--help").stdout
    for word in ("--database", "--key_node", "--iter_start", "--reports", "simple", "pytorch", "tensorflow1"):
        assert word in helptext


@pytest.mark.slow
def test_input_is_never_modified(tmp_path, export):
    before = (sha(export), os.stat(export).st_mtime_ns)
    run_dlprof(f"--database={export}", "--reports=all", f"--output_path={tmp_path / 'o'}")
    assert (sha(export), os.stat(export).st_mtime_ns) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o", "t.sqlite"]  # no journal left beside it


@pytest.mark.slow
@pytest.mark.parametrize(
    "content,message",
    [
        (None, "no such file"),
        (b"", "empty file"),
        (b"hello, this is not a database" * 10, "not an SQLite database"),
    ],
)
def test_unreadable_inputs(tmp_path, content, message):
    path = tmp_path / "input.sqlite"
    if content is not None:
        path.write_bytes(content)
    proc = run_dlprof(f"--database={path}", f"--output_path={tmp_path / 'o'}", check=False)
    assert proc.returncode != 0
    line = error_line(proc)
    assert str(path) in line and message in line
    assert_nothing_written(tmp_path / "o")


@pytest.mark.slow
def test_truncated_file(tmp_path, export):
    data = export.read_bytes()
    path = tmp_path / "cut.sqlite"
    path.write_bytes(data[: len(data) // 2])
    proc = run_dlprof(f"--database={path}", f"--output_path={tmp_path / 'o'}", check=False)
    assert proc.returncode != 0
    line = error_line(proc)
    assert str(path) in line and "truncated" in line
    assert_nothing_written(tmp_path / "o")


@pytest.mark.slow
def test_sqlite_that_is_not_an_export(tmp_path):
    path = tmp_path / "other.sqlite"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE people (name TEXT)")
    con.commit()
    con.close()
    proc = run_dlprof(f"--database={path}", f"--output_path={tmp_path / 'o'}", check=False)
    assert proc.returncode != 0
    assert "not an Nsight Systems export or DLProf database" in error_line(proc)


@pytest.mark.slow
def test_exports_without_cuda_or_nvtx_warn_and_still_report(tmp_path):
    exp = NsysExport()
    t = exp.add_thread(pid=1, tid=1, name="python", process_name="python")
    exp.push_pop(t, 0, 100, "step")
    no_cuda = exp.write(tmp_path / "no_cuda.sqlite")
    proc = run_dlprof(f"--database={no_cuda}", f"--output_path={tmp_path / 'a'}")
    assert "no CUDA trace tables" in proc.stderr and (tmp_path / "a" / "dlprof_summary.csv").is_file()
    exp = NsysExport()
    exp.add_gpu(device_id=0)
    t = exp.add_thread(pid=1, tid=1, name="python", process_name="python")
    exp.launch(t, 10, 20, 30, 40, kernel="k")
    no_nvtx = exp.write(tmp_path / "no_nvtx.sqlite")
    proc = run_dlprof(f"--database={no_nvtx}", "--reports=kernel", f"--output_path={tmp_path / 'b'}")
    assert "no NVTX ranges" in proc.stderr
    assert "unassociated_cudaLaunchKernel" in (tmp_path / "b" / "dlprof_kernel.csv").read_text()


@pytest.mark.slow
def test_key_node_not_found_warns_and_gives_one_iteration(tmp_path, export):
    proc = run_dlprof(
        f"--database={export}", "--key_node=nope", "--reports=summary,expert_systems", f"--output_path={tmp_path / 'o'}"
    )
    assert "key node 'nope' found" in proc.stderr or "key node 'nope'" in proc.stderr
    text = (tmp_path / "o" / "dlprof_summary.csv").read_text()
    assert "Total Iterations,1" in text and "Start Iteration,0" in text and "Stop Iteration,0" in text
    assert "key op nope not found" in (tmp_path / "o" / "dlprof_expert_systems.csv").read_text()


@pytest.mark.slow
@pytest.mark.parametrize(
    "args,message",
    [
        (["--iter_start=2", "--iter_stop=1"], "--iter_stop 1 is below --iter_start 2"),
        (["--iter_start=7"], "outside the profile"),
        (["--iter_start=-1"], "invalid arguments"),
        (["--reports=summary,bogus"], "invalid arguments"),
    ],
)
def test_bad_iteration_ranges_and_options(tmp_path, export, args, message):
    proc = run_dlprof(f"--database={export}", *args, f"--output_path={tmp_path / 'o'}", check=False)
    assert proc.returncode == 2
    assert message in error_line(proc)
    assert_nothing_written(tmp_path / "o")


def test_output_path_that_cannot_be_written(tmp_path, export):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    proc = run_dlprof(f"--database={export}", f"--output_path={blocker / 'sub'}", check=False)
    assert proc.returncode != 0
    assert str(blocker / "sub") in error_line(proc)


@pytest.mark.slow
def test_existing_outputs_need_force(tmp_path, export):
    out = tmp_path / "o"
    run_dlprof(f"--database={export}", "--reports=summary", f"--output_path={out}")
    first = sha(out / "dlprof_dldb.sqlite")
    proc = run_dlprof(f"--database={export}", "--reports=summary", f"--output_path={out}", check=False)
    assert proc.returncode != 0
    line = error_line(proc)
    assert "output file exists" in line and "--force" in line
    assert sha(out / "dlprof_dldb.sqlite") == first
    run_dlprof(f"--database={export}", "--reports=summary", f"--output_path={out}", "-f", "true")
    assert len(list((out / "dlprof").glob("events.out.tfevents.*"))) == 1  # the old event file was replaced
    assert not list(out.glob(".dlprof-staging-*"))


@pytest.mark.slow
def test_a_failure_after_reading_leaves_no_partial_output(tmp_path, export):
    out = tmp_path / "o"
    proc = run_dlprof(
        f"--database={export}",
        "--key_node=Optimizer.step#SGD.step",
        "--iter_start=3",
        "--iter_stop=9",
        f"--output_path={out}",
        check=False,
    )
    assert proc.returncode == 2
    assert not out.exists()  # the folder it created, empty after the failure, is removed too


@pytest.mark.slow
def test_dump_model_data(tmp_path, export):
    import json

    run_dlprof(f"--database={export}", "--dump_model_data=true", f"--output_path={tmp_path / 'o'}")
    doc = json.loads((tmp_path / "o" / "dlprof_model_data.json").read_text())
    names = {op["name"] for op in doc["default"]["ops"]}
    assert "/aten::conv2d" in names and len(doc["default"]["instances"]["data"]) == 24


@pytest.mark.slow
def test_dlprof_18_database_is_refused_with_the_file_to_give_instead(tmp_path):
    """DLProf 1.8's own database (its table names: reference dlprof_outputs.md §6) holds no NVTX ranges or
    API calls to rebuild the op model from: one line saying so and naming the export to give instead."""
    import sqlite3

    db = tmp_path / "dlprof_dldb.sqlite"
    con = sqlite3.connect(db)
    for table in (
        "dictionary",
        "metric",
        "read_only_ops",
        "read_only_op_instances",
        "read_only_kernels",
        "node_time_metrics",
        "op_nodes",
        "aggregations",
        "db_version",
    ):
        con.execute(f"CREATE TABLE {table} (id INTEGER PRIMARY KEY)")
    con.execute("INSERT INTO db_version VALUES (1)")
    con.commit()
    con.close()
    before = db.read_bytes()
    proc = run_dlprof(f"--database={db}", f"--output_path={tmp_path / 'o'}", check=False)
    assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) == 1
    assert "a database written by NVIDIA DLProf 1.x" in proc.stderr and "nsys_profile.sqlite" in proc.stderr
    assert db.read_bytes() == before and not (tmp_path / "o").exists()


def test_every_message_is_one_line_whatever_it_holds(capsys):
    """Control characters are escaped as repr() writes them: a name cannot end a line or forge another."""
    from dlprof_profiler import log

    log.error("/tmp/a\n[DLProf-00:00:00] ERROR: forged\r\x1b[2K\u2028\udcff\tend é")
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.endswith(" ERROR: /tmp/a\\n[DLProf-00:00:00] ERROR: forged\\r\\x1b[2K\\u2028\\udcff\\tend é\n")


@pytest.mark.parametrize("signum", ["SIGTERM", "SIGHUP"])
def test_sigterm_and_sighup_unwind_the_run(signum):
    """They raise in the run (which then removes its staging and lock, as after Ctrl-C); a second one while it
    unwinds is ignored; the previous handlers come back after the run."""
    import signal

    from dlprof_profiler.cli.main import ended_by_signals
    from dlprof_profiler.errors import Interrupted

    number = getattr(signal, signum)
    before = signal.getsignal(number)
    with pytest.raises(Interrupted) as err, ended_by_signals():
        try:
            os.kill(os.getpid(), number)  # the handler runs as soon as the call returns
        finally:
            os.kill(os.getpid(), number)  # while unwinding: ignored
    assert (err.value.signum, err.value.name) == (number, signum)
    assert signal.getsignal(number) is before


def test_the_command_line_becomes_one_frozen_run_options():
    """Parsed once: defaults applied, lists as tuples, the diff added with a baseline; nothing can change it."""
    import dataclasses
    import pickle

    from dlprof_profiler.cli.main import parse_options
    from dlprof_profiler.options import DEFAULT_REPORTS, REPORT_NAMES, RunOptions

    options = parse_options(["--database=x.sqlite", "--key_node", "step", "--iter_start=2", "--baseline=b.sqlite"])
    assert isinstance(options, RunOptions)
    assert options.reports == (*DEFAULT_REPORTS, "diff") and options.formats == ("csv",)
    assert (options.key_node, options.iter_start, options.iter_stop) == ("step", 2, None)
    assert options.profile_name == options.base_name == "dlprof" and options.command == ()
    assert str(options.database_path) == "dlprof_dldb.sqlite" and str(options.baseline_path) == "b.sqlite"
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.key_node = "other"
    assert pickle.loads(pickle.dumps(options)) == options  # what the rank workers receive
    profiled = parse_options(["--reports", "all", "--", "python", "train.py", "--reports=x"])
    assert profiled.command == ("python", "train.py", "--reports=x") and "diff" not in profiled.reports
    assert set(profiled.reports) == set(REPORT_NAMES) - {"all", "diff"}  # "all" is every report of one profile
    viewer = RunOptions.reaggregation("aten::relu", 1, None)
    assert viewer.require_key_node and viewer.reports == () and viewer.analysis_config().key_node == "aten::relu"
