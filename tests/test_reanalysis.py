"""Re-analysing a DLProf database (run/reanalysis.py: `dlprof --database=dlprof_dldb.sqlite`, the viewer's
Reaggregate) with the options of the run that wrote it gives that run's reports byte for byte, on every real
profile the suite holds: the database keeps all a re-analysis reads."""

from __future__ import annotations

import shutil
import sqlite3

import pytest

from dlprof_profiler.cli.main import main
from dlprof_profiler.db.load import (
    READ_BASE_BYTES,
    READ_BYTES_PER_ROW,
    made_from,
    memory_to_read,
    rows_read_whole,
)
from dlprof_profiler.errors import DLProfError
from dlprof_profiler.run import reanalysis
from dlprof_profiler.run.single import reaggregate_in_place
from tests import data
from tests.stored_ranges import stored_ranges
from tests.profiles import run_dlprof

PROFILES = sorted(data.NSYS.glob("*.sqlite")) + sorted(data.KINETO.glob("*.json.gz"))


@pytest.mark.slow
@pytest.mark.parametrize("profile", PROFILES, ids=lambda p: p.name)
def test_a_database_re_analysed_gives_the_reports_of_the_run_that_wrote_it(profile, tmp_path):
    first, again = tmp_path / "first", tmp_path / "again"
    options = ("--reports=all", "--formats=csv,json", "-v", "quiet")
    run_dlprof(f"--database={profile}", f"--output_path={first}", *options)
    run_dlprof(f"--database={first / 'dlprof_dldb.sqlite'}", f"--output_path={again}", *options)
    reports = sorted(p.name for p in first.iterdir() if p.suffix in (".csv", ".json"))
    assert "dlprof_summary.csv" in reports  # (profiles without ops get the summary and kernel reports only)
    assert sorted(p.name for p in again.iterdir() if p.suffix in (".csv", ".json")) == reports
    for name in reports:
        assert (again / name).read_bytes() == (first / name).read_bytes(), name


@pytest.fixture(scope="module")
def analysed(tmp_path_factory):
    """Databases of a real Kineto trace (op details) and a real nsys export (two NVTX domains, no details)."""
    base = tmp_path_factory.mktemp("reanalysis")
    out = {}
    for name in ("pytorch_amd_mi250.json.gz", "nvfuser_8xh100_nsys2024.6.sqlite"):
        folder = base / name.split(".")[0]
        source = (data.KINETO if name.endswith(".gz") else data.NSYS) / name
        run_dlprof(f"--database={source}", f"--output_path={folder}", "--reports=summary", "-v", "quiet")
        out[name] = folder / "dlprof_dldb.sqlite"
    return out


def _count(db, sql: str) -> int:
    con = sqlite3.connect(db)
    try:
        return int(con.execute(sql).fetchone()[0] or 0)
    finally:
        con.close()


def test_the_rows_a_re_analysis_reads_whole_are_counted_without_a_scan(analysed):
    for db in analysed.values():
        con = sqlite3.connect(db)
        try:
            ranges = len(stored_ranges(con))  # the blocks decoded by pyarrow alone
        finally:
            con.close()
        assert ranges > 0
        counted = sum(
            _count(db, f"SELECT count(*) FROM {table}")
            for table in ("raw_api_calls", "raw_gpu_activities", "raw_op_instances")
        )
        assert rows_read_whole(db) == ranges + counted
        assert memory_to_read(ranges + counted) == READ_BASE_BYTES + READ_BYTES_PER_ROW * (ranges + counted)


def test_a_re_analysis_the_memory_cannot_hold_is_refused_before_anything_is_read_or_written(
    analysed, tmp_path, monkeypatch
):
    db = tmp_path / "dlprof_dldb.sqlite"
    shutil.copy(analysed["nvfuser_8xh100_nsys2024.6.sqlite"], db)
    before = db.read_bytes()
    rows = rows_read_whole(db)
    need = memory_to_read(rows)
    monkeypatch.setattr(reanalysis, "available_memory", lambda: need - 1)
    with pytest.raises(DLProfError) as refused:
        reaggregate_in_place(db, iter_start=0, iter_stop=0)
    message = str(refused.value)
    assert message.startswith(f"{db}: re-analysing this database needs about {need / 2**30:.1f} GB of memory")
    assert f"({rows:,} ranges" in message and "\n" not in message
    export = data.NSYS / "nvfuser_8xh100_nsys2024.6.sqlite"
    assert made_from(db) == (str(export), "nsys_sqlite")
    assert f"analyse the export it was made from instead (dlprof --database={export} --out_of_core=on:" in message
    assert db.read_bytes() == before  # no aggregation appended
    out = tmp_path / "out"
    assert main([f"--database={db}", f"--output_path={out}", "-v", "quiet"]) != 0
    assert not out.exists() or not any(out.iterdir())
    # with room for it, the same re-analysis goes ahead
    monkeypatch.setattr(reanalysis, "available_memory", lambda: need)
    assert reaggregate_in_place(db, iter_start=0, iter_stop=0) == 2
