"""`dlprofviewer <database> [--port 8000] [--host 127.0.0.1]`: the DLPROF UI and HTTP API without TensorBoard.

One run per database, named after the file (`dlprof_dldb.sqlite` -> run `dlprof_dldb`). `/` serves a page
that, like TensorBoard's plugin iframe, has `<base href="data/plugin/dlprof/">`, imports `./index.js` and
calls its `render()`; the API answers at `/data/plugin/dlprof/<route>` and, for convenience, at `/<route>`.
Every request passes security.py's checks first (Host names, cross-site requests; `--allowed_hosts`).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import logging
import os
import sys
from pathlib import Path

ENTRY_SCRIPT = 'import("./index.js").then((m) => void m.render());'
PAGE = """<!DOCTYPE html>
<html lang="en">
<head><meta charset="utf-8"><title>DLProf Viewer</title><base href="data/plugin/dlprof/">
<link rel="icon" type="image/svg+xml" href="logo.svg"></head>
<body><script type="module">{script}</script></body>
</html>
"""


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
    from werkzeug import wrappers

    from dlprof_plugin import security
    from dlprof_plugin.db import Database
    from dlprof_plugin.plugin import ROUTE_PREFIX, static_dir
    from dlprof_plugin.runs import RunInfo, StaticRuns
    from dlprof_plugin.service import Service, error_reply

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

    @wrappers.Request.application
    def app(request):
        reason = security.check_request(request, policy)
        if reason:
            reply = error_reply(403, reason)
            return http_util.Respond(request, reply.body, reply.content_type, code=reply.status)
        path = request.path
        if path in ("/", "/index.html"):
            return http_util.Respond(request, page, "text/html", csp_scripts_sha256s=[script_sha])
        if path == "/favicon.ico":  # asked for by browsers whatever the page links
            route = "logo.svg"
        elif path.startswith(ROUTE_PREFIX):
            route = path[len(ROUTE_PREFIX) :]
        else:
            route = path.lstrip("/")
        reply = service.handle(route, request, None, "")
        return http_util.Respond(request, reply.body, reply.content_type, code=reply.status, headers=reply.headers)

    app.service = service
    return app


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
    args = parser.parse_args(argv)
    from dlprof_plugin.db import NotADatabase

    for d in args.database:
        if not os.path.isfile(d):
            print(f"dlprofviewer: {d}: no such file", file=sys.stderr)
            return 2
    try:
        from dlprof_plugin.security import policy_for_bind

        app = build_app(args.database, policy_for_bind(args.host, allowed=args.allowed_hosts))
    except NotADatabase as exc:
        print(f"dlprofviewer: {exc}", file=sys.stderr)
        return 2
    from werkzeug.serving import make_server

    if args.quiet:
        logging.getLogger("werkzeug").setLevel(logging.WARNING)
    try:
        server = make_server(args.host, args.port, app, threaded=True)
    except OSError as exc:
        print(f"dlprofviewer: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 2
    host = f"[{args.host}]" if ":" in args.host else args.host
    print(f"DLProf viewer at http://{host}:{server.server_port}/ (Ctrl+C to quit)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        app.service.jobs.shutdown()
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
