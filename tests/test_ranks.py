"""Multi-rank analysis end to end (ranks.py): a generated 4-rank job with one slow rank whose every cross-rank
figure is computed by hand (tests/profiles.rank_profile), per-rank outputs against single-file analyses, the
merged database, re-aggregation, errors, the real fixtures as ranks, and a real Dask LocalCluster."""

from __future__ import annotations

import csv
import gzip
import json
import sqlite3
import time
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest

from dlprof_profiler import contract as K
from dlprof_profiler.db import writer as database
from tests.profiles import RANK_BASE, RANK_ITERATION, RANK_STEPS, SLOW_ITERATION, rank_profile, run_dlprof
from tests import data

pytestmark = pytest.mark.slow  # multi-rank CLI runs, worker processes and a Dask cluster


FIXTURES = data.DATA
SLOW = 2


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """Four ranks (rank 2 slow) analysed together, default reports plus the iteration report."""
    root = tmp_path_factory.mktemp("job")
    files = [rank_profile(root / f"r{r}.sqlite", r, slow=(r == SLOW)) for r in range(4)]
    out = root / "out"
    proc = run_dlprof(
        f"--database={','.join(map(str, files))}",
        f"--output_path={out}",
        "--reports=summary,detail,iteration,expert_systems",
        "--formats=csv,json",
    )
    return {"root": root, "files": files, "out": out, "log": proc.stdout + proc.stderr}


def read_rows(path: Path) -> list[dict]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_ranks_report_hand_computed(job):
    """Per rank, iterations 0..2 last L (50 us, slow rank 80 us) and iteration 3 (the tail) 1 us:
    avg (3L + 1000) / 4, max L. GPU busy per iteration: the compute kernel [3000, 3000 + c) united with the NCCL
    kernel [15000, 25000): 22 us (c = 20 us), slow 40 us (c = 40 us); window 3L + 1000. Communication 3 x 10 us;
    overlapped 3 x 8 us (80 %), slow rank 100 %. One host, one epoch: the last to finish is the latest end,
    rank 2 in both complete iterations (1 and 2; 0 runs up to the first key node, 3 after the last)."""
    rows = read_rows(job["out"] / "dlprof_ranks.csv")
    assert list(rows[0]) == [
        "Rank",
        "Source file",
        "GPUs",
        "Iterations",
        "Avg Iteration Time (ns)",
        "Max Iteration Time (ns)",
        "GPU Utilization %",
        "Communication Time (ns)",
        "Overlapped Communication %",
        "Times Slowest",
    ]
    assert [int(r["Rank"]) for r in rows] == [0, 1, 2, 3]
    for r in rows:
        rank = int(r["Rank"])
        length = SLOW_ITERATION if rank == SLOW else RANK_ITERATION
        busy = 40_000 if rank == SLOW else 22_000
        window = RANK_STEPS * length + 1000
        assert r["Source file"] == str(job["files"][rank].resolve())
        assert int(r["GPUs"]) == 1 and int(r["Iterations"]) == RANK_STEPS + 1
        assert r["Avg Iteration Time (ns)"] == str(int((RANK_STEPS * length + 1000) / 4 + 0.5))
        assert int(r["Max Iteration Time (ns)"]) == length
        assert r["GPU Utilization %"] == f"{100 * RANK_STEPS * busy / window:.1f}"
        assert int(r["Communication Time (ns)"]) == RANK_STEPS * 10_000
        assert r["Overlapped Communication %"] == ("100.0" if rank == SLOW else "80.0")
        assert int(r["Times Slowest"]) == (2 if rank == SLOW else 0)
    doc = json.loads((job["out"] / "dlprof_ranks.json").read_text())
    assert doc["report"] == "ranks" and doc["sections"][0]["rows"][SLOW][4] == (RANK_STEPS * SLOW_ITERATION + 1000) / 4


def test_straggler_named_in_the_runs_expert_systems(job):
    text = (job["out"] / "dlprof_expert_systems.csv").read_text()
    lines = text.splitlines()
    assert lines[:2] == ["Expert Systems Feedback", "Rank,Problem,Recommendation"]
    rows = list(csv.reader(lines[2:]))
    straggler = [r for r in rows if r[0] == "all" and r[1].startswith("Rank 2 is a straggler")]
    assert len(straggler) == 1
    problem = straggler[0][1]
    # rank 2: (3 x 80 + 1) / 4 = 60.25 us against the median rank 1's 37.75 us; its conv2d kernel runs 20 us longer
    # in each of the 3 steps: 60 us more over 4 iterations, 15 us per iteration
    assert "60.2 us on average, 1.60x the median rank (rank 1: 37.8 us)" in problem
    assert "in 2 of 2 matched iterations" in problem  # the complete ones, 1 and 2
    assert "ops by GPU time: /aten::conv2d (+15.0 us)" in problem
    assert "kernels: volta_sgemm_32x32_sliced1x4_tn (+15.0 us)" in problem
    assert not any(r[1].startswith(f"Rank {n} is a straggler") for r in rows for n in (0, 1, 3))
    imbalance = [r for r in rows if r[0] == "all" and r[1].startswith("Load imbalance")]
    assert imbalance and "rank 2 runs 30.0 us of compute kernels and rank 0 15.0 us (50.0% less)" in imbalance[0][1]
    # then each rank's own findings, as its own report lists them
    for rank in range(4):
        own = list(csv.reader((job["out"] / f"dlprof_expert_systems_rank{rank}.csv").read_text().splitlines()[2:]))
        assert [r[1:] for r in rows if r[0] == str(rank)] == own and own


def test_per_rank_reports_equal_single_file_analyses(job, tmp_path):
    """Each rank's reports are what analysing its file alone writes, byte for byte."""
    for rank in (0, SLOW):
        single = tmp_path / f"single{rank}"
        run_dlprof(
            f"--database={job['files'][rank]}",
            f"--output_path={single}",
            "--reports=summary,detail,iteration,expert_systems",
            "--formats=csv,json",
            "-v",
            "quiet",
        )
        for name in ("summary", "detailed", "iteration", "expert_systems"):
            for fmt in ("csv", "json"):
                mine = (job["out"] / f"dlprof_{name}_rank{rank}.{fmt}").read_bytes()
                assert mine == (single / f"dlprof_{name}.{fmt}").read_bytes(), (rank, name, fmt)


def test_out_of_core_ranks_write_what_in_memory_ranks_write(job, tmp_path):
    """--out_of_core=on: every rank staged in its worker's store; the reports, the cross-rank report and the
    merged database's content are those of the in-memory run."""
    from tests.test_store import _database_content

    out = tmp_path / "ooc"
    run_dlprof(
        f"--database={','.join(map(str, job['files']))}",
        f"--output_path={out}",
        "--out_of_core=on",
        "--reports=summary,detail,iteration,expert_systems",
        "--formats=csv,json",
    )
    names = sorted(p.name for p in job["out"].glob("dlprof_*") if p.suffix in (".csv", ".json"))
    assert "dlprof_ranks.csv" in names and "dlprof_iteration_rank2.csv" in names
    assert names == sorted(p.name for p in out.glob("dlprof_*") if p.suffix in (".csv", ".json"))
    for name in names:
        assert (out / name).read_bytes() == (job["out"] / name).read_bytes(), name
    assert _database_content(out / "dlprof_dldb.sqlite") == _database_content(job["out"] / "dlprof_dldb.sqlite")
    assert not any(p.name.startswith(".") for p in out.iterdir())  # stores and staging gone


def test_merged_database_holds_every_rank(job):
    db = job["out"] / "dlprof_dldb.sqlite"
    con = sqlite3.connect(db)
    try:
        assert [r[0] for r in con.execute(f"SELECT rank FROM {K.RANKS} ORDER BY rank")] == [0, 1, 2, 3]
        # every rank's kernels, API calls and ranges, under rank-scoped keys
        per_rank = dict(con.execute(f"SELECT rank, count(*) FROM {K.RAW_GPU_ACTIVITIES} GROUP BY rank"))
        assert per_rank == {r: 2 * RANK_STEPS for r in range(4)}
        keys = con.execute(
            f"SELECT rank, min(activity_id), max(activity_id) FROM {K.RAW_GPU_ACTIVITIES} GROUP BY rank"
        ).fetchall()
        assert all(lo >> K.ID_BITS == r and hi >> K.ID_BITS == r for r, lo, hi in keys)
        # names resolve per rank after the string ids were shifted
        names = con.execute(
            "SELECT rank, name FROM read_only_gpu_activities WHERE kind = 0 GROUP BY rank, name ORDER BY rank, name"
        ).fetchall()
        assert names == [
            (r, n)
            for r in range(4)
            for n in ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "volta_sgemm_32x32_sliced1x4_tn")
        ]
        ops = con.execute(
            "SELECT o.rank, o.op_name, n.num_calls, n.gpu_total FROM view_op_nodes n "
            "JOIN read_only_ops o ON o.op_index = n.op_index WHERE o.op_name = '/aten::conv2d' "
            "ORDER BY o.rank"
        ).fetchall()
        assert ops == [
            (r, "/aten::conv2d", RANK_STEPS, RANK_STEPS * (40_000 if r == SLOW else 20_000)) for r in range(4)
        ]
        assert [r[0] for r in con.execute("SELECT aggr_id FROM aggregations")] == [1]
        summary = con.execute(
            f"SELECT rank, times_slowest, straggler FROM {K.RANK_SUMMARY} WHERE aggr_id = 1 ORDER BY rank"
        ).fetchall()
        assert summary == [(0, 0, 0), (1, 0, 0), (2, 2, 1), (3, 0, 0)]
        cross = [
            r[0]
            for r in con.execute(
                "SELECT exp_sys_id FROM expert_systems_feedback WHERE rank = ? AND domain_id = ?",
                (K.ALL_RANKS, K.ALL_RANKS),
            )
        ]
        assert cross == ["straggler_rank_detector", "load_imbalance_detector"]
        assert json.loads(dict(con.execute("SELECT name, value FROM profile_info"))["ranks"]) == [0, 1, 2, 3]
        # the viewer's indexes, as a single-rank database has them
        import re

        from dlprof_profiler.db.schema import DERIVED_TABLES, FINAL_INDEXES, RAW_INDEXES

        wanted = set(re.findall(r"CREATE INDEX (\w+)", DERIVED_TABLES + RAW_INDEXES + FINAL_INDEXES))
        assert {
            r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'index' AND name LIKE 'idx_%'")
        } == wanted
    finally:
        con.close()
    # each rank reads back as its own model, as its file analysed alone would give
    for rank in range(4):
        trace, corr, profile, domain_ids, _ = database.load_model(db, rank)
        assert profile["source_file"] == str(job["files"][rank].resolve())
        assert len(trace.gpu) == 2 * RANK_STEPS and domain_ids == {"default": rank * 1024}
        assert int(trace.gpu["end"].max()) == RANK_BASE + (RANK_STEPS - 1) * (
            SLOW_ITERATION if rank == SLOW else RANK_ITERATION
        ) + (43_000 if rank == SLOW else 25_000)


def test_event_file_has_every_ranks_iteration_times(job):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(job["out"] / "dlprof"))
    acc.Reload()
    for rank in range(4):
        length = SLOW_ITERATION if rank == SLOW else RANK_ITERATION
        values = [e.value for e in acc.Scalars(f"dlprof/rank{rank}/iteration_time_ms")]
        assert values == pytest.approx([length / 1e6] * RANK_STEPS + [1000 / 1e6])


def test_reaggregation_covers_every_rank(job, tmp_path):
    """`dlprof --database=<run's database> --iter_stop 2`: the steady iterations of every rank: avg = max = L."""
    out = tmp_path / "again"
    run_dlprof(
        f"--database={job['out'] / 'dlprof_dldb.sqlite'}", f"--output_path={out}", "--iter_stop=2", "-v", "quiet"
    )
    rows = read_rows(out / "dlprof_ranks.csv")
    for r in rows:
        length = SLOW_ITERATION if int(r["Rank"]) == SLOW else RANK_ITERATION
        assert (r["Iterations"], r["Avg Iteration Time (ns)"], r["Max Iteration Time (ns)"]) == (
            "3",
            str(length),
            str(length),
        )
        assert r["Source file"] == str(job["files"][int(r["Rank"])].resolve())
    assert sorted(p.name for p in out.glob("dlprof_summary_rank*.csv")) == [
        f"dlprof_summary_rank{r}.csv" for r in range(4)
    ]
    con = sqlite3.connect(out / "dlprof_dldb.sqlite")
    try:
        assert [r[0] for r in con.execute("SELECT aggr_id FROM aggregations ORDER BY aggr_id")] == [1, 2]
        assert con.execute("SELECT count(DISTINCT rank) FROM model_summary WHERE aggr_id = 2").fetchone()[0] == 4
    finally:
        con.close()


def test_viewer_reaggregation_in_place(job, tmp_path):
    import shutil
    import subprocess
    import sys

    db = tmp_path / "copy.sqlite"
    shutil.copy(job["out"] / "dlprof_dldb.sqlite", db)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "dlprof_profiler.run.reaggregate",
            "--database",
            str(db),
            "--iter_start",
            "1",
            "--iter_stop",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"status": "succeeded", "aggr_id": 2}
    con = sqlite3.connect(db)
    try:
        rows = con.execute(
            f"SELECT rank, iterations, avg_iteration_time FROM {K.RANK_SUMMARY} WHERE aggr_id = 2 ORDER BY rank"
        ).fetchall()
        assert rows == [(r, 2, float(SLOW_ITERATION if r == SLOW else RANK_ITERATION)) for r in range(4)]
    finally:
        con.close()
    before = db.read_bytes()
    proc = subprocess.run(
        [sys.executable, "-m", "dlprof_profiler.run.reaggregate", "--database", str(db), "--key_node", "no_such_node"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    status = json.loads(proc.stdout.strip().splitlines()[-1])
    assert status["status"] == "failed" and "key node 'no_such_node' not found in rank " in status["message"]
    assert db.read_bytes() == before


def test_force_rules_and_no_partial_output(job, tmp_path):
    files = ",".join(map(str, job["files"]))
    proc = run_dlprof(f"--database={files}", f"--output_path={job['out']}", check=False)
    assert proc.returncode != 0 and "output file exists" in proc.stderr and "use --force=true" in proc.stderr
    # a damaged rank fails the run with one line naming it, and nothing is written
    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(job["files"][1].read_bytes()[:8192])
    out = tmp_path / "fails"
    proc = run_dlprof(f"--database={job['files'][0]},{bad}", f"--output_path={out}", check=False)
    errors = [line for line in proc.stderr.splitlines() if "ERROR" in line]
    assert proc.returncode != 0 and len(errors) == 1 and "bad.sqlite" in errors[0]
    assert not out.exists()


def _union(intervals):
    """Total length of a union of [s, e) intervals (plain Python: an independent reference)."""
    total, end = 0, None
    for s, e in sorted(intervals):
        if end is None or s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def test_real_2gpu_nsys_exports_as_ranks(tmp_path):
    """Both real 2-GPU exports as the ranks of one run (given after-before: ranks by order): per rank, GPUs and
    NCCL time and its overlap with compute kernels from direct SQL over the export."""
    ns = FIXTURES / "nsys"
    files = [ns / "pytorch_2gpu_nccl_nsys2026.2_after.sqlite", ns / "pytorch_2gpu_nccl_nsys2026.2_before.sqlite"]
    out = tmp_path / "out"
    run_dlprof(f"--database={files[0]},{files[1]}", f"--output_path={out}", "-v", "quiet")
    rows = read_rows(out / "dlprof_ranks.csv")
    assert [(int(r["Rank"]), r["Source file"]) for r in rows] == [(0, str(files[0])), (1, str(files[1]))]
    for r, path in zip(rows, files):
        con = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
        try:
            kernels = con.execute(
                "SELECT k.deviceId, k.start, k.end, s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k "
                "JOIN StringIds s ON s.id = k.shortName"
            ).fetchall()
        finally:
            con.close()
        devices = sorted({k[0] for k in kernels})
        comm = overlap = 0
        for dev in devices:
            c = [(s, e) for d, s, e, n in kernels if d == dev and "nccl" in n.lower()]
            o = [(s, e) for d, s, e, n in kernels if d == dev and "nccl" not in n.lower()]
            comm += _union(c)
            overlap += _union(c) + _union(o) - _union(c + o)
        assert int(r["GPUs"]) == len(devices) == 2
        assert int(r["Communication Time (ns)"]) == comm > 0
        assert r["Overlapped Communication %"] == f"{100.0 * overlap / comm:.1f}"
        # no key node: one iteration, the whole profile, which is not a complete iteration to compare
        assert int(r["Iterations"]) == 1 and int(r["Times Slowest"]) == 0


def test_real_ddp_kineto_traces_as_ranks(tmp_path):
    """The DDP trace (distributedInfo rank 0) and the 8xA100 one (rank 3): ranks from the traces; NCCL time per
    rank from the JSON events; ProfilerStep#N counts; the two traces come from different hosts, so the slowest
    rank of an iteration is the one with the longer iteration."""
    kin = FIXTURES / "kineto"
    files = {3: kin / "pytorch_8xa100_rank3.json.gz", 0: kin / "pytorch_ddp_2gpu_nccl.json.gz"}
    out = tmp_path / "out"
    run_dlprof(f"--database={files[3]},{files[0]}", f"--output_path={out}", "-v", "quiet")
    rows = {int(r["Rank"]): r for r in read_rows(out / "dlprof_ranks.csv")}
    assert sorted(rows) == [0, 3]
    durations = {}
    for rank, path in files.items():
        doc = json.loads(gzip.decompress(path.read_bytes()), parse_float=Decimal)  # exact us decimals
        events = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
        kernels = [e for e in events if e.get("cat") in ("kernel", "Kernel")]
        nccl = [
            (int(Decimal(e["ts"]) * 1000), int((Decimal(e["ts"]) + Decimal(e["dur"])) * 1000))
            for e in kernels
            if "nccl" in e["name"].lower()
        ]
        steps = [e for e in events if e["name"].startswith("ProfilerStep#")]
        r = rows[rank]
        assert r["Source file"] == str(files[rank])
        assert int(r["GPUs"]) == len({e["args"]["device"] for e in kernels}) == 1
        assert int(r["Iterations"]) == len(steps)  # each step its own iteration
        # the NCCL kernels all lie inside the window; one stream of them on one GPU: the union is their sum
        assert int(r["Communication Time (ns)"]) == _union(nccl)
        con = sqlite3.connect(out / "dlprof_dldb.sqlite")
        try:
            durations[rank] = [
                d
                for (d,) in con.execute(
                    "SELECT duration FROM iteration_summary s JOIN read_only_domains d ON d.domain_id = s.domain_id "
                    "WHERE s.aggr_id = 1 AND d.rank = ? ORDER BY iter_value",
                    (rank,),
                )
            ]
        finally:
            con.close()
    common = min(len(durations[0]), len(durations[3]))
    wins = {
        rank: sum(durations[rank][k] >= durations[other][k] for k in range(common)) for rank, other in ((0, 3), (3, 0))
    }
    assert {rank: int(rows[rank]["Times Slowest"]) for rank in rows} == wins
    findings = (out / "dlprof_expert_systems.csv").read_text()
    assert "Ranks have different iteration counts (rank 0: 3, rank 3: 6)" in findings


def test_dask_local_cluster(tmp_path):
    """The same 4-rank job on a real Dask LocalCluster (worker processes): the same reports as local workers."""
    distributed = pytest.importorskip("distributed")
    files = [rank_profile(tmp_path / f"r{r}.sqlite", r, slow=(r == SLOW)) for r in range(4)]
    local, on_dask = tmp_path / "local", tmp_path / "dask"
    run_dlprof(f"--database={','.join(map(str, files))}", f"--output_path={local}", "-v", "quiet")
    with distributed.LocalCluster(
        processes=True, n_workers=2, threads_per_worker=1, dashboard_address=None, silence_logs=50
    ) as cluster:
        proc = run_dlprof(
            f"--database={','.join(map(str, files))}",
            f"--output_path={on_dask}",
            f"--scheduler={cluster.scheduler_address}",
        )
    assert "on the Dask cluster at" in proc.stdout
    for name in ["dlprof_ranks.csv"] + [f"dlprof_summary_rank{r}.csv" for r in range(4)]:
        assert (on_dask / name).read_text() == (local / name).read_text(), name
    con = sqlite3.connect(on_dask / "dlprof_dldb.sqlite")
    try:
        assert con.execute("SELECT count(*) FROM raw_gpu_activities").fetchone()[0] == 4 * 2 * RANK_STEPS
    finally:
        con.close()


def test_scheduler_errors(tmp_path, monkeypatch):
    """Nothing listens at the address: Dask retries until its connect timeout (its own setting, which dlprof
    keeps: 2 s here instead of the default 30 s), then one line names the address."""
    monkeypatch.setenv("DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT", "2s")
    files = [rank_profile(tmp_path / f"r{r}.sqlite", r) for r in range(2)]
    started = time.monotonic()
    proc = run_dlprof(
        f"--database={files[0]},{files[1]}",
        f"--output_path={tmp_path / 'o'}",
        "--scheduler=tcp://127.0.0.1:9",
        check=False,
    )
    assert time.monotonic() - started < 30  # the setting was taken (the default alone waits 30 s)
    errors = [line for line in proc.stderr.splitlines() if "ERROR" in line]
    assert proc.returncode == 2 and len(errors) == 1 and "cannot connect to the Dask scheduler" in errors[0]
    assert "--scheduler=tcp://127.0.0.1:9" in errors[0] and "after 2 s" in errors[0]
    assert not (tmp_path / "o").exists()
    assert np.all([f.exists() for f in files])


def test_scheduler_without_distributed_names_the_package(tmp_path):
    """--scheduler on a machine without the `distributed` package: one line naming it (a stand-in package that
    fails to import, first on the path)."""
    import subprocess
    import sys

    blocker = tmp_path / "block" / "distributed"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('not installed')\n")
    files = [rank_profile(tmp_path / f"r{r}.sqlite", r) for r in range(2)]
    import os

    env = dict(os.environ, PYTHONPATH=str(blocker.parent))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "dlprof_profiler",
            f"--database={files[0]},{files[1]}",
            f"--output_path={tmp_path / 'o'}",
            "--scheduler=tcp://127.0.0.1:9",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    errors = [line for line in proc.stderr.splitlines() if "ERROR" in line]
    assert proc.returncode == 2 and len(errors) == 1
    assert "--scheduler needs the Python package 'distributed'" in errors[0] and "dlprof-profiler[dask]" in errors[0]


def test_a_dask_worker_that_cannot_see_the_output_folder(tmp_path):
    """The probe file written into the staging folder must be visible to every worker: one line naming the
    worker that cannot see it (the cluster's answer stubbed: a real LocalCluster shares this filesystem)."""
    from types import SimpleNamespace

    from dlprof_profiler.errors import DLProfError
    from dlprof_profiler.run.ranks import DaskRunner

    staging = tmp_path / "out" / ".dlprof-staging-1@h.x"
    staging.mkdir(parents=True)
    seen = {}

    def run(fn, path):
        seen["path"] = path
        return {"tcp://10.0.0.1:4000": fn(path), "tcp://10.0.0.2:4000": False}

    runner = DaskRunner.__new__(DaskRunner)
    runner.address, runner.client = "tcp://10.0.0.9:8786", SimpleNamespace(run=run)
    with pytest.raises(DLProfError) as err:
        runner.check_shared(staging)
    assert "Dask worker tcp://10.0.0.2:4000 cannot see the output folder" in str(err.value)
    assert seen["path"].startswith(str(staging)) and not list(staging.iterdir())  # the probe is removed


def test_workers_option_and_an_empty_directory(tmp_path):
    files = [rank_profile(tmp_path / f"r{r}.sqlite", r) for r in range(2)]
    proc = run_dlprof(
        f"--database={files[0]},{files[1]}", f"--output_path={tmp_path / 'o'}", "--workers=0", check=False
    )
    assert proc.returncode == 2 and "--workers" in proc.stderr and "expected a number >= 1" in proc.stderr
    out = tmp_path / "one"
    proc = run_dlprof(f"--database={files[0]},{files[1]}", f"--output_path={out}", "--workers=1")
    assert "on 1 local worker process(es)" in proc.stdout and (out / "dlprof_ranks.csv").exists()
    (tmp_path / "empty").mkdir()
    proc = run_dlprof(f"--database={tmp_path / 'empty'}", f"--output_path={tmp_path / 'e'}", check=False)
    assert proc.returncode == 1 and "empty: is a directory without profiles" in proc.stderr


def test_ranks_may_mix_nsys_versions_and_kineto_traces(tmp_path):
    """A generated nsys 2022.4 export, a real nsys 2026.2 export and a real Kineto trace recording rank 0: the
    trace keeps rank 0, the exports take 1 and 2 in the order given; each rank keeps its own versions."""
    mine = rank_profile(tmp_path / "mine.sqlite", 0)
    real = FIXTURES / "nsys" / "pytorch_2gpu_nccl_nsys2026.2_before.sqlite"
    ddp = FIXTURES / "kineto" / "pytorch_ddp_2gpu_nccl.json.gz"
    out = tmp_path / "out"
    run_dlprof(f"--database={mine},{real},{ddp}", f"--output_path={out}", "-v", "quiet")
    rows = read_rows(out / "dlprof_ranks.csv")
    assert [(r["Rank"], r["Source file"]) for r in rows] == [
        ("0", str(ddp)),
        ("1", str(mine.resolve())),
        ("2", str(real)),
    ]
    con = sqlite3.connect(out / "dlprof_dldb.sqlite")
    try:
        versions = dict(con.execute(f"SELECT rank, nsys_version FROM {K.RANKS}"))
        kinds = dict(con.execute(f"SELECT rank, source_kind FROM {K.RANKS}"))
    finally:
        con.close()
    assert versions[1].startswith("2022.4") and versions[2].startswith("2026.2") and "torch.profiler" in versions[0]
    assert kinds == {0: "kineto_json", 1: "nsys_sqlite", 2: "nsys_sqlite"}
    assert sorted(p.name for p in out.glob("dlprof_summary_rank*.csv")) == [
        f"dlprof_summary_rank{r}.csv" for r in range(3)
    ]
