"""`dlprofviewer <database> [--port 8000] [--host 127.0.0.1]`: the DLPROF UI and HTTP API without TensorBoard.

One run per database, named after the file (`dlprof_dldb.sqlite` -> run `dlprof_dldb`). `/` serves a page
that, like TensorBoard's plugin iframe, has `<base href="data/plugin/dlprof/">`, imports `./index.js` and
calls its `render()`; the API answers at `/data/plugin/dlprof/<route>` and, for convenience, at `/<route>`.
Every request passes security.py's checks first (Host names, cross-site requests, body size; `--allowed_hosts`).
Served by waitress with a bounded worker pool, timeouts and a connection limit (http_server.py).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import logging
import os
import sys
import time
from pathlib import Path

from werkzeug import wrappers

from dlprof_plugin import security
from dlprof_plugin.db import Database, NotADatabase
from dlprof_plugin.http_server import Limits, ViewerServer
from dlprof_plugin.plugin import ROUTE_PREFIX, static_dir
from dlprof_plugin.replies import error_reply
from dlprof_plugin.runs import RunInfo, StaticRuns
from dlprof_plugin.security import policy_for_bind
from dlprof_plugin.service import Service

ENTRY_SCRIPT = 'import("./index.js").then((m) => void m.render());'
PAGE = """<!DOCTYPE html>
<html lang="en">
<head><meta charset="utf-8"><title>DLProf Viewer</title><base href="data/plugin/dlprof/">
<link rel="icon" type="image/svg+xml" href="logo.svg"></head>
<body><script type="module">{script}</script></body>
</html>
"""
# Routes that read no profile data (and the page and static files): served on the light lane (http_server.py).
LIGHT_ROUTES = frozenset({"runs", "terms", "aggregations", "domains", "reaggregate", "reaggregate_status"})
log = logging.getLogger("dlprof_plugin.viewer")


def _run_names(paths: list[str]) -> dict[str, str]:
    names: dict[str, str] = {}
    for p in paths:
        name = Path(p).stem or "dlprof"
        if name in names:
            name = f"{Path(p).parent.name}/{name}"
        k, base = 2, name
        while name in names:
            name, k = f"{base}_{k}", k + 1
        names[name] = p
    return names


def build_app(databases: list[str], policy=None):
    """The viewer's WSGI app for these database files (validated: DLProf databases); `policy`: the
    security.HostPolicy of its binding (default: bound to loopback)."""
    from tensorboard.backend import http_util

    policy = policy or security.policy_for_bind("127.0.0.1")

    runs = {}
    for name, path in _run_names([os.path.realpath(d) for d in databases]).items():
        db = Database(path)
        db.profile_info()  # raises NotADatabase
        db.close()
        runs[name] = RunInfo(run=name, database=path, shown_database=os.path.basename(path), meta={})
    service = Service(StaticRuns(runs), static_dir=static_dir())
    page = PAGE.format(script=ENTRY_SCRIPT)
    script_sha = base64.b64encode(hashlib.sha256(ENTRY_SCRIPT.encode("utf-8")).digest()).decode("ascii")

    def route_of(path: str) -> str:
        if path == "/favicon.ico":  # asked for by browsers whatever the page links
            return "logo.svg"
        return path[len(ROUTE_PREFIX) :] if path.startswith(ROUTE_PREFIX) else path.lstrip("/")

    @wrappers.Request.application
    def app(request):
        refused = security.screen(request, policy)
        if refused:
            reply = error_reply(*refused)
            return http_util.Respond(request, reply.body, reply.content_type, code=reply.status)
        if request.path in ("/", "/index.html"):
            return http_util.Respond(request, page, "text/html", csp_scripts_sha256s=[script_sha])
        reply = service.handle(route_of(request.path), request, None, "")
        return http_util.Respond(request, reply.body, reply.content_type, code=reply.status, headers=reply.headers)

    def is_light(path: str) -> bool:
        """Whether a request path reads no profile data: the page, static files, LIGHT_ROUTES."""
        route = route_of(path).strip("/")
        return route in LIGHT_ROUTES or not (route in service.routes or route.split("/")[0] == "table")

    app.service = service
    app.is_light = is_light
    return app


def access_logged(app):
    """`app` logging one line per request in the common log format (as werkzeug's server did)."""

    def logged(environ, start_response):
        status = []

        def start(line, headers, exc_info=None):
            status.append(line.split(" ", 1)[0])
            return start_response(line, headers, exc_info)

        result = app(environ, start)
        uri = environ.get("REQUEST_URI") or environ.get("PATH_INFO", "")
        log.info(
            '%s - - [%s] "%s %s %s" %s -',
            environ.get("REMOTE_ADDR", "-"),
            time.strftime("%d/%b/%Y %H:%M:%S"),
            environ.get("REQUEST_METHOD"),
            uri.encode("latin-1", "replace").decode("ascii", "backslashreplace"),
            environ.get("SERVER_PROTOCOL"),
            status[0] if status else "-",
        )
        return result

    return logged


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="dlprofviewer", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("database", nargs="+", help="DLProf database (dlprof_dldb.sqlite); several make several runs")
    parser.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000; 0 = any free)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument(
        "--allowed_hosts",
        metavar="NAMES",
        default="",
        help="host names (comma-separated) the viewer answers besides localhost and IP addresses, "
        "e.g. a reverse proxy's; requests naming other hosts are refused (DNS rebinding). "
        "Bound to a non-loopback --host without this option, every name is answered",
    )
    parser.add_argument("--quiet", action="store_true", help="do not log each request")
    limits = Limits()
    parser.add_argument(
        "--connection_limit",
        type=int,
        default=limits.connection_limit,
        metavar="N",
        help=f"open connections served at once; more wait to be accepted (default {limits.connection_limit})",
    )
    parser.add_argument(
        "--request_timeout",
        type=float,
        default=limits.request_timeout,
        metavar="S",
        help="seconds a request (line, headers and body) may take to arrive from its first byte; slower "
        f"connections are closed (default {limits.request_timeout:g})",
    )
    parser.add_argument(
        "--idle_timeout",
        type=int,
        default=limits.idle_timeout,
        metavar="S",
        help=f"seconds a connection may stay silent between requests (default {limits.idle_timeout})",
    )
    args = parser.parse_args(argv)
    for d in args.database:
        if not os.path.isfile(d):
            print(f"dlprofviewer: {d}: no such file", file=sys.stderr)
            return 2
    if args.connection_limit < 1 or args.request_timeout <= 0 or args.idle_timeout < 1:
        print("dlprofviewer: --connection_limit, --request_timeout, --idle_timeout must be positive", file=sys.stderr)
        return 2
    try:
        app = build_app(args.database, policy_for_bind(args.host, allowed=args.allowed_hosts))
    except NotADatabase as exc:
        print(f"dlprofviewer: {exc}", file=sys.stderr)
        return 2
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.WARNING if args.quiet else logging.INFO)
    log.propagate = False
    logging.getLogger("waitress.queue").setLevel(logging.ERROR)  # queued requests are the lanes' design
    limits = Limits(
        connection_limit=args.connection_limit, request_timeout=args.request_timeout, idle_timeout=args.idle_timeout
    )
    try:
        server = ViewerServer(access_logged(app), limits, app.is_light, args.host, args.port)
    except OSError as exc:
        print(f"dlprofviewer: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 2
    host = f"[{args.host}]" if ":" in args.host else args.host
    print(f"DLProf viewer at http://{host}:{server.port}/ (Ctrl+C to quit)", flush=True)
    try:
        server.run()
    finally:
        app.service.jobs.shutdown()
        server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
