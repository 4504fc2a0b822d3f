"""Opening input SQLite files safely: read-only, checked, tolerant of text that is not UTF-8."""
from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import numpy as np
import pandas as pd

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
        raise DLProfError(f"{path}: truncated SQLite file ({size} bytes, header says "
                          f"{page_size * page_count})")
    if size % page_size:
        raise DLProfError(f"{path}: truncated SQLite file (size {size} is not a multiple of the page size)")


def _lenient_text(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace")


class SqliteSource:
    """A read-only connection to an input file, with table and column discovery."""

    def __init__(self, path: Path | str, immutable: bool = True):
        self.path = Path(path)
        check_sqlite_file(self.path)
        flags = "mode=ro&immutable=1" if immutable else "mode=ro"
        uri = f"{self.path.resolve().as_uri()}?{flags}"
        try:
            self.con = sqlite3.connect(uri, uri=True, check_same_thread=False)
            self.tables = {row[0] for row in self.con.execute(
                "SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")}
        except sqlite3.DatabaseError as exc:
            raise DLProfError(f"{self.path}: unreadable SQLite file ({exc})") from None
        self._columns: dict[str, list[str]] = {}

    def close(self) -> None:
        self.con.close()

    def has(self, table: str) -> bool:
        return table in self.tables

    def columns(self, table: str) -> list[str]:
        if table not in self._columns:
            self._columns[table] = [r[1] for r in self.con.execute(f'PRAGMA table_info("{table}")')] \
                if table in self.tables else []
        return self._columns[table]

    def col(self, table: str, name: str, default: str = "NULL") -> str:
        """The column's name if the table has it, else a default SQL expression aliased to that name."""
        return f'"{name}"' if name in self.columns(table) else f"{default} AS \"{name}\""

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

    def int_columns(self, sql: str, names: list[str], params=()) -> dict:
        """Integer columns of a query as numpy arrays (the query must not return NULLs: coalesce them)."""
        rows = self.fetchall(sql, params)
        matrix = np.array(rows, dtype=np.int64) if rows else np.zeros((0, len(names)), dtype=np.int64)
        return {name: matrix[:, i] for i, name in enumerate(names)}

    def text_column(self, sql: str, params=()) -> np.ndarray:
        """One text column as an object array (None for NULL)."""
        rows = self.fetchall(sql, params)
        out = np.empty(len(rows), dtype=object)
        out[:] = [r[0] for r in rows]
        return out

    def frame(self, sql: str, columns: list[str], params=()) -> pd.DataFrame:
        rows = self.fetchall(sql, params)
        return pd.DataFrame.from_records(rows, columns=columns) if rows else pd.DataFrame(
            {c: pd.Series(dtype="int64") for c in columns})

    def _damaged(self, exc: Exception) -> DLProfError:
        return DLProfError(f"{self.path}: damaged or truncated SQLite file ({exc})")
