"""`dlprof python train.py` on unmodified PyTorch scripts, real captures on both backends.

- Nsight Systems: the startup hook annotates torch with no code change (ops named by module attribute path,
  fprop/bprop, iterations at the optimizer step, Framework PyTorch, a true wall clock), checked against the
  export read here with sqlite3; `--pytorch_init=false` leaves torch alone; a script calling init() itself is
  not annotated twice; dlprof_profiler is loaded from dlprof's installation without its folder on sys.path.
- A program with no NVTX at all still gets its capture's own window as wall clock and one line saying why.
- torch.profiler: the same script gives the same ops (name, type, direction and calls) as under nsys.

The scripts are tests/unmodified_train.py (a tiny Transformer LM and a CNN) and small inline programs.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("torch")

pytestmark = pytest.mark.slow  # real Nsight Systems and torch.profiler captures of a training script


REPO = Path(__file__).resolve().parents[1]
TRAIN = REPO / "tests" / "unmodified_train.py"
STEPS = 2


def dlprof(out: Path, *argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """This tree's dlprof as a user runs it (the command's own PYTHONPATH is the test's)."""
    full = dict(os.environ, PYTHONPATH=str(REPO), **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", "dlprof_profiler", f"--output_path={out}", *argv],
        capture_output=True,
        text=True,
        env=full,
        timeout=600,
    )


def summary(out: Path) -> dict:
    with open(out / "dlprof_summary.csv", newline="") as fh:
        return {row[0]: row[1] for row in csv.reader(fh) if len(row) >= 2}


def detailed(out: Path) -> list[dict]:
    with open(out / "dlprof_detailed.csv", newline="") as fh:
        rows = list(csv.reader(fh))
    head = next(i for i, row in enumerate(rows) if row and row[0] == "Op ID")
    return [dict(zip(rows[head], row)) for row in rows[head + 1 :] if row and row[0]]


def calls_by_op(out: Path) -> Counter:
    """Calls per (op name, op type, direction) over every op of that name (the n-th-call ops of DLProf's rule
    depend on where iterations are cut, which differs between the backends; their calls do not)."""
    calls = Counter()
    for row in detailed(out):
        calls[(row["Op Name"], row["Op Type"], row["Direction"])] += int(row["No. Calls"])
    return calls


def export_rows(out: Path, query: str) -> list:
    with sqlite3.connect(out / "nsys_profile.sqlite") as db:
        return db.execute(query).fetchall()


RANGE_TEXT = "coalesce(e.text, s.value)"
RANGES = "FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId WHERE e.eventType = 59"


@pytest.fixture(scope="module")
def nsys_run(tmp_path_factory):
    if shutil.which("nsys") is None:
        pytest.skip("Nsight Systems (nsys) is not on PATH")
    out = tmp_path_factory.mktemp("nsys") / "out"
    proc = dlprof(out, "--reports=summary,detail", sys.executable, str(TRAIN), "--steps", str(STEPS))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out, proc


@pytest.fixture(scope="module")
def torch_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("torch") / "out"
    proc = dlprof(out, "--backend=torch", "--reports=summary,detail", sys.executable, str(TRAIN), "--steps", str(STEPS))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out, proc


LM = "/module/train_lm"
CNN = "/module/train_cnn"
# A few ops of the two models by hand: name -> (op type, directions). One call per training step each.
EXPECTED = {
    f"{LM}/model/embed/embedding": ("embedding", {"fprop", "bprop"}),
    f"{LM}/model/encoder/layers.0/self_attn/multi_head_attention_forward": (
        "multi_head_attention_forward",
        {"fprop", "bprop"},
    ),
    f"{LM}/model/encoder/layers.1/linear2/linear": ("linear", {"fprop", "bprop"}),
    f"{LM}/model/encoder/layers.1/norm2/layer_norm": ("layer_norm", {"fprop", "bprop"}),
    f"{LM}/model/encoder/layers.1/dropout1/dropout": ("dropout", {"fprop"}),  # p = 0: no autograd node
    f"{LM}/model/head/linear": ("linear", {"fprop", "bprop"}),
    f"{LM}/cross_entropy": ("cross_entropy", {"fprop", "bprop"}),
    f"{CNN}/model/conv/conv2d": ("conv2d", {"fprop", "bprop"}),
    f"{CNN}/model/bn/batch_norm": ("batch_norm", {"fprop", "bprop"}),
    f"{CNN}/model/relu_": ("relu_", {"fprop", "bprop"}),
    # the in-place relu_ on a slice of the flattened view: CopySlices and the view's AsStridedBackward0
    f"{CNN}/model/relu_[2]": ("relu_", {"fprop", "bprop"}),
    # flatten's and the slice's backward nodes are replaced by the in-place op's: they never run
    f"{CNN}/model/flatten": ("flatten", {"fprop"}),
    f"{CNN}/model/__getitem__": ("__getitem__", {"fprop"}),
    f"{CNN}/model/fc/linear": ("linear", {"fprop", "bprop"}),
}


def check_expected_ops(calls: Counter) -> None:
    by_name = {}
    for (name, op_type, direction), n in calls.items():
        by_name.setdefault(name, {})[direction] = (op_type, n)
    for name, (op_type, directions) in EXPECTED.items():
        assert set(by_name.get(name, {})) == directions, name
        for direction in directions:
            assert by_name[name][direction] == (op_type, STEPS), (name, direction)
    # the optimizers' ops are named like every other op: by the call hierarchy from the script's frame
    adamw = [n for n in by_name if n.startswith(f"{LM}/") and "/AdamW::step/" in n and n.endswith("/_foreach_lerp_")]
    sgd = [n for n in by_name if n.startswith(f"{CNN}/") and "/SGD::step/" in n and n.rsplit("/", 1)[1] == "mul_"]
    assert len(adamw) == 1 and by_name[adamw[0]] == {"fprop": ("_foreach_lerp_", STEPS)}
    assert sgd and all(by_name[n]["fprop"][0] == "mul_" for n in sgd)
    clip = [n for n in by_name if "/clip_grad_norm_/" in n and n.endswith("/_foreach_norm")]
    assert len(clip) == 1 and by_name[clip[0]] == {"fprop": ("_foreach_norm", STEPS)}
    # every op starts at the script (no optimizer-step or DataLoader prefix), and no autograd node is an
    # op of its own: every bprop op is the backward of an fprop op of the same name and type
    assert all(name.startswith("/module/") for name in by_name)
    for name, sides in by_name.items():
        if "bprop" in sides:
            assert sides.get("fprop", (None,))[0] == sides["bprop"][0], name
    assert not [t for (_, t, _) in calls if "Accumulate" in t or "Backward" in t or "CopySlices" in t]


@pytest.mark.nsys
def test_nsys_names_ops_of_an_unmodified_script(nsys_run):
    out, proc = nsys_run
    check_expected_ops(calls_by_op(out))
    facts = summary(out)
    assert facts["Framework"].startswith("PyTorch ")
    # no driver on this machine: nsys records NvDriverVersion 0 (and its own CUDA version): not shown
    (driver,) = export_rows(out, "SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'NvDriverVersion'")
    if str(driver[0]) in ("0", ""):
        assert facts["GPU Driver Version"] == "Unknown" and facts["CUDA Version"] == "Unknown"


@pytest.mark.nsys
def test_nsys_iterations_and_wall_clock_follow_the_export(nsys_run):
    """Iterations at the optimizer step: AdamW's N steps (the first optimizer stepped) give N + 1 iterations
    (DLProf's rule); the wall clock runs from the first range (the config marker at init()) to the end of the
    last iteration, the profile's last event (the last range to end: no CUDA here), as read from the export."""
    out, _ = nsys_run
    facts = summary(out)
    (steps,) = export_rows(out, f"SELECT count(*) {RANGES} AND {RANGE_TEXT} = 'Optimizer.step#AdamW.step'")
    assert steps[0] == STEPS and int(facts["Total Iterations"]) == STEPS + 1
    ((first, last),) = export_rows(
        out, "SELECT min(start), max(end) FROM NVTX_EVENTS WHERE eventType IN (59, 60) AND end IS NOT NULL"
    )
    assert int(facts["Wall Clock Time (ns)"]) == last - first
    assert float(facts["Average Iteration Time (ns)"]) == pytest.approx((last - first) / (STEPS + 1), abs=0.05)


@pytest.mark.nsys
@pytest.mark.torch
def test_both_backends_give_the_same_ops(nsys_run, torch_run):
    """One name per op: the same (name, type, direction) and the same calls of each, under Nsight Systems
    (NVTX markers) and torch.profiler (the markers as record_function ranges)."""
    nsys_calls, torch_calls = calls_by_op(nsys_run[0]), calls_by_op(torch_run[0])
    assert set(torch_calls) == set(nsys_calls)
    assert torch_calls == nsys_calls
    check_expected_ops(torch_calls)
    assert summary(torch_run[0])["Framework"].startswith("PyTorch ")


# A script that annotates itself (import + init()), and reports what the startup hook did.
SELF_ANNOTATED = textwrap.dedent("""
    import json, os, sys
    import torch
    import torch.nn.functional as F
    import dlprof_profiler
    import dlprof_profiler.pytorch as dp
    dp.init()
    layer = torch.nn.Linear(4, 2)
    for _ in range(3):
        layer(torch.randn(8, 4)).sum().backward()
    wrapped = getattr(F.linear, "__dlprof_original__", None)
    json.dump({
        "package": dlprof_profiler.__file__,
        "sys_path": sys.path,
        "active": dp.is_active(),
        "wrapped_once": wrapped is not None and getattr(wrapped, "__dlprof_original__", None) is None,
    }, open(sys.argv[1], "w"))
""")
# The same program with no dlprof in it (the hook alone annotates it, unless told not to).
PLAIN_TORCH = textwrap.dedent("""
    import json, sys
    import torch
    layer = torch.nn.Linear(4, 2)
    for _ in range(3):
        layer(torch.randn(8, 4)).sum().backward()
    json.dump({"annotated": "dlprof_profiler.pytorch" in sys.modules}, open(sys.argv[1], "w"))
""")


@pytest.mark.nsys
def test_a_script_calling_init_is_annotated_once_from_dlprofs_own_package(tmp_path):
    """The hook loads dlprof_profiler from this installation by its path, so the profiled program's sys.path
    gets only the hook's folder (here the command's PYTHONPATH is cut down to it: the program still imports
    dlprof_profiler through the hook's loading). The script's own init() then changes nothing: one set of
    markers per call."""
    if shutil.which("nsys") is None:
        pytest.skip("Nsight Systems (nsys) is not on PATH")
    script, report = tmp_path / "self_annotated.py", tmp_path / "report.json"
    script.write_text(SELF_ANNOTATED)
    only_hook = 'PYTHONPATH="${PYTHONPATH%%' + os.pathsep + '*}" exec "$0" "$@"'
    out = tmp_path / "out"
    proc = dlprof(out, "--reports=summary,detail", "sh", "-c", only_hook, sys.executable, str(script), str(report))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    seen = json.loads(report.read_text())
    assert seen["active"] and seen["wrapped_once"]
    assert Path(seen["package"]).resolve() == (REPO / "dlprof_profiler" / "__init__.py").resolve()
    assert str(REPO) not in [os.path.abspath(p) for p in seen["sys_path"] if p]
    linear_markers = f"{RANGE_TEXT} LIKE '{{''mod'': ''torch.nn.functional'', ''op'': ''linear'', %''fprop''%'"
    arg_markers = export_rows(out, f"SELECT count(*) {RANGES} AND {linear_markers}")
    assert arg_markers == [(3,)]
    # no optimizer, so no key node: one iteration, and the three calls of one name are three ops
    calls = calls_by_op(out)
    assert {k: v for k, v in calls.items() if k[1] == "linear"} == {
        ("/module/layer/linear", "linear", "fprop"): 3,
        ("/module/layer/linear", "linear", "bprop"): 3,
    }


@pytest.mark.nsys
def test_pytorch_init_false_profiles_the_program_as_it_is(tmp_path):
    if shutil.which("nsys") is None:
        pytest.skip("Nsight Systems (nsys) is not on PATH")
    script, report = tmp_path / "plain_torch.py", tmp_path / "report.json"
    script.write_text(PLAIN_TORCH)
    out = tmp_path / "out"
    proc = dlprof(out, "--pytorch_init=false", "--reports=summary", sys.executable, str(script), str(report))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(report.read_text()) == {"annotated": False}
    # nsys writes no NVTX_EVENTS table when nothing was recorded
    assert export_rows(out, "SELECT count(*) FROM sqlite_master WHERE name = 'NVTX_EVENTS'") == [(0,)]


@pytest.mark.nsys
def test_a_program_without_nvtx_gets_its_capture_window_and_one_line(tmp_path):
    """A plain Python program (no torch, no NVTX, no CUDA): the wall clock is the capture's own window
    (ANALYSIS_DETAILS), one iteration of that length (no key node: DLProf's rule), and one console line
    saying what is missing and what to do."""
    if shutil.which("nsys") is None:
        pytest.skip("Nsight Systems (nsys) is not on PATH")
    script = tmp_path / "plain.py"
    script.write_text("import time\nend = time.time() + 0.5\nwhile time.time() < end:\n    pass\n")
    out = tmp_path / "out"
    proc = dlprof(out, sys.executable, str(script))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ((start, stop),) = export_rows(out, "SELECT startTime, stopTime FROM ANALYSIS_DETAILS")
    facts = summary(out)
    assert int(facts["Wall Clock Time (ns)"]) == stop - start >= 500_000_000
    assert int(facts["Total Iterations"]) == 1
    assert float(facts["Average Iteration Time (ns)"]) == stop - start
    lines = [line for line in proc.stderr.splitlines() if "nsys_profile.sqlite" in line and "NVTX" in line]
    assert len(lines) == 1, proc.stderr
    assert "recorded no NVTX ranges and no CUDA activity" in lines[0] and "imports torch" in lines[0]
    assert facts["CUDA Version"] == "Unknown" and facts["Framework"] == "Unknown"
