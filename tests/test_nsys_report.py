"""Nsight Systems reports as they come (nsys_report.py): `--database`, a rank list and `--baseline` take
`.nsys-rep`/`.qdrep` files, recognised by content, exported into the run's staging folder with the nsys on PATH
and analysed as the export; no nsys, or one too old: one line saying what to install."""

import os
import shutil
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dlprof_profiler.ingest import formats as ingest
from dlprof_profiler.ingest import nsys_report
from tests.profiles import run_dlprof
from tests.test_capture import _nvtx_library_loads
from tests.stored_ranges import with_raw_ranges

REPO = Path(__file__).resolve().parents[1]


def needs_nsys(test):
    """Marks of a test running the real nsys."""
    for mark in (
        pytest.mark.nsys,
        pytest.mark.skipif(shutil.which("nsys") is None, reason="Nsight Systems (nsys) is not on PATH"),
        pytest.mark.skipif(not _nvtx_library_loads(), reason="libnvToolsExt.so.1 (Debian libnvtoolsext1) is missing"),
    ):
        test = mark(test)
    return test


# A CPU program with NVTX ranges (ctypes libnvToolsExt.so.1, which nsys 2022.4 records): three steps
PROGRAM = textwrap.dedent("""
    import ctypes
    nvtx = ctypes.CDLL("libnvToolsExt.so.1")
    for step in range(3):
        nvtx.nvtxRangePushA(b"train_step")
        nvtx.nvtxRangePushA(b"forward")
        sum(i * i for i in range(20000))
        nvtx.nvtxRangePop()
        nvtx.nvtxRangePop()
""")


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """A real report written by the nsys installed here, and its export by that nsys (the reference)."""
    if shutil.which("nsys") is None or not _nvtx_library_loads():
        pytest.skip("needs nsys and libnvToolsExt.so.1")
    folder = tmp_path_factory.mktemp("report")
    (folder / "program.py").write_text(PROGRAM)
    subprocess.run(
        ["nsys", "profile", "-o", str(folder / "capture"), "-t", "nvtx,osrt", "--cpuctxsw=none", "-s", "none"]
        + [sys.executable, str(folder / "program.py")],
        check=True,
        capture_output=True,
        timeout=120,
        cwd=folder,
    )
    path = folder / "capture.nsys-rep"
    reference = folder / "reference" / "capture.sqlite"
    reference.parent.mkdir()
    subprocess.run(
        ["nsys", "export", "--type", "sqlite", "-o", str(reference), str(path)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return path, reference


def _listing(folder: Path) -> list:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.mark.slow
@needs_nsys
@pytest.mark.parametrize("name", ["capture.nsys-rep", "capture.qdrep", "capture.bin"])
def test_a_report_is_analysed_as_its_export(report, tmp_path, name):
    path, reference = report
    given = tmp_path / "given" / name  # recognised by its content, whatever its name
    given.parent.mkdir()
    shutil.copyfile(path, given)
    assert ingest.trace_format(given) == ingest.NSYS_REPORT
    before = _listing(given.parent)
    out, expected = tmp_path / "out", tmp_path / "expected"
    run_dlprof(f"--database={given}", "--key_node=train_step", "--reports=summary,detail", f"--output_path={out}")
    run_dlprof(
        f"--database={reference}", "--key_node=train_step", "--reports=summary,detail", f"--output_path={expected}"
    )
    assert _listing(given.parent) == before  # nothing written beside the input
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in expected.iterdir())  # no staging left
    detail = (out / "dlprof_detailed.csv").read_text()
    assert detail == (expected / "dlprof_detailed.csv").read_text() and "/train_step/forward" in detail
    assert "Total Iterations,4" in (out / "dlprof_summary.csv").read_text()  # three steps: 4 iterations
    con = with_raw_ranges(sqlite3.connect(out / "dlprof_dldb.sqlite"))
    try:
        source = con.execute("SELECT value FROM profile_info WHERE name = 'source_file'").fetchone()[0]
        ranges = con.execute("SELECT count(*) FROM raw_ranges").fetchone()[0]
    finally:
        con.close()
    assert source == str(given.resolve()) and ranges == 6  # the report, not its staged export


@pytest.mark.slow
@needs_nsys
def test_reports_as_ranks_and_as_the_baseline(report, tmp_path):
    path, _ = report
    for name in ("r0.nsys-rep", "r1.qdrep"):
        shutil.copyfile(path, tmp_path / name)
    out = tmp_path / "ranks"
    run_dlprof(f"--database={tmp_path / 'r0.nsys-rep'},{tmp_path / 'r1.qdrep'}", f"--output_path={out}")
    ranks = (out / "dlprof_ranks.csv").read_text().splitlines()
    assert ranks[1].startswith(f"0,{tmp_path / 'r0.nsys-rep'},") and ranks[2].startswith(f"1,{tmp_path / 'r1.qdrep'},")
    out = tmp_path / "diff"
    run_dlprof(f"--database={tmp_path / 'r0.nsys-rep'}", f"--baseline={tmp_path / 'r1.qdrep'}", f"--output_path={out}")
    assert f"Profile,{tmp_path / 'r1.qdrep'},{tmp_path / 'r0.nsys-rep'}" in (out / "dlprof_diff.csv").read_text()
    assert not [p for p in out.iterdir() if p.name.startswith(".dlprof-staging")]


@pytest.mark.slow
@needs_nsys
def test_a_folder_takes_a_report_unless_its_export_is_beside_it(report, tmp_path):
    path, reference = report
    folder = tmp_path / "runs"
    folder.mkdir()
    shutil.copyfile(path, folder / "a.nsys-rep")
    shutil.copyfile(reference, folder / "a.sqlite")  # what `nsys profile --export=sqlite` leaves beside it
    shutil.copyfile(path, folder / "b.nsys-rep")
    out = tmp_path / "out"
    run_dlprof(f"--database={folder}", f"--output_path={out}")
    sources = [line.split(",")[1] for line in (out / "dlprof_ranks.csv").read_text().splitlines()[1:]]
    assert sources == [str(folder / "a.sqlite"), str(folder / "b.nsys-rep")]


def _fake_report(path: Path, version: str = "1") -> Path:
    path.write_bytes(b"NVIDIA Tegra Profiler Report " + version.encode() + b".\n\x0bLocal (CLI)\x12\n" + bytes(64))
    return path


@pytest.mark.slow
def test_without_nsys_one_line_says_what_to_install(tmp_path):
    report = _fake_report(tmp_path / "run.nsys-rep")
    env = dict(os.environ, PATH=str(tmp_path / "no-such-folder"), PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [sys.executable, "-m", "dlprof_profiler", f"--database={report}", f"--output_path={tmp_path / 'out'}"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert f"{report}: an Nsight Systems report" in lines[0] and "`nsys`, which is not on PATH" in lines[0]
    assert "apt-get install nsight-systems" in lines[0] and f"nsys export --type sqlite {report}" in lines[0]
    assert not (tmp_path / "out").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["run.nsys-rep"]


@pytest.mark.slow
@needs_nsys
def test_a_report_newer_than_the_nsys_on_path_is_named_with_the_version_to_install(tmp_path):
    report = _fake_report(tmp_path / "new.nsys-rep", "2099@1@0@5-abc")
    assert nsys_report.writer_version(report) == (2099, 1, 0, 5)
    proc = run_dlprof(f"--database={report}", f"--output_path={tmp_path / 'out'}", check=False)
    assert proc.returncode == 1
    line = proc.stderr.strip().splitlines()[-1]
    assert f"{report}: written by Nsight Systems 2099.1.0; the nsys on PATH" in line
    assert "install Nsight Systems 2099.1.0 or newer" in line
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
@needs_nsys
def test_a_report_nsys_cannot_export_is_one_line(tmp_path):
    report = _fake_report(tmp_path / "damaged.qdrep")
    proc = run_dlprof(f"--database={report}", f"--output_path={tmp_path / 'out'}", check=False)
    assert proc.returncode == 1
    line = proc.stderr.strip().splitlines()[-1]
    assert f"exporting {report} to SQLite failed" in line and "the report is damaged, or was written by a newer" in line
    assert ".dlprof-staging" not in line and not (tmp_path / "out").exists()
