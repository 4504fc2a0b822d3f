"""Capture without Nsight Systems: `dlprof --backend=torch [options] python train.py`.

The user's command runs unchanged with dlprof's startup hook on PYTHONPATH (`torch_startup/
sitecustomize.py`), which, when the program imports torch, annotates it as `dlprof_profiler.pytorch.init()`
does (markers as `record_function` ranges; `--pytorch_init=false` leaves torch alone), starts
torch.profiler, marks iterations at optimizer steps and writes one Kineto trace per profiled process. Then:

1. checks first (nothing is written when one fails): the output folder, no planned output already there
   (unless --force), the command exists, the options make sense for this backend;
2. runs the command with dlprof's own stdin/stdout/stderr; Ctrl-C reaches the program (same terminal
   process group), SIGTERM/SIGHUP sent to dlprof are passed on; the exit status is the program's;
3. moves the trace(s) next to the other outputs (`<base_name>.pt.trace.json.gz`, or one file per process
   as `<base_name>.<pid>.pt.trace.json.gz`) and returns them; the CLI then runs the same analysis as
   `dlprof --database` on them.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from dlprof_profiler import log
from dlprof_profiler.capture import torch_startup
from dlprof_profiler.capture.command import (
    Captured,
    check_existing,
    check_output_path,
    describe_status,
    output_dir,
    resolve_command,
    signal_name,
)
from dlprof_profiler.errors import DLProfError
from dlprof_profiler.options import RunOptions

HOOK_DIR = torch_startup.HOOK_DIR
CAPTURE_ENV = torch_startup.CAPTURE_ENV
TRACE_SUFFIX = ".pt.trace.json.gz"
_FORWARDED = (signal.SIGTERM, signal.SIGHUP)


def trace_path(options: RunOptions) -> Path:
    """Where the trace of a single profiled process goes."""
    return output_dir(options) / f"{options.base_name}{TRACE_SUFFIX}"


def parse_iterations(text: str | None) -> tuple[int, int] | None:
    """`--capture_iterations START:STOP` (optimizer steps counted from 0, inclusive)."""
    if not text:
        return None
    parts = str(text).split(":")
    try:
        first, last = int(parts[0]), int(parts[-1])
    except ValueError:
        raise DLProfError(f"--capture_iterations {text}: expected START:STOP, e.g. 5:9", exit_code=2) from None
    if len(parts) > 2 or first < 0 or last < first:
        raise DLProfError(f"--capture_iterations {text}: expected START:STOP with 0 <= START <= STOP", exit_code=2)
    return first, last


def capture_config(options: RunOptions, folder: Path, started: float) -> dict:
    """What the startup hook needs, as the JSON it reads from DLPROF_TORCH_CAPTURE. Python stacks are recorded
    only without dlprof's markers, which carry the op's stack themselves: torch.profiler's Python tracer
    would record every Python call the annotation makes (5x the events of the LM test script)."""
    detailed = options.detailed_mode
    return {
        "dir": str(folder),
        "t0": started,
        "delay": options.delay or None,
        "duration": options.duration or None,
        "iterations": parse_iterations(options.capture_iterations),
        "with_stack": not options.pytorch_init,
        "profile_memory": detailed,
    }


def command_environment(config: dict, base: dict | None = None, pytorch_init: bool = True) -> dict:
    """The environment of the profiled command: the hook folder first on PYTHONPATH, the capture config and,
    unless `pytorch_init` is off, the annotation of torch with markers torch.profiler records."""
    init = torch_startup.init_config("record_function") if pytorch_init else None
    return torch_startup.environment(init=init, capture=config, base=base)


def check_options(options: RunOptions) -> None:
    if options.capture_iterations and (options.delay or options.duration):
        raise DLProfError(
            "--capture_iterations selects what to record by iterations; do not combine it with --delay or --duration",
            exit_code=2,
        )
    ignored = [
        name
        for name, on in (
            ("--nsys_opts", options.nsys_opts),
            ("--nsys_profile_range", options.nsys_profile_range),
        )
        if on
    ]
    if ignored:
        log.warning(f"{', '.join(ignored)}: Nsight Systems options, ignored by the torch backend")


def run_command(command: list, env: dict) -> tuple[int, int | None]:
    """Run the command; returns (exit status as a shell reports it, first signal dlprof passed on)."""
    proc = subprocess.Popen(command, env=env)
    state = {"signal": None}

    def forward(signum, _frame):
        state["signal"] = state["signal"] or signum
        try:
            proc.send_signal(signum)
        except OSError:
            pass

    previous = {}
    try:
        previous[signal.SIGINT] = signal.signal(signal.SIGINT, lambda *_: None)  # the program gets it too
        for signum in _FORWARDED:
            previous[signum] = signal.signal(signum, forward)
    except ValueError:  # not the main thread: no signal handling
        previous = {}
    try:
        code = proc.wait()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return (128 - code if code < 0 else code), state["signal"]


def traces_folder(options: RunOptions) -> Path:
    """Where the traces go when several processes were profiled (one file per process id)."""
    return output_dir(options) / f"{options.base_name}_torch_traces"


def collect_traces(folder: Path, options: RunOptions) -> list[Path]:
    """Move the written traces next to the outputs: `<base>.pt.trace.json.gz` for one process, else a
    folder `<base>_torch_traces/` with `<pid>.pt.trace.json.gz` per process."""
    found = sorted(p for p in folder.glob(f"*{TRACE_SUFFIX}") if ".partial." not in p.name)
    if len(found) == 1:
        targets = [trace_path(options)]
    elif found:
        target_folder = traces_folder(options)
        check_existing([target_folder], options.force)
        target_folder.mkdir(exist_ok=True)
        for old in target_folder.glob(f"*{TRACE_SUFFIX}"):
            old.unlink()  # --force was given
        targets = [target_folder / p.name for p in found]
    else:
        targets = []
    for source, target in zip(found, targets):
        os.replace(source, target)
    return targets


def capture(options: RunOptions, planned: list[Path], reason: str = "") -> Captured:
    """Profile `options.command` with torch.profiler; `planned` are the analysis's outputs, refused (with the
    trace's own) before the command runs unless --force. Returns the trace(s) to analyse."""
    out = output_dir(options)
    check_output_path(out)
    check_options(options)
    parse_iterations(options.capture_iterations)
    check_existing([Path(p) for p in planned] + [trace_path(options)], options.force)
    resolve_command(options.command)
    out.mkdir(parents=True, exist_ok=True)
    log.info(f"Backend: torch.profiler (Kineto){reason}: {shlex.join(options.command)}")
    started = time.time()
    with tempfile.TemporaryDirectory(prefix=".dlprof-torch-", dir=out) as tmp:
        config = capture_config(options, Path(tmp), started)
        env = command_environment(config, pytorch_init=options.pytorch_init)
        status, forwarded = run_command(list(options.command), env)
        log.info(f"the command ended ({describe_status(status)})")
        if forwarded:
            log.warning(f"{signal_name(forwarded)} was passed on to the command")
        traces = collect_traces(Path(tmp), options)
    if not traces:
        raise DLProfError(
            f"no trace was written: the command did not import torch, ended before collection "
            f"started (--delay, --capture_iterations), or its Python ignores PYTHONPATH (-E/-I); "
            f"the command ended with {describe_status(status)}",
            exit_code=status or 1,
        )
    source = traces[0] if len(traces) == 1 else traces_folder(options)
    if len(traces) > 1:
        log.info(f"{len(traces)} processes were profiled; their traces are analysed together")
    log.info(f"capture: {', '.join(str(t) for t in traces)}")
    info = {
        "backend": "torch",
        "command": list(options.command),
        "trace_paths": [str(t) for t in traces],
        "exit_status": int(status),
        "interrupted": forwarded is not None,
        "capture_iterations": config["iterations"],
        "delay": config["delay"],
        "duration": config["duration"],
    }
    return Captured(Path(source), info, int(status))
