"""NVTX ranges stored as Arrow blocks (db/range_blocks.py): what is written is read back, each rank's own in
order; a schema 3.2 file (ranges as rows) reads as its 3.3 twin."""

from __future__ import annotations

import sqlite3

import pandas as pd
import pyarrow as pa
import pytest

from dlprof_profiler import contract as K
from dlprof_profiler.db import range_blocks
from dlprof_profiler.db.load import load_model
from dlprof_profiler.db.schema import SCHEMA
from dlprof_profiler.errors import DLProfError
from dlprof_profiler.ingest.sqlite_source import SqliteSource
from tests import profiles
from tests.profiles import run_dlprof
from tests.stored_ranges import COLUMNS, as_schema_3_2


def block(first: int, n: int) -> pa.Table:
    ids = list(range(first, first + n))
    return pa.table(
        {
            "range_id": ids,
            "domain_id": [7] * n,
            "thread_id": [i % 3 for i in ids],
            "event_type": [59] * n,
            "start": [1000 * i for i in ids],
            "duration": [10 + i for i in ids],
            "unclosed": [int(i == first) for i in ids],
            "text": [f"aten::mm, seq = {i}, op_id = {5 * i}" if i % 2 else f"é{i}\n" for i in ids],
        }
    )


def test_blocks_read_back_in_order_by_rank(tmp_path):
    path = tmp_path / "db.sqlite"
    con = sqlite3.connect(path)
    con.executescript(SCHEMA)
    rows = [range_blocks.block_row(block(0, 5), rank=2), range_blocks.block_row(block(5, 4), rank=2)]
    rows.append(range_blocks.block_row(block(100, 3), rank=1))  # another rank's block, between none of them
    for row in rows:
        con.execute(f"INSERT INTO {K.RAW_RANGE_BLOCKS} VALUES (?, ?, ?)", [row[c][0].as_py() for c in row.column_names])
    con.commit()
    assert con.execute(f"SELECT rank, rows FROM {K.RAW_RANGE_BLOCKS} ORDER BY rowid").fetchall() == [
        (2, 5),
        (2, 4),
        (1, 3),
    ]
    con.close()
    src = SqliteSource(path, immutable=True)
    try:
        got = range_blocks.read_ranges(src, 2)
        assert range_blocks.read_ranges(src, 5).num_rows == 0
    finally:
        src.close()
    assert got.to_pylist() == pa.concat_tables([block(0, 5), block(5, 4)]).to_pylist()
    assert got.schema == range_blocks.BLOCK_SCHEMA and got.column_names == COLUMNS


@pytest.mark.slow
def test_a_3_2_database_with_range_rows_reads_as_its_3_3_twin(tmp_path):
    export = profiles.training_profile(tmp_path / "t.sqlite")
    run_dlprof(f"--database={export}", "--reports=summary", f"--output_path={tmp_path / 'o'}")
    new = tmp_path / "o" / "dlprof_dldb.sqlite"
    old = tmp_path / "old.sqlite"
    old.write_bytes(new.read_bytes())
    con = sqlite3.connect(old)
    n = as_schema_3_2(con)  # the call fields cut off as 3.2 stored them, in plain Python
    # 36 emit_nvtx texts, each with its own op_id: 12 distinct shared texts
    assert con.execute("SELECT count(op_id), count(DISTINCT text_id) FROM raw_ranges").fetchone() == (36, 12)
    con.close()
    a, b = load_model(old)[0].ranges, load_model(new)[0].ranges
    assert len(a) == n == 36
    pd.testing.assert_frame_equal(a, b)
    assert b["text"].str.contains(", op_id = ").sum() == 36  # the texts are whole again


def test_a_database_without_its_ranges_is_named_damaged(tmp_path):
    path = tmp_path / "db.sqlite"
    con = sqlite3.connect(path)
    con.executescript(SCHEMA)
    con.execute(f"DROP TABLE {K.RAW_RANGE_BLOCKS}")
    con.execute("INSERT INTO db_version VALUES ('3.3.0', '3.3.0', 'dlprof test')")
    con.commit()
    con.close()
    with pytest.raises(DLProfError, match=f"damaged DLProf database: table {K.RAW_RANGE_BLOCKS} missing"):
        load_model(path)
