"""Tables of an out-of-core analysis kept on disk as Arrow IPC files, a part at a time.

A part is written whole once (Arrow buffers as they are: no encoding) and read back memory-mapped, so a time
segment's rows come back without a copy. Each part carries a tag (the time chunk it belongs to), the segment
it was written from and the range of its key columns, so a reader takes just the parts it needs. For ad-hoc
SQL (the expert systems' queries, the op table) a table is registered in a DuckDB connection as a view over
its files (`register`); no row is copied into DuckDB.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.ipc as ipc

_SERIAL = itertools.count()

# How parts are compressed as they are written, unless a table says otherwise. Most tables are read about once
# or twice, and their columns are mostly
# flags, small codes and repeated ids, which lz4 shrinks 4-7x for about the CPU of copying them uncompressed.
# The run's peak use of its output folder (staged parts, database, reports): 2.4 -> 1.1 GB at 10^6 kernels,
# 24 -> 12 GB at 10^7, in the same time and CPU within the machine's noise. Tables read again for
# every time segment (the GPU activities, the API calls) are created uncompressed (compression=None):
# memory-mapped, they are read without a copy.
COMPRESSED = "lz4"
PART_BATCH_ROWS = 1 << 20  # rows per record batch of a part: a part of up to that many reads back as one array
# A table read by key range a segment at a time whose parts' key ranges overlap (range_info: nsys writes ranges
# as they end, so a part holds the long ones that started long before) keeps each batch's key range: read_range
# then decodes only the batches its range meets, not the whole parts (at 3·10^6 kernels 11.4M rows decoded for
# the 9.0M read, against 17.8M)
SMALL_BATCH_ROWS = 1 << 16


@dataclass(frozen=True)
class Part:
    path: Path
    tag: int  # the time chunk its rows belong to
    source: int  # the time segment it was written from
    rows: int
    bounds: dict = field(default_factory=dict)  # key column -> (least, greatest) value in the part
    # key column -> (least, greatest) value per record batch of the part (tables written in small batches)
    batch_bounds: dict = field(default_factory=dict)


class PartTable:
    """One table as Arrow IPC files in a folder (see the module docstring)."""

    def __init__(
        self,
        folder: Path,
        name: str,
        schema: pa.Schema,
        keys=(),
        compression: str | None = COMPRESSED,
        batch_rows: int = PART_BATCH_ROWS,
    ):
        """`keys`: integer columns whose range each part records (`read_range`, `lookup`), the first the default.
        `compression`: None for a table read again and again, which memory-mapped parts serve without a copy
        (see COMPRESSED). `batch_rows`: rows per record batch; smaller batches (SMALL_BATCH_ROWS) record their
        key ranges too, so `read_range` decodes just the batches its range meets (a whole part read then
        takes a copy to join them)."""
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.schema = schema
        self.keys = tuple(keys)
        self.options = ipc.IpcWriteOptions(compression=compression)
        self.batch_rows = int(batch_rows)
        self.parts: list[Part] = []

    @property
    def rows(self) -> int:
        return sum(p.rows for p in self.parts)

    def append(self, columns, tag: int = 0, source: int | None = None) -> None:
        """Write rows (a dict of arrays or an Arrow table, in the table's column order) as a new part."""
        table = columns if isinstance(columns, pa.Table) else pa.table(columns, schema=self.schema)
        if table.num_rows == 0:
            return
        if table.schema != self.schema:
            table = table.cast(self.schema)
        path = self.folder / f"{self.name}.{next(_SERIAL)}.arrow"
        batches = table.to_batches(max_chunksize=self.batch_rows)
        with ipc.new_file(path, self.schema, options=self.options) as out:
            for batch in batches:
                out.write_batch(batch)
        bounds, batch_bounds = {}, {}
        for key in self.keys:
            low, high = pc.min_max(table.column(key)).values()
            bounds[key] = (int(low.as_py()), int(high.as_py()))
            if self.batch_rows < PART_BATCH_ROWS and len(batches) > 1:  # (a few dozen batches a part)
                ranges = [pc.min_max(b.column(key)) for b in batches]
                batch_bounds[key] = (
                    np.array([r["min"].as_py() for r in ranges], dtype=np.int64),
                    np.array([r["max"].as_py() for r in ranges], dtype=np.int64),
                )
        self.parts.append(
            Part(path, int(tag), int(tag if source is None else source), table.num_rows, bounds, batch_bounds)
        )

    def read(self, tag: int | None = None, source: int | None = None, columns=None) -> pa.Table:
        """The rows of the parts with this tag and/or source (all parts without either), in writing order."""
        chosen = [p for p in self.parts if (tag is None or p.tag == tag) and (source is None or p.source == source)]
        tables = [self.read_part(p, columns) for p in chosen]
        if not tables:
            schema = self.schema if columns is None else pa.schema([self.schema.field(c) for c in columns])
            return schema.empty_table()
        return tables[0] if len(tables) == 1 else pa.concat_tables(tables)

    def read_part(self, part: Part, columns=None) -> pa.Table:
        return read_part(part.path, columns, self.schema)

    def read_range(self, lo: int, hi: int, columns=None, key: str | None = None, where=None) -> dict:
        """Numpy columns of the rows whose key is in [lo, hi), from the parts whose key range meets it, in the
        parts' order; `where(columns of a part)`: a mask of the rows to keep besides (read as `columns`)."""
        key = key or self.keys[0]
        names = list(self.schema.names if columns is None else columns)
        wanted = names if key in names else names + [key]
        found = []
        for p in self.parts:
            low, high = p.bounds[key]
            if high < lo or low >= hi:
                continue
            table = self._read_part_range(p, key, lo, hi, wanted)
            cols = {c: _numpy(table.column(c)) for c in wanted}
            if low >= lo and high < hi and where is None:
                found.append({c: cols[c] for c in names})
                continue
            keep = (cols[key] >= lo) & (cols[key] < hi)
            if where is not None:
                keep &= where(cols)
            rows = np.flatnonzero(keep)
            if rows.size:
                found.append({c: cols[c][rows] for c in names})
        if not found:
            return {c: np.zeros(0, dtype=self.schema.field(c).type.to_pandas_dtype()) for c in names}
        if len(found) == 1:
            return found[0]
        return {c: np.concatenate([f[c] for f in found]) for c in names}

    def _read_part_range(self, part: Part, key: str, lo: int, hi: int, columns) -> pa.Table:
        """The part's columns, of just the record batches whose key range meets [lo, hi) when it records them."""
        if key not in part.batch_bounds:
            return self.read_part(part, columns)
        lows, highs = part.batch_bounds[key]
        meets = np.flatnonzero((highs >= lo) & (lows < hi))
        if meets.size == lows.size:
            return self.read_part(part, columns)
        return read_part(part.path, columns, self.schema, batches=meets)

    def lookup(self, keys: np.ndarray, columns, key: str | None = None) -> dict:
        """Numpy columns of the rows with the given values of a unique key that increases within each part,
        in the order of `keys`; rows of values not found are 0."""
        key = key or self.keys[0]
        keys = np.asarray(keys, dtype=np.int64)
        out = {c: np.zeros(keys.size, dtype=self.schema.field(c).type.to_pandas_dtype()) for c in columns}
        if keys.size == 0:
            return out
        lo, hi = int(keys.min()), int(keys.max())
        for p in self.parts:
            low, high = p.bounds[key]
            if high < lo or low > hi:
                continue
            inside = np.flatnonzero((keys >= low) & (keys <= high))
            if inside.size == 0:
                continue
            table = self.read_part(p, [key, *columns])
            stored = _numpy(table.column(key))
            at = np.minimum(np.searchsorted(stored, keys[inside]), stored.size - 1)
            found = stored[at] == keys[inside]
            for c in columns:
                out[c][inside[found]] = _numpy(table.column(c))[at[found]]
        return out

    def sources(self) -> list[int]:
        return sorted({p.source for p in self.parts})

    def dataset(self):
        """Every part as one pyarrow dataset (or an empty table), for SQL."""
        if not self.parts:
            return self.schema.empty_table()
        return pads.dataset([str(p.path) for p in self.parts], schema=self.schema, format="ipc")

    def register(self, con, name: str | None = None) -> None:
        """Make the table queryable as `name` (default: its own) on a DuckDB connection or cursor."""
        con.register(name or self.name, self.dataset())

    def drop(self) -> None:
        for p in self.parts:
            p.path.unlink(missing_ok=True)
        self.parts = []


def read_part(path: Path, columns=None, schema: pa.Schema | None = None, batches=None) -> pa.Table:
    """One part (the named columns only; of `batches`, its record batches of those numbers, if given),
    memory-mapped: its buffers are views of the file unless compressed."""
    options = None
    if columns is not None and schema is not None:
        options = ipc.IpcReadOptions(included_fields=[schema.get_field_index(c) for c in columns])
    with pa.memory_map(str(path)) as source:
        reader = ipc.open_file(source, options=options)
        if batches is None:
            table = reader.read_all()
        else:
            table = pa.Table.from_batches([reader.get_batch(int(i)) for i in batches], reader.schema)
    return table.select(list(columns)) if columns is not None else table


def _numpy(column) -> np.ndarray:
    """A column as a numpy array (a view where the data allow it)."""
    if isinstance(column, pa.ChunkedArray) and column.num_chunks == 1:
        column = column.chunk(0)
    return column.to_numpy(zero_copy_only=False) if isinstance(column, pa.Array) else column.to_numpy()


def int_schema(columns) -> pa.Schema:
    """A schema of columns that are all int64."""
    return pa.schema([(c, pa.int64()) for c in columns])
