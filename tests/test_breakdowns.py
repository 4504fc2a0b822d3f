"""GPU time breakdowns (engine/breakdowns.py; DESIGN.md "GPU time breakdowns"): hand-computed cases built
with the nsys builder, and direct sums over a real DDP trace's JSON."""

from __future__ import annotations

import gzip
import json
import re
from decimal import Decimal

import numpy as np
import pytest

from dlprof_profiler.engine.breakdowns import LaunchDelays
from tests.analysis import analyze
from tests.nsys_builder import NsysExport
from tests.test_ranks import _union  # plain Python union length: an independent reference
from tests.data import KINETO

NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL"


def _two_streams(path):
    """GPU 0, window [0, 7000) (the range `outer`):

    stream 7   gemm [1000, 2000) launched at 100; relu [2500, 2800) launched at 500 (call 400 ns: short);
               gemm [5000, 5200) launched at 4500
    stream 8   NCCL all-reduce [1500, 3000) launched at 300
    stream 9   memcpy [3500, 4000), its cudaMemcpyAsync at 3200
    stream 10  a kernel [6000, 6100) no launch call correlates with
    """
    exp = NsysExport()
    exp.add_gpu(device_id=0)
    t = exp.add_thread(pid=1, tid=1, name="python", process_name="python")
    exp.launch(t, 100, 200, 1000, 2000, kernel="gemm", stream_id=7)
    exp.launch(t, 300, 400, 1500, 3000, kernel=NCCL, stream_id=8)
    exp.launch(t, 500, 900, 2500, 2800, kernel="relu", stream_id=7)
    copy = exp.runtime(t, 3200, 3300, name="cudaMemcpyAsync_v3020")
    exp.memcpy(1, copy, 3500, 4000, bytes=1 << 20, stream_id=9)
    exp.launch(t, 4500, 4600, 5000, 5200, kernel="gemm", stream_id=7)
    exp.kernel(1, 9999, 6000, 6100, "orphan", stream_id=10)
    exp.push_pop(t, 0, 7000, "outer")
    return exp.write(path)


@pytest.fixture(scope="module")
def two_streams(tmp_path_factory):
    return analyze(_two_streams(tmp_path_factory.mktemp("b") / "b.sqlite")).agg()


def test_busy_split_and_overlapped_communication(two_streams):
    agg = two_streams
    assert (agg.window_start, agg.window_end) == (0, 7000)
    gpu = agg.devices.set_index("device_id").loc[0]
    # computation: gemm 1000 + relu 300 + gemm 200 + orphan 100; communication: [1500, 3000); memory: the copy
    assert (gpu["computation_busy"], gpu["communication_busy"], gpu["memory_busy"]) == (1600, 1500, 500)
    # any activity: [1000, 3000) + [3500, 4000) + [5000, 5200) + [6000, 6100)
    assert (gpu["gpu_busy"], gpu["gpu_idle_time"]) == (2800, 4200)
    # the all-reduce overlaps gemm [1500, 2000) and relu [2500, 2800)
    assert gpu["overlapped_communication_busy"] == 800
    s = agg.summary
    assert (s["communication_time"], s["overlapped_communication_time"]) == (1500, 800)


def test_idle_split_per_gpu(two_streams):
    row = two_streams.gpu_breakdowns["gpus"].set_index("device_id").loc[0]
    # [0, 1000) launch at 100: 100 host + 900 kernel; [3000, 3500) copy call at 3200: 200 + 300;
    # [4000, 5000) launch at 4500: 500 + 500; [5200, 6000) closed by the orphan: other; [6100, 7000): other
    assert (row["host_wait"], row["kernel_wait"], row["other_wait"]) == (800, 1700, 800 + 900)


def test_idle_split_per_stream(two_streams):
    st = two_streams.gpu_breakdowns["streams"].set_index("stream_id")
    got = {
        int(k): tuple(int(v) for v in r) for k, r in st[["busy", "host_wait", "kernel_wait", "other_wait"]].iterrows()
    }
    assert got == {
        # [0,1000): 100 + 900; [2000,2500) relu launched at 500 already: 500 kernel; [2800,5000): 1700 + 500;
        # [5200, 7000) other
        7: (1500, 100 + 1700, 900 + 500 + 500, 1800),
        8: (1500, 300, 1200, 4000),
        9: (500, 3200, 300, 3000),
        10: (100, 0, 0, 6900),
    }
    assert (st["busy"] + st["idle"] == 7000).all()


def test_launch_delay_per_kernel_name(two_streams):
    ld = two_streams.gpu_breakdowns["launches"].set_index("name")
    # gemm: 1000 - 100 and 5000 - 4500; p95 interpolated between them as numpy does
    assert ld.loc["gemm", ["launches", "mean", "p50", "p95"]].tolist() == [2, 700, 700, 500 + 0.95 * 400]
    assert ld.loc[NCCL, ["launches", "mean", "short_kernels"]].tolist() == [1, 1200, 0]
    # relu ran 300 ns, its launch call took 400 ns: a short kernel; the orphan has no launch, the copy is no kernel
    assert ld.loc["relu", ["launches", "p50", "short_kernels"]].tolist() == [1, 2000, 1]
    assert set(ld.index) == {"gemm", NCCL, "relu"}
    assert (two_streams.gpu_breakdowns["short_kernels"], two_streams.gpu_breakdowns["launches_total"]) == (1, 4)


def test_per_iteration_split_sums_to_the_iteration(tmp_path):
    """Two iterations bounded by the key node: each iteration's busy and idle time is its own."""
    exp = NsysExport()
    exp.add_gpu(device_id=0)
    t = exp.add_thread(pid=1, tid=1, name="python", process_name="python")
    for i, base in enumerate((0, 10_000)):
        exp.push_pop(t, base, base + 10_000, f"step{i}")
        exp.launch(t, base + 100, base + 200, base + 1000, base + 3000, kernel="gemm")
        exp.launch(t, base + 300, base + 400, base + 2000, base + 2500 + 1000 * i, kernel=NCCL, stream_id=8)
        exp.push_pop(t, base + 9000, base + 9500, "Optimizer.step#SGD.step")
    agg = analyze(exp.write(tmp_path / "it.sqlite"), key_node="Optimizer.step#SGD.step").agg()
    it = agg.iterations.set_index("iteration")
    a0 = it.loc[it.index[it["computation_busy"] > 0]]
    assert len(a0) >= 2
    for _, row in a0.iterrows():
        assert row["gpu_idle_time"] + row["gpu_busy"] == row["duration"]
    # the all-reduce of the second one runs 500 ns past the gemm: 1000 overlapped of 1500
    assert sorted(a0["communication_busy"].tolist()) == [500, 1500]
    assert sorted(a0["overlapped_communication_busy"].tolist()) == [500, 1000]


@pytest.mark.parametrize("chunks", [1, 3, 7])
def test_launch_delays_match_numpy_however_chunked(chunks):
    """Per kernel name: launches, mean, p50 and p95 as numpy computes them over all its delays, and the short
    kernels, whatever chunks the launches arrive in (each name's delays spread over several)."""
    rng = np.random.default_rng(3)
    codes = rng.integers(0, 5, 400) * 7  # codes with gaps, one name (21) with no launch
    codes[codes == 21] = 14
    values = rng.integers(-50, 10_000, 400)  # a kernel may start before its launch call is timed to
    short = values < 100
    names = np.array([f"k{i}" for i in range(30)], dtype=object)
    delays = LaunchDelays()
    for part in np.array_split(np.arange(400), chunks):
        delays.add(codes[part], values[part], short[part])
    table = delays.table(names).set_index("name")
    assert sorted(table.index) == ["k0", "k14", "k28", "k7"]
    for code in (0, 7, 14, 28):
        row, mine = table.loc[f"k{code}"], values[codes == code]
        assert row["launches"] == mine.size
        assert row["mean"] == pytest.approx(mine.mean())
        assert row["p50"] == pytest.approx(np.percentile(mine, 50))
        assert row["p95"] == pytest.approx(np.percentile(mine, 95))
        assert row["short_kernels"] == int((mine < 100).sum())
    assert list(table["launches"]) == sorted(table["launches"], reverse=True)
    assert delays.totals() == (400, int(short.sum()))


def test_no_launch_delays_give_an_empty_table():
    delays = LaunchDelays()
    delays.add(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, bool))
    assert len(delays.table(np.array(["a"], dtype=object))) == 0 and delays.totals() == (0, 0)


def _us_ns(value) -> int:
    return int(Decimal(value) * 1000)


@pytest.mark.parametrize("name", ["pytorch_ddp_2gpu_nccl.json.gz", "pytorch_8xa100_rank3.json.gz"])
def test_ddp_trace_communication_against_its_json(name):
    """DDP ranks' traces (NCCL all-reduce kernels on their own stream): communication time and its overlap by
    compute kernels, the memory operations' busy time and the kernel launches, summed directly over the JSON in
    the steps."""
    path = KINETO / name
    doc = json.loads(gzip.open(path).read(), parse_float=Decimal)
    events = doc["traceEvents"]
    steps = [e for e in events if re.fullmatch(r"ProfilerStep#\d+", str(e.get("name"))) and e.get("ph") == "X"]
    lo = min(_us_ns(e["ts"]) for e in steps)
    hi = max(_us_ns(e["ts"]) + _us_ns(e["dur"]) for e in steps)

    def clipped(cat, pick=lambda e: True):
        out = []
        for e in events:
            if e.get("cat") == cat and pick(e):
                s, end = _us_ns(e["ts"]), _us_ns(e["ts"]) + _us_ns(e["dur"])
                if min(end, hi) > max(s, lo):
                    out.append((max(s, lo), min(end, hi)))
        return out

    comm_re = re.compile(r"nccl", re.IGNORECASE)
    comm = clipped("kernel", lambda e: bool(comm_re.search(e["name"])))
    compute = clipped("kernel", lambda e: not comm_re.search(e["name"]))
    memory = clipped("gpu_memcpy") + clipped("gpu_memset")
    communication = _union(comm)
    overlapped = communication + _union(compute) - _union(comm + compute)
    assert communication > 0 and 0 < overlapped < communication

    agg = analyze(path).agg()
    assert agg.window_end - agg.window_start == hi - lo
    s = agg.summary
    assert (s["communication_time"], s["overlapped_communication_time"]) == (communication, overlapped)
    (device,) = {e["args"]["device"] for e in events if e.get("cat") == "kernel"}
    gpu = agg.devices.set_index("device_id").loc[device]
    assert gpu["memory_busy"] == _union(memory)
    assert gpu["computation_busy"] == _union(compute)
    assert gpu["gpu_idle_time"] == (hi - lo) - _union(comm + compute + memory)
    # kernels launched in the steps (their cuda_runtime call starts in one), each with its launch delay
    launches = {e["args"]["correlation"]: _us_ns(e["ts"]) for e in events if e.get("cat") == "cuda_runtime"}
    spans = [(_us_ns(x["ts"]), _us_ns(x["ts"]) + _us_ns(x["dur"])) for x in steps]

    def in_steps(t):
        return any(a <= t < b for a, b in spans)

    delays = [
        _us_ns(e["ts"]) - launches[e["args"]["correlation"]]
        for e in events
        if e.get("cat") == "kernel"
        and e["args"].get("correlation") in launches
        and in_steps(launches[e["args"]["correlation"]])
    ]
    gb = agg.gpu_breakdowns
    assert gb["launches_total"] == len(delays)
    table = gb["launches"]
    assert (table["mean"] * table["launches"]).sum() == pytest.approx(sum(delays))


def _launches(path, short: int, long_: int):
    """`short` kernels of 1 us launched by 5 us calls, then `long_` kernels of 20 us launched by 5 us calls."""
    exp = NsysExport()
    exp.add_gpu(device_id=0)
    t = exp.add_thread(pid=1, tid=1, name="python", process_name="python")
    at = 0
    for k in range(short + long_):
        dur = 1_000 if k < short else 20_000
        exp.launch(t, at, at + 5_000, at + 6_000, at + 6_000 + dur, kernel="tiny" if k < short else "big")
        at += 6_000 + dur
    exp.push_pop(t, 0, at + 1_000, "outer")
    return exp.write(path)


@pytest.mark.parametrize(("short", "long_", "severity"), [(60, 40, "warning"), (35, 65, "info"), (25, 75, None)])
def test_short_kernels_finding(tmp_path, short, long_, severity):
    from dlprof_profiler.experts import detect

    a = analyze(_launches(tmp_path / "l.sqlite", short, long_))
    agg = a.agg()
    found = detect(a.trace, a.corr, a.domain(), agg, a.iterations, strict=True, only={"short_kernels_detector"})
    if severity is None:  # 25 % of the launches: below the threshold
        assert found == []
        return
    (f,) = found
    assert f["severity"] == severity
    assert f["data"]["short_kernels"] == short and f["data"]["launches"] == short + long_
    assert f"{short} of {short + long_} kernel launches" in f["problem"] and "tiny" in f["problem"]


def test_few_launches_give_no_short_kernel_finding(tmp_path):
    from dlprof_profiler.experts import detect

    a = analyze(_launches(tmp_path / "l.sqlite", 50, 0))  # all short, but 50 launches only
    only = {"short_kernels_detector"}
    assert detect(a.trace, a.corr, a.domain(), a.agg(), a.iterations, strict=True, only=only) == []


def test_a_cpu_only_trace_has_no_gpu_breakdown():
    """No GPU ran anything: no GPU rows, no stream, no launch; no iteration's GPU is idle."""
    agg = analyze(KINETO / "pytorch_cpu_only.pt.trace.json.gz").agg()
    gb = agg.gpu_breakdowns
    assert len(gb["streams"]) == 0 and len(gb["launches"]) == 0 and gb["launches_total"] == 0
    assert not agg.devices["used"].any()
    it = agg.iterations
    assert len(it) and (it[["computation_busy", "communication_busy", "memory_busy", "gpu_idle_time"]] == 0).all().all()
    assert (agg.summary["communication_time"], agg.summary["overlapped_communication_time"]) == (0, 0)


def test_underutilized_gpu_finding_names_the_idle_split(tmp_path):
    """The two-stream profile's GPU is busy 40 % of its window: the finding says what its idle 4,200 ns waited
    for: 800 host wait (19.0 %), 1,700 kernel wait (40.5 %), 1,700 other (40.5 %)."""
    from dlprof_profiler.experts import detect

    a = analyze(_two_streams(tmp_path / "b.sqlite"))
    (f,) = [
        f
        for f in detect(a.trace, a.corr, a.domain(), a.agg(), a.iterations, strict=True)
        if f["id"] == "underutilized_gpu_detector"
    ]
    assert f["data"]["idle_split"] == {"host_wait": 800, "kernel_wait": 1700, "other_wait": 1700}
    assert "19.0% waited for the host to launch work (host wait), 40.5% for launched work" in f["recommendation"]
