"""Read-only access to DLProf databases for the plugin and the standalone viewer.

One `Database` per file (realpath): a small pool of read-only SQLite connections (`mode=ro` URI, busy
timeout) shared by the server's request threads, and a result cache keyed by the file's state (mtime, size,
inode), so a re-aggregation committed by another process invalidates it and a replaced file (dlprof --force)
reopens the connections. Nothing here ever writes to the database.
"""

from __future__ import annotations

import json
import re
import logging
import os
import queue
import sqlite3
import threading
from collections import OrderedDict
from contextlib import contextmanager
from pathlib import Path

from dlprof_plugin.replies import NotFound
from dlprof_profiler import contract as K

BUSY_TIMEOUT_S = 10.0  # readers wait at most this long for a writer's commit
POOL_IDLE = 8  # idle connections kept per database
CACHE_ENTRIES = 256  # cached results per database
MMAP_BYTES = 1 << 34  # map up to 16 GiB of the file (address space only; pages come from the OS cache)
SUPPORTED_MAJORS = K.READABLE_SCHEMA_MAJORS  # DB_SCHEMA_VERSION majors this reader understands

log = logging.getLogger("dlprof_plugin")


def is_hot_journal_error(exc: BaseException) -> bool:
    """A read-only connection met the rollback journal of a writer that died mid-transaction."""
    return getattr(exc, "sqlite_errorname", "") == "SQLITE_READONLY_ROLLBACK" or "readonly database" in str(exc)


class NotADatabase(NotFound):
    """The file is missing, unreadable or not a DLProf database (HTTP 404)."""


def lenient_text(raw: bytes) -> str:
    """TEXT that is not valid UTF-8 (schema 2.0 copied names from the export byte for byte), with U+FFFD."""
    return raw.decode("utf-8", "replace")


def is_decode_error(exc: BaseException) -> bool:
    """A text value is not valid UTF-8 (names copied verbatim from an export with such bytes)."""
    return "decode" in str(exc).lower() and "utf" in str(exc).lower()


def _state(path: str) -> tuple:
    st = os.stat(path)
    return (st.st_mtime_ns, st.st_size, st.st_ino, st.st_dev)


class Database:
    def __init__(self, path: str):
        self.path = path
        self._uri = Path(path).as_uri() + "?mode=ro"
        self._pool: queue.LifoQueue = queue.LifoQueue()
        self._lock = threading.Lock()
        self._cache: OrderedDict = OrderedDict()
        self._identity = None  # (inode, device) the pooled connections were opened on
        self._checked_identity = None
        self.schema_major = None  # "2" or "3", known once a connection checked the file
        self.lenient = False  # decode TEXT leniently (every 2.0 file; a 3.0 file once it failed)

    # ------------------------------------------------------------------ connections
    def state(self) -> tuple:
        try:
            return _state(self.path)
        except OSError as exc:
            raise NotADatabase(f"database not readable: {exc.strerror}") from None

    def _open(self) -> sqlite3.Connection:
        try:
            con = sqlite3.connect(
                self._uri, uri=True, timeout=BUSY_TIMEOUT_S, check_same_thread=False, isolation_level=None
            )
            con.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
            con.execute("PRAGMA query_only = 1")
            con.execute("PRAGMA temp_store = MEMORY")
            con.execute(f"PRAGMA mmap_size = {MMAP_BYTES}")  # random B-tree probes without read() calls
            if self.lenient:
                con.text_factory = lenient_text
        except sqlite3.Error as exc:
            raise NotADatabase(f"cannot open the database: {exc}") from None
        return con

    @contextmanager
    def snapshot(self):
        """A pooled connection inside one read transaction: several queries see the same database state
        (and skip the per-statement lock round trips)."""
        with self.connect() as con:
            con.execute("BEGIN")
            try:
                yield con
            finally:
                if con.in_transaction:
                    con.execute("COMMIT")

    @contextmanager
    def connect(self):
        """A pooled read-only connection (returned to the pool afterwards)."""
        state = self.state()
        identity = state[2:]
        with self._lock:
            if identity != self._identity:
                # a new file at this path (dlprof --force): drop connections to the old one
                self._drain()
                self._identity = identity
                self._cache.clear()
        try:
            con = self._pool.get_nowait()
        except queue.Empty:
            con = self._open()
        con.text_factory = lenient_text if self.lenient else str
        if self._checked_identity != identity:
            self._check_schema(con)
            self._checked_identity = identity
        broken = False
        try:
            yield con
        except sqlite3.DatabaseError as exc:
            broken = "malformed" in str(exc) or "not a database" in str(exc)
            if is_decode_error(exc) and not self.lenient:
                # a 3.0 writer stores valid UTF-8 only; should a file hold other bytes, decode it leniently from
                # the next request on
                self.lenient = broken = True
                self._drain()
            raise
        finally:
            if con.in_transaction:
                try:
                    con.rollback()
                except sqlite3.Error:
                    broken = True
            if broken or self._pool.qsize() >= POOL_IDLE or self._identity != identity:
                con.close()
            else:
                self._pool.put(con)

    def _drain(self) -> None:
        while True:
            try:
                self._pool.get_nowait().close()
            except queue.Empty:
                return

    def _check_schema(self, con: sqlite3.Connection) -> None:
        try:
            tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")}
            if not set(K.VIEWER_REQUIRED) <= tables:
                raise NotADatabase("not a DLProf database")
            row = con.execute("SELECT current_version, created_by FROM db_version").fetchone()
        except sqlite3.Error as exc:
            if is_hot_journal_error(exc):
                raise
            raise NotADatabase(f"not a DLProf database ({exc})") from None
        if not row or not str(row[1] or "").startswith(K.CREATED_BY_PREFIX):
            raise NotADatabase("not a DLProf database")
        major = K.schema_major(row[0])
        if major not in SUPPORTED_MAJORS:
            raise NotADatabase(f"DLProf database schema {row[0]} is not supported by this viewer")
        self.schema_major = major
        if major == "2" and not self.lenient:
            self.lenient = True
            con.text_factory = lenient_text

    def close(self) -> None:
        with self._lock:
            self._drain()

    def recover(self) -> bool:
        """Roll back the hot journal a killed writer (an interrupted re-aggregation) left behind, as any
        read-write SQLite connection would on opening: the file returns to its last committed state.
        Read-only connections cannot do it and fail until someone does. Returns whether it was done."""
        journal = self.path + "-journal"
        if not (os.path.isfile(self.path) and os.path.isfile(journal) and os.path.getsize(journal) > 0):
            return False
        with self._lock:
            try:
                con = sqlite3.connect(Path(self.path).as_uri() + "?mode=rw", uri=True, timeout=BUSY_TIMEOUT_S)
                try:
                    con.execute("SELECT count(*) FROM sqlite_master").fetchone()
                finally:
                    con.close()
            except sqlite3.Error as exc:
                log.warning("dlprof: %s: cannot roll back the interrupted write: %s", self.path, exc)
                return False
            self._drain()
            self._cache.clear()
        log.warning("dlprof: %s: rolled back an interrupted write (hot journal)", self.path)
        return True

    # ------------------------------------------------------------------ queries
    def query(self, sql: str, params=()) -> list[tuple]:
        with self.connect() as con:
            return con.execute(sql, params).fetchall()

    def query_dicts(self, sql: str, params=()) -> list[dict]:
        with self.connect() as con:
            cur = con.execute(sql, params)
            names = [d[0] for d in cur.description]
            return [dict(zip(names, r)) for r in cur.fetchall()]

    def one(self, sql: str, params=()) -> dict | None:
        rows = self.query_dicts(sql, params)
        return rows[0] if rows else None

    def cached(self, key, compute):
        """compute() once per (file state, key); results must be treated as read-only."""
        full = (self.state(), key)
        with self._lock:
            if full in self._cache:
                self._cache.move_to_end(full)
                return self._cache[full]
        value = compute()
        with self._lock:
            self._cache[full] = value
            while len(self._cache) > CACHE_ENTRIES:
                self._cache.popitem(last=False)
        return value

    # ------------------------------------------------------------------ facts used by many routes
    def profile_info(self) -> dict:
        return self.cached(
            "profile_info", lambda: {k: v for k, v in self.query("SELECT name, value FROM profile_info")}
        )

    def domains(self, rank: int | None = None) -> list[dict]:
        """The NVTX domains with an op model (of one rank in a 3.0 file; default: the default rank)."""
        rank = self.default_rank() if rank is None else int(rank)

        def compute():
            with self.connect():  # knows the schema version from here on
                pass
            where = f"WHERE rank = {rank} " if self.schema_major != "2" else ""
            return self.query_dicts(
                "SELECT domain_id, name, family, has_markers, num_ranges, is_primary "
                f"FROM {K.READ_ONLY_DOMAINS} {where}ORDER BY domain_id"
            )

        return self.cached(("domains", rank), compute)

    def ranks(self) -> list[dict]:
        """The ranks (profiles) of the file: rank, source_file, source_kind, host_name, nsys_version; a 2.0 file
        (or a 3.0 one without the table) is rank 0."""

        def compute():
            if not self.v3:
                return [{"rank": K.DEFAULT_RANK}]
            tables = {r[0] for r in self.query("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if K.RANKS not in tables:
                return [{"rank": K.DEFAULT_RANK}]
            rows = self.query_dicts(
                f"SELECT rank, source_file, source_kind, host_name, nsys_version FROM {K.RANKS} ORDER BY rank"
            )
            return rows or [{"rank": K.DEFAULT_RANK}]

        return self.cached("ranks", compute)

    def default_rank(self) -> int:
        """contract.DEFAULT_RANK when the file has it, else its lowest rank."""
        numbers = [r["rank"] for r in self.ranks()]
        return K.DEFAULT_RANK if K.DEFAULT_RANK in numbers else numbers[0]

    @property
    def v3(self) -> bool:
        """Whether the file has schema 3.0's raw tables (raw_*, strings), else 2.0's read_only_* tables."""
        if self.schema_major is None:
            with self.connect():
                pass
        return self.schema_major != "2"

    def aggregations(self) -> list[dict]:
        return self.cached(
            "aggregations",
            lambda: self.query_dicts(
                "SELECT aggr_id, created_utc, key_node, key_source, key_found, iter_start, iter_stop, "
                "total_iterations, server_user_name, server_host_name, engine_version, elapsed_seconds "
                "FROM aggregations ORDER BY aggr_id"
            ),
        )

    def model_config(self, rank: int | None = None) -> dict:
        rank = self.default_rank() if rank is None else int(rank)

        def compute():
            out = {}
            where = f" WHERE rank = {rank}" if self.v3 else ""
            for k, v in self.query(f"SELECT name, value FROM read_only_model_config{where}"):
                try:
                    out[k] = json.loads(v)
                except (TypeError, ValueError):
                    out[k] = v
            return out

        return self.cached(("model_config", rank), compute)

    def columns(self, table: str) -> frozenset:
        """The column names of a table (empty when the file has no such table): columns later schemas added."""
        if not re.fullmatch(r"\w+", table):
            return frozenset()
        return self.cached(
            ("columns", table), lambda: frozenset(r[1] for r in self.query(f'PRAGMA table_info("{table}")'))
        )

    def index_on(self, table: str, leading: tuple[str, ...]) -> str | None:
        """Name of an index on `table` whose first columns are `leading` (None if there is none)."""

        def compute():
            found = {}
            with self.connect() as con:
                for (name,) in con.execute(
                    "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = ? ORDER BY name", (table,)
                ).fetchall():
                    cols = tuple(r[2] for r in con.execute("SELECT * FROM pragma_index_info(?)", (name,)).fetchall())
                    for i in range(1, len(cols) + 1):
                        found.setdefault(cols[:i], name)
            return found

        return self.cached(("indexes", table), compute).get(tuple(leading))

    def has_index(self, table: str, leading: tuple[str, ...]) -> bool:
        return self.index_on(table, leading) is not None


class Registry:
    """One Database per real path."""

    def all(self) -> list[Database]:
        with self._lock:
            return list(self._dbs.values())

    def __init__(self):
        self._lock = threading.Lock()
        self._dbs: dict[str, Database] = {}

    def get(self, path: str) -> Database:
        with self._lock:
            db = self._dbs.get(path)
            if db is None:
                db = self._dbs[path] = Database(path)
            return db
