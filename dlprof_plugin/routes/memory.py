"""The Memory view's data (http_api.md, `memory` and `table/memory_ops`): the memory report of an aggregation as
the engine stored it (memory_devices, memory_ops: memory.py computed them), and each device's allocated and
reserved memory over a time window from raw_memory_events, whose rows hold the levels after each event, so the
viewer draws the engine's figures and computes none. The Timeline's memory track reads the same route.

A window's curve keeps every event while there are at most POINTS_PER_PIXEL per pixel column; beyond that, per
pixel column the first, lowest, highest and last level (every peak stays), plus the level the window starts at.
"""

from __future__ import annotations

import numpy as np

from dlprof_plugin.replies import BadRequest, NotFound, TooLarge, int_arg, json_reply
from dlprof_plugin.tables import Col, TableQuery, aggregation_filters, op_identity
from dlprof_profiler import contract as K

POINTS_PER_PIXEL = 4
MAX_WIDTH = 20_000
NOT_RECORDED = (
    "No memory events in this profile: record them with dlprof --detailed_mode (either backend), "
    "nsys profile --cuda-memory-usage=true or torch.profiler.profile(profile_memory=True)"
)
OLD_DATABASE = (
    "This database was written before dlprof recorded memory (schema older than 3.1): analyse the profile again "
    "with this dlprof (dlprof --database=<the nsys export or trace>) for the memory report"
)


def routes(service) -> dict:
    """{route: handler} for the Service."""
    return {"memory": lambda request, ctx, eid: memory_route(service, request, ctx, eid)}


def tables(service) -> dict:
    """{table name: builder(scope, request)} for the Service."""
    return {"memory_ops": lambda s, request: memory_ops_table(s)}


def has_memory_tables(db) -> bool:
    """Whether the file's schema has the memory tables (3.1 and newer)."""
    return db.cached(
        "memory_tables",
        lambda: bool(db.query("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (K.RAW_MEMORY_EVENTS,))),
    )


def _recorded(db, rank: int) -> bool:
    return has_memory_tables(db) and db.cached(
        ("memory_recorded", rank),
        lambda: bool(db.query(f"SELECT 1 FROM {K.RAW_MEMORY_EVENTS} WHERE rank = ? LIMIT 1", (rank,))),
    )


def memory_route(service, request, ctx, eid):
    s = service.scope(request, ctx, eid)
    db = s.db
    iterations = service.iteration_rows(s)
    doc = {
        "recorded": False,
        "message": None,
        "devices": [],
        "series": [],
        "iterations": [{k: it[k] for k in ("iteration", "start", "end", "aggregated")} for it in iterations],
    }
    if not has_memory_tables(db):
        doc["message"] = OLD_DATABASE
        return json_reply(doc)
    if not _recorded(db, s.rank):
        doc["message"] = NOT_RECORDED
        return json_reply(doc)
    doc["recorded"] = True
    doc["devices"] = db.query_dicts(
        f"SELECT device_type, device_id, {K.device_label_sql('device_type', 'device_id')} AS device, peak_allocated, "
        "peak_reserved, allocated_at_end, allocations, frees, bytes_allocated, bytes_freed "
        f"FROM {K.MEMORY_DEVICES} WHERE aggr_id = ? AND domain_id = ? ORDER BY device_type, device_id",
        (s.aggr_id, s.domain_id),
    )
    extent = _extent(db, s.rank, iterations)
    t0 = int_arg(request, "t0", default=extent[0], minimum=None)
    t1 = int_arg(request, "t1", default=extent[1], minimum=None)
    if t1 <= t0:
        raise BadRequest("t1 must be greater than t0")
    width = int_arg(request, "width", default=1000, minimum=1)
    if width > MAX_WIDTH:
        raise TooLarge(f"width {width} is larger than {MAX_WIDTH} pixels")
    doc["extent"] = list(extent)
    doc["window"] = [t0, t1]
    doc["series"] = [
        _series(db, s.rank, int(d["device_type"]), int(d["device_id"]), d["device"], t0, t1, width)
        for d in _event_devices(db, s.rank)
    ]
    return json_reply(doc)


def _event_devices(db, rank: int) -> list[dict]:
    return db.cached(
        ("memory_devices", rank),
        lambda: db.query_dicts(
            f"SELECT device_type, device_id, {K.device_label_sql('device_type', 'device_id')} AS device "
            f"FROM {K.RAW_MEMORY_EVENTS} WHERE rank = ? GROUP BY device_type, device_id "
            "ORDER BY device_type, device_id",
            (rank,),
        ),
    )


def _extent(db, rank: int, iterations: list[dict]) -> tuple[int, int]:
    """The whole profile: its iterations and its memory events."""

    def compute():
        lo, hi = db.query(f"SELECT min(start), max(start) FROM {K.RAW_MEMORY_EVENTS} WHERE rank = ?", (rank,))[0]
        starts = [int(it["start"]) for it in iterations] + ([int(lo)] if lo is not None else [])
        ends = [int(it["end"]) for it in iterations] + ([int(hi) + 1] if hi is not None else [])
        return (min(starts), max(ends)) if starts else (0, 1)

    return db.cached(("memory_extent", rank), compute)


def _series(db, rank: int, device_type: int, device_id: int, label: str, t0: int, t1: int, width: int) -> dict:
    """One device's curve over [t0, t1): the level the window starts at, then the events in it (thinned)."""
    key = "rank = ? AND device_type = ? AND device_id = ?"
    params = (rank, device_type, device_id)
    with db.connect() as con:
        before = con.execute(
            f"SELECT start, allocated, coalesce(reserved, -1) FROM {K.RAW_MEMORY_EVENTS} WHERE {key} AND start < ? "
            "ORDER BY start DESC, rowid DESC LIMIT 1",
            params + (t0,),
        ).fetchone()
        rows = con.execute(
            f"SELECT start, allocated, coalesce(reserved, -1) FROM {K.RAW_MEMORY_EVENTS} WHERE {key} "
            "AND start >= ? AND start < ? ORDER BY start, rowid",
            params + (t0, t1),
        ).fetchall()
        first = None
        if before is None:  # the level before the device's first event: its allocated less its bytes
            first = con.execute(
                f"SELECT allocated - bytes FROM {K.RAW_MEMORY_EVENTS} WHERE {key} ORDER BY start, rowid LIMIT 1",
                params,
            ).fetchone()
    events = len(rows)
    t = np.array([r[0] for r in rows], dtype=np.int64)
    allocated = np.array([r[1] for r in rows], dtype=np.int64)
    reserved = np.array([r[2] for r in rows], dtype=np.int64)
    if events > POINTS_PER_PIXEL * width:
        keep = _thinned(t, allocated, t0, t1, width)
        t, allocated, reserved = t[keep], allocated[keep], reserved[keep]
    start_level = int(before[1]) if before is not None else (int(first[0]) if first is not None else 0)
    start_reserved = int(before[2]) if before is not None else -1
    return {
        "device_type": device_type,
        "device_id": device_id,
        "device": label,
        "events": events,
        "t": [t0] + t.tolist(),
        "allocated": [start_level] + allocated.tolist(),
        "reserved": [None if start_reserved < 0 else start_reserved] + [None if r < 0 else int(r) for r in reserved],
    }


def _thinned(t: np.ndarray, level: np.ndarray, t0: int, t1: int, width: int) -> np.ndarray:
    """Rows to keep, in time order: per pixel column its first, lowest, highest and last row."""
    column = np.minimum(((t - t0) * width) // max(t1 - t0, 1), width - 1)
    bounds = np.flatnonzero(np.r_[True, column[1:] != column[:-1]])
    ends = np.r_[bounds[1:], t.size] - 1
    low = np.minimum.reduceat(level, bounds)
    high = np.maximum.reduceat(level, bounds)
    group = np.repeat(np.arange(bounds.size), np.diff(np.r_[bounds, t.size]))
    lowest = np.zeros(bounds.size, dtype=np.int64)
    highest = np.zeros(bounds.size, dtype=np.int64)
    rows = np.arange(t.size)
    # the first row of each column reaching its low / high (reverse writes: the earliest one stays)
    is_low, is_high = level == low[group], level == high[group]
    lowest[group[is_low][::-1]] = rows[is_low][::-1]
    highest[group[is_high][::-1]] = rows[is_high][::-1]
    return np.unique(np.concatenate([bounds, lowest, highest, ends]))


def memory_ops_table(s) -> TableQuery:
    """The memory report's Ops section of an aggregation (a file older than schema 3.1: 404 with the reason)."""
    if not has_memory_tables(s.db):
        raise NotFound(OLD_DATABASE)
    cols = [Col("op_index", "Op Index", "int", "m.op_index", hidden=True)]
    cols += op_identity("o", s.pytorch, with_type=False)
    cols += [
        Col("device", "Device", "text", K.device_label_sql("m.device_type", "m.device_id"), term="memory_device"),
        Col("num_calls", "No. Calls", "int", "n.num_calls"),
        Col("allocations", "Allocations", "int", "m.allocations", term="op_allocations"),
        Col("frees", "Frees", "int", "m.frees", term="op_frees"),
        Col("bytes_allocated", "Bytes Allocated", "int", "m.bytes_allocated", term="op_bytes_allocated"),
        Col("bytes_freed", "Bytes Freed", "int", "m.bytes_freed", term="op_bytes_freed"),
        Col("peak_allocated", "Peak Allocated (bytes)", "int", "m.peak_allocated", term="op_peak_allocated"),
    ]
    return TableQuery(
        "memory_ops",
        cols,
        "memory_ops m JOIN read_only_ops o ON o.op_index = m.op_index LEFT JOIN op_nodes n ON n.aggr_id = m.aggr_id "
        "AND n.domain_id = m.domain_id AND n.op_index = m.op_index",
        aggregation_filters("m"),
        s.params(),
        ("bytes_allocated", "desc"),
        "m.rowid",
        key="m.rowid",
        count_source="memory_ops m",
    )
