"""The timeline routes (http_api.md "Timeline"): one iteration's or time window's rows, and what ran in a gap;
the rows themselves are dlprof_plugin.timeline's."""

from __future__ import annotations

from dlprof_plugin import timeline
from dlprof_plugin.replies import BadRequest, NotFound, Reply, TooLarge, arg, int_arg, json_reply


def routes(service) -> dict:
    """{route: handler} for the Service."""
    return {
        "timeline": lambda request, ctx, eid: timeline_route(service, request, ctx, eid),
        "timeline_gap": lambda request, ctx, eid: timeline_gap_route(service, request, ctx, eid),
    }


def window_of(request, s) -> tuple[int, int, dict | None]:
    """[t0, t1) of a timeline request: `t0` and `t1`, else the bounds of `iteration`."""
    if not s.db.v3:
        raise NotFound("the timeline needs a DLProf database of schema 3.0: analyse the export again with this dlprof")
    iteration = int_arg(request, "iteration")
    it = None
    if iteration is not None:
        rank = timeline.rank_of_domain(s.db, s.domain_id)
        bounds = timeline.iteration_bounds(s.db, s.aggr_id, rank)
        match = bounds[bounds[:, 0] == iteration] if len(bounds) else bounds
        if not len(match):
            raise NotFound(f"unknown iteration {iteration} in aggregation {s.aggr_id}")
        it = {"iteration": iteration, "start": int(match[0, 1]), "end": int(match[0, 2])}
    t0, t1 = int_arg(request, "t0", minimum=None), int_arg(request, "t1", minimum=None)
    if (t0 is None) != (t1 is None):
        raise BadRequest("give both t0 and t1 (or neither, with iteration)")
    if t0 is None:
        if it is None:
            raise BadRequest("parameter 'iteration' (or 't0' and 't1') is required")
        t0, t1 = it["start"], max(it["end"], it["start"] + 1)
    if t1 <= t0:
        raise BadRequest("'t1' must be greater than 't0'")
    return t0, t1, it


def timeline_route(service, request, ctx, eid) -> Reply:
    """`timeline?run=&aggr=&domain=&iteration=|t0=&t1=&width=&rows=&hide=`: one window of the timeline."""
    s = service.scope(request, ctx, eid)
    t0, t1, it = window_of(request, s)
    width = int_arg(request, "width", default=1000, minimum=1)
    if width > timeline.MAX_WIDTH:
        raise BadRequest(f"'width' must be at most {timeline.MAX_WIDTH} pixels")
    rows, hide = arg(request, "rows"), arg(request, "hide")
    groups = None if rows is None else {g for g in rows.split(",") if g}
    hidden = {g for g in (hide or "").split(",") if g}
    return json_reply(
        answer(timeline.window, s.db, s.aggr_id, s.domain_id, t0, t1, width, groups, it, hidden),
        sanitize=False,
    )


def timeline_gap_route(service, request, ctx, eid) -> Reply:
    """`timeline_gap?...&t0=&t1=`: what ran on the GPU in an idle gap's window."""
    s = service.scope(request, ctx, eid)
    t0, t1, _ = window_of(request, s)
    return json_reply(answer(timeline.gap_activity, s.db, s.aggr_id, s.domain_id, t0, t1))


def answer(fn, *args):
    """A timeline function's answer; its refusals as HTTP errors."""
    try:
        return fn(*args)
    except timeline.TooManyEvents as exc:
        raise TooLarge(str(exc), {"events": exc.events, "max_events": timeline.MAX_EVENTS}) from None
    except timeline.TimelineError as exc:
        raise BadRequest(str(exc)) from None
