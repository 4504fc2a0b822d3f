"""The Memory view's routes (`memory`, `table/memory_ops`) over HTTP against a real TensorBoard process: the
hand-computed memory profile, a profile without memory events and a schema 3.0 database."""

from __future__ import annotations

import shutil
import sqlite3

import pytest

from dlprof_profiler import contract as K
from tests import test_plugin_checks as checks
from tests.profiles import BASE, ITERATION_SPAN, MIB, memory_profile, run_dlprof

pytestmark = pytest.mark.slow  # TensorBoard; test_plugin_routes.py has the fast checks


RUN = "plugin_memory/memory/dlprof"


@pytest.fixture(scope="module")
def built(tmp_path_factory, training_run):
    base = tmp_path_factory.mktemp("plugin_memory")
    root = base / "logdir"
    memory = memory_profile(base / "memory.sqlite")
    for name in ("memory", "old"):
        run_dlprof(f"--database={memory}", f"--output_path={root / name}", "--reports=summary", "-v", "quiet")
    shutil.copytree(training_run, root / "plain")
    # a database of schema 3.0, written before the memory tables
    con = sqlite3.connect(root / "old" / "dlprof_dldb.sqlite")
    con.execute("DROP VIEW read_only_memory_events")
    for table in (K.RAW_MEMORY_EVENTS, K.MEMORY_DEVICES, K.MEMORY_OPS):
        con.execute(f"DROP TABLE {table}")
    con.execute("UPDATE db_version SET current_version = '3.0.0', original_version = '3.0.0'")
    con.commit()
    con.close()
    return root


@pytest.fixture(scope="module")
def logdir(built, tensorboard):
    """The runs in the session's TensorBoard (as plugin_memory/<run>/dlprof): their folder there."""
    return tensorboard.publish("plugin_memory", built)


@pytest.fixture(scope="module")
def api(logdir, tensorboard):
    return checks.Api(tensorboard.url)


def _db(logdir, run="memory"):
    return logdir / run / "dlprof_dldb.sqlite"


def test_memory_route_gives_the_reports_figures_and_every_level(api, logdir):
    doc = api.get("memory", run=RUN)
    assert doc["recorded"] is True and doc["message"] is None
    devices = {d["device"]: d for d in doc["devices"]}
    assert list(devices) == ["CPU", "GPU 0", "GPU 1"]
    gpu = devices["GPU 0"]
    assert (gpu["peak_allocated"], gpu["peak_reserved"], gpu["allocated_at_end"], gpu["allocations"], gpu["frees"]) == (
        4096 + MIB,
        None,
        0,
        6,
        6,
    )
    assert [i["iteration"] for i in doc["iterations"]] == [0, 1, 2, 3] and all(
        i["aggregated"] for i in doc["iterations"]
    )
    series = {s["device"]: s for s in doc["series"]}
    # the whole profile: every event, after the level before the first one
    rows = checks.db_rows(
        _db(logdir),
        f"SELECT start, allocated FROM {K.RAW_MEMORY_EVENTS} WHERE device_type = 1 AND device_id = 0 ORDER BY start",
    )
    s = series["GPU 0"]
    assert s["events"] == 12 and s["t"][1:] == [r[0] for r in rows] and s["allocated"] == [0] + [r[1] for r in rows]
    assert s["t"][0] == doc["window"][0] == doc["extent"][0] and set(s["reserved"]) == {None}
    assert series["CPU"]["allocated"] == [0, 2048] and series["GPU 1"]["allocated"] == [0, 512, 1024, 1536]


def test_memory_route_window_starts_at_the_level_before_it(api):
    t = BASE + ITERATION_SPAN  # iteration 1's base: 4096 allocated since T+2000 (the previous step freed 1 MiB)
    doc = api.get("memory", run=RUN, t0=t + 3000, t1=t + 23000, width=800)
    s = {x["device"]: x for x in doc["series"]}["GPU 0"]
    assert s["t"] == [t + 3000, t + 6500, t + 22500] and s["allocated"] == [4096, 4096 + MIB, 4096]
    assert s["events"] == 2
    # thinned to the first, lowest, highest and last level per pixel: the peak stays
    one = {x["device"]: x for x in api.get("memory", run=RUN, width=1)["series"]}["GPU 0"]
    assert one["events"] == 12 and len(one["t"]) <= 1 + 4 and max(one["allocated"]) == 4096 + MIB
    assert one["allocated"][-1] == 0 and one["t"][1:] == sorted(one["t"][1:])


def test_memory_ops_table(api, logdir):
    doc, rows = api.table("memory_ops", run=RUN, limit=100)
    assert doc["total"] == 5 and [r["bytes_allocated"] for r in rows] == sorted(
        (r["bytes_allocated"] for r in rows), reverse=True
    )
    by_name = {(r["op_name"], r["device"]): r for r in rows}
    conv = by_name["/aten::conv2d", "GPU 0"]
    assert (conv["num_calls"], conv["allocations"], conv["bytes_allocated"], conv["peak_allocated"]) == (
        3,
        3,
        3 * MIB,
        4096 + MIB,
    )
    assert by_name["/aten::to", "CPU"]["bytes_allocated"] == 2048
    stored = checks.db_rows(_db(logdir), f"SELECT sum(allocations), sum(frees), sum(bytes_freed) FROM {K.MEMORY_OPS}")
    assert stored == [
        (sum(r["allocations"] for r in rows), sum(r["frees"] for r in rows), sum(r["bytes_freed"] for r in rows))
    ]


def test_device_names_in_sql_are_the_engines():
    con = sqlite3.connect(":memory:")
    for device_type, device_id in ((0, -1), (1, 0), (1, 7), (12, 3), (99, 2)):
        sql = K.device_label_sql(str(device_type), str(device_id))
        assert con.execute(f"SELECT {sql}").fetchone()[0] == K.device_label(device_type, device_id)


def test_without_memory_events_the_route_says_how_to_record_them(api):
    doc = api.get("memory", run="plugin_memory/plain/dlprof")
    assert doc["recorded"] is False and doc["series"] == [] and doc["devices"] == []
    assert "--detailed_mode" in doc["message"] and "profile_memory=True" in doc["message"]
    assert len(doc["iterations"]) == 4


def test_a_schema_3_0_database_says_it_predates_memory(api):
    doc = api.get("memory", run="plugin_memory/old/dlprof")
    assert doc["recorded"] is False and "schema older than 3.1" in doc["message"]
    assert "schema older than 3.1" in api.get("table/memory_ops", expect=404, run="plugin_memory/old/dlprof")["error"]


def test_bad_windows_are_refused(api):
    assert "t1 must be greater" in api.get("memory", expect=400, run=RUN, t0=10, t1=10)["error"]
    api.get("memory", expect=413, run=RUN, width=10**6)
    api.get("memory", expect=400, run=RUN, t0="x")
