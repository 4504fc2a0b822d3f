"""Output folders: created and removed again when left empty, one run at a time (lock), stale staging
folders of killed runs cleaned, staging paths never shown."""

import os
import subprocess
import sys
import time

import pytest

from dlprof_profiler.outputs import publish as outputs
from dlprof_profiler.errors import DLProfError
from dlprof_profiler.outputs.publish import LOCK_NAME, OutputFolder, Staging, stale_staging, unstaged


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_created_folders_are_removed_when_left_empty(tmp_path):
    out = tmp_path / "a" / "b" / "c"
    with pytest.raises(RuntimeError), OutputFolder(out):
        assert out.is_dir() and (out / LOCK_NAME).is_file()
        raise RuntimeError("the run failed")
    assert not (tmp_path / "a").exists()
    with OutputFolder(out):
        (out / "report.csv").write_text("x")
    assert sorted(p.name for p in out.iterdir()) == ["report.csv"]  # outputs stay, the lock file goes


def test_an_existing_folder_is_kept(tmp_path):
    with OutputFolder(tmp_path):
        pass
    assert tmp_path.is_dir() and list(tmp_path.iterdir()) == []


def test_a_second_run_into_a_locked_folder_fails_at_once_naming_the_folder_and_pid(tmp_path):
    with OutputFolder(tmp_path):
        started = time.monotonic()
        with pytest.raises(DLProfError) as err, OutputFolder(tmp_path):
            pass
        assert time.monotonic() - started < 5
        assert str(err.value).startswith(f"{tmp_path}: another dlprof run (pid {os.getpid()})")
    with OutputFolder(tmp_path):  # released
        pass


def test_a_lock_left_by_a_killed_run_does_not_block(tmp_path):
    (tmp_path / LOCK_NAME).write_text(f"{dead_pid()} {outputs._host()}\n")  # the kernel dropped its lock
    with OutputFolder(tmp_path):
        assert (tmp_path / LOCK_NAME).read_text().split()[0] == str(os.getpid())
    assert not (tmp_path / LOCK_NAME).exists()


def test_staging_folders_carry_their_owner_and_are_never_named_in_messages(tmp_path):
    staging = Staging(tmp_path)
    assert staging.root.name.startswith(f".dlprof-staging-{os.getpid()}@{outputs._host()}.")
    staged = staging.path(tmp_path / "dlprof_dldb.sqlite")
    assert (
        unstaged(f"{staged}: could not write the database (disk full)")
        == f"{tmp_path / 'dlprof_dldb.sqlite'}: could not write the database (disk full)"
    )
    staging.discard()


def test_stale_staging_of_gone_processes_is_removed(tmp_path):
    host = outputs._host()
    gone = tmp_path / f".dlprof-staging-{dead_pid()}@{host}.ab12"
    mine = tmp_path / f".dlprof-staging-{os.getpid()}@{host}.cd34"
    elsewhere = tmp_path / f".dlprof-staging-{dead_pid()}@another-host.example.ef56"
    legacy_old, legacy_new = tmp_path / ".dlprof-staging-old1234", tmp_path / ".dlprof-staging-new5678"
    for folder in (gone, mine, elsewhere, legacy_old, legacy_new):
        folder.mkdir()
        (folder / "dlprof_dldb.sqlite").write_bytes(b"\0" * 1000)
    old = time.time() - outputs.LEGACY_STAGING_AGE_S - 60
    os.utime(legacy_old / "dlprof_dldb.sqlite", (old, old))
    os.utime(legacy_old, (old, old))
    assert sorted(p.name for p in stale_staging(tmp_path)) == sorted([gone.name, legacy_old.name])
    with OutputFolder(tmp_path):
        pass
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([mine.name, elsewhere.name, legacy_new.name])


# ---------------------------------------------------------------------------- publication and report sets


def _staged(tmp_path, names):
    staging = Staging(tmp_path)
    for name in names:
        staging.path(tmp_path / name).write_text(f"new {name}")
    return staging


def test_commit_puts_the_staged_files_in_place_and_removes_the_replaced_ones(tmp_path):
    (tmp_path / "dlprof_summary.csv").write_text("old")
    (tmp_path / "dlprof_summary.json").write_text("old")
    (tmp_path / "notes.txt").write_text("mine")
    staging = _staged(tmp_path, ["dlprof_summary.csv", "dlprof/events.out.tfevents.1.h.2.dlprof"])
    staging.commit(replacing=[tmp_path / "dlprof_summary.csv", tmp_path / "dlprof_summary.json"])
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()) == [
        "dlprof/events.out.tfevents.1.h.2.dlprof",
        "dlprof_summary.csv",
        "notes.txt",
    ]
    assert (tmp_path / "dlprof_summary.csv").read_text() == "new dlprof_summary.csv"
    assert not outputs.publication_pending(tmp_path) and not staging.root.exists()


def test_a_journal_left_by_a_killed_publication_is_completed_by_the_next_run(tmp_path):
    """Killed after the first of three renames and before the removal: the journal and the staging folder are
    left; entering the folder (as every run does) completes the renames and the removal."""
    (tmp_path / "dlprof_kernel.json").write_text("old")
    staging = _staged(tmp_path, ["a.csv", "b.csv", "sub/c.csv"])
    journal = {
        "version": outputs.JOURNAL_VERSION,
        "pid": 1,
        "staging": staging.root.name,
        "moves": ["a.csv", "b.csv", "sub/c.csv"],
        "removals": ["dlprof_kernel.json"],
    }
    outputs._write_journal(tmp_path, journal)
    os.replace(staging.root / "a.csv", tmp_path / "a.csv")  # the one rename done before the kill
    assert outputs.publication_pending(tmp_path)
    assert outputs.complete_publication(tmp_path) == 4
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()) == [
        "a.csv",
        "b.csv",
        "sub/c.csv",
    ]
    assert not outputs.publication_pending(tmp_path) and not staging.root.exists()
    assert outputs.complete_publication(tmp_path) == 0  # nothing pending


def test_a_journal_naming_paths_outside_the_folder_is_refused(tmp_path):
    staging = Staging(tmp_path)
    outputs._write_journal(
        tmp_path, {"version": 1, "pid": 1, "staging": staging.root.name, "moves": ["../x"], "removals": []}
    )
    with pytest.raises(DLProfError) as err:
        outputs.complete_publication(tmp_path)
    assert str(err.value).startswith(f"{tmp_path / outputs.PUBLISH_JOURNAL}: cannot complete the publication")


def test_a_publication_that_fails_midway_keeps_its_staging_for_the_next_run(tmp_path, monkeypatch):
    staging = _staged(tmp_path, ["a.csv", "b.csv"])
    real_replace = os.replace

    def failing_second(src, dst):
        if str(src).endswith("b.csv"):
            raise OSError(5, "Input/output error", str(src))
        real_replace(src, dst)

    monkeypatch.setattr(outputs.os, "replace", failing_second)
    with pytest.raises(OSError):
        staging.commit()
    staging.discard()  # what the run's error handling does
    assert outputs.publication_pending(tmp_path) and (staging.root / "b.csv").exists()
    monkeypatch.setattr(outputs.os, "replace", real_replace)
    with OutputFolder(tmp_path):
        pass
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.csv", "b.csv"]


def test_report_set_of_a_base_name(tmp_path):
    names = [
        "dlprof_summary.csv",
        "dlprof_detailed_TensorRT.json",
        "dlprof_kernel_rank3.csv",
        "dlprof_ranks.json",
        "dlprof_model_data.json",
        "dlprof_dldb.sqlite",  # the database is replaced, not part of the report set
        "dlprof_summary.txt",
        "dlprofsummary.csv",
        "other_summary.csv",
        "dlprof_x_summary.csv",  # another base name (dlprof_x)
        "dlprof_kernel_summary.csv",  # a run with base name dlprof_kernel: its database is beside it
        "dlprof_kernel_dldb.sqlite",
        "dlprof_summary_extra.csv",  # no dlprof_summary database: a domain suffix of a dlprof report
    ]
    for name in names:
        (tmp_path / name).write_text("x")
    found = outputs.report_set(tmp_path, "dlprof", ["summary", "detailed", "kernel", "ranks", "model_data"])
    assert [p.name for p in found] == [
        "dlprof_detailed_TensorRT.json",
        "dlprof_kernel_rank3.csv",
        "dlprof_model_data.json",
        "dlprof_ranks.json",
        "dlprof_summary.csv",
        "dlprof_summary_extra.csv",
    ]
    assert outputs.report_set(tmp_path / "missing", "dlprof", ["summary"]) == []
