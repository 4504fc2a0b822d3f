"""Opening input SQLite files safely: read-only, checked, tolerant of text that is not UTF-8."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from dlprof_profiler.errors import DLProfError

SQLITE_MAGIC = b"SQLite format 3\x00"


def check_sqlite_file(path: Path) -> None:
    """Raise a one-line DLProfError unless `path` is a complete SQLite file."""
    if not path.exists():
        raise DLProfError(f"{path}: no such file")
    if path.is_dir():
        raise DLProfError(f"{path}: is a directory, not an SQLite file")
    if not os.access(path, os.R_OK):
        raise DLProfError(f"{path}: not readable (permission denied)")
    size = path.stat().st_size
    with open(path, "rb") as fh:
        header = fh.read(100)
    if size == 0:
        raise DLProfError(f"{path}: empty file, not an SQLite database")
    if not header.startswith(SQLITE_MAGIC):
        raise DLProfError(f"{path}: not an SQLite database (wrong file header)")
    if len(header) < 100:
        raise DLProfError(f"{path}: truncated SQLite file (header incomplete)")
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    page_count = int.from_bytes(header[28:32], "big")
    change_counter = int.from_bytes(header[24:28], "big")
    valid_for = int.from_bytes(header[92:96], "big")
    # The in-header page count is trustworthy only when written by the same change as the counter.
    if page_count and valid_for == change_counter and size < page_size * page_count:
        raise DLProfError(f"{path}: truncated SQLite file ({size} bytes, header says {page_size * page_count})")
    if size % page_size:
        raise DLProfError(f"{path}: truncated SQLite file (size {size} is not a multiple of the page size)")


def _adbc_sqlite():
    """ADBC's SQLite DB-API module, its calls left to Python's own SIGINT handling. On the main thread ADBC
    swaps in a SIGINT handler of its own for each call, whose thread asks the driver to cancel: SQLite's
    driver cannot (ADBC then raises that error from KeyboardInterrupt, which passed for undecodable text), and a
    Ctrl-C arriving as a short call ends was lost (the call clears the cancel before that thread runs it), so
    the run went on. ADBC calls straight through on Windows and off the main thread; here too, so a Ctrl-C
    raises KeyboardInterrupt once the current call returns."""
    import adbc_driver_manager.dbapi as manager
    import adbc_driver_sqlite.dbapi as adbc

    if hasattr(manager, "_blocking_call"):
        manager._blocking_call = _call_through
    return adbc


def _call_through(func, args, kwargs, cancel):
    return func(*args, **kwargs)


def _lenient_text(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace")


class SqliteSource:
    """A read-only connection to an input file, with table and column discovery."""

    CHUNK = 262_144  # rows per fetch: bounds the memory of Python row tuples

    def __init__(self, path: Path | str, immutable: bool = True):
        self.path = Path(path)
        check_sqlite_file(self.path)
        flags = "mode=ro&immutable=1" if immutable else "mode=ro"
        uri = f"{self.path.resolve().as_uri()}?{flags}"
        try:
            self.con = sqlite3.connect(uri, uri=True, check_same_thread=False)
            self.tables = {
                row[0] for row in self.con.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")
            }
        except sqlite3.DatabaseError as exc:
            raise DLProfError(f"{self.path}: unreadable SQLite file ({exc})") from None
        self._columns: dict[str, list[str]] = {}
        self.immutable = immutable
        self._adbc = None

    def close(self) -> None:
        self.con.close()
        if self._adbc:
            self._adbc.close()
            self._adbc = None

    def has(self, table: str) -> bool:
        return table in self.tables

    def columns(self, table: str) -> list[str]:
        if table not in self._columns:
            self._columns[table] = (
                [r[1] for r in self.con.execute(f'PRAGMA table_info("{table}")')] if table in self.tables else []
            )
        return self._columns[table]

    def col(self, table: str, name: str, default: str = "NULL") -> str:
        """The column's name if the table has it, else a default SQL expression aliased to that name."""
        return f'"{name}"' if name in self.columns(table) else f'{default} AS "{name}"'

    def count(self, table: str) -> int:
        if not self.has(table):
            return 0
        return self.query_scalar(f'SELECT count(*) FROM "{table}"')

    def query_scalar(self, sql: str, params=()):
        row = self.fetchall(sql, params)
        return row[0][0] if row else None

    def fetchall(self, sql: str, params=()) -> list[tuple]:
        """Rows of a query; text that is not valid UTF-8 is decoded with replacement characters."""
        try:
            return self.con.execute(sql, params).fetchall()
        except sqlite3.OperationalError as exc:
            if "decode" not in str(exc).lower():
                raise self._damaged(exc) from None
        except sqlite3.DatabaseError as exc:
            raise self._damaged(exc) from None
        self.con.text_factory = _lenient_text
        try:
            return self.con.execute(sql, params).fetchall()
        except sqlite3.DatabaseError as exc:
            raise self._damaged(exc) from None
        finally:
            self.con.text_factory = str

    def _batches(self, sql: str, params, convert) -> list:
        """convert(rows) for each batch of rows; text that is not valid UTF-8 is decoded with replacement
        characters (the whole query is read again leniently, so no batch is seen twice)."""
        for lenient in (False, True):
            if lenient:
                self.con.text_factory = _lenient_text
            try:
                cursor = self.con.execute(sql, params)
                out = []
                while True:
                    rows = cursor.fetchmany(self.CHUNK)
                    if not rows:
                        return out
                    out.append(convert(rows))
            except sqlite3.OperationalError as exc:
                if lenient or "decode" not in str(exc).lower():
                    raise self._damaged(exc) from None
            except sqlite3.DatabaseError as exc:
                raise self._damaged(exc) from None
            finally:
                self.con.text_factory = str
        return []

    def _adbc_table(self, sql: str):
        """The query's result as an Arrow table read by ADBC's SQLite driver (columnar, in C), or None
        when the driver is missing or cannot read it (text that is not UTF-8, mixed column types)."""
        if self._adbc is False:
            return None
        try:
            if self._adbc is None:
                adbc = _adbc_sqlite()
                flags = "mode=ro&immutable=1" if self.immutable else "mode=ro"
                self._adbc = adbc.connect(f"{self.path.resolve().as_uri()}?{flags}")
            cursor = self._adbc.cursor()
            try:
                # large batches: integer columns then come back as single chunks numpy can share
                cursor.adbc_statement.set_options(**{"adbc.sqlite.query.batch_rows": str(1 << 24)})
                cursor.execute(sql)
                table = cursor.fetch_arrow_table()
            finally:
                cursor.close()
            for column in table.columns:
                if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
                    column.validate(full=True)
            return table
        except ImportError:
            self._adbc = False
            return None
        except Exception:  # fall back to the sqlite3 module, which decodes leniently
            return None

    def record_batches(self, sql: str, schema: pa.Schema, rows_per_batch: int = 1 << 20):
        """The query's rows as Arrow record batches of `schema`, streamed (bounded memory): through ADBC's
        SQLite driver, else (text that is not UTF-8) through the sqlite3 module with lenient decoding."""
        try:
            adbc = _adbc_sqlite()
            flags = "mode=ro&immutable=1" if self.immutable else "mode=ro"
            con = adbc.connect(f"{self.path.resolve().as_uri()}?{flags}")
        except ImportError:
            con = None
        done = 0  # rows already yielded: a lenient re-read skips them (same query, same order)
        if con is not None:
            try:
                cursor = con.cursor()
                cursor.adbc_statement.set_options(**{"adbc.sqlite.query.batch_rows": str(rows_per_batch)})
                cursor.execute(sql)
                for batch in cursor.fetch_record_batch():
                    for column in batch.columns:
                        if pa.types.is_string(column.type):
                            column.validate(full=True)
                    if batch.schema != schema:  # by position: the query's column names are its expressions
                        batch = pa.RecordBatch.from_arrays(
                            [c if c.type == f.type else c.cast(f.type) for c, f in zip(batch.columns, schema)],
                            schema=schema,
                        )
                    yield batch
                    done += batch.num_rows
                cursor.close()
                return
            except Exception:  # noqa: BLE001 - undecodable text or mixed types: read it leniently below
                pass
            finally:
                con.close()
        for lenient in (False, True):
            if lenient:
                self.con.text_factory = _lenient_text
            try:
                cursor = self.con.execute(sql)
                skip = done
                while True:
                    rows = cursor.fetchmany(self.CHUNK)
                    if not rows:
                        return
                    if skip:
                        cut = min(skip, len(rows))
                        rows, skip = rows[cut:], skip - cut
                        if not rows:
                            continue
                    columns = list(zip(*rows))
                    batch = pa.record_batch([pa.array(c, type=f.type) for c, f in zip(columns, schema)], schema=schema)
                    yield batch
                    done += batch.num_rows
            except sqlite3.OperationalError as exc:
                if lenient or "decode" not in str(exc).lower():
                    raise self._damaged(exc) from None
            except sqlite3.DatabaseError as exc:
                raise self._damaged(exc) from None
            finally:
                self.con.text_factory = str

    def int_columns(self, sql: str, names: list[str], params=()) -> dict:
        """Integer columns of a query as numpy arrays (the query must not return NULLs: coalesce them)."""
        table = None if params else self._adbc_table(sql)
        if table is not None and all(pa.types.is_integer(c.type) or c.null_count == len(c) for c in table.columns):
            return {
                name: np.asarray(table.column(i).to_numpy(), dtype=np.int64)
                if table.num_rows
                else np.zeros(0, dtype=np.int64)
                for i, name in enumerate(names)
            }
        parts = self._batches(sql, params, lambda rows: np.array(rows, dtype=np.int64))
        matrix = np.concatenate(parts) if parts else np.zeros((0, len(names)), dtype=np.int64)
        return {name: np.ascontiguousarray(matrix[:, i]) for i, name in enumerate(names)}

    def arrow_text_column(self, sql: str, params=()):
        """One text column as an Arrow string array (compact: no Python string object per row)."""
        table = None if params else self._adbc_table(sql)
        if table is not None and table.num_columns == 1:
            column = table.column(0)
            if pa.types.is_null(column.type) or column.null_count == len(column):
                return pa.nulls(len(column), pa.string())
            if pa.types.is_string(column.type):
                return column.combine_chunks()
        parts = self._batches(sql, params, lambda rows: pa.array([r[0] for r in rows], type=pa.string()))
        return pa.chunked_array(parts, type=pa.string()).combine_chunks() if parts else pa.array([], pa.string())

    def text_column(self, sql: str, params=()) -> np.ndarray:
        """One text column as an object array (None for NULL)."""

        def convert(rows):
            part = np.empty(len(rows), dtype=object)
            part[:] = [r[0] for r in rows]
            return part

        parts = self._batches(sql, params, convert)
        return np.concatenate(parts) if parts else np.zeros(0, dtype=object)

    def frame(self, sql: str, columns: list[str], params=()) -> pd.DataFrame:
        rows = self.fetchall(sql, params)
        return (
            pd.DataFrame.from_records(rows, columns=columns)
            if rows
            else pd.DataFrame({c: pd.Series(dtype="int64") for c in columns})
        )

    def _damaged(self, exc: Exception) -> DLProfError:
        return DLProfError(f"{self.path}: damaged or truncated SQLite file ({exc})")
