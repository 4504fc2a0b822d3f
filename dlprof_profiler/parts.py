"""Tables of an out-of-core analysis kept on disk as Arrow IPC files, a part at a time.

A part is written whole once (LZ4-compressed Arrow buffers: no encoding) and read back whole, so a time
segment's rows come back as the arrays they were. Each part carries a tag (the time segment or
chunk it belongs to) and the segment it was written from, so a reader takes just the parts it needs. For
ad-hoc SQL (the expert systems' queries, the op table) a table is registered in a DuckDB connection as a
view over its files (`register`); no row is copied into DuckDB.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.ipc as ipc

_SERIAL = itertools.count()
# LZ4: the columns are mostly small integers and -1s: a third of the bytes, and compressing them costs less than
# handing the kernel three times as many pages to write (measured: 10^6 instances, 204 MB: 0.40 s to write
# plain, 0.17 s compressed; reading back 0.02 s / 0.09 s)
WRITE_OPTIONS = ipc.IpcWriteOptions(compression=__import__("os").environ.get("DLPROF_PART_COMPRESSION", "lz4") or None)


@dataclass(frozen=True)
class Part:
    path: Path
    tag: int  # the time chunk its rows belong to
    source: int  # the time segment it was written from
    rows: int
    low: int = 0  # the least and greatest value of the table's key column in the part (see PartTable.key)
    high: int = -1


class PartTable:
    """One table as Arrow IPC files in a folder (see the module docstring)."""

    def __init__(self, folder: Path, name: str, schema: pa.Schema, key: str | None = None):
        """`key`: an integer column whose range each part records, for `read_range`."""
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.schema = schema
        self.key = key
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
        with ipc.new_file(path, self.schema, options=WRITE_OPTIONS) as out:
            out.write_table(table, max_chunksize=1 << 20)
        low, high = 0, -1
        if self.key is not None:
            values = table.column(self.key)
            low, high = int(pc.min(values).as_py()), int(pc.max(values).as_py())
        self.parts.append(Part(path, int(tag), int(tag if source is None else source), table.num_rows, low, high))

    def read(self, tag: int | None = None, source: int | None = None, columns=None) -> pa.Table:
        """The rows of the parts with this tag and/or source (all parts without either), in writing order."""
        chosen = [p for p in self.parts if (tag is None or p.tag == tag) and (source is None or p.source == source)]
        tables = [read_part(p.path, columns) for p in chosen]
        if not tables:
            schema = self.schema if columns is None else pa.schema([self.schema.field(c) for c in columns])
            return schema.empty_table()
        return tables[0] if len(tables) == 1 else pa.concat_tables(tables)

    def read_range(self, lo: int, hi: int, columns=None) -> dict:
        """Numpy columns of the rows whose key is in [lo, hi), from the parts whose key range meets it."""
        names = list(self.schema.names if columns is None else columns)
        if self.key not in names:
            names.append(self.key)
        found = []
        for p in self.parts:
            if p.high >= lo and p.low < hi:
                table = read_part(p.path, names)
                key = table.column(self.key).to_numpy()
                if p.low >= lo and p.high < hi:
                    found.append({c: table.column(c).to_numpy() for c in names})
                else:
                    rows = np.flatnonzero((key >= lo) & (key < hi))
                    found.append({c: table.column(c).to_numpy()[rows] for c in names})
        if not found:
            return {c: np.zeros(0, dtype=self.schema.field(c).type.to_pandas_dtype()) for c in names}
        if len(found) == 1:
            return found[0]
        return {c: np.concatenate([f[c] for f in found]) for c in names}

    def lookup(self, keys: np.ndarray, columns) -> dict:
        """Numpy columns of the rows with the given key values (a unique key, in increasing order within each
        part), in the order of `keys`; rows of keys not found are 0."""
        keys = np.asarray(keys, dtype=np.int64)
        out = {c: np.zeros(keys.size, dtype=self.schema.field(c).type.to_pandas_dtype()) for c in columns}
        if keys.size == 0:
            return out
        lo, hi = int(keys.min()), int(keys.max())
        for p in self.parts:
            if p.high < lo or p.low > hi:
                continue
            inside = np.flatnonzero((keys >= p.low) & (keys <= p.high))
            if inside.size == 0:
                continue
            table = read_part(p.path, [self.key, *columns])
            stored = table.column(self.key).to_numpy()
            at = np.minimum(np.searchsorted(stored, keys[inside]), stored.size - 1)
            found = stored[at] == keys[inside]
            for c in columns:
                out[c][inside[found]] = table.column(c).to_numpy()[at[found]]
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


def read_part(path: Path, columns=None) -> pa.Table:
    """One part, memory-mapped (its buffers are views of the file)."""
    with pa.memory_map(str(path)) as source:
        table = ipc.open_file(source).read_all()
    return table.select(columns) if columns is not None else table


def numpy_columns(table: pa.Table, columns=None) -> dict:
    """Columns of an Arrow table as numpy arrays (views where the data allow it)."""
    names = table.column_names if columns is None else columns
    out = {}
    for name in names:
        column = table.column(name)
        out[name] = column.to_numpy() if column.num_chunks != 1 else column.chunk(0).to_numpy(zero_copy_only=False)
    return out


def schema_of(int64: list[str] = (), **typed) -> pa.Schema:
    """A schema of int64 columns, then typed ones (`name=pa type`)."""
    return pa.schema([(c, pa.int64()) for c in int64] + list(typed.items()))


def int_schema(columns) -> pa.Schema:
    """A schema of columns that are all int64."""
    return pa.schema([(c, pa.int64()) for c in columns])


EMPTY = np.zeros(0, dtype=np.int64)
