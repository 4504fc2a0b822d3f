"""Capture: `dlprof [options] <command>` runs the command under Nsight Systems and analyses the capture.

Three kinds of tests:
- pure: the nsys command line, option merging, version parsing, finding what nsys wrote;
- stand-in nsys: a small script named `nsys` on PATH, for the cases the real nsys cannot show on demand
  (it exits 1, leaves only a .qdstrm, is too old, does not pass the exit status on);
- real nsys (`-m nsys`): a CPU-only program emitting NVTX ranges through ctypes libnvToolsExt.so.1, profiled
  end to end. Tests of the capture alone use a stand-in analysis (the CLI's `analysis.run_analysis`).
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
import types
from pathlib import Path

import pytest

from dlprof_profiler import nsys_tool
from dlprof_profiler.capture import nsys as capture
from dlprof_profiler.cli import main as cli
from dlprof_profiler.capture.nsys import build_nsys_command
from dlprof_profiler.nsys_tool import NsysInfo, profile_options
from dlprof_profiler.errors import DLProfError
from dlprof_profiler.run import outputs as run_outputs
from tests.waiting import OutputLines, wait_until

REPO = Path(__file__).resolve().parents[1]

# The option lines of `nsys profile --help` that matter, as nsys 2022.4 prints them.
HELP_2022_4 = """
usage: nsys profile [<args>] [application] [<application args>]
\t-b, --backtrace=
\t-c, --capture-range=
\t--capture-range-end=
\t--cpuctxsw=
\t--cudabacktrace=
\t-d, --duration=
\t--export=<format>[,<format>...]
\t-f, --force-overwrite=
\t-o, --output=
\t-s, --sample=
\t--stats=
\t-t, --trace=
\t-w, --show-output=
\t-y, --delay=
"""
# A newer nsys adds --pytorch.
HELP_2024 = (
    HELP_2022_4
    + """
\t--pytorch=
\t   Possible values are 'autograd-nvtx', 'autograd-shapes-nvtx' or 'none'.
"""
)
# An old nsys without --export, --cpuctxsw and --capture-range-end.
HELP_2020 = "\n".join(
    line
    for line in HELP_2022_4.splitlines()
    if not any(x in line for x in ("--export", "--cpuctxsw", "--capture-range-end"))
)

NSYS_2022 = NsysInfo(
    path="/usr/bin/nsys", version="2022.4.2.1", options=profile_options(HELP_2022_4), help_text=HELP_2022_4
)
NSYS_2024 = NsysInfo(
    path="/usr/bin/nsys", version="2024.6.1.90", options=profile_options(HELP_2024), help_text=HELP_2024
)
NSYS_2020 = NsysInfo(
    path="/opt/nsys/bin/nsys", version="2020.3.4.32", options=profile_options(HELP_2020), help_text=HELP_2020
)


def parse(*argv):
    return cli.parse_options(list(argv))


def nsys_cmd(*argv, info=NSYS_2022):
    return build_nsys_command(parse(*argv), info)


def options_of(cmd, command_len):
    """The nsys options of a built command: between `profile` and the user's command."""
    return cmd[2 : len(cmd) - command_len]


# ------------------------------------------------------------------------------------------- pure: command


def test_default_command_traces_cuda_nvtx_without_sampling_and_exports_sqlite(tmp_path):
    cmd = nsys_cmd(f"--output_path={tmp_path}", "python", "train.py")
    assert cmd == [
        "/usr/bin/nsys",
        "profile",
        "-t",
        "cuda,nvtx",
        "-s",
        "none",
        "--cpuctxsw=none",
        "--export=sqlite",
        "-o",
        str(tmp_path / "nsys_profile"),
        "python",
        "train.py",
    ]


def test_output_is_absolute_and_uses_nsys_base_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cmd = nsys_cmd("--output_path", "runs/a", "--nsys_base_name", "cap", "python", "t.py")
    assert cmd[cmd.index("-o") + 1] == str(tmp_path / "runs" / "a" / "cap")


def test_percent_in_base_name_is_escaped_for_nsys(tmp_path):
    cmd = nsys_cmd(f"--output_path={tmp_path}", "--nsys_base_name=run%1", "python", "t.py")
    assert cmd[cmd.index("-o") + 1] == str(tmp_path / "run%%1")


def test_force_adds_force_overwrite_only_when_given(tmp_path):
    assert "-f" not in nsys_cmd(f"--output_path={tmp_path}", "python", "t.py")
    cmd = nsys_cmd(f"--output_path={tmp_path}", "--force", "python", "t.py")
    assert cmd[cmd.index("-f") : cmd.index("-f") + 2] == ["-f", "true"]
    assert "-f" not in nsys_cmd(f"--output_path={tmp_path}", "--force=false", "python", "t.py")


def test_delay_and_duration(tmp_path):
    opts = options_of(nsys_cmd(f"--output_path={tmp_path}", "-y", "5", "-d", "60", "python", "t.py"), 2)
    assert opts[opts.index("-y") + 1] == "5" and opts[opts.index("-d") + 1] == "60"
    # nsys takes whole seconds only (2022.4 rejects "--delay 0.5"): round up
    opts = options_of(nsys_cmd(f"--output_path={tmp_path}", "--delay=0.5", "--duration=2.5", "python", "t.py"), 2)
    assert opts[opts.index("-y") + 1] == "1" and opts[opts.index("-d") + 1] == "3"
    opts = options_of(nsys_cmd(f"--output_path={tmp_path}", "--delay=0", "python", "t.py"), 2)
    assert "-y" not in opts


def test_profile_range_uses_cuda_profiler_api_and_lets_the_program_finish(tmp_path):
    opts = options_of(nsys_cmd(f"--output_path={tmp_path}", "--nsys_profile_range", "python", "t.py"), 2)
    assert opts[opts.index("-c") + 1] == "cudaProfilerApi"
    assert "--capture-range-end=stop" in opts
    opts = options_of(
        nsys_cmd(f"--output_path={tmp_path}", "--nsys_profile_range=true", "python", "t.py", info=NSYS_2020), 2
    )
    assert opts[opts.index("-c") + 1] == "cudaProfilerApi"
    assert not any(o.startswith("--capture-range-end") for o in opts)


def test_detailed_mode_adds_osrt_sampling_and_backtraces(tmp_path):
    opts = options_of(nsys_cmd(f"--output_path={tmp_path}", "--detailed_mode", "python", "t.py"), 2)
    assert opts[opts.index("-t") + 1] == "cuda,nvtx,osrt"
    assert opts[opts.index("-s") + 1] == "process-tree"
    assert "--cudabacktrace=all" in opts


@pytest.mark.parametrize(
    "user, expected",
    [
        ("-t osrt,cublas", "cuda,nvtx,osrt,cublas"),
        ("--trace=osrt", "cuda,nvtx,osrt"),
        ("--trace osrt", "cuda,nvtx,osrt"),
        ("-tnvtx", "cuda,nvtx"),
        ("-t none", "cuda,nvtx"),  # DLProf's needs stay
        ("-t nvtx,cuda", "cuda,nvtx"),
    ],
)
def test_user_trace_is_merged_and_keeps_cuda_nvtx(tmp_path, user, expected):
    cmd = nsys_cmd(f"--output_path={tmp_path}", f"--nsys_opts={user}", "python", "t.py")
    opts = options_of(cmd, 2)
    assert [o for o in opts if o in ("-t", "--trace") or o.startswith(("--trace", "-t"))] == ["-t"]
    assert opts[opts.index("-t") + 1] == expected


@pytest.mark.parametrize(
    "user, expected",
    [
        ("--export=json", "--export=sqlite,json"),
        ("--export json,hdf", "--export=sqlite,json,hdf"),
        ("--export=none", "--export=sqlite"),
        ("--export=sqlite", "--export=sqlite"),
    ],
)
def test_user_export_is_merged_and_keeps_sqlite(tmp_path, user, expected):
    opts = options_of(nsys_cmd(f"--output_path={tmp_path}", f"--nsys_opts={user}", "python", "t.py"), 2)
    assert [o for o in opts if o.startswith("--export")] == [expected]


def contains(seq, sub):
    """Whether `sub` occurs in `seq` as consecutive items."""
    return any(seq[i : i + len(sub)] == sub for i in range(len(seq) - len(sub) + 1))


@pytest.mark.parametrize(
    "user, dropped",
    [
        ("-s process-tree", ["-s", "none"]),
        ("--sample=process-tree", ["-s", "none"]),
        ("--cpuctxsw=process-tree", ["--cpuctxsw=none"]),
        ("-y 9", ["-y", "1"]),
        ("--duration=7", ["-d", "2"]),
    ],
)
def test_user_values_win_over_dlprof_defaults(tmp_path, user, dropped):
    opts = options_of(
        nsys_cmd(f"--output_path={tmp_path}", "-y", "1", "-d", "2", f"--nsys_opts={user}", "python", "t.py"), 2
    )
    assert not contains(opts, dropped)
    assert contains(opts, user.split())


def test_other_user_options_pass_through_in_order(tmp_path):
    opts = options_of(
        nsys_cmd(f"--output_path={tmp_path}", "--nsys_opts=--stats=true -e A=1,B=2 --wait primary", "python", "t.py"), 2
    )
    i = opts.index("--stats=true")
    assert opts[i : i + 5] == ["--stats=true", "-e", "A=1,B=2", "--wait", "primary"]


@pytest.mark.parametrize("user", ["-o elsewhere", "--output=elsewhere", "python", "-t cuda stray"])
def test_bad_nsys_opts_are_one_line_errors(tmp_path, user):
    with pytest.raises(DLProfError) as err:
        nsys_cmd(f"--output_path={tmp_path}", f"--nsys_opts={user}", "python", "t.py")
    assert err.value.exit_code == 2 and "\n" not in str(err.value) and "--nsys_opts" in str(err.value)


def test_pytorch_mode_adds_autograd_nvtx_only_when_nsys_has_it(tmp_path):
    base = (f"--output_path={tmp_path}", "--mode=pytorch", "python", "t.py")
    assert "--pytorch=autograd-nvtx" in nsys_cmd(*base, info=NSYS_2024)
    assert not any(o.startswith("--pytorch") for o in nsys_cmd(*base, info=NSYS_2022))
    cmd = nsys_cmd(base[0], base[1], "--nsys_opts=--pytorch=none", *base[2:], info=NSYS_2024)
    assert [o for o in cmd if o.startswith("--pytorch")] == ["--pytorch=none"]
    assert "--pytorch=autograd-nvtx" not in nsys_cmd(
        f"--output_path={tmp_path}", "--mode=nvtx", "python", "t.py", info=NSYS_2024
    )


def test_command_environment_carries_the_startup_hook_unless_switched_off():
    """The command (through nsys) gets the hook folder first on PYTHONPATH and the request to annotate PyTorch
    (NVTX, on while a profiler is attached); --pytorch_init=false leaves the environment as it is."""
    from dlprof_profiler.capture import torch_startup

    env = capture.command_environment(parse("python", "train.py"), {"PYTHONPATH": "/mine", "HOME": "/h"})
    assert env["PYTHONPATH"] == str(torch_startup.HOOK_DIR) + os.pathsep + "/mine" and env["HOME"] == "/h"
    assert json.loads(env["DLPROF_PYTORCH_INIT"]) == {"root": str(REPO), "backend": "auto"}
    assert "DLPROF_TORCH_CAPTURE" not in env
    off = parse("--pytorch_init=false", "python", "train.py")
    assert off.pytorch_init is False and parse("python", "x.py").pytorch_init is True
    assert parse("--pytorch_init", "false", "python", "x.py").command == ("python", "x.py")
    assert capture.command_environment(off, {"PYTHONPATH": "/mine"}) == {"PYTHONPATH": "/mine"}
    assert "--pytorch_init" in cli.build_parser().format_help()


def test_old_nsys_without_export_or_cpuctxsw_options(tmp_path):
    opts = options_of(nsys_cmd(f"--output_path={tmp_path}", "python", "t.py", info=NSYS_2020), 2)
    assert not any(o.startswith(("--export", "--cpuctxsw")) for o in opts)
    assert opts[:4] == ["-t", "cuda,nvtx", "-s", "none"]


def test_user_command_is_not_interpreted(tmp_path):
    command = ["python", "train.py", "-o", "x", "--output_path=y", "-t", "none", "--force", "--", "a b", "", "$HOME"]
    cmd = nsys_cmd(f"--output_path={tmp_path}", *command)
    assert cmd[-len(command) :] == command
    assert cmd[cmd.index("-o") + 1] == str(tmp_path / "nsys_profile")


def test_launcher_goes_just_before_the_command(tmp_path):
    args = parse(f"--output_path={tmp_path}", "python", "t.py")
    cmd = build_nsys_command(args, NSYS_2022, launcher=["L1", "L2"])
    assert cmd[-4:] == ["L1", "L2", "python", "t.py"]


EQUALS_FORM = [
    "--output_path=OUT",
    "--nsys_base_name=cap",
    "--delay=3",
    "--duration=20",
    "--nsys_opts=-t osrt",
    "--force=true",
    "--mode=pytorch",
    "--nsys_profile_range=true",
    "--detailed_mode=false",
    "--verbosity=quiet",
]
SPACE_FORM = [
    "--output_path",
    "OUT",
    "--nsys_base_name",
    "cap",
    "-y",
    "3",
    "-d",
    "20",
    "--nsys_opts",
    "-t osrt",
    "-f",
    "true",
    "-m",
    "pytorch",
    "--nsys_profile_range",
    "true",
    "--detailed_mode",
    "false",
    "-v",
    "quiet",
]


def test_option_forms_equals_and_space_give_the_same_command(tmp_path):
    eq = [a.replace("OUT", str(tmp_path)) for a in EQUALS_FORM]
    sp = [a.replace("OUT", str(tmp_path)) for a in SPACE_FORM]
    command = ["python", "train.py", "--lr", "0.1"]
    for info in (NSYS_2022, NSYS_2024):
        assert build_nsys_command(parse(*eq, *command), info) == build_nsys_command(parse(*sp, *command), info)
    cmd = build_nsys_command(parse(*sp, *command), NSYS_2024)
    opts = options_of(cmd, len(command))
    assert opts[opts.index("-t") + 1] == "cuda,nvtx,osrt" and opts[opts.index("-y") + 1] == "3"
    assert opts[opts.index("-d") + 1] == "20" and "-f" in opts and "--pytorch=autograd-nvtx" in opts
    assert opts[opts.index("-o") + 1] == str(tmp_path / "cap") and cmd[-len(command) :] == command


def test_nsys_opts_space_form_with_a_single_option(tmp_path):
    # `--nsys_opts --stats=true`: the value starts with '-' and has no space
    cmd = nsys_cmd("--output_path", str(tmp_path), "--nsys_opts", "--stats=true", "python", "t.py")
    assert "--stats=true" in options_of(cmd, 2) and cmd[-2:] == ["python", "t.py"]


# ------------------------------------------------------------------------------------------- pure: helpers


@pytest.mark.parametrize(
    "text, version",
    [
        ("NVIDIA Nsight Systems version 2022.4.2.1-df9881f\n", "2022.4.2.1"),
        ("NVIDIA Nsight Systems version 2020.3.1.72-5fcd1e1", "2020.3.1.72"),
        ("NVIDIA Nsight Systems version 2024.6.1.90-246160830v0", "2024.6.1.90"),
        ("2019.5.2.16-b54ef97", "2019.5.2.16"),
        ("nsys: command failed", None),
        ("", None),
    ],
)
def test_parse_nsys_version(text, version):
    assert nsys_tool.parse_nsys_version(text) == version


def test_version_tuple_and_report_suffix():
    assert nsys_tool.version_tuple("2022.4.2.1") == (2022, 4, 2, 1)
    assert nsys_tool.version_tuple("2021.3.1.54-ee9c30a") == (2021, 3, 1)
    assert NSYS_2022.report_suffix == ".nsys-rep"
    assert NsysInfo(path="nsys", version="2021.3.1.54").report_suffix == ".qdrep"


def test_profile_options_from_help():
    options = profile_options(HELP_2022_4)
    assert {"trace", "sample", "cpuctxsw", "export", "capture-range-end", "force-overwrite"} <= options
    assert "pytorch" not in options and NSYS_2024.pytorch_autograd and not NSYS_2022.pytorch_autograd
    # unreadable help: assume the basics every supported nsys has
    blind = NsysInfo(path="nsys", version="2022.4.2.1")
    assert blind.supports("export") and blind.supports("cpuctxsw") and not blind.supports("pytorch")


def test_generated_paths_from_nsys_output():
    output = (
        "Failed to create '/out/nsys_profile.nsys-rep': File exists.\r\n"
        "Generating '/tmp/nsys-report-3a4b.qdstrm'\n[1/2] [===100%] nsys_profile.nsys-rep\r\n"
        "Generated:\n    /tmp/nsys-report-62b7.nsys-rep\n    /tmp/nsys-report-e76d.sqlite\n"
        'Saved report file to "/data/run 1/x.qdrep"\n'
    )
    assert capture.generated_paths(output) == [
        Path("/out/nsys_profile.nsys-rep"),
        Path("/tmp/nsys-report-3a4b.qdstrm"),
        Path("/tmp/nsys-report-62b7.nsys-rep"),
        Path("/tmp/nsys-report-e76d.sqlite"),
        Path("/data/run 1/x.qdrep"),
    ]
    assert capture.generated_paths("[1/2] [===100%] nsys_profile.nsys-rep\n") == []


def test_collapse_progress_keeps_the_last_state_of_each_line():
    text = "Generating 'x'\n[1/2] [0%   ] r.nsys-rep\r[1/2] [=50% ] r.nsys-rep\r[1/2] [100%] r.nsys-rep\r\nGenerated:"
    assert capture.collapse_progress(text) == "Generating 'x'\n[1/2] [100%] r.nsys-rep\nGenerated:"


def test_find_outputs_plain_numbered_stale_and_elsewhere(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    assert capture.find_outputs(out, "nsys_profile") == {"report": None, "qdstrm": None, "sqlite": None}
    (out / "nsys_profile.nsys-rep").write_bytes(b"r")
    (out / "nsys_profile.sqlite").write_bytes(b"s")
    (out / "other.sqlite").write_bytes(b"o")
    found = capture.find_outputs(out, "nsys_profile")
    assert found == {"report": out / "nsys_profile.nsys-rep", "qdstrm": None, "sqlite": out / "nsys_profile.sqlite"}
    # files written before the capture started are stale leftovers
    old = time.time() - 3600
    for p in out.iterdir():
        os.utime(p, (old, old))
    since = time.time() - 1
    assert capture.find_outputs(out, "nsys_profile", since=since)["report"] is None
    # numbered names (older nsys when the name was taken), a .qdrep, a lone .qdstrm
    (out / "nsys_profile.1.qdrep").write_bytes(b"r")
    (out / "nsys_profile_2.qdstrm").write_bytes(b"q")
    found = capture.find_outputs(out, "nsys_profile", since=since)
    assert found == {"report": out / "nsys_profile.1.qdrep", "qdstrm": out / "nsys_profile_2.qdstrm", "sqlite": None}
    # a report nsys put elsewhere and named in its output
    elsewhere = tmp_path / "nsys-report-62b7.sqlite"
    elsewhere.write_bytes(b"s")
    assert capture.find_outputs(out, "nsys_profile", since=since, extra=[elsewhere])["sqlite"] == elsewhere


def test_find_qdstrm_importer_beside_nsys_through_symlinks(tmp_path):
    # Debian layout: /usr/bin/nsys -> ../lib/nsight-systems/bin/nsys -> ../target-linux-x64/nsys and the
    # importer in .../nsight-systems/host-linux-x64
    root = tmp_path / "lib" / "nsight-systems"
    for sub in ("bin", "target-linux-x64", "host-linux-x64"):
        (root / sub).mkdir(parents=True)
    (root / "target-linux-x64" / "nsys").write_text("")
    importer = root / "host-linux-x64" / "QdstrmImporter"
    importer.write_text("#!/bin/sh\n")
    importer.chmod(0o755)
    (root / "bin" / "nsys").symlink_to("../target-linux-x64/nsys")
    (tmp_path / "usrbin").mkdir()
    (tmp_path / "usrbin" / "nsys").symlink_to(root / "bin" / "nsys")
    assert nsys_tool.find_qdstrm_importer(str(tmp_path / "usrbin" / "nsys")) == str(importer)
    assert nsys_tool.find_qdstrm_importer(str(root / "target-linux-x64" / "nsys")) is not None


def test_check_output_path(tmp_path):
    capture.check_output_path(tmp_path)
    capture.check_output_path(tmp_path / "new" / "deeper")
    (tmp_path / "file").write_text("x")
    for bad in (tmp_path / "file", tmp_path / "file" / "sub"):
        with pytest.raises(DLProfError) as err:
            capture.check_output_path(bad)
        assert str(bad) in str(err.value) and "not a folder" in str(err.value)


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write into read-only folders")
def test_check_output_path_read_only_folder(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        with pytest.raises(DLProfError, match="not writable"):
            capture.check_output_path(ro / "out")
        with pytest.raises(DLProfError, match="not writable"):
            capture.check_output_path(ro)
    finally:
        ro.chmod(0o755)


# ------------------------------------------------------------------------------------------- the launcher


def run_launcher(tmp_path, command):
    status = tmp_path / "status"
    done = subprocess.run(capture.launcher_command(status) + command, capture_output=True, text=True, timeout=60)
    return done, (status.read_text().strip() if status.exists() else None)


def test_launcher_records_exit_status_and_signals(tmp_path):
    done, status = run_launcher(tmp_path, [sys.executable, "-c", "import sys; sys.exit(7)"])
    assert (done.returncode, status) == (7, "7")
    done, status = run_launcher(
        tmp_path, [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"]
    )
    assert (done.returncode, status) == (143, "143")
    done, status = run_launcher(tmp_path, ["no-such-program-dlprof"])
    assert (done.returncode, status) == (127, "127") and "cannot run no-such-program-dlprof" in done.stderr


def test_launcher_gives_the_program_default_signal_dispositions(tmp_path):
    # Python ignores SIGPIPE; an ignored signal would stay ignored in the program after exec.
    done, _ = run_launcher(tmp_path, ["cat", "/proc/self/status"])
    ignored = int(next(ln for ln in done.stdout.splitlines() if ln.startswith("SigIgn:")).split()[1], 16)
    assert not ignored & (1 << (signal.SIGPIPE - 1))


# ------------------------------------------------------------------------------------------- stand-in engine


class FakePipeline:
    """Stands in for the analysis the CLI runs on a capture (dlprof_profiler.run.single.run_analysis): records
    the call and writes the run's planned outputs."""

    def __init__(self):
        self.calls = []

    def run_analysis(self, source, options, capture=None):
        self.calls.append((Path(source), capture))
        for path in run_outputs.planned_outputs(options):
            path.write_text("fake")
        return 0


@pytest.fixture
def fake_pipeline(monkeypatch):
    fake = FakePipeline()
    monkeypatch.setattr(cli.analysis, "run_analysis", lambda *a, **k: fake.run_analysis(*a, **k))
    return fake


# A runner for subprocess runs of the CLI with the stand-in engine (it writes capture.json).
RUNNER = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from dlprof_profiler.cli import main as cli
    def run_analysis(source, options, capture=None):
        out = Path(options.output_path)
        (out / "dlprof_dldb.sqlite").write_text("fake")
        (out / "capture.json").write_text(json.dumps({"source": str(source), "capture": capture}))
        return 0
    cli.analysis.run_analysis = run_analysis
    sys.exit(cli.main(sys.argv[1:]))
""")


# ------------------------------------------------------------------------------------------- stand-in nsys

STAND_IN = textwrap.dedent('''\
    #!{python}
    """Stand-in nsys: logs its arguments, acts as told by BEHAVIOUR."""
    import json, subprocess, sys
    from pathlib import Path
    B = json.loads({behaviour!r})
    args = sys.argv[1:]
    with open(B["log"], "a") as f:
        f.write(json.dumps(["nsys"] + args) + "\\n")
    if args[:1] == ["--version"]:
        print(B.get("version", "NVIDIA Nsight Systems version 2022.4.2.1-df9881f"))
        sys.exit(0)
    if args[:2] == ["profile", "--help"]:
        print(B.get("help", ""))
        sys.exit(0)
    if args[:1] == ["export"]:
        out = args[args.index("-o") + 1]
        Path(out).write_bytes(b"exported " + args[-1].encode())
        sys.exit(0)
    if args[:1] == ["profile"]:
        i, out = 1, None
        while i < len(args) and args[i].startswith("-"):
            if "=" in args[i]:
                i += 1
            else:
                if args[i] in ("-o", "--output"):
                    out = args[i + 1]
                i += 2
        if B.get("fail"):
            print(B["fail"], file=sys.stderr)
            sys.exit(1)
        if B.get("hang"):
            import signal, time
            for s in (signal.SIGINT, signal.SIGTERM):
                signal.signal(s, signal.SIG_IGN)
            Path(B["log"] + ".hanging").touch()  # signals ignored from here on
            print("profiling", flush=True)
            time.sleep(120)  # the hang under test: an nsys that never ends, however often it is interrupted
        rc = subprocess.call(args[i:])
        for suffix in B.get("writes", [".nsys-rep", ".sqlite"]):
            Path(out + suffix).write_bytes(b"capture")
        for path in B.get("writes_elsewhere", []):
            Path(path).write_bytes(b"capture")
            print("Generated:\\n    " + path)
        sys.exit(B["rc"] if "rc" in B else rc)
    sys.exit(2)
''')

IMPORTER = textwrap.dedent("""\
    #!{python}
    import json, sys
    from pathlib import Path
    args = sys.argv[1:]
    with open({log!r}, "a") as f:
        f.write(json.dumps(["QdstrmImporter"] + args) + "\\n")
    Path(args[args.index("-o") + 1]).write_bytes(b"imported")
""")


class StandIn:
    """An nsys install under tmp: root/bin/nsys and root/host-linux-x64/QdstrmImporter, first on PATH."""

    def __init__(self, tmp_path, monkeypatch, **behaviour):
        self.root = tmp_path / "nsys-standin"
        (self.root / "bin").mkdir(parents=True)
        (self.root / "host-linux-x64").mkdir()
        self.log = self.root / "calls.jsonl"
        behaviour.setdefault("help", HELP_2022_4)
        behaviour["log"] = str(self.log)
        nsys = self.root / "bin" / "nsys"
        nsys.write_text(STAND_IN.format(python=sys.executable, behaviour=json.dumps(behaviour)))
        importer = self.root / "host-linux-x64" / "QdstrmImporter"
        importer.write_text(IMPORTER.format(python=sys.executable, log=str(self.log)))
        for path in (nsys, importer):
            path.chmod(0o755)
        monkeypatch.setenv("PATH", f"{self.root / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}")

    def calls(self):
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    def profile_calls(self):
        return [c for c in self.calls() if c[:2] == ["nsys", "profile"] and c[2:3] != ["--help"]]


def exits_with(status):
    """A command that exits with `status`."""
    return [sys.executable, "-c", f"import sys; sys.exit({status})"]


def test_exit_status_comes_from_the_launcher_when_nsys_does_not_pass_it_on(tmp_path, monkeypatch, fake_pipeline):
    standin = StandIn(tmp_path, monkeypatch, rc=0)  # this nsys always exits 0
    out = tmp_path / "out"
    assert cli.main(["--output_path", str(out), *exits_with(3)]) == 3
    ((source, cap),) = fake_pipeline.calls
    assert source == out / "nsys_profile.sqlite"
    assert cap["exit_status"] == 3 and cap["interrupted"] is False and cap["nsys_version"] == "2022.4.2.1"
    assert cap["command"] == exits_with(3)
    assert cap["nsys_command"][-3:] == exits_with(3) and cap["report_path"] == str(out / "nsys_profile.nsys-rep")
    assert len(standin.profile_calls()) == 1


def test_nsys_failing_is_one_line_and_not_analysed(tmp_path, monkeypatch, fake_pipeline, capsys):
    StandIn(tmp_path, monkeypatch, fail="unrecognised option '--bogus'")
    code = cli.main(["-v", "quiet", "--output_path", str(tmp_path / "out"), *exits_with(0)])
    err = capsys.readouterr().err.strip()
    assert code == 1 and fake_pipeline.calls == []
    assert len(err.splitlines()) == 1 and "unrecognised option '--bogus'" in err and "no report" in err


def test_lone_qdstrm_is_imported_then_exported(tmp_path, monkeypatch, fake_pipeline):
    standin = StandIn(tmp_path, monkeypatch, writes=[".qdstrm"])
    out = tmp_path / "out"
    assert cli.main(["--output_path", str(out), *exits_with(0)]) == 0
    (importer_call,) = [c for c in standin.calls() if c[0] == "QdstrmImporter"]
    assert importer_call[1:] == ["-i", str(out / "nsys_profile.qdstrm"), "-o", str(out / "nsys_profile.nsys-rep")]
    (export_call,) = [c for c in standin.calls() if c[1:2] == ["export"]]
    assert export_call[1:] == [
        "export",
        "--type",
        "sqlite",
        "-o",
        str(out / "nsys_profile.sqlite"),
        str(out / "nsys_profile.nsys-rep"),
    ]
    ((source, cap),) = fake_pipeline.calls
    assert source == out / "nsys_profile.sqlite" and cap["report_path"] == str(out / "nsys_profile.nsys-rep")


def test_old_nsys_report_without_sqlite_is_exported(tmp_path, monkeypatch, fake_pipeline):
    standin = StandIn(
        tmp_path,
        monkeypatch,
        version="NVIDIA Nsight Systems version 2021.3.1.54-ee9c30a",
        help=HELP_2020,
        writes=[".qdrep"],
    )
    out = tmp_path / "out"
    assert cli.main(["--output_path", str(out), *exits_with(0)]) == 0
    (profile,) = standin.profile_calls()
    assert not any(a.startswith("--export") for a in profile)
    assert (out / "nsys_profile.sqlite").read_bytes() == b"exported " + str(out / "nsys_profile.qdrep").encode()
    assert fake_pipeline.calls[0][1]["report_path"] == str(out / "nsys_profile.qdrep")


def test_report_written_elsewhere_is_found_from_nsys_output(tmp_path, monkeypatch, fake_pipeline):
    elsewhere = tmp_path / "tmp" / "nsys-report-62b7.nsys-rep"
    elsewhere.parent.mkdir()
    StandIn(tmp_path, monkeypatch, writes=[], writes_elsewhere=[str(elsewhere)])
    out = tmp_path / "out"
    assert cli.main(["-v", "quiet", "--output_path", str(out), *exits_with(0)]) == 0
    assert fake_pipeline.calls[0][1]["report_path"] == str(elsewhere)
    assert (out / "nsys_profile.sqlite").is_file()


def test_no_nsys_on_path(tmp_path, monkeypatch, fake_pipeline, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    out = tmp_path / "out"
    # without nsys the default backend is torch.profiler (tests/test_capture_torch.py); asked for, nsys fails
    assert cli.main(["--backend=nsys", "--output_path", str(out), *exits_with(0)]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "nsys" in err and "not on PATH" in err
    assert "apt-get install nsight-systems" in err and not out.exists()


def test_no_nsys_on_path_as_a_subprocess(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    env = dict(os.environ, PATH=str(empty), PYTHONPATH=str(REPO))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "dlprof_profiler",
            "--backend=nsys",
            f"--output_path={tmp_path / 'out'}",
            sys.executable,
            "-c",
            "pass",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode != 0 and len(done.stderr.strip().splitlines()) == 1
    assert "not on PATH" in done.stderr and not (tmp_path / "out").exists()


def test_nsys_too_old(tmp_path, monkeypatch, fake_pipeline, capsys):
    standin = StandIn(tmp_path, monkeypatch, version="NVIDIA Nsight Systems version 2019.5.2.16-b54ef97")
    out = tmp_path / "out"
    assert cli.main(["--output_path", str(out), *exits_with(0)]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "2019.5.2.16" in err and "older than 2020.3" in err
    assert "install" in err and not out.exists() and standin.profile_calls() == []


@pytest.mark.slow
def test_existing_outputs_need_force(tmp_path, monkeypatch, fake_pipeline, capsys):
    standin = StandIn(tmp_path, monkeypatch)
    out = tmp_path / "out"
    out.mkdir()
    for existing in ("nsys_profile.nsys-rep", "nsys_profile.qdstrm", "dlprof_dldb.sqlite"):
        (out / existing).write_text("old")
        assert cli.main(["--output_path", str(out), *exits_with(0)]) == 1
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and str(out / existing) in err and "--force" in err
        assert standin.profile_calls() == [] and (out / existing).read_text() == "old"
        (out / existing).unlink()
    (out / "nsys_profile.nsys-rep").write_text("old")
    assert cli.main(["--output_path", str(out), "--force", *exits_with(0)]) == 0
    (profile,) = standin.profile_calls()
    assert profile[profile.index("-f") + 1] == "true"
    assert (out / "nsys_profile.nsys-rep").read_text() == "capture"


def test_unwritable_output_path_under_a_file(tmp_path, monkeypatch, fake_pipeline, capsys):
    standin = StandIn(tmp_path, monkeypatch)
    (tmp_path / "afile").write_text("x")
    assert cli.main([f"--output_path={tmp_path / 'afile' / 'out'}", *exits_with(0)]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "afile" in err and "not a folder" in err
    assert standin.profile_calls() == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write into read-only folders")
def test_unwritable_output_path_read_only(tmp_path, monkeypatch, fake_pipeline, capsys):
    standin = StandIn(tmp_path, monkeypatch)
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        assert cli.main([f"--output_path={ro / 'out'}", *exits_with(0)]) == 1
        assert "not writable" in capsys.readouterr().err and standin.profile_calls() == []
    finally:
        ro.chmod(0o755)


def test_command_not_found(tmp_path, monkeypatch, fake_pipeline, capsys):
    standin = StandIn(tmp_path, monkeypatch)
    out = tmp_path / "out"
    assert cli.main(["--output_path", str(out), "no-such-program-dlprof", "--x"]) == 127
    assert "no-such-program-dlprof: command not found" in capsys.readouterr().err
    assert standin.profile_calls() == [] and not out.exists()


def test_analysis_failure_is_reported(tmp_path, monkeypatch, fake_pipeline, capsys):
    StandIn(tmp_path, monkeypatch)

    def broken(source, args, capture=None):
        raise DLProfError(f"{source}: not an Nsight Systems export")

    monkeypatch.setattr(cli.analysis, "run_analysis", broken)
    assert cli.main(["-v", "quiet", "--output_path", str(tmp_path / "out"), *exits_with(3)]) == 1
    assert "not an Nsight Systems export" in capsys.readouterr().err


def test_third_interrupt_abandons_a_stuck_capture(tmp_path, monkeypatch):
    standin = StandIn(tmp_path, monkeypatch, hang=True)
    proc = _run_cli(tmp_path, ["-v", "minimal", f"--output_path={tmp_path / 'out'}", *exits_with(0)], {})
    stderr_lines, _ = OutputLines(proc.stderr), OutputLines(proc.stdout)  # both pipes drained
    # the stand-in ignores signals from here on, and dlprof has set its handlers before starting it
    wait_until(lambda: Path(str(standin.log) + ".hanging").exists(), 30, "the stand-in nsys to hang", proc)
    # each interrupt once dlprof has answered the one before (two signals sent at once may arrive as one)
    for answer in ("interrupt twice more to abandon it", "interrupt once more to abandon it", None):
        proc.send_signal(signal.SIGINT)
        if answer:
            stderr_lines.wait_for(answer, 30, proc)
    proc.wait(timeout=30)
    stderr = stderr_lines.close()
    assert proc.returncode == 130
    assert "writing the report" in stderr and "abandoned" in stderr.splitlines()[-1]


# ------------------------------------------------------------------------------------------- real nsys


def _nvtx_library_loads() -> bool:
    try:
        ctypes.CDLL("libnvToolsExt.so.1")
        return True
    except OSError:
        return False


needs_nsys = [
    pytest.mark.nsys,
    pytest.mark.skipif(shutil.which("nsys") is None, reason="Nsight Systems (nsys) is not on PATH"),
    pytest.mark.skipif(not _nvtx_library_loads(), reason="libnvToolsExt.so.1 (Debian libnvtoolsext1) is missing"),
]

# A CPU-only "training" program: NVTX ranges through ctypes libnvToolsExt.so.1 (nsys 2022.4 records these),
# its argv written to a file, a line on stdout, and the exit status it is told.
PROGRAM = textwrap.dedent("""
    import ctypes, json, os, sys, time
    nvtx = ctypes.CDLL("libnvToolsExt.so.1")
    out = os.environ["DLPROF_TEST_OUT"]
    with open(os.path.join(out, "argv.json"), "w") as f:
        json.dump(sys.argv[1:], f)
    print("hello from the program", flush=True)
    for step in range(3):
        nvtx.nvtxRangePushA(b"train_step")
        nvtx.nvtxRangePushA(b"forward")
        sum(i * i for i in range(20000))
        nvtx.nvtxRangePop()
        nvtx.nvtxRangePushA(b"optimizer_step")
        nvtx.nvtxRangePop()
        nvtx.nvtxRangePop()
    if os.environ.get("DLPROF_TEST_SLEEP"):
        open(os.path.join(out, "started"), "w").close()
        try:  # a long training step, until interrupted or ended by --duration: what the tests send it
            time.sleep(float(os.environ["DLPROF_TEST_SLEEP"]))
        except KeyboardInterrupt:
            print("program interrupted", flush=True)
            sys.exit(int(os.environ.get("DLPROF_TEST_INTERRUPTED_STATUS", "5")))
    sys.exit(int(os.environ.get("DLPROF_TEST_STATUS", "0")))
""")

USER_ARGS = ["--lr", "0.1", "-f", "a b", "--output_path=not-dlprofs", "--", "", "$HOME", "*", "ünï", "-v", "quiet"]


def _run_cli(tmp_path, argv, env_extra, runner=True, **popen):
    script = tmp_path / "program.py"
    script.write_text(PROGRAM)
    env = dict(os.environ, PYTHONPATH=str(REPO), DLPROF_TEST_OUT=str(tmp_path), **env_extra)
    if runner:
        (tmp_path / "runner.py").write_text(RUNNER)
        head = [sys.executable, str(tmp_path / "runner.py")]
    else:  # the `dlprof` console script when the package is installed, as the README's quick start runs it
        script_path = Path(sys.executable).parent / "dlprof"
        head = [str(script_path)] if script_path.exists() else [sys.executable, "-m", "dlprof_profiler"]
    argv = [a.replace("PROGRAM", str(script)) for a in argv]
    return subprocess.Popen(
        head + argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, **popen
    )


@pytest.fixture(scope="module")
def quiet_run(tmp_path_factory):
    """One real capture: quiet, `--opt value` forms, a program exiting 3 with tricky arguments."""
    if shutil.which("nsys") is None or not _nvtx_library_loads():
        pytest.skip("needs nsys and libnvToolsExt.so.1")
    tmp = tmp_path_factory.mktemp("quiet_run")
    out = tmp / "out dir"
    proc = _run_cli(
        tmp,
        ["-v", "quiet", "--output_path", str(out), "--nsys_base_name", "cap", sys.executable, "PROGRAM", *USER_ARGS],
        {"DLPROF_TEST_STATUS": "3"},
    )
    stdout, stderr = proc.communicate(timeout=120)
    return types.SimpleNamespace(tmp=tmp, out=out, code=proc.returncode, stdout=stdout, stderr=stderr)


class TestRealNsys:
    pytestmark = needs_nsys

    def test_exit_status_passes_through(self, quiet_run):
        assert quiet_run.code == 3, quiet_run.stderr

    def test_program_arguments_arrive_unchanged(self, quiet_run):
        assert json.loads((quiet_run.tmp / "argv.json").read_text()) == USER_ARGS

    def test_quiet_hides_nsys_but_not_the_program(self, quiet_run):
        assert "hello from the program" in quiet_run.stdout
        assert "Generat" not in quiet_run.stdout + quiet_run.stderr and "[DLProf" not in quiet_run.stdout

    def test_report_and_sqlite_with_the_nvtx_ranges(self, quiet_run):
        assert (quiet_run.out / "cap.nsys-rep").is_file()
        with sqlite3.connect(quiet_run.out / "cap.sqlite") as db:
            texts = [row[0] for row in db.execute("SELECT text FROM NVTX_EVENTS WHERE text IS NOT NULL")]
        assert texts.count("train_step") == 3 and texts.count("forward") == 3 and texts.count("optimizer_step") == 3

    def test_engine_gets_the_capture(self, quiet_run):
        recorded = json.loads((quiet_run.out / "capture.json").read_text())
        cap = recorded["capture"]
        assert recorded["source"] == str(quiet_run.out / "cap.sqlite")
        assert cap["exit_status"] == 3 and cap["interrupted"] is False
        assert cap["command"] == [sys.executable, str(quiet_run.tmp / "program.py"), *USER_ARGS]
        assert cap["nsys_version"] == nsys_tool.nsys_version(shutil.which("nsys"))
        assert cap["report_path"] == str(quiet_run.out / "cap.nsys-rep")
        assert cap["nsys_command"][1:7] == ["profile", "-t", "cuda,nvtx", "-s", "none", "--cpuctxsw=none"]

    def test_ctrl_c_lets_nsys_write_the_report_then_analyses_it(self, tmp_path):
        out = tmp_path / "out"
        proc = _run_cli(tmp_path, [f"--output_path={out}", sys.executable, "PROGRAM"], {"DLPROF_TEST_SLEEP": "60"})
        wait_until(lambda: (tmp_path / "started").exists(), 60, "the program to start", proc)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 130, stderr
        assert "program interrupted" in stdout and "Generated" in stdout  # info shows nsys's output
        cap = json.loads((out / "capture.json").read_text())["capture"]
        assert cap["interrupted"] is True and cap["exit_status"] == 5
        with sqlite3.connect(out / "nsys_profile.sqlite") as db:
            assert db.execute("SELECT count(*) FROM NVTX_EVENTS WHERE text = 'train_step'").fetchone()[0] == 3

    def test_duration_ends_the_program_and_its_status_is_reported(self, tmp_path):
        out = tmp_path / "out"
        proc = _run_cli(
            tmp_path, ["--output_path", str(out), "-d", "1", sys.executable, "PROGRAM"], {"DLPROF_TEST_SLEEP": "30"}
        )
        stdout, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 143, stderr  # nsys ends the program with SIGTERM after --duration
        assert "ended by SIGTERM" in stdout and "--duration" in stdout
        cap = json.loads((out / "capture.json").read_text())["capture"]
        assert cap["exit_status"] == 143 and cap["interrupted"] is False
        assert cap["nsys_command"][cap["nsys_command"].index("-d") + 1] == "1"

    def test_install_without_importer_link_leaves_a_qdstrm_that_is_imported(self, tmp_path):
        """Debian's nsight-systems without /usr/lib/x86_64-linux-gnu/nsight-systems/host-linux-x64: nsys
        finds no importer beside its real path and writes only <base>.qdstrm; dlprof finds the importer
        through the /usr/lib/nsight-systems/bin/nsys link, imports and exports."""
        real = shutil.which("nsys")
        importer = nsys_tool.find_qdstrm_importer(real)
        if importer is None:
            pytest.skip("this nsys install has no QdstrmImporter")
        target = Path(os.path.realpath(real)).parent
        layout = tmp_path / "install"
        fake_target = layout / "arch" / "target-linux-x64"
        fake_target.mkdir(parents=True)
        for entry in target.iterdir():
            if entry.name == "nsys":  # the binary must be a real file here: nsys looks beside its own path
                try:
                    os.link(entry, fake_target / "nsys")
                except OSError:
                    shutil.copy2(entry, fake_target / "nsys")
            else:
                (fake_target / entry.name).symlink_to(entry)
        bin_dir = layout / "lib" / "nsight-systems" / "bin"
        bin_dir.mkdir(parents=True)
        (bin_dir / "nsys").symlink_to(fake_target / "nsys")
        (bin_dir.parent / "host-linux-x64").symlink_to(Path(importer).parent)
        out = tmp_path / "out"
        proc = _run_cli(
            tmp_path,
            ["--output_path", str(out), sys.executable, "PROGRAM"],
            {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"},
        )
        stdout, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 0, stderr
        assert "importing it with" in stdout
        assert (out / "nsys_profile.qdstrm").is_file() and (out / "nsys_profile.nsys-rep").is_file()
        with sqlite3.connect(out / "nsys_profile.sqlite") as db:
            assert db.execute("SELECT count(*) FROM NVTX_EVENTS WHERE text = 'forward'").fetchone()[0] == 3
        cap = json.loads((out / "capture.json").read_text())["capture"]
        assert cap["report_path"] == str(out / "nsys_profile.nsys-rep")


@pytest.mark.slow
@pytest.mark.nsys
@pytest.mark.skipif(shutil.which("nsys") is None, reason="Nsight Systems (nsys) is not on PATH")
@pytest.mark.skipif(not _nvtx_library_loads(), reason="libnvToolsExt.so.1 (Debian libnvtoolsext1) is missing")
def test_end_to_end_real_nsys_reports_and_database(tmp_path):
    """The README quick start: `dlprof --output_path=./event_files python <script>`."""
    out = tmp_path / "event_files"
    proc = _run_cli(tmp_path, ["--output_path=./event_files", sys.executable, "PROGRAM"], {}, runner=False)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr
    for name in (
        "nsys_profile.nsys-rep",
        "nsys_profile.sqlite",
        "dlprof_dldb.sqlite",
        "dlprof_summary.csv",
        "dlprof_detailed.csv",
        "dlprof_expert_systems.csv",
    ):
        assert (out / name).is_file(), name
    options = cli.parse_options(["--output_path", str(out), sys.executable, "x.py"])
    for path in run_outputs.planned_outputs(options):
        assert Path(path).exists(), path
