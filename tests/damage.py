"""Damaged copies of exports and databases for the hardening tests: NULL or reversed timestamps (the nsys
schema declares most times NOT NULL, so the constraint is dropped first, as a foreign or broken exporter
would), dropped tables, cut files."""

from __future__ import annotations

import hashlib
import shutil
import sqlite3
from pathlib import Path


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def allow_nulls(con: sqlite3.Connection, table: str) -> None:
    """Recreate `table` with its NOT NULL constraints removed (rows, rowids and column order kept)."""
    ddl = con.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)).fetchone()[0]
    con.execute(f'ALTER TABLE "{table}" RENAME TO "old_{table}"')
    con.execute(ddl.replace(" NOT NULL", ""))
    con.execute(f'INSERT INTO "{table}" SELECT * FROM "old_{table}" ORDER BY rowid')
    con.execute(f'DROP TABLE "old_{table}"')


def damaged_copy(source: Path, target: Path, *statements: str, nullable=()) -> Path:
    """A copy of `source` with `nullable` tables freed of NOT NULL and the SQL statements applied."""
    target = Path(target)
    shutil.copy(source, target)
    con = sqlite3.connect(target)
    try:
        for table in nullable:
            allow_nulls(con, table)
        for sql in statements:
            con.execute(sql)
        con.commit()
    finally:
        con.close()
    return target
