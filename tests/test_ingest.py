"""Ingest across nsys export schemas: the same capture written with each version's schema reads alike."""

import pytest

from dlprof_profiler.errors import DLProfError
from dlprof_profiler.ingest.nsys import read_nsys_export
from dlprof_profiler.ingest.sanitize import sanitize_trace
from tests.nsys_builder import SCHEMA_VERSIONS, NsysExport


def capture(schema, dlprof_modified=False, registered=False):
    exp = NsysExport(schema=schema, dlprof_modified=dlprof_modified)
    exp.add_gpu(device_id=0, name="NVIDIA A100-SXM4-40GB", sm_count=108, compute=(8, 0))
    exp.system_env("CpuDescription", "Test CPU")
    t = exp.add_thread(pid=7, tid=7, name="python", process_name="python")
    exp.add_domain(t, domain_id=5, name="MyDomain", registered=registered)
    exp.push_pop(t, 0, 500, "outer", registered=registered)
    exp.push_pop(t, 10, 400, "inner", domain_id=5, registered=registered)
    exp.start_end(t, 50, 700, "async", registered=registered)
    exp.push_pop(t, 600, None, "never closed")
    exp.launch(t, 20, 30, 40, 90, kernel="k1", demangled_name="void k1<float>(float*)")
    corr = exp.runtime(t, 100, 120, name="cudaMemcpyAsync_v3020")
    exp.memcpy(7, corr, 130, 150, bytes=4096, copy_kind=2)
    corr = exp.runtime(t, 160, 170, name="cudaMemsetAsync_v3020")
    exp.memset(7, corr, 180, 185, bytes=64)
    exp.set_session(start_time=0, stop_time=1000)
    return exp


@pytest.mark.parametrize("schema", SCHEMA_VERSIONS)
@pytest.mark.parametrize("variant", ["plain", "registered", "dlprof_modified"])
def test_every_schema_reads_alike(tmp_path, schema, variant):
    exp = capture(schema, dlprof_modified=variant == "dlprof_modified", registered=variant == "registered")
    trace = read_nsys_export(exp.write(tmp_path / f"{schema}.sqlite"))
    ranges = trace.ranges.sort_values("start").reset_index(drop=True)
    assert ranges["text"].tolist() == ["outer", "inner", "async", "never closed"]
    assert ranges["domain"].tolist() == ["default", "MyDomain", "default", "default"]
    assert ranges["event_type"].tolist() == [59, 59, 60, 59]
    # an unclosed range ends at the capture end (ANALYSIS_DETAILS stop, when the version has it)
    capture_end = 1000 if schema != "2021.3" else 700
    assert ranges["end"].tolist() == [500, 400, 700, capture_end] and ranges["unclosed"].tolist() == [0, 0, 0, 1]
    gpu = trace.gpu
    assert gpu["kind"].tolist() == [0, 1, 2]
    assert gpu["name"].astype(str).tolist() == ["k1", "[CUDA memcpy DtoH]", "[CUDA memset]"]
    assert gpu["long_name"].astype(str).tolist()[0] == "void k1<float>(float*)"
    assert (gpu["end"] - gpu["start"]).tolist() == [50, 20, 5] and gpu["bytes"].tolist()[1:] == [4096, 64]
    api = trace.api_calls
    assert api["name"].astype(str).tolist() == [
        "cudaLaunchKernel_v7000",
        "cudaMemcpyAsync_v3020",
        "cudaMemsetAsync_v3020",
    ]
    assert (api["pid"] == 7).all() and len(set(api["correlation_id"])) == 3
    dev = trace.devices.iloc[0]
    assert (dev["name"], dev["sm_count"], dev["compute_major"]) == ("NVIDIA A100-SXM4-40GB", 108, 8)
    assert trace.system["CpuDescription"] == "Test CPU"
    if schema != "2021.3":
        assert trace.meta["nsys_version"].startswith(schema)


def test_invalid_utf8_is_replaced_not_fatal(tmp_path):
    exp = capture("2021.3")
    exp.system_env("Weird", b"caf\xe9 \xff")
    trace = read_nsys_export(exp.write(tmp_path / "bad.sqlite"))
    assert trace.system["Weird"] == "caf\ufffd \ufffd"


@pytest.mark.parametrize("text", ["plain", "not UTF-8"])
def test_other_nvtx_events_are_left_out_but_a_late_mark_ends_the_capture(tmp_path, text):
    """Marks and category names between the ranges are not ranges; the latest NVTX time of any event (here a mark
    after every range, call and kernel, in a capture without a session stop) is the capture end, where the
    unclosed range ends; the same in memory and staged (ingest.nsys.read_nvtx_rows, store/trace_store)."""
    from dlprof_profiler.store.trace_store import TraceStore

    exp = NsysExport(schema="2021.3")  # no ANALYSIS_DETAILS: no session stop
    t = exp.add_thread(pid=7, tid=7, name="python", process_name="python")
    exp.add_category(t, 1, "cat", time=5)
    exp.push_pop(t, 10, 500, "outer")
    exp.mark(t, 20, b"mark \xff" if text == "not UTF-8" else "mark")
    exp.add_domain(t, domain_id=5, name="MyDomain", time=25)
    exp.push_pop(t, 30, 400, "inner", domain_id=5)
    exp.mark(t, 2000, "late mark")
    exp.push_pop(t, 600, None, b"open \xfe" if text == "not UTF-8" else "open")
    exp.launch(t, 40, 50, 60, 90, kernel="k1")
    path = exp.write(tmp_path / "marks.sqlite")
    opened = "open \ufffd" if text == "not UTF-8" else "open"
    store = TraceStore(path, tmp_path / "store")
    try:
        store.load()
        for trace in (sanitize_trace(read_nsys_export(path)), store.whole_trace()):
            ranges = trace.ranges
            assert ranges["text"].tolist() == ["outer", "inner", opened]
            assert ranges["domain"].tolist() == ["default", "MyDomain", "default"]
            assert ranges["start"].tolist() == [10, 30, 600] and ranges["end"].tolist() == [500, 400, 2000]
            assert ranges["unclosed"].tolist() == [0, 0, 1]
            assert trace.meta["capture_end"] == 2000
    finally:
        store.close()


def test_kernel_device_not_listed_is_added(tmp_path):
    exp = NsysExport()
    exp.add_gpu(device_id=0)
    t = exp.add_thread(pid=1, tid=1, name="python", process_name="python")
    exp.launch(t, 0, 10, 20, 30, kernel="k", device_id=3)
    trace = read_nsys_export(exp.write(tmp_path / "p.sqlite"))
    assert trace.devices["device_id"].tolist() == [0, 3]


def test_not_an_export(tmp_path):
    import sqlite3

    path = tmp_path / "x.sqlite"
    sqlite3.connect(path).execute("CREATE TABLE t (a)").connection.close()
    with pytest.raises(DLProfError, match="not an Nsight Systems export"):
        read_nsys_export(path)


def test_peak_gpu_memory_from_cuda_memory_usage_events(tmp_path):
    import sqlite3

    exp = NsysExport()
    exp.add_gpu(device_id=0, total_memory=40 << 30)
    t = exp.add_thread(pid=1, tid=1, name="python", process_name="python")
    exp.launch(t, 0, 10, 20, 30, kernel="k")
    path = exp.write(tmp_path / "p.sqlite")
    con = sqlite3.connect(path)
    # the columns nsys writes with --cuda-memory-usage=true (subset the reader uses)
    con.execute(
        "CREATE TABLE CUDA_GPU_MEMORY_USAGE_EVENTS (start INTEGER NOT NULL, globalPid INTEGER, "
        "deviceId INTEGER, address INTEGER, bytes INTEGER, memKind INTEGER, memoryOperationType INTEGER, "
        "correlationId INTEGER)"
    )
    gib = 1 << 30
    events = [(10, 0, 4 * gib, 0), (20, 0, 2 * gib, 0), (30, 0, 4 * gib, 1), (40, 0, 1 * gib, 0), (15, 1, 1 * gib, 0)]
    con.executemany(
        "INSERT INTO CUDA_GPU_MEMORY_USAGE_EVENTS (start, deviceId, bytes, memoryOperationType) VALUES (?, ?, ?, ?)",
        events,
    )
    con.commit()
    con.close()
    trace = read_nsys_export(path)
    assert trace.meta["gpu_peak_memory"] == 6 * gib  # 4 + 2 GiB before the first free on GPU 0
    from tests.analysis import analyze
    from dlprof_profiler import experts as expert_systems

    a = analyze(path)
    assert a.corr.config["peak_memory"] == 6 * gib
    findings = expert_systems.detect(a.trace, a.corr, a.domain(), a.agg(), a.iterations)
    batch = [f for f in findings if f["id"] == "batch_size_detector"]
    assert batch and batch[0]["problem"].startswith("GPU Memory is underutilized: Only 15.0% of GPU Memory is used")
    # out of core: the same run configuration (correlate.run_config)
    from dlprof_profiler.engine.analysis import analyze_store
    from dlprof_profiler.store.trace_store import TraceStore

    store = TraceStore(path, tmp_path / "store")
    try:
        store.load()
        assert analyze_store(store).corr.config["peak_memory"] == 6 * gib
    finally:
        store.close()


def _summary(out) -> dict:
    import csv

    with open(out / "dlprof_summary.csv", newline="") as fh:
        return {row[0]: row[1] for row in csv.reader(fh) if len(row) >= 2}


@pytest.mark.slow
@pytest.mark.parametrize(
    "driver, cuda, shown",
    [
        (0, 12020, ("Unknown", "Unknown")),  # nsys 2022.4 on a machine without a driver writes these
        ("", 12020, ("Unknown", "Unknown")),
        ("535.129.03", 12080, ("535.129.03", "12.8")),
        (5206105, 11080, ("520.61.05", "11.8")),
    ],
)
def test_driver_facts_only_where_a_driver_was_recorded(tmp_path, driver, cuda, shown):
    """System facts come from what the capture recorded: NvDriverVersion 0 means no NVIDIA driver ran, so
    the CUDA version nsys writes beside it (its own) is no fact of the machine either."""
    from tests.profiles import run_dlprof

    exp = NsysExport()
    exp.system_env("NvDriverVersion", driver)
    exp.system_env("CudaDriverVersion", cuda)
    t = exp.add_thread(pid=1, tid=1, name="python", process_name="python")
    exp.push_pop(t, 100, 900, "work")
    exp.set_session(start_time=0, stop_time=1000)
    path = exp.write(tmp_path / "p.sqlite")
    trace = read_nsys_export(path)
    recorded = str(driver) not in ("0", "")
    assert ("NvDriverVersion" in trace.system, "CudaDriverVersion" in trace.system) == (recorded, recorded)
    run_dlprof(f"--database={path}", f"--output_path={tmp_path / 'out'}", "--reports=summary", "-v", "quiet")
    facts = _summary(tmp_path / "out")
    assert (facts["GPU Driver Version"], facts["CUDA Version"]) == shown


@pytest.mark.slow
def test_a_capture_without_events_spans_its_own_window(tmp_path):
    """No NVTX range, CUDA call or GPU activity: the profile is the capture's window (ANALYSIS_DETAILS
    1000..5000), one iteration of 4000 ns (no key node), and one warning line that says what to do."""
    from tests.profiles import run_dlprof

    exp = NsysExport()
    exp.add_thread(pid=1, tid=1, name="python", process_name="python")
    exp.set_session(start_time=1000, stop_time=5000)
    path = exp.write(tmp_path / "empty.sqlite")
    trace = read_nsys_export(path)
    assert (trace.profile_start, trace.profile_end) == (1000, 5000)
    assert len(trace.warnings) == 1 and "no NVTX ranges and no CUDA activity" in trace.warnings[0]
    proc = run_dlprof(f"--database={path}", f"--output_path={tmp_path / 'out'}", "--reports=summary")
    facts = _summary(tmp_path / "out")
    assert facts["Wall Clock Time (ns)"] == "4000" and facts["Total Iterations"] == "1"
    assert facts["Average Iteration Time (ns)"] == "4000.0"
    assert sum("no NVTX ranges" in line for line in proc.stderr.splitlines()) == 1
    # with events, the window is theirs (DLProf's rule), not the session's
    exp.push_pop(exp.add_thread(pid=1, tid=1, name="python"), 2000, 3000, "work")
    trace = read_nsys_export(exp.write(tmp_path / "one.sqlite"))
    assert (trace.profile_start, trace.profile_end) == (2000, 3000)


def test_capture_end_is_the_session_stop_unless_an_event_ends_later():
    """One rule for both engines (in memory and staged): the session's stop time, or the latest event end
    (CUDA call, GPU activity, NVTX end or time) when one ends after it; kinds without events count as none."""
    from dlprof_profiler.ingest.nsys import capture_end

    assert capture_end([900, None, 950], {"session_stop": 1000}) == 1000
    assert capture_end([900, 1200, 950], {"session_stop": 1000}) == 1200
    assert capture_end([900, None, 1300], {}) == 1300
    assert capture_end([None, None, None], {"session_stop": 700}) == 700
    assert capture_end([None, None, None], {}) == 0
