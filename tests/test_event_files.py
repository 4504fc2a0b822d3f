"""Where the event files go: the run directory TensorBoard names the run by."""

from __future__ import annotations

import pytest

from dlprof_profiler.outputs import event_files
from tests.profiles import run_dlprof, training_profile


@pytest.mark.slow
def test_the_run_directory_does_not_repeat_the_profile_name(tmp_path):
    """`--output_path=runs/example --profile_name=example` is the run `example` below `runs`, not
    `example/example`; another profile name gets its own folder inside the output folder."""
    assert event_files.run_directory(tmp_path / "runs" / "example", "example") == tmp_path / "runs" / "example"
    assert event_files.run_directory(tmp_path / "out", "example") == tmp_path / "out" / "example"
    assert event_files.run_directory(tmp_path / "out" / ".", "out") == tmp_path / "out"
    export = training_profile(tmp_path / "training.sqlite")
    run_dlprof(
        f"--database={export}",
        f"--output_path={tmp_path / 'runs' / 'example'}",
        "--profile_name=example",
        "-v",
        "quiet",
    )
    (event,) = (tmp_path / "runs").rglob("events.out.tfevents.*")
    assert event.parent == tmp_path / "runs" / "example"
    # a second run into the same folder needs --force, as any output (the event file is one of them)
    proc = run_dlprof(
        f"--database={export}",
        f"--output_path={tmp_path / 'runs' / 'example'}",
        "--profile_name=example",
        "-v",
        "quiet",
        check=False,
    )
    assert proc.returncode != 0 and "--force" in proc.stderr
