"""Copy an nsys export's raw facts into the DLProf database inside SQLite (INSERT ... SELECT over an
attached, read-only export), with the ids, order and values ingest_nsys gives them: millions of rows
move at C speed instead of through Python."""
from __future__ import annotations

import sqlite3
from pathlib import Path

from dlprof_profiler.ingest_nsys import (COPY_KIND_LABELS, KERNEL_SOURCE_COLUMNS, MEMORY_SOURCE_COLUMNS,
                                         MEMSET_LABEL, NVTX_RANGE_TYPES, _GPU_FIELD)
from dlprof_profiler.sqlite_source import SqliteSource
from dlprof_profiler.trace import GPU_COLUMNS, KIND_KERNEL, KIND_MEMCPY, KIND_MEMSET

SRC = "src"
PID = "((coalesce({g}, 0) >> 24) & 16777215)"


def _col(src: SqliteSource, table: str, name: str, default: str = "-1", alias: str = "t") -> str:
    return f'coalesce({alias}."{name}", {default})' if name in src.columns(table) else default


# Rows sanitize.py drops (a time missing, or the end before the start) are not copied either, so ids match.
VALID_TIMES = "t.start IS NOT NULL AND t.end IS NOT NULL AND t.end >= t.start"


def attach(con: sqlite3.Connection, export: Path) -> None:
    con.execute(f"ATTACH DATABASE ? AS {SRC}", (f"{Path(export).resolve().as_uri()}?mode=ro&immutable=1",))


def copy_ranges(con: sqlite3.Connection, src: SqliteSource, domain_map: dict, domain_ids: dict,
                capture_end: int) -> None:
    """NVTX ranges -> read_only_ranges (range_id = rowid; unclosed ranges end at the capture end)."""
    t = "NVTX_EVENTS"
    if not src.has(t):
        return
    con.execute("CREATE TEMP TABLE domain_map (pid INTEGER, handle INTEGER, domain_id INTEGER, "
                "PRIMARY KEY (pid, handle))")
    con.executemany("INSERT INTO temp.domain_map VALUES (?, ?, ?)",
                    [(p, h, domain_ids.get(name, -1)) for (p, h), name in domain_map.items()])
    text = "coalesce(s.value, t.text, '')" if "textId" in src.columns(t) and "text" in src.columns(t) else \
        ("coalesce(s.value, '')" if "textId" in src.columns(t) else "coalesce(t.text, '')")
    join = f"LEFT JOIN {SRC}.StringIds s ON s.id = t.textId" if "textId" in src.columns(t) else ""
    end = f"coalesce(t.end, max({int(capture_end)}, t.start))"
    con.execute(f"""
        INSERT INTO read_only_ranges (range_id, domain_id, text, start, "end", global_tid, pid, event_type, unclosed)
        SELECT t.rowid, m.domain_id, {text}, t.start, {end}, coalesce(t.globalTid, 0),
               {PID.format(g='t.globalTid')}, t.eventType, t.end IS NULL
        FROM {SRC}.{t} t {join}
        JOIN temp.domain_map m ON m.pid = {PID.format(g='t.globalTid')} AND m.handle = {_col(src, t, 'domainId', '0')}
        WHERE t.eventType IN ({','.join(map(str, NVTX_RANGE_TYPES))}) AND {end} >= t.start""")


def copy_api_calls(con: sqlite3.Connection, src: SqliteSource) -> None:
    """CUDA API calls -> read_only_cuda_calls (api_id = position in (start, rowid) order)."""
    t = "CUPTI_ACTIVITY_KIND_RUNTIME"
    if not src.has(t):
        return
    con.execute(f"""
        INSERT INTO read_only_cuda_calls (api_id, name, start, "end", global_tid, pid, correlation_id, event_class,
                                          return_value)
        SELECT ROW_NUMBER() OVER (ORDER BY t.start, t.rowid) - 1, s.value, t.start, t.end, coalesce(t.globalTid, 0),
               {PID.format(g='t.globalTid')}, coalesce(t.correlationId, -1), coalesce(t.eventClass, 0),
               {_col(src, t, 'returnValue', '0')}
        FROM {SRC}.{t} t LEFT JOIN {SRC}.StringIds s ON s.id = t.nameId WHERE {VALID_TIMES}""")


def copy_gpu_activities(con: sqlite3.Connection, src: SqliteSource) -> None:
    """Kernels, memcpys, memsets -> read_only_gpu_activities (activity_id = position in
    (start, kind, rowid) order), named as ingest names them."""
    reverse = {}
    for source, field in _GPU_FIELD.items():
        reverse.setdefault(field, []).append(source)
    selects = []
    kt, mt, st = "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"

    def fields(table: str, available: list[str], kind: int, name_sql: str, long_sql: str) -> str:
        exprs = []
        for column in GPU_COLUMNS:
            if column == "activity_id":
                continue
            if column == "kind":
                exprs.append(f"{kind} AS kind")
            elif column == "name":
                exprs.append(f"{name_sql} AS name")
            elif column == "long_name":
                exprs.append(f"{long_sql} AS long_name")
            elif column == "pid":
                exprs.append(f"{PID.format(g='t.globalPid')} AS pid")
            else:
                sources = [s for s in reverse.get(column, []) if s in available]
                exprs.append(f"{_col(src, table, sources[0]) if sources else '-1'} AS {column}")
        return ", ".join(exprs) + ", t.rowid AS src_rowid"
    if src.has(kt):
        short = f"{SRC}.StringIds ss ON ss.id = t.shortName" if "shortName" in src.columns(kt) else None
        long = f"{SRC}.StringIds sl ON sl.id = t.demangledName" if "demangledName" in src.columns(kt) else None
        joins = " ".join(f"LEFT JOIN {j}" for j in (short, long) if j)
        name = f"coalesce({'ss.value, ' if short else ''}{'sl.value, ' if long else ''}'<unknown kernel>')"
        long_name = f"coalesce({'sl.value, ' if long else ''}{'ss.value, ' if short else ''}'<unknown kernel>')"
        selects.append(f"SELECT {fields(kt, KERNEL_SOURCE_COLUMNS, KIND_KERNEL, name, long_name)} "
                       f"FROM {SRC}.{kt} t {joins} WHERE {VALID_TIMES}")
    if src.has(mt):
        cases = " ".join(f"WHEN {k} THEN '{v}'" for k, v in COPY_KIND_LABELS.items())
        label = f"CASE {_col(src, mt, 'copyKind', '0')} {cases} ELSE '{COPY_KIND_LABELS[0]}' END"
        selects.append(f"SELECT {fields(mt, MEMORY_SOURCE_COLUMNS + ['copyKind', 'srcKind', 'dstKind'], KIND_MEMCPY, label, label)} "
                       f"FROM {SRC}.{mt} t WHERE {VALID_TIMES}")
    if src.has(st):
        label = f"'{MEMSET_LABEL}'"
        selects.append(f"SELECT {fields(st, MEMORY_SOURCE_COLUMNS + ['memKind'], KIND_MEMSET, label, label)} "
                       f"FROM {SRC}.{st} t WHERE {VALID_TIMES}")
    if not selects:
        return
    columns = [c for c in GPU_COLUMNS if c != "activity_id"]
    quoted = ", ".join(f'"{c}"' for c in columns)
    con.execute(f"""
        INSERT INTO read_only_gpu_activities (activity_id, {quoted})
        SELECT ROW_NUMBER() OVER (ORDER BY start, kind, src_rowid) - 1, {quoted}
        FROM ({' UNION ALL '.join(selects)})""")
