"""Cross-checks against Nsight Systems' own `nsys stats` reports on the same SQLite files: per-kernel
totals (gpukernsum), API totals (cudaapisum), memory totals (gpumemtimesum), range durations (nvtxsum)
and kernel-to-range attribution at every nesting level (nvtxkernsum)."""

import csv
import re
import shutil
import subprocess
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from dlprof_profiler.engine.structure import RangeForest, ThreadTimeKeys
from tests.analysis import analyze
from tests.nsys_builder import NsysExport
from tests.test_fixtures import FIXTURES, NAMES

pytestmark = pytest.mark.nsys
NSYS = shutil.which("nsys")
if NSYS is None:
    pytest.skip("Nsight Systems (nsys) is not installed", allow_module_level=True)

_SUFFIX = re.compile(r"_v\d+$")


def nsys_stats(path: Path, report: str) -> list[dict]:
    """Rows of one nsys stats report as dicts (an empty list when the report has no data)."""
    base = path.with_suffix("")
    proc = subprocess.run(
        [NSYS, "stats", "-q", "-r", report, "-f", "csv", "-o", str(base), str(path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = Path(f"{base}_{report.replace(':', '_')}.csv")
    if proc.returncode not in (0, 27) or not out.exists():
        raise AssertionError(f"nsys stats {report} failed ({proc.returncode}): {proc.stderr}")
    with open(out, newline="") as fh:
        return list(csv.DictReader(fh))


def random_profile(path: Path, seed: int) -> Path:
    """Random nested ranges on two threads with launches that never straddle a range boundary (range
    boundaries are multiples of 10; calls are [10k + 3, 10k + 7))."""
    rng = np.random.default_rng(seed)
    exp = NsysExport(schema="2022.4")
    exp.add_gpu(device_id=0)
    counter = 0
    for tid in (1, 2):
        t = exp.add_thread(pid=50, tid=tid, name=f"thread{tid}", process_name="python")
        clock, stack = 0, []
        for _ in range(60):
            clock += 10 * int(rng.integers(1, 4))
            action = rng.random()
            if stack and action < 0.35:
                start, text = stack.pop()
                exp.push_pop(t, start, clock, text)
            elif action < 0.7:
                counter += 1
                stack.append((clock, f"r{counter}"))
            else:
                for _ in range(int(rng.integers(1, 3))):
                    k = int(rng.integers(0, 3))
                    gpu_start = 100_000 + counter * 1000 + int(rng.integers(0, 500))
                    exp.launch(
                        t, clock + 3, clock + 7, gpu_start, gpu_start + int(rng.integers(1, 400)), kernel=f"kernel_{k}"
                    )
                    clock += 10
        while stack:
            clock += 10
            start, text = stack.pop()
            exp.push_pop(t, start, clock, text)
    return exp.write(path)


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    return [random_profile(tmp_path_factory.mktemp("gen") / f"p{seed}.sqlite", seed) for seed in range(3)]


def our_kernel_totals(a) -> dict:
    gpu = a.trace.gpu
    kernels = gpu[gpu["kind"] == 0]
    dur = (kernels["end"] - kernels["start"]).to_numpy()
    totals = defaultdict(lambda: [0, 0])
    for name, d in zip(kernels["name"].astype(str), dur):
        totals[name][0] += int(d)
        totals[name][1] += 1
    return dict(totals)


@pytest.mark.slow
def test_gpukernsum_matches_on_generated_and_real_exports(generated, tmp_path):
    paths = list(generated)
    for name in NAMES:
        shutil.copy(FIXTURES / name, tmp_path / name)
        paths.append(tmp_path / name)
    checked = 0
    for path in paths:
        a = analyze(path)
        theirs = defaultdict(lambda: [0, 0])
        for row in nsys_stats(path, "gpukernsum:base"):
            theirs[row["Name"]][0] += int(row["Total Time (ns)"])
            theirs[row["Name"]][1] += int(row["Instances"])
        assert our_kernel_totals(a) == dict(theirs), path.name
        checked += bool(theirs)
    assert checked >= 6  # three generated and the real exports that hold kernels


def test_cudaapisum_and_gpumemtimesum(generated, tmp_path):
    path = tmp_path / "app.sqlite"
    shutil.copy(FIXTURES / "cuda_app_no_nvtx_nsys2021.3.sqlite", path)
    a = analyze(path)
    api = a.trace.api_calls
    ours = defaultdict(lambda: [0, 0])
    for name, d in zip(api["name"].astype(str), (api["end"] - api["start"]).to_numpy()):
        ours[_SUFFIX.sub("", name)][0] += int(d)
        ours[_SUFFIX.sub("", name)][1] += 1
    theirs = {
        row["Name"]: [int(row["Total Time (ns)"]), int(row["Num Calls"])] for row in nsys_stats(path, "cudaapisum")
    }
    assert dict(ours) == theirs
    gpu = a.trace.gpu
    memory = gpu[gpu["kind"] != 0]
    ours_mem = defaultdict(lambda: [0, 0])
    for name, d in zip(memory["name"].astype(str), (memory["end"] - memory["start"]).to_numpy()):
        ours_mem[name][0] += int(d)
        ours_mem[name][1] += 1
    theirs_mem = {
        row["Operation"]: [int(row["Total Time (ns)"]), int(row["Count"])] for row in nsys_stats(path, "gpumemtimesum")
    }
    assert dict(ours_mem) == theirs_mem
    # and the summary's Memory row is their total
    assert a.agg().summary["kernels"]["memory"]["gpu_time"] == sum(v[0] for v in theirs_mem.values())


@pytest.mark.slow
def test_nvtxsum_range_durations(generated):
    for path in generated:
        a = analyze(path)
        ranges = a.trace.ranges
        ours = defaultdict(int)
        for text, d in zip(ranges["text"].astype(str), (ranges["end"] - ranges["start"]).to_numpy()):
            ours[text] += int(d)
        theirs = {row["Range"]: int(row["Total Time (ns)"]) for row in nsys_stats(path, "nvtxsum")}
        assert dict(ours) == theirs


@pytest.mark.slow
def test_nvtxkernsum_attribution_at_every_level(generated):
    for path in generated:
        a = analyze(path)
        trace = a.trace
        ranges, api, gpu = trace.ranges, trace.api_calls, trace.gpu
        forest = RangeForest(
            ranges["global_tid"].to_numpy(),
            ranges["start"].to_numpy(),
            ranges["end"].to_numpy(),
            ranges["range_id"].to_numpy(),
        )
        keys = ThreadTimeKeys(
            [ranges["global_tid"].to_numpy(), api["global_tid"].to_numpy()],
            [ranges["start"].to_numpy(), ranges["end"].to_numpy(), api["start"].to_numpy()],
        )
        innermost = forest.innermost_at(keys, api["global_tid"].to_numpy(), api["start"].to_numpy())
        texts = ranges["text"].astype(str).to_numpy()
        ours = defaultdict(int)
        for k, api_row in enumerate(a.corr.gpu_api):
            r = innermost[api_row]
            if r < 0:  # nsys lists kernels launched outside every range under "None"
                ours[("None", str(gpu["name"].iloc[k]))] += int(gpu["end"].iloc[k] - gpu["start"].iloc[k])
            while r >= 0:  # the kernel counts for its range and every range around it
                ours[(texts[r], str(gpu["name"].iloc[k]))] += int(gpu["end"].iloc[k] - gpu["start"].iloc[k])
                r = forest.parent[r]
        theirs = defaultdict(int)
        for row in nsys_stats(path, "nvtxkernsum"):  # rows are per (range, process, thread, kernel)
            theirs[(row["NVTX Range"], row["Kernel Name"])] += int(row["Total Time (ns)"])
        theirs = dict(theirs)
        assert dict(ours) == theirs
        # leaf ranges are op instances of this marker-free profile: their accumulated kernel time agrees
        dm = a.domain()
        inst = dm.instances
        kernel_time = np.bincount(dm.gpu_instance, weights=(gpu["end"] - gpu["start"]).to_numpy(), minlength=len(inst))
        leaf = set(np.flatnonzero(np.bincount(forest.parent[forest.parent >= 0], minlength=len(ranges)) == 0))
        row_of_range = {rid: i for i, rid in enumerate(ranges["range_id"])}
        checked = 0
        for i, rid in enumerate(inst["range_id"]):
            if rid >= 0 and row_of_range[rid] in leaf:
                text = texts[row_of_range[rid]]
                assert kernel_time[i] == sum(v for (t, _), v in theirs.items() if t == text)
                checked += 1
        assert checked > 0
