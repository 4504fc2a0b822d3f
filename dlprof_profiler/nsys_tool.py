"""The Nsight Systems command-line tool: where `nsys` is, which version it is, which `nsys profile` options it
has, and the `nsys export` / QdstrmImporter steps that turn a capture into an SQLite export. Used by the capture
(`capture.nsys`, which runs `nsys profile`) and by ingest (`ingest.nsys_report`, which exports the reports users
bring), so that neither imports the other."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from dlprof_profiler import log
from dlprof_profiler.errors import DLProfError

MIN_NSYS_VERSION = (2020, 3)
INSTALL_HINT = (
    "install Nsight Systems 2020.3 or newer and put `nsys` on PATH: `apt-get install nsight-systems` "
    "(Debian non-free, Ubuntu multiverse) or NVIDIA's installer from "
    "https://developer.nvidia.com/nsight-systems"
)


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
        said = last_line(done.stdout + done.stderr) or f"exit status {done.returncode}"
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


def run_tool(cmd: list, what: str) -> str:
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
        raise DLProfError(f"{what} failed (exit status {done.returncode}): {failure_text(output)}")
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
    run_tool(cmd, f"importing {qdstrm}")
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
    run_tool(cmd, f"exporting {report} to SQLite")
    if not sqlite_path.is_file():
        raise DLProfError(f"{report}: nsys export wrote no {sqlite_path}")
    return sqlite_path


def collapse_progress(text: str) -> str:
    """Keep the last state of each line that nsys redraws with carriage returns (its progress bars)."""
    return "\n".join(line.rstrip("\r").rsplit("\r", 1)[-1] for line in (text or "").split("\n"))


def last_line(text: str) -> str:
    lines = [line.strip() for line in (text or "").replace("\r", "\n").splitlines() if line.strip()]
    return lines[-1] if lines else ""


def failure_text(text: str) -> str:
    """The line of nsys output that says what went wrong (else its last line)."""
    lines = [line.strip() for line in (text or "").replace("\r", "\n").splitlines() if line.strip()]
    for line in lines:
        if re.search(r"error|illegal|unrecognis|unrecogniz|invalid|failed|not found|cannot|unable", line, re.I):
            return line
    return lines[-1] if lines else "no output"
