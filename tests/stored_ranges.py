"""A DLProf database's NVTX ranges (schema 3.3 stores them as Arrow IPC blocks, `raw_range_blocks`) as a
temporary `raw_ranges` table, decoded with pyarrow alone (not the engine's reader), so tests keep asking SQL
about them; and the same ranges as schema 3.2 stored them, to build a 3.2 twin of a database."""

from __future__ import annotations

import re
import sqlite3

import pyarrow as pa
import pyarrow.ipc as ipc

COLUMNS = ["range_id", "domain_id", "thread_id", "event_type", "start", "duration", "unclosed", "text"]


def stored_ranges(con: sqlite3.Connection) -> list[tuple]:
    """(rank, *COLUMNS) of every stored range, in the order written."""
    rows = []
    for rank, data in con.execute("SELECT rank, data FROM raw_range_blocks ORDER BY rowid"):
        block = ipc.open_stream(pa.py_buffer(data)).read_all()
        assert block.schema.names == COLUMNS
        rows.extend((rank, *values) for values in zip(*(block[c].to_pylist() for c in COLUMNS)))
    return rows


def with_raw_ranges(con: sqlite3.Connection) -> sqlite3.Connection:
    """`con` with a temporary `raw_ranges` table holding the database's ranges, and a readable view of it,
    `read_only_ranges` (end times, thread ids), as schema 3.2 had."""
    con.execute(f"CREATE TEMP TABLE raw_ranges (rank, {', '.join(COLUMNS)})")
    con.executemany(f"INSERT INTO temp.raw_ranges VALUES ({', '.join('?' * (len(COLUMNS) + 1))})", stored_ranges(con))
    con.execute(
        "CREATE TEMP VIEW read_only_ranges AS SELECT r.rank, r.range_id, r.domain_id, r.text, "
        'r.start, r.start + r.duration AS "end", t.global_tid, t.pid, r.event_type, r.unclosed '
        "FROM temp.raw_ranges r LEFT JOIN raw_threads t ON t.rank = r.rank AND t.thread_id = r.thread_id"
    )
    return con


def split_call_fields(text: str) -> tuple[str, int | None, int | None]:
    """(shared part, seq, op_id) as schema 3.0-3.2 stored a range's text: the first `, seq = ` and
    `, op_id = ` (in that order) end the text with integers written as Python writes them (at most 18
    digits), else the text stays whole."""
    s, o = text.find(", seq = "), text.find(", op_id = ")
    if (s >= 0 and o >= 0 and o < s) or (s < 0 and o < 0):
        return text, None, None

    def canonical(piece):
        return re.fullmatch(r"-?[0-9]{1,18}", piece) is not None and str(int(piece)) == piece

    seq = text[s + len(", seq = ") : o if o >= 0 else len(text)] if s >= 0 else None
    op = text[o + len(", op_id = ") :] if o >= 0 else None
    if (seq is not None and not canonical(seq)) or (op is not None and not canonical(op)):
        return text, None, None
    return text[: s if s >= 0 else o], None if seq is None else int(seq), None if op is None else int(op)


def as_schema_3_2(con: sqlite3.Connection) -> int:
    """Turn the database into its schema 3.2 twin: the ranges as `raw_ranges` rows (the shared text a string
    id, the call fields integers) instead of blocks; returns the number of ranges."""
    ranges = stored_ranges(con)
    next_id = con.execute("SELECT coalesce(max(id), -1) + 1 FROM strings").fetchone()[0]
    ids = dict(con.execute("SELECT value, id FROM strings"))
    rows = []
    for *head, text in ranges:
        shared, seq, op_id = split_call_fields(text)
        if shared not in ids:
            ids[shared] = next_id
            con.execute("INSERT INTO strings VALUES (?, ?)", (next_id, shared))
            next_id += 1
        rank, range_id, domain_id, thread_id, event_type, start, duration, unclosed = head
        rows.append(
            (rank, range_id, domain_id, thread_id, event_type, start, duration, ids[shared], seq, op_id, unclosed)
        )
    con.execute(
        "CREATE TABLE raw_ranges (rank INTEGER NOT NULL, range_id INTEGER NOT NULL, domain_id INTEGER NOT NULL, "
        "thread_id INTEGER NOT NULL, event_type INTEGER, start INTEGER NOT NULL, duration INTEGER NOT NULL, "
        "text_id INTEGER NOT NULL, seq INTEGER, op_id INTEGER, unclosed INTEGER NOT NULL)"
    )
    con.executemany(f"INSERT INTO raw_ranges VALUES ({', '.join('?' * 11)})", rows)
    con.execute("DROP TABLE raw_range_blocks")
    con.execute("UPDATE db_version SET current_version = '3.2.0', original_version = '3.2.0'")
    con.commit()
    return len(rows)
