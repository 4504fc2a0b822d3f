"""Command line: `dlprof [options] <command>` profiles and analyses; `dlprof --database=FILE` analyses."""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import threading
from contextlib import contextmanager
from pathlib import Path

from dlprof_profiler import __version__, log
from dlprof_profiler.capture import nsys as nsys_capture
from dlprof_profiler.capture import torch_profiler as torch_capture
from dlprof_profiler.errors import DLProfError, Interrupted
from dlprof_profiler.options import (
    BACKENDS,
    DEFAULT_REPORTS,
    FORMAT_NAMES,
    MODES,
    OUT_OF_CORE_EVENTS,
    REPORT_NAMES,
    RunOptions,
)
from dlprof_profiler.outputs.publish import OutputFolder, defer_while_held, unstaged
from dlprof_profiler.run import outputs as run_outputs
from dlprof_profiler.run import single as analysis


_TRUE = {"true", "yes", "1", "on"}
_FALSE = {"false", "no", "0", "off"}

# Options taking a value; the splitter must know them to find where the user's command begins.
_VALUE_OPTIONS = {
    "--database",
    "--output_path",
    "--profile_name",
    "--base_name",
    "-v",
    "--verbosity",
    "-m",
    "--mode",
    "--key_node",
    "--key_op",
    "--iter_start",
    "--iter_stop",
    "--nsys_opts",
    "--nsys_base_name",
    "-y",
    "--delay",
    "-d",
    "--duration",
    "--domain",
    "--backend",
    "--capture_iterations",
    "--baseline",
    "--out_of_core",
    "--scheduler",
    "--workers",
}
# Options with an optional boolean value (`--force`, `--force=true`, `-f false`).
_BOOL_OPTIONS = {"-f", "--force", "--dump_model_data", "--nsys_profile_range", "--detailed_mode", "--pytorch_init"}
# Options whose value may be a space-separated list ended by `--`.
_LIST_OPTIONS = {"--reports": REPORT_NAMES, "--formats": FORMAT_NAMES, "--file_formats": FORMAT_NAMES}

MODE_HELP = """\
modes (-m/--mode; detected from the NVTX markers when not given):
  simple       no op analysis: totals and the kernel report only (every kernel is an
               unassociated op named after its launching API call)
  nvtx         generic NVTX ranges: leaf ranges are ops, enclosing ranges their scope path
  pytorch      PyTorch emit_nvtx / dlprof_profiler.pytorch markers: op types, direction
               (fprop/bprop), shapes, stack traces; default key node the optimizer step or
               ProfilerStep#N; when profiling, adds nsys --pytorch=autograd-nvtx if this nsys
               supports it and --nsys_opts does not set --pytorch itself
  tensorflow1  TensorFlow NVTX op ranges (`OpType: node`); default key node global_step
  tensorflow2  same as tensorflow1
  tensorrt     TensorRT layer ranges (domain TensorRT); key node ExecutionContext::execute
"""


def parse_bool(text: str) -> bool:
    value = str(text).strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got '{text}'")


def split_command(argv: list[str]) -> tuple[list[str], list[str]]:
    """Split argv into dlprof's own options and the user's command (first non-option word onwards)."""
    options: list[str] = []
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--":
            return options, argv[i + 1 :]
        if not word.startswith("-") or word == "-":
            return options, argv[i:]
        name, has_value, _ = word.partition("=")
        if name in _LIST_OPTIONS and not has_value:
            allowed = _LIST_OPTIONS[name]
            values = []
            j = i + 1
            while (
                j < len(argv)
                and all(v.strip() in allowed for v in argv[j].split(",") if v.strip())
                and not argv[j].startswith("-")
            ):
                values.append(argv[j])
                j += 1
            if not values:
                raise DLProfError(f"{name} needs a value: one or more of {', '.join(allowed)}")
            options.append(f"{name}={','.join(values)}")
            if j < len(argv) and argv[j] == "--":
                j += 1  # `--reports a b --` ends the list; options may follow, then the command
            i = j
            continue
        if name in _BOOL_OPTIONS and not has_value:
            if i + 1 < len(argv) and argv[i + 1].lower() in _TRUE | _FALSE:
                options.append(f"{name}={argv[i + 1]}")
                i += 2
            else:
                options.append(f"{name}=true")
                i += 1
            continue
        options.append(word)
        if name in _VALUE_OPTIONS and not has_value:
            if i + 1 >= len(argv):
                raise DLProfError(f"option {name} needs a value")
            options[-1] = f"{name}={argv[i + 1]}"  # joined: argparse would read '--stats=true' as an option
            i += 2
            continue
        i += 1
    return options, []


def _list_cut_short(argv: list[str], command: list[str]) -> str | None:
    """The list option (`--reports`) whose space-separated values ended where the command begins, i.e. at a
    word that is not one of its values (`--reports summary bogus --`); None otherwise."""
    j = len(argv) - len(command) - 1
    while j >= 0 and not argv[j].startswith("-"):
        j -= 1
    return argv[j] if j >= 0 and argv[j] in _LIST_OPTIONS else None


def _list_value(allowed, default=None):
    def parse(text: str):
        values = [v.strip() for v in text.replace(" ", ",").split(",") if v.strip()]
        bad = [v for v in values if v not in allowed]
        if bad or not values:
            raise argparse.ArgumentTypeError(
                f"unknown value '{','.join(bad) or text}'; choose from {', '.join(allowed)}"
            )
        return values

    return parse


def _verbosity(text: str) -> int:
    value = text.strip().lower()
    if value in log.LEVELS:
        return log.LEVELS[value]
    if value.isdigit() and int(value) in range(4):
        return int(value)
    raise argparse.ArgumentTypeError("choose from quiet, minimal, info, detailed")


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got '{text}'") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {value}")
    return value


def _positive_int(text: str) -> int:
    value = _non_negative_int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("expected a number >= 1")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got '{text}'") from None
    if value < 0:
        raise argparse.ArgumentTypeError("expected seconds >= 0")
    return value


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, non-zero exit, as every other input error
        raise DLProfError(f"invalid arguments: {message}", exit_code=2)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="dlprof",
        usage="dlprof [options] <training command> [its arguments]\n       dlprof --database=FILE [options]",
        description="Profile a deep-learning training run with Nsight Systems or torch.profiler and report "
        "where the time of each iteration goes, per framework op and per GPU kernel.",
        epilog=MODE_HELP + "\nlists such as --reports take a comma list (--reports=summary,detail) or "
        "space-separated words ended by -- (--reports summary detail --).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        add_help=True,
    )
    p.add_argument("-V", "--version", action="version", version=f"dlprof {__version__}")
    p.add_argument(
        "--database",
        metavar="FILE",
        help="analyse an existing capture instead of profiling: an Nsight Systems SQLite export (also "
        "one DLProf 1.x modified) or report (.nsys-rep, .qdrep: exported with the nsys on PATH), a "
        "torch.profiler (Kineto) trace TRACE.json[.gz] or a folder of them (one per process), or a "
        "database written by this dlprof (not DLProf 1.x's own dlprof_dldb.sqlite: give its "
        "nsys_profile.sqlite instead); recognised by content. Several "
        "profiles, one per rank: a comma list (r0.sqlite,r1.sqlite), a directory or a quoted glob "
        "('report_*.sqlite'); ranks come from the profiles where recorded, else the order given",
    )
    p.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        help="multi-rank analysis on a running Dask distributed cluster (tcp://host:8786) instead of "
        "local processes; the workers must see the profiles and --output_path (a shared "
        "filesystem); needs the 'distributed' package (pip install 'dlprof-profiler[dask]')",
    )
    p.add_argument(
        "--workers",
        type=_positive_int,
        metavar="N",
        help="multi-rank analysis: ranks analysed at once on this machine (default: the number of ranks, "
        "at most the CPU cores)",
    )
    p.add_argument(
        "--output_path", metavar="DIR", default=".", help="folder for every output; created if missing (default: .)"
    )
    p.add_argument(
        "--profile_name",
        metavar="NAME",
        help="name of the TensorBoard run and of the profile in the database (default: the base name)",
    )
    p.add_argument(
        "--base_name",
        metavar="NAME",
        default="dlprof",
        help="prefix of the report and database file names (default: dlprof)",
    )
    p.add_argument(
        "-f",
        "--force",
        type=parse_bool,
        default=False,
        metavar="BOOL",
        help="overwrite existing outputs (default: false)",
    )
    p.add_argument(
        "-v",
        "--verbosity",
        type=_verbosity,
        default=log.INFO,
        metavar="LEVEL",
        help="quiet, minimal, info (default) or detailed",
    )
    p.add_argument("-m", "--mode", choices=MODES, help="framework mode (default: detected)")
    p.add_argument(
        "--reports",
        type=_list_value(REPORT_NAMES),
        metavar="LIST",
        help=f"reports to write: {', '.join(REPORT_NAMES)} (default: {','.join(DEFAULT_REPORTS)})",
    )
    p.add_argument(
        "--formats",
        "--file_formats",
        dest="formats",
        type=_list_value(FORMAT_NAMES),
        metavar="LIST",
        help="report file formats: csv, json (default: csv)",
    )
    p.add_argument(
        "--key_node",
        "--key_op",
        dest="key_node",
        metavar="NAME",
        help="op name, op label, Op ID or NVTX range text that marks the end of an iteration",
    )
    p.add_argument(
        "--iter_start", type=_non_negative_int, metavar="N", help="first iteration to aggregate (default: 0)"
    )
    p.add_argument(
        "--iter_stop",
        type=_non_negative_int,
        metavar="N",
        help="last iteration to aggregate, inclusive (default: the last)",
    )
    p.add_argument(
        "--domain",
        metavar="NAME",
        help="NVTX domain whose ops the reports show (default: the default domain, else the "
        "domain with the most ranges); the database keeps every domain",
    )
    p.add_argument(
        "--baseline",
        metavar="FILE",
        help="also compare with this profile (an nsys export, a torch.profiler trace or a DLProf "
        "database, analysed with the same key node, iteration range and domain): writes the diff "
        "report <base_name>_diff.csv, per op and per kernel the GPU time of both and its change",
    )
    p.add_argument(
        "--dump_model_data",
        type=parse_bool,
        default=False,
        metavar="BOOL",
        help="also write the op model (ops, instances, kernels) as JSON",
    )
    p.add_argument(
        "--out_of_core",
        choices=("auto", "on", "off"),
        default="auto",
        help="analyse an nsys export out of core (staged on disk next to the outputs, memory bounded "
        "whatever its size) or in memory (faster while it fits); auto: out of core from "
        f"{OUT_OF_CORE_EVENTS:,} events (NVTX ranges, CUDA API calls and GPU activities) on",
    )
    g = p.add_argument_group("profiling (ignored with --database)")
    g.add_argument(
        "--backend",
        choices=BACKENDS,
        help="nsys: run the command under Nsight Systems (NVTX ranges, CUDA API calls, GPU kernels); "
        "torch: run it with torch.profiler started by a startup hook, no code change, the trace "
        "written as <base_name>.pt.trace.json.gz (default: nsys when `nsys` is on PATH, else "
        "torch)",
    )
    g.add_argument(
        "--capture_iterations",
        metavar="START:STOP",
        help="torch backend: record only training iterations START..STOP (optimizer steps counted "
        "from 0, inclusive) through torch.profiler's schedule",
    )
    g.add_argument(
        "--nsys_opts",
        metavar="OPTS",
        default="",
        help="extra options for nsys profile, in one quoted string; dlprof keeps the options "
        "it needs (-t cuda,nvtx, export to SQLite)",
    )
    g.add_argument(
        "--nsys_base_name",
        metavar="NAME",
        default="nsys_profile",
        help="base name of the nsys report and its SQLite export (default: nsys_profile)",
    )
    g.add_argument(
        "-y",
        "--delay",
        type=_seconds,
        metavar="SEC",
        help="start collecting SEC seconds after the command starts (torch backend: at the first "
        "module call or optimizer step after that)",
    )
    g.add_argument(
        "-d",
        "--duration",
        type=_seconds,
        metavar="SEC",
        help="collect for SEC seconds, then end the command with SIGTERM (both backends)",
    )
    g.add_argument(
        "--nsys_profile_range",
        type=parse_bool,
        default=False,
        metavar="BOOL",
        help="collect only between cudaProfilerStart and cudaProfilerStop",
    )
    g.add_argument(
        "--detailed_mode",
        type=parse_bool,
        default=False,
        metavar="BOOL",
        help="also collect CUDA backtraces, OS runtime calls and memory allocations (the memory report; "
        "slower, more detail)",
    )
    g.add_argument(
        "--pytorch_init",
        type=parse_bool,
        default=True,
        metavar="BOOL",
        help="annotate a Python command's PyTorch as dlprof_profiler.pytorch.init() does, without a code "
        "change: ops named by the module attribute path, fprop/bprop, shapes (both backends; programs "
        "that never import torch are left alone); false: profile the command as it is",
    )
    return p


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Parse dlprof's options; `command` holds the user's command, untouched."""
    option_words, command = split_command(argv)
    args = build_parser().parse_args(option_words)
    args.command = command
    if args.reports is None:
        args.reports = list(DEFAULT_REPORTS)
    args.reports = _with_diff(args.reports, args.baseline)
    if args.formats is None:
        args.formats = ["csv"]
    if args.profile_name is None:
        args.profile_name = args.base_name
    if args.iter_start is not None and args.iter_stop is not None and args.iter_stop < args.iter_start:
        raise DLProfError(f"--iter_stop {args.iter_stop} is below --iter_start {args.iter_start}", exit_code=2)
    if args.database and command:
        option = _list_cut_short(argv, command)
        if option:
            raise DLProfError(
                f"invalid arguments: {option}: unknown value '{command[0]}'; choose from "
                f"{', '.join(_LIST_OPTIONS[option])}",
                exit_code=2,
            )
        raise DLProfError(
            f"unexpected argument '{command[0]}': give either --database=FILE or a command to profile, not both",
            exit_code=2,
        )
    if not args.database and not command:
        raise DLProfError(
            "nothing to do: give a command to profile or --database=FILE (see dlprof --help)", exit_code=2
        )
    for name in (args.base_name, args.profile_name, args.nsys_base_name):
        if not name or "/" in name or name in (".", ".."):
            raise DLProfError(f"invalid name '{name}': names may not be empty or contain '/'", exit_code=2)
    return args


def _with_diff(reports: list[str], baseline: str | None) -> list[str]:
    """The report list with `all` expanded; the diff is written whenever a baseline is given (`all` includes
    it only then) and cannot be written without one."""
    if "diff" in reports and not baseline:
        raise DLProfError("the diff report needs a baseline to compare with: add --baseline=FILE", exit_code=2)
    if "all" in reports:
        reports = [r for r in REPORT_NAMES if r not in ("all", "diff")]
    reports = [r for r in dict.fromkeys(reports) if r != "diff"]
    return reports + (["diff"] if baseline else [])


def choose_backend(requested: str | None) -> tuple[str, str]:
    """The capture backend and, when it was not asked for, why it was chosen."""
    if requested:
        return requested, ""
    if shutil.which("nsys"):
        return "nsys", " (default: nsys is on PATH; --backend=torch profiles with torch.profiler instead)"
    return "torch", " (default: nsys is not on PATH)"


@contextmanager
def ended_by_signals():
    """SIGTERM and SIGHUP end the run as Ctrl-C does, by unwinding it, so that its staging folder and the
    lock of the output folder go with it (by default they would kill the process where it stands); a second
    signal while it unwinds is ignored, so the cleaning finishes. The capture backends install their own
    handlers while the profiled command runs."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    state = {"ending": False}

    def on_signal(signum, _frame):
        if state["ending"] or defer_while_held(lambda: on_signal(signum, None)):
            return
        state["ending"] = True
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise Interrupted(signum, signal.Signals(signum).name)

    wanted = [getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n)]
    previous = {}
    for signum in wanted:
        if signal.getsignal(signum) is signal.SIG_IGN:
            continue  # started with it ignored (nohup, a background job): kept so
        previous[signum] = signal.signal(signum, on_signal)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def run_options(args: argparse.Namespace) -> RunOptions:
    """The run's options from the parsed command line (the one place a Namespace becomes RunOptions)."""
    return RunOptions(
        database=args.database,
        command=tuple(args.command),
        output_path=args.output_path,
        base_name=args.base_name,
        profile_name=args.profile_name,
        force=bool(args.force),
        verbosity=args.verbosity,
        mode=args.mode,
        key_node=args.key_node or None,
        iter_start=args.iter_start,
        iter_stop=args.iter_stop,
        domain=args.domain,
        baseline=args.baseline,
        out_of_core=args.out_of_core or "auto",
        reports=tuple(args.reports),
        formats=tuple(args.formats),
        dump_model_data=bool(args.dump_model_data),
        scheduler=args.scheduler,
        workers=args.workers,
        backend=args.backend,
        capture_iterations=args.capture_iterations,
        nsys_opts=args.nsys_opts or "",
        nsys_base_name=args.nsys_base_name,
        delay=args.delay,
        duration=args.duration,
        nsys_profile_range=bool(args.nsys_profile_range),
        detailed_mode=bool(args.detailed_mode),
        pytorch_init=bool(args.pytorch_init),
    )


def parse_options(argv: list[str]) -> RunOptions:
    """`dlprof`'s command line as the run's options."""
    return run_options(parse_args(argv))


def profile_then_analyze(options: RunOptions) -> int:
    """`dlprof [options] <command>`: capture with the chosen backend, then analyse what it captured; returns the
    command's exit status (or the analysis's, when that failed)."""
    backend, reason = choose_backend(options.backend)
    planned = run_outputs.planned_outputs(options)  # refused before the command runs, unless --force
    if backend == "torch":
        captured = torch_capture.capture(options, planned, reason)
    else:
        if reason:
            log.info(f"Backend: Nsight Systems{reason}")
        captured = nsys_capture.capture(options, planned)
    return analysis.run_analysis(captured.source, options, captured.info) or captured.status


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `dlprof` console script; returns the exit status."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        options = parse_options(argv)
        log.set_verbosity(options.verbosity)
        with ended_by_signals(), OutputFolder(Path(options.output_path)):  # one run at a time; removed if left empty
            if options.database:
                return analysis.analyze_database(options)
            return profile_then_analyze(options)
    except DLProfError as exc:
        log.error(unstaged(str(exc)))
        return exc.exit_code
    except OSError as exc:  # an output that cannot be written mid-run (disk full, file too large, permissions)
        where = f"{unstaged(str(exc.filename))}: " if exc.filename else ""
        log.error(f"{where}{exc.strerror or exc}")
        return 1
    except Interrupted as exc:
        log.error(f"ended by {exc.name}")
        return 128 + exc.signum
    except KeyboardInterrupt:
        log.error("interrupted")
        return 130
