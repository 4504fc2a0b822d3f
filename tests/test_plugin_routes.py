"""The DLPROF routes answered in this process (dlprofviewer's WSGI app, werkzeug's test client): the HTTP API
checks of test_plugin_checks.py without a server process, so the everyday command (`pytest -m "not slow"`)
covers the plugin's handlers. test_plugin_viewer.py and test_plugin_http.py run the same checks against real
dlprofviewer and TensorBoard processes."""

from __future__ import annotations

import urllib.parse

import pytest
from werkzeug.test import Client

from dlprof_plugin.viewer import build_app
from tests import test_plugin_checks as checks

RUN = "dlprof_dldb"  # dlprofviewer names a run by its database file


class InProcessApi(checks.Api):
    """checks.Api over a WSGI app: the same requests, no socket."""

    def __init__(self, app, base: str = "http://127.0.0.1:6006"):
        super().__init__(base)
        self.client = Client(app)

    def raw(self, url, data=None, method=None, timeout=30, headers=None):
        parts = urllib.parse.urlsplit(url)
        headers = dict(headers or {})
        if data is not None:
            headers.setdefault("Content-Type", "application/json")
        reply = self.client.open(
            parts.path,
            base_url=f"{parts.scheme}://{parts.netloc}",
            query_string=parts.query,
            method=method or ("POST" if data is not None else "GET"),
            data=data,
            headers=headers,
        )
        return reply.status_code, dict(reply.headers), reply.get_data()


@pytest.fixture(scope="module")
def viewer(tmp_path_factory, training_run):
    from tests.profiles import make_logdir

    root = make_logdir(tmp_path_factory.mktemp("plugin_routes") / "out", {"viewer": training_run})
    db = root / "viewer" / "dlprof_dldb.sqlite"
    return {"api": InProcessApi(build_app([str(db)])), "db": db}


def test_runs(viewer):
    checks.check_runs(viewer["api"], {RUN: viewer["db"]})


def test_metadata_routes(viewer):
    checks.check_metadata_routes(viewer["api"], RUN, viewer["db"])


def test_dashboard(viewer):
    checks.check_dashboard(viewer["api"], RUN, viewer["db"])


def test_tables(viewer):
    checks.check_tables(viewer["api"], RUN, viewer["db"])


def test_exports(viewer):
    checks.check_exports(viewer["api"], RUN)


def test_terms(viewer):
    checks.check_terms(viewer["api"], RUN)


def test_bad_requests(viewer):
    checks.check_bad_requests(viewer["api"], RUN)


def test_static_files(viewer):
    checks.check_static(viewer["api"])
