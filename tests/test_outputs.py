"""Output folders: created and removed again when left empty, one run at a time (lock), stale staging
folders of killed runs cleaned, staging paths never shown."""

import os
import subprocess
import sys
import time

import pytest

from dlprof_profiler import outputs
from dlprof_profiler.errors import DLProfError
from dlprof_profiler.outputs import LOCK_NAME, OutputFolder, Staging, stale_staging, unstaged


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
