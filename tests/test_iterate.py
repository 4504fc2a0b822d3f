"""Iteration splitting (DESIGN.md "Iterations") on hand-built profiles."""

import numpy as np
import pytest

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
    from dlprof_profiler import expert_systems

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
