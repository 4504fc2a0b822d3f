"""The DLPROF TensorBoard plugin: serves http_api.md under /data/plugin/dlprof/ and the frontend module.

Runs are found through the data provider (the Rust data server with --load_fast, or the multiplexer), so
the plugin works in both modes; each run's event file names its DLProf database, read here directly.
"""

from __future__ import annotations

import logging
import threading
import time
from importlib.resources import files

from tensorboard.backend import http_util
from tensorboard.plugins import base_plugin
from werkzeug import wrappers

from dlprof_plugin import security
from dlprof_plugin.runs import PLUGIN_NAME, ProviderRuns
from dlprof_plugin.replies import error_reply
from dlprof_plugin.service import Service

log = logging.getLogger("dlprof_plugin")
ROUTE_PREFIX = f"/data/plugin/{PLUGIN_NAME}/"
ACTIVE_REFRESH_S = 15.0


def static_dir():
    """The frontend_static package directory (a Traversable), or None when it is not installed."""
    try:
        return files("frontend_static")
    except (ImportError, ModuleNotFoundError, TypeError):
        return None


def route_of(path: str) -> str:
    """The part of a request path below /data/plugin/dlprof/ ('runs', 'table/ops', 'index.js')."""
    i = path.find(ROUTE_PREFIX)
    return path[i + len(ROUTE_PREFIX) :] if i >= 0 else path.lstrip("/")


class DLProfPlugin(base_plugin.TBPlugin):
    plugin_name = PLUGIN_NAME

    def __init__(self, context):
        self._context = context
        self._runs = ProviderRuns(context.data_provider, context.logdir)
        self._service = Service(self._runs, static_dir=static_dir())
        flags = getattr(context, "flags", None)
        self._policy = security.policy_for_bind(
            getattr(flags, "host", None),
            bool(getattr(flags, "bind_all", False)),
            getattr(flags, "dlprof_allowed_hosts", None),
            flag="--dlprof_allowed_hosts",
        )
        self._active = False
        self._active_lock = threading.Lock()
        self._refresher = None

    # ------------------------------------------------------------------ TBPlugin
    def get_plugin_apps(self):
        apps = {f"/{route}": self._serve for route in self._service.routes}
        apps["/index.js"] = self._serve
        apps["/table/*"] = self._serve
        apps["/*"] = self._serve  # other static files of the frontend; JSON 404 for anything else
        return apps

    def is_active(self):
        """O(1): a flag refreshed by a background thread (started on the first call)."""
        with self._active_lock:
            if self._refresher is None and self._runs.available():
                self._refresher = threading.Thread(target=self._refresh_active, name="dlprof-is-active", daemon=True)
                self._refresher.start()
        return self._active

    def frontend_metadata(self):
        return base_plugin.FrontendMetadata(es_module_path="/index.js", tab_name="DLPROF", disable_reload=True)

    def data_plugin_names(self):
        return (PLUGIN_NAME,)

    # ------------------------------------------------------------------ internals
    def _refresh_active(self):
        from tensorboard import context as tb_context

        while True:
            try:
                self._active = bool(self._runs.runs(tb_context.RequestContext(), "", max_age=0))
            except Exception as exc:  # noqa: BLE001 - keep the last value
                log.debug("dlprof: is_active refresh failed: %s", exc)
            time.sleep(ACTIVE_REFRESH_S)

    @wrappers.Request.application
    def _serve(self, request):
        from tensorboard import plugin_util

        ctx = plugin_util.context(request.environ)
        eid = plugin_util.experiment_id(request.environ)
        # TensorBoard's routing hands the untouched WSGI environ to this app: nothing has read the body yet,
        # so an oversized one is refused here before a byte of it is read.
        refused = security.screen(request, self._policy)
        reply = error_reply(*refused) if refused else self._service.handle(route_of(request.path), request, ctx, eid)
        return http_util.Respond(request, reply.body, reply.content_type, code=reply.status, headers=reply.headers)
