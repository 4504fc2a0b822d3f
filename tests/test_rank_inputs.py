"""Which files `--database` names in a multi-rank analysis and which rank each one is (rank_inputs.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dlprof_profiler.ingest import formats as ingest
from dlprof_profiler.errors import DLProfError
from dlprof_profiler.run.inputs import rank_from_environment, resolve
from tests.kineto_builder import KinetoTrace
from tests.profiles import rank_profile
from tests import data

FIXTURES = data.DATA


def kineto(path: Path, rank: int | None, gz: bool = False) -> Path:
    """A small Kineto trace, with distributedInfo when `rank` is given."""
    k = KinetoTrace(pid=100 + (rank or 0))
    if rank is not None:
        k.top["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": 4}
    k.cpu_op(1, 1000, 500, "aten::mm")
    return k.write(path, gz=gz)


def ranks_of(entries) -> dict:
    return {Path(e.path).name: (e.rank, e.recorded) for e in entries}


def test_comma_list_ranks_in_the_order_given(tmp_path):
    files = [rank_profile(tmp_path / f"p{i}.sqlite", 0) for i in (2, 0, 1)]
    entries = resolve(",".join(str(f) for f in files))
    assert ranks_of(entries) == {"p2.sqlite": (0, False), "p0.sqlite": (1, False), "p1.sqlite": (2, False)}
    assert [e.kind for e in entries] == [ingest.SQLITE] * 3


def test_recorded_ranks_win_and_the_others_take_free_numbers(tmp_path):
    a = rank_profile(tmp_path / "a.sqlite", 1, env_rank=True)  # RANK=1 in the environment nsys saw
    b = kineto(tmp_path / "b.json.gz", 0, gz=True)  # distributedInfo rank 0
    c = rank_profile(tmp_path / "c.sqlite", 5)  # nothing recorded
    entries = resolve(f"{c},{a},{b}")
    assert ranks_of(entries) == {"b.json.gz": (0, True), "a.sqlite": (1, True), "c.sqlite": (2, False)}
    assert [e.rank for e in entries] == [0, 1, 2]


def test_glob_sorts_names_naturally(tmp_path):
    for i in (10, 2, 1):
        rank_profile(tmp_path / f"report_{i}.sqlite", 0)
    entries = resolve(str(tmp_path / "report_*.sqlite"))
    assert [(Path(e.path).name, e.rank) for e in entries] == [
        ("report_1.sqlite", 0),
        ("report_2.sqlite", 1),
        ("report_10.sqlite", 2),
    ]


@pytest.mark.slow
def test_directory_of_exports_is_ranks_and_skips_dlprof_databases(tmp_path):
    for i in range(2):
        rank_profile(tmp_path / f"r{i}.sqlite", i, env_rank=True)
    (tmp_path / "notes.txt").write_text("not a profile")
    shutil.copy(FIXTURES / "nsys" / "cuda_app_no_nvtx_nsys2021.3.sqlite", tmp_path / "r9.sqlite")  # no rank
    from tests.profiles import run_dlprof

    run_dlprof(f"--database={tmp_path / 'r0.sqlite'}", f"--output_path={tmp_path / 'out'}", "-v", "quiet")
    shutil.copy(tmp_path / "out" / "dlprof_dldb.sqlite", tmp_path / "dlprof_dldb.sqlite")
    entries = resolve(str(tmp_path))
    assert ranks_of(entries) == {"r0.sqlite": (0, True), "r1.sqlite": (1, True), "r9.sqlite": (2, False)}


def test_kineto_folder_without_ranks_stays_one_capture(tmp_path):
    kineto(tmp_path / "111.pt.trace.json", None)
    kineto(tmp_path / "222.pt.trace.json", None)
    entries = resolve(str(tmp_path))
    assert len(entries) == 1 and Path(entries[0].path) == tmp_path


def test_kineto_folder_with_ranks_leaves_the_launcher_out(tmp_path, capsys):
    kineto(tmp_path / "1.pt.trace.json", 1)
    kineto(tmp_path / "2.pt.trace.json", 0)
    kineto(tmp_path / "3.pt.trace.json", None)  # torchrun itself: no process group
    entries = resolve(str(tmp_path))
    assert ranks_of(entries) == {"2.pt.trace.json": (0, True), "1.pt.trace.json": (1, True)}
    assert "3.pt.trace.json" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("case", ["missing", "twice", "clash", "directory", "dlprof_db", "no_match", "not_profile"])
def test_bad_lists_are_one_line_errors_naming_the_file(tmp_path, case):
    a = rank_profile(tmp_path / "a.sqlite", 0)
    if case == "missing":
        spec, named = f"{a},{tmp_path / 'gone.sqlite'}", "gone.sqlite: no such file"
    elif case == "twice":
        spec, named = f"{a},{tmp_path}/./a.sqlite", "given twice"
    elif case == "clash":
        spec = f"{kineto(tmp_path / 'x.json', 3)},{kineto(tmp_path / 'y.json', 3)}"
        named = "y.json: records rank 3, as"
    elif case == "directory":
        (tmp_path / "d").mkdir()
        spec, named = f"{a},{tmp_path / 'd'}", "d: is a directory"
    elif case == "dlprof_db":
        from tests.profiles import run_dlprof

        run_dlprof(f"--database={a}", f"--output_path={tmp_path / 'o'}", "-v", "quiet")
        spec, named = f"{a},{tmp_path / 'o' / 'dlprof_dldb.sqlite'}", "a DLProf database cannot be one rank"
    elif case == "no_match":
        spec, named = str(tmp_path / "nothing_*.sqlite"), "no file matches this pattern"
    else:
        (tmp_path / "n.txt").write_text("hello")
        spec, named = f"{a},{tmp_path / 'n.txt'}", "n.txt: not an SQLite database"
    with pytest.raises(DLProfError) as err:
        resolve(spec)
    message = str(err.value)
    assert named in message and "\n" not in message


def test_environment_rank_variables():
    assert rank_from_environment("A=1;RANK=7;SLURM_PROCID=3") == 7
    assert rank_from_environment("OMPI_COMM_WORLD_RANK=4;X=y") == 4
    assert rank_from_environment("LOCAL_RANK=1;WORLD_SIZE=8") is None
    assert rank_from_environment("RANK=;RANKS=3") is None


def test_fixture_ranks(tmp_path):
    """The DDP trace records rank 0, the 8xA100 one rank 3; the real 2-GPU nsys exports record none."""
    kin = FIXTURES / "kineto"
    entries = resolve(f"{kin / 'pytorch_8xa100_rank3.json.gz'},{kin / 'pytorch_ddp_2gpu_nccl.json.gz'}")
    assert ranks_of(entries) == {"pytorch_ddp_2gpu_nccl.json.gz": (0, True), "pytorch_8xa100_rank3.json.gz": (3, True)}
    ns = FIXTURES / "nsys"
    after, before = ns / "pytorch_2gpu_nccl_nsys2026.2_after.sqlite", ns / "pytorch_2gpu_nccl_nsys2026.2_before.sqlite"
    entries = resolve(f"{after},{before}")
    assert [(Path(e.path).name, e.rank, e.recorded) for e in entries] == [
        ("pytorch_2gpu_nccl_nsys2026.2_after.sqlite", 0, False),
        ("pytorch_2gpu_nccl_nsys2026.2_before.sqlite", 1, False),
    ]


def test_single_file_and_comma_in_a_real_name(tmp_path):
    odd = rank_profile(tmp_path / "a,b.sqlite", 0)
    assert [Path(e.path) for e in resolve(str(odd))] == [odd]
