"""The routes of multi-rank runs (http_api.md "Ranks"): the ranks of a database, and one aggregation's cross-rank
table (the engine's dlprof_ranks.csv), every rank's iteration times and the findings across ranks. Read-only, as
every route."""

from __future__ import annotations

from dlprof_plugin.replies import json_field, json_reply
from dlprof_profiler import contract as K


def routes(service) -> dict:
    """{route: handler} for the Service."""
    return {
        "ranks": lambda request, ctx, eid: ranks_route(service, request, ctx, eid),
        "rank_summary": lambda request, ctx, eid: rank_summary_route(service, request, ctx, eid),
    }


def ranks_route(service, request, ctx, eid):
    info = service.run_info(request, ctx, eid)
    db = service.registry.get(info.database)
    return json_reply({"ranks": db.ranks(), "default": db.default_rank()})


def _tables(db) -> set:
    return db.cached(
        "table_names",
        lambda: {r[0] for r in db.query("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")},
    )


def rank_summary_route(service, request, ctx, eid):
    """`rank_summary?run=&aggr=`: {"ranks": [rank_summary rows], "iterations": {rank: [{iteration, duration,
    aggregated}]}, "findings": [...], "stragglers": [ranks]}; "ranks" is empty for a single-rank database."""
    s = service.scope(request, ctx, eid)
    db = s.db

    def compute():
        if K.RANK_SUMMARY not in _tables(db):
            return {"ranks": [], "iterations": {}, "findings": [], "stragglers": []}
        rows = db.query_dicts(
            f"SELECT rank, source_file, gpus, iterations, total_iterations, avg_iteration_time, "
            "max_iteration_time, gpu_utilization, communication_time, overlapped_communication_pct, "
            f"times_slowest, straggler FROM {K.RANK_SUMMARY} WHERE aggr_id = ? ORDER BY rank",
            (s.aggr_id,),
        )
        for r in rows:
            r["straggler"] = bool(r["straggler"])
        iterations: dict = {}
        for rank, iteration, duration, aggregated in db.query(
            "SELECT d.rank, s.iter_value, s.duration, s.aggregated FROM iteration_summary s "
            f"JOIN {K.READ_ONLY_DOMAINS} d ON d.domain_id = s.domain_id "
            "WHERE s.aggr_id = ? AND d.is_primary ORDER BY d.rank, s.iter_value",
            (s.aggr_id,),
        ):
            iterations.setdefault(str(rank), []).append(
                {"iteration": iteration, "duration": duration, "aggregated": bool(aggregated)}
            )
        findings = db.query_dicts(
            "SELECT id, exp_sys_id, severity, problem, recommendation, link, action, data "
            "FROM expert_systems_feedback WHERE aggr_id = ? AND rank = ? ORDER BY id",
            (s.aggr_id, K.ALL_RANKS),
        )
        for f in findings:
            f["action"], f["data"] = json_field(f["action"]), json_field(f["data"])
        return {
            "ranks": rows,
            "iterations": iterations,
            "findings": findings,
            "stragglers": [r["rank"] for r in rows if r["straggler"]],
        }

    return json_reply(db.cached(("rank_summary", s.aggr_id), compute))
