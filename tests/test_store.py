"""The out-of-core path (DuckDB store, segment by segment) against the in-memory engine on the same files:
the staged frames equal read_nsys_export's, and every aggregation table and finding is the same however
the profile is split into segments."""

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from dlprof_profiler.engine.analysis import AnalysisConfig, analyze, analyze_store
from dlprof_profiler.ingest.nsys import read_nsys_export
from dlprof_profiler.ingest.sanitize import sanitize_trace
from dlprof_profiler.store.model import DatabaseFeed, StringPool
from dlprof_profiler.store.trace_store import TraceStore
from dlprof_profiler import contract as K
from tests import damage, profiles
from tests.profiles import run_dlprof
from tests.test_aggregate import _same_dict
from tests.test_fixtures import FIXTURES

FIXTURE_NAMES = sorted(p.name for p in FIXTURES.glob("*.sqlite"))


@pytest.fixture(scope="module")
def training(tmp_path_factory):
    return profiles.training_profile(tmp_path_factory.mktemp("store") / "training.sqlite")


@pytest.fixture(scope="module")
def damaged(tmp_path_factory, training):
    """The training profile with missing and reversed times in every table and a reused correlation id."""
    d = tmp_path_factory.mktemp("damaged")
    return damage.damaged_copy(
        training,
        d / "damaged.sqlite",
        "UPDATE NVTX_EVENTS SET start = NULL WHERE rowid = 3",
        'UPDATE NVTX_EVENTS SET "end" = start - 10 WHERE rowid = 7',
        'UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET "end" = NULL WHERE rowid = 2',
        "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = NULL WHERE rowid = 4",
        'UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET "end" = start - 5 WHERE rowid = 9',
        "UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET correlationId = "
        "(SELECT correlationId FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE rowid = 5) WHERE rowid = 12",
        nullable=("NVTX_EVENTS", "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_KERNEL"),
    )


@pytest.fixture(scope="module")
def backward_calls(tmp_path_factory):
    """Backward nodes grouped into calls (call_id): the op table is made of calls."""
    return profiles.backward_calls_profile(tmp_path_factory.mktemp("calls") / "calls.sqlite")


@pytest.fixture(scope="module")
def flops(tmp_path_factory):
    """Shapes, FP16 and FP32 GEMMs on a GPU of the peak table: FLOPs, achieved TFLOP/s and MFU."""
    return profiles.flops_profile(tmp_path_factory.mktemp("flops") / "flops.sqlite")


@pytest.fixture
def named(training, damaged, backward_calls, flops):
    return {"training": training, "damaged": damaged, "backward_calls": backward_calls, "flops": flops}


def _path(name, named):
    return named.get(name) or FIXTURES / name


TRACE_FRAMES = ("ranges", "api_calls", "gpu", "devices", "threads", "processes", "io_calls", "syncs")


def _assert_same_frames(expected, staged, frames) -> None:
    for frame in frames:
        pd.testing.assert_frame_equal(
            getattr(expected, frame).reset_index(drop=True),
            getattr(staged, frame).reset_index(drop=True),
            check_dtype=False,
            check_categorical=False,
            obj=frame,
        )


@pytest.mark.slow
@pytest.mark.parametrize("name", ["training", "damaged"] + FIXTURE_NAMES)
def test_staged_frames_equal_the_in_memory_ingest(name, named, tmp_path):
    path = _path(name, named)
    expected = sanitize_trace(read_nsys_export(path))
    store = TraceStore(path, tmp_path / "store")
    try:
        store.load()
        staged = store.whole_trace()
        _assert_same_frames(expected, staged, TRACE_FRAMES)
        for attr in ("meta", "system", "domain_map", "warnings", "has_cuda_tables", "has_nvtx"):
            assert getattr(expected, attr) == getattr(staged, attr), attr
        if name == "damaged":  # the damage is there: 2 ranges, 1 API call, 2 kernels dropped; one id shared
            text = " ".join(staged.warnings)
            assert "2 NVTX ranges (1 without a start or end time, 1 ending before they start)" in text
            assert "1 CUDA API calls (1 without a start or end time)" in text
            assert "2 GPU activities (1 without a start or end time, 1 ending before they start)" in text
            assert "1 correlation id(s) are used by more than one CUDA API call" in text
    finally:
        store.close()
    assert not (tmp_path / "store").exists()


@pytest.mark.parametrize(
    "name",  # the training profile keeps the out-of-core path in the everyday command
    ["training"]
    + [pytest.param(n, marks=pytest.mark.slow) for n in ["damaged", "backward_calls", "flops"] + FIXTURE_NAMES],
)
def test_out_of_core_analysis_equals_the_in_memory_one(name, named, tmp_path):
    # the small hand-made profiles are cut into many segments too (calls and ranges across segment bounds)
    splits = (10**9, 2000) + ((25,) if name in named else ())
    _assert_same_analysis(_path(name, named), AnalysisConfig(), splits, tmp_path)


def _assert_same_analysis(path, config: AnalysisConfig, splits, tmp_path) -> None:
    expected = analyze(sanitize_trace(read_nsys_export(path)), config)
    for events_per_segment in splits:
        store = TraceStore(path, tmp_path / f"store{events_per_segment}")
        try:
            store.load()
            result = analyze_store(store, config, events_per_segment=events_per_segment)
        finally:
            store.close()
        assert result.mode == expected.mode and result.primary == expected.primary
        its, want = result.iterations, expected.iterations
        assert its.boundaries.tolist() == want.boundaries.tolist()
        assert (its.key_node, its.found, its.by_step) == (want.key_node, want.found, want.by_step)
        assert its.starts.tolist() == want.starts.tolist() and its.ends.tolist() == want.ends.tolist()
        for domain, agg in expected.aggregations.items():
            other = result.aggregations[domain]
            assert (agg.window_start, agg.window_end) == (other.window_start, other.window_end)
            for table in ("ops", "op_types", "kernels", "tensor_core", "groups", "devices", "iterations"):
                pd.testing.assert_frame_equal(
                    getattr(agg, table).reset_index(drop=True),
                    getattr(other, table).reset_index(drop=True),
                    check_dtype=False,
                    obj=f"{domain} {table} ({events_per_segment} events per segment)",
                )
            for name in ("gpus", "streams", "launches"):  # GPU time breakdowns
                pd.testing.assert_frame_equal(
                    agg.gpu_breakdowns[name], other.gpu_breakdowns[name], check_dtype=False, obj=name
                )
            _same_dict(agg.summary, other.summary)
            assert [(f["id"], f["problem"]) for f in expected.findings[domain]] == [
                (f["id"], f["problem"]) for f in result.findings[domain]
            ]


def _iteration_case(case, tmp_path):
    """(profile, key nodes to look for) of the iteration rule's cases: ProfilerStep iterations (an empty last
    step), key nodes matching forward calls only (by label, by text), a window holding the last interval's
    data loading."""
    from tests import test_iterate

    if case == "profiler_steps":
        return test_iterate.profiler_steps_profile(tmp_path / "steps.sqlite"), ["ProfilerStep", "ProfilerStep#2"]
    if case == "forward_label":
        return profiles.backward_calls_profile(tmp_path / "calls.sqlite"), ["linear", "no_such_node"]
    return test_iterate.tail_loading_profile(tmp_path / "tail.sqlite"), ["train_step"]


def _matches(frame: pd.DataFrame) -> list:
    """A `ranges_where` answer as sorted plain rows (missing direction: None)."""
    rows = zip(*(frame[c].tolist() for c in ("start", "end", "pid", "global_tid")), frame["backward"].astype(bool))
    directions = [d if isinstance(d, str) else None for d in frame["direction"].tolist()]
    return sorted((*r, d) for r, d in zip(rows, directions))


@pytest.mark.parametrize("case", ["profiler_steps", "forward_label", "tail_loading"])
def test_the_store_gives_the_iteration_rule_the_inputs_the_trace_gives(case, tmp_path):
    """The iteration rule is one function (iterate.split_iterations, its cases in test_iterate.py); out of core,
    the store only reads its inputs: the default key node, the ranges a key node's label test or text matches
    (backward ones too, which the rule drops), the starts of every range and API call, the profile window."""
    from dlprof_profiler.engine import iterate
    from dlprof_profiler.engine.correlate import classify_trace, launch_links
    from dlprof_profiler.store.model import StoreAnalysis

    path, keys = _iteration_case(case, tmp_path)
    trace = sanitize_trace(read_nsys_export(path))
    info, _, family, _ = classify_trace(trace, None)
    _, thread_dev, process_dev = launch_links(trace)
    memory = iterate.whole_trace_inputs(trace, info, family, thread_dev, process_dev)
    store = TraceStore(path, tmp_path / "store")
    try:
        store.load()
        sa = StoreAnalysis(store)
        _, store_family, _ = sa.classify(None)
        store_threads, store_processes = sa.link_launches()
        stored = sa.iteration_inputs(sa.range_labels(), store_family, store_threads, store_processes)
        assert stored.default_key() == memory.default_key()
        assert (stored.profile_start, stored.profile_end) == (memory.profile_start, memory.profile_end)
        assert (stored.thread_device, stored.process_device) == (memory.thread_device, memory.process_device)
        for key in keys:
            want = iterate.NUMBER_SUFFIX.sub("", key)
            for label_test, text in ((lambda labels: labels == key, key), (lambda labels: labels == want, None)):
                expected = _matches(memory.ranges_where(label_test, text))
                assert _matches(stored.ranges_where(label_test, text)) == expected, key
        assert sorted(np.concatenate(list(stored.event_starts())).tolist()) == sorted(
            np.concatenate(list(memory.event_starts())).tolist()
        )
    finally:
        store.close()


@pytest.mark.slow
@pytest.mark.parametrize("case", ["profiler_steps_range", "forward_op_name"])
def test_out_of_core_iteration_ranges_and_key_ops_equal_the_in_memory_ones(case, tmp_path):
    """What the store adds to the iteration rule's inputs, in a whole analysis, any split: an iteration range
    of steps (the aggregation window), a key node given as an op name (the store's op instances)."""
    from tests import test_iterate

    if case == "profiler_steps_range":
        path = test_iterate.profiler_steps_profile(tmp_path / "steps.sqlite")
        config = AnalysisConfig(iter_start=1, iter_stop=2)
    else:
        path, config = profiles.training_profile(tmp_path / "t.sqlite"), AnalysisConfig(key_node="/aten::conv2d")
    _assert_same_analysis(path, config, (10**9, 7), tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["training", "nvfuser_h200_nsys2025.1.sqlite"])
def test_iteration_report_rows_are_ordered_alike_in_memory_and_by_duckdb(name, named, tmp_path, monkeypatch):
    """The iteration report's launch rows are ordered part by part in memory; an iteration of more rows than
    REPORT_SORT_ROWS (the whole profile, when it has no key node) is ordered by DuckDB instead: the same rows
    in the same order either way (the in-memory order is compared with the in-memory engine's byte for byte
    by the report tests above)."""

    from dlprof_profiler.store import model as store_model

    store = TraceStore(_path(name, named), tmp_path / "store")
    try:
        store.load()
        result = analyze_store(store, AnalysisConfig(), events_per_segment=25 if name in named else 2000)
        dm, agg = result.corr.domains[result.primary], result.aggregations[result.primary]
        assert len(agg.launch_spill.parts.parts) > 1  # spilled in several parts

        def rows():
            chunks = list(agg.launch_spill.report_chunks(dm.ops, 64))
            return {c: np.concatenate([np.asarray(chunk[c]) for chunk in chunks]) for c in chunks[0]}

        in_memory = rows()
        monkeypatch.setattr(store_model, "REPORT_SORT_ROWS", 1)
        by_duckdb = rows()
    finally:
        store.close()
    assert in_memory["iteration"].size > 0
    assert set(in_memory) == set(by_duckdb)
    for column, values in in_memory.items():
        assert values.tolist() == by_duckdb[column].tolist(), column


@pytest.mark.slow
def test_segments_are_cut_where_the_plan_says(training, tmp_path):
    """A small budget really splits the work (so the equality above is not trivially one segment)."""
    from dlprof_profiler.store.model import StoreAnalysis

    store = TraceStore(FIXTURES / "pytorch_2gpu_nccl_nsys2026.2_before.sqlite", tmp_path / "s")
    try:
        store.load()
        sa = StoreAnalysis(store)
        sa.classify(None)
        sa.link_launches()
        cuts = sa.plan_cuts([], 2000)
        total = sum(store.counts.values())
        assert len(cuts) >= total // 4000
        sizes = [len(seg.ranges) + len(seg.api) + len(seg.gpu) for seg in sa.segments(cuts)]
        assert sum(sizes) >= total and max(sizes) < 6000
    finally:
        store.close()


@pytest.mark.slow
def test_staging_does_not_depend_on_the_exports_row_order(tmp_path, monkeypatch):
    """An export whose API calls and kernels are stored out of time order (a shuffled copy), staged in parts of
    a few hundred rows: the same frames as the in-memory ingest of that file, and every GPU activity linked to
    the launch correlate.link_gpu_to_api finds."""
    import shutil
    import sqlite3

    from dlprof_profiler.store import trace_store as store_module
    from dlprof_profiler.engine.correlate import link_gpu_to_api

    path = tmp_path / "shuffled.sqlite"
    shutil.copy(FIXTURES / "pytorch_2gpu_nccl_nsys2026.2_before.sqlite", path)
    con = sqlite3.connect(path)
    for table in ("CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_KERNEL"):
        con.execute(f"CREATE TABLE shuffled AS SELECT * FROM {table} ORDER BY random()")
        con.execute(f"DROP TABLE {table}")
        con.execute(f"ALTER TABLE shuffled RENAME TO {table}")
    con.commit()
    starts = [r[0] for r in con.execute("SELECT start FROM CUPTI_ACTIVITY_KIND_RUNTIME ORDER BY rowid")]
    con.close()
    assert starts != sorted(starts)
    monkeypatch.setattr(store_module, "STAGE_ROWS", 500)
    expected = sanitize_trace(read_nsys_export(path))
    store = TraceStore(path, tmp_path / "store")
    try:
        store.load()
        store.wait_staged()
        assert len(store.api.parts) > 5 and len(store.gpu.parts) > 5
        staged = store.whole_trace()
        _assert_same_frames(expected, staged, ("ranges", "api_calls", "gpu"))
        linked = store.frame("SELECT activity_id, api_id FROM gpu_by_launch ORDER BY activity_id")
    finally:
        store.close()
    launches = link_gpu_to_api(expected)
    assert (launches >= 0).sum() > 1000  # real launches were linked
    assert linked["activity_id"].tolist() == list(range(len(expected.gpu)))
    assert linked["api_id"].tolist() == np.where(launches >= 0, launches, -1).tolist()


VOLATILE = {"aggregations": ("created_utc", "elapsed_seconds")}  # and profile_info's created_utc row


def _database_content(path):
    """Every view (names joined as text, as schema 2.0 read) and every table without string ids, rows sorted;
    the moment and duration of the run left out."""
    import sqlite3

    con = sqlite3.connect(path)
    try:
        objects = con.execute("SELECT name, type FROM sqlite_master WHERE type IN ('table', 'view')").fetchall()
        content = {}
        for name, kind in objects:
            columns = [r[1] for r in con.execute(f"PRAGMA table_info('{name}')")]
            if kind == "table" and (
                name == "strings"
                or any(
                    c.endswith("_id")
                    and c
                    not in (
                        "domain_id",
                        "device_id",
                        "range_id",
                        "api_id",
                        "activity_id",
                        "instance_id",
                        "correlation_id",
                        "stream_id",
                        "context_id",
                        "process_id",
                        "thread_id",
                        "source_id",
                        "call_id",
                        "op_id",
                        "graph_node_id",
                        "aggr_id",
                        "label_id",
                    )
                    for c in columns
                )
            ):
                continue  # holds string ids: compared through its view
            if (
                kind == "table"
                and name.startswith("raw_")
                and any(c in ("name_id", "text_id", "label_id") for c in columns)
            ):
                continue
            keep = [c for c in columns if c not in VOLATILE.get(name.removeprefix("view_"), ())]
            rows = con.execute(f"SELECT {', '.join(chr(34) + c + chr(34) for c in keep)} FROM '{name}'").fetchall()
            if name in ("profile_info", "rank_profile_info"):  # name/value rows: when the run was is volatile
                rows = [r for r in rows if "created_utc" not in r[:2]]
            content[name] = (keep, sorted(rows, key=repr))
        return content
    finally:
        con.close()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["training", "damaged", "backward_calls", "flops"] + FIXTURE_NAMES)
def test_out_of_core_run_writes_what_the_in_memory_run_writes(name, named, tmp_path):
    """`dlprof --out_of_core=on` and `=off` on the same export: every report byte for byte, the database's
    content (through its views where it holds string ids) and the op model dump."""
    import json

    path = _path(name, named)
    out = {mode: tmp_path / mode for mode in ("on", "off")}
    for mode, folder in out.items():
        run_dlprof(
            f"--database={path}",
            f"--out_of_core={mode}",
            "--reports=all",
            "--formats=csv,json",
            f"--output_path={folder}",
            "--dump_model_data=true",
        )
    reports = sorted(p.name for p in out["off"].glob("dlprof_*") if p.suffix in (".csv", ".json"))
    assert reports == sorted(p.name for p in out["on"].glob("dlprof_*") if p.suffix in (".csv", ".json"))
    assert "dlprof_summary.csv" in reports and ("dlprof_iteration.csv" in reports or name not in named)
    for report in reports:
        a, b = (out[m] / report for m in ("on", "off"))
        if report == "dlprof_model_data.json":
            doc_a, doc_b = json.loads(a.read_text()), json.loads(b.read_text())
            for domain in doc_b:
                assert doc_a[domain]["ops"] == doc_b[domain]["ops"]
                assert sorted(doc_a[domain]["instances"]["data"]) == sorted(doc_b[domain]["instances"]["data"])
            continue
        assert a.read_bytes() == b.read_bytes(), report
    on, off = (_database_content(out[m] / "dlprof_dldb.sqlite") for m in ("on", "off"))
    assert set(on) == set(off)
    for table in off:
        assert on[table] == off[table], table
    assert not any(p.name.startswith(".dlprof") for p in out["on"].iterdir())  # the store went with the staging


def test_the_string_pool_codes_values_as_a_factorization_of_them_would():
    """Rows are grouped by object before their values are looked up: equal values held by distinct objects get
    one code, missing ones (None, NaN) -1, and a value gets its code in order of first appearance over calls."""
    pool = StringPool()
    copy = "".join(["b", "x"])
    first = np.array(["bx", None, "a", copy, float("nan"), "a"], dtype=object)
    assert first[0] is not first[3]
    assert pool.encode(first).tolist() == [0, -1, 1, 0, -1, 1]
    assert pool.encode(np.full(4, None, dtype=object)).tolist() == [-1] * 4
    assert pool.encode(np.array(["c", "a", "c"], dtype=object)).tolist() == [2, 1, 2]
    assert pool.encode(np.zeros(0, dtype=object)).tolist() == []
    assert pool.encode(first[::-2]).tolist() == [1, 0, -1]  # (a strided view)
    assert pool.values == ["bx", "a", "c"]
    assert pool.decode(np.array([2, -1, 0, -5])).tolist() == ["c", None, "bx", None]
    for i in range(100):  # the decoding lookup grows with the pool
        assert pool.decode(pool.encode(np.array([f"v{i}", "a"], dtype=object))).tolist() == [f"v{i}", "a"]
    assert pool.decode(np.full(3, -1)).tolist() == [None] * 3


class _RecordingWriter:
    """What DatabaseFeed asks of the database writer, in order (the rows' generators are never read)."""

    def __init__(self):
        self.calls = []

    def add_domain_model(self, name, instances, owners):
        self.calls.append(("owners" if instances is None else "instances", name))

    def add_ops(self, name, ops):
        self.calls.append(("ops", name))

    def build_indexes(self, table=None):
        self.calls.append(("index", table))


def _fed_model(feed, sinks):
    pool = SimpleNamespace(array=lambda: [])
    feed.model(
        SimpleNamespace(
            domains={d: SimpleNamespace(sink=s, ops=None) for d, s in sinks.items()}, store=SimpleNamespace(pool=pool)
        )
    )


def test_the_owners_are_indexed_as_soon_as_the_last_segment_is_fed():
    """Out of core, the activity owners' indexes are queued once every segment's owners are, not when the op
    model is complete (the writer's thread builds them while the op tables are made), and only once."""
    sinks = {d: SimpleNamespace(a=SimpleNamespace(bounds=[(0, 10), (10, 20)])) for d in ("default", "NCCL")}
    writer = _RecordingWriter()
    feed = DatabaseFeed(writer, store=None)
    feed.owners(0, sinks)
    feed.owners(1, sinks)
    feed.join()  # what the feed did before any op model
    assert writer.calls == [("owners", "default"), ("owners", "NCCL")] * 2 + [("index", K.RAW_ACTIVITY_OWNERS)]
    # a segment left for the model (as when owners are not fed by segment): indexed after it, once
    writer = _RecordingWriter()
    feed = DatabaseFeed(writer, store=None)
    feed.owners(0, sinks)
    _fed_model(feed, sinks)
    feed.join()
    assert writer.calls == [("owners", "default"), ("owners", "NCCL"), ("owners", "default"), ("owners", "NCCL")] + [
        ("index", K.RAW_ACTIVITY_OWNERS),
        ("ops", "default"),
        ("instances", "default"),
        ("ops", "NCCL"),
        ("instances", "NCCL"),
        ("index", None),
    ]
