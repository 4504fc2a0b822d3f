"""Overhead of dlprof_profiler.pytorch on a small CPU model's training steps (not a test).

Times the same training step uninstrumented and instrumented, in one process, alternating rounds so
machine noise hits every variant alike, and prints the median time per step and its ratio to the
uninstrumented run:

- ``off``: no instrumentation (torch as shipped);
- ``no-profiler``: ``init()`` as a user runs it outside a profiler (backend auto: nvtx package, no tool
  attached, so wrappers call straight through) - the cost users pay for leaving ``init()`` in;
- ``markers-null``: wrappers build every marker (stack walk, argument description, backward hooks) but
  send them nowhere - the CPU cost of annotation itself;
- ``markers-nvtx``: markers sent through the nvtx package with no tool attached (the NVTX calls are
  no-ops, plus the package's string registration);
- ``markers-libnvtx``: markers sent through the NVTX library by ctypes (what the startup hook uses under
  Nsight Systems), no tool attached;
- ``kineto``: torch.profiler on with shapes and Python stacks, no markers: the torch backend without
  annotation (``--pytorch_init=false``);
- ``kineto+markers``: torch.profiler on with shapes, the markers as ``record_function`` ranges (they carry
  the stacks): the torch backend's default. Its ratio to ``kineto`` is what one op naming on both
  backends costs.

Usage: python benchmarks/bench_pytorch_overhead.py [--steps 30] [--rounds 5] [--batch 32] [--threads 1]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import dlprof_profiler.pytorch as dlprof_pytorch  # noqa: E402
from dlprof_profiler.pytorch.backend import (  # noqa: E402
    LibNvtxBackend,
    NullBackend,
    NvtxBackend,
    RecordFunctionBackend,
)


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = nn.Linear(32 * 8 * 8, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        return self.fc2(x)


def make_step(batch: int):
    torch.manual_seed(0)
    model = SmallCNN()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(batch, 3, 32, 32)
    y = torch.randint(0, 10, (batch,))

    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    return step


def time_steps(step, steps: int) -> float:
    step()  # warm-up (first-call numbering, caches)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - start) / steps


VARIANTS = {
    "off": (None, False),
    "no-profiler": ("auto", False),
    "markers-null": (lambda: NullBackend(enabled=True), False),
    "markers-nvtx": (lambda: NvtxBackend(enabled=True), False),
    "markers-libnvtx": (lambda: LibNvtxBackend(enabled=True), False),
    "kineto": (None, "with_stack"),
    "kineto+markers": (lambda: RecordFunctionBackend(enabled=True), "shapes"),
}


def run_variant(name: str, step, steps: int) -> float:
    spec, kineto = VARIANTS[name]
    with contextlib.ExitStack() as stack:
        if kineto:
            stack.enter_context(torch.profiler.profile(record_shapes=True, with_stack=kineto == "with_stack"))
        if spec is not None:
            stack.enter_context(dlprof_pytorch.instrumented(backend=spec() if callable(spec) else spec))
            if name == "no-profiler" and dlprof_pytorch.is_active():
                print("note: a profiler seems attached; 'no-profiler' measures annotation", file=sys.stderr)
        return time_steps(step, steps)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (1 = least noise)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    step = make_step(args.batch)
    times = {name: [] for name in VARIANTS}
    for _ in range(args.rounds):
        for name in VARIANTS:
            times[name].append(run_variant(name, step, args.steps))
    base = statistics.median(times["off"])
    print(
        "torch %s, batch %d, %d steps x %d rounds, %d thread(s)"
        % (torch.__version__, args.batch, args.steps, args.rounds, args.threads)
    )
    print("%-14s %12s %8s" % ("variant", "ms/step", "ratio"))
    for name in VARIANTS:
        med = statistics.median(times[name])
        print("%-14s %12.3f %8.3f" % (name, med * 1e3, med / base))
    return 0


if __name__ == "__main__":
    sys.exit(main())
