"""The DLProf database: versioned schema, re-aggregation in place, earlier aggregations kept."""
import hashlib
import json
import sqlite3
import subprocess
import sys

import pytest

from dlprof_profiler import DB_SCHEMA_VERSION
from dlprof_profiler.errors import DLProfError
from dlprof_profiler.pipeline import reaggregate_in_place
from tests import profiles
from tests.profiles import run_dlprof


@pytest.fixture
def db(tmp_path):
    export = profiles.training_profile(tmp_path / "t.sqlite")
    run_dlprof(f"--database={export}", "--reports=summary", f"--output_path={tmp_path / 'o'}")
    return tmp_path / "o" / "dlprof_dldb.sqlite"


def query(db, sql, params=()):
    con = sqlite3.connect(db)
    try:
        return con.execute(sql, params).fetchall()
    finally:
        con.close()


def test_schema_and_first_aggregation(db):
    assert query(db, "SELECT current_version FROM db_version") == [(DB_SCHEMA_VERSION,)]
    assert query(db, "SELECT aggr_id, key_node, iter_start, iter_stop, total_iterations FROM aggregations") == \
        [(1, "Optimizer.step#SGD.step", 0, 3, 4)]
    assert query(db, "SELECT wall_time, iter_total FROM model_summary WHERE aggr_id = 1") == [(1_290_000, 4)]
    assert query(db, "SELECT count(*) FROM read_only_ranges") == [(36,)]
    assert query(db, "SELECT count(*) FROM read_only_gpu_activities") == [(21,)]
    top = query(db, "SELECT op_name, direction, gpu_total FROM view_op_nodes WHERE aggr_id = 1 "
                    "ORDER BY gpu_total DESC LIMIT 1")
    assert top == [("/aten::conv2d", "fprop", 30_000)]


def test_reaggregation_appends_and_keeps_the_earlier_ones(db, tmp_path):
    aggr = reaggregate_in_place(db, iter_start=1, iter_stop=2)
    assert aggr == 2
    rows = query(db, "SELECT aggr_id, iter_start, iter_stop FROM aggregations ORDER BY aggr_id")
    assert rows == [(1, 0, 3), (2, 1, 2)]
    assert query(db, "SELECT wall_time FROM model_summary WHERE aggr_id = 1") == [(1_290_000,)]
    assert query(db, "SELECT wall_time FROM model_summary WHERE aggr_id = 2") == [(199_000,)]
    # the same numbers as a separate run of the engine on the original export for that range
    run_dlprof(f"--database={tmp_path / 't.sqlite'}", "--iter_start=1", "--iter_stop=2", "--reports=summary",
               "--formats=json", f"--output_path={tmp_path / 'sub'}")
    doc = json.loads((tmp_path / "sub" / "dlprof_summary.json").read_text())
    wall = dict(doc["sections"][1]["rows"])["Wall Clock Time (ns)"]
    assert int(wall) == 199_000
    # a new key node
    aggr3 = reaggregate_in_place(db, key_node="aten::relu")
    assert query(db, "SELECT key_node, total_iterations FROM aggregations WHERE aggr_id = ?", (aggr3,)) == \
        [("aten::relu", 4)]


def test_failed_reaggregation_leaves_the_file_as_it_was(db):
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    with pytest.raises(DLProfError):
        reaggregate_in_place(db, iter_start=2, iter_stop=9)
    with pytest.raises(DLProfError):
        reaggregate_in_place(db, key_node="no such node")
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before


def test_reaggregate_module_reports_json(db):
    proc = subprocess.run([sys.executable, "-m", "dlprof_profiler.reaggregate", "--database", str(db),
                           "--iter_start", "0", "--iter_stop", "0"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and json.loads(proc.stdout) == {"status": "succeeded", "aggr_id": 2}
    proc = subprocess.run([sys.executable, "-m", "dlprof_profiler.reaggregate", "--database", str(db),
                           "--iter_start", "5"], capture_output=True, text=True, timeout=300)
    result = json.loads(proc.stdout)
    assert proc.returncode != 0 and result["status"] == "failed" and "outside the profile" in result["message"]


def test_cli_reaggregation_copies_the_input_database(db, tmp_path):
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    run_dlprof(f"--database={db}", "--key_node=aten::relu", "--reports=summary", f"--output_path={tmp_path / 'r'}")
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before
    new = tmp_path / "r" / "dlprof_dldb.sqlite"
    assert query(new, "SELECT aggr_id, key_node FROM aggregations ORDER BY aggr_id") == \
        [(1, "Optimizer.step#SGD.step"), (2, "aten::relu")]
    # its own folder updates the run (the expert systems' proposed command), never without --force
    proc = run_dlprof(f"--database={db}", f"--output_path={db.parent}", check=False)
    assert proc.returncode == 1 and "use --force=true" in proc.stderr
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before
    run_dlprof(f"--database={db}", f"--output_path={db.parent}", "--key_node=aten::relu", "-f", "true")
    assert query(db, "SELECT aggr_id, key_node FROM aggregations ORDER BY aggr_id") == \
        [(1, "Optimizer.step#SGD.step"), (2, "aten::relu")]


def test_event_file_is_readable_by_tensorboard(db):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    run_dir = db.parent / "dlprof"
    acc = EventAccumulator(str(run_dir), size_guidance={"tensors": 0, "scalars": 0})
    acc.Reload()
    tags = acc.Tags()
    assert "dlprof/profile" in tags["tensors"]
    assert "dlprof/iteration_time_ms" in tags["tensors"] or "dlprof/iteration_time_ms" in tags["scalars"]
    event = acc.Tensors("dlprof/profile")[0]
    meta = json.loads(event.tensor_proto.string_val[0])
    assert meta["database"] == "../dlprof_dldb.sqlite" and meta["mode"] == "pytorch"
    assert acc.SummaryMetadata("dlprof/profile").data_class == 2  # DATA_CLASS_TENSOR: the data server keeps it
    times = acc.Tensors("dlprof/iteration_time_ms") if "dlprof/iteration_time_ms" in tags["tensors"] else \
        acc.Scalars("dlprof/iteration_time_ms")
    assert len(times) == 4
