"""The one analysis sequence (run/analyse.py): what a sink is given and left with, in either engine. The figures
are those of tests/profiles.rank_profile, computed by hand."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from dlprof_profiler import contract as K
from dlprof_profiler import process_memory
from dlprof_profiler.cli.main import parse_options
from dlprof_profiler.outputs.publish import Staging
from dlprof_profiler.run import analyse
from dlprof_profiler.run.single import RunDatabase
from tests.profiles import RANK_STEPS, rank_profile

DATA = Path(__file__).parent / "data" / "nsys"


class RecordingDatabase(RunDatabase):
    """A single run's sink that remembers the domain order it was asked to open the database with."""

    def open(self, trace, domain_names: list, events: int | None = None):
        self.domain_names = list(domain_names)
        return super().open(trace, domain_names, events)


def options_for(source: Path, out: Path, *extra: str):
    return parse_options([f"--database={source}", f"--output_path={out}", *extra])


def test_the_baseline_sink_analyses_and_writes_nothing(tmp_path):
    source = rank_profile(tmp_path / "r0.sqlite", 0)
    out = tmp_path / "out"
    with analyse.analysed(source, options_for(source, out), analyse.Sink()) as run:
        assert run.database is None
        kernels = run.result.aggregations[run.result.primary].kernels
        gemm = kernels[kernels["name"].astype(str) == "volta_sgemm_32x32_sliced1x4_tn"]
        assert int(gemm["gpu_total"].sum()) == RANK_STEPS * 20_000  # one 20 us GEMM a step (the docstring)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r0.sqlite"]  # no output folder, no staging


@pytest.mark.parametrize("engine", ["off", "on"])
def test_the_database_is_opened_with_the_model_domains_in_either_engine(tmp_path, engine):
    # a rank's database numbers its domains before the model exists: the order it is opened with must be the
    # order of the model's domains, in memory and out of core
    source = DATA / "pytorch_2gpu_nccl_nsys2026.2_before.sqlite"
    out = tmp_path / "out"
    out.mkdir()
    options = options_for(source, out, f"--out_of_core={engine}")
    staging = Staging(out)
    sink = RecordingDatabase(options, staging)
    with analyse.analysed(source, options, sink) as run:
        assert sink.domain_names == list(run.result.corr.domains)
        run.database.start()
        domain_ids, _ = run.database.finish()
    staged = staging.path(options.database_path)
    con = sqlite3.connect(staged)
    try:
        names = [r[0] for r in con.execute(f"SELECT name FROM {K.RAW_DOMAINS} ORDER BY domain_id")]
    finally:
        con.close()
    assert names == sink.domain_names == sorted(domain_ids, key=domain_ids.get)
    staging.discard()


def test_a_failure_while_writing_outputs_discards_the_staged_database(tmp_path):
    source = rank_profile(tmp_path / "r0.sqlite", 0)
    out = tmp_path / "out"
    out.mkdir()
    options = options_for(source, out)
    staging = Staging(out)
    sink = RunDatabase(options, staging)
    with pytest.raises(RuntimeError, match="disk gone"):
        with analyse.analysed(source, options, sink):
            assert staging.path(options.database_path).exists()
            raise RuntimeError("disk gone")
    assert not staging.root.exists() and list(out.iterdir()) == []


def heap_kept_while_writing(source: Path, options, out: Path) -> bool:
    """Whether glibc's heap is kept while the analysed profile's database is written (the outputs' time)."""
    staging = Staging(out)
    with analyse.analysed(source, options, RunDatabase(options, staging)) as run:
        kept = process_memory.heap_kept()
        run.database.start()
        run.database.finish()
    staging.discard()
    return kept


@pytest.mark.parametrize(
    "source, extra, kept",
    [
        (DATA / "pytorch_2gpu_nccl_nsys2026.2_before.sqlite", (), True),  # bounded by the engine choice
        (DATA / "pytorch_2gpu_nccl_nsys2026.2_before.sqlite", ("--out_of_core=off",), False),  # forced: any size
        (DATA.parent / "kineto" / "pytorch_cpu_only.pt.trace.json.gz", (), False),  # a Kineto trace: any size
    ],
)
def test_only_a_profile_bounded_in_size_keeps_its_freed_memory(tmp_path, source, extra, kept):
    out = tmp_path / "out"
    out.mkdir()
    assert heap_kept_while_writing(source, options_for(source, out, *extra), out) is kept
    assert process_memory.heap_kept() is False  # and only during the analysis


def test_out_of_core_the_analysis_after_staging_keeps_its_freed_memory(tmp_path, monkeypatch):
    # staging's frees are handed back before the analysis; the analysis keeps its own (segment after segment),
    # and the heap is trimmed again once it returns
    source = DATA / "pytorch_2gpu_nccl_nsys2026.2_before.sqlite"
    out = tmp_path / "out"
    out.mkdir()
    options = options_for(source, out, "--out_of_core=on")
    seen = []
    trims = []
    monkeypatch.setattr(process_memory, "_libc", lambda: type("Libc", (), {"malloc_trim": trims.append})())
    real_analyze_store = analyse.analyze_store

    def spy(*args, **kwargs):
        seen.append((process_memory.heap_kept(), len(trims)))
        result = real_analyze_store(*args, **kwargs)
        seen.append((process_memory.heap_kept(), len(trims)))
        return result

    monkeypatch.setattr(analyse, "analyze_store", spy)
    real_load = analyse.TraceStore.load

    def load(self, *args, **kwargs):
        trace = real_load(self, *args, **kwargs)
        trims.append("staged")
        return trace

    monkeypatch.setattr(analyse.TraceStore, "load", load)
    after = heap_kept_while_writing(source, options, out)
    (kept_at_start, trims_before), (kept_at_end, trims_after) = seen
    assert kept_at_start and kept_at_end and after is False
    assert 0 in trims[trims.index("staged") : trims_before]  # a trim once staged, before the analysis
    assert trims_after == trims_before  # none while the analysis ran
