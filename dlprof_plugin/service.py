"""The HTTP API of http_api.md, independent of TensorBoard: `Service.handle(route, request, ctx, eid)`
returns a `Reply`; the TensorBoard plugin and the standalone viewer wrap it in their WSGI apps."""

from __future__ import annotations

import json
import logging
import os
import re
import sqlite3
import threading
from dataclasses import dataclass

from dlprof_plugin import compare, export, tables, terms
from dlprof_plugin.routes import jobs as jobs_routes
from dlprof_plugin.routes import memory, ranks
from dlprof_plugin.routes import timeline as timeline_routes
from dlprof_plugin.db import NotADatabase, Registry, is_decode_error, is_hot_journal_error
from dlprof_plugin.guidance import dashboard_guidance
from dlprof_plugin.jobs import JobManager
from dlprof_plugin.runs import RunInfo
from dlprof_plugin.replies import (
    JSON,
    BadRequest,
    MethodNotAllowed,
    NotFound,
    PublicError,
    Reply,
    TooLarge,
    arg,
    check_method,
    check_name,
    clip,
    error_reply,
    finite,
    int_arg,
    json_field,
    json_reply,
)
from dlprof_plugin.tables import MAX_EXPORT_ROWS, MAX_PAGE, Page
from dlprof_profiler import __version__
from dlprof_profiler import contract as K

log = logging.getLogger("dlprof_plugin")

EXPORT_FORMATS = ("csv", "xlsx", "json_all")
STATIC_TYPES = {
    ".js": "text/javascript",
    ".mjs": "text/javascript",
    ".css": "text/css",
    ".svg": "image/svg+xml",
    ".html": "text/html",
    ".json": "application/json",
    ".map": "application/json",
    ".png": "image/png",
    ".woff2": "font/woff2",
    ".woff": "font/woff",
    ".ico": "image/x-icon",
    ".txt": "text/plain",
}
_STATIC_PART = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
INLINE_RANGES = 200_000  # NVTX range labels are counted once per file; larger tables in the background
# A range's label as the engine's key-node matching sees it: the text without PyTorch emit_nvtx per-call
# fields (", seq = ...", ", op_id = ...", ", sizes = ...", ", input_op_ids = ..."; nvtx_markers._PT_FIELDS).
_NO_CUT = 1 << 40
_CUT = (
    "min("
    + ", ".join(
        f"coalesce(nullif(instr(text, ', {f} = '), 0), {_NO_CUT})" for f in ("seq", "op_id", "sizes", "input_op_ids")
    )
    + ")"
)
RANGE_LABEL = f"(CASE WHEN text LIKE '{{%' OR {_CUT} = {_NO_CUT} THEN text ELSE substr(text, 1, {_CUT} - 1) END)"
RANGE_LABELS_SQL = (
    f"SELECT domain_id, {RANGE_LABEL} AS text, count(*) AS num FROM {K.READ_ONLY_RANGES} GROUP BY 1, 2 "
    "HAVING count(*) >= 2"
)


def viewer_versions() -> dict:
    """Versions of the software serving the viewer (the profile's own come from the database)."""
    try:
        from tensorboard.version import VERSION as tensorboard_version
    except ImportError:
        tensorboard_version = None
    return {"plugin_version": __version__, "tensorboard_version": tensorboard_version}


_HOT_JOURNAL = object()  # marker: a read failed on a hot journal (see Database.recover)
_NOT_UTF8 = object()  # marker: a text value was not UTF-8 (see Database.lenient)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_.") or "dlprof"


def _has_table(db, name: str) -> bool:
    """Whether the database has a table (tables a later schema added)."""
    return db.cached(
        ("has_table", name),
        lambda: bool(db.query("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,))),
    )


def _bool(v):
    return None if v is None else bool(v)


@dataclass
class Scope:
    """What a request is about: run, database, aggregation, domain."""

    info: RunInfo
    db: object
    aggr_id: int | None
    domain_id: int
    domain: str
    mode: str
    rank: int = K.DEFAULT_RANK  # the rank (profile) of a multi-rank database the request is about
    request_context: tuple = ()  # (ctx, eid) of the request, for routes that look up a second run

    @property
    def pytorch(self) -> bool:
        return self.mode == "pytorch"

    def params(self) -> dict:
        return {"aggr": self.aggr_id, "domain": self.domain_id}


class Service:
    """Routes of http_api.md over a run source (`runs(ctx, eid)`, `lookup(ctx, eid, run)`)."""

    def __init__(self, run_source, static_dir=None, jobs: JobManager | None = None):
        self.run_source = run_source
        self.registry = Registry()
        self.jobs = jobs or JobManager(aggregations=lambda database: self.registry.get(database).aggregations())
        self.static_dir = static_dir
        self._range_lock = threading.Lock()
        self._range_jobs: dict = {}
        self.routes = {
            "runs": self.runs,
            "terms": lambda request, ctx, eid: json_reply(terms.as_json()),
            "aggregations": self.aggregations,
            "domains": self.domains,
            "dashboard": self.dashboard,
            "system": self.system,
            "gpus": self.gpus,
            "iterations": self.iterations,
            "op": self.op,
            "expert_systems": self.expert_systems,
            "compare": self.compare,
            **jobs_routes.routes(self),
            **timeline_routes.routes(self),
            **ranks.routes(self),
            **memory.routes(self),
        }
        self.tables = {
            "ops": lambda s, a: tables.ops_table(s),
            "kernels": self._kernels_table,
            "op_types": lambda s, a: tables.op_types_table(s),
            "tensor_core": lambda s, a: tables.tensor_core_table(s),
            "group_ops": self._group_ops_table,
            "iterations": lambda s, a: tables.iterations_table(s),
            "iteration_kernels": self._iteration_kernels_table,
            "iteration_ops": self._iteration_ops_table,
            "iteration_op_kernels": self._iteration_op_kernels_table,
            "key_nodes": self._key_nodes_table,
            "expert_systems": lambda s, a: tables.expert_systems_table(s),
            "compare_ops": lambda s, a: compare.ops_table(self._compared(s, a)[0], s.pytorch),
            "compare_kernels": lambda s, a: compare.kernels_table(self._compared(s, a)[0]),
            **memory.tables(self),
        }

    # ------------------------------------------------------------------ dispatch
    def handle(self, route: str, request, ctx=None, eid: str = "") -> Reply:
        """route: the path below the plugin's prefix ('runs', 'table/ops', 'index.js', ...)."""
        route = route.strip("/")
        lenient = recovered = False
        while True:  # each kind of retry at most once
            reply = self._handle(route, request, ctx, eid)
            if reply is _NOT_UTF8 and not lenient:
                lenient = True
                for db in self.registry.all():
                    db.lenient = True
                continue
            if reply is _HOT_JOURNAL and not recovered:
                recovered = True
                if [db.path for db in self.registry.all() if db.recover()]:
                    continue
            break
        if reply is _HOT_JOURNAL:
            return error_reply(
                503,
                "the database has an interrupted write that this server cannot roll "
                "back (no write permission?); open it once with sqlite3 or dlprof",
            )
        if reply is _NOT_UTF8:
            return error_reply(500, "the database holds text that cannot be decoded")
        return reply

    def _handle(self, route: str, request, ctx, eid) -> Reply:
        try:
            if route.startswith("table/"):
                check_method(request, ("GET", "HEAD"))
                return self.table(route[len("table/") :], request, ctx, eid)
            handler = self.routes.get(route)
            if handler is None:
                if route == "table":
                    raise NotFound("table name missing: use table/<name>")
                return self.static(route, request)
            check_method(request, ("POST",) if route == "reaggregate" else ("GET", "HEAD"))
            return handler(request, ctx, eid)
        except PublicError as exc:  # BadRequest, NotFound, TooLarge, JobConflict, NotADatabase ...
            return exc.reply()
        except sqlite3.OperationalError as exc:
            if is_hot_journal_error(exc):
                return _HOT_JOURNAL
            if is_decode_error(exc):
                return _NOT_UTF8
            if "locked" in str(exc) or "busy" in str(exc):
                return Reply(
                    503,
                    json.dumps({"error": "the database is busy (a re-aggregation is being committed); retry"}),
                    JSON,
                    [("Retry-After", "1")],
                )
            log.exception("dlprof: query failed")
            return error_reply(500, f"database query failed: {exc}")
        except Exception as exc:  # noqa: BLE001 - reported as JSON, logged with its traceback
            log.exception("dlprof: %s failed", route)
            return error_reply(500, f"internal error: {type(exc).__name__}: {clip(exc, 200)}")

    def run_info(self, request, ctx, eid, run: str | None = None) -> RunInfo:
        run = run if run is not None else arg(request, "run")
        if run is None or run == "":
            raise BadRequest("parameter 'run' is required")
        if not isinstance(run, str):
            raise BadRequest("'run' must be a string")
        check_name(run, "run")
        info = self.run_source.lookup(ctx, eid, run)
        if info is None:
            raise NotFound(f"unknown run '{clip(run)}'")
        return info

    def rank(self, request, db) -> int:
        """The `rank` parameter: a rank of the database (404 otherwise); default: contract.DEFAULT_RANK, or the
        lowest rank of a file without it."""
        value = int_arg(request, "rank", minimum=None)
        if value is None:
            return db.default_rank()
        if value not in [r["rank"] for r in db.ranks()]:
            raise NotFound(f"unknown rank {value}")
        return value

    def scope(self, request, ctx, eid, need_aggr: bool = True) -> Scope:
        info = self.run_info(request, ctx, eid)
        db = self.registry.get(info.database)
        profile = db.profile_info()
        rank = self.rank(request, db)
        domains = db.domains(rank)
        name = arg(request, "domain")
        if name is None or name == "":
            primary = profile.get("primary_domain") or info.meta.get("primary_domain")
            dom = (
                next((d for d in domains if d["is_primary"]), None)
                or next((d for d in domains if d["name"] == primary), None)
                or (domains[0] if domains else None)
            )
            if dom is None:
                raise NotFound("the database has no NVTX domain")
        else:
            check_name(name, "domain")
            dom = next((d for d in domains if d["name"] == name), None)
            if dom is None:
                raise NotFound(f"unknown domain '{clip(name)}'")
        aggr_id = None
        if need_aggr:
            aggrs = db.aggregations()
            if not aggrs:
                raise NotFound("the database has no aggregation")
            aggr_id = int_arg(request, "aggr", default=aggrs[-1]["aggr_id"], minimum=1)
            if not any(a["aggr_id"] == aggr_id for a in aggrs):
                raise NotFound(f"unknown aggregation {aggr_id}")
            ok = db.cached(
                ("has_summary", aggr_id, dom["domain_id"]),
                lambda: bool(
                    db.query(
                        "SELECT 1 FROM model_summary WHERE aggr_id = ? AND domain_id = ?", (aggr_id, dom["domain_id"])
                    )
                ),
            )
            if not ok:
                raise NotFound(f"aggregation {aggr_id} has no data for domain '{dom['name']}'")
        return Scope(
            info,
            db,
            aggr_id,
            dom["domain_id"],
            dom["name"],
            profile.get("mode") or info.meta.get("mode") or "",
            rank=rank,
        )

    # ------------------------------------------------------------------ routes
    def runs(self, request, ctx, eid) -> Reply:
        out = []
        for name, info in sorted(self.run_source.runs(ctx, eid).items()):
            try:
                try:
                    profile = self.registry.get(info.database).profile_info()
                except sqlite3.OperationalError as exc:
                    if not (is_hot_journal_error(exc) and self.registry.get(info.database).recover()):
                        raise
                    profile = self.registry.get(info.database).profile_info()
            except (NotADatabase, sqlite3.Error) as exc:
                log.warning("dlprof: run %s: %s", name, exc)
                continue
            meta = info.meta
            out.append(
                {
                    "run": name,
                    "profile_name": profile.get("profile_name") or meta.get("profile_name"),
                    "database": info.shown_database,
                    "mode": profile.get("mode") or meta.get("mode"),
                    "primary_domain": profile.get("primary_domain") or meta.get("primary_domain"),
                    "nsys_version": profile.get("nsys_version") or meta.get("nsys_version"),
                    "dlprof_version": profile.get("dlprof_version") or meta.get("dlprof_version"),
                    "created_utc": profile.get("created_utc"),
                }
            )
        return json_reply({"runs": out})

    def _aggr_row(self, a: dict) -> dict:
        keys = (
            "aggr_id",
            "created_utc",
            "key_node",
            "key_source",
            "key_found",
            "iter_start",
            "iter_stop",
            "total_iterations",
            "elapsed_seconds",
        )
        row = {k: a.get(k) for k in keys}
        row["key_found"] = _bool(row["key_found"])
        return row

    def aggregations(self, request, ctx, eid) -> Reply:
        info = self.run_info(request, ctx, eid)
        db = self.registry.get(info.database)
        rows = [self._aggr_row(a) for a in db.aggregations()]
        kept = {}
        for b in compare.stored_baselines(db):
            kept.setdefault(b["aggr_id"], b["source"])
        for r in rows:
            r["baseline"] = kept.get(r["aggr_id"])
        return json_reply(
            {
                "aggregations": rows,
                "newest": rows[-1]["aggr_id"] if rows else None,
                "job": self.jobs.status(info.database),
            }
        )

    def domains(self, request, ctx, eid) -> Reply:
        info = self.run_info(request, ctx, eid)
        db = self.registry.get(info.database)
        rows = [
            dict(d, has_markers=_bool(d["has_markers"]), is_primary=_bool(d["is_primary"]))
            for d in db.domains(self.rank(request, db))
        ]
        return json_reply({"domains": rows})

    def iteration_rows(self, s: Scope) -> list[dict]:
        def compute():
            known = {r[1] for r in s.db.query("PRAGMA table_info(iteration_summary)")}
            complete = "i.complete" if "complete" in known else "NULL AS complete"  # earlier files: unknown
            # the GPU time breakdowns (schema 3.2): NULL in a file written before them
            split = (
                "b.computation_busy, b.communication_busy, b.memory_busy, b.gpu_idle, b.overlapped_communication"
                if _has_table(s.db, K.ITERATION_BREAKDOWN)
                else "NULL AS computation_busy, NULL AS communication_busy, NULL AS memory_busy, NULL AS gpu_idle, "
                "NULL AS overlapped_communication"
            )
            join = (
                f"LEFT JOIN {K.ITERATION_BREAKDOWN} b ON b.aggr_id = i.aggr_id AND b.domain_id = i.domain_id "
                "AND b.iter_value = i.iter_value AND b.rank = i.rank "
                if _has_table(s.db, K.ITERATION_BREAKDOWN)
                else ""
            )
            rows = s.db.query_dicts(
                'SELECT i.iter_value AS iteration, i.start_time AS start, i.stop_time AS "end", i.duration, '
                "i.aggregated, i.kernels, i.tc_kernels, i.kernel_time_per_gpu, i.tc_kernel_time_per_gpu, i.tc_time, "
                "i.non_tc_time, i.memory_time, i.dataloader_time, i.io_time, i.cpu_time, i.other_time, "
                f"i.gpu_utilization, {complete}, {split} FROM iteration_summary i {join}"
                "WHERE i.aggr_id = ? AND i.domain_id = ? ORDER BY i.iter_value",
                (s.aggr_id, s.domain_id),
            )
            for r in rows:
                r["aggregated"] = _bool(r["aggregated"])
                r["complete"] = None if r["complete"] is None else _bool(r["complete"])
            return rows

        return s.db.cached(("iterations", s.aggr_id, s.domain_id), compute)

    def iterations(self, request, ctx, eid) -> Reply:
        s = self.scope(request, ctx, eid)
        a = dict(next(x for x in s.db.aggregations() if x["aggr_id"] == s.aggr_id))
        # a multi-rank aggregation's range is each rank's own (a rank may have fewer iterations)
        own = s.db.one(
            "SELECT iter_start, iter_stop FROM model_summary WHERE aggr_id = ? AND domain_id = ?",
            (s.aggr_id, s.domain_id),
        )
        if own and own.get("iter_start") is not None:
            a.update(own)
        return json_reply(
            {
                "iterations": self.iteration_rows(s),
                "iter_start": a["iter_start"],
                "iter_stop": a["iter_stop"],
                "key_node": a["key_node"],
            }
        )

    @staticmethod
    def _of_rank(db, rank: int | None) -> str:
        """The WHERE clause restricting a per-rank view of a 3.0 file to one rank ('' for 2.0)."""
        return f" WHERE rank = {int(db.default_rank() if rank is None else rank)}" if db.v3 else ""

    def _system(self, db, rank: int | None = None) -> dict:
        where = self._of_rank(db, rank)

        def compute():
            system = {k: v for k, v in db.query(f"SELECT name, value FROM read_only_system_config{where}")}
            config = db.model_config(rank)
            profile = db.profile_info()
            names = [r[0] or "" for r in db.query(f"SELECT name FROM read_only_gpu_infos{where} ORDER BY device_id")]
            if config.get("torch_version"):
                framework = f"PyTorch {config['torch_version']}"
            else:
                framework = {"pytorch": "PyTorch", "tensorflow": "TensorFlow", "tensorrt": "TensorRT"}.get(
                    profile.get("family") or "", "Unknown"
                )
            raw = str(system.get("CudaDriverVersion", "") or "")
            if config.get("cuda_version"):
                cuda = str(config["cuda_version"])
            elif raw.isdigit():
                cuda = f"{int(raw) // 1000}.{(int(raw) % 1000) // 10}"
            else:
                cuda = raw or "Unknown"
            return {
                "gpu_count": len(names),
                "gpu_names": "; ".join(sorted(set(names))),
                "cpu_model": system.get("CpuDescription") or "Unknown",
                "driver_version": system.get("NvDriverVersion") or "Unknown",
                "framework": framework,
                "cuda_version": cuda,
                "nsys_version": profile.get("nsys_version") or "unknown",
                "dlprof_version": profile.get("dlprof_version"),
                **viewer_versions(),
            }

        return db.cached(("system_summary", where), compute)

    def _findings(self, s: Scope) -> list[dict]:
        rows = s.db.query_dicts(
            "SELECT id, exp_sys_id, severity, problem, recommendation, link, action, data "
            "FROM expert_systems_feedback e WHERE aggr_id = ? AND domain_id = ? "
            f"ORDER BY {tables.SEVERITY_ORDER_SQL}, id",
            (s.aggr_id, s.domain_id),
        )
        for r in rows:
            r["action"], r["data"] = json_field(r["action"]), json_field(r["data"])
        return rows

    def dashboard(self, request, ctx, eid) -> Reply:
        s = self.scope(request, ctx, eid)
        return json_reply(
            s.db.cached(("dashboard", s.aggr_id, s.domain_id), lambda: self._dashboard(s)), sanitize=False
        )

    def _dashboard(self, s: Scope) -> dict:
        db = s.db
        ms = db.one("SELECT * FROM model_summary WHERE aggr_id = ? AND domain_id = ?", (s.aggr_id, s.domain_id))
        aggr = next(self._aggr_row(a) for a in db.aggregations() if a["aggr_id"] == s.aggr_id)
        summary_keys = (
            "wall_time",
            "tc_utilization",
            "gpu_utilization",
            "tc_duration_pct",
            "non_tc_duration_pct",
            "memory_duration_pct",
            "dataloader_duration_pct",
            "io_duration_pct",
            "cpu_duration_pct",
            "other_duration_pct",
            "iter_total",
            "iter_aggregated",
            "iter_start",
            "iter_stop",
            "avg_iteration_time",
            "iteration_time_std_dev",
            "median_iteration_time",
            "complete_iterations",
            "complete_start",
            "complete_stop",
            "key_node",
            "key_found",
            "n_visible_gpus",
        )
        summary = {k: ms.get(k) for k in summary_keys}
        summary["key_found"] = _bool(summary["key_found"])
        iterations = self.iteration_rows(s)
        # the aggregated iterations that are partial (key-node intervals: the run up to the first key node and
        # after the last one); None where the database does not say (written by an earlier version)
        summary["partial_iterations"] = (
            [r["iteration"] for r in iterations if r["aggregated"] and r["complete"] is False]
            if summary["median_iteration_time"] is not None
            else None
        )

        def trio(prefix):
            return {
                "gpu_time": ms.get(f"{prefix}_gpu"),
                "cpu_time": ms.get(f"{prefix}_cpu"),
                "count": ms.get(f"{prefix}_count"),
            }

        op_summary = {
            "all": trio("ops_all"),
            "using_tc": trio("ops_tc"),
            "eligible_not_using": trio("ops_eligible"),
            "other": trio("ops_other"),
        }
        kernel_summary = {k: trio(f"kernels_{k}") for k in ("all", "tc", "memory", "other")}
        counts = db.query(
            "SELECT coalesce(sum(tc_eligible != 0), 0), coalesce(sum(using_tc != 0), 0), "
            "coalesce(sum(tc_eligible != 0 AND using_tc = 0), 0) FROM op_nodes "
            "WHERE aggr_id = ? AND domain_id = ?",
            (s.aggr_id, s.domain_id),
        )[0]
        tensor_core = {
            "tc_utilization": ms.get("tc_utilization"),
            "eligible_ops": counts[0],
            "using_tc_ops": counts[1],
            "eligible_not_using_ops": counts[2],
        }
        top = db.query_dicts(
            "SELECT n.op_index, o.op_id, o.op_name, o.direction, o.op_type, n.num_calls, n.gpu_total, n.cpu_total, "
            "n.tc_eligible, n.using_tc FROM op_nodes n JOIN read_only_ops o ON o.op_index = n.op_index "
            "WHERE n.aggr_id = ? AND n.domain_id = ? ORDER BY n.gpu_total DESC, n.op_index LIMIT 10",
            (s.aggr_id, s.domain_id),
        )
        for r in top:
            r["tc_eligible"], r["using_tc"] = _bool(r["tc_eligible"]), _bool(r["using_tc"])
        findings = self._findings(s)
        doc = {
            "aggregation": aggr,
            "domain": s.domain,
            "mode": s.mode,
            "summary": summary,
            "op_summary": op_summary,
            "kernel_summary": kernel_summary,
            "tensor_core": tensor_core,
            "iterations": iterations,
            "top_ops": top,
            "system": self._system(db, s.rank),
            "findings": findings,
            "guidance": dashboard_guidance(summary, tensor_core),
            "gpu_breakdown": self._gpu_breakdown(s),
        }
        return finite(doc)

    @staticmethod
    def _gpu_breakdown(s: Scope) -> dict | None:
        """The GPU time breakdowns of the aggregation (DESIGN.md "GPU time breakdowns"): per GPU used, and the
        summary's communication figures summed over them; None for a file written before them (schema 3.2)."""
        if not _has_table(s.db, K.GPU_BREAKDOWN):
            return None
        gpus = s.db.query_dicts(
            "SELECT device_id, computation_busy, communication_busy, memory_busy, gpu_busy, gpu_idle, "
            f"overlapped_communication, host_wait, kernel_wait, other_wait FROM {K.GPU_BREAKDOWN} "
            "WHERE aggr_id = ? AND domain_id = ? AND rank = ? ORDER BY device_id",
            (s.aggr_id, s.domain_id, s.rank),
        )
        launches = s.db.one(
            "SELECT coalesce(sum(launches), 0) AS launches, coalesce(sum(short_kernels), 0) AS short_kernels "
            f"FROM {K.LAUNCH_DELAYS} WHERE aggr_id = ? AND domain_id = ? AND rank = ?",
            (s.aggr_id, s.domain_id, s.rank),
        )
        comm = sum(int(g["communication_busy"] or 0) for g in gpus)
        overlapped = sum(int(g["overlapped_communication"] or 0) for g in gpus)
        return {
            "gpus": gpus,
            "communication_time": comm,
            "overlapped_communication_pct": 100.0 * overlapped / comm if comm else 0.0,
            "launches": launches["launches"],
            "short_kernels": launches["short_kernels"],
        }

    def system(self, request, ctx, eid) -> Reply:
        info = self.run_info(request, ctx, eid)
        db = self.registry.get(info.database)
        rank = self.rank(request, db)
        where = self._of_rank(db, rank)

        def compute():
            gpus = db.query_dicts(f"SELECT * FROM read_only_gpu_infos{where} ORDER BY device_id")
            for g in gpus:
                g["compute_capability"] = (
                    f"{g['compute_major']}.{g['compute_minor']}" if g.get("compute_major") is not None else None
                )
            system = {
                k: v for k, v in db.query(f"SELECT name, value FROM read_only_system_config{where} ORDER BY name")
            }
            return {
                "gpus": gpus,
                "system": system,
                "model_config": db.model_config(rank),
                "profile": db.profile_info(),
                "summary": self._system(db, rank),
            }

        return json_reply(db.cached(("system_route", rank), compute))

    def gpus(self, request, ctx, eid) -> Reply:
        s = self.scope(request, ctx, eid)
        rows = s.db.query_dicts(
            "SELECT g.device_id, g.name, g.compute_major, g.compute_minor, g.sm_count, g.total_memory, "
            "u.gpu_utilization, u.tc_pct, u.non_tc_pct, u.memory_pct, u.dataloader_pct, u.io_pct, u.cpu_pct, "
            "u.other_pct FROM (SELECT * FROM read_only_gpu_infos" + self._of_rank(s.db, s.rank) + ") g "
            "LEFT JOIN device_utilization u ON u.device_id = g.device_id "
            "AND u.aggr_id = ? AND u.domain_id = ? ORDER BY g.device_id",
            (s.aggr_id, s.domain_id),
        )
        for r in rows:
            major, minor = r.pop("compute_major"), r.pop("compute_minor")
            r["compute_capability"] = f"{major}.{minor}" if major is not None else None
        return json_reply({"gpus": rows})

    def op(self, request, ctx, eid) -> Reply:
        s = self.scope(request, ctx, eid)
        op_index = int_arg(request, "op_index", required=True)
        self._check_op(s, op_index)
        tq = tables.ops_table(Scope(s.info, s.db, s.aggr_id, s.domain_id, s.domain, "pytorch", s.rank))
        cols = tq.columns
        with s.db.connect() as con:
            row = con.execute(
                f"SELECT {', '.join(c.sql for c in cols)} FROM {tq.source} WHERE "
                f"{' AND '.join(tq.where)} AND n.op_index = :op_index",
                dict(tq.params, op_index=op_index),
            ).fetchone()
            base = con.execute(
                "SELECT op_index, op_id, op_name, direction, op_type, tc_eligible, data_type, "
                "stack_trace, label, device_id, num_instances FROM read_only_ops "
                "WHERE op_index = ?",
                (op_index,),
            ).fetchone()
        if row is not None:
            rows = [list(row)]
            tables.clean_rows(rows, cols)
            doc = dict(zip([c.key for c in cols], rows[0]))
        else:  # the op has no call in this aggregation
            doc = {c.key: None for c in cols}
            doc.update(num_calls=0)
        keys = (
            "op_index",
            "op_id",
            "op_name",
            "direction",
            "op_type",
            "tc_eligible",
            "data_type",
            "stack_trace",
            "label",
            "device_id",
            "instances",
        )
        facts = dict(zip(keys, base))
        facts["tc_eligible"] = _bool(facts["tc_eligible"])
        for k, v in facts.items():
            if doc.get(k) is None:
                doc[k] = v
        doc["instances"] = facts["instances"]
        doc["label"] = facts["label"]
        doc["graph_node"] = self._graph_node(s, op_index)
        ktq = tables.kernels_table(s, op_index)
        result = tables.run_query(s.db, ktq, Page("gpu_total", "desc", 0, MAX_PAGE * 10, None, {}))
        doc["kernel_columns"] = [c.meta() for c in ktq.columns]
        doc["kernels"] = [dict(zip([c.key for c in ktq.columns], r)) for r in result["rows"]]
        return json_reply(doc)

    def _graph_node(self, s: Scope, op_index: int) -> str | None:
        """The name of the op's node in the GRAPHS tab: runs whose event file holds the graph
        (graph_events) show the ops of their primary domain; None otherwise."""
        primary = s.db.profile_info().get("primary_domain") or s.info.meta.get("primary_domain")
        if not s.info.meta.get("graph") or s.domain != primary:
            return None

        def compute():
            from dlprof_profiler.outputs.graph_events import node_names

            rows = s.db.query(
                "SELECT op_index, op_name, direction, op_type, kind FROM read_only_ops WHERE domain_id = ? "
                "ORDER BY op_index",
                (s.domain_id,),
            )
            names = node_names(*([r[k] for r in rows] for k in (1, 2, 3, 4)))
            return dict(zip((r[0] for r in rows), names))

        return s.db.cached(("graph_nodes", s.domain_id), compute).get(op_index)

    def expert_systems(self, request, ctx, eid) -> Reply:
        s = self.scope(request, ctx, eid)
        return json_reply({"findings": self._findings(s)})

    # ------------------------------------------------------------------ tables
    def _check_op(self, s: Scope, op_index: int) -> None:
        ok = s.db.query("SELECT 1 FROM read_only_ops WHERE op_index = ? AND domain_id = ?", (op_index, s.domain_id))
        if not ok:
            raise NotFound(f"unknown op_index {op_index} in domain '{s.domain}'")

    def _iteration(self, s: Scope, request) -> tuple[int, tuple[int, int]]:
        iteration = int_arg(request, "iteration", required=True)
        rank = " AND rank = ?" if s.db.v3 else ""
        row = s.db.query(
            f"SELECT start_time, stop_time FROM iteration_list WHERE aggr_id = ? AND iter_value = ?{rank}",
            (s.aggr_id, iteration) + ((s.rank,) if rank else ()),
        )
        if not row:
            raise NotFound(f"unknown iteration {iteration} in aggregation {s.aggr_id}")
        return iteration, (int(row[0][0]), int(row[0][1]))

    def _kernels_table(self, s, request):
        op_index = int_arg(request, "op_index")
        if op_index is not None:
            self._check_op(s, op_index)
        return tables.kernels_table(s, op_index)

    def _group_ops_table(self, s, request):
        parent = arg(request, "parent")
        return tables.group_ops_table(s, parent)

    def _iteration_kernels_table(self, s, request):
        iteration, bounds = self._iteration(s, request)
        return tables.iteration_kernels_table(s, iteration, bounds)

    def _iteration_ops_table(self, s, request):
        iteration, bounds = self._iteration(s, request)
        return tables.iteration_ops_table(s, iteration, bounds)

    def _iteration_op_kernels_table(self, s, request):
        iteration, bounds = self._iteration(s, request)
        op_index = int_arg(request, "op_index", required=True)
        self._check_op(s, op_index)
        return tables.iteration_op_kernels_table(s, iteration, bounds, op_index)

    def _key_nodes_table(self, s, request):
        source, params, partial = self._range_texts(s.db)
        tq = tables.key_nodes_table(s, source)
        tq.params.update(params)
        if partial:
            tq.extra = {
                "partial": True,
                "message": "NVTX ranges are still being counted; only ops are listed. Retry in a few seconds.",
            }
        return tq

    def _range_texts(self, db) -> tuple[str, dict, bool]:
        """A SELECT of (domain_id, text, num): NVTX range labels seen at least twice, its parameters, and
        whether it is still incomplete. The labels are counted once per file (raw tables never change): small
        range tables while the first request waits, large ones in the background (partial answers meanwhile)."""
        tables_in_db = db.cached(
            "table_names",
            lambda: {r[0] for r in db.query("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")},
        )
        if K.READ_ONLY_RANGE_LABELS in tables_in_db:  # precounted by the engine; older files count here
            return (
                "SELECT domain_id, label AS text, num_ranges AS num FROM read_only_range_labels WHERE num_ranges >= 2",
                {},
                False,
            )
        n = db.cached("range_count", lambda: db.query(f"SELECT max(rowid) FROM {K.READ_ONLY_RANGES}")[0][0] or 0)
        values = self._range_label_values(db, wait=n <= INLINE_RANGES)
        # the counted rows are bound as one JSON parameter and unpacked by SQLite
        return (
            (
                "SELECT json_extract(value, '$[0]') AS domain_id, json_extract(value, '$[1]') AS text, "
                "json_extract(value, '$[2]') AS num FROM json_each(:range_labels)"
            ),
            {"range_labels": json.dumps(values or [])},
            values is None,
        )

    def _range_label_values(self, db, wait: bool = False):
        key = (db.path, db.state()[2:])
        with self._range_lock:
            job = self._range_jobs.get(key)
            if job is None:
                job = {"done": threading.Event(), "values": None}
                self._range_jobs[key] = job

                def work():
                    try:
                        job["values"] = [
                            list(r)
                            for r in db.query(f"SELECT * FROM ({RANGE_LABELS_SQL}) ORDER BY num DESC LIMIT 100000")
                        ]
                    except Exception:  # noqa: BLE001
                        log.exception("dlprof: counting NVTX range labels failed")
                        job["values"] = []
                    job["done"].set()

                threading.Thread(target=work, name="dlprof-range-labels", daemon=True).start()
        job["done"].wait(60 if wait else 0.01)
        return job["values"] if job["done"].is_set() else None

    def _page(self, request, tq) -> tuple[Page, str]:
        fmt = arg(request, "format", "json") or "json"
        if fmt not in ("json",) + EXPORT_FORMATS:
            raise BadRequest(f"unknown format '{clip(fmt)}'; use json, csv, xlsx or json_all")
        export_all = fmt in EXPORT_FORMATS
        offset = int_arg(request, "offset", default=0, minimum=0)
        limit_given = arg(request, "limit") not in (None, "")
        limit = int_arg(request, "limit", default=25, minimum=-1)
        if limit == -1 and not export_all:
            raise BadRequest("limit=-1 needs format=csv, xlsx or json_all")
        if limit > MAX_PAGE and not export_all:
            raise TooLarge(f"limit {limit} is larger than the maximum page of {MAX_PAGE} rows")
        if export_all and not limit_given:
            limit = -1
        sort = arg(request, "sort")
        order = arg(request, "order")
        if sort in (None, ""):
            sort, default_order = tq.default_sort
            order = order or default_order
        else:
            col = tq.col(sort)
            if col is None:
                raise BadRequest(f"unknown sort key '{clip(sort)}' for table {tq.name}")
            if not col.sortable:
                raise BadRequest(f"column '{sort}' cannot be sorted")
            order = order or ("asc" if col.type in tables.TEXT_TYPES else "desc")
        if order not in ("asc", "desc"):
            raise BadRequest(f"order must be asc or desc, got '{clip(order)}'")
        filters = {}
        for name in request.args:
            if name.startswith("col."):
                filters[name[4:]] = arg(request, name)
        q = arg(request, "q")
        return Page(sort, order, offset, limit, q or None, filters), fmt

    def table(self, name: str, request, ctx, eid) -> Reply:
        builder = self.tables.get(name)
        if builder is None:
            raise NotFound(f"unknown table '{clip(name)}'")
        s = self.scope(request, ctx, eid)
        s.request_context = (ctx, eid)
        tq = builder(s, request)
        page, fmt = self._page(request, tq)
        result = tables.run_query(
            tq.db if tq.db is not None else s.db, tq, page, max_rows=MAX_EXPORT_ROWS if fmt in EXPORT_FORMATS else None
        )
        columns = [c.meta() for c in tq.columns]
        doc = {
            "table": tq.name,
            "columns": columns,
            "total": result["total"],
            "filtered": result["filtered"],
            "offset": page.offset,
            "limit": page.limit,
            "sort": page.sort,
            "order": page.order,
            "rows": result["rows"],
            **tq.extra,
        }
        if fmt == "json":
            return json_reply(doc, sanitize=False)
        base = f"{_slug(s.info.run)}_{name}"
        if fmt == "csv":
            body, ctype, ext = export.to_csv(columns, result["rows"]), "text/csv; charset=utf-8", "csv"
        elif fmt == "xlsx":
            if len(result["rows"]) > export.XLSX_MAX_ROWS:
                raise TooLarge(f"{len(result['rows'])} rows do not fit in one worksheet; filter the table")
            body, ctype, ext = export.to_xlsx(columns, result["rows"], name), export.XLSX_TYPE, "xlsx"
        else:
            body, ctype, ext = export.to_json(doc), JSON, "json"
        return Reply(200, body, ctype, [("Content-Disposition", f'attachment; filename="{base}.{ext}"')])

    # ------------------------------------------------------------------ compare
    def compare(self, request, ctx, eid) -> Reply:
        s = self.scope(request, ctx, eid)
        s.request_context = (ctx, eid)
        compared, baseline = self._compared(s, request)
        return json_reply(compare.summary_doc(compared, self._side(s), baseline))

    @staticmethod
    def _side(s: Scope) -> dict:
        return {"run": s.info.run, "aggr": s.aggr_id, "domain": s.domain, "stored": False}

    @staticmethod
    def _asks_for_a_run(request) -> bool:
        """Whether the request names a baseline run, aggregation or domain (else: the run's own baseline)."""
        return any(request.args.get(k) not in (None, "") for k in ("base_run", "base_aggr", "base_domain"))

    def _baseline_scope(self, s: Scope, request) -> Scope:
        """The baseline of a comparison: `base_run` (default: the run itself), `base_aggr` (default: its newest
        aggregation), `base_domain` (default: the compared domain's name when the baseline has it, else its
        primary domain), resolved and checked as run, aggr and domain are."""
        ctx, eid = s.request_context
        run = arg(request, "base_run") or s.info.run
        domain = arg(request, "base_domain")
        if not domain:
            info = self.run_info(request, ctx, eid, run=run)
            db = self.registry.get(info.database)
            names = {d["name"] for d in (db.domains(s.rank) if run == s.info.run else db.domains())}
            domain = s.domain if s.domain in names else None
        aggr = int_arg(request, "base_aggr", minimum=1)
        args = {
            "run": run,
            "aggr": None if aggr is None else str(aggr),
            "domain": domain,
            "rank": str(s.rank) if run == s.info.run else None,
        }  # another aggregation of the shown rank
        view = type(
            "BaselineRequest",
            (),
            {"args": {k: v for k, v in args.items() if v not in (None, "")}, "method": request.method},
        )()
        return self.scope(view, ctx, eid)

    def _compared(self, s: Scope, request):
        """(compare.Compared, the baseline's description): computed once per state of both files. Without a
        baseline run, aggregation or domain in the request, the baseline the run was analysed with
        (`dlprof --baseline`, kept in its database), when it has one; else the run itself."""
        label = lambda x: f"{x.info.run} · aggregation {x.aggr_id}"  # noqa: E731
        stored = None
        if not self._asks_for_a_run(request):
            stored = compare.stored_baseline(s.db, s.aggr_id, s.domain_id, s.rank)
        if stored is not None:
            key = ("compare_stored", s.aggr_id, s.domain_id, s.rank, stored["aggr_id"])
            compared = s.db.cached(
                key,
                lambda: compare.Compared.of(
                    compare.side_from_database(s.db, s.aggr_id, s.domain_id, label(s), s.rank),
                    compare.side_from_stored(s.db, stored),
                ),
            )
            return compared, {
                "run": None,
                "aggr": None,
                "domain": s.domain,
                "stored": True,
                "source": stored["source"],
                "compared_aggr": stored["aggr_id"],
            }
        b = self._baseline_scope(s, request)

        def compute():
            return compare.Compared.of(
                compare.side_from_database(s.db, s.aggr_id, s.domain_id, label(s), s.rank),
                compare.side_from_database(b.db, b.aggr_id, b.domain_id, label(b), b.rank),
            )

        key = ("compare", s.aggr_id, s.domain_id, s.rank, b.db.path, b.db.state(), b.aggr_id, b.domain_id, b.rank)
        return s.db.cached(key, compute), self._side(b)

    # ------------------------------------------------------------------ static files
    def static(self, route: str, request) -> Reply:
        if request.method not in ("GET", "HEAD"):
            raise MethodNotAllowed("method not allowed")
        parts = route.split("/") if route else []
        ext = os.path.splitext(route)[1].lower()
        if (
            not parts
            or self.static_dir is None
            or ext not in STATIC_TYPES
            or not all(_STATIC_PART.match(p) for p in parts)
        ):
            raise NotFound(f"unknown route '{clip(route)}'")
        node = self.static_dir
        for p in parts:
            node = node.joinpath(p)
        try:
            if not node.is_file():
                raise NotFound(f"unknown route '{clip(route)}'")
            data = node.read_bytes()
        except OSError:
            raise NotFound(f"unknown route '{clip(route)}'") from None
        return Reply(200, data, STATIC_TYPES[ext])
