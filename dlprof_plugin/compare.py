"""The Compare view's data: two aggregations (of two runs, or of one run) compared by the engine's own
`dlprof_profiler.engine.compare` over the figures their databases' derived tables hold, so the view and the diff
report (`dlprof --baseline`) show the same rows.

The comparison is computed once per (both files' states, aggregations, domains) and kept in an in-memory
SQLite database, so its rows are paged, sorted, filtered and exported by the same query builder as every
other table (tables.run_query).
"""

from __future__ import annotations

import math
import sqlite3
import threading
from contextlib import contextmanager

import numpy as np
import pandas as pd

from dlprof_plugin.tables import Col, TableQuery
from dlprof_profiler.engine import compare
from dlprof_profiler import contract as K


def _rank_filter(db, alias: str) -> str:
    """Schema 3.0 rows carry their rank; 2.0 files have one."""
    return f" AND {alias}.rank = :rank" if db.v3 else ""


def side_from_database(db, aggr_id: int, domain_id: int, label: str, rank: int = K.DEFAULT_RANK) -> compare.Side:
    """One side of a comparison from a DLProf database: the op and kernel rows of an aggregation of a domain
    (op_nodes, kernel_summaries) and its model_summary figures."""
    params = {"aggr": aggr_id, "domain": domain_id, "rank": rank}
    with db.snapshot() as con:
        ops = pd.DataFrame(
            con.execute(
                "SELECT o.op_name, o.direction, o.op_type, n.num_calls, n.gpu_total FROM op_nodes n "
                "JOIN read_only_ops o ON o.op_index = n.op_index WHERE n.aggr_id = :aggr AND n.domain_id = :domain"
                + _rank_filter(db, "n"),
                params,
            ).fetchall(),
            columns=compare.OP_INPUT,
        )
        name, _ = K.kernel_summary_names(db.columns(K.KERNEL_SUMMARIES), "k")
        kernels = pd.DataFrame(
            con.execute(
                f"SELECT {name}, k.uses_tc, k.num_calls, k.gpu_total FROM {K.KERNEL_SUMMARIES} k "
                "WHERE k.aggr_id = :aggr AND k.domain_id = :domain" + _rank_filter(db, "k"),
                params,
            ).fetchall(),
            columns=compare.KERNEL_INPUT,
        )
        cur = con.execute(
            "SELECT * FROM model_summary m WHERE m.aggr_id = :aggr AND m.domain_id = :domain" + _rank_filter(db, "m"),
            params,
        )
        names = [d[0] for d in cur.description]
        row = cur.fetchone()
        aggr = con.execute(
            "SELECT key_node, key_found, iter_start, iter_stop, total_iterations FROM aggregations WHERE aggr_id = ?",
            (aggr_id,),
        ).fetchone()
    s = dict(zip(names, row)) if row else {}
    figures = compare.side_figures(dict(s, aggregated_iterations=s.get("iter_aggregated")))
    key_node = (aggr[0] or "") if aggr and aggr[1] else ""
    iterations = (int(aggr[2]), int(aggr[3]), int(aggr[4])) if aggr and None not in aggr[2:5] else ()
    return compare.Side(ops, kernels, figures, label, key_node, iterations)


def stored_baselines(db) -> list[dict]:
    """The baselines kept with a run (`dlprof --baseline`, database.write_baselines): one row per (compared
    aggregation, domain, rank) with the baseline's file, key node, iterations and figures; [] without any."""

    def compute():
        tables = {r[0] for r in db.query("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if K.BASELINE_PROFILES not in tables:
            return []
        return db.query_dicts(f"SELECT * FROM {K.BASELINE_PROFILES} ORDER BY aggr_id, domain_id, rank")

    return db.cached("stored_baselines", compute)


def stored_baseline(db, aggr_id: int, domain_id: int, rank: int) -> dict | None:
    """The baseline kept for an aggregation of a domain and rank: the one it was compared with, else the one of
    the newest aggregation that was (a re-aggregation keeps the run's baseline); None when the run has none."""
    rows = [r for r in stored_baselines(db) if r["domain_id"] == domain_id and r["rank"] == rank]
    exact = [r for r in rows if r["aggr_id"] == aggr_id]
    return (exact or rows)[-1] if rows else None


def side_from_stored(db, row: dict) -> compare.Side:
    """The baseline's side of the diff report, as `dlprof --baseline` kept it with the run."""
    key = (row["aggr_id"], row["domain_id"], row["rank"])
    where = "WHERE aggr_id = ? AND domain_id = ? AND rank = ?"
    ops = pd.DataFrame(
        db.query(f"SELECT op_name, direction, op_type, num_calls, gpu_total FROM {K.BASELINE_OPS} {where}", key),
        columns=compare.OP_INPUT,
    )
    kernels = pd.DataFrame(
        db.query(f"SELECT kernel_name, uses_tc, num_calls, gpu_total FROM {K.BASELINE_KERNELS} {where}", key),
        columns=compare.KERNEL_INPUT,
    )
    its = (row["iter_start"], row["iter_stop"], row["total_iterations"])
    iterations = tuple(int(v) for v in its) if None not in its else ()
    return compare.Side(ops, kernels, compare.side_figures(row), row["source"] or "", row["key_node"] or "", iterations)


class FrameDatabase:
    """A comparison's rows in an in-memory SQLite database, read like a DLProf database by run_query."""

    def __init__(self, tables: dict[str, pd.DataFrame]):
        self._con = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
        self._lock = threading.Lock()
        for name, frame in tables.items():
            cols = list(frame.columns)
            self._con.execute(f"CREATE TABLE {name} (row INTEGER PRIMARY KEY, {', '.join(cols)})")
            rows = zip(range(len(frame)), *(_plain(frame[c]) for c in cols))
            self._con.executemany(f"INSERT INTO {name} VALUES ({', '.join('?' * (len(cols) + 1))})", rows)

    @contextmanager
    def snapshot(self):
        with self._lock:
            yield self._con

    def cached(self, key, compute):
        return compute()


def _plain(series: pd.Series) -> list:
    """Python values SQLite stores (NaN -> NULL, NumPy scalars -> int/float/bool)."""
    out = []
    for v in series.tolist():
        if isinstance(v, float) and math.isnan(v):
            v = None
        elif isinstance(v, (np.bool_, bool)):
            v = int(v)
        out.append(v)
    return out


class Compared:
    """A comparison and its rows, ready to serve."""

    def __init__(self, comparison: compare.Comparison):
        self.comparison = comparison
        ops = comparison.ops.assign(abs_delta=comparison.ops["delta"].abs())
        kernels = comparison.kernels.assign(abs_delta=comparison.kernels["delta"].abs())
        self.db = FrameDatabase({"ops": ops, "kernels": kernels})

    @classmethod
    def of(cls, after: compare.Side, baseline: compare.Side) -> "Compared":
        return cls(compare.compare(after, baseline))

    def counts(self, what: str) -> dict:
        frame = self.comparison.ops if what == "ops" else self.comparison.kernels
        counts = frame["presence"].value_counts()
        return {p: int(counts.get(p, 0)) for p in (compare.BOTH, compare.AFTER_ONLY, compare.BASELINE_ONLY)}


def _compared_columns(alias: str, kernels: bool) -> list[Col]:
    """The compared figures; a kernel row counts launches and kernel durations."""
    return [
        Col(
            "presence",
            "Present In",
            "text",
            f"{alias}.presence",
        ),
        Col("calls", "No. Calls", "int", f"{alias}.calls", term="compare_launches" if kernels else "compare_calls"),
        Col(
            "baseline_calls",
            "Baseline No. Calls",
            "int",
            f"{alias}.baseline_calls",
            term="compare_baseline_launches" if kernels else "compare_baseline_calls",
        ),
        Col(
            "gpu_time",
            "GPU Time (ns)",
            "ns",
            f"{alias}.gpu_time",
            term="compare_kernel_time" if kernels else "compare_gpu_time",
        ),
        Col(
            "baseline_gpu_time",
            "Baseline GPU Time (ns)",
            "ns",
            f"{alias}.baseline_gpu_time",
            term="compare_baseline_kernel_time" if kernels else "compare_baseline_gpu_time",
        ),
        Col(
            "delta",
            "Delta GPU Time (ns)",
            "ns",
            f"{alias}.delta",
            term="compare_kernel_delta" if kernels else "compare_delta",
        ),
        Col(
            "delta_pct",
            "Delta GPU Time %",
            "pct",
            f"{alias}.delta_pct",
            term="compare_kernel_delta_pct" if kernels else "compare_delta_pct",
        ),
        Col(
            "abs_delta",
            "Absolute Delta (ns)",
            "ns",
            f"{alias}.abs_delta",
            hidden=True,
        ),
    ]


def ops_table(compared: Compared, pytorch: bool) -> TableQuery:
    """Per op (name, direction): the diff report's Op Diff rows."""
    cols = [
        Col("row", "Row", "int", "c.row", hidden=True),
        Col("op_name", "Op Name", "text", "c.name"),
    ]
    if pytorch:
        cols.append(Col("direction", "Direction", "text", "c.direction"))
    cols.append(Col("op_type", "Op Type", "text", "c.op_type"))
    cols += _compared_columns("c", kernels=False)
    tq = TableQuery("compare_ops", cols, "ops c", [], {}, ("abs_delta", "desc"), "c.row", key="c.row")
    tq.db = compared.db
    return tq


def kernels_table(compared: Compared) -> TableQuery:
    """Per kernel name: the diff report's Kernel Diff rows."""
    cols = [
        Col("row", "Row", "int", "c.row", hidden=True),
        Col("kernel_name", "Kernel Name", "text", "c.name"),
        Col("uses_tc", "Uses TC", "bool", "c.uses_tc"),
    ]
    cols += _compared_columns("c", kernels=True)
    tq = TableQuery("compare_kernels", cols, "kernels c", [], {}, ("abs_delta", "desc"), "c.row", key="c.row")
    tq.db = compared.db
    return tq


def summary_doc(compared: Compared, after: dict, baseline: dict) -> dict:
    """The `compare` route's answer: both sides, the headline figures and the row counts."""
    c = compared.comparison
    rows = []
    for r in c.summary.to_dict("records"):
        rows.append({k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in r.items()})
    for side, info in ((c.after, after), (c.baseline, baseline)):
        info.update(
            label=side.label, key_node=side.key_node, iterations=list(side.iterations) if side.iterations else None
        )
    return {
        "after": after,
        "baseline": baseline,
        "summary": rows,
        "ops": compared.counts("ops"),
        "kernels": compared.counts("kernels"),
    }
