"""The DLProf database (schema 3.0): every raw fact round-trips, names go through the string table, rank 0,
the writer's segment API, re-aggregation in place keeping the earlier aggregations."""

import hashlib
import json
import sqlite3
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dlprof_profiler import DB_SCHEMA_VERSION, contract
from dlprof_profiler.db import writer as database
from dlprof_profiler.engine.correlate import INSTANCE_COLUMNS
from dlprof_profiler.db.load import load_model
from dlprof_profiler.errors import DLProfError
from dlprof_profiler.run.single import reaggregate_in_place
from tests import profiles
from tests.analysis import analyze
from tests.nsys_builder import NsysExport
from tests.profiles import run_dlprof
from tests.stored_ranges import as_schema_3_2, with_raw_ranges

PID, OTHER_PID = 100, 200
SHORT, LONG = "gemm_kernel", "void gemm_kernel<float, 128>(float const*, float*)"
OP_COLUMNS = [
    "op_index",
    "domain",
    "op_id",
    "name",
    "direction",
    "op_type",
    "label",
    "tc_eligible",
    "data_type",
    "stack_trace",
    "device_id",
    "first_start",
    "n_instances",
    "kind",
]
BAD_NAME = b"copy_\xff_kernel"  # invalid UTF-8 in the export: read as copy_\ufffd_kernel


@pytest.fixture
def db(tmp_path):
    export = profiles.training_profile(tmp_path / "t.sqlite")
    run_dlprof(f"--database={export}", "--reports=summary", f"--output_path={tmp_path / 'o'}")
    return tmp_path / "o" / "dlprof_dldb.sqlite"


def query(db, sql, params=()):
    con = sqlite3.connect(db)
    if "raw_ranges" in sql:
        with_raw_ranges(con)
    try:
        return con.execute(sql, params).fetchall()
    finally:
        con.close()


def mixed_profile(path):
    """Every kind of raw fact: PyTorch per-call fields in canonical and other forms, a named domain, an
    unclosed range, a thread without a name, a second process, a kernel with a demangled name, one without a
    launching call, one whose name is invalid UTF-8, a memcpy, a memset, a sync, OS I/O calls."""
    exp = NsysExport(schema="2024.6")
    exp.add_gpu(device_id=0, name="NVIDIA A100-SXM4-40GB", total_memory=42505273344, sm_count=108, compute=(8, 0))
    exp.system_env("CpuDescription", "Test CPU")
    exp.system_env("Hostname", "node7")
    main = exp.add_thread(pid=PID, tid=PID, name="python", process_name="python")
    worker = main + 2  # thread PID + 2: ranges and calls, but no ThreadNames row
    other = exp.add_thread(pid=OTHER_PID, tid=OTHER_PID, name="helper", process_name="helper")
    exp.add_domain(main, domain_id=5, name="MyDomain")
    exp.push_pop(main, 1_000, 9_000, "aten::conv2d, seq = 12, op_id = 345")
    exp.push_pop(main, 1_500, 8_000, "aten::convolution, op_id = 346")
    exp.launch(
        main,
        2_000,
        3_000,
        4_000,
        6_000,
        kernel=SHORT,
        demangled_name=LONG,
        grid=(4, 2, 1),
        block=(256, 1, 1),
        registers=64,
        static_smem=1024,
        dynamic_smem=2048,
    )
    exp.push_pop(main, 10_000, 12_000, "aten::relu, seq = 007, op_id = 1")  # not as Python writes ints
    exp.push_pop(main, 12_500, 13_000, "aten::mm, seq = 3, op_id = 4, sizes = [[2, 3], [3, 4]]")
    corr = exp.runtime(main, 12_600, 12_700, name="cudaMemcpyAsync_v3020")
    exp.memcpy(PID, corr, 12_800, 12_900, bytes=4096, copy_kind=2)
    exp.push_pop(worker, 14_000, 20_000, "ProfilerStep#1, op_id = 7")
    exp.start_end(main, 15_000, 30_000, "async range", domain_id=5)
    corr = exp.runtime(worker, 15_500, 15_600, name="cudaMemsetAsync_v3020")
    exp.memset(PID, corr, 15_700, 15_800, bytes=64)
    corr = exp.runtime(other, 21_000, 21_100, name="cudaLaunchKernel_v7000")
    exp.kernel(OTHER_PID, corr, 22_000, 23_000, BAD_NAME, device_id=0)
    exp.kernel(OTHER_PID, 999, 24_000, 25_000, "orphan_kernel")  # no API call with this correlation id
    corr = exp.runtime(main, 26_000, 27_000, name="cudaStreamSynchronize_v3020")
    exp.sync(PID, corr, 26_100, 26_900)
    exp.osrt(main, 27_500, 27_800, name="read")
    exp.osrt(worker, 28_000, 28_300, name="fwrite")
    exp.push_pop(main, 29_000, None, "never closed")
    exp.set_session(start_time=0, stop_time=40_000)
    return exp.write(path)


def _same_frame(ours: pd.DataFrame, theirs: pd.DataFrame, what: str) -> None:
    assert list(ours.columns) == list(theirs.columns), what
    assert len(ours) == len(theirs), what
    for c in ours.columns:
        a, b = ours[c], theirs[c]
        if (
            isinstance(a.dtype, pd.CategoricalDtype)
            or isinstance(b.dtype, pd.CategoricalDtype)
            or a.dtype == object
            or b.dtype == object
            or str(a.dtype) in ("str", "string")
        ):
            a = [None if pd.isna(v) else str(v) for v in a.astype(object)]
            b = [None if pd.isna(v) else str(v) for v in b.astype(object)]
            assert a == b, f"{what}.{c}"
        else:
            assert np.array_equal(a.to_numpy(), b.to_numpy()), f"{what}.{c}"


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    base = tmp_path_factory.mktemp("mixed")
    export = mixed_profile(base / "mixed.sqlite")
    run_dlprof(f"--database={export}", "--reports=summary", f"--output_path={base / 'o'}", "-v", "quiet")
    return export, base / "o" / "dlprof_dldb.sqlite"


@pytest.mark.slow
def test_every_raw_fact_round_trips(mixed):
    export, path = mixed
    fresh = analyze(export)
    trace, corr, _profile, domain_ids, offsets = database.load_model(path)
    for name in ("ranges", "api_calls", "gpu", "syncs", "io_calls", "devices"):
        _same_frame(getattr(trace, name), getattr(fresh.trace, name), name)
    assert len(trace.syncs) == 1 and len(trace.io_calls) == 2 and trace.ranges["unclosed"].sum() == 1
    assert trace.system == fresh.trace.system and trace.system["Hostname"] == "node7"
    assert {k: str(v) for k, v in trace.meta.items()} == {k: str(v) for k, v in fresh.trace.meta.items()}
    # the export's named processes and threads (the unnamed worker thread is kept for its rows only)
    assert sorted(trace.processes["name"]) == ["helper", "python"]
    assert sorted(trace.threads["name"]) == ["helper", "python"]
    assert np.array_equal(corr.gpu_api, fresh.corr.gpu_api)
    assert np.array_equal(corr.uses_tc, fresh.corr.uses_tc) and list(corr.tc_rule) == list(fresh.corr.tc_rule)
    assert corr.config == fresh.corr.config and corr.mode == fresh.corr.mode == "pytorch"
    assert set(corr.domains) == set(fresh.corr.domains) == {"default", "MyDomain"}
    for name, dm in fresh.corr.domains.items():
        loaded = corr.domains[name]
        _same_frame(loaded.instances[INSTANCE_COLUMNS], dm.instances[INSTANCE_COLUMNS], f"{name}.instances")
        _same_frame(loaded.ops[OP_COLUMNS], dm.ops[OP_COLUMNS], f"{name}.ops")
        assert np.array_equal(loaded.gpu_instance, dm.gpu_instance)
        assert (loaded.has_markers, loaded.n_ranges, loaded.family) == (dm.has_markers, dm.n_ranges, dm.family)
    assert domain_ids == {"default": 0, "MyDomain": 1}
    assert offsets == {"default": 0, "MyDomain": len(fresh.corr.domains["default"].ops)}


def test_names_are_stored_once_in_the_string_table(mixed):
    _, path = mixed
    values = [r[0] for r in query(path, "SELECT value FROM strings")]
    assert len(values) == len(set(values))
    kernels = dict(
        query(path, "SELECT s.value, count(*) FROM raw_gpu_activities g JOIN strings s ON s.id = g.name_id GROUP BY 1")
    )
    assert kernels == {
        SHORT: 1,
        "copy_\ufffd_kernel": 1,
        "orphan_kernel": 1,
        "[CUDA memcpy DtoH]": 1,
        "[CUDA memset]": 1,
    }
    # the long name is stored only where it differs from the name
    assert query(path, "SELECT s.value FROM raw_gpu_activities g JOIN strings s ON s.id = g.long_name_id") == [(LONG,)]
    assert query(
        path,
        "SELECT grid_x, grid_y, block_x, registers, static_smem, dynamic_smem FROM raw_gpu_activities "
        "WHERE long_name_id IS NOT NULL",
    ) == [(4, 2, 256, 64, 1024, 2048)]
    apis = [
        r[0]
        for r in query(path, "SELECT s.value FROM raw_api_calls c JOIN strings s ON s.id = c.name_id ORDER BY c.api_id")
    ]
    assert apis == [
        "cudaLaunchKernel_v7000",
        "cudaMemcpyAsync_v3020",
        "cudaMemsetAsync_v3020",
        "cudaLaunchKernel_v7000",
        "cudaStreamSynchronize_v3020",
    ]
    # the texts as recorded, PyTorch's per-call fields and all
    assert [t for (t,) in query(path, "SELECT text FROM raw_ranges ORDER BY start")] == [
        "aten::conv2d, seq = 12, op_id = 345",
        "aten::convolution, op_id = 346",
        "aten::relu, seq = 007, op_id = 1",
        "aten::mm, seq = 3, op_id = 4, sizes = [[2, 3], [3, 4]]",
        "ProfilerStep#1, op_id = 7",
        "async range",
        "never closed",
    ]
    # read back, the texts are whole again
    texts = load_model(path)[0].ranges.sort_values("start", kind="stable")["text"].tolist()
    assert texts[:2] == ["aten::conv2d, seq = 12, op_id = 345", "aten::convolution, op_id = 346"]
    threads = query(
        path,
        "SELECT t.global_tid, t.pid, t.tid, s.value FROM raw_threads t LEFT JOIN strings s "
        "ON s.id = t.name_id ORDER BY t.global_tid",
    )
    assert [t[1:] for t in threads] == [(PID, PID, "python"), (PID, PID + 2, None), (OTHER_PID, OTHER_PID, "helper")]


def test_everything_is_rank_zero(mixed):
    _, path = mixed
    tables = [r[0] for r in query(path, "SELECT name FROM sqlite_master WHERE type = 'table'")]
    with_rank = [t for t in tables if any(c[1] == "rank" for c in query(path, f'PRAGMA table_info("{t}")'))]
    assert set(with_rank) >= {
        contract.RAW_RANGE_BLOCKS,
        contract.RAW_API_CALLS,
        contract.RAW_GPU_ACTIVITIES,
        contract.RAW_OP_INSTANCES,
        contract.RAW_ACTIVITY_OWNERS,
        contract.RAW_OPS,
        contract.RAW_THREADS,
        contract.RAW_DOMAINS,
        contract.OP_NODES,
        contract.MODEL_SUMMARY,
        contract.ITERATION_LIST,
        contract.KERNEL_SUMMARIES,
        contract.GROUP_OPS,
        contract.EXPERT_SYSTEMS_FEEDBACK,
    }
    # every table but the database-wide ones (versions, profile, strings, aggregations headers) has a rank
    assert set(tables) - set(with_rank) == {"db_version", "profile_info", "strings", "aggregations"}
    for table in with_rank:
        assert query(path, f"SELECT DISTINCT rank FROM {table}") in ([(0,)], []), table
    assert query(path, "SELECT rank, source_file, host_name, nsys_version FROM ranks") == [
        (0, str(mixed[0].resolve()), "node7", "2024.6.2.25")
    ]
    # rank 0's database-wide keys are the engine's ids
    assert query(path, "SELECT min(activity_id), max(activity_id), count(*) FROM raw_gpu_activities") == [(0, 4, 5)]


@pytest.mark.slow
def test_schema_and_first_aggregation(db):
    assert query(db, "SELECT current_version FROM db_version") == [(DB_SCHEMA_VERSION,)] == [("3.4.0",)]
    assert query(db, "SELECT aggr_id, key_node, iter_start, iter_stop, total_iterations FROM aggregations") == [
        (1, "Optimizer.step#SGD.step", 0, 3, 4)
    ]
    assert query(db, "SELECT wall_time, iter_total FROM model_summary WHERE aggr_id = 1") == [(290_000, 4)]
    stored = query(db, "SELECT sum(rows) FROM raw_range_blocks")
    assert query(db, "SELECT count(*) FROM raw_ranges") == stored == [(36,)]
    assert query(db, "SELECT count(*) FROM read_only_gpu_activities") == [(21,)]
    top = query(
        db, "SELECT op_name, direction, gpu_total FROM view_op_nodes WHERE aggr_id = 1 ORDER BY gpu_total DESC LIMIT 1"
    )
    assert top == [("/aten::conv2d", "fprop", 30_000)]
    # 36 emit_nvtx texts, each with its own op_id
    assert query(db, "SELECT count(DISTINCT text), sum(text LIKE '%, op_id = %') FROM raw_ranges") == [(36, 36)]


@pytest.mark.slow
def test_viewer_indexes_only(db):
    indexes = {r[0] for r in query(db, "SELECT name FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL")}
    assert indexes == {
        "idx_instances_start",
        "idx_instances_op",
        "idx_owner_instance",
        "idx_owner_launch",
        "idx_op_nodes_gpu",
        "idx_kernel_summaries",
        "idx_group_ops",
        "idx_memory_events",  # the Memory view's curve of a device in a time window
        "idx_memory_ops",  # the Memory view's ops table of an aggregation
    }
    # the op index holds only instances with GPU work (the training profile's 36 ranges give 24 op instances,
    # 3 iterations x 7 of them with kernels or copies)
    assert query(db, "SELECT count(*) FROM raw_op_instances INDEXED BY idx_instances_op WHERE n_gpu > 0") == [(21,)]


@pytest.mark.slow
def test_a_3_2_database_gives_its_texts_whole_again(mixed, tmp_path):
    """Schema 3.0-3.2 stored a text's PyTorch call fields as integers apart from its shared part: reading such
    a file joins them back exactly, for the texts whose fields were not written as Python writes integers too."""
    _export, path = mixed
    old = tmp_path / "old.sqlite"
    old.write_bytes(path.read_bytes())
    con = sqlite3.connect(old)
    as_schema_3_2(con)
    assert con.execute("SELECT count(seq), count(op_id) FROM raw_ranges").fetchone() == (1, 3)  # the canonical ones
    con.close()
    assert database.load_model(old)[0].ranges["text"].tolist() == database.load_model(path)[0].ranges["text"].tolist()


def _segments(frame: pd.DataFrame, bounds) -> list[pd.DataFrame]:
    start = frame["start"].to_numpy()
    return [frame[(start >= lo) & (start < hi)] for lo, hi in zip(bounds[:-1], bounds[1:])]


def test_segments_write_the_same_database(tmp_path, mixed):
    """The segmented engine's calls: raw facts per time segment, op instances and owners per segment, ops
    at the end; the database reads back as the one written in one go."""
    export, whole = mixed
    a = analyze(export)
    trace, corr = a.trace, a.corr
    bounds = [0, 11_000, 22_000, 1 << 62]
    path = tmp_path / "segments.sqlite"
    ids = database.domain_ids_for(corr)
    writer = database.DatabaseWriter(path, database.Header.from_trace(trace, ids), queue_size=1)
    for seg in range(3):
        writer.add_raw(
            types.SimpleNamespace(
                **{
                    name: _segments(getattr(trace, name), bounds)[seg]
                    for name in ("ranges", "api_calls", "gpu", "syncs", "io_calls")
                }
            )
        )
    launch = database.launch_times(trace, corr.gpu_api)
    api_id = np.where(corr.gpu_api >= 0, corr.gpu_api, -1)
    for name, dm in corr.domains.items():
        owners = pd.DataFrame(
            {
                "activity_id": trace.gpu["activity_id"],
                "instance_id": dm.gpu_instance,
                "api_id": api_id,
                "launch_time": launch,
                "start": trace.gpu["start"],
            }
        )
        for inst, own in zip(_segments(dm.instances, bounds)[::-1], _segments(owners, bounds)):  # any order
            writer.add_domain_model(name, inst, own.drop(columns="start"))
    for name, dm in corr.domains.items():
        writer.add_ops(name, dm.ops)
    domains = {
        n: {"family": corr.family, "has_markers": dm.has_markers, "num_ranges": dm.n_ranges}
        for n, dm in corr.domains.items()
    }
    profile = dict(query(whole, "SELECT name, value FROM profile_info"))
    profile.pop("primary_domain")
    assert (
        writer.finish(
            profile, "default", domains, corr.config, corr.range_labels, database.kernel_tc_pairs(trace, corr)
        )
        == ids
    )
    t1, c1, p1, d1, _ = database.load_model(whole)
    t2, c2, p2, d2, _offsets = database.load_model(path)
    for name in ("ranges", "api_calls", "gpu", "syncs", "io_calls"):
        ours = getattr(t2, name).sort_values("start", kind="stable").reset_index(drop=True)
        theirs = getattr(t1, name).sort_values("start", kind="stable").reset_index(drop=True)
        _same_frame(ours, theirs, name)
    assert (p1, d1) == (p2, d2)
    for name, dm in c1.domains.items():
        _same_frame(c2.domains[name].instances, dm.instances, name)
        _same_frame(c2.domains[name].ops, dm.ops, name)
        assert np.array_equal(c2.domains[name].gpu_instance, dm.gpu_instance)
    values = [r[0] for r in query(path, "SELECT value FROM strings")]
    assert len(values) == len(set(values))


def test_op_model_is_queued_before_aggregation(mixed, monkeypatch):
    """The pipeline hands the op model to the writer as soon as correlation is done (`on_correlated`), so the
    writer's thread writes it while the analysis aggregates."""
    from dlprof_profiler.engine import analysis as engine
    from dlprof_profiler.ingest.formats import read_trace
    from dlprof_profiler.ingest.sanitize import sanitize_trace

    events = []
    real_aggregate = engine.aggregate
    monkeypatch.setattr(engine, "aggregate", lambda *a, **k: events.append("aggregate") or real_aggregate(*a, **k))
    trace = sanitize_trace(read_trace(mixed[0]))
    result = engine.analyze(trace, on_correlated=lambda corr: events.append(("model", list(corr.domains))))
    domains = list(result.corr.domains)
    assert domains == ["default", "MyDomain"]
    assert events == [("model", domains)] + ["aggregate"] * len(domains)


INDEXED_QUERIES = {
    "idx_instances_start": "SELECT count(*), sum(start) FROM raw_op_instances INDEXED BY idx_instances_start "
    "WHERE domain_id >= 0",
    "idx_instances_op": "SELECT count(*), sum(start) FROM raw_op_instances INDEXED BY idx_instances_op "
    "WHERE domain_id >= 0 AND n_gpu > 0",
    "idx_owner_instance": "SELECT count(*), sum(instance_id) FROM raw_activity_owners INDEXED BY idx_owner_instance "
    "WHERE instance_id >= 0",
    "idx_owner_launch": "SELECT count(*), sum(launch_time) FROM raw_activity_owners INDEXED BY idx_owner_launch "
    "WHERE domain_id >= 0",
}


def test_deferred_indexes_give_the_same_database(tmp_path, mixed):
    """Indexes built after the rows (the in-memory pipeline's writer) hold the same entries as indexes kept up
    to date row by row, including rows added after build_indexes."""
    a = analyze(mixed[0])
    results = []
    for deferred in (False, True):
        path = tmp_path / f"deferred_{deferred}.sqlite"
        writer = database.DatabaseWriter(
            path, database.Header.from_trace(a.trace, database.domain_ids_for(a.corr)), deferred_indexes=deferred
        )
        writer.add_raw(a.trace)
        first, *others = list(a.corr.domains)
        writer.add_ops(first, a.corr.domains[first].ops)
        writer.add_domain_model(
            first,
            a.corr.domains[first].instances,
            database._owner_chunks(a.trace, a.corr.gpu_api, a.corr.domains[first].gpu_instance),
        )
        writer.build_indexes()  # the other domains' rows come after the indexes exist
        database.finish_analysis(writer, a.trace, a.corr, "default", {"profile_end": a.trace.profile_end})
        assert others, "the mixed profile has a second domain"
        counts = {name: query(path, sql)[0] for name, sql in INDEXED_QUERIES.items()}
        plain = {
            name: query(path, sql.replace(f"INDEXED BY {name}", "NOT INDEXED"))[0]
            for name, sql in INDEXED_QUERIES.items()
        }
        assert counts == plain and all(c[0] > 0 for c in counts.values())
        results.append(
            (
                counts,
                {
                    t: query(path, f"SELECT * FROM {t} ORDER BY rowid")
                    for t in ("raw_op_instances", "raw_activity_owners", "raw_ranges", "raw_ops")
                },
            )
        )
    assert results[0] == results[1]


def test_writer_errors_reach_the_caller(tmp_path, mixed):
    with pytest.raises(DLProfError, match="could not write the database"):
        database.DatabaseWriter(tmp_path / "missing" / "x.sqlite", database.Header())
    writer = database.DatabaseWriter(tmp_path / "x.sqlite", database.Header(domain_ids={"default": 0}))
    writer.add_raw(types.SimpleNamespace(ranges=pd.DataFrame({"text": ["a"]})))  # no start column
    with pytest.raises(KeyError):
        writer.finish({}, "default")
    writer.wait()  # stopped: returns at once
    # a writer abandoned without finish stops without writing what is still queued
    writer = database.DatabaseWriter(tmp_path / "y.sqlite", database.Header(domain_ids={"default": 0}))
    writer.add_raw(analyze(mixed[0]).trace)
    writer.wait()
    assert query(tmp_path / "y.sqlite", "SELECT count(*) FROM db_version") == [(0,)]


@pytest.mark.slow
def test_reaggregation_appends_and_keeps_the_earlier_ones(db, tmp_path):
    aggr = reaggregate_in_place(db, iter_start=1, iter_stop=2)
    assert aggr == 2
    rows = query(db, "SELECT aggr_id, iter_start, iter_stop FROM aggregations ORDER BY aggr_id")
    assert rows == [(1, 0, 3), (2, 1, 2)]
    assert query(db, "SELECT wall_time FROM model_summary WHERE aggr_id = 1") == [(290_000,)]
    # iterations 1 and 2 of the training profile: [1,080,000, 1,280,000)
    assert query(db, "SELECT wall_time, rank FROM model_summary WHERE aggr_id = 2") == [(200_000, 0)]
    # the same numbers as a separate run of the engine on the original export for that range
    run_dlprof(
        f"--database={tmp_path / 't.sqlite'}",
        "--iter_start=1",
        "--iter_stop=2",
        "--reports=summary",
        "--formats=json",
        f"--output_path={tmp_path / 'sub'}",
    )
    doc = json.loads((tmp_path / "sub" / "dlprof_summary.json").read_text())
    wall = dict(doc["sections"][1]["rows"])["Wall Clock Time (ns)"]
    assert int(wall) == 200_000
    # a new key node
    aggr3 = reaggregate_in_place(db, key_node="aten::relu")
    assert query(db, "SELECT key_node, total_iterations FROM aggregations WHERE aggr_id = ?", (aggr3,)) == [
        ("aten::relu", 4)
    ]


def test_kernel_summaries_name_their_kernels_by_string_id(db, tmp_path):
    """Schema 3.4: kernel_summaries holds ids into `strings` (each text there once), in the run's aggregation and
    in one appended later; the names and launch counts are the export's."""
    columns = {r[1] for r in query(db, "PRAGMA table_info(kernel_summaries)")}
    assert {"name_id", "long_name_id"} <= columns and not {"kernel_name", "long_name"} & columns
    export = tmp_path / "t.sqlite"
    launches = dict(
        query(
            export,
            "SELECT s.value, count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName "
            "GROUP BY 1",
        )
    )
    aggr = reaggregate_in_place(db, iter_start=1, iter_stop=2)
    named = (
        "SELECT s.value, l.value, sum(k.num_calls) FROM kernel_summaries k JOIN strings s ON s.id = k.name_id "
        "JOIN strings l ON l.id = k.long_name_id WHERE k.aggr_id = ? GROUP BY 1, 2"
    )
    first = {name: (long, calls) for name, long, calls in query(db, named, (1,))}
    assert first == {name: (name, calls) for name, calls in launches.items()}  # no demangled names in the export
    later = {name: (long, calls) for name, long, calls in query(db, named, (aggr,))}
    assert set(later) == set(launches) and all(0 < calls < launches[name] for name, (_, calls) in later.items())
    values = [v for (v,) in query(db, "SELECT value FROM strings")]
    assert len(values) == len(set(values))
    # the compatibility view gives them as text, as schema 2.0 did
    assert sorted(
        query(db, "SELECT kernel_name, sum(num_calls) FROM view_kernel_summaries WHERE aggr_id = 1 GROUP BY 1")
    ) == sorted(launches.items())


def test_a_small_profile_gets_small_pages(db, tmp_path):
    """Every table and index takes a page at least: a small profile's database has 4 KiB pages (a fifth of an
    empty one's size), a large one (or one staged out of core, not counted) SQLite pages of 16 KiB."""
    assert database.page_size_for(0) == database.page_size_for(999_999) == 4096
    assert database.page_size_for(1_000_000) == database.page_size_for(None) == 16384
    assert query(db, "PRAGMA page_size") == [(4096,)]
    out = tmp_path / "staged"
    run_dlprof(f"--database={tmp_path / 't.sqlite'}", "--reports=summary", "--out_of_core=on", f"--output_path={out}")
    assert query(out / "dlprof_dldb.sqlite", "PRAGMA page_size") == [(16384,)]
    same = "SELECT wall_time, gpu_utilization FROM model_summary"
    assert query(out / "dlprof_dldb.sqlite", same) == query(db, same)


def test_appended_rows_find_or_add_their_strings():
    """A re-aggregation's texts get the ids `strings` already has, new ones the next free ids; None stays NULL."""
    con = sqlite3.connect(":memory:")
    con.execute("CREATE TABLE strings (id INTEGER PRIMARY KEY, value TEXT NOT NULL)")
    con.executemany("INSERT INTO strings VALUES (?, ?)", [(0, "a"), (1, "b"), (5, "b")])
    ids = database._Inserter(con, 0).string_ids(pd.Series(["b", None, "c", "a", "c", "d"], index=[9, 8, 7, 6, 5, 4]))
    assert ids.tolist() == [1, pd.NA, 6, 0, 6, 7] and ids.index.tolist() == [9, 8, 7, 6, 5, 4]
    assert con.execute("SELECT id, value FROM strings WHERE id > 5 ORDER BY id").fetchall() == [(6, "c"), (7, "d")]


@pytest.mark.slow
def test_failed_reaggregation_leaves_the_file_as_it_was(db):
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    with pytest.raises(DLProfError):
        reaggregate_in_place(db, iter_start=2, iter_stop=9)
    with pytest.raises(DLProfError):
        reaggregate_in_place(db, key_node="no such node")
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before


@pytest.mark.slow
def test_reaggregate_module_reports_json(db):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "dlprof_profiler.run.reaggregate",
            "--database",
            str(db),
            "--iter_start",
            "0",
            "--iter_stop",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0 and json.loads(proc.stdout) == {"status": "succeeded", "aggr_id": 2}
    proc = subprocess.run(
        [sys.executable, "-m", "dlprof_profiler.run.reaggregate", "--database", str(db), "--iter_start", "5"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    result = json.loads(proc.stdout)
    assert proc.returncode != 0 and result["status"] == "failed" and "outside the profile" in result["message"]


@pytest.mark.slow
def test_cli_reaggregation_copies_the_input_database(db, tmp_path):
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    run_dlprof(f"--database={db}", "--key_node=aten::relu", "--reports=summary", f"--output_path={tmp_path / 'r'}")
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before
    new = tmp_path / "r" / "dlprof_dldb.sqlite"
    assert query(new, "SELECT aggr_id, key_node FROM aggregations ORDER BY aggr_id") == [
        (1, "Optimizer.step#SGD.step"),
        (2, "aten::relu"),
    ]
    # its own folder updates the run (the expert systems' proposed command), never without --force
    proc = run_dlprof(f"--database={db}", f"--output_path={db.parent}", check=False)
    assert proc.returncode == 2 and "would replace the input: add --force=true" in proc.stderr
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before
    run_dlprof(f"--database={db}", f"--output_path={db.parent}", "--key_node=aten::relu", "-f", "true")
    assert query(db, "SELECT aggr_id, key_node FROM aggregations ORDER BY aggr_id") == [
        (1, "Optimizer.step#SGD.step"),
        (2, "aten::relu"),
    ]


@pytest.mark.slow
def test_event_file_is_readable_by_tensorboard(db):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = db.parent / "dlprof"
    acc = EventAccumulator(str(run_dir), size_guidance={"tensors": 0, "scalars": 0})
    acc.Reload()
    tags = acc.Tags()
    assert "dlprof/profile" in tags["tensors"]
    assert "dlprof/iteration_time_ms" in tags["tensors"] or "dlprof/iteration_time_ms" in tags["scalars"]
    event = acc.Tensors("dlprof/profile")[0]
    meta = json.loads(event.tensor_proto.string_val[0])
    assert meta["database"] == "../dlprof_dldb.sqlite" and meta["mode"] == "pytorch"
    assert acc.SummaryMetadata("dlprof/profile").data_class == 2  # DATA_CLASS_TENSOR: the data server keeps it
    times = (
        acc.Tensors("dlprof/iteration_time_ms")
        if "dlprof/iteration_time_ms" in tags["tensors"]
        else acc.Scalars("dlprof/iteration_time_ms")
    )
    assert len(times) == 4


def test_contract_codes_are_the_engines():
    from dlprof_profiler.engine import correlate
    from dlprof_profiler.outputs import event_files
    from dlprof_profiler.engine import trace
    from dlprof_profiler.experts import base

    assert (trace.KIND_KERNEL, trace.KIND_MEMCPY, trace.KIND_MEMSET) == (0, 1, 2)
    assert (
        correlate.RANGE_OP,
        correlate.SCOPE_OP,
        correlate.UNASSOCIATED_API,
        correlate.UNASSOCIATED_GPU,
        correlate.BACKWARD_PASS,
    ) == (
        contract.RANGE_OP,
        contract.SCOPE_OP,
        contract.UNASSOCIATED_API,
        contract.UNASSOCIATED_GPU,
        contract.BACKWARD_PASS,
    )
    assert base.SEVERITIES == contract.SEVERITIES
    assert event_files.PLUGIN_NAME == contract.PLUGIN_NAME == "dlprof"
    # the contract module imports nothing (the plugin loads it without the engine)
    source = Path(contract.__file__).read_text(encoding="utf-8")
    assert "\nimport " not in source and "\nfrom " not in source
