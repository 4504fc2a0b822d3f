"""Capture: run the user's command under Nsight Systems, find what nsys wrote, then analyse it.

`dlprof [options] <command>` lands in `profile_and_analyze(args)`:

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
4. runs the same analysis as `dlprof --database`, and returns the command's exit status.
"""

from __future__ import annotations

import codecs
import importlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from dlprof_profiler import log
from dlprof_profiler.capture import torch_startup
from dlprof_profiler.errors import DLProfError

MIN_NSYS_VERSION = (2020, 3)
INSTALL_HINT = (
    "install Nsight Systems 2020.3 or newer and put `nsys` on PATH: `apt-get install nsight-systems` "
    "(Debian non-free, Ubuntu multiverse) or NVIDIA's installer from "
    "https://developer.nvidia.com/nsight-systems"
)
REQUIRED_TRACE = ("cuda", "nvtx")  # DLProf's analysis needs both; user --nsys_opts can add, never remove
REPORT_SUFFIXES = (".nsys-rep", ".qdrep")
NSYS_SUFFIXES = REPORT_SUFFIXES + (".qdstrm", ".sqlite")

# Options assumed present when `nsys profile --help` cannot be read (every supported nsys has them).
_ASSUMED_OPTIONS = frozenset(
    {
        "trace",
        "sample",
        "output",
        "force-overwrite",
        "delay",
        "duration",
        "capture-range",
        "export",
        "cpuctxsw",
        "cudabacktrace",
    }
)
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


@dataclass(frozen=True)
class NsysInfo:
    """What dlprof knows about the nsys it will run."""

    path: str
    version: str  # "2022.4.2.1"
    options: frozenset = field(default_factory=frozenset)  # long options of `nsys profile --help`
    help_text: str = ""
    build: str = ""  # "2022.4.2.1-df9881f" (with its build suffix)

    @property
    def version_tuple(self) -> tuple:
        return version_tuple(self.version)

    def supports(self, option: str) -> bool:
        """Whether `nsys profile` takes --option (assumed for the basics when the help was unreadable)."""
        if self.options:
            return option in self.options
        return option in _ASSUMED_OPTIONS

    @property
    def pytorch_autograd(self) -> bool:
        """Whether `--pytorch=autograd-nvtx` exists (nsys 2023.x and newer)."""
        return self.supports("pytorch") and "autograd-nvtx" in self.help_text

    @property
    def report_suffix(self) -> str:
        """The report extension this nsys writes: `.qdrep` before 2021.4, `.nsys-rep` since."""
        return ".nsys-rep" if self.version_tuple >= (2021, 4) else ".qdrep"


def parse_nsys_version(text: str) -> str | None:
    """The version in `nsys --version` output: "NVIDIA Nsight Systems version 2022.4.2.1-df9881f" -> "2022.4.2.1"."""
    match = re.search(r"\b(20\d\d\.\d+(?:\.\d+)*)", text or "")
    return match.group(1) if match else None


def parse_nsys_build(text: str) -> str | None:
    """The version with its build suffix: "... version 2022.4.2.1-df9881f" -> "2022.4.2.1-df9881f"."""
    match = re.search(r"\b(20\d\d\.\d+(?:\.\d+)*(?:-[0-9A-Za-z]+)?)", text or "")
    return match.group(1) if match else None


def version_tuple(version: str) -> tuple:
    """ "2022.4.2.1" -> (2022, 4, 2, 1); unparsable parts end the tuple."""
    parts = []
    for piece in (version or "").split("."):
        if not piece.isdigit():
            break
        parts.append(int(piece))
    return tuple(parts)


def profile_options(help_text: str) -> frozenset:
    """Long option names listed by `nsys profile --help` ("\t-t, --trace=" -> "trace")."""
    names = re.findall(r"(?m)^\s*(?:-\w,\s*)?--([a-z0-9][a-z0-9-]*)", help_text or "")
    return frozenset(names)


def find_nsys() -> str:
    """Path of `nsys` on PATH, or a one-line error saying how to install it."""
    path = shutil.which("nsys")
    if not path:
        raise DLProfError(f"Nsight Systems (nsys) is not on PATH; {INSTALL_HINT}")
    return path


def nsys_version(nsys: str = "nsys", build: bool = False) -> str:
    """Run `nsys --version` and return the version ("2022.4.2.1"; with `build`: "2022.4.2.1-df9881f")."""
    try:
        done = subprocess.run(
            [nsys, "--version"], stdin=subprocess.DEVNULL, capture_output=True, text=True, errors="replace", timeout=120
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise DLProfError(f"{nsys} --version failed: {exc}") from None
    version = parse_nsys_version(done.stdout + done.stderr)
    if done.returncode != 0 or not version:
        said = _last_line(done.stdout + done.stderr) or f"exit status {done.returncode}"
        raise DLProfError(f"{nsys} --version did not give a version ({said}); {INSTALL_HINT}")
    return (parse_nsys_build(done.stdout + done.stderr) or version) if build else version


def probe_nsys() -> NsysInfo:
    """Find nsys, check its version, and read which `nsys profile` options it has."""
    path = find_nsys()
    build = nsys_version(path, build=True)
    version = parse_nsys_version(build)
    if version_tuple(version) < MIN_NSYS_VERSION:
        raise DLProfError(
            f"{path} is Nsight Systems {version}, older than {'.'.join(map(str, MIN_NSYS_VERSION))}; {INSTALL_HINT}"
        )
    try:
        done = subprocess.run(
            [path, "profile", "--help"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=120,
        )
        help_text = done.stdout + done.stderr
    except (OSError, subprocess.TimeoutExpired):
        help_text = ""  # fall back to the options every supported nsys has
    return NsysInfo(path=path, version=version, options=profile_options(help_text), help_text=help_text, build=build)


def find_qdstrm_importer(nsys_path: str) -> str | None:
    """QdstrmImporter of this nsys install: beside nsys or in the sibling host-linux-x64 folder.

    Follows the symlink chain (/usr/bin/nsys -> .../bin/nsys -> .../target-linux-x64/nsys) because the
    importer sits next to one of the links, not next to the real file, depending on the installer.
    """
    seen, todo = [], [Path(nsys_path)]
    while todo:
        path = todo.pop(0)
        if path in seen:
            continue
        seen.append(path)
        if path.is_symlink():
            todo.append(path.parent / os.readlink(path))
    seen.append(Path(os.path.realpath(nsys_path)))
    for path in seen:
        for candidate in (path.parent / "QdstrmImporter", path.parent.parent / "host-linux-x64" / "QdstrmImporter"):
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return str(candidate)
    return shutil.which("QdstrmImporter")


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


def build_nsys_command(args, nsys_info: NsysInfo, launcher=None) -> list:
    """The `nsys profile` command line for these dlprof options (pure).

    DLProf's needs stay whatever --nsys_opts says (`-t` keeps cuda,nvtx, the export keeps sqlite, the
    report goes to --output_path/--nsys_base_name); for every other option the user's value wins over
    dlprof's default. `launcher` (a list) goes before the user's command, which follows untouched.
    """
    user = parse_nsys_opts(getattr(args, "nsys_opts", "") or "")
    user_names = {opt.name for opt in user}
    if "output" in user_names:
        raise DLProfError(
            "--nsys_opts: do not set -o/--output; the report goes to --output_path as --nsys_base_name", exit_code=2
        )
    detailed = bool(getattr(args, "detailed_mode", False))
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
    delay, duration = getattr(args, "delay", None), getattr(args, "duration", None)
    if delay and "delay" not in user_names:
        cmd += ["-y", _whole_seconds(delay, "--delay")]
    if duration and "duration" not in user_names:
        cmd += ["-d", _whole_seconds(duration, "--duration")]
    if getattr(args, "nsys_profile_range", False):
        if "capture-range" not in user_names:
            cmd += ["-c", "cudaProfilerApi"]
        if nsys_info.supports("capture-range-end") and "capture-range-end" not in user_names:
            # nsys's default (stop-shutdown) kills the program at cudaProfilerStop; let it run to its end.
            cmd += ["--capture-range-end=stop"]
    if getattr(args, "mode", None) == "pytorch" and nsys_info.pytorch_autograd and "pytorch" not in user_names:
        cmd += ["--pytorch=autograd-nvtx"]
    for opt in user:
        if opt.name not in ("trace", "export") or (opt.name == "export" and not nsys_info.supports("export")):
            cmd += opt.words
    if getattr(args, "force", False) and "force-overwrite" not in user_names:
        cmd += ["-f", "true"]
    base = getattr(args, "nsys_base_name", "nsys_profile") or "nsys_profile"
    # nsys expands %p, %h, %q{VAR} in -o; a literal % in the name must be doubled.
    cmd += ["-o", str(output_dir(args) / base.replace("%", "%%"))]
    return cmd + list(launcher or []) + list(args.command)


def output_dir(args) -> Path:
    """--output_path as an absolute path (nsys runs the program elsewhere than dlprof's folder)."""
    return Path(os.path.abspath(os.path.expanduser(getattr(args, "output_path", ".") or ".")))


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


def _run_tool(cmd: list, what: str) -> str:
    """Run an nsys helper to completion; its output is shown at detailed verbosity."""
    log.detail("running " + shlex.join(cmd))
    try:
        done = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, errors="replace")
    except OSError as exc:
        raise DLProfError(f"{what}: cannot run {cmd[0]}: {exc.strerror}") from None
    output = done.stdout + done.stderr
    if output.strip():
        log.detail(collapse_progress(output).strip())
    if done.returncode != 0:
        raise DLProfError(f"{what} failed (exit status {done.returncode}): {_failure_text(output)}")
    return output


def import_qdstrm(qdstrm, report, nsys_info: NsysInfo, force: bool = False) -> Path:
    """Turn a raw `.qdstrm` into a report with the QdstrmImporter of this nsys install."""
    importer = find_qdstrm_importer(nsys_info.path)
    if not importer:
        raise DLProfError(
            f"{qdstrm}: nsys left only this raw capture and QdstrmImporter was not found beside {nsys_info.path}"
        )
    report = Path(report)
    log.info(f"Nsight Systems left only {qdstrm}: importing it with {importer}")
    cmd = [importer, "-i", str(qdstrm), "-o", str(report)]
    if force or report.exists():
        cmd.append("-f")  # an existing name was refused before the capture unless --force: this one is ours
    _run_tool(cmd, f"importing {qdstrm}")
    if not report.is_file():
        raise DLProfError(f"{qdstrm}: QdstrmImporter wrote no report {report}")
    return report


def export_sqlite(report, sqlite_path, nsys_info: NsysInfo, force: bool = False) -> Path:
    """Export a report to SQLite with `nsys export --type sqlite`."""
    sqlite_path = Path(sqlite_path)
    log.info(f"exporting {report} to {sqlite_path}")
    cmd = [nsys_info.path, "export", "--type", "sqlite", "-o", str(sqlite_path)]
    if force or sqlite_path.exists():
        cmd += ["--force-overwrite", "true"]
    cmd.append(str(report))
    _run_tool(cmd, f"exporting {report} to SQLite")
    if not sqlite_path.is_file():
        raise DLProfError(f"{report}: nsys export wrote no {sqlite_path}")
    return sqlite_path


# --------------------------------------------------------------------------------------------- checks


def check_output_path(path: Path) -> None:
    """--output_path must be a writable folder, or creatable; checked before anything is written."""
    path = Path(path)
    if path.exists():
        if not path.is_dir():
            raise DLProfError(f"--output_path {path}: exists and is not a folder")
        if not os.access(path, os.W_OK | os.X_OK):
            raise DLProfError(f"--output_path {path}: folder is not writable")
        return
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise DLProfError(f"--output_path {path}: cannot be created, {parent} is not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise DLProfError(f"--output_path {path}: cannot be created, {parent} is not writable")


def check_existing(paths, force: bool) -> None:
    """Existing outputs are an error unless --force."""
    existing = [Path(p) for p in paths if Path(p).exists()]
    if existing and not force:
        more = f" (and {len(existing) - 1} more outputs)" if len(existing) > 1 else ""
        raise DLProfError(f"{existing[0]}: already exists{more}; use --force to overwrite, or another --output_path")


def resolve_command(command: list) -> str:
    """Path of the program the command runs, or a one-line error (status 127/126 as a shell would)."""
    if not command:
        raise DLProfError("no command to profile", exit_code=2)
    program = command[0]
    path = program if os.sep in program else shutil.which(program)
    if not path or not os.path.exists(path):
        raise DLProfError(f"{program}: command not found", exit_code=127)
    if os.path.isdir(path) or not os.access(path, os.X_OK):
        raise DLProfError(f"{program}: not an executable program", exit_code=126)
    return path


# --------------------------------------------------------------------------------------------- running nsys


@dataclass
class NsysRun:
    """Outcome of the nsys process."""

    returncode: int
    output: str
    signal: int | None = None  # first signal dlprof received (and forwarded) while nsys ran
    announced: bool = False  # whether the command's end was already reported while nsys wrote


def collapse_progress(text: str) -> str:
    """Keep the last state of each line that nsys redraws with carriage returns (its progress bars)."""
    return "\n".join(line.rstrip("\r").rsplit("\r", 1)[-1] for line in (text or "").split("\n"))


def _isatty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _last_line(text: str) -> str:
    lines = [line.strip() for line in (text or "").replace("\r", "\n").splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _failure_text(text: str) -> str:
    """The line of nsys output that says what went wrong (else its last line)."""
    lines = [line.strip() for line in (text or "").replace("\r", "\n").splitlines() if line.strip()]
    for line in lines:
        if re.search(r"error|illegal|unrecognis|unrecogniz|invalid|failed|not found|cannot|unable", line, re.I):
            return line
    return lines[-1] if lines else "no output"


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


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
                f"{_signal_name(signum)}: stopping the command; Nsight Systems is writing the report "
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
                    f"the command ended ({_describe_status(_read_status(status_file))}); "
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


def _read_status(path: Path) -> int | None:
    try:
        return int(Path(path).read_text().strip())
    except (OSError, ValueError):
        return None


def _describe_status(status: int | None) -> str:
    if status is None:
        return "exit status unknown"
    if status > 128 and status - 128 < signal.NSIG:
        return f"exit status {status}, ended by {_signal_name(status - 128)}"
    return f"exit status {status}"


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


def command_environment(args, base: dict | None = None) -> dict:
    """The environment nsys and the command run in: dlprof's, plus the startup hook that annotates PyTorch
    (NVTX markers, `auto` backend: on only while a profiler is attached) unless --pytorch_init=false."""
    init = torch_startup.init_config("auto") if getattr(args, "pytorch_init", True) else None
    return torch_startup.environment(init=init, base=base)


def _pipeline():
    """The analysis engine (imported late: the capture checks must not need pandas)."""
    return importlib.import_module("dlprof_profiler.run.single")


def profile_and_analyze(args) -> int:
    """Profile `args.command` with Nsight Systems, analyse the capture; return the command's exit status."""
    nsys_info = probe_nsys()
    out = output_dir(args)
    base = getattr(args, "nsys_base_name", "nsys_profile") or "nsys_profile"
    force = bool(getattr(args, "force", False))
    check_output_path(out)
    try:
        pipeline = _pipeline()
    except ImportError as exc:
        raise DLProfError(f"the analysis engine cannot be loaded: {exc}") from None
    planned = [Path(p) for p in pipeline.planned_outputs(args)] + nsys_output_paths(out, base)
    check_existing(planned, force)
    resolve_command(args.command)
    shown_cmd = build_nsys_command(args, nsys_info)  # validates --nsys_opts before anything is written

    out.mkdir(parents=True, exist_ok=True)
    log.info(f"Nsight Systems {nsys_info.version}: {shlex.join(shown_cmd)}")
    if getattr(args, "pytorch_init", True):
        log.info("PyTorch is annotated when the command imports it (ops named by module; --pytorch_init=false: off)")
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="dlprof-") as tmp:
        status_file = Path(tmp) / "exit_status"
        stdio = _stdio_fds()
        try:
            # The launcher goes right before the user's command, which ends the command line.
            cmd = (
                shown_cmd[: len(shown_cmd) - len(args.command)]
                + launcher_command(status_file, stdio)
                + list(args.command)
            )
            run = run_nsys(
                cmd,
                show_output=log.verbosity() >= log.INFO,
                pass_fds=[fd for fd in stdio if fd is not None],
                status_file=status_file,
                env=command_environment(args),
            )
        finally:
            for fd in stdio:
                if fd is not None:
                    os.close(fd)
        status = _read_status(status_file)
    command_ran = status is not None
    if status is None:
        # The launcher did not finish (killed with SIGKILL, or nsys never started it): nsys's own status
        # is the best we have.
        status = run.returncode
    if command_ran and not run.announced:
        log.info(f"the command ended ({_describe_status(status)})")
    if command_ran and status - 128 == signal.SIGTERM and getattr(args, "duration", None):
        log.info("(nsys ends the command with SIGTERM when --duration has elapsed)")

    outputs = find_outputs(out, base, since=started - 2.0, extra=generated_paths(run.output))
    report, sqlite_path = outputs["report"], outputs["sqlite"]
    if sqlite_path is None:
        if report is None and outputs["qdstrm"] is not None:
            report = import_qdstrm(outputs["qdstrm"], out / f"{base}{nsys_info.report_suffix}", nsys_info, force)
        if report is None:
            ran = f"; the command ended with {_describe_status(status)}" if command_ran else ""
            raise DLProfError(
                f"Nsight Systems wrote no report in {out} (nsys exit status {run.returncode}: "
                f"{_failure_text(run.output)}){ran}"
            )
        sqlite_path = export_sqlite(report, out / f"{base}.sqlite", nsys_info, force)
    if report is not None and report.parent != out:
        log.warning(f"Nsight Systems wrote the report to {report}, not into {out}")
    log.info(f"capture: {report or '(no report file)'}, {sqlite_path}")

    capture = {
        "command": list(args.command),
        "nsys_version": nsys_info.version,
        "nsys_build": nsys_info.build or nsys_info.version,
        "nsys_command": shown_cmd,
        "report_path": str(report) if report else "",
        "sqlite_path": str(sqlite_path),
        "exit_status": int(status),
        "interrupted": run.signal is not None,
    }
    code = pipeline.run_analysis(Path(sqlite_path), args, capture=capture)
    if code:
        return code
    if run.signal is not None:
        return 128 + run.signal
    return int(status)
