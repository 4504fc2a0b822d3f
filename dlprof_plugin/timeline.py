"""The Timeline view's data: one window [t0, t1) of one rank of a DLProf database (schema 3.0), as rows of
boxes a canvas draws. CPU threads carry the op instances of the shown NVTX domain (one sub-row per nesting
depth) and their CUDA API calls; GPUs carry, per stream, their kernels, memcpys and memsets.

Only what the window shows is read and sent:
- API calls and GPU activities are keyed in start order within a rank (contract.db_id over the engine's
  positional ids), so a window is a rowid range found by binary search; op instances come from the
  (domain_id, start) index.
- An event is in the window when it overlaps it (an instant counts as 1 ns); events starting before it are
  looked for back to the start of the iteration before the window's first one, or, once known, back to the
  longest duration of their table (so the answer does not depend on which bound was used).
- Events shorter than a pixel are merged with the others starting in the same pixel of their row into one box
  (its count, busy time and the name of its longest event), so an answer holds at most about two boxes per
  pixel and row, whatever the zoom, and a dense stretch keeps its shape (the busy time shades each pixel).
- GPU idle gaps: per GPU, the parts of the window in which no kernel runs on it (from every kernel in the
  window, merged or not); those of a pixel or more are listed, their total is exact.
Times are integer ns on the capture clock.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass

import numpy as np

from dlprof_profiler import contract as K

KIND_OP, KIND_API = 10, 11  # event kinds besides the GPU activity kinds (contract.KIND_*)
MAX_WIDTH = 20_000  # pixels a request may ask for
MAX_IN_LIST = 500  # keys per `IN (...)` lookup
MAX_EVENTS = 1_000_000  # events a window may hold (more: 413, zoom in)
NOT_ON_CPU = (K.UNASSOCIATED_GPU,)  # op instances without CPU time: GPU activities no API call launched


class TimelineError(Exception):
    """A request the timeline cannot answer (the message is the reason)."""


class TooManyEvents(Exception):
    """A window holding more events than a request reads (`events`: how many, at least)."""

    def __init__(self, events: int):
        super().__init__(
            f"more than {MAX_EVENTS:,} events (op instances, API calls and GPU activities) start in the window: zoom in"
        )
        self.events = events


# ---------------------------------------------------------------------------- window bounds


def rank_of_domain(db, domain_id: int) -> int:
    """The rank a domain of a schema 3.0 database belongs to."""

    def compute():
        row = db.query(f"SELECT rank FROM {K.RAW_DOMAINS} WHERE domain_id = ?", (domain_id,))
        return int(row[0][0]) if row else K.DEFAULT_RANK

    return db.cached(("domain_rank", domain_id), compute)


def iteration_bounds(db, aggr_id: int, rank: int) -> np.ndarray:
    """(iteration, start, stop) rows of an aggregation's iterations, in order."""

    def compute():
        rows = db.query(
            f"SELECT iter_value, start_time, stop_time FROM {K.ITERATION_LIST} WHERE aggr_id = ? "
            "AND rank = ? ORDER BY iter_value",
            (aggr_id, rank),
        )
        return np.array(rows, dtype=np.int64).reshape(-1, 3)

    return db.cached(("iteration_bounds", aggr_id, rank), compute)


def lookback_start(iterations: np.ndarray, t0: int) -> int:
    """The start of the iteration before the one containing t0 (the first iteration's start if there is
    none; t0 itself before the first iteration)."""
    if len(iterations) == 0 or t0 < iterations[0, 1]:
        return t0
    i = int(np.searchsorted(iterations[:, 1], t0, side="right")) - 1
    return int(iterations[max(i - 1, 0), 1])


class LongestDurations:
    """The longest duration of each large table's rows of a rank (or domain), found in the background once per
    database state: until known, windows look back by iterations."""

    def __init__(self):
        self._lock = threading.Lock()
        self._values: dict = {}

    def get(self, db, table: str, key: str, scope: int) -> int | None:
        state = (db.path, db.state())
        name = (state, table, scope)
        with self._lock:
            if name in self._values:
                return self._values[name]
            self._values[name] = None
            for old in [k for k in self._values if k[0][0] == db.path and k[0] != state]:
                del self._values[old]

        def work():
            try:
                lo, hi = K.db_id(scope, 0), K.db_id(scope + 1, 0)
                row = db.query(f"SELECT max(duration) FROM {table} WHERE {key} >= ? AND {key} < ?", (lo, hi))
                value = int(row[0][0] or 0)
            except Exception:  # noqa: BLE001 - keep looking back by iterations
                return
            with self._lock:
                if name in self._values:
                    self._values[name] = value

        threading.Thread(target=work, name="dlprof-timeline-longest", daemon=True).start()
        return None


LONGEST = LongestDurations()


def look_back(db, aggr_id: int, rank: int, domain_id: int, t0: int) -> dict:
    """Per kind of event (ops, api, gpu), the earliest start read for a window from t0: the start of the
    iteration before t0's, or t0 minus the kind's longest duration once known, whichever is later."""
    back = lookback_start(iteration_bounds(db, aggr_id, rank), t0)
    out = {}
    for name, table, key, scope in (
        ("ops", K.RAW_OP_INSTANCES, "instance_id", domain_id),
        ("api", K.RAW_API_CALLS, "api_id", rank),
        ("gpu", K.RAW_GPU_ACTIVITIES, "activity_id", rank),
    ):
        longest = LONGEST.get(db, table, key, scope)
        out[name] = min(t0, max(back, t0 - longest)) if longest is not None else min(t0, back)
    return out


def _first_key_at(con, table: str, key: str, lo_key: int, hi_key: int, time: int) -> int:
    """The first key in [lo_key, hi_key) of a row starting at or after `time` (past the last row if none):
    binary search on the rowid, the rows of a rank being keyed in start order (keys may have holes)."""
    # two rowid seeks (min() and max() together would scan the range)
    first = con.execute(
        f"SELECT {key} FROM {table} WHERE {key} >= ? AND {key} < ? ORDER BY {key} LIMIT 1", (lo_key, hi_key)
    ).fetchone()
    if first is None:
        return lo_key
    last = con.execute(f"SELECT {key} FROM {table} WHERE {key} < ? ORDER BY {key} DESC LIMIT 1", (hi_key,)).fetchone()
    first, last = first[0], last[0]
    lo, hi = int(first), int(last) + 1
    probe = f"SELECT {key}, start FROM {table} WHERE {key} >= ? ORDER BY {key} LIMIT 1"
    while lo < hi:
        mid = (lo + hi) // 2
        k, start = con.execute(probe, (mid,)).fetchone()  # exists: mid <= last
        if start < time:
            lo = int(k) + 1
        else:
            hi = mid
    return lo


def _keyed_range(con, table: str, key: str, rank: int, lo: int, t1: int) -> tuple[int, int]:
    scope_lo, scope_hi = K.db_id(rank, 0), K.db_id(rank + 1, 0)
    return (
        _first_key_at(con, table, key, scope_lo, scope_hi, lo),
        _first_key_at(con, table, key, scope_lo, scope_hi, t1),
    )


def _columns(cursor, names: tuple) -> dict:
    """The rows of a query over integer columns (NULLs coalesced in SQL) as int64 arrays by name."""
    rows = cursor.fetchall()
    flat = np.fromiter(itertools.chain.from_iterable(rows), dtype=np.int64, count=len(rows) * len(names))
    table = flat.reshape(len(rows), len(names))
    return {n: table[:, i] for i, n in enumerate(names)}


@dataclass
class Ranges:
    """Where a window's events are read from: the API call and GPU activity key ranges and the op instances'
    start range (each from its own look-back bound to t1)."""

    api: tuple[int, int]
    gpu: tuple[int, int]
    ops_from: int


def find_ranges(con, rank: int, lo: dict, t1: int) -> Ranges:
    return Ranges(
        _keyed_range(con, K.RAW_API_CALLS, "api_id", rank, lo["api"], t1),
        _keyed_range(con, K.RAW_GPU_ACTIVITIES, "activity_id", rank, lo["gpu"], t1),
        lo["ops"],
    )


def count_at_most(con, rank: int, domain_id: int, t0: int, t1: int, limit: int) -> int:
    """How many events start in [t0, t1) (op instances counted up to `limit` + 1 only: a bounded cost)."""
    n = 0
    for table, key in ((K.RAW_API_CALLS, "api_id"), (K.RAW_GPU_ACTIVITIES, "activity_id")):
        a, b = _keyed_range(con, table, key, rank, t0, t1)
        n += b - a
    if n > limit:
        return n
    ops = con.execute(
        f"SELECT count(*) FROM (SELECT 1 FROM {K.RAW_OP_INSTANCES} WHERE domain_id = ? AND start >= ? "
        "AND start < ? LIMIT ?)",
        (domain_id, t0, t1, limit - n + 1),
    ).fetchone()[0]
    return n + ops


def read_instances(con, domain_id: int, lo: int, t0: int, t1: int) -> dict:
    """Op instances of a domain on a CPU thread overlapping [t0, t1), started at or after lo."""
    return _columns(
        con.execute(
            f"SELECT i.instance_id, i.op_index, i.thread_id, i.start, i.duration FROM {K.RAW_OP_INSTANCES} i "
            "WHERE i.domain_id = ? AND i.start >= ? AND i.start < ? AND i.start + max(i.duration, 1) > ? "
            f"AND i.kind NOT IN ({', '.join(str(k) for k in NOT_ON_CPU)}) AND i.thread_id IS NOT NULL",
            (domain_id, lo, t1, t0),
        ),
        ("key", "op_index", "thread_id", "start", "duration"),
    )


def read_api_calls(con, keys: tuple[int, int], t0: int) -> dict:
    return _columns(
        con.execute(
            f"SELECT api_id, coalesce(name_id, -1), thread_id, start, duration FROM {K.RAW_API_CALLS} "
            "WHERE api_id >= ? AND api_id < ? AND start + max(duration, 1) > ?",
            (*keys, t0),
        ),
        ("key", "name_id", "thread_id", "start", "duration"),
    )


def read_gpu_activities(con, keys: tuple[int, int], t0: int) -> dict:
    return _columns(
        con.execute(
            f"SELECT activity_id, kind, name_id, coalesce(device_id, -1), coalesce(stream_id, -1), start, duration "
            f"FROM {K.RAW_GPU_ACTIVITIES} WHERE activity_id >= ? AND activity_id < ? AND start + max(duration, 1) > ?",
            (*keys, t0),
        ),
        ("key", "kind", "name_id", "device_id", "stream_id", "start", "duration"),
    )


# ---------------------------------------------------------------------------- pure helpers over arrays


def nesting_depth(group: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Per interval, how many intervals of its group enclose it (properly nested intervals; partly
    overlapping ones count as enclosing while open): intervals opened before it, outer first at equal starts,
    minus those closed by its start."""
    n = start.size
    depth = np.zeros(n, dtype=np.int64)
    if n == 0:
        return depth
    order = np.lexsort((-end, start, group))
    g, s = group[order], start[order]
    first = np.r_[0, np.flatnonzero(g[1:] != g[:-1]) + 1]
    first_of = np.repeat(first, np.diff(np.r_[first, n]))
    span = int(max(end.max(), start.max()) - min(end.min(), start.min())) + 1
    base = int(min(end.min(), start.min()))
    _, g_rank = np.unique(g, return_inverse=True)
    ends_key = np.sort(g_rank.astype(np.int64) * span + (end[order] - base))
    closed = np.searchsorted(ends_key, g_rank.astype(np.int64) * span + (s - base), side="right") - np.searchsorted(
        ends_key, g_rank.astype(np.int64) * span, side="left"
    )
    depth[order] = np.maximum(np.arange(n) - first_of - closed, 0)
    return depth


def merge_small(row: np.ndarray, start: np.ndarray, t0: int, ns_per_px: float) -> tuple[np.ndarray, np.ndarray]:
    """Events shorter than a pixel, grouped per row and pixel column of their start (events starting before
    the window in the first column): (order of the events by row and start, group number of each event in that
    order). A row gets at most one group per pixel, so dense stretches keep their shape at any zoom."""
    n = start.size
    if n == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    order = np.lexsort((start, row))
    r, s = row[order], start[order]
    column = np.floor(np.maximum(s - t0, 0) / ns_per_px).astype(np.int64)
    new = np.r_[True, (r[1:] != r[:-1]) | (column[1:] != column[:-1])]
    return order, np.cumsum(new) - 1


def idle_gaps(start: np.ndarray, end: np.ndarray, t0: int, t1: int) -> tuple[np.ndarray, np.ndarray]:
    """The parts of [t0, t1) that no interval covers (intervals clipped to the window)."""
    s = np.clip(start, t0, t1)
    e = np.clip(end, t0, t1)
    keep = e > s
    order = np.argsort(s[keep], kind="stable")
    s, e = s[keep][order], e[keep][order]
    covered_to = np.maximum.accumulate(e) if e.size else e
    gap_s = np.r_[t0, covered_to].astype(np.int64)  # after each prefix of intervals ...
    gap_e = np.r_[s, t1].astype(np.int64)  # ... until the next one starts
    ok = gap_e > gap_s
    return gap_s[ok], gap_e[ok]


def covered_time(start: np.ndarray, end: np.ndarray, t0: int, t1: int) -> int:
    """The length of [t0, t1) the intervals cover (overlaps once)."""
    gs, ge = idle_gaps(start, end, t0, t1)
    return int(t1 - t0 - (ge - gs).sum())


# ---------------------------------------------------------------------------- names and rows


def _texts(con, ids) -> dict:
    ids = sorted({int(i) for i in ids if i is not None and int(i) >= 0})
    out = {}
    for k in range(0, len(ids), MAX_IN_LIST):
        chunk = ids[k : k + MAX_IN_LIST]
        out.update(
            con.execute(
                f"SELECT id, value FROM {K.STRINGS} WHERE id IN ({', '.join('?' * len(chunk))})", chunk
            ).fetchall()
        )
    return out


def _op_names(con, op_indexes) -> dict:
    ids = sorted({int(i) for i in op_indexes})
    out = {}
    for k in range(0, len(ids), MAX_IN_LIST):
        chunk = ids[k : k + MAX_IN_LIST]
        out.update(
            con.execute(
                f"SELECT op_index, op_name FROM {K.READ_ONLY_OPS} WHERE op_index IN ({', '.join('?' * len(chunk))})",
                chunk,
            ).fetchall()
        )
    return out


def _threads(con, rank: int, thread_ids) -> dict:
    ids = np.unique(np.asarray(thread_ids, dtype=np.int64)).tolist()
    out = {}
    for k in range(0, len(ids), MAX_IN_LIST):
        chunk = ids[k : k + MAX_IN_LIST]
        for tid_, pid, tid, name in con.execute(
            f"SELECT t.thread_id, t.pid, t.tid, (SELECT value FROM {K.STRINGS} WHERE id = t.name_id) "
            f"FROM {K.RAW_THREADS} t WHERE t.rank = ? AND t.thread_id IN ({', '.join('?' * len(chunk))})",
            [rank] + chunk,
        ).fetchall():
            out[int(tid_)] = (int(pid), int(tid), name)
    return out


def _launches(con, domain_id: int, activity_keys: np.ndarray) -> dict:
    """Who launched GPU activities, from the domain's owner rows: {activity key: (its launching API call's key,
    thread, start and end, or -1s when no call launched it; the op_index of the op instance owning it)}."""
    found = {}
    keys = [int(k) for k in activity_keys]
    for k in range(0, len(keys), MAX_IN_LIST):
        chunk = [K.db_id(domain_id, a & K.ID_MASK) for a in keys[k : k + MAX_IN_LIST]]
        for act, api, thread, start, duration, op_index in con.execute(
            f"SELECT w.activity_id, c.api_id, c.thread_id, c.start, c.duration, i.op_index "
            f"FROM {K.RAW_ACTIVITY_OWNERS} w LEFT JOIN {K.RAW_API_CALLS} c ON c.api_id = w.api_id "
            f"LEFT JOIN {K.RAW_OP_INSTANCES} i ON i.instance_id = w.instance_id "
            f"WHERE w.owner_id IN ({', '.join('?' * len(chunk))})",
            chunk,
        ).fetchall():
            call = (-1, -1, -1, -1) if api is None else (int(api), int(thread), int(start), int(start) + int(duration))
            found[int(act)] = (*call, -1 if op_index is None else int(op_index))
    return found


# ---------------------------------------------------------------------------- the route


def window(
    db,
    aggr_id: int,
    domain_id: int,
    t0: int,
    t1: int,
    width: int,
    groups: set | None = None,
    iteration: dict | None = None,
    hidden: set | None = None,
) -> dict:
    """The `timeline` route's answer for [t0, t1) drawn `width` pixels wide; `groups`: the thread (`t<id>`)
    and stream (`g<device>.<stream>`) groups whose events to send (None: all), `hidden`: groups whose events
    not to send."""
    if t1 <= t0:
        raise TimelineError("the window must end after it starts (t1 > t0)")
    rank = rank_of_domain(db, domain_id)
    lo = look_back(db, aggr_id, rank, domain_id, t0)
    ns_per_px = (t1 - t0) / width
    with db.snapshot() as con:
        n = count_at_most(con, rank, domain_id, t0, t1, MAX_EVENTS)
        if n > MAX_EVENTS:
            raise TooManyEvents(n)
        ranges = find_ranges(con, rank, lo, t1)
        inst = read_instances(con, domain_id, ranges.ops_from, t0, t1)
        api = read_api_calls(con, ranges.api, t0)
        gpu = read_gpu_activities(con, ranges.gpu, t0)
        answer = _assemble(con, rank, domain_id, inst, api, gpu, t0, t1, ns_per_px, groups, hidden or set())
    answer.update(window=[t0, t1], width=width, ns_per_px=ns_per_px, iteration=iteration, rank=rank)
    return answer


def unique_rows(table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """np.unique(table, axis=0, return_inverse=True) for a few distinct rows of many, through one packed int64
    key per row (each column coded first): a 1-D sort instead of a sort of row records."""
    if len(table) == 0:
        return table.reshape(0, table.shape[1]), np.zeros(0, dtype=np.int64)
    key = np.zeros(len(table), dtype=np.int64)
    for column in table.T:
        values, codes = np.unique(column, return_inverse=True)
        key = key * len(values) + codes.reshape(-1)
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    return table[first], inverse.reshape(-1)


def _row_layout(inst: dict, depth: np.ndarray, api: dict, gpu: dict, threads: dict) -> tuple[list, np.ndarray]:
    """The rows of a window and the row of each event (op instances, then API calls, then GPU activities):
    per CPU thread (by pid, tid) one row per op nesting depth then one for its API calls; per GPU one row per
    stream."""
    n_i, n_a, n_g = inst["start"].size, api["start"].size, gpu["start"].size
    # (family: 0 CPU / 1 GPU, thread or device, 0 ops / 1 API or stream, depth) of every event
    spec = np.stack(
        [
            np.r_[np.zeros(n_i + n_a, np.int64), np.ones(n_g, np.int64)],
            np.r_[inst["thread_id"], api["thread_id"], gpu["device_id"]],
            np.r_[np.zeros(n_i, np.int64), np.ones(n_a, np.int64), gpu["stream_id"]],
            np.r_[depth, np.zeros(n_a + n_g, np.int64)],
        ],
        axis=1,
    ).astype(np.int64)
    specs, inverse = unique_rows(spec)

    def order(i):
        fam, a, b, d = (int(v) for v in specs[i])
        if fam == 0:
            pid, tid, _ = threads.get(a, (-1, -1, None))
            return (0, pid if pid is not None else -1, tid if tid is not None else -1, a, b, d)
        return (1, a, b, 0, 0, 0)

    shown = sorted(range(len(specs)), key=order)
    row_of_spec = np.empty(len(specs), dtype=np.int64)
    row_of_spec[shown] = np.arange(len(specs))
    rows = []
    for i in shown:
        fam, a, b, d = (int(v) for v in specs[i])
        if fam == 0:
            pid, tid, name = threads.get(a, (None, None, None))
            label = f"{name or 'thread'} (pid {pid}, tid {tid})" if pid is not None else f"thread {a}"
            rows.append(
                {
                    "id": f"t{a}.{'api' if b else d}",
                    "group": f"t{a}",
                    "kind": "api" if b else "ops",
                    "thread_id": a,
                    "pid": pid,
                    "tid": tid,
                    "depth": d,
                    "label": label,
                }
            )
        else:
            rows.append(
                {
                    "id": f"g{a}.{b}",
                    "group": f"g{a}.{b}",
                    "kind": "gpu",
                    "device_id": a,
                    "stream_id": b,
                    "label": f"GPU {a} · stream {b}",
                }
            )
    return rows, row_of_spec[inverse.reshape(-1)]


def _events(inst: dict, api: dict, gpu: dict, row: np.ndarray) -> dict:
    """Every event of the window as columns: row, start, end, kind, key, op (op_index or -1), name (op
    events: -1 - op_index; others: their string id) and device (GPU activities; -1 for the others)."""
    n_i, n_a, n_g = inst["start"].size, api["start"].size, gpu["start"].size
    start = np.r_[inst["start"], api["start"], gpu["start"]].astype(np.int64)
    return {
        "row": row.astype(np.int64),
        "start": start,
        "end": start + np.r_[inst["duration"], api["duration"], gpu["duration"]].astype(np.int64),
        "kind": np.r_[np.full(n_i, KIND_OP), np.full(n_a, KIND_API), gpu["kind"]].astype(np.int64),
        "key": np.r_[inst["key"], api["key"], gpu["key"]].astype(np.int64),
        "op": np.r_[inst["op_index"], np.full(n_a + n_g, -1)].astype(np.int64),
        "name": np.r_[-1 - inst["op_index"], api["name_id"], gpu["name_id"]].astype(np.int64),
        "device": np.r_[np.full(n_i + n_a, -1), gpu["device_id"]].astype(np.int64),
    }


def _gpu_gaps(ev: dict, t0: int, t1: int, ns_per_px: float) -> tuple[dict, dict]:
    """Per GPU of the window: its idle gaps of a pixel or more, and its exact idle time."""
    gaps = {"device_id": [], "start": [], "end": []}
    idle = {}
    kernel = ev["kind"] == K.KIND_KERNEL
    for dev in np.unique(ev["device"][ev["device"] >= 0]).tolist():
        on = kernel & (ev["device"] == dev)
        gs, ge = idle_gaps(ev["start"][on], ev["end"][on], t0, t1)
        idle[str(dev)] = int((ge - gs).sum())
        wide = (ge - gs) >= ns_per_px
        gaps["device_id"] += [dev] * int(wide.sum())
        gaps["start"] += gs[wide].tolist()
        gaps["end"] += ge[wide].tolist()
    return gaps, idle


BOX_COLUMNS = ("row", "start", "end", "kind", "key", "op", "name", "n", "busy")


def merged_boxes(ev: dict, t0: int, ns_per_px: float) -> dict:
    """The boxes to draw: events of a pixel or more as they are; shorter ones merged with those starting in the
    same pixel of their row (merge_small) into boxes with their count `n`, busy time (summed durations) and the
    kind, op and name of their longest event (key -1); a short event alone in its pixel stays itself. Sorted by
    row and start."""
    dur = ev["end"] - ev["start"]
    small = dur < ns_per_px
    order, group = merge_small(ev["row"][small], ev["start"][small], t0, ns_per_px)
    small_idx = np.flatnonzero(small)[order]
    sizes = np.bincount(group) if group.size else np.zeros(0, dtype=np.int64)
    alone = sizes[group] == 1
    whole = np.r_[np.flatnonzero(~small), small_idx[alone]].astype(np.int64)
    parts = [
        {
            "row": ev["row"][whole],
            "start": ev["start"][whole],
            "end": ev["end"][whole],
            "kind": ev["kind"][whole],
            "key": ev["key"][whole],
            "op": ev["op"][whole],
            "name": ev["name"][whole],
            "n": np.ones(whole.size, dtype=np.int64),
            "busy": dur[whole],
        }
    ]
    m_idx, m_group = small_idx[~alone], group[~alone]
    if m_idx.size:
        first = np.r_[0, np.flatnonzero(np.diff(m_group)) + 1]
        m_dur = dur[m_idx]
        by_length = np.lexsort((-m_dur, m_group))
        longest = m_idx[by_length[np.r_[0, np.flatnonzero(np.diff(m_group[by_length])) + 1]]]
        parts.append(
            {
                "row": ev["row"][m_idx][first],
                "start": np.minimum.reduceat(ev["start"][m_idx], first),
                "end": np.maximum.reduceat(ev["end"][m_idx], first),
                "kind": ev["kind"][longest],
                "key": np.full(first.size, -1, dtype=np.int64),
                "op": ev["op"][longest],
                "name": ev["name"][longest],
                "n": np.diff(np.r_[first, m_idx.size]),
                "busy": np.add.reduceat(m_dur, first),
            }
        )
    boxes = {c: np.concatenate([p[c] for p in parts]).astype(np.int64) for c in BOX_COLUMNS}
    final = np.lexsort((boxes["start"], boxes["row"]))
    return {c: v[final] for c, v in boxes.items()}


def _assemble(con, rank, domain_id, inst, api, gpu, t0, t1, ns_per_px, groups, hidden) -> dict:
    depth = nesting_depth(inst["thread_id"], inst["start"], inst["start"] + inst["duration"])
    threads = _threads(con, rank, np.r_[inst["thread_id"], api["thread_id"]])
    rows, event_rows = _row_layout(inst, depth, api, gpu, threads)
    ev = _events(inst, api, gpu, event_rows)
    gaps, idle = _gpu_gaps(ev, t0, t1, ns_per_px)
    shown = np.array(
        [(groups is None or r["group"] in groups) and r["group"] not in hidden for r in rows] + [False], dtype=bool
    )
    keep = shown[ev["row"]]
    boxes = merged_boxes({c: v[keep] for c, v in ev.items()}, t0, ns_per_px)
    # who launched each GPU activity sent as itself: its call (an arrow on hover) and its op (the tooltip)
    api_row = {r["thread_id"]: i for i, r in enumerate(rows) if r["kind"] == "api"}
    alone = (boxes["n"] == 1) & (boxes["kind"] < KIND_OP) & (boxes["key"] >= 0)
    found = _launches(con, domain_id, boxes["key"][alone])
    launches = {"key": [], "api_key": [], "api_row": [], "api_start": [], "api_end": [], "op": [], "op_name": []}
    launch_ops = []
    for k in boxes["key"][alone].tolist():
        if k in found:
            api_key, thread, s, e, op = found[k]
            for field, value in zip(launches, (k, api_key, api_row.get(thread, -1), s, e, op)):
                launches[field].append(None if value == -1 and field != "api_row" else value)
            launch_ops.append(op)
    # one list of names (ops as -1 - op_index); boxes and launches point into it
    name = boxes["name"]
    launch_names = -1 - np.asarray([op for op in launch_ops if op >= 0], dtype=np.int64)
    text = _texts(con, name[name >= 0])
    api_names = {int(v) for v in np.unique(name[(name >= 0) & (boxes["kind"] == KIND_API)])}
    op_text = _op_names(con, (-1 - np.r_[name[name < 0], launch_names]).tolist())
    uniq, name_pos = np.unique(np.r_[name, launch_names], return_inverse=True)
    name_pos = name_pos.reshape(-1)
    names = [
        op_text.get(int(-1 - v), f"op {int(-1 - v)}")
        if v < 0
        else K.api_display_name(text.get(int(v), ""))
        if int(v) in api_names
        else text.get(int(v), "")
        for v in uniq
    ]
    of_op = iter(name_pos[name.size :].tolist())
    launches["op_name"] = [None if op is None else next(of_op) for op in launches["op"]]
    events = {c: boxes[c].tolist() for c in ("row", "start", "end", "kind", "n", "busy")}
    events["key"] = [None if k < 0 else k for k in boxes["key"].tolist()]
    events["op"] = [None if k < 0 else k for k in boxes["op"].tolist()]
    events["name"] = name_pos[: name.size].astype(np.int64).tolist()
    return {
        "rows": rows,
        "names": names,
        "events": events,
        "launches": launches,
        "gaps": gaps,
        "idle": idle,
        "counts": {"events": int(keep.sum()), "sent": int(boxes["row"].size), "merged": int((boxes["n"] > 1).sum())},
    }


def gap_activity(db, aggr_id: int, domain_id: int, t0: int, t1: int, top: int = 8) -> dict:
    """What the CPU threads did during [t0, t1) (a GPU's idle gap): per thread, the time covered by op
    instances and by API calls, and the ops and API calls by the time they overlap the interval, longest
    first (at most `top` of each)."""
    if t1 <= t0:
        raise TimelineError("the interval must end after it starts (t1 > t0)")
    rank = rank_of_domain(db, domain_id)
    lo = look_back(db, aggr_id, rank, domain_id, t0)
    with db.snapshot() as con:
        n = count_at_most(con, rank, domain_id, t0, t1, MAX_EVENTS)
        if n > MAX_EVENTS:
            raise TooManyEvents(n)
        keys = _keyed_range(con, K.RAW_API_CALLS, "api_id", rank, lo["api"], t1)
        inst = read_instances(con, domain_id, lo["ops"], t0, t1)
        api = read_api_calls(con, keys, t0)
        threads = _threads(con, rank, np.r_[inst["thread_id"], api["thread_id"]])
        op_text = _op_names(con, np.unique(inst["op_index"]).tolist())
        api_text = {k: K.api_display_name(v) for k, v in _texts(con, np.unique(api["name_id"]).tolist()).items()}
    out = []
    for t in np.unique(np.r_[inst["thread_id"], api["thread_id"]]).tolist():
        entry = {"thread_id": t}
        pid, tid, name = threads.get(t, (None, None, None))
        entry.update(pid=pid, tid=tid, label=f"{name or 'thread'} (pid {pid}, tid {tid})")
        for what, frame, key, texts in (("ops", inst, "op_index", op_text), ("api_calls", api, "name_id", api_text)):
            on = frame["thread_id"] == t
            s = np.clip(frame["start"][on], t0, t1)
            e = np.clip(frame["start"][on] + frame["duration"][on], t0, t1)
            entry[f"{what}_time"] = covered_time(s, e, t0, t1)
            overlap = e - s
            names, which = np.unique(frame[key][on], return_inverse=True)
            calls = np.bincount(which.reshape(-1), minlength=names.size)
            total = np.bincount(which.reshape(-1), weights=overlap, minlength=names.size).astype(np.int64)
            ranked = sorted(range(names.size), key=lambda i: (-total[i], -calls[i], str(texts.get(int(names[i]), ""))))
            entry[what] = [
                {"name": texts.get(int(names[i]), str(names[i])), "calls": int(calls[i]), "overlap": int(total[i])}
                for i in ranked[:top]
            ]
            entry[f"{what}_distinct"] = int(names.size)
        out.append(entry)
    out.sort(key=lambda x: (-(x["ops_time"] + x["api_calls_time"]), x["thread_id"]))
    return {"interval": [t0, t1], "threads": out}
