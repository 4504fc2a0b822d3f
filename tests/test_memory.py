"""The memory report (memory.py, DESIGN.md "Memory"): hand-computed Kineto and nsys profiles, the real
resnet50 trace against direct sums over its JSON, the out-of-core engine against the in-memory one, the
database round trip, and the report's files."""

import csv
import gzip
import json
import re
import sqlite3
import sys

import numpy as np
import pandas as pd
import pytest

from dlprof_profiler.capture import nsys as capture
from dlprof_profiler.engine import memory
from dlprof_profiler.engine.analysis import AnalysisConfig, analyze_store
from dlprof_profiler.engine.analysis import analyze as engine_analyze
from dlprof_profiler.ingest.formats import read_trace
from dlprof_profiler.ingest.nsys import read_nsys_export
from dlprof_profiler.ingest.sanitize import sanitize_trace
from dlprof_profiler.options import RunOptions
from dlprof_profiler.store.trace_store import TraceStore
from tests import profiles
from tests.analysis import analyze
from tests.data import KINETO
from tests.kineto_builder import KinetoTrace
from tests.profiles import MIB, run_dlprof

RESNET = KINETO / "resnet50_v100_2021format.pt.trace.json.gz"
MAIN, BWD = 10, 11


def _devices(agg) -> dict:
    """{device label: row} of the Devices table."""
    return {r["device"]: r for r in agg.memory.devices.to_dict("records")}


def _ops(agg) -> dict:
    """{(op name, direction, device label): row} of the Ops table (names of CUDA API calls without nsys' `_vNNNN`
    version suffix, whether the op model keeps it or not)."""
    names = agg.ops.set_index("op_index")[["name", "direction"]]
    out = {}
    for r in agg.memory.ops.to_dict("records"):
        name = re.sub(r"_v\d{4}$", "", names.at[r["op_index"], "name"])
        key = (name, names.at[r["op_index"], "direction"], r["device"])
        assert key not in out
        out[key] = r
    return out


def _figures(row, *names):
    return tuple(None if pd.isna(row[n]) else int(row[n]) for n in names)


DEVICE_FIGURES = ("peak_allocated", "peak_reserved", "allocated_at_end", "allocations", "frees")
OP_FIGURES = ("allocations", "frees", "bytes_allocated", "bytes_freed", "peak_allocated")


# ---------------------------------------------------------------------------- levels


def test_levels_follow_total_allocated_or_the_running_sum_per_process():
    # process 1 records no totals (running sum from 0); process 2 records them (1000 allocated before its first
    # event): the device holds the sum of both
    f = memory.memory_frame(
        [10, 20, 30, 40, 50],
        [100, -50, 200, 30, -100],
        [1] * 5,
        [0] * 5,
        [1, 1, 2, 2, 1],
        total_allocated=[-1, -1, 1200, 1230, -1],
        total_reserved=[-1, -1, 2000, 2000, -1],
    )
    assert f["allocated"].tolist() == [1100, 1050, 1250, 1280, 1180]
    assert f["reserved"].tolist() == [-1] * 5  # process 1 records none: the device's is not known
    f = memory.memory_frame(
        [30, 10, 20],
        [200, 100, -50],
        [1, 1, 1],
        [0, 0, 0],
        [7, 7, 7],
        total_allocated=[650, 500, 450],
        total_reserved=[2000, 1000, 1000],
    )
    assert f["start"].tolist() == [10, 20, 30]  # time order
    assert f["allocated"].tolist() == [500, 450, 650]
    assert f["reserved"].tolist() == [1000, 1000, 2000]


# ---------------------------------------------------------------------------- nsys, hand computed


@pytest.fixture(scope="module")
def nsys_memory(tmp_path_factory):
    return profiles.memory_profile(tmp_path_factory.mktemp("memory") / "memory.sqlite")


def test_nsys_memory_report_hand_computed(nsys_memory):
    a = analyze(nsys_memory)
    assert a.iterations.count == 4  # three optimizer steps: the cudaFree after each falls in the next iteration
    agg = a.agg()
    devices = _devices(agg)
    assert list(devices) == ["CPU", "GPU 0", "GPU 1"]
    # GPU 0 per iteration: +4096, +1 MiB, -1 MiB, -4096 (from 0): peak 4096 + 1 MiB, nothing left at the end
    assert _figures(devices["GPU 0"], *DEVICE_FIGURES) == (4096 + MIB, None, 0, 6, 6)
    assert _figures(devices["GPU 1"], *DEVICE_FIGURES) == (1536, None, 1536, 3, 0)
    assert _figures(devices["CPU"], *DEVICE_FIGURES) == (2048, None, 2048, 1, 0)  # pinned host memory
    ops = _ops(agg)
    assert set(ops) == {
        ("/aten::empty", "fprop", "GPU 0"),
        ("/aten::conv2d", "fprop", "GPU 0"),
        ("/aten::to", "fprop", "CPU"),
        ("/Optimizer.step#SGD.step/aten::add_", "fprop", "GPU 0"),  # the innermost instance, not the scope
        ("unassociated_cudaFree", "", "GPU 0"),  # its event at T+36500 is attributed by its call's start
    }
    assert _figures(ops["/aten::empty", "fprop", "GPU 0"], *OP_FIGURES) == (3, 0, 3 * 4096, 0, 4096)
    assert _figures(ops["/aten::conv2d", "fprop", "GPU 0"], *OP_FIGURES) == (3, 0, 3 * MIB, 0, 4096 + MIB)
    assert _figures(ops["/aten::to", "fprop", "CPU"], *OP_FIGURES) == (1, 0, 2048, 0, 2048)
    add = ops["/Optimizer.step#SGD.step/aten::add_", "fprop", "GPU 0"]
    assert _figures(add, *OP_FIGURES) == (0, 3, 0, 3 * MIB, 4096 + MIB)  # the level its calls start at
    assert _figures(ops["unassociated_cudaFree", "", "GPU 0"], *OP_FIGURES) == (0, 3, 0, 3 * 4096, 4096)


@pytest.mark.slow
def test_nsys_memory_report_of_an_iteration_range(nsys_memory):
    agg = analyze(nsys_memory, iter_start=1, iter_stop=2).agg()
    devices = _devices(agg)
    # iterations 1-2: -4096 (iteration 0's cudaFree), +4096, +1 MiB, -1 MiB, twice; 4096 allocated before them
    assert _figures(devices["GPU 0"], *DEVICE_FIGURES) == (4096 + MIB, None, 4096, 4, 4)
    assert _figures(devices["GPU 1"], *DEVICE_FIGURES) == (1024, None, 1024, 2, 0)
    assert _figures(devices["CPU"], *DEVICE_FIGURES) == (2048, None, 2048, 0, 0)  # allocated in iteration 0
    ops = _ops(agg)
    assert ("/aten::to", "fprop", "CPU") not in ops
    assert _figures(ops["/aten::conv2d", "fprop", "GPU 0"], *OP_FIGURES) == (2, 0, 2 * MIB, 0, 4096 + MIB)
    assert _figures(ops["unassociated_cudaFree", "", "GPU 0"], *OP_FIGURES) == (0, 2, 0, 2 * 4096, 4096)


def test_nsys_memory_events_take_their_call_thread(nsys_memory):
    frame = read_nsys_export(nsys_memory).memory
    assert len(frame) == 3 * 5 + 1
    linked = frame["device_id"].to_numpy() != 1
    assert (frame["global_tid"].to_numpy()[linked] >= 0).all() and (frame["global_tid"].to_numpy()[~linked] == -1).all()
    free = frame[(frame["bytes"] == -4096)]
    assert (free["call_start"] == free["start"] - 1500).all()  # the cudaFree began before it returned


@pytest.mark.slow
def test_out_of_core_memory_tables_equal_the_in_memory_ones(nsys_memory, tmp_path):
    expected = engine_analyze(sanitize_trace(read_nsys_export(nsys_memory)), AnalysisConfig(iter_start=1, iter_stop=3))
    for events_per_segment in (10**9, 20, 7):
        store = TraceStore(nsys_memory, tmp_path / f"store{events_per_segment}")
        try:
            store.load()
            pd.testing.assert_frame_equal(store.whole_trace().memory, expected.trace.memory)
            result = analyze_store(
                store, AnalysisConfig(iter_start=1, iter_stop=3), events_per_segment=events_per_segment
            )
        finally:
            store.close()
        for domain, agg in expected.aggregations.items():
            mine, theirs = agg.memory, result.aggregations[domain].memory
            assert mine.recorded and theirs.recorded
            for table in ("devices", "ops"):
                pd.testing.assert_frame_equal(
                    getattr(mine, table), getattr(theirs, table), obj=f"{table} {events_per_segment}"
                )


# ---------------------------------------------------------------------------- Kineto, hand computed


def _kineto_profile(path, dialect="2.x"):
    """Two profiler steps; GPU events with Total Allocated/Reserved (4000 bytes allocated before the trace):

    t      thread  bytes   allocated  reserved  enclosed by
    1550   MAIN    +1000   5000       8000      aten::linear (step 1; aten::empty inside it folds into it)
    5000   MAIN    +100    5100       8000      aten::relu (starts at 5000: inside)
    5500   MAIN    +500    5600       8000      aten::relu
    6000   MAIN    -500    5100       8000      nothing (aten::relu ends at 6000)
    6500   BWD     +2000   7100       16000     AddmmBackward0 (bprop of linear)
    7000   MAIN    -1000   6100       16000     nothing
    11500  MAIN    +3000   9100       16000     aten::linear (step 2)
    12000  MAIN    -3000   6100       16000     aten::linear (step 2)
    25000  MAIN    -2000   4100       16000     nothing (after the last step)
    25500  MAIN    +64 on the CPU (64, reserved 0)  aten::zeros (after the last step)

    The two steps are the iterations (DESIGN.md "Iterations"): what runs after the last one, from 20000 on, is
    in none, and the aggregation's memory figures leave it out.
    """
    k = KinetoTrace(dialect=dialect)
    totals = dialect != "2021"
    k.annotation(MAIN, 0, 10000, "ProfilerStep#1")
    k.cpu_op(MAIN, 1000, 3000, "aten::linear", seq=1)
    k.cpu_op(MAIN, 1500, 100, "aten::empty")
    k.cpu_op(MAIN, 5000, 1000, "aten::relu", seq=2)
    k.cpu_op(BWD, 6000, 3000, "autograd::engine::evaluate_function: AddmmBackward0", seq=1)
    k.annotation(MAIN, 10000, 10000, "ProfilerStep#2")
    k.cpu_op(MAIN, 11000, 3000, "aten::linear", seq=3)
    k.cpu_op(MAIN, 25200, 800, "aten::zeros")
    events = [
        (MAIN, 1550, 1000, 5000, 8000),
        (MAIN, 5000, 100, 5100, 8000),
        (MAIN, 5500, 500, 5600, 8000),
        (MAIN, 6000, -500, 5100, 8000),
        (BWD, 6500, 2000, 7100, 16000),
        (MAIN, 7000, -1000, 6100, 16000),
        (MAIN, 11500, 3000, 9100, 16000),
        (MAIN, 12000, -3000, 6100, 16000),
        (MAIN, 25000, -2000, 4100, 16000),
    ]
    for tid, ts, nbytes, total, reserved in events:
        k.memory(tid, ts, nbytes, total if totals else None, reserved if totals else None, addr=0x7000 + ts)
    k.memory(MAIN, 25500, 64, 64 if totals else None, 0 if totals else None, device_type=0, device_id=-1)
    k.metadata({MAIN: "main", BWD: "autograd"})
    return k.write(path)


def test_kineto_memory_report_hand_computed(tmp_path):
    a = analyze(_kineto_profile(tmp_path / "mem.json"))
    assert a.iterations.count == 2
    agg = a.agg()
    devices = _devices(agg)
    # [0, 20000): five allocations and three frees, 6100 allocated when the last step ends
    assert _figures(devices["GPU 0"], *DEVICE_FIGURES) == (9100, 16000, 6100, 5, 3)
    assert _figures(devices["CPU"], *DEVICE_FIGURES) == (0, None, 0, 0, 0)
    ops = _ops(agg)
    assert set(ops) == {
        ("/ProfilerStep/aten::linear", "fprop", "GPU 0"),
        ("/ProfilerStep/aten::relu", "fprop", "GPU 0"),
        ("/ProfilerStep/aten::linear", "bprop", "GPU 0"),
    }
    # linear: +1000 in step 1 (level 4000 -> 5000); +3000 -3000 in step 2 (6100 -> 9100 -> 6100)
    assert _figures(ops["/ProfilerStep/aten::linear", "fprop", "GPU 0"], *OP_FIGURES) == (2, 1, 4000, 3000, 9100)
    assert _figures(ops["/ProfilerStep/aten::relu", "fprop", "GPU 0"], *OP_FIGURES) == (2, 0, 600, 0, 5600)
    # the backward call [6000, 9000): the device's peak counts the other thread's events too
    assert _figures(ops["/ProfilerStep/aten::linear", "bprop", "GPU 0"], *OP_FIGURES) == (1, 0, 2000, 0, 7100)
    # step 2 alone: 6100 allocated when it starts
    agg = analyze(_kineto_profile(tmp_path / "mem2.json"), iter_start=1, iter_stop=1).agg()
    devices = _devices(agg)
    assert _figures(devices["GPU 0"], *DEVICE_FIGURES) == (9100, 16000, 6100, 1, 1)
    assert _figures(devices["CPU"], *DEVICE_FIGURES) == (0, None, 0, 0, 0)
    assert list(_ops(agg)) == [("/ProfilerStep/aten::linear", "fprop", "GPU 0")]


def test_kineto_2021_memory_events_count_from_zero(tmp_path):
    agg = analyze(_kineto_profile(tmp_path / "mem.json", dialect="2021")).agg()
    devices = _devices(agg)
    # no totals: the running sum of Bytes from the start of the trace (1000, 1100, 1600, 1100, 3100, 2100, 5100,
    # 2100 inside the steps); nothing reserved is known
    assert _figures(devices["GPU 0"], *DEVICE_FIGURES) == (5100, None, 2100, 5, 3)
    assert _figures(devices["CPU"], *DEVICE_FIGURES) == (0, None, 0, 0, 0)


def test_memory_of_several_processes_on_one_device_adds_up(tmp_path):
    folder = tmp_path / "traces"
    folder.mkdir()
    for pid, events in ((1, [(100, 100, 1100), (300, -100, 1000)]), (2, [(200, 50, 550), (400, 50, 600)])):
        k = KinetoTrace(pid=pid)
        k.cpu_op(MAIN, 0, 500, "aten::empty")
        for ts, nbytes, total in events:
            k.memory(MAIN, ts, nbytes, total, 2048)
        k.write(folder / f"p{pid}.pt.trace.json")
    agg = analyze(folder).agg()
    # 1000 + 500 allocated before; then 1600, 1650, 1550, 1600; both processes reserve 2048
    assert _figures(_devices(agg)["GPU 0"], *DEVICE_FIGURES) == (1650, 4096, 1600, 3, 1)


# ---------------------------------------------------------------------------- the real resnet50 trace


def _innermost_ops(events: list, ops: list) -> list:
    """Per memory event, the outermost operator event on its thread enclosing its time (what the op model folds
    nested ops into), or None. Operators nest on a thread: the outermost ones are those no earlier one reaches
    past the start of."""
    import bisect

    outermost = {}
    for op in sorted(ops, key=lambda o: (int(o["tid"]), o["ts"], -o["dur"])):  # 2021 traces: the ops' tid is text
        tops = outermost.setdefault(int(op["tid"]), [])
        if not tops or op["ts"] >= tops[-1]["ts"] + tops[-1]["dur"]:
            tops.append(op)
    starts = {tid: [op["ts"] for op in tops] for tid, tops in outermost.items()}
    out = []
    for e in events:
        tid = int(e["tid"])
        k = bisect.bisect_right(starts.get(tid, []), e["ts"]) - 1
        op = outermost[tid][k] if k >= 0 else None
        out.append(op if op is not None and e["ts"] < op["ts"] + op["dur"] else None)
    return out


@pytest.mark.slow
def test_resnet50_memory_report_against_its_json():
    from decimal import Decimal

    doc = json.loads(gzip.open(RESNET).read(), parse_float=Decimal)  # times compared exactly, as dlprof reads them
    events = [e for e in doc["traceEvents"] if e.get("name") == "[memory]"]
    assert len(events) == 12838
    # the iterations are the ProfilerStep#N ranges (2021: `Operator` events): what lies outside them is in none
    steps = sorted(
        (e["ts"], e["ts"] + e["dur"])
        for e in doc["traceEvents"]
        if e.get("ph") == "X" and e.get("cat") == "Operator" and re.fullmatch(r"ProfilerStep#\d+", e["name"])
    )

    def in_step(ts) -> bool:
        return any(lo <= ts < hi for lo, hi in steps)

    agg = analyze(RESNET).agg()
    devices = _devices(agg)
    assert list(devices) == ["CPU", "GPU 0"]
    for label, device_type in (("CPU", 0), ("GPU 0", 1)):
        mine = sorted((e for e in events if e["args"]["Device Type"] == device_type), key=lambda e: e["ts"])
        level = np.cumsum([e["args"]["Bytes"] for e in mine])  # a 2021 trace: no Total Allocated, from 0
        inside = [k for k, e in enumerate(mine) if in_step(e["ts"])]
        nbytes = [mine[k]["args"]["Bytes"] for k in inside]
        before = int(level[inside[0] - 1]) if inside[0] > 0 else 0
        row = devices[label]
        assert row["allocations"] == sum(b > 0 for b in nbytes)
        assert row["frees"] == sum(b < 0 for b in nbytes)
        assert row["bytes_allocated"] == sum(b for b in nbytes if b > 0)
        assert row["bytes_freed"] == -sum(b for b in nbytes if b < 0)
        assert row["peak_allocated"] == max(before, int(level[inside].max()))
        assert row["allocated_at_end"] == int(level[inside[-1]])
        assert pd.isna(row["peak_reserved"])
    assert devices["GPU 0"]["peak_allocated"] == 2791636480
    # per op label: the events inside an operator (nested ones fold into the outermost) are its op's
    ops = [
        e
        for e in doc["traceEvents"]
        if e.get("cat") == "Operator" and e.get("ph") == "X" and not ("#" in e["name"] and "::" not in e["name"])
    ]
    owners = _innermost_ops(events, ops)
    expected = {}
    for e, op in zip(events, owners):
        if op is None or not in_step(op["ts"]):  # ops of the aggregated iterations: starting in a step
            continue
        key = (op["name"], "CPU" if e["args"]["Device Type"] == 0 else "GPU 0")
        counts = expected.setdefault(key, [0, 0, 0, 0])
        b = e["args"]["Bytes"]
        counts[0 if b > 0 else 1] += 1
        counts[2 if b > 0 else 3] += abs(b)
    labels = agg.ops.set_index("op_index")["label"]
    table = agg.memory.ops.assign(label=agg.memory.ops["op_index"].map(labels))
    got = table.groupby(["label", "device"])[["allocations", "frees", "bytes_allocated", "bytes_freed"]].sum()
    got = {k: list(map(int, v)) for k, v in zip(got.index, got.to_numpy())}
    # forward ops one by one; the autograd nodes of one forward call are one backward op (cross_entropy's
    # NllLossBackward and LogSoftmaxBackward, say), so those are compared as a whole
    forward = {k: v for k, v in expected.items() if k[0].startswith("aten::")}
    assert {k: got.get(k) for k in forward} == forward
    nodes = {k[0] for k in expected} - {k[0] for k in forward}
    for device in ("CPU", "GPU 0"):
        total = [sum(v[i] for k, v in expected.items() if k[0] in nodes and k[1] == device) for i in range(4)]
        assert [sum(v[i] for k, v in got.items() if k[0] in nodes and k[1] == device) for i in range(4)] == total
    # (the others: data loading, the optimizer, Python, and 6 in ops outside the steps)
    assert sum(v[0] + v[1] for v in expected.values()) == 5580


# ---------------------------------------------------------------------------- outputs


def _read_csv_sections(path) -> dict:
    sections, title, rows = {}, None, []
    for line in path.read_text().splitlines():
        if not line:
            continue
        if title is None or (line in ("Devices", "Ops")):
            if title is not None:
                sections[title] = rows
            title, rows = line, []
            continue
        rows.append(line)
    sections[title] = rows
    return {k: list(csv.reader(v)) for k, v in sections.items()}


@pytest.mark.slow
def test_memory_report_files_and_database_round_trip(nsys_memory, tmp_path):
    out = tmp_path / "out"
    run_dlprof(f"--database={nsys_memory}", "--reports=all", "--formats=csv,json", f"--output_path={out}")
    sections = _read_csv_sections(out / "dlprof_memory.csv")
    assert sections["Devices"][0] == [
        "Device",
        "Peak Allocated (bytes)",
        "Peak Reserved (bytes)",
        "Allocated at End (bytes)",
        "Allocations",
        "Frees",
    ]
    assert sections["Devices"][1:] == [
        ["CPU", "2048", "", "2048", "1", "0"],
        ["GPU 0", str(4096 + MIB), "", "0", "6", "6"],
        ["GPU 1", "1536", "", "1536", "3", "0"],
    ]
    assert sections["Ops"][0][:5] == ["Op ID", "Op Name", "Direction", "Device", "No. Calls"]
    assert [
        "CONV2D_1",
        "/aten::conv2d",
        "fprop",
        "GPU 0",
        "3",
        "3",
        "0",
        str(3 * MIB),
        "0",
        str(4096 + MIB),
    ] in sections["Ops"]
    doc = json.loads((out / "dlprof_memory.json").read_text())
    assert [s["title"] for s in doc["sections"]] == ["Devices", "Ops"]
    assert doc["sections"][0]["rows"][1] == ["GPU 0", 4096 + MIB, None, 0, 6, 6]
    con = sqlite3.connect(out / "dlprof_dldb.sqlite")
    try:
        assert con.execute("SELECT current_version FROM db_version").fetchone() == ("3.4.0",)
        assert con.execute("SELECT count(*), sum(bytes) FROM raw_memory_events").fetchone() == (16, 2048 + 3 * 512)
        assert con.execute(
            "SELECT peak_allocated, allocated_at_end, allocations, frees FROM memory_devices WHERE device_type = 1 "
            "AND device_id = 0"
        ).fetchall() == [(4096 + MIB, 0, 6, 6)]
        assert con.execute("SELECT count(*) FROM memory_ops").fetchone() == (5,)
    finally:
        con.close()
    # re-aggregating the database (no export any more) gives the same report
    again = tmp_path / "again"
    run_dlprof(f"--database={out / 'dlprof_dldb.sqlite'}", "--reports=memory", f"--output_path={again}")
    assert (again / "dlprof_memory.csv").read_bytes() == (out / "dlprof_memory.csv").read_bytes()


@pytest.mark.slow
def test_a_schema_3_0_database_without_memory_tables_is_still_read(nsys_memory, tmp_path):
    out = tmp_path / "out"
    run_dlprof(f"--database={nsys_memory}", "--reports=summary", f"--output_path={out}")
    db = out / "dlprof_dldb.sqlite"
    con = sqlite3.connect(db)
    for name in ("read_only_memory_events",):
        con.execute(f"DROP VIEW {name}")
    for name in ("raw_memory_events", "memory_devices", "memory_ops"):
        con.execute(f"DROP TABLE {name}")
    con.execute("UPDATE db_version SET current_version = '3.0.0', original_version = '3.0.0'")
    con.commit()
    con.close()
    again = tmp_path / "again"
    run_dlprof(f"--database={db}", "--reports=memory,summary", f"--output_path={again}")
    sections = _read_csv_sections(again / "dlprof_memory.csv")
    assert sections["Devices"][1][0].startswith("No memory events in this profile")
    assert sections["Ops"] == [sections["Ops"][0]]


@pytest.mark.slow
def test_a_profile_without_memory_events_says_so_in_one_row(tmp_path):
    export = profiles.training_profile(tmp_path / "training.sqlite")
    out = tmp_path / "out"
    run_dlprof(f"--database={export}", "--reports=memory", "--formats=csv,json", f"--output_path={out}")
    sections = _read_csv_sections(out / "dlprof_memory.csv")
    assert len(sections["Devices"]) == 2 and sections["Devices"][1][1:] == ["", "", "", "", ""]
    assert "--detailed_mode" in sections["Devices"][1][0] and "profile_memory=True" in sections["Devices"][1][0]
    doc = json.loads((out / "dlprof_memory.json").read_text())
    assert doc["sections"][0]["rows"] == [[memory.NO_EVENTS_TEXT, None, None, None, None, None]]
    assert doc["sections"][1]["rows"] == []


def test_detailed_mode_records_cuda_memory_usage():
    info = capture.NsysInfo(path="nsys", version="2022.4.2.1", options=frozenset({"trace", "cuda-memory-usage"}))
    args = RunOptions(command=("python", "train.py"), detailed_mode=True)
    assert "--cuda-memory-usage=true" in capture.build_nsys_command(args, info)
    assert "--cuda-memory-usage=true" not in capture.build_nsys_command(args.but(detailed_mode=False), info)
    args = args.but(nsys_opts="--cuda-memory-usage=false")  # the user's choice wins
    command = capture.build_nsys_command(args, info)
    assert "--cuda-memory-usage=true" not in command and "--cuda-memory-usage=false" in command
    old = capture.NsysInfo(path="nsys", version="2020.3", options=frozenset({"trace"}))  # no such option
    assert not any("cuda-memory-usage" in w for w in capture.build_nsys_command(args.but(nsys_opts=""), old))


@pytest.mark.slow
def test_out_of_core_run_writes_the_same_memory_report_and_tables(nsys_memory, tmp_path):
    outputs = {}
    for choice in ("off", "on"):
        out = tmp_path / choice
        run_dlprof(f"--database={nsys_memory}", "--reports=memory", f"--out_of_core={choice}", f"--output_path={out}")
        con = sqlite3.connect(out / "dlprof_dldb.sqlite")
        try:
            tables = {
                t: con.execute(f"SELECT * FROM {t} ORDER BY 1, 2, 3, 4, 5, 6").fetchall()
                for t in ("raw_memory_events", "memory_devices", "memory_ops")
            }
        finally:
            con.close()
        outputs[choice] = ((out / "dlprof_memory.csv").read_bytes(), tables)
    assert outputs["on"] == outputs["off"]
    assert len(outputs["on"][1]["raw_memory_events"]) == 16 and len(outputs["on"][1]["memory_ops"]) == 5


@pytest.mark.slow
def test_ranks_write_their_memory_reports_and_the_merged_database_keeps_every_ranks(nsys_memory, tmp_path):
    second = tmp_path / "r1.sqlite"
    second.write_bytes(nsys_memory.read_bytes())
    out = tmp_path / "out"
    run_dlprof(f"--database={nsys_memory},{second}", "--reports=memory", f"--output_path={out}", "--workers=1")
    reports = [(out / f"dlprof_memory_rank{r}.csv").read_text() for r in (0, 1)]
    assert reports[0] == reports[1] and "GPU 0,1052672,,0,6,6" in reports[0].replace('"', "")
    con = sqlite3.connect(out / "dlprof_dldb.sqlite")
    try:
        assert con.execute("SELECT rank, count(*) FROM raw_memory_events GROUP BY rank").fetchall() == [
            (0, 16),
            (1, 16),
        ]
        ops = con.execute(
            "SELECT m.rank, o.op_name, m.bytes_allocated FROM memory_ops m "
            "JOIN read_only_ops o ON o.op_index = m.op_index WHERE o.op_name = '/aten::conv2d' ORDER BY m.rank"
        ).fetchall()
        assert ops == [(0, "/aten::conv2d", 3 * MIB), (1, "/aten::conv2d", 3 * MIB)]
        assert con.execute(
            "SELECT count(*) FROM memory_ops m JOIN read_only_ops o USING (op_index) WHERE o.rank != m.rank"
        ).fetchone() == (0,)
    finally:
        con.close()


@pytest.mark.slow
def test_the_viewers_reaggregation_writes_the_memory_tables_of_its_range(nsys_memory, tmp_path):
    from dlprof_profiler.run.single import reaggregate_in_place

    out = tmp_path / "out"
    run_dlprof(f"--database={nsys_memory}", "--reports=summary", f"--output_path={out}")
    db = out / "dlprof_dldb.sqlite"
    aggr = reaggregate_in_place(db, iter_start=1, iter_stop=2)
    con = sqlite3.connect(db)
    try:
        rows = con.execute(
            "SELECT device_type, device_id, peak_allocated, allocated_at_end, allocations, frees FROM memory_devices "
            "WHERE aggr_id = ? ORDER BY device_type, device_id",
            (aggr,),
        ).fetchall()
    finally:
        con.close()
    # as test_nsys_memory_report_of_an_iteration_range computed them
    assert rows == [(0, -1, 2048, 2048, 0, 0), (1, 0, 4096 + MIB, 4096, 4, 4), (1, 1, 1024, 1024, 2, 0)]


@pytest.mark.slow
@pytest.mark.torch
def test_a_real_torch_profiler_capture_with_detailed_mode(tmp_path):
    pytest.importorskip("torch")
    from tests.test_capture_torch import dlprof, train_script

    proc = dlprof(
        tmp_path, "--detailed_mode=true", "--reports=memory", sys.executable, str(train_script(tmp_path)), "3", "0"
    )
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "out"
    doc = json.loads(gzip.open(out / "dlprof.pt.trace.json.gz").read())
    events = sorted((e for e in doc["traceEvents"] if e.get("name") == "[memory]"), key=lambda e: float(e["ts"]))
    assert events and {e["args"]["Device Type"] for e in events} == {0}  # a CPU run: host memory only
    totals = [e["args"]["Total Allocated"] for e in events]
    nbytes = [e["args"]["Bytes"] for e in events]
    sections = _read_csv_sections(out / "dlprof_memory.csv")
    assert sections["Devices"][1:] == [
        [
            "CPU",
            str(max([totals[0] - nbytes[0]] + totals)),  # every iteration: from before the first event
            str(max(e["args"]["Total Reserved"] for e in events)),
            str(totals[-1]),
            str(sum(b > 0 for b in nbytes)),
            str(sum(b < 0 for b in nbytes)),
        ]
    ]
    assert len(sections["Ops"]) > 1  # the model's ops allocate


def test_damaged_memory_event_times_are_dropped_with_a_warning(tmp_path):
    k = KinetoTrace()
    k.cpu_op(MAIN, 1000, 3000, "aten::empty")
    k.memory(MAIN, 1500, 100, 100, 0)
    k.memory(MAIN, 2000 + 3 * 86_400 * 10**9, 50, 150, 0)  # three days later: a damaged ts
    trace = sanitize_trace(read_trace(k.write(tmp_path / "far.json")))
    assert trace.memory["bytes"].tolist() == [100]
    assert any("1 memory events were dropped" in w for w in trace.warnings)
    # nsys: an event without a time cannot be placed
    export = profiles.memory_profile(tmp_path / "m.sqlite", iterations=1)
    con = sqlite3.connect(export)
    rows = con.execute("SELECT * FROM CUDA_GPU_MEMORY_USAGE_EVENTS").fetchall()
    columns = [r[1] for r in con.execute("PRAGMA table_info(CUDA_GPU_MEMORY_USAGE_EVENTS)")]
    con.execute("DROP TABLE CUDA_GPU_MEMORY_USAGE_EVENTS")
    con.execute(f"CREATE TABLE CUDA_GPU_MEMORY_USAGE_EVENTS ({', '.join(columns)})")  # no NOT NULL
    con.executemany(f"INSERT INTO CUDA_GPU_MEMORY_USAGE_EVENTS VALUES ({', '.join('?' * len(columns))})", rows)
    con.execute("UPDATE CUDA_GPU_MEMORY_USAGE_EVENTS SET start = NULL WHERE rowid = 2")
    con.commit()
    con.close()
    trace = read_nsys_export(export)
    assert len(trace.memory) == len(rows) - 1
    assert any("1 CUDA memory events without a time were dropped" in w for w in trace.warnings)
