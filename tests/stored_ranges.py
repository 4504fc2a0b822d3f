"""A DLProf database's NVTX ranges (schema 3.3 stores them as Arrow IPC blocks, `raw_range_blocks`) as a
temporary `raw_ranges` table with schema 3.2's rows, decoded with pyarrow alone (not the engine's reader), so
tests keep asking SQL about them."""

from __future__ import annotations

import sqlite3

import pyarrow as pa
import pyarrow.ipc as ipc

COLUMNS = [
    "range_id",
    "domain_id",
    "thread_id",
    "event_type",
    "start",
    "duration",
    "text_id",
    "seq",
    "op_id",
    "unclosed",
]


def stored_ranges(con: sqlite3.Connection) -> list[tuple]:
    """(rank, *COLUMNS) of every stored range, in the order written."""
    rows = []
    for rank, base, data in con.execute("SELECT rank, text_id_base, data FROM raw_range_blocks ORDER BY rowid"):
        block = ipc.open_stream(pa.py_buffer(data)).read_all()
        assert block.schema.names == COLUMNS
        for values in zip(*(block[c].to_pylist() for c in COLUMNS)):
            row = dict(zip(COLUMNS, values))
            row["text_id"] += base
            rows.append((rank, *row.values()))
    return rows


def with_raw_ranges(con: sqlite3.Connection) -> sqlite3.Connection:
    """`con` with a temporary `raw_ranges` table holding the database's ranges, and schema 3.2's readable view
    of it, `read_only_ranges` (texts whole again, end times, thread ids)."""
    con.execute(f"CREATE TEMP TABLE raw_ranges (rank, {', '.join(COLUMNS)})")
    con.executemany(f"INSERT INTO temp.raw_ranges VALUES ({', '.join('?' * (len(COLUMNS) + 1))})", stored_ranges(con))
    con.execute(
        "CREATE TEMP VIEW read_only_ranges AS SELECT r.rank, r.range_id, r.domain_id, s.value "
        "|| CASE WHEN r.seq IS NULL THEN '' ELSE ', seq = ' || r.seq END "
        "|| CASE WHEN r.op_id IS NULL THEN '' ELSE ', op_id = ' || r.op_id END AS text, "
        'r.start, r.start + r.duration AS "end", t.global_tid, t.pid, r.event_type, r.unclosed '
        "FROM temp.raw_ranges r JOIN strings s ON s.id = r.text_id "
        "LEFT JOIN raw_threads t ON t.rank = r.rank AND t.thread_id = r.thread_id"
    )
    return con
