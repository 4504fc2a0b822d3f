"""`dlprof --backend=torch`: real captures of CPU PyTorch programs with torch.profiler, analysed, and checked
against the trace the program wrote (read here with the standard library) and the program's own log."""

from __future__ import annotations

import gzip
import json
import os
import re
import sqlite3
import sys
import textwrap
from decimal import Decimal
from pathlib import Path

import pytest

from dlprof_profiler.capture import torch_profiler as capture_torch
from dlprof_profiler.cli import main as cli
from dlprof_profiler.errors import DLProfError
from tests.profiles import run_dlprof
from tests.stored_ranges import with_raw_ranges

pytest.importorskip("torch")
pytestmark = pytest.mark.torch

# A small training loop that logs when each iteration starts and ends (absolute epoch seconds).
TRAIN = textwrap.dedent("""
    import json, os, sys, time
    import torch
    import torch.nn as nn
    steps, pause = int(sys.argv[1]), float(sys.argv[2])
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    if os.environ.get("TRAIN_BEFORE_DELAY"):   # start iterating this long before dlprof's delay ends
        capture = json.loads(os.environ["DLPROF_TORCH_CAPTURE"])
        open(os.environ["TRAIN_LOG"] + ".t0", "w").write(str(capture["t0"]))
        # the program's own clock: dlprof's delay has no event a program could wait for
        while time.time() < capture["t0"] + capture["delay"] - float(os.environ["TRAIN_BEFORE_DELAY"]):
            time.sleep(0.05)
    log = open(os.environ["TRAIN_LOG"], "w")
    for i in range(steps):
        time.sleep(pause)  # the step's host work: the times the tests compare the capture with
        log.write(json.dumps({"step": i, "start": time.time()}) + "\\n"); log.flush()
        loss = model(torch.randn(8, 16)).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        log.write(json.dumps({"step": i, "end": time.time()}) + "\\n"); log.flush()
    if os.environ.get("TRAIN_CHILD"):
        import subprocess
        env = dict(os.environ, TRAIN_CHILD="", TRAIN_LOG=os.environ["TRAIN_LOG"] + ".child")
        subprocess.run([sys.executable, __file__, "2", "0"], env=env, check=True)
    sys.exit(int(os.environ.get("TRAIN_EXIT", "0")))
""")


def train_script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text(TRAIN)
    return path


def events(trace: Path) -> list:
    with gzip.open(trace, "rb") as fh:
        return json.load(fh)["traceEvents"]


def steps_in(evs) -> list[int]:
    return sorted(
        int(m.group(1))
        for e in evs
        if e.get("cat") == "user_annotation"
        for m in [re.fullmatch(r"ProfilerStep#(\d+)", e["name"])]
        if m
    )


def is_dlprof_range(event) -> bool:
    """A range dlprof_profiler.pytorch emitted: a marker (a dict literal) or a scope of its own."""
    own_scope = re.match(r"(Optimizer\.step|enumerate\(DataLoader\))#", event["name"])
    return event["name"].startswith("{'") or bool(own_scope)


def dlprof(tmp_path, *options, env=None, check=False):
    full_env = dict(os.environ, TRAIN_LOG=str(tmp_path / "train.log"), **(env or {}))
    return run_dlprof_env(["--backend=torch", f"--output_path={tmp_path / 'out'}", *options], full_env, check)


def run_dlprof_env(args, env, check):
    import subprocess

    repo = Path(__file__).resolve().parents[1]
    env = dict(env, PYTHONPATH=str(repo) + os.pathsep + env.get("PYTHONPATH", ""))
    proc = subprocess.run(
        [sys.executable, "-m", "dlprof_profiler", *args], capture_output=True, text=True, env=env, timeout=900
    )
    if check and proc.returncode:
        raise AssertionError(f"dlprof exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


def sql(db: Path, query: str):
    con = sqlite3.connect(db)
    if "read_only_ranges" in query:
        with_raw_ranges(con)
    try:
        return con.execute(query).fetchall()
    finally:
        con.close()


@pytest.mark.slow
def test_capture_analyse_and_pass_the_exit_status(tmp_path):
    """A real capture: the trace goes next to the outputs, every report is written, the figures follow
    the trace (ProfilerStep count, op counts), and the program's exit status (3) is dlprof's. A user's
    own sitecustomize still runs. The unmodified script's torch is annotated as dlprof_profiler.pytorch.init()
    does: ops named by the module attribute path, as under Nsight Systems (tests/test_capture.py)."""
    script = train_script(tmp_path)
    own = tmp_path / "own_site"
    own.mkdir()
    (own / "sitecustomize.py").write_text(f"open({str(tmp_path / 'own_site_ran')!r}, 'w').close()\n")
    proc = dlprof(
        tmp_path,
        "--reports=all",
        sys.executable,
        str(script),
        "3",
        "0",
        env={"TRAIN_EXIT": "3", "PYTHONPATH": str(own)},
    )
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "Backend: torch.profiler (Kineto)" in proc.stdout
    assert (tmp_path / "own_site_ran").exists()
    out = tmp_path / "out"
    trace = out / "dlprof.pt.trace.json.gz"
    for name in ("summary", "detailed", "iteration", "kernel", "tensor_core", "op_type", "group_op", "expert_systems"):
        assert (out / f"dlprof_{name}.csv").exists(), name
    evs = events(trace)
    # ProfilerStep#0 opens when profiling starts, each optimizer step closes one and opens the next
    assert steps_in(evs) == [0, 1, 2, 3]
    db = out / "dlprof_dldb.sqlite"
    # the iterations are the steps in which something ran: ProfilerStep#3, opened by the last optimizer step
    # and closed at exit, holds no op
    assert sql(db, "SELECT key_node, total_iterations FROM aggregations") == [("ProfilerStep", 3)]
    # ProfilerStep#0 runs from the start of profiling to the first optimizer step (the trace says so): partial,
    # as the first key-node interval of an nsys capture, and left out of the median
    meta = json.loads(gzip.open(trace).read())
    assert meta["dlprof_partial_steps"] == [0, 3]
    assert sql(db, "SELECT DISTINCT iter_value, complete FROM iteration_summary ORDER BY iter_value") == [
        (0, 0),
        (1, 1),
        (2, 1),
    ]
    # PyTorch's ops are ranges with their seq and op_id; dlprof's own ranges (written as cpu_ops: its markers,
    # named by a dict literal, and the optimizer-step scope) are annotations, taken as they are
    ops = [e for e in evs if e.get("cat") == "cpu_op" and not is_dlprof_range(e)]
    markers = [e for e in evs if e["name"].startswith("{'")]
    assert sql(db, "SELECT count(*) FROM read_only_ranges WHERE text LIKE '%, op_id = %'")[0][0] == len(ops)
    assert sql(db, "SELECT count(*) FROM read_only_ranges WHERE text LIKE '{''%'")[0][0] == len(markers) > 0
    # each forward call of a Linear layer is one call of the op named by its attribute path in the model
    calls = dict(
        sql(
            db,
            "SELECT o.op_name, sum(n.num_calls) FROM op_nodes n JOIN read_only_ops o USING (op_index) "
            "WHERE o.direction = 'fprop' AND o.op_type = 'linear' GROUP BY 1",
        )
    )
    linear = sum(1 for e in ops if e["name"] == "aten::linear")
    assert linear == 6 and calls == {"/module/model/0/linear": 3, "/module/model/2/linear": 3}
    directions = dict(
        sql(db, "SELECT direction, count(*) FROM read_only_ops WHERE op_name = '/module/model/0/linear' GROUP BY 1")
    )
    assert directions == {"fprop": 1, "bprop": 1}
    # no op of PyTorch's own (aten::, autograd nodes): the markers name every op
    assert sql(db, "SELECT count(*) FROM read_only_ops WHERE op_name LIKE '%aten::%' OR op_type LIKE '%Backward%'")[
        0
    ] == (0,)
    # torch.profiler's Python tracer is off (the markers carry the stacks)
    assert not [e for e in evs if e.get("cat") == "python_function"]
    stacks = [r[0] for r in sql(db, "SELECT stack_trace FROM read_only_ops WHERE stack_trace IS NOT NULL")]
    assert stacks and all("train.py:" in s and "sitecustomize" not in s for s in stacks)


@pytest.mark.slow
def test_capture_without_annotation_keeps_torch_profiler_names(tmp_path):
    """--pytorch_init=false: torch as shipped, torch.profiler's own names (module class and instance
    counters, aten:: ops) and Python stacks."""
    script = train_script(tmp_path)
    proc = dlprof(tmp_path, "--pytorch_init=false", "--reports=summary", sys.executable, str(script), "3", "0")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    evs = events(tmp_path / "out" / "dlprof.pt.trace.json.gz")
    assert not [e for e in evs if e["name"].startswith("{'")]
    db = tmp_path / "out" / "dlprof_dldb.sqlite"
    names = {r[0] for r in sql(db, "SELECT op_name FROM read_only_ops")}
    assert "/ProfilerStep/Sequential_0/Linear_0/aten::linear" in names
    assert "/ProfilerStep/Optimizer.step#SGD.step/aten::add_" in names
    directions = dict(
        sql(
            db,
            "SELECT direction, count(*) FROM read_only_ops "
            "WHERE op_name = '/ProfilerStep/Sequential_0/Linear_0/aten::linear' GROUP BY 1",
        )
    )
    assert directions == {"fprop": 1, "bprop": 1}
    stacks = [r[0] for r in sql(db, "SELECT stack_trace FROM read_only_ops WHERE stack_trace IS NOT NULL")]
    assert stacks and all("train.py(" in s and "sitecustomize" not in s for s in stacks)


@pytest.mark.slow
def test_capture_iterations_keep_only_the_window(tmp_path):
    script = train_script(tmp_path)
    proc = dlprof(tmp_path, "--capture_iterations=2:3", "--reports=summary", sys.executable, str(script), "6", "0")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    evs = events(tmp_path / "out" / "dlprof.pt.trace.json.gz")
    assert steps_in(evs) == [2, 3]
    linear = sum(1 for e in evs if e.get("cat") == "cpu_op" and e["name"] == "aten::linear")
    assert linear == 2 * 2  # two iterations of two Linear layers
    summary = (tmp_path / "out" / "dlprof_summary.csv").read_text().splitlines()
    assert "Total Iterations,2" in summary  # the two steps kept, nothing after them
    # both are whole steps, from one optimizer step to the next: none is partial
    assert "dlprof_partial_steps" not in json.loads(gzip.open(tmp_path / "out" / "dlprof.pt.trace.json.gz").read())
    db = tmp_path / "out" / "dlprof_dldb.sqlite"
    assert sql(db, "SELECT DISTINCT iter_value, complete FROM iteration_summary ORDER BY iter_value") == [
        (0, 1),
        (1, 1),
    ]


@pytest.mark.slow
def test_delay_starts_collection_later(tmp_path):
    """The program reads dlprof's start time and delay from its environment and starts iterating 2.5 s
    before the delay ends (torch's import may take many seconds on a loaded machine, hence the long
    delay), 10 iterations 0.5 s apart: collection starts at the first module call after the delay, so
    exactly the iterations that end after that are recorded, and the first ones are not."""
    script = train_script(tmp_path)
    proc = dlprof(
        tmp_path,
        "--delay=20",
        "--reports=summary",
        sys.executable,
        str(script),
        "10",
        "0.5",
        env={"TRAIN_BEFORE_DELAY": "2.5"},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    t0 = float((tmp_path / "train.log.t0").read_text())
    log = [json.loads(line) for line in (tmp_path / "train.log").read_text().splitlines()]
    if not any("end" in r and r["end"] < t0 + 20 for r in log):
        pytest.skip("importing torch and building the model outlasted the delay on this (loaded) machine")
    trace = tmp_path / "out" / "dlprof.pt.trace.json.gz"
    evs = events(trace)
    base = json.loads(gzip.open(trace).read())["baseTimeNanoseconds"]
    # PyTorch's first op (dlprof's config marker goes out the moment collection starts, which may be inside
    # the step that ends the delay, before the program logs that step's end)
    ops = [e for e in evs if e.get("cat") == "cpu_op" and not is_dlprof_range(e)]
    first_op = min(Decimal(str(e["ts"])) for e in ops) * 1000 + base
    assert first_op >= Decimal(t0 + 20) * 10**9
    after = [r["step"] for r in log if "end" in r and Decimal(r["end"]) * 10**9 > first_op]
    assert 1 <= len(after) < 10  # the first iterations ran before the delay
    assert steps_in(evs) == list(range(len(after) + 1))


@pytest.mark.slow
def test_duration_ends_the_program_with_sigterm(tmp_path):
    script = train_script(tmp_path)
    proc = dlprof(tmp_path, "--duration=3", "--reports=summary", sys.executable, str(script), "200", "0.2")
    assert proc.returncode == 128 + 15, proc.stdout + proc.stderr  # SIGTERM, as with nsys
    log = [json.loads(line) for line in (tmp_path / "train.log").read_text().splitlines()]
    done = [r["step"] for r in log if "end" in r]
    recorded = steps_in(events(tmp_path / "out" / "dlprof.pt.trace.json.gz"))
    assert 1 <= len(recorded) and len(done) < 200
    assert (tmp_path / "out" / "dlprof_summary.csv").exists()


@pytest.mark.slow
def test_child_processes_are_profiled_and_analysed_together(tmp_path):
    script = train_script(tmp_path)
    proc = dlprof(tmp_path, "--reports=summary", sys.executable, str(script), "3", "0", env={"TRAIN_CHILD": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    folder = tmp_path / "out" / "dlprof_torch_traces"
    traces = sorted(folder.glob("*.pt.trace.json.gz"))
    assert len(traces) == 2 and not (tmp_path / "out" / "dlprof.pt.trace.json.gz").exists()
    ops = sum(1 for t in traces for e in events(t) if e.get("cat") == "cpu_op" and not is_dlprof_range(e))
    db = tmp_path / "out" / "dlprof_dldb.sqlite"
    assert sql(db, "SELECT count(*) FROM read_only_ranges WHERE text LIKE '%, op_id = %'")[0][0] == ops
    assert sql(db, "SELECT count(DISTINCT pid) FROM read_only_ranges")[0][0] == 2


@pytest.mark.slow
def test_no_trace_is_a_clear_error(tmp_path):
    script = tmp_path / "plain.py"
    script.write_text("print('no torch here')\n")
    proc = dlprof(tmp_path, sys.executable, str(script))
    assert proc.returncode == 1 and "no trace was written: the command did not import torch" in proc.stderr
    assert not (tmp_path / "out" / "dlprof_dldb.sqlite").exists()


# ---------------------------------------------------------------------------- options (no capture)


def test_backend_default_follows_nsys_on_path(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert cli.choose_backend(None)[0] == "torch"
    (tmp_path / "nsys").write_text("#!/bin/sh\n")
    (tmp_path / "nsys").chmod(0o755)
    assert cli.choose_backend(None)[0] == "nsys"
    assert cli.choose_backend("torch") == ("torch", "")


def test_capture_iterations_option():
    assert capture_torch.parse_iterations("5:9") == (5, 9) and capture_torch.parse_iterations(None) is None
    for bad in ("9:5", "a:b", "-1:3", "1:2:3"):
        with pytest.raises(DLProfError):
            capture_torch.parse_iterations(bad)
    options = cli.parse_options(["--backend=torch", "--capture_iterations", "2:4", "--delay", "3", "python", "x.py"])
    with pytest.raises(DLProfError, match="do not combine"):
        capture_torch.check_options(options)


def test_command_environment_puts_the_hook_first():
    env = capture_torch.command_environment({"dir": "/x"}, {"PYTHONPATH": "/mine"})
    assert env["PYTHONPATH"] == str(capture_torch.HOOK_DIR) + os.pathsep + "/mine"
    assert json.loads(env["DLPROF_TORCH_CAPTURE"]) == {"dir": "/x"}
    root = capture_torch.HOOK_DIR.parent.parent.parent  # the checkout: capture/torch_startup/ is the hook
    assert json.loads(env["DLPROF_PYTORCH_INIT"]) == {"root": str(root), "backend": "record_function"}
    assert (root / "dlprof_profiler" / "pytorch" / "__init__.py").exists()
    assert (capture_torch.HOOK_DIR / "sitecustomize.py").exists()
    # the hook reads the variables by these names (it cannot import dlprof_profiler to share them)
    hook = (capture_torch.HOOK_DIR / "sitecustomize.py").read_text()
    assert '"DLPROF_TORCH_CAPTURE"' in hook and '"DLPROF_PYTORCH_INIT"' in hook
    plain = capture_torch.command_environment({"dir": "/x"}, {"DLPROF_PYTORCH_INIT": "{}"}, pytorch_init=False)
    assert "DLPROF_PYTORCH_INIT" not in plain and "DLPROF_TORCH_CAPTURE" in plain


@pytest.mark.slow
def test_existing_trace_needs_force(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "dlprof.pt.trace.json.gz").write_bytes(b"old")
    proc = run_dlprof("--backend=torch", f"--output_path={tmp_path / 'out'}", sys.executable, "-c", "pass", check=False)
    assert proc.returncode == 1 and "already exists" in proc.stderr
    assert (tmp_path / "out" / "dlprof.pt.trace.json.gz").read_bytes() == b"old"
