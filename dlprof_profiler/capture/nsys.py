"""Capture: run the user's command under Nsight Systems and find what nsys wrote.

`dlprof [options] <command>` (nsys backend) lands in `capture(options, planned)`:

1. checks (nothing is written when one fails): nsys on PATH and new enough, the output folder creatable
   and writable, no planned output already there (unless --force), the command exists;
2. runs `nsys profile ... <launcher> <command>`; the launcher is a tiny Python program that hands the
   command dlprof's own stdin/stdout/stderr and records its exit status in a file, because nsys does not
   always pass the status on (it reports its own failures, a signal-killed wrapper, `--kill` endings).
   The command's environment carries dlprof's startup hook (`torch_startup`): a Python program that imports
   torch is annotated as `dlprof_profiler.pytorch.init()` does, with no code change (`--pytorch_init=false`
   turns it off);
3. finds the report and the SQLite export whatever this nsys version named them, importing a lone
   `.qdstrm` (QdstrmImporter) and exporting SQLite (`nsys export`) when nsys did not;
4. returns the export with what the database records of the capture and the command's exit status; the CLI
   then runs the same analysis as `dlprof --database` on it.

What nsys is and how a report is exported is `nsys_tool`'s; what both backends check is `capture.command`'s.
"""

from __future__ import annotations

import codecs
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from dlprof_profiler import log
from dlprof_profiler.capture import torch_startup
from dlprof_profiler.capture.command import (
    Captured,
    check_existing,
    check_output_path,
    describe_status,
    output_dir,
    read_status,
    resolve_command,
    signal_name,
)
from dlprof_profiler.errors import DLProfError
from dlprof_profiler.nsys_tool import (
    NsysInfo,
    collapse_progress,
    export_sqlite,
    failure_text,
    import_qdstrm,
    probe_nsys,
)
from dlprof_profiler.options import DEFAULT_NSYS_BASE_NAME, RunOptions

REQUIRED_TRACE = ("cuda", "nvtx")  # DLProf's analysis needs both; user --nsys_opts can add, never remove
REPORT_SUFFIXES = (".nsys-rep", ".qdrep")
NSYS_SUFFIXES = REPORT_SUFFIXES + (".qdstrm", ".sqlite")

# Short nsys profile options and their long names, to merge the user's --nsys_opts by meaning.
_SHORT_OPTIONS = {
    "t": "trace",
    "s": "sample",
    "o": "output",
    "f": "force-overwrite",
    "y": "delay",
    "d": "duration",
    "c": "capture-range",
    "w": "show-output",
    "x": "stop-on-exit",
    "b": "backtrace",
    "e": "env-var",
    "n": "inherit-environment",
    "p": "nvtx-capture",
    "h": "help",
}
_INTERRUPTS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

# The launcher nsys starts instead of the command (run as `python -I -S -c LAUNCHER status fds cmd...`).
# - It puts dlprof's own stdin/stdout/stderr (passed as inherited fds) back on 0/1/2, so the program talks
#   to the user's terminal directly (line-buffered, visible even when nsys's chatter is hidden).
# - nsys signals the whole process group (Ctrl-C forwarding, `--duration`/`--kill` endings): the launcher
#   catches those signals so that it outlives the program and can record how the program ended; the
#   program itself gets default signal handling back at exec.
# - The status file is written whole (rename) so a reader never sees half a number.
LAUNCHER = r"""
import os, signal, sys
status_file, fds, command = sys.argv[1], sys.argv[2].split(","), sys.argv[3:]
for target, fd in enumerate(fds):
    if fd.isdigit():
        try:
            os.dup2(int(fd), target)
            os.close(int(fd))
        except OSError:
            pass
for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT"):
    signal.signal(getattr(signal, name), lambda *_: None)
pid = os.fork()
if pid == 0:
    for name in ("SIGPIPE", "SIGXFSZ"):   # Python ignores these; an ignored signal would stay ignored
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_DFL)
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        sys.stderr.write("dlprof: cannot run %s: %s\n" % (command[0], exc.strerror))
        os._exit(127 if isinstance(exc, FileNotFoundError) else 126)
while True:
    try:
        _, status = os.waitpid(pid, 0)
        break
    except InterruptedError:
        pass
code = os.waitstatus_to_exitcode(status)
code = 128 - code if code < 0 else code
with open(status_file + ".tmp", "w") as out:
    out.write("%d\n" % code)
os.replace(status_file + ".tmp", status_file)
os._exit(code)
"""


# --------------------------------------------------------------------------------------------- nsys itself


# ------------------------------------------------------------------------------------- building the command


@dataclass
class NsysOption:
    """One option of the user's --nsys_opts: its long name (no dashes) or None, value, original words."""

    name: str | None
    value: str | None
    words: list


def parse_nsys_opts(text: str) -> list:
    """Split --nsys_opts into options, recognising `--name=value`, `--name value`, `-x value` and `-xvalue`."""
    try:
        words = shlex.split(text or "")
    except ValueError as exc:
        raise DLProfError(f"--nsys_opts: {exc}", exit_code=2) from None
    options, i = [], 0
    while i < len(words):
        word = words[i]
        if not word.startswith("-") or word in ("-", "--"):
            raise DLProfError(
                f"--nsys_opts: '{word}' is not an nsys option (put the command after the "
                f"options, not inside --nsys_opts)",
                exit_code=2,
            )
        if word.startswith("--"):
            name, has_value, value = word[2:].partition("=")
        else:
            name, has_value, value = _SHORT_OPTIONS.get(word[1], word[1:2]), len(word) > 2, word[2:].lstrip("=")
        if has_value:
            options.append(NsysOption(name, value, [word]))
            i += 1
        elif i + 1 < len(words) and not words[i + 1].startswith("-"):
            options.append(NsysOption(name, words[i + 1], [word, words[i + 1]]))
            i += 2
        else:  # a bare flag such as --help; pass it on untouched
            options.append(NsysOption(name, None, [word]))
            i += 1
    return options


def _merge_list(required, user_values) -> str:
    """Comma list: DLProf's required values first, then the user's others, without 'none' or repeats."""
    merged = list(required)
    for value in user_values:
        for item in (value or "").split(","):
            item = item.strip()
            if item and item != "none" and item not in merged:
                merged.append(item)
    return ",".join(merged)


def _whole_seconds(value, option: str) -> str:
    """nsys takes whole seconds for --delay/--duration; round a fraction up and say so."""
    value = float(value)
    whole = int(-(-value // 1))
    if whole != value:
        log.warning(f"{option} {value:g}: Nsight Systems takes whole seconds, using {whole}")
    return str(whole)


def build_nsys_command(options: RunOptions, nsys_info: NsysInfo, launcher=None) -> list:
    """The `nsys profile` command line for these dlprof options (pure).

    DLProf's needs stay whatever --nsys_opts says (`-t` keeps cuda,nvtx, the export keeps sqlite, the
    report goes to --output_path/--nsys_base_name); for every other option the user's value wins over
    dlprof's default. `launcher` (a list) goes before the user's command, which follows untouched.
    """
    user = parse_nsys_opts(options.nsys_opts or "")
    user_names = {opt.name for opt in user}
    if "output" in user_names:
        raise DLProfError(
            "--nsys_opts: do not set -o/--output; the report goes to --output_path as --nsys_base_name", exit_code=2
        )
    detailed = options.detailed_mode
    cmd = [nsys_info.path, "profile"]

    required_trace = REQUIRED_TRACE + (("osrt",) if detailed else ())
    cmd += ["-t", _merge_list(required_trace, [o.value for o in user if o.name == "trace"])]
    if "sample" not in user_names:
        # No CPU sampling by default: DLProf does not use it, and it costs overhead.
        cmd += ["-s", "process-tree" if detailed else "none"]
    if nsys_info.supports("cpuctxsw") and "cpuctxsw" not in user_names:
        # Thread-scheduling trace is unused by DLProf, and with nsys 2022.4 on recent kernels its perf
        # events make the nsys agent spin forever after the program exits ("Generating ...qdstrm" hangs).
        cmd += ["--cpuctxsw=none"]
    if detailed and nsys_info.supports("cudabacktrace") and "cudabacktrace" not in user_names:
        cmd += ["--cudabacktrace=all"]
    if detailed and nsys_info.supports("cuda-memory-usage") and "cuda-memory-usage" not in user_names:
        cmd += ["--cuda-memory-usage=true"]  # CUDA_GPU_MEMORY_USAGE_EVENTS: the memory report (memory.py)
    if nsys_info.supports("export"):
        cmd += ["--export=" + _merge_list(("sqlite",), [o.value for o in user if o.name == "export"])]
    delay, duration = options.delay, options.duration
    if delay and "delay" not in user_names:
        cmd += ["-y", _whole_seconds(delay, "--delay")]
    if duration and "duration" not in user_names:
        cmd += ["-d", _whole_seconds(duration, "--duration")]
    if options.nsys_profile_range:
        if "capture-range" not in user_names:
            cmd += ["-c", "cudaProfilerApi"]
        if nsys_info.supports("capture-range-end") and "capture-range-end" not in user_names:
            # nsys's default (stop-shutdown) kills the program at cudaProfilerStop; let it run to its end.
            cmd += ["--capture-range-end=stop"]
    if options.mode == "pytorch" and nsys_info.pytorch_autograd and "pytorch" not in user_names:
        cmd += ["--pytorch=autograd-nvtx"]
    for opt in user:
        if opt.name not in ("trace", "export") or (opt.name == "export" and not nsys_info.supports("export")):
            cmd += opt.words
    if options.force and "force-overwrite" not in user_names:
        cmd += ["-f", "true"]
    base = options.nsys_base_name or DEFAULT_NSYS_BASE_NAME
    # nsys expands %p, %h, %q{VAR} in -o; a literal % in the name must be doubled.
    cmd += ["-o", str(output_dir(options) / base.replace("%", "%%"))]
    return cmd + list(launcher or []) + list(options.command)


def nsys_output_paths(output_path: Path, base_name: str) -> list:
    """Every name nsys may give the capture in the output folder, whichever version runs."""
    return [Path(output_path) / f"{base_name}{suffix}" for suffix in NSYS_SUFFIXES]


# ----------------------------------------------------------------------------------- finding what nsys wrote


def generated_paths(nsys_output: str) -> list:
    """Absolute capture file paths named in nsys's console output, in order: quoted ones ("Generating
    '/tmp/nsys-report-1a2b.qdstrm'", 'Saved report file to "..."') and the indented list after "Generated:"
    (e.g. /tmp/nsys-report-1a2b.nsys-rep, where nsys 2022.4 writes when the target name is taken)."""
    suffixes = "|".join(re.escape(s) for s in NSYS_SUFFIXES)
    pattern = re.compile(rf"""['"](/[^'"\n]*?(?:{suffixes}))['"]|^[ \t]+(/[^\n]*?(?:{suffixes}))[ \t]*\r?$""", re.M)
    return [Path(quoted or listed) for quoted, listed in pattern.findall(nsys_output or "")]


def find_outputs(output_path, base_name: str, since: float | None = None, extra=()) -> dict:
    """The capture's report, qdstrm and SQLite export, whatever nsys named them.

    Looks for `<base>.<ext>`, numbered variants nsys makes when a name is taken (`<base>.1.nsys-rep`,
    `<base>_1.sqlite`, `<base>1.qdrep`) and the `extra` paths nsys printed. With `since` (a time.time()),
    files last written before it are stale leftovers and ignored. Prefers the plain name, then the newest.
    Returns {"report": Path|None, "qdstrm": Path|None, "sqlite": Path|None}.
    """
    output_path = Path(output_path)
    pattern = re.compile(rf"^{re.escape(base_name)}(?:[._-]?\d+)?(\.nsys-rep|\.qdrep|\.qdstrm|\.sqlite)$")
    candidates = []
    if output_path.is_dir():
        candidates += [p for p in output_path.iterdir() if pattern.match(p.name)]
    candidates += [Path(p) for p in extra]
    found = {"report": [], "qdstrm": [], "sqlite": []}
    for path in candidates:
        try:
            if not path.is_file() or (since is not None and path.stat().st_mtime < since):
                continue
        except OSError:
            continue
        kind = {".qdstrm": "qdstrm", ".sqlite": "sqlite"}.get(path.suffix, "report")
        if path not in found[kind]:
            found[kind].append(path)

    def best(paths):
        if not paths:
            return None
        plain = [p for p in paths if p.parent == output_path and p.stem == base_name]
        return plain[0] if plain else max(paths, key=lambda p: p.stat().st_mtime)

    return {kind: best(paths) for kind, paths in found.items()}


# --------------------------------------------------------------------------------------------- checks


# --------------------------------------------------------------------------------------------- running nsys


@dataclass
class NsysRun:
    """Outcome of the nsys process."""

    returncode: int
    output: str
    signal: int | None = None  # first signal dlprof received (and forwarded) while nsys ran
    announced: bool = False  # whether the command's end was already reported while nsys wrote


def _isatty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _kill_agents(nsys_pid: int) -> None:
    """Stop the nsys agents of our session: they run in their own session, named after the nsys pid."""
    for entry in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            words = entry.read_bytes().split(b"\0")
        except OSError:
            continue
        if b"--start-agent" in words and any(
            w.startswith(b"--session-name=") and w.endswith(b"-%d" % nsys_pid) for w in words
        ):
            try:
                os.kill(int(entry.parent.name), signal.SIGKILL)
            except OSError:
                pass


def run_nsys(
    cmd: list, show_output: bool, pass_fds=(), status_file: Path | None = None, env: dict | None = None
) -> NsysRun:
    """Run nsys in its own process group, echoing its output when `show_output`, and handle interrupts.
    `env`: the environment of nsys and so of the command (default: dlprof's).

    Ctrl-C (or SIGTERM/SIGHUP) is forwarded once to nsys's group; nsys then stops the program and writes
    the report, which we wait for. A second Ctrl-C only says so; a third abandons the capture.
    """
    proc = subprocess.Popen(
        cmd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        pass_fds=tuple(pass_fds),
        env=env,
    )
    chunks = []
    # nsys redraws progress bars with carriage returns: fine on a terminal, hundreds of fragments per line
    # in a log file, where only the last state of each line is kept.
    collapse = not _isatty(sys.stdout)

    def pump():
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        pending = ""
        while True:
            data = os.read(proc.stdout.fileno(), 65536)
            if not data:
                break
            text = decoder.decode(data)
            chunks.append(text)
            if show_output and not collapse:
                sys.stdout.write(text)
                sys.stdout.flush()
            elif show_output:
                complete, newline, pending = (pending + text).rpartition("\n")
                if newline:
                    sys.stdout.write(collapse_progress(complete) + "\n")
                    sys.stdout.flush()
        if show_output and collapse and pending.strip():
            sys.stdout.write(collapse_progress(pending) + "\n")
            sys.stdout.flush()

    reader = threading.Thread(target=pump, name="nsys-output", daemon=True)
    reader.start()

    state = {"signal": None, "count": 0, "abandon": False}

    def on_signal(signum, _frame):
        state["count"] += 1
        if state["signal"] is None:
            state["signal"] = signum
            log.warning(
                f"{signal_name(signum)}: stopping the command; Nsight Systems is writing the report "
                f"(interrupt twice more to abandon it)"
            )
            try:
                os.killpg(proc.pid, signum)
            except OSError:
                pass
        elif state["count"] == 2:
            log.warning("still waiting for Nsight Systems to write the report; interrupt once more to abandon it")
        else:
            state["abandon"] = True

    previous = {}
    if threading.current_thread() is threading.main_thread():
        for signum in _INTERRUPTS:
            previous[signum] = signal.signal(signum, on_signal)
    announced = False
    try:
        while True:
            try:
                returncode = proc.wait(timeout=0.25)
                break
            except subprocess.TimeoutExpired:
                pass
            if state["abandon"]:
                for target in (lambda: os.killpg(proc.pid, signal.SIGKILL), lambda: _kill_agents(proc.pid)):
                    try:
                        target()
                    except OSError:
                        pass
                proc.wait()
                raise DLProfError(
                    "interrupted: the capture was abandoned before Nsight Systems wrote the report",
                    exit_code=128 + (state["signal"] or signal.SIGINT),
                )
            if not announced and status_file is not None and status_file.exists():
                announced = True
                log.info(
                    f"the command ended ({describe_status(read_status(status_file))}); "
                    f"Nsight Systems is writing the report ..."
                )
    finally:
        if proc.poll() is None:  # dlprof itself is failing: do not leave nsys running
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            proc.wait()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        reader.join(timeout=5)  # a daemonised grandchild may hold the pipe open: do not wait for it
    return NsysRun(returncode=returncode, output="".join(chunks), signal=state["signal"], announced=announced)


def _stdio_fds() -> tuple:
    """Duplicates of dlprof's stdin/stdout/stderr for the launcher ("-" where one is closed)."""
    fds = []
    for fd in (0, 1, 2):
        try:
            fds.append(os.dup(fd))
        except OSError:
            fds.append(None)
    return tuple(fds)


def launcher_command(status_file: Path, stdio_fds=()) -> list:
    """The words nsys runs before the user's command: a Python launcher that records the exit status."""
    fds = ",".join(str(fd) if fd is not None else "-" for fd in stdio_fds)
    return [sys.executable, "-I", "-S", "-c", LAUNCHER, str(status_file), fds or "-"]


# --------------------------------------------------------------------------------------------- the whole run


def command_environment(options: RunOptions, base: dict | None = None) -> dict:
    """The environment nsys and the command run in: dlprof's, plus the startup hook that annotates PyTorch
    (NVTX markers, `auto` backend: on only while a profiler is attached) unless --pytorch_init=false."""
    init = torch_startup.init_config("auto") if options.pytorch_init else None
    return torch_startup.environment(init=init, base=base)


def capture(options: RunOptions, planned: list[Path]) -> Captured:
    """Profile `options.command` with Nsight Systems; `planned` are the analysis's outputs, refused (with the
    capture's own) before the command runs unless --force. Returns the SQLite export to analyse."""
    nsys_info = probe_nsys()
    out = output_dir(options)
    base = options.nsys_base_name or DEFAULT_NSYS_BASE_NAME
    check_output_path(out)
    check_existing([Path(p) for p in planned] + nsys_output_paths(out, base), options.force)
    resolve_command(options.command)
    shown_cmd = build_nsys_command(options, nsys_info)  # validates --nsys_opts before anything is written

    out.mkdir(parents=True, exist_ok=True)
    log.info(f"Nsight Systems {nsys_info.version}: {shlex.join(shown_cmd)}")
    if options.pytorch_init:
        log.info("PyTorch is annotated when the command imports it (ops named by module; --pytorch_init=false: off)")
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="dlprof-") as tmp:
        status_file = Path(tmp) / "exit_status"
        stdio = _stdio_fds()
        try:
            # The launcher goes right before the user's command, which ends the command line.
            cmd = (
                shown_cmd[: len(shown_cmd) - len(options.command)]
                + launcher_command(status_file, stdio)
                + list(options.command)
            )
            run = run_nsys(
                cmd,
                show_output=log.verbosity() >= log.INFO,
                pass_fds=[fd for fd in stdio if fd is not None],
                status_file=status_file,
                env=command_environment(options),
            )
        finally:
            for fd in stdio:
                if fd is not None:
                    os.close(fd)
        status = read_status(status_file)
    command_ran = status is not None
    if status is None:
        # The launcher did not finish (killed with SIGKILL, or nsys never started it): nsys's own status
        # is the best we have.
        status = run.returncode
    if command_ran and not run.announced:
        log.info(f"the command ended ({describe_status(status)})")
    if command_ran and status - 128 == signal.SIGTERM and options.duration:
        log.info("(nsys ends the command with SIGTERM when --duration has elapsed)")

    outputs = find_outputs(out, base, since=started - 2.0, extra=generated_paths(run.output))
    report, sqlite_path = outputs["report"], outputs["sqlite"]
    if sqlite_path is None:
        if report is None and outputs["qdstrm"] is not None:
            report = import_qdstrm(
                outputs["qdstrm"], out / f"{base}{nsys_info.report_suffix}", nsys_info, options.force
            )
        if report is None:
            ran = f"; the command ended with {describe_status(status)}" if command_ran else ""
            raise DLProfError(
                f"Nsight Systems wrote no report in {out} (nsys exit status {run.returncode}: "
                f"{failure_text(run.output)}){ran}"
            )
        sqlite_path = export_sqlite(report, out / f"{base}.sqlite", nsys_info, options.force)
    if report is not None and report.parent != out:
        log.warning(f"Nsight Systems wrote the report to {report}, not into {out}")
    log.info(f"capture: {report or '(no report file)'}, {sqlite_path}")

    info = {
        "command": list(options.command),
        "nsys_version": nsys_info.version,
        "nsys_build": nsys_info.build or nsys_info.version,
        "nsys_command": shown_cmd,
        "report_path": str(report) if report else "",
        "sqlite_path": str(sqlite_path),
        "exit_status": int(status),
        "interrupted": run.signal is not None,
    }
    # a signal passed on to nsys ends the run as that signal would have ended dlprof
    return Captured(Path(sqlite_path), info, 128 + run.signal if run.signal is not None else int(status))
