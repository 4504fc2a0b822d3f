"""The databases of a multi-rank run's ranks merged into one (schema 3.0, every rank's rows): the first rank's
file becomes the run's database as it is (renamed, not copied), the others are appended table by table with
`ATTACH` + `INSERT ... SELECT` in SQLite (bulk, no row passes through Python).

Their keys are already distinct (API calls and GPU activities scoped by rank, op instances and activity owners
by a domain_id in the rank's own block), so rows are copied as they are except for two per-file numberings:
string ids (each file numbers its `strings` from 0) and op_index (each numbers its ops from 0), shifted past
those already merged. Derived rows keep their aggr_id: the run's first aggregation is aggregation 1 of every
rank. The one index with random keys is dropped while appending and built once at the end.
"""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

from dlprof_profiler import contract as K
from dlprof_profiler.db.schema import FINAL_INDEXES, RANK_TABLES
from dlprof_profiler.errors import DLProfError

# columns holding ids into `strings`
STRING_ID_COLUMNS = {
    "name_id",
    "long_name_id",
    "op_type_id",
    "label_id",
    "data_type_id",
    "stack_trace_id",
    "input_shapes_id",
    "output_shapes_id",
    "parameters_id",
}
# tables that describe the whole file: taken from the first rank, never appended
FILE_TABLES = {"db_version", "profile_info", K.AGGREGATIONS, K.STRINGS, K.RANK_PROFILE_INFO, K.RANK_SUMMARY}
CACHE_KIB = 64 << 10


class MergedDatabase:
    """The run's database, built rank by rank in rank order (`add`), then `finish`ed."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.con: sqlite3.Connection | None = None
        self.ranks: list[int] = []

    def add(self, rank_database: Path, rank: int) -> None:
        """Append one rank's database (its file is removed afterwards)."""
        rank_database = Path(rank_database)
        try:
            if self.con is None:
                os.replace(rank_database, self.path)
                self._open()
                self._profile_rows(rank, "main")
            else:
                self._append(rank_database, rank)
                rank_database.unlink()
        except sqlite3.Error as exc:
            raise DLProfError(f"{self.path}: could not merge rank {rank}'s database ({exc})") from None
        self.ranks.append(rank)

    def _open(self) -> None:
        con = sqlite3.connect(self.path, isolation_level=None)
        for pragma in ("journal_mode=OFF", "synchronous=OFF", f"cache_size=-{CACHE_KIB}"):
            con.execute(f"PRAGMA {pragma}")
        for statement in filter(None, (s.strip() for s in FINAL_INDEXES.split(";"))):
            name = statement.split()[2]
            con.execute(f"DROP INDEX IF EXISTS {name}")  # a rank's database written with it (built at finish)
        con.executescript(RANK_TABLES)
        self.con = con

    def _profile_rows(self, rank: int, schema: str) -> None:
        self.con.execute(
            f"INSERT INTO main.{K.RANK_PROFILE_INFO} (rank, name, value) "
            f"SELECT ?, name, value FROM {schema}.profile_info",
            (rank,),
        )

    def _append(self, rank_database: Path, rank: int) -> None:
        con = self.con
        con.execute("ATTACH DATABASE ? AS r", (str(rank_database),))
        try:
            con.execute("BEGIN")
            string_offset = con.execute(f"SELECT coalesce(max(id) + 1, 0) FROM main.{K.STRINGS}").fetchone()[0]
            op_offset = con.execute(f"SELECT coalesce(max(op_index) + 1, 0) FROM main.{K.RAW_OPS}").fetchone()[0]
            con.execute(
                f"INSERT INTO main.{K.STRINGS} (id, value) SELECT id + ?, value FROM r.{K.STRINGS}", (string_offset,)
            )
            tables = [
                r[0]
                for r in con.execute(
                    "SELECT name FROM r.sqlite_master WHERE type = 'table' "
                    "AND name NOT LIKE 'sqlite_%' ORDER BY rootpage"
                )
            ]
            for table in tables:
                if table in FILE_TABLES:
                    continue
                columns = [r[1] for r in con.execute(f'PRAGMA r.table_info("{table}")')]
                if table == K.EXPERT_SYSTEMS_FEEDBACK:
                    columns = [c for c in columns if c != "id"]  # numbered anew in the merged table
                values = [
                    f'"{c}" + :strings' if c in STRING_ID_COLUMNS else f'"{c}" + :ops' if c == "op_index" else f'"{c}"'
                    for c in columns
                ]
                con.execute(
                    f'INSERT INTO main."{table}" ({", ".join(chr(34) + c + chr(34) for c in columns)}) '
                    f'SELECT {", ".join(values)} FROM r."{table}"',
                    {"strings": string_offset, "ops": op_offset},
                )
            self._profile_rows(rank, "r")
            con.execute("COMMIT")
        except BaseException:
            if con.in_transaction:
                con.execute("ROLLBACK")
            raise
        finally:
            con.execute("DETACH DATABASE r")

    def finish(self, profile: dict, aggregation: dict, table, findings: list[dict]) -> None:
        """Build the last index, write the run's profile_info, its aggregation row and the cross-rank rows of
        aggregation 1 (`table`: rank_report.rank_table; `findings`: the cross-rank ones), close the file."""
        con = self.con
        try:
            con.execute("BEGIN")
            write_cross_rank(con, 1, table, findings)
            for key, value in profile.items():
                con.execute(
                    "INSERT OR REPLACE INTO profile_info (name, value) VALUES (?, ?)",
                    (key, value if value is None or isinstance(value, str) else json.dumps(value)),
                )
            if aggregation:
                sets = ", ".join(f"{k} = ?" for k in aggregation)
                con.execute(f"UPDATE {K.AGGREGATIONS} SET {sets} WHERE aggr_id = 1", list(aggregation.values()))
            con.execute("COMMIT")
            con.executescript(FINAL_INDEXES)
        except sqlite3.Error as exc:
            raise DLProfError(f"{self.path}: could not finish the merged database ({exc})") from None
        finally:
            self.close()

    def close(self) -> None:
        if self.con is not None:
            self.con.close()
            self.con = None


def write_cross_rank(con: sqlite3.Connection, aggr_id: int, table, findings: list[dict]) -> None:
    """The cross-rank rows of one aggregation (inside the caller's transaction; the file has RANK_TABLES):
    rank_summary (a row per rank, stragglers flagged) and the findings across ranks (expert_systems_feedback with
    rank and domain_id = contract.ALL_RANKS)."""
    stragglers = {int(f["data"].get("rank")) for f in findings if f.get("id") == "straggler_rank_detector"}
    for row in table.to_dict("records"):
        con.execute(
            f"INSERT INTO {K.RANK_SUMMARY} (aggr_id, rank, source_file, gpus, iterations, total_iterations, "
            "avg_iteration_time, max_iteration_time, gpu_utilization, communication_time, "
            "overlapped_communication_pct, times_slowest, straggler) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                aggr_id,
                int(row["rank"]),
                row["source_file"],
                int(row["gpus"]),
                int(row["iterations"]),
                int(row["total_iterations"]),
                float(row["avg_iteration_time"]),
                int(row["max_iteration_time"]),
                float(row["gpu_utilization"]),
                int(row["communication_time"]),
                float(row["overlapped_communication_pct"]),
                int(row["times_slowest"]),
                int(int(row["rank"]) in stragglers),
            ),
        )
    for f in findings:
        con.execute(
            f"INSERT INTO {K.EXPERT_SYSTEMS_FEEDBACK} (aggr_id, domain_id, rank, exp_sys_id, severity, "
            "problem, recommendation, link, action, data) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                aggr_id,
                K.ALL_RANKS,
                K.ALL_RANKS,
                f.get("id"),
                f.get("severity"),
                f.get("problem"),
                f.get("recommendation"),
                f.get("link"),
                json.dumps(f.get("action")),
                json.dumps(f.get("data", {}), default=str),
            ),
        )
