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


@pytest.mark.parametrize("check", list(checks.route_checks(RUN)))
def test_routes(viewer, check):
    checks.route_checks(RUN)[check](viewer["api"], viewer["db"])


def test_timeline_of_an_iteration(viewer):
    """The hand-computed iteration 1 of the training profile (tests/test_plugin_timeline.py's expectations)."""
    from tests import test_plugin_timeline as tl

    doc = viewer["api"].get("timeline", run=RUN, iteration=1, width=2000)
    assert doc["window"] == list(checks.ITER1)
    got = tl.events(doc)
    by_row = {
        rid: [(e["start"], e["end"], e["name"]) for e in got if e["row"]["id"] == rid] for rid in ("t0.0", "t1.0")
    }
    assert by_row == {"t0.0": tl.MAIN_OPS, "t1.0": tl.GRAD_OPS}
    gpu = [(e["start"], e["end"], e["name"], e["kind"]) for e in got if e["row"]["id"] == "g0.7"]
    assert gpu == [g[:4] for g in tl.GPU]


def test_ranks_of_a_single_profile(viewer, training_export):
    doc = viewer["api"].get("ranks", run=RUN)
    assert doc["default"] == 0
    assert [(r["rank"], r["source_file"], r["source_kind"]) for r in doc["ranks"]] == [
        (0, str(training_export), "nsys_sqlite")
    ]


def test_memory_of_a_profile_without_memory_events(viewer):
    """No memory events recorded: the route says how to record them, and still lists the iterations."""
    doc = viewer["api"].get("memory", run=RUN, aggr=1)
    assert doc["recorded"] is False and "--cuda-memory-usage=true" in doc["message"]
    assert doc["devices"] == [] and doc["series"] == []
    assert [(i["iteration"], i["start"], i["end"]) for i in doc["iterations"][:2]] == [
        (0, 1_000_000, checks.ITER1[0]),
        (1, *checks.ITER1),
    ]
