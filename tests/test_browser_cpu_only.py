"""Item 4 of issue 15 on a real CPU-only capture: `dlprof --backend=torch` of examples/pytorch_train_cpu.py (no GPU,
no CUDA), shown in a real headless Chromium inside a real TensorBoard. The Iterations chart stacks the data-loading,
CPU and other classes of each iteration, in the proportions computed straight from the torch.profiler trace: the
DataLoader ranges, and the op ranges outside them (docs/DESIGN.md, "Summary time breakdown")."""

from __future__ import annotations

import gzip
import json
import re
import sys
from decimal import Decimal
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.browser import requires_browser
from tests.profiles import run_dlprof
from tests.test_browser_views import goto, select_run

pytestmark = [pytest.mark.browser, pytest.mark.torch, requires_browser]
torch = pytest.importorskip("torch")

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "pytorch_train_cpu.py"


def _ns(value) -> int:
    return int(Decimal(value) * 1000)  # Kineto's microsecond decimals, exactly


def _union(intervals) -> list[list[int]]:
    out = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def _length(union, a: int, b: int) -> int:
    return sum(max(0, min(e, b) - max(s, a)) for s, e in union)


def _intersection(u, v) -> list[list[int]]:
    i = j = 0
    out = []
    while i < len(u) and j < len(v):
        s, e = max(u[i][0], v[j][0]), min(u[i][1], v[j][1])
        if s < e:
            out.append([s, e])
        if u[i][1] < v[j][1]:
            i += 1
        else:
            j += 1
    return out


def classes_from_trace(trace: Path) -> list[dict]:
    """Per iteration, a ProfilerStep#N range in which an op starts (docs/DESIGN.md "Iterations"): its duration,
    the time DataLoader ranges cover, and the time op ranges (cpu_op events) cover outside them."""
    with gzip.open(trace, "rb") as fh:
        events = [e for e in json.load(fh, parse_float=Decimal)["traceEvents"] if e.get("ph") == "X"]
    span = lambda e: (_ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"]))  # noqa: E731
    steps = sorted(
        span(e) for e in events if e.get("cat") == "user_annotation" and re.fullmatch(r"ProfilerStep#\d+", e["name"])
    )
    loader = _union(
        span(e) for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("enumerate(DataLoader)#")
    )
    ops = _union(span(e) for e in events if e.get("cat") == "cpu_op")
    op_starts = [span(e)[0] for e in events if e.get("cat") == "cpu_op"]
    out = []
    for a, b in steps:
        if not any(a < t < b for t in op_starts):
            continue  # torch.profiler's last step, closed when profiling stops: no iteration
        dataloader = _length(loader, a, b)
        cpu = _length(ops, a, b) - _length(_intersection(ops, loader), a, b)
        out.append({"duration": b - a, "dataloader": dataloader, "cpu": cpu, "other": b - a - dataloader - cpu})
    return out


@pytest.fixture(scope="module")
def env(tmp_path_factory, tensorboard, browser):
    logdir = tmp_path_factory.mktemp("cpu_capture") / "logdir"
    run_dlprof(
        "--backend=torch",
        "--pytorch_init=false",  # torch.profiler's own ops: classes_from_trace reads their cpu_op events
        f"--output_path={logdir / 'cpu'}",
        "--reports=summary",
        "-v",
        "quiet",
        sys.executable,
        str(EXAMPLE),
        "--iterations",
        "6",
    )
    logdir = tensorboard.publish("cpu_only", logdir)
    b = browser.fresh(1600, 1000)
    b.open_dlprof(tensorboard.url, run="cpu_only/cpu/dlprof")
    b.wait_css("#view .view", 30)
    return SimpleNamespace(b=b, trace=logdir / "cpu" / "dlprof.pt.trace.json.gz")


def test_a_cpu_only_capture_shows_its_time_classes(env):
    b = env.b
    expected = classes_from_trace(env.trace)
    assert len(expected) >= 4
    select_run(b, "cpu_only/cpu/dlprof")
    goto(b, "iterations")
    for k, want in enumerate(expected[1:], start=1):  # iteration k is step k (step 0 holds the start-up)
        bar = b.css(f"#iterations-chart g.bar[data-iteration='{k}']")
        heights = b.js(
            "const out = {}; for (const r of arguments[0].querySelectorAll('rect.seg')) "
            "out[r.getAttribute('class').split('seg-')[1]] = Number(r.getAttribute('height')); return out;",
            bar,
        )
        assert {"dataloader", "cpu", "other"} >= set(heights) >= {"cpu", "other"}, heights  # not one grey bar
        # the same pixels per ns for every segment of the bar (drawn at least half a pixel high)
        big = max(("dataloader", "cpu", "other"), key=lambda c: want[c])
        scale = heights[big] / want[big]
        for key in ("dataloader", "cpu", "other"):
            if want[key] == 0:
                assert key not in heights, (k, key)
            else:
                assert heights[key] == pytest.approx(max(0.5, want[key] * scale), rel=1e-6), (k, key)
    assert any(e["dataloader"] > 0 for e in expected)
    legend = {li.get_attribute("data-key") for li in b.all("#iterations-chart .legend li")}
    assert {"dataloader", "cpu", "other"} <= legend
    b.screenshot("cpu_only_capture_iterations.png")
