"""Comparing with a baseline (`dlprof --baseline`, the diff report): compare.py's rows on a hand-computed pair of
profiles, the identity "op deltas add up to the change of total GPU time" on the real before/after exports,
per-kernel GPU times against SQL sums over those exports, and the command line's rules."""

from __future__ import annotations

import csv
import io
import json
import math
import sqlite3
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dlprof_profiler.engine import compare
from tests.nsys_builder import NsysExport
from tests.profiles import run_dlprof
from tests import data

FIXTURES = data.NSYS
BEFORE = FIXTURES / "pytorch_2gpu_nccl_nsys2026.2_before.sqlite"
AFTER = FIXTURES / "pytorch_2gpu_nccl_nsys2026.2_after.sqlite"
needs_fixtures = pytest.mark.skipif(not (BEFORE.exists() and AFTER.exists()), reason="before/after fixtures missing")


# ---------------------------------------------------------------------------- hand-computed profiles


def _profile(path: Path, calls: list[tuple]) -> Path:
    """One thread of emit_nvtx-style ops, each launching one kernel: calls = [(label, seq, start, kernel,
    kernel start, kernel end)]; op [start, start + 3000), launch [start + 100, start + 200)."""
    exp = NsysExport(schema="2022.4")
    exp.add_gpu(device_id=0)
    tid = exp.add_thread(pid=10, tid=10, name="python", process_name="python")
    for op_id, (label, seq, start, kernel, k0, k1) in enumerate(calls, 1):
        exp.push_pop(tid, start, start + 3000, f"{label}, seq = {seq}, op_id = {op_id}")
        exp.launch(tid, start + 100, start + 200, k0, k1, kernel=kernel)
    exp.set_session(start_time=0)
    return exp.write(path)


def hand_before(path: Path) -> Path:
    """/aten::mm -> gemm_a 10 us; /aten::relu -> relu_k 3 us; /aten::relu[2] -> relu_k 2 us."""
    return _profile(
        path,
        [
            ("aten::mm", 1, 1000, "gemm_a", 2000, 12000),
            ("aten::relu", 2, 6000, "relu_k", 12000, 15000),
            ("aten::relu", 3, 20000, "relu_k", 22000, 24000),
        ],
    )


def hand_after(path: Path) -> Path:
    """/aten::mm -> gemm_a 6 us; /aten::relu -> relu_k 3 us; /aten::add -> add_k 1 us."""
    return _profile(
        path,
        [
            ("aten::mm", 1, 1000, "gemm_a", 2000, 8000),
            ("aten::relu", 2, 6000, "relu_k", 9000, 12000),
            ("aten::add", 3, 13000, "add_k", 13500, 14500),
        ],
    )


# (name, direction, presence, calls, baseline calls, GPU time, baseline GPU time, delta, delta %), by |delta|
HAND_OPS = [
    ("/aten::mm", "fprop", "both", 1, 1, 6000, 10000, -4000, -40.0),
    ("/aten::relu[2]", "fprop", "baseline only", 0, 1, 0, 2000, -2000, -100.0),
    ("/aten::add", "fprop", "after only", 1, 0, 1000, 0, 1000, None),
    ("/aten::relu", "fprop", "both", 1, 1, 3000, 3000, 0, 0.0),
]
HAND_KERNELS = [
    ("gemm_a", "both", 1, 1, 6000, 10000, -4000, -40.0),
    ("relu_k", "both", 1, 2, 3000, 5000, -2000, -40.0),
    ("add_k", "after only", 1, 0, 1000, 0, 1000, None),
]


def read_sections(path: Path) -> dict:
    """{section title: rows (lists of text, header first when the section has one)} of a multi-section CSV."""
    out, title = {}, None
    for line in path.read_text(encoding="utf-8").split("\n\n"):
        rows = list(csv.reader(io.StringIO(line.strip("\n"))))
        if rows:
            title = rows[0][0]
            out[title] = rows[1:]
    return out


def as_number(text: str):
    if text == "":
        return None
    return float(text) if "." in text else int(text)


@pytest.fixture(scope="module")
def hand(tmp_path_factory):
    root = tmp_path_factory.mktemp("hand")
    before, after = hand_before(root / "before.sqlite"), hand_after(root / "after.sqlite")
    run_dlprof(
        f"--database={after}",
        f"--baseline={before}",
        f"--output_path={root / 'out'}",
        "--formats=csv,json",
        "-v",
        "quiet",
    )
    return root, before, after


@pytest.mark.slow
def test_the_baseline_is_kept_in_the_runs_database(hand):
    """--baseline writes the baseline's side of the diff into the run's database, by hand: its three ops (mm
    10 us, relu 3 us, relu[2] 2 us; one call each), its two kernel rows per op (gemm_a, relu_k twice) and its
    figures, beside the run's aggregation 1 and primary domain."""
    import sqlite3

    root, before, after = hand
    con = sqlite3.connect(root / "out" / "dlprof_dldb.sqlite")
    try:
        (domain,) = con.execute("SELECT domain_id FROM read_only_domains WHERE is_primary").fetchone()
        (profile,) = con.execute(
            "SELECT aggr_id, domain_id, rank, source, iter_start, iter_stop, "
            "aggregated_iterations FROM baseline_profiles"
        ).fetchall()
        assert profile == (1, domain, 0, str(before), 0, 0, 1)
        ops = con.execute(
            "SELECT op_name, direction, num_calls, gpu_total FROM baseline_ops ORDER BY op_name"
        ).fetchall()
        assert ops == [
            ("/aten::mm", "fprop", 1, 10000),
            ("/aten::relu", "fprop", 1, 3000),
            ("/aten::relu[2]", "fprop", 1, 2000),
        ]
        kernels = con.execute(
            "SELECT kernel_name, num_calls, gpu_total FROM baseline_kernels ORDER BY gpu_total"
        ).fetchall()
        assert sorted(kernels) == [("gemm_a", 1, 10000), ("relu_k", 1, 2000), ("relu_k", 1, 3000)]
    finally:
        con.close()


def test_hand_computed_diff_report(hand):
    root, before, after = hand
    sections = read_sections(root / "out" / "dlprof_diff.csv")
    assert list(sections) == ["Compared Profiles", "Diff Summary", "Op Diff", "Kernel Diff"]
    header, *rows = sections["Op Diff"]
    assert header == [
        "Op Name",
        "Direction",
        "Op Type",
        "Present In",
        "No. Calls",
        "Baseline No. Calls",
        "GPU Time (ns)",
        "Baseline GPU Time (ns)",
        "Delta GPU Time (ns)",
        "Delta GPU Time %",
    ]
    got = [(r[0], r[1], r[3]) + tuple(as_number(v) for v in r[4:]) for r in rows]
    assert got == HAND_OPS
    header, *rows = sections["Kernel Diff"]
    assert header[:3] == ["Kernel Name", "Uses TC", "Present In"]
    assert [(r[0], r[2]) + tuple(as_number(v) for v in r[3:]) for r in rows] == HAND_KERNELS
    summary = {r[0]: r[1:] for r in sections["Diff Summary"][1:]}
    assert summary["Total GPU Time (ns)"] == ["15000", "10000", "-5000"]  # the op deltas' sum
    assert summary["Kernel GPU Time (ns)"] == ["15000", "10000", "-5000"]
    assert sum(r[7] for r in HAND_OPS) == -5000
    compared = {r[0]: r[1:] for r in sections["Compared Profiles"][1:]}
    assert compared["Profile"] == [str(before), str(after)]
    # quoting as DLProf's detailed report: names always quoted, direction and numbers bare
    text = (root / "out" / "dlprof_diff.csv").read_text()
    assert '\n"/aten::mm",fprop,"mm",both,1,1,6000,10000,-4000,-40.0\n' in text
    assert '\n"/aten::add",fprop,"add",after only,1,0,1000,0,1000,\n' in text


def test_hand_computed_json_has_the_same_tables(hand):
    root, _, _ = hand
    doc = json.loads((root / "out" / "dlprof_diff.json").read_text())
    assert doc["report"] == "diff"
    ops = next(s for s in doc["sections"] if s["title"] == "Op Diff")
    assert [tuple(r[:2]) + (r[3],) + tuple(r[4:]) for r in ops["rows"]] == HAND_OPS


def test_compare_module_on_frames():
    """compare.py alone: names shared by several ops sum, a missing direction is the empty text, ties of |delta|
    are ordered by the key."""
    after = pd.DataFrame(
        {
            "name": ["/a", "/b", "/b", "x"],
            "direction": ["fprop", "bprop", "bprop", None],
            "op_type": ["a", "b", "b", "x"],
            "calls": [1, 2, 3, 4],
            "gpu_time": [5, 20, 30, 7],
        }
    )
    base = pd.DataFrame(
        {
            "name": ["/a", "/c", "x"],
            "direction": ["fprop", "fprop", np.nan],
            "op_type": ["a", "c", "x"],
            "calls": [1, 1, 4],
            "gpu_time": [10, 5, 7],
        }
    )
    out = compare.compare_ops(after, base)
    assert out[["name", "direction", "presence", "calls", "baseline_calls", "delta"]].values.tolist() == [
        ["/b", "bprop", "after only", 5, 0, 50],
        ["/a", "fprop", "both", 1, 1, -5],
        ["/c", "fprop", "baseline only", 0, 1, -5],
        ["x", "", "both", 4, 4, 0],
    ]
    assert out["delta"].sum() == after["gpu_time"].sum() - base["gpu_time"].sum()
    assert math.isnan(out["delta_pct"].iloc[0]) and out["delta_pct"].iloc[1] == -50.0
    empty = compare.compare_ops(after.iloc[:0], base.iloc[:0])
    assert list(empty.columns) == compare.OP_COLUMNS and len(empty) == 0


# ---------------------------------------------------------------------------- the real before/after exports


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    root = tmp_path_factory.mktemp("real")
    run_dlprof(f"--database={BEFORE}", f"--output_path={root / 'before'}", "-v", "quiet")
    run_dlprof(f"--database={AFTER}", f"--baseline={BEFORE}", f"--output_path={root / 'after'}", "-v", "quiet")
    return root


def kernel_sums(export: Path) -> dict:
    """{short kernel name: (launches, summed duration)} straight from the export."""
    con = sqlite3.connect(f"file:{export}?mode=ro", uri=True)
    try:
        return {
            name: (n, total)
            for name, n, total in con.execute(
                'SELECT s.value, count(*), sum(k."end" - k.start) FROM CUPTI_ACTIVITY_KIND_KERNEL k '
                "JOIN StringIds s ON s.id = k.shortName GROUP BY s.value"
            )
        }
    finally:
        con.close()


def summary_value(path: Path, section: str, label: str, column: int = 1) -> str:
    return next(r for r in read_sections(path)[section] if r[0] == label)[column]


@pytest.mark.slow
@needs_fixtures
def test_op_deltas_add_up_to_the_change_of_total_gpu_time(real):
    sections = read_sections(real / "after" / "dlprof_diff.csv")
    ops = sections["Op Diff"][1:]
    # the summary reports of each run, analysed on its own: "All ops" GPU time
    before_total = int(summary_value(real / "before" / "dlprof_summary.csv", "All Ops", "All ops"))
    after_total = int(summary_value(real / "after" / "dlprof_summary.csv", "All Ops", "All ops"))
    assert sum(int(r[8]) for r in ops) == after_total - before_total != 0
    assert sum(int(r[6]) for r in ops) == after_total and sum(int(r[7]) for r in ops) == before_total
    summary = {r[0]: r[1:] for r in sections["Diff Summary"][1:]}
    assert summary["Total GPU Time (ns)"] == [str(before_total), str(after_total), str(after_total - before_total)]
    # every row: delta = after - baseline; one side only means 0 on the other
    for r in ops:
        assert int(r[8]) == int(r[6]) - int(r[7])
        assert (r[3] == "after only") == (int(r[5]) == 0) and (r[3] == "baseline only") == (int(r[4]) == 0)
    deltas = [abs(int(r[8])) for r in ops]
    assert deltas == sorted(deltas, reverse=True)
    assert {r[3] for r in ops} == {"both", "after only", "baseline only"}


@pytest.mark.slow
@needs_fixtures
def test_kernel_rows_equal_sql_sums_over_the_exports(real):
    """The one iteration of each export covers every kernel: per kernel name, launches and GPU time are the
    exports' own sums."""
    before, after = kernel_sums(BEFORE), kernel_sums(AFTER)
    rows = read_sections(real / "after" / "dlprof_diff.csv")["Kernel Diff"][1:]
    assert {r[0] for r in rows} == set(before) | set(after)
    for r in rows:
        name = r[0]
        calls, base_calls, gpu, base_gpu, delta = (int(v) for v in r[3:8])
        assert (calls, gpu) == after.get(name, (0, 0)), name
        assert (base_calls, base_gpu) == before.get(name, (0, 0)), name
        assert delta == gpu - base_gpu
    total = {r[0]: r[1:] for r in read_sections(real / "after" / "dlprof_diff.csv")["Diff Summary"][1:]}
    before_all, after_all = sum(v[1] for v in before.values()), sum(v[1] for v in after.values())
    assert total["Kernel GPU Time (ns)"] == [str(before_all), str(after_all), str(after_all - before_all)]


@pytest.mark.slow
@needs_fixtures
def test_a_dlprof_database_as_baseline_gives_the_same_diff(real, tmp_path):
    out = tmp_path / "o"
    run_dlprof(
        f"--database={AFTER}",
        f"--baseline={real / 'before' / 'dlprof_dldb.sqlite'}",
        f"--output_path={out}",
        "--reports=summary",
        "-v",
        "quiet",
    )
    mine = read_sections(out / "dlprof_diff.csv")
    theirs = read_sections(real / "after" / "dlprof_diff.csv")
    for title in ("Diff Summary", "Op Diff", "Kernel Diff"):
        assert mine[title] == theirs[title], title


# ---------------------------------------------------------------------------- command line


@pytest.mark.slow
def test_diff_rules_of_the_command_line(hand, tmp_path):
    root, before, after = hand
    proc = run_dlprof(f"--database={after}", "--reports=summary,diff", f"--output_path={tmp_path / 'a'}", check=False)
    assert proc.returncode == 2 and "--baseline" in proc.stderr and not (tmp_path / "a").exists()
    run_dlprof(f"--database={after}", "--reports=all", f"--output_path={tmp_path / 'b'}", "-v", "quiet")
    assert not (tmp_path / "b" / "dlprof_diff.csv").exists() and (tmp_path / "b" / "dlprof_kernel.csv").exists()
    run_dlprof(
        f"--database={after}", "--reports=all", f"--baseline={before}", f"--output_path={tmp_path / 'c'}", "-v", "quiet"
    )
    assert (tmp_path / "c" / "dlprof_diff.csv").exists()
    # an existing diff needs --force like every output
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "dlprof_diff.csv").write_text("an earlier diff")
    proc = run_dlprof(
        f"--database={after}",
        f"--baseline={before}",
        "--reports=summary",
        f"--output_path={tmp_path / 'd'}",
        check=False,
    )
    assert proc.returncode != 0 and "dlprof_diff.csv" in proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("content,message", [(None, "no such file"), (b"not a profile at all" * 8, "not an SQLite")])
def test_a_bad_baseline_is_one_line_naming_it_and_nothing_is_written(hand, tmp_path, content, message):
    _, _, after = hand
    bad = tmp_path / "baseline.sqlite"
    if content is not None:
        bad.write_bytes(content)
    proc = run_dlprof(f"--database={after}", f"--baseline={bad}", f"--output_path={tmp_path / 'o'}", check=False)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode != 0 and len(lines) == 1, proc.stderr
    assert str(bad) in lines[0] and message in lines[0]
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_the_baseline_gets_the_runs_iteration_range(tmp_path):
    """--iter_start/--iter_stop apply to both; a range the baseline does not have names the baseline."""
    from tests.profiles import training_profile

    three = training_profile(tmp_path / "three.sqlite", iterations=3)
    two = training_profile(tmp_path / "two.sqlite", iterations=1)
    proc = run_dlprof(
        f"--database={three}",
        f"--baseline={two}",
        "--iter_start=1",
        "--iter_stop=3",
        f"--output_path={tmp_path / 'o'}",
        check=False,
    )
    lines = [line for line in proc.stderr.splitlines() if line.strip() and "ERROR" in line]
    assert proc.returncode != 0 and len(lines) == 1 and str(two) in lines[0], proc.stderr
    assert not (tmp_path / "o").exists()
    run_dlprof(
        f"--database={three}",
        f"--baseline={three}",
        "--iter_start=1",
        "--iter_stop=2",
        f"--output_path={tmp_path / 'p'}",
        "-v",
        "quiet",
    )
    sections = read_sections(tmp_path / "p" / "dlprof_diff.csv")
    assert {r[0]: r[1:] for r in sections["Compared Profiles"][1:]}["Iterations"] == ["1 to 2 of 4", "1 to 2 of 4"]
    assert all(int(r[8]) == 0 and r[3] == "both" for r in sections["Op Diff"][1:])
