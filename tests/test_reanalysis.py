"""Re-analysing a DLProf database (run/reanalysis.py: `dlprof --database=dlprof_dldb.sqlite`, the viewer's
Reaggregate) with the options of the run that wrote it gives that run's reports byte for byte, on every real
profile the suite holds: the database keeps all a re-analysis reads."""

from __future__ import annotations

import pytest

from tests import data
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
