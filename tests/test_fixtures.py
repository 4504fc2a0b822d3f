"""Every real export in tests/data/nsys is processed, and exact figures agree with direct SQL over
the file (an independent computation)."""

import shutil
import sqlite3

import numpy as np
import pandas as pd
import pytest

from dlprof_profiler.db import writer as database
from tests.analysis import analyze
from tests.profiles import run_dlprof
from tests import data

FIXTURES = data.NSYS
NAMES = sorted(p.name for p in FIXTURES.glob("*.sqlite"))


def sql(path, query):
    con = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    con.text_factory = lambda b: b.decode("utf-8", "replace")
    try:
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        return con.execute(query).fetchall(), tables
    finally:
        con.close()


def table_sum(path, table, expr="sum(end - start)", group=""):
    rows, tables = sql(path, "SELECT 1")
    if table not in tables:
        return {} if group else 0
    rows, _ = sql(
        path, f"SELECT {group + ', ' if group else ''}{expr} FROM {table} {'GROUP BY ' + group if group else ''}"
    )
    return {r[0]: r[1] for r in rows} if group else (rows[0][0] or 0)


@pytest.fixture(scope="module")
def fixture_copies(tmp_path_factory):
    """Read-only fixtures copied to a temporary folder before anything could touch them."""
    root = tmp_path_factory.mktemp("fixtures")
    for name in NAMES:
        shutil.copy(FIXTURES / name, root / name)
    return root


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_fixture_totals_match_direct_sql(fixture_copies, name):
    path = fixture_copies / name
    a = analyze(path)
    gpu = a.trace.gpu
    kernel_count = table_sum(path, "CUPTI_ACTIVITY_KIND_KERNEL", "count(*)")
    assert int((gpu["kind"] == 0).sum()) == kernel_count
    kernel_time = table_sum(path, "CUPTI_ACTIVITY_KIND_KERNEL")
    memory_time = table_sum(path, "CUPTI_ACTIVITY_KIND_MEMCPY") + table_sum(path, "CUPTI_ACTIVITY_KIND_MEMSET")
    for domain, agg in a.aggs.items():
        kernels = agg.summary["kernels"]
        assert kernels["tc"]["gpu_time"] + kernels["other"]["gpu_time"] == kernel_time, domain
        assert kernels["memory"]["gpu_time"] == memory_time, domain
        assert kernels["all"]["gpu_time"] == kernel_time + memory_time, domain
        # every GPU activity is owned by exactly one op instance of every domain
        assert (a.domain(domain).gpu_instance >= 0).all()
        launches = agg.kernel_launches
        assert len(launches) == kernel_count and int(launches["gpu_duration"].sum()) == kernel_time
    per_device = table_sum(path, "CUPTI_ACTIVITY_KIND_KERNEL", group="deviceId")
    ours = gpu[gpu["kind"] == 0].assign(d=gpu["end"] - gpu["start"]).groupby("device_id")["d"].sum().to_dict()
    assert ours == per_device
    api_count = table_sum(path, "CUPTI_ACTIVITY_KIND_RUNTIME", "count(*)")
    assert len(a.trace.api_calls) == api_count
    ranges = table_sum(path, "NVTX_EVENTS", "sum(eventType IN (59, 60, 70, 71))")
    assert len(a.trace.ranges) == ranges


def test_utilization_averages_the_gpus_used(fixture_copies):
    """8 GPUs listed, work on GPU 0 only: the figures are GPU 0's (averaging over the machine's 8 GPUs would
    show an eighth of it); the 7 others are listed as idle."""
    a = analyze(fixture_copies / "nvfuser_8xh100_nsys2024.6.sqlite")
    s = a.agg().summary
    assert (s["n_visible_gpus"], s["n_listed_gpus"]) == (1, 8) and len(a.trace.devices) == 8
    devices = a.agg().devices.set_index("device_id")
    assert devices["used"].tolist() == [True] + [False] * 7
    assert devices.loc[0, "gpu_utilization"] > 0 and devices.loc[1:, "gpu_utilization"].eq(0).all()
    assert devices.loc[1:, "other_pct"].eq(100.0).all()
    assert s["gpu_utilization"] == pytest.approx(devices.loc[0, "gpu_utilization"])
    busy = merged_busy(a.trace.gpu)  # independent: union of GPU 0's activities over the window
    assert s["gpu_utilization"] == pytest.approx(100.0 * busy / s["wall_time"])


def merged_busy(gpu) -> int:
    """Flattened GPU time of the activities (they all ran on one device here), by a plain sweep."""
    total, reach = 0, None
    for start, end in sorted(zip(gpu["start"].tolist(), gpu["end"].tolist())):
        if reach is None or start > reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total


@pytest.mark.slow
def test_pytorch_fixture_multi_gpu_and_domains(fixture_copies):
    a = analyze(fixture_copies / "pytorch_2gpu_nccl_nsys2026.2_before.sqlite")
    assert a.corr.mode == "pytorch" and set(a.corr.domains) == {"default", "domain1"}
    assert a.agg().summary["n_visible_gpus"] == 2
    names = a.op_names()
    assert "/aten::linear" in names and "/aten::layer_norm" in names
    assert a.op("/aten::linear", "fprop")["op_type"] == "linear"
    # the emit_nvtx text was parsed: no op name carries seq/op_id fields
    assert not any(", op_id = " in n for n in names)


def test_bad_utf8_export_is_read(fixture_copies):
    a = analyze(fixture_copies / "no_cuda_tables_bad_utf8_nsys2021.3.sqlite")
    assert any("\ufffd" in str(v) for v in a.trace.system.values())
    assert a.corr.mode == "simple" and len(a.trace.gpu) == 0


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_cli_writes_every_report_and_the_database_reloads_identically(fixture_copies, tmp_path, name):
    path = fixture_copies / name
    out = tmp_path / "out"
    run_dlprof(f"--database={path}", "--reports=all", "--formats=csv,json", f"--output_path={out}", "-v", "quiet")
    assert (out / "dlprof_summary.csv").is_file() and (out / "dlprof_summary.json").is_file()
    trace, corr, profile, domain_ids, offsets = database.load_model(out / "dlprof_dldb.sqlite")
    fresh = analyze(path)
    pd.testing.assert_frame_equal(
        trace.gpu.drop(columns=["name", "long_name"]), fresh.trace.gpu.drop(columns=["name", "long_name"])
    )
    assert trace.gpu["name"].astype(str).tolist() == fresh.trace.gpu["name"].astype(str).tolist()
    pd.testing.assert_frame_equal(trace.api_calls.drop(columns=["name"]), fresh.trace.api_calls.drop(columns=["name"]))
    assert trace.api_calls["name"].astype(str).tolist() == fresh.trace.api_calls["name"].astype(str).tolist()
    ours = trace.ranges.sort_values("range_id").reset_index(drop=True)
    theirs = fresh.trace.ranges.sort_values("range_id").reset_index(drop=True)
    for column in ("range_id", "start", "end", "global_tid", "pid", "unclosed"):
        assert (ours[column].to_numpy() == theirs[column].to_numpy()).all(), column
    assert ours["text"].astype(str).tolist() == theirs["text"].astype(str).tolist()
    assert ours["domain"].astype(str).tolist() == theirs["domain"].astype(str).tolist()
    assert np.array_equal(corr.gpu_api, fresh.corr.gpu_api) and np.array_equal(corr.uses_tc, fresh.corr.uses_tc)
    for domain, dm in fresh.corr.domains.items():
        loaded = corr.domains[domain]
        for column in (
            "op_index",
            "kind",
            "start",
            "end",
            "pid",
            "global_tid",
            "device_id",
            "cpu_time",
            "cpu_overhead",
            "gpu_time",
            "gpu_idle",
            "n_kernels",
        ):
            assert (loaded.instances[column].to_numpy() == dm.instances[column].to_numpy()).all(), column
        assert loaded.ops["name"].tolist() == dm.ops["name"].tolist()
        assert loaded.ops["op_id"].tolist() == dm.ops["op_id"].tolist()
        assert np.array_equal(loaded.gpu_instance, dm.gpu_instance)
