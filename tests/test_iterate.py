"""Iteration splitting (DESIGN.md "Iterations") on hand-built profiles."""

from functools import partial

import numpy as np
import pytest

from dlprof_profiler.engine.trace import PARTIAL_STEPS
from dlprof_profiler.errors import DLProfError
from tests.analysis import analyze
from tests.nsys_builder import NsysExport


def steps_profile(tmp_path, ends=(1000, 2000, 3000), label="train_step", devices=((100, 0),), extra_end=3500):
    """One `label` range per entry of `ends` (each 100 ns long, ending there) per (pid, device), each
    thread launching a kernel on its device at the start of every step; an unassociated call at extra_end."""
    exp = NsysExport()
    for _, dev in devices:
        exp.add_gpu(device_id=dev)
    for pid, dev in devices:
        t = exp.add_thread(pid=pid, tid=pid, name="python", process_name="python")
        for _i, end in enumerate(ends):
            exp.push_pop(t, end - 100, end, label)
            exp.launch(t, end - 90, end - 80, end - 70, end - 60, kernel="k", device_id=dev)
        exp.runtime(t, extra_end - 10, extra_end, name="cudaDeviceSynchronize_v3020")
    return exp.write(tmp_path / "p.sqlite")


def test_n_key_nodes_give_n_plus_one_iterations(tmp_path):
    a = analyze(steps_profile(tmp_path), key_node="train_step")
    it = a.iterations
    assert it.found and it.count == 4
    assert it.boundaries.tolist() == [1000, 2000, 3000]
    # iteration 0 starts at the first recorded event: the first step range [900, 1000)
    assert it.starts.tolist() == [900, 1000, 2000, 3000]
    assert it.ends.tolist() == [1000, 2000, 3000, 3500]
    s = a.agg().summary
    assert (s["total_iterations"], s["aggregated_iterations"], s["iter_start"], s["iter_stop"]) == (4, 4, 0, 3)
    assert s["wall_time"] == 2600  # from the first event (900) to the last (3500)
    assert s["avg_iteration_time"] == pytest.approx(2600 / 4)
    # iteration durations 100, 1000, 1000, 500 -> sample standard deviation
    assert s["iteration_std"] == pytest.approx(np.std([100, 1000, 1000, 500], ddof=1))


def test_key_node_not_found_means_one_iteration(tmp_path):
    a = analyze(steps_profile(tmp_path), key_node="no_such_node")
    assert not a.iterations.found and a.iterations.count == 1
    s = a.agg().summary
    assert (s["total_iterations"], s["aggregated_iterations"], s["iter_start"], s["iter_stop"]) == (1, 1, 0, 0)
    from dlprof_profiler import experts as expert_systems

    findings = expert_systems.detect(a.trace, a.corr, a.domain(), a.agg(), a.iterations)
    texts = [f["problem"] for f in findings]
    assert "Unable to split profile into training iterations: key op no_such_node not found" in texts


def test_iteration_range_selects_items_by_start(tmp_path):
    a = analyze(steps_profile(tmp_path), key_node="train_step", iter_start=1, iter_stop=2)
    agg = a.agg()
    # iterations 1 and 2: [1000, 3000); the window ends at the latest end of their items
    assert agg.window_start == 1000
    assert agg.window_end == 3000  # the step range ending at 3000 starts in iteration 2
    assert agg.summary["wall_time"] == 2000 and agg.summary["aggregated_iterations"] == 2
    # the kernels launched in iterations 1 and 2 (the steps ending at 2000 and 3000)
    assert agg.summary["kernels"]["all"]["gpu_time"] == 20


@pytest.mark.parametrize("start,stop", [(4, 4), (0, 9), (2, 1)])
def test_iteration_range_outside_the_profile_is_an_error(tmp_path, start, stop):
    with pytest.raises(DLProfError) as err:
        analyze(steps_profile(tmp_path), key_node="train_step", iter_start=start, iter_stop=stop)
    assert str(err.value).count("\n") == 0 and ("outside the profile" in str(err.value) or "below" in str(err.value))


def test_multi_gpu_same_counts_take_the_latest_kth_end(tmp_path):
    exp = NsysExport()
    for dev in (0, 1):
        exp.add_gpu(device_id=dev)
    for pid, dev, ends in ((100, 0, (1000, 2000)), (200, 1, (1100, 1900))):
        t = exp.add_thread(pid=pid, tid=pid, name="python", process_name="python")
        for end in ends:
            exp.push_pop(t, end - 100, end, "step")
            exp.launch(t, end - 90, end - 80, end - 70, end - 60, kernel="k", device_id=dev)
    a = analyze(exp.write(tmp_path / "p.sqlite"), key_node="step")
    assert a.iterations.boundaries.tolist() == [1100, 2000]


def test_multi_gpu_different_counts_use_every_instance(tmp_path):
    """One process driving two GPUs whose key node counts differ: every instance is a boundary."""
    exp = NsysExport()
    for dev in (0, 1):
        exp.add_gpu(device_id=dev)
    t = exp.add_thread(pid=100, tid=100, name="python", process_name="python")
    s = exp.add_thread(pid=100, tid=101, name="python", process_name="python")
    for thread, dev, ends in ((t, 0, (1000, 2000)), (s, 1, (1500,))):
        for end in ends:
            exp.push_pop(thread, end - 100, end, "step")
            exp.launch(thread, end - 90, end - 80, end - 70, end - 60, kernel="k", device_id=dev)
    a = analyze(exp.write(tmp_path / "p.sqlite"), key_node="step")
    assert a.iterations.boundaries.tolist() == [1000, 1500, 2000]


@pytest.mark.parametrize("late, extra", [(True, False), (False, True), (True, True)])
def test_a_process_per_gpu_keeps_its_own_steps(tmp_path, late, extra):
    """Spawned workers, one per GPU, steps every 1000 ns nearly in step (worker 2 ends each 50 ns later);
    worker 2's capture starts a step late and/or worker 1 runs one step more: the steps are matched one to
    one (the latest end of each matched pair is a boundary), not interleaved into twice as many iterations."""
    exp = NsysExport()
    for dev in (0, 1):
        exp.add_gpu(device_id=dev)
    first = [1000, 2000, 3000, 4000] + ([5000] if extra else [])
    second = [e + 50 for e in ((2000, 3000, 4000) if late else (1000, 2000, 3000, 4000))]
    for pid, dev, ends in ((100, 0, first), (200, 1, second)):
        t = exp.add_thread(pid=pid, tid=pid, name="python", process_name="python")
        for end in ends:
            exp.push_pop(t, end - 100, end, "step")
            exp.launch(t, end - 90, end - 80, end - 70, end - 60, kernel="k", device_id=dev)
    a = analyze(exp.write(tmp_path / "p.sqlite"), key_node="step")
    expected = second
    assert a.iterations.boundaries.tolist() == expected
    assert a.iterations.count == len(expected) + 1


@pytest.mark.slow
def test_key_node_matches_labels_texts_names_and_op_ids(tmp_path):
    exp = NsysExport()
    exp.add_gpu(device_id=0)
    t = exp.add_thread(pid=100, tid=100, name="python", process_name="python")
    for i, end in enumerate((1000, 2000)):
        exp.push_pop(t, end - 500, end, f"ProfilerStep#{i + 1}, op_id = {10 * i}")
        exp.push_pop(t, end - 400, end - 300, f"aten::add_, seq = {i}, op_id = {10 * i + 1}")
        exp.launch(t, end - 390, end - 380, end - 370, end - 360, kernel="k")
    path = exp.write(tmp_path / "p.sqlite")
    by_label = analyze(path, key_node="aten::add_")  # an op label
    assert by_label.iterations.boundaries.tolist() == [700, 1700]
    by_text = analyze(path, key_node="ProfilerStep#1, op_id = 0")  # the full range text
    assert by_text.iterations.boundaries.tolist() == [1000]
    by_counter = analyze(path, key_node="ProfilerStep")  # the label without its #N counter
    assert by_counter.iterations.boundaries.tolist() == [1000, 2000]
    default = analyze(path)  # PyTorch default: ProfilerStep#N
    assert default.iterations.source == "default" and default.iterations.boundaries.tolist() == [1000, 2000]
    # the step counter is not part of op names, so each step's add_ is the same op
    op = default.op("/ProfilerStep/aten::add_")
    assert op["calls"] == 2
    by_op_id = analyze(path, key_node=op["op_id"])  # an Op ID
    assert by_op_id.iterations.found and by_op_id.iterations.boundaries.tolist() == [700, 1700]
    by_name = analyze(path, key_node="/ProfilerStep/aten::add_")  # an op name
    assert by_name.iterations.boundaries.tolist() == [700, 1700]


def test_nested_matches_count_once(tmp_path):
    exp = NsysExport()
    exp.add_gpu(device_id=0)
    t = exp.add_thread(pid=100, tid=100, name="python", process_name="python")
    exp.push_pop(t, 0, 1000, "step")
    exp.push_pop(t, 100, 900, "step")
    exp.push_pop(t, 1000, 2000, "step")
    exp.launch(t, 10, 20, 30, 40, kernel="k")
    a = analyze(exp.write(tmp_path / "p.sqlite"), key_node="step")
    assert a.iterations.boundaries.tolist() == [1000, 2000]


# ---------------------------------------------------------------------------- torch.profiler steps

STEPS = ((1000, 2000), (2100, 3000), (3100, 4100))  # ProfilerStep#1..3: [start, end)


def profiler_steps_profile(path):
    """An nsys capture of a torch.profiler run (thread 100, GPU 0; times in ns). Each step [s, e) of STEPS
    holds `aten::mm` [s+100, s+300) launching `mm_kernel` (call [s+150, s+200), kernel [s+250, s+550)). Outside
    every step: `aten::zeros` [100, 200) with `fill_kernel` [300, 400) before the first, `aten::zero_`
    [2020, 2060) with `fill_kernel` [2070, 2090) between steps 1 and 2, cudaDeviceSynchronize [4200, 4300) after
    the last; then ProfilerStep#4 [4400, 4450), in which nothing runs (torch.profiler's last step, opened by the
    last prof.step() and closed when profiling stops)."""
    exp = NsysExport()
    exp.add_gpu(device_id=0)
    t = exp.add_thread(pid=100, tid=100, name="python", process_name="python")
    exp.push_pop(t, 100, 200, "aten::zeros, op_id = 1")
    exp.launch(t, 120, 140, 300, 400, kernel="fill_kernel")
    for i, (s, e) in enumerate(STEPS):
        exp.push_pop(t, s, e, f"ProfilerStep#{i + 1}")
        exp.push_pop(t, s + 100, s + 300, f"aten::mm, seq = {i}, op_id = {10 + i}")
        exp.launch(t, s + 150, s + 200, s + 250, s + 550, kernel="mm_kernel")
    exp.push_pop(t, 2020, 2060, "aten::zero_, op_id = 2")
    exp.launch(t, 2030, 2040, 2070, 2090, kernel="fill_kernel")
    exp.runtime(t, 4200, 4300, name="cudaDeviceSynchronize_v3020")
    exp.push_pop(t, 4400, 4450, "ProfilerStep#4")
    return exp.write(path)


@pytest.mark.slow
def test_profiler_steps_are_the_iterations(tmp_path):
    """N steps give N iterations, each the step's own span: nothing before the first, between two or after the
    last is in an iteration; those ops stay in the model (and the database) but no aggregation counts them."""
    a = analyze(profiler_steps_profile(tmp_path / "p.sqlite"))
    it = a.iterations
    assert it.key_node == "ProfilerStep" and it.source == "default" and it.by_step
    assert it.count == 3 and it.starts.tolist() == [1000, 2100, 3100] and it.ends.tolist() == [2000, 3000, 4100]
    assert it.complete.tolist() == [True, True, True]
    assert it.of([999, 1000, 2050, 2100, 4100, 4420]).tolist() == [-1, 0, -1, 1, -1, -1]
    agg = a.agg()
    s = agg.summary
    assert (agg.window_start, agg.window_end) == (1000, 4100)  # the steps: the GPU tail [4100, 4150) is not in it
    assert (s["total_iterations"], s["aggregated_iterations"], s["wall_time"]) == (3, 3, 3100)
    assert s["avg_iteration_time"] == pytest.approx(3100 / 3)
    assert s["iteration_std"] == pytest.approx(np.std([1000, 900, 1000], ddof=1))
    assert s["median_iteration_time"] == 1000
    assert (s["complete_iterations"], s["complete_start"], s["complete_stop"], s["partial_iterations"]) == (3, 0, 2, [])
    assert agg.iterations["duration"].tolist() == [1000, 900, 1000]
    assert agg.iterations["kernels"].tolist() == [1, 1, 1]
    # only the steps' ops and kernels are aggregated: three mm calls and their 300 ns kernels
    assert agg.ops["name"].tolist() == ["/ProfilerStep/aten::mm"] and agg.ops["calls"].tolist() == [3]
    assert s["kernels"]["all"]["gpu_time"] == 900 and s["ops"]["all"]["count"] == 1
    labels = set(a.domain().instances["label"].astype(str))
    assert {"aten::zeros", "aten::zero_", "aten::mm"} <= labels  # outside ones kept as instances


@pytest.mark.slow
def test_key_node_profiler_step_on_an_nsys_capture_and_an_iteration_range(tmp_path):
    """The step rule follows the key node, given or default; --iter_start/--iter_stop pick steps."""
    path = profiler_steps_profile(tmp_path / "p.sqlite")
    a = analyze(path, key_node="ProfilerStep", iter_start=1, iter_stop=2)
    agg = a.agg()
    assert a.iterations.source == "user" and a.iterations.count == 3
    assert (agg.window_start, agg.window_end) == (2100, 4100)
    assert agg.summary["wall_time"] == 2000 and agg.summary["median_iteration_time"] == 950


def test_one_step_of_a_cpu_trace_is_one_iteration(tmp_path):
    """A CPU-only Kineto trace: collection from 0 to 1,289,000 ns, one ProfilerStep#551 [4,000, 214,000) and
    gloo collectives after it: one iteration of 210,000 ns, not two averaging 641,000 (N + 1 intervals)."""
    from tests.kineto_builder import KinetoTrace

    k = KinetoTrace()
    k.metadata({7: "python"})
    k.span(0, 1_289_000)
    k.annotation(7, 4_000, 210_000, "ProfilerStep#551")
    k.cpu_op(7, 10_000, 150_000, "aten::linear", seq=1)
    for t in (300_000, 700_000, 1_200_000):
        k.annotation(7, t, 80_000, "gloo:all_reduce")
        k.cpu_op(7, t + 1_000, 1_000, "aten::empty")
    a = analyze(k.write(tmp_path / "cpu.json"))
    s = a.agg().summary
    assert (s["total_iterations"], s["wall_time"], s["avg_iteration_time"], s["median_iteration_time"]) == (
        1,
        210_000,
        210_000,
        210_000,
    )


def test_mtia_style_step_ends_after_every_event(tmp_path):
    """An MTIA-style trace (mtia_runtime calls, mtia_ccp_events device activities) ends without a device
    synchronize: its one ProfilerStep [1000, 30000) encloses every op and device activity (the last ends at
    12000). Iteration 0 of N + 1 intervals ran to the step's end (29,000 ns) while the wall clock window ended
    at the last op (11,000 ns); now the iteration is the step and the window is the step. With a key node (the
    same range as `train_step`), the window holds the intervals: iteration 0 is no longer than it."""
    from tests.kineto_builder import KinetoTrace

    def trace(label):
        k = KinetoTrace()
        k.metadata({10: "python"})
        k.annotation(10, 1000, 29_000, label)
        k.cpu_op(10, 2000, 10_000, "aten::mm", seq=1)
        k.raw(
            '{"ph": "X", "cat": "mtia_runtime", "name": "mtiaLaunchKernel", "pid": 4242, "tid": 10, '
            '"ts": 3.000, "dur": 2.000, "args": {"correlation": 77}}'
        )
        k.raw(
            '{"ph": "X", "cat": "mtia_ccp_events", "name": "mm_kernel", "pid": 1, "tid": 3, '
            '"ts": 6.000, "dur": 3.500, "args": {"correlation": 77, "device": 1, "stream": 3}}'
        )
        return k.write(tmp_path / f"{label}.json")

    a = analyze(trace("ProfilerStep#0"))
    agg = a.agg()
    assert agg.iterations["duration"].tolist() == [29_000] and agg.summary["wall_time"] == 29_000
    b = analyze(trace("train_step"), key_node="train_step")
    agg = b.agg()
    # key node intervals [1000, 30000) and [30000, 30000); the window holds them
    assert agg.iterations["duration"].tolist() == [29_000, 0]
    assert agg.summary["wall_time"] == 29_000 >= agg.iterations["duration"].max()


def tail_loading_profile(path):
    """test_data_loading_at_the_end_of_the_profile_is_in_the_window's capture."""
    exp = NsysExport()
    t = exp.add_thread(pid=100, tid=100, name="python", process_name="python")
    loader = "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"
    for i, base in enumerate((0, 1000)):
        exp.push_pop(t, base, base + 200, loader)
        exp.push_pop(t, base + 250, base + 1000, "train_step")
        exp.push_pop(t, base + 300, base + 600, f"aten::add, seq = {i}, op_id = {i + 1}")
    exp.push_pop(t, 2100, 2600, loader)
    return exp.write(path)


def test_data_loading_at_the_end_of_the_profile_is_in_the_window(tmp_path):
    """No GPU. train_step [250, 1000) and [1250, 2000) are the key node; DataLoader ranges [0, 200), [1000,
    1200) and, after the last step, the one raising StopIteration [2100, 2600); ops [300, 600) and [1300, 1600).
    The window is [0, 2600) (the last interval ends with the profile), not [0, 1600) (the last op): data
    loading 900 / 2600, CPU 600 / 2600, not 400 / 1600."""
    a = analyze(tail_loading_profile(tmp_path / "p.sqlite"), key_node="train_step")
    s = a.agg().summary
    assert s["wall_time"] == 2600
    assert s["pct"]["dataloader"] == pytest.approx(100 * 900 / 2600)
    assert s["pct"]["cpu"] == pytest.approx(100 * 600 / 2600)
    assert s["pct"]["other"] == pytest.approx(100 * 1100 / 2600)
    # iterations 0 and 2 are partial: the median is iteration 1's 1000 ns
    assert s["median_iteration_time"] == 1000 and s["partial_iterations"] == [0, 2]


# ---------------------------------------------------------------------------- key nodes are forward calls


def test_a_key_node_matches_forward_calls_only(tmp_path):
    """dlprof_profiler.pytorch markers label a call's backward nodes with the forward op (`linear`, dir bprop):
    `--key_node=linear` gives one boundary per forward call (the dict marker [T+100, T+9900) of T = 1.0, 1.1,
    1.2 ms), not three (the two backward nodes too). By op name (bprop ops carry the forward op's name) the
    same holds: the training profile's /aten::conv2d ends at T+20000."""
    from tests import profiles

    a = analyze(profiles.backward_calls_profile(tmp_path / "calls.sqlite"), key_node="linear")
    assert a.iterations.boundaries.tolist() == [1_009_900, 1_109_900, 1_209_900]
    b = analyze(profiles.training_profile(tmp_path / "t.sqlite"), key_node="/aten::conv2d")
    assert b.iterations.found and b.iterations.boundaries.tolist() == [1_020_000, 1_120_000, 1_220_000]


def test_steps_in_which_nothing_runs_are_no_iterations(tmp_path):
    """Two ProfilerSteps with nothing inside (an op runs after them): no iteration to split by, the whole
    profile is one, as without a key node."""
    from tests.kineto_builder import KinetoTrace

    k = KinetoTrace()
    k.metadata({7: "python"})
    k.annotation(7, 1000, 500, "ProfilerStep#0")
    k.annotation(7, 2000, 500, "ProfilerStep#1")
    k.cpu_op(7, 3000, 1000, "aten::mm", seq=1)
    it = analyze(k.write(tmp_path / "empty.json")).iterations
    assert (it.found, it.by_step, it.count, it.boundaries.tolist()) == (False, False, 1, [])
    assert (it.starts.tolist(), it.ends.tolist()) == ([0], [3000])  # time 0: the first event, at 1000


def test_key_ops_are_forward_ops_named_or_numbered_as_the_key():
    """Both engines find a key node among ops with it: op name or Op ID, never a bprop op."""
    import pandas as pd

    from dlprof_profiler.engine.iterate import key_ops

    ops = pd.DataFrame(
        {
            "name": ["linear", "linear", "relu", "step"],
            "op_id": ["LINEAR_1", "LINEAR_2", "RELU_1", "linear"],
            "direction": ["fprop", "bprop", "fprop", ""],
        }
    )
    assert key_ops(ops, "linear").tolist() == [True, False, False, True]
    assert key_ops(ops, "RELU_1").tolist() == [False, False, True, False]


# ---------------------------------------------------------------------------- the rule itself, on plain frames
# Both engines call iterate.split_iterations: the in-memory one through trace_inputs, the out-of-core one through
# store.model.StoreAnalysis.iteration_inputs (tests/test_store.py checks those inputs alike).


def _ranges(rows):
    """A range frame and its classification from (start, end, text, label, backward, direction) rows on thread
    7 of process 1."""
    import pandas as pd

    ranges = pd.DataFrame(
        {
            "start": np.array([r[0] for r in rows], dtype=np.int64),
            "end": np.array([r[1] for r in rows], dtype=np.int64),
            "pid": np.ones(len(rows), dtype=np.int64),
            "global_tid": np.full(len(rows), 7, dtype=np.int64),
            "text": [r[2] for r in rows],
        }
    )
    info = pd.DataFrame(
        {"label": [r[3] for r in rows], "backward": [r[4] for r in rows], "direction": [r[5] for r in rows]}
    )
    return ranges, info


def _inputs(rows, window=(500, 4000), api_starts=(), preferred=None):
    from dlprof_profiler.engine import iterate

    ranges, info = _ranges(rows)
    info["kind"] = 0
    return iterate.trace_inputs(
        ranges, info, None, {7: 0}, {1: 0}, window[1], window[0], preferred, np.asarray(api_starts, dtype=np.int64)
    )


def test_three_key_nodes_in_the_window_give_four_intervals():
    """Key node instances ending at 1000, 2000 and 3000 in the window [500, 4000): [500, 1000), [1000, 2000),
    [2000, 3000), [3000, 4000); the first and the last are partial."""
    from dlprof_profiler.engine import iterate

    rows = [(s - 100, s, "train_step", "train_step", False, None) for s in (1000, 2000, 3000)]
    it = iterate.split_iterations("train_step", _inputs(rows))
    assert (it.key_node, it.source, it.found, it.by_step, it.count) == ("train_step", "user", True, False, 4)
    assert it.boundaries.tolist() == [1000, 2000, 3000]
    assert it.starts.tolist() == [500, 1000, 2000, 3000] and it.ends.tolist() == [1000, 2000, 3000, 4000]
    assert it.complete.tolist() == [False, True, True, False]
    assert it.of([500, 999, 1000, 2999, 3000, 3999]).tolist() == [0, 0, 1, 2, 3, 3]
    # a key node ending before the window opens or after it closes widens the outer intervals
    wide = iterate.split_iterations("train_step", _inputs(rows, window=(1500, 2500)))
    assert wide.starts.tolist() == [1000, 1000, 2000, 3000] and wide.ends.tolist() == [1000, 2000, 3000, 3000]


def test_no_key_node_is_one_iteration_and_the_default_is_asked_only_without_one():
    from dlprof_profiler.engine import iterate

    rows = [(100, 1000, "step", "step", False, None)]
    none = iterate.split_iterations(None, _inputs(rows))
    assert (none.key_node, none.source, none.found, none.count) == ("", "none", False, 1)
    assert (none.starts.tolist(), none.ends.tolist()) == ([500], [4000])
    default = iterate.split_iterations(None, _inputs(rows, preferred="step"))
    assert (default.source, default.boundaries.tolist()) == ("default", [1000])
    missing = iterate.split_iterations("other", _inputs(rows, preferred="step"))
    assert (missing.key_node, missing.source, missing.found, missing.count) == ("other", "user", False, 1)


def test_key_node_ranges_are_forward_outermost_text_or_label_else_without_counter():
    """Text or label equal to the key, forward only, nested once; the `#N`-stripped label only when no range
    matches exactly."""
    from dlprof_profiler.engine import iterate

    rows = [
        (0, 1000, "linear, seq = 1", "linear", False, "fprop"),  # by label
        (100, 900, "linear, seq = 2", "linear", False, "fprop"),  # nested in the first
        (1000, 1500, "linear", None, False, None),  # by text
        (1600, 1700, "LinearBackward0", "linear", True, "bprop"),  # backward node: not a key node
        (1800, 1900, "bwd", "linear", False, "bprop"),  # bprop marker: not a key node
        (2000, 2500, "step#1", "step#1", False, None),
        (2500, 3000, "step#2", "step#2", False, None),
    ]
    it = iterate.split_iterations("linear", _inputs(rows))
    assert it.boundaries.tolist() == [1000, 1500]
    by_counter = iterate.split_iterations("step#9", _inputs(rows))  # no exact match: step#1, step#2
    assert by_counter.boundaries.tolist() == [2500, 3000]
    exact = iterate.split_iterations("step#2", _inputs(rows))  # an exact match wins over the stripped ones
    assert exact.boundaries.tolist() == [3000]
    backward_only = iterate.split_iterations("LinearBackward0", _inputs(rows))
    assert not backward_only.found and backward_only.count == 1


def test_profiler_steps_are_their_spans_and_empty_steps_are_dropped():
    """ProfilerStep#1..3 [1000, 2000), [2100, 3000), [3100, 4100) with something starting in each, #4
    [4400, 4450) with nothing: three step iterations; what lies between steps is in none."""
    from dlprof_profiler.engine import iterate

    steps = [(1000, 2000), (2100, 3000), (3100, 4100), (4400, 4450)]
    rows = [(s, e, f"ProfilerStep#{i + 1}", f"ProfilerStep#{i + 1}", False, None) for i, (s, e) in enumerate(steps)]
    steps_of = partial(_inputs, rows, window=(100, 4450), preferred="ProfilerStep")  # a torch.profiler trace's
    it = iterate.split_iterations(None, steps_of(api_starts=[3150, 1500, 2200]))
    assert (it.key_node, it.source, it.by_step, it.count) == ("ProfilerStep", "default", True, 3)
    assert it.starts.tolist() == [1000, 2100, 3100] and it.ends.tolist() == [2000, 3000, 4100]
    assert it.boundaries.tolist() == [2000, 3000, 4100, 4450]  # op names are numbered between all ends
    assert it.of([999, 1000, 2050, 2100, 4100]).tolist() == [-1, 0, -1, 1, -1]
    assert it.complete.tolist() == [True, True, True]
    marked = iterate.with_partial_steps(it, {PARTIAL_STEPS: "1000,3100"})
    assert marked.complete.tolist() == [False, True, False]
    # no API call in any step: no step holds anything, as if no key node were found
    empty = iterate.split_iterations(None, steps_of())
    assert (empty.found, empty.by_step, empty.count) == (False, False, 1)


def test_occupied_counts_starts_strictly_inside_each_span_over_any_batches():
    from dlprof_profiler.engine import iterate

    spans = np.array([[10, 20], [20, 30], [40, 50]], dtype=np.int64)
    batches = [np.array([25, 10, 50]), np.array([], dtype=np.int64), np.array([45, 11])]
    assert iterate.occupied_by(lambda: batches)(spans).tolist() == [True, True, True]
    # a span's own start and its end are not inside it
    assert iterate.occupied_by(lambda: [np.array([10, 20, 30, 40, 50])])(spans).tolist() == [False, False, False]
