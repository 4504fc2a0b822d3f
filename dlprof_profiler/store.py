"""The out-of-core trace store: a large nsys export staged in a DuckDB database on disk, read segment by
segment, so a profile of 10^7 kernels is analysed in bounded memory.

Staging copies the export's NVTX, CUDA runtime and GPU activity rows (streamed through Arrow) and derives
the same frames `ingest_nsys.read_nsys_export` builds in memory: names as integer codes into sorted
dictionaries, GPU activities in (start, kind, rowid) order, API calls in (start, rowid) order, ranges with
their domain, text, and unclosed ends at the capture end. DuckDB sorts, joins and aggregates with a memory
limit, spilling to its temporary directory; Python only ever holds one segment (and small per-name
tables) at a time.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa

from dlprof_profiler import ingest_nsys as nsys
from dlprof_profiler import log
from dlprof_profiler.errors import DLProfError
from dlprof_profiler.sqlite_source import SqliteSource
from dlprof_profiler.trace import GPU_COLUMNS, KIND_KERNEL, KIND_MEMCPY, KIND_MEMSET, Trace, make_frame

DEFAULT_MEMORY_LIMIT = "1200MB"
SORT_SPAN_ROWS = 1 << 22  # rows an id-ordered read sorts at a time (see TraceStore.ordered_batches)
_RANGES = (
    'SELECT range_id, domain_code, text, start, "end", global_tid, pid, event_type, unclosed '
    "FROM ranges WHERE {where} ORDER BY range_id"
)
_API = (
    'SELECT api_id, name_code, start, "end", global_tid, pid, correlation_id, event_class, return_value '
    "FROM api WHERE {where} ORDER BY api_id"
)
_GPU = "SELECT * FROM gpu WHERE {where} ORDER BY activity_id"
I64 = pa.int64()

UNKNOWN_KERNEL = nsys.UNKNOWN_KERNEL


class TraceStore:
    """An nsys export staged for out-of-core analysis (a DuckDB file in `workdir`)."""

    def __init__(self, export: Path, workdir: Path, memory_limit: str = DEFAULT_MEMORY_LIMIT, threads: int = 2):
        self.export = Path(export)
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.path = self.workdir / "trace.duckdb"
        self.memory_limit = memory_limit
        tmp = self.workdir / "spill"
        tmp.mkdir(exist_ok=True)
        self.con = duckdb.connect(str(self.path))
        for setting in (
            f"SET memory_limit = '{memory_limit}'",
            f"SET threads = {int(threads)}",
            f"SET temp_directory = '{tmp}'",
            "SET preserve_insertion_order = false",
        ):
            self.con.execute(setting).fetchall()
        self.trace: Trace | None = None
        self.counts: dict = {}
        self.gpu_short: np.ndarray = np.zeros(0, dtype=object)  # short kernel name per name code
        self.gpu_long: np.ndarray = np.zeros(0, dtype=object)  # long kernel name per long code
        self.api_names: np.ndarray = np.zeros(0, dtype=object)  # API name per name code
        self.domains: list[str] = []
        self.drops: dict = {}  # frame -> rows dropped for impossible timestamps (sanitize.py)
        self.before: dict = {}  # frame -> rows staged before the drop
        self.unclosed = 0
        self.raw_end: dict = {}  # table -> latest end among the rows as exported (the capture end)
        self.raw_devices: list = []  # devices of the GPU activities as exported

    def close(self) -> None:
        try:
            self.con.close()
        finally:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def sql(self, query: str, params=None):
        return self.con.execute(query, params) if params is not None else self.con.execute(query)

    def run(self, statement: str, params=None) -> None:
        """A statement whose result is not needed (DDL, INSERT), run to completion."""
        self.sql(statement, params).fetchall()

    def scalar(self, query: str, params=None):
        rows = self.sql(query, params).fetchall()
        return rows[0][0] if rows else None

    def frame(self, query: str, params=None) -> pd.DataFrame:
        return self.sql(query, params).df()

    def columns(self, query: str, params=None) -> dict:
        """A query's result as numpy arrays by column (no DataFrame: building one copied every column once more)."""
        return self.sql(query, params).fetchnumpy()

    def arrow(self, query: str, params=None) -> pa.Table:
        return (self.con.sql(query, params=params) if params is not None else self.con.sql(query)).to_arrow_table()

    # -- staging --------------------------------------------------------------------------------------
    def load(self) -> Trace:
        """Stage the export; return a Trace holding its small frames (the large ones live in the store)."""
        src = SqliteSource(self.export, immutable=True)
        try:
            if not any(src.has(t) for t in nsys.KNOWN_NSYS_TABLES):
                raise DLProfError(
                    f"{self.export}: not an Nsight Systems export or DLProf database "
                    "(none of the nsys tables StringIds, NVTX_EVENTS, CUPTI_ACTIVITY_KIND_* found)"
                )
            trace = Trace(source=self.export)
            trace.meta = nsys.read_meta(src)
            trace.system = nsys.read_system_env(src)
            strings = nsys.StringTable(src) if not src.has("StringIds") or src.count("StringIds") < 1_000_000 else None
            self._stage_strings(src)
            trace.processes, trace.threads = nsys.read_processes_threads(src, strings or _NoStrings(self))
            trace.has_nvtx = src.has("NVTX_EVENTS")
            trace.has_cuda_tables = any(
                src.has(t)
                for t in (
                    "CUPTI_ACTIVITY_KIND_RUNTIME",
                    "CUPTI_ACTIVITY_KIND_KERNEL",
                    "CUPTI_ACTIVITY_KIND_MEMCPY",
                    "CUPTI_ACTIVITY_KIND_MEMSET",
                )
            )
            api_read, gpu_reads, ranges_read = self._api_read(src), self._gpu_reads(src), self._ranges_read(src)
            with log.stage("Reading the CUDA API calls, GPU activities and NVTX ranges into the store"):
                self._read_tables([api_read, *gpu_reads, ranges_read])
            with log.stage("Staging CUDA API calls"):
                self._stage_api()
            with log.stage("Staging GPU activities"):
                self._gpu_names([(table, kind) for table, _, _, kind in gpu_reads])
            from dlprof_profiler.sanitize import drop_invalid_times

            trace.syncs, self.drops["syncs"] = drop_invalid_times(nsys.read_syncs(src), "GPU synchronizations", "syncs")
            trace.io_calls, self.drops["io_calls"] = drop_invalid_times(
                nsys.read_io_calls(src, strings or _NoStrings(self)), "I/O calls", "io_calls"
            )
            capture_end = self._capture_end(src, trace.meta)
            with log.stage("Staging NVTX ranges"):
                trace.domain_map = self._stage_ranges(capture_end)
            used = [(d,) for d in self.raw_devices]
            trace.devices = nsys.read_devices(
                src, pd.DataFrame({"device_id": np.array([r[0] for r in used], dtype=np.int64)})
            )
            peak = nsys.read_peak_memory(src)
            if peak is not None:
                trace.meta["gpu_peak_memory"] = peak
            trace.meta["capture_end"] = int(capture_end)
        finally:
            src.close()
        self.counts = {t: int(self.scalar(f"SELECT count(*) FROM {t}")) for t in ("ranges", "api", "gpu")}
        self._profile_end = int(
            self.scalar(
                'SELECT greatest(coalesce((SELECT max("end") FROM ranges), 0), '
                'coalesce((SELECT max("end") FROM api), 0), coalesce((SELECT max("end") FROM gpu), 0))'
            )
        )
        trace.warnings = self._warnings(trace)
        self.trace = trace
        return trace

    @property
    def profile_end(self) -> int:
        return self._profile_end

    @property
    def profile_start(self) -> int:
        """Start of the first recorded event (Trace.profile_start)."""
        starts = [self.scalar(f"SELECT min(start) FROM {t}") for t in ("ranges", "api", "gpu")]
        starts = [int(v) for v in starts if v is not None]
        return min(starts) if starts else 0

    def _stage_strings(self, src: SqliteSource) -> None:
        schema = pa.schema([("id", I64), ("value", pa.string())])
        self._insert("strings", src, "SELECT id, value FROM StringIds" if src.has("StringIds") else None, schema)

    def _read_tables(self, reads: list[tuple]) -> None:
        """Stream queries of the export into new DuckDB tables (empty when a query is None), at once, each on
        connections of its own: ADBC reads SQLite in C without the GIL and DuckDB inserts without it, so the
        reads share the cores (as ingest_nsys reads the export)."""
        from concurrent.futures import ThreadPoolExecutor

        for table, _, schema, *_ in reads:
            cols = ", ".join(f'"{f.name}" {_duck_type(f.type)}' for f in schema)
            self.run(f"CREATE OR REPLACE TABLE {table} ({cols})")

        def read(table: str, query: str, schema: pa.Schema) -> None:
            src, cursor = SqliteSource(self.export, immutable=True), self.con.cursor()
            try:
                for batch in src.record_batches(query, schema):
                    cursor.register("_batch", batch)
                    cursor.execute(f"INSERT INTO {table} SELECT * FROM _batch").fetchall()
                    cursor.unregister("_batch")
            finally:
                cursor.close()
                src.close()

        with ThreadPoolExecutor(max_workers=3, thread_name_prefix="dlprof-stage") as pool:
            done = [pool.submit(read, table, query, schema) for table, query, schema, *_ in reads if query]
            for future in done:
                future.result()

    def _insert(self, table: str, src: SqliteSource, query: str | None, schema: pa.Schema) -> None:
        """Stream a query of the export into a new DuckDB table (empty when `query` is None)."""
        cols = ", ".join(f'"{f.name}" {_duck_type(f.type)}' for f in schema)
        self.run(f"CREATE OR REPLACE TABLE {table} ({cols})")
        if query is None:
            return
        for batch in src.record_batches(query, schema):
            self.con.register("_batch", batch)
            self.run(f"INSERT INTO {table} SELECT * FROM _batch")
            self.con.unregister("_batch")

    def _api_read(self, src: SqliteSource) -> tuple:
        """(table, query of the export or None, schema) of the raw CUDA API calls."""
        t = "CUPTI_ACTIVITY_KIND_RUNTIME"
        names = ["rowid", "start", "end", "global_tid", "correlation_id", "name_id", "event_class", "return_value"]
        schema = pa.schema([(n, I64) for n in names])
        query = None
        if src.has(t):
            query = (
                f"SELECT rowid, start, end, coalesce(globalTid, 0), coalesce(correlationId, -1), "
                f"coalesce(nameId, -1), coalesce(eventClass, 0), "
                f"coalesce({src.col(t, 'returnValue', '0')}, 0) FROM {t}"
            )
        return "raw_api", query, schema

    def _stage_api(self) -> None:
        names_table = self.frame(
            "SELECT DISTINCT r.name_id, s.value FROM raw_api r LEFT JOIN strings s ON s.id = r.name_id"
        )
        values = names_table["value"].to_numpy(dtype=object)
        # categories as ingest_nsys builds them: distinct values of the string table that are used
        known = pd.notna(values)
        cats = np.array(sorted(set(values[known].tolist())), dtype=object)
        self.api_names = cats
        code = pd.Series(
            np.searchsorted(cats, values[known]).astype(np.int64) if known.any() else [],
            index=names_table["name_id"].to_numpy()[known],
            dtype=np.int64,
        )
        self.con.register(
            "_api_name_codes",
            pd.DataFrame({"name_id": code.index.to_numpy(np.int64), "name_code": code.to_numpy(np.int64)}),
        )
        self.run("""
            CREATE OR REPLACE TABLE api AS
            SELECT (row_number() OVER (ORDER BY r.start, r.rowid) - 1)::BIGINT AS api_id,
                   coalesce(c.name_code, -1)::BIGINT AS name_code, r.start, r."end", r.global_tid,
                   ((r.global_tid >> 24) & 16777215)::BIGINT AS pid, r.correlation_id, r.event_class, r.return_value
            FROM raw_api r LEFT JOIN _api_name_codes c ON c.name_id = r.name_id
            WHERE r.start IS NOT NULL AND r."end" IS NOT NULL AND r."end" >= r.start
            ORDER BY r.start, r.rowid""")
        self.con.unregister("_api_name_codes")
        self._count_drops("api_calls", "CUDA API calls", "raw_api")
        self.raw_end["api"] = self.scalar('SELECT max("end") FROM raw_api')
        self.run("DROP TABLE raw_api")

    def _gpu_reads(self, src: SqliteSource) -> list[tuple]:
        """(table, query of the export, schema, kind) of the raw GPU activities, per activity table."""
        kt, mt, st = "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"
        # our column <- export column, per table (absent columns read as -1, as ingest_nsys reads them)
        common = {
            "start": "start",
            "end": "end",
            "device_id": "deviceId",
            "stream_id": "streamId",
            "context_id": "contextId",
            "global_pid": "globalPid",
            "correlation_id": "correlationId",
            "graph_node_id": "graphNodeId",
        }
        kernel = {
            **common,
            "grid_x": "gridX",
            "grid_y": "gridY",
            "grid_z": "gridZ",
            "block_x": "blockX",
            "block_y": "blockY",
            "block_z": "blockZ",
            "registers": "registersPerThread",
            "static_smem": "staticSharedMemory",
            "dynamic_smem": "dynamicSharedMemory",
            "short_id": "shortName",
            "long_id": "demangledName",
        }
        memcpy = {**common, "bytes": "bytes", "copy_kind": "copyKind", "src_kind": "srcKind", "dst_kind": "dstKind"}
        memset = {**common, "bytes": "bytes", "dst_kind": "memKind"}
        fields = [
            "rowid",
            "start",
            "end",
            "device_id",
            "stream_id",
            "context_id",
            "global_pid",
            "correlation_id",
            "grid_x",
            "grid_y",
            "grid_z",
            "block_x",
            "block_y",
            "block_z",
            "registers",
            "static_smem",
            "dynamic_smem",
            "graph_node_id",
            "bytes",
            "copy_kind",
            "src_kind",
            "dst_kind",
            "short_id",
            "long_id",
        ]
        schema = pa.schema([(n, I64) for n in fields])
        parts = []
        for table, kind, columns in ((kt, KIND_KERNEL, kernel), (mt, KIND_MEMCPY, memcpy), (st, KIND_MEMSET, memset)):
            if not src.has(table):
                continue
            exprs = ["rowid"]
            for f in fields[1:]:
                source = columns.get(f)
                default = "0" if (f == "copy_kind" and kind == KIND_MEMCPY) else "-1"
                if f in ("start", "end"):
                    exprs.append(f'"{source}"')  # NULL stays NULL: damage, dropped and counted below
                else:
                    exprs.append(nsys._int_col(src, table, source, default) if source else "-1")
            parts.append((f"raw_gpu_{kind}", f"SELECT {', '.join(exprs)} FROM {table}", schema, kind))
        return parts

    def _gpu_names(self, parts: list[tuple[str, int]]) -> None:
        """GPU activities as ingest_nsys gives them: a kernel's short and long names stand in for each other
        when one is unknown; memcpys are named by copy kind, memsets `[CUDA memset]`; codes index the sorted
        distinct names. Names are resolved per distinct (kind, short id, long id, copy kind), not per row."""
        if not parts:
            self._empty_gpu()
            return
        # the key of an activity's names: the string ids of a kernel, the copy kind of a memcpy
        keyed = []
        for table, kind in parts:
            short = "r.short_id" if kind == KIND_KERNEL else "-1"
            long = "r.long_id" if kind == KIND_KERNEL else "-1"
            copy = "r.copy_kind" if kind == KIND_MEMCPY else "-1"
            keyed.append(
                f"SELECT r.*, {kind}::TINYINT AS kind, {short} AS key_short, {long} AS key_long, {copy} AS key_copy "
                f"FROM {table} r"
            )
        self.run(f"CREATE OR REPLACE TEMP VIEW gpu_raw AS {' UNION ALL '.join(keyed)}")
        self._count_drops("gpu", "GPU activities", "gpu_raw")
        self.raw_end["gpu"] = self.scalar('SELECT max("end") FROM gpu_raw')
        self.raw_devices = [r[0] for r in self.sql("SELECT DISTINCT device_id FROM gpu_raw").fetchall()]
        keys = self.frame("""
            SELECT k.kind, k.key_short, k.key_long, k.key_copy, ss.value AS short_text, sl.value AS long_text
            FROM (SELECT DISTINCT kind, key_short, key_long, key_copy FROM gpu_raw
                  WHERE start IS NOT NULL AND "end" IS NOT NULL AND "end" >= start) k
            LEFT JOIN strings ss ON ss.id = k.key_short LEFT JOIN strings sl ON sl.id = k.key_long""")
        kind = keys["kind"].to_numpy(np.int64)
        short_text = keys["short_text"].to_numpy(dtype=object)
        long_text = keys["long_text"].to_numpy(dtype=object)
        copy_label = np.array([nsys.copy_kind_label(int(c)) for c in keys["key_copy"]], dtype=object)
        known_short, known_long = pd.notna(short_text), pd.notna(long_text)
        kernel_name = np.where(known_short, short_text, np.where(known_long, long_text, UNKNOWN_KERNEL))
        kernel_long = np.where(known_long, long_text, np.where(known_short, short_text, UNKNOWN_KERNEL))
        other = np.where(kind == KIND_MEMCPY, copy_label, nsys.MEMSET_LABEL)
        name = np.where(kind == KIND_KERNEL, kernel_name, other)
        long_name = np.where(kind == KIND_KERNEL, kernel_long, other)
        self.gpu_short, self.gpu_long = _sorted_text(pd.unique(name)), _sorted_text(pd.unique(long_name))
        codes = keys[["kind", "key_short", "key_long", "key_copy"]].assign(
            name_code=np.searchsorted(self.gpu_short, name).astype(np.int64),
            long_code=np.searchsorted(self.gpu_long, long_name).astype(np.int64),
        )
        self.con.register("_names", codes)
        self.run("""
            CREATE OR REPLACE TABLE gpu AS
            SELECT (row_number() OVER (ORDER BY g.start, g.kind, g.rowid) - 1)::BIGINT AS activity_id, g.kind,
                   n.name_code::BIGINT AS name_code, n.long_code::BIGINT AS long_code, g.start, g."end",
                   g.device_id, g.stream_id, g.context_id, ((g.global_pid >> 24) & 16777215)::BIGINT AS pid,
                   g.correlation_id, g.grid_x, g.grid_y, g.grid_z, g.block_x, g.block_y, g.block_z, g.registers,
                   g.static_smem, g.dynamic_smem, g.bytes, g.copy_kind, g.src_kind, g.dst_kind, g.graph_node_id
            FROM gpu_raw g JOIN _names n ON n.kind = g.kind AND n.key_short = g.key_short
                 AND n.key_long = g.key_long AND n.key_copy = g.key_copy
            WHERE g.start IS NOT NULL AND g."end" IS NOT NULL AND g."end" >= g.start
            ORDER BY g.start, g.kind, g.rowid""")
        self.con.unregister("_names")
        self.run("DROP VIEW gpu_raw")
        for table, _ in parts:
            self.run(f"DROP TABLE {table}")

    def _empty_gpu(self) -> None:
        codes = {"name": "name_code", "long_name": "long_code"}  # names are string-table codes in the store
        cols = ", ".join(f'"{codes.get(c, c)}" BIGINT' for c in GPU_COLUMNS)
        self.run(f"CREATE OR REPLACE TABLE gpu ({cols})")

    def _capture_end(self, src: SqliteSource, meta: dict) -> int:
        ends = [0]
        for table in ("api", "gpu"):
            value = self.raw_end.get(table)
            if value is not None:
                ends.append(int(value))
        if src.has("NVTX_EVENTS"):
            value = src.query_scalar("SELECT max(coalesce(end, start)) FROM NVTX_EVENTS")
            if value is not None:
                ends.append(int(value))
        stop = meta.get("session_stop")
        latest = max(ends)
        return int(stop) if isinstance(stop, int) and stop >= latest else latest

    def _ranges_read(self, src: SqliteSource) -> tuple:
        """(table, query of the export or None, schema) of the raw NVTX ranges."""
        t = "NVTX_EVENTS"
        fields = [
            ("range_id", I64),
            ("event_type", I64),
            ("start", I64),
            ("end", I64),
            ("global_tid", I64),
            ("domain_id", I64),
            ("text_id", I64),
            ("text", pa.string()),
        ]
        schema = pa.schema(fields)
        query = None
        if src.has(t):
            types = ",".join(map(str, nsys.NVTX_RANGE_TYPES + (nsys.NVTX_DOMAIN_CREATE,)))
            query = (
                f"SELECT rowid, eventType, start, coalesce(end, -1), coalesce(globalTid, 0), "
                f"{nsys._int_col(src, t, 'domainId', '0')}, {nsys._int_col(src, t, 'textId')}, "
                f"{src.col(t, 'text')} FROM {t} WHERE eventType IN ({types})"
            )
        return "raw_ranges", query, schema

    def _stage_ranges(self, capture_end: int) -> dict:
        # domain handles are per process: (pid, domainId) -> name, from the domain-create rows
        created = self.frame(f"""
            SELECT ((r.global_tid >> 24) & 16777215) AS pid, r.domain_id, coalesce(s.value, r.text, '') AS name
            FROM raw_ranges r LEFT JOIN strings s ON s.id = r.text_id
            WHERE r.event_type = {nsys.NVTX_DOMAIN_CREATE}""")
        names = {(int(p), int(d)): str(n) for p, d, n in created.itertuples(index=False)}
        pairs = self.frame(f"""SELECT DISTINCT ((global_tid >> 24) & 16777215) AS pid, domain_id FROM raw_ranges
                               WHERE event_type <> {nsys.NVTX_DOMAIN_CREATE}""")
        mapping = nsys.domain_name_map(pairs["pid"].to_numpy(np.int64), pairs["domain_id"].to_numpy(np.int64), names)
        self.domains = list(dict.fromkeys(mapping.values()))
        dom_code = {name: i for i, name in enumerate(self.domains)}
        self.con.register(
            "_domains",
            pd.DataFrame(
                {
                    "pid": np.array([k[0] for k in mapping], dtype=np.int64),
                    "domain_id": np.array([k[1] for k in mapping], dtype=np.int64),
                    "domain_code": np.array([dom_code[v] for v in mapping.values()], dtype=np.int64),
                }
            ),
        )
        end = f'CASE WHEN r."end" < 0 THEN greatest({int(capture_end)}, r.start) ELSE r."end" END'
        self.run(f"""
            CREATE OR REPLACE TABLE ranges AS
            SELECT r.range_id, d.domain_code, coalesce(s.value, r.text, '') AS text, r.start, {end} AS "end",
                   r.global_tid, ((r.global_tid >> 24) & 16777215)::BIGINT AS pid, r.event_type::TINYINT AS event_type,
                   (r."end" < 0) AS unclosed
            FROM raw_ranges r
            JOIN _domains d ON d.pid = ((r.global_tid >> 24) & 16777215) AND d.domain_id = r.domain_id
            LEFT JOIN strings s ON s.id = r.text_id
            WHERE r.event_type <> {nsys.NVTX_DOMAIN_CREATE} AND r.start IS NOT NULL AND {end} >= r.start""")
        # (not sorted: every reader orders what it reads; the segments read a start-ordered copy made once the
        # ranges are classified, see store_model.StoreAnalysis.segments)
        self.con.unregister("_domains")
        self.unclosed = int(
            self.scalar(f'SELECT count(*) FROM raw_ranges WHERE "end" < 0 AND event_type <> {nsys.NVTX_DOMAIN_CREATE}')
        )
        self._count_drops(
            "ranges", "NVTX ranges", "raw_ranges", unclosed_end=-1, where=f"event_type <> {nsys.NVTX_DOMAIN_CREATE}"
        )
        self.run("DROP TABLE raw_ranges")
        return mapping

    def _count_drops(
        self, frame: str, what: str, table: str, unclosed_end: int | None = None, where: str = "true"
    ) -> None:
        """Rows of a staged table with a missing start or end, or ending before they start (sanitize.py)."""
        from dlprof_profiler.sanitize import Dropped

        end_missing = 'r."end" IS NULL' if unclosed_end is None else "false"
        reversed_ = 'r."end" < r.start' if unclosed_end is None else f'r."end" <> {unclosed_end} AND r."end" < r.start'
        missing, rev, total = self.sql(f"""
            SELECT count(*) FILTER (WHERE r.start IS NULL OR {end_missing}),
                   count(*) FILTER (WHERE r.start IS NOT NULL AND NOT ({end_missing}) AND {reversed_}),
                   count(*)
            FROM {table} r WHERE {where}""").fetchall()[0]
        self.before[frame] = int(total)
        self.drops[frame] = Dropped(frame, what, int(missing), int(rev))

    def _warnings(self, trace: Trace) -> list[str]:
        """The ingest's warnings (counts as staged) and sanitize.py's (rows dropped, shared correlation ids)."""
        from dlprof_profiler.sanitize import CORE_FRAMES, TIMED_FRAMES, drop_warnings

        path = self.export
        out = []
        if not trace.has_cuda_tables:
            out.append(
                f"{path}: no CUDA trace tables (CUPTI_ACTIVITY_KIND_*): the capture holds no CUDA API calls "
                "or GPU activities, so every GPU figure is zero"
            )
        elif self.before.get("gpu", 0) == 0:
            out.append(f"{path}: no GPU activities (kernels, memcpys, memsets) were captured")
        if not trace.has_nvtx or self.before.get("ranges", 0) == 0:
            out.append(
                f"{path}: no NVTX ranges: ops cannot be named, every GPU activity is reported under the API "
                "call that launched it"
            )
        if self.unclosed:
            out.append(f"{path}: {self.unclosed} NVTX ranges were never closed; they end at the capture end")
        drops = [self.drops[name] for name, _, _ in TIMED_FRAMES if name in self.drops and self.drops[name].total]
        table = {"ranges": "ranges", "api_calls": "api", "gpu": "gpu"}
        before = sum(self.before.get(f, 0) for f in CORE_FRAMES)
        after = sum(self.counts[table[f]] for f in CORE_FRAMES)
        shared = self.sql("""SELECT count(*), coalesce(sum(n), 0) FROM (
                                 SELECT count(*) AS n FROM api WHERE correlation_id >= 0
                                 GROUP BY pid, correlation_id HAVING count(*) > 1)""").fetchall()[0]
        return out + drop_warnings(path, drops, before, after, (int(shared[0]), int(shared[1])))

    # -- frames, as ingest_nsys builds them (for slices of the timeline) --------------------------------
    def ranges_frame(self, where: str = "true", params=None) -> pd.DataFrame:
        return self._ranges_of(self.arrow(_RANGES.format(where=where), params))

    def api_frame(self, where: str = "true", params=None) -> pd.DataFrame:
        return self._api_of(make_frame(self.columns(_API.format(where=where), params)))

    def gpu_frame(self, where: str = "true", params=None) -> pd.DataFrame:
        return self._gpu_of(self.frame(_GPU.format(where=where), params))

    def frame_chunks(self, frame: str, rows: int):
        """Every row of `ranges`, `api_calls` or `gpu` in id order, as frames of `rows` rows at most (streamed
        on a cursor of its own: the store stays usable meanwhile)."""
        query, convert, table_name, key = {
            "ranges": (_RANGES, self._ranges_of, "ranges", "range_id"),
            "api_calls": (_API, self._api_of, "api", "api_id"),
            "gpu": (_GPU, self._gpu_of, "gpu", "activity_id"),
        }[frame]
        for table in self.ordered_batches(query, table_name, key, rows):
            yield convert(table if frame == "ranges" else table.to_pandas())

    def batches(self, query: str, rows: int):
        """A query's result `rows` at a time (Arrow tables), on a cursor of its own."""
        cursor = self.con.cursor()
        try:
            for batch in cursor.sql(query).to_arrow_reader(rows):
                yield pa.Table.from_batches([batch])
        finally:
            cursor.close()

    def ordered_batches(self, query: str, table: str, key: str, rows: int, span_rows: int = SORT_SPAN_ROWS):
        """`query` (holding `WHERE {where} ORDER BY key`, `key` a unique integer column of `table`) `rows` at
        a time, on a cursor of its own, sorted one stretch of keys of about `span_rows` rows at a time: bounded
        sorts that stay in memory (a sort of every row spilled to disk at 10^7 kernels), each stretch read
        through the zone maps of a table stored roughly in key order."""
        cursor = self.con.cursor()
        try:
            lo, hi, n = cursor.execute(f"SELECT min({key}), max({key}), count(*) FROM {table}").fetchall()[0]
            if not n:
                return
            width = (int(hi) - int(lo)) // max(1, -(-int(n) // span_rows)) + 1
            for start in range(int(lo), int(hi) + 1, width):
                where = f"{key} >= {start} AND {key} < {start + width}"
                for batch in cursor.sql(query.format(where=where)).to_arrow_reader(rows):
                    if batch.num_rows:
                        yield pa.Table.from_batches([batch])
        finally:
            cursor.close()

    def _ranges_of(self, table: pa.Table) -> pd.DataFrame:
        domains = np.array(self.domains, dtype=object)
        codes = table.column("domain_code").to_numpy()
        return pd.DataFrame(
            {
                "range_id": table.column("range_id").to_numpy(),
                "domain": pd.Series(domains[codes] if len(codes) else np.zeros(0, object), dtype=object),
                "text": pd.Series(
                    table.column("text").combine_chunks() if table.num_rows else pa.array([], pa.string()), dtype="str"
                ),
                "start": table.column("start").to_numpy(),
                "end": table.column("end").to_numpy(),
                "global_tid": table.column("global_tid").to_numpy(),
                "pid": table.column("pid").to_numpy(),
                "event_type": table.column("event_type").to_numpy().astype(np.int8),
                "unclosed": table.column("unclosed").to_numpy(zero_copy_only=False).astype(bool),
            },
            copy=False,
        )

    def _api_of(self, f: pd.DataFrame) -> pd.DataFrame:
        f.insert(
            1,
            "name",
            pd.Categorical.from_codes(
                f.pop("name_code").to_numpy(np.int64), categories=pd.Index(self.api_names, dtype=object)
            ),
        )
        return f

    def _gpu_of(self, f: pd.DataFrame) -> pd.DataFrame:
        from dlprof_profiler.trace import GPU_COLUMNS

        f["kind"] = f["kind"].astype(np.int8)
        f["name"] = pd.Categorical.from_codes(
            f.pop("name_code").to_numpy(np.int64), categories=pd.Index(self.gpu_short, dtype=object)
        )
        f["long_name"] = pd.Categorical.from_codes(
            f.pop("long_code").to_numpy(np.int64), categories=pd.Index(self.gpu_long, dtype=object)
        )
        return f[GPU_COLUMNS]

    def whole_trace(self) -> Trace:
        """Every frame in memory, exactly as read_nsys_export builds them (for small stores and tests)."""
        trace = self.trace
        out = Trace(
            source=trace.source,
            meta=dict(trace.meta),
            system=dict(trace.system),
            devices=trace.devices,
            processes=trace.processes,
            threads=trace.threads,
            syncs=trace.syncs,
            io_calls=trace.io_calls,
            domain_map=dict(trace.domain_map),
            warnings=list(trace.warnings),
            has_cuda_tables=trace.has_cuda_tables,
            has_nvtx=trace.has_nvtx,
        )
        out.ranges = self.ranges_frame()
        out.api_calls = self.api_frame()
        out.gpu = self.gpu_frame()
        return out


class _NoStrings:
    """Names of threads and I/O calls looked up in the staged string table (huge StringIds tables)."""

    def __init__(self, store: TraceStore):
        self.store = store

    def lookup(self, ids) -> np.ndarray:
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size == 0:
            return np.zeros(0, dtype=object)
        self.store.con.register("_ids", pd.DataFrame({"id": ids, "pos": np.arange(ids.size)}))
        f = self.store.frame("SELECT i.pos, s.value FROM _ids i LEFT JOIN strings s ON s.id = i.id ORDER BY i.pos")
        self.store.con.unregister("_ids")
        return f["value"].to_numpy(dtype=object)


def _sorted_text(values: np.ndarray) -> np.ndarray:
    """Distinct texts in Python's order (code points), as numpy's unique gives them."""
    return np.array(sorted(values.tolist()), dtype=object)


def _duck_type(t: pa.DataType) -> str:
    return "VARCHAR" if pa.types.is_string(t) else "BIGINT"
