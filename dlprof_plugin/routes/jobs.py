"""Re-aggregation from the browser (http_api.md "Reaggregate"): start a job that appends a new aggregation to
the run's database in its own process (jobs.JobManager runs `python -m dlprof_profiler.run.reaggregate`), and
its status."""

from __future__ import annotations

import json
import re

from dlprof_plugin import security
from dlprof_plugin.jobs import JobConflict
from dlprof_plugin.replies import INT64_MAX, BadRequest, Reply, TooLarge, json_reply


def routes(service) -> dict:
    """{route: handler} for the Service."""
    return {
        "reaggregate": lambda request, ctx, eid: reaggregate(service, request, ctx, eid),
        "reaggregate_status": lambda request, ctx, eid: reaggregate_status(service, request, ctx, eid),
    }


def reaggregate_status(service, request, ctx, eid) -> Reply:
    """`reaggregate_status?run=`: the database's re-aggregation job, if any."""
    info = service.run_info(request, ctx, eid)
    return json_reply({"job": service.jobs.status(info.database)})


def reaggregate(service, request, ctx, eid) -> Reply:
    """POST `reaggregate` {run, key_node, iter_start, iter_stop}: start a re-aggregation job (202)."""
    raw = security.read_body(request)
    if raw is None:
        raise TooLarge(security.too_large())
    try:
        body = json.loads(raw.decode("utf-8")) if raw.strip() else None
    except (UnicodeDecodeError, ValueError, RecursionError):  # RecursionError: nested too deeply
        raise BadRequest("the body must be a JSON object") from None
    if not isinstance(body, dict):
        raise BadRequest('the body must be a JSON object {"run", "key_node", "iter_start", "iter_stop"}')
    unknown = set(body) - {"run", "key_node", "iter_start", "iter_stop", "aggr", "domain"}
    if unknown:
        raise BadRequest(f"unknown field(s): {', '.join(sorted(map(str, unknown)))[:200]}")
    run = body.get("run")
    if not isinstance(run, str) or not run:
        raise BadRequest("'run' (a string) is required")
    key_node = body.get("key_node")
    if key_node is not None:
        if not isinstance(key_node, str):
            raise BadRequest("'key_node' must be a string or null")
        key_node = key_node.strip()
        if len(key_node) > 2000 or re.search(r"[\x00-\x1f\x7f]", key_node):
            raise BadRequest("'key_node' must be one line of at most 2000 characters")
        key_node = key_node or None
    bounds = {}
    for name in ("iter_start", "iter_stop"):
        v = body.get(name)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise BadRequest(f"'{name}' must be a non-negative integer or null")
        if v is not None and v > INT64_MAX:
            raise BadRequest(f"'{name}' must be at most {INT64_MAX}")
        bounds[name] = v
    if (
        bounds["iter_start"] is not None
        and bounds["iter_stop"] is not None
        and bounds["iter_start"] > bounds["iter_stop"]
    ):
        raise BadRequest("'iter_start' must not be greater than 'iter_stop'")
    info = service.run_info(request, ctx, eid, run=run)
    service.registry.get(info.database).profile_info()  # a DLProf database (404 otherwise)
    try:
        job = service.jobs.start(info.database, key_node, bounds["iter_start"], bounds["iter_stop"])
    except JobConflict as exc:
        raise JobConflict(str(exc), {"job": service.jobs.status(info.database)}) from None
    return json_reply({"job": job}, status=202)
