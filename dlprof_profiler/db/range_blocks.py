"""The database's NVTX ranges as compressed Arrow IPC blocks (schema 3.3, table `raw_range_blocks`).

Why blocks and not rows: the ranges are the database's largest table (three per kernel in a typical export) and
nothing queries them row by row: the viewer reads the precounted `raw_range_labels`, and only a re-analysis of
the database (`--database=DB`, the viewer's re-aggregation) reads them, all at once. Inserted as SQLite rows
they cost about 1 µs each on the writer's thread, which sets the pace of the whole run; a block of 2^18 rows
costs a few milliseconds and less than half the space (measured in docs/DESIGN.md, "Blocks, not rows").

A block row holds `rank`, `rows` (so `SELECT sum(rows)` counts ranges without opening a block) and `data`, an
Arrow IPC stream of BLOCK_SCHEMA. The texts are in the block as they were recorded, not string ids: PyTorch's
texts differ in every range (`, seq = N, op_id = M`), so interning them means cutting those fields off first,
which cost more than compressing the texts whole. A block names no string, so merging rank databases
(db/merge.py) copies it as it is.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.ipc as ipc

from dlprof_profiler import contract as K

BLOCK_SCHEMA = pa.schema(
    [
        ("range_id", pa.int64()),
        ("domain_id", pa.int64()),
        ("thread_id", pa.int64()),
        ("event_type", pa.int64()),
        ("start", pa.int64()),
        ("duration", pa.int64()),
        ("unclosed", pa.int64()),
        ("text", pa.string()),
    ]
)
# zstd: the fastest of Arrow's codecs here that also makes the blocks small (3·10^6 PyTorch ranges: 0.1 s, 30 MB,
# where SQLite rows took 1.9 s and 108 MB); the database is the copy a user keeps
COMPRESSION = "zstd"
_WRITE_OPTIONS = ipc.IpcWriteOptions(compression=COMPRESSION)


def block_row(ranges: pa.Table, rank: int) -> pa.Table:
    """The `raw_range_blocks` row holding `ranges` (BLOCK_SCHEMA's columns: db/encode.range_rows)."""
    block = ranges.select(BLOCK_SCHEMA.names).cast(BLOCK_SCHEMA)
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, BLOCK_SCHEMA, options=_WRITE_OPTIONS) as stream:
        stream.write_table(block)
    return pa.table(
        {
            "rank": pa.array([rank], pa.int64()),
            "rows": pa.array([block.num_rows], pa.int64()),
            "data": pa.array([sink.getvalue().to_pybytes()], pa.binary()),
        }
    )


def read_ranges(src, rank: int) -> pa.Table:
    """Every range of `rank` in the order written (BLOCK_SCHEMA). `src` is an ingest.sqlite_source.SqliteSource
    on the database."""
    parts = []
    for (data,) in src.fetchall(f"SELECT data FROM {K.RAW_RANGE_BLOCKS} WHERE rank = ? ORDER BY rowid", (rank,)):
        parts.append(ipc.open_stream(pa.py_buffer(data)).read_all())
    return pa.concat_tables(parts) if parts else BLOCK_SCHEMA.empty_table()
