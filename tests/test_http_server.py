"""dlprofviewer's HTTP server (dlprof_plugin/http_server.py): the worker lanes in process; the limits and timeouts
over HTTP against a real dlprofviewer in tests/test_hardening.py (issue 25), the load in
benchmarks/bench_viewer_load.py."""

from __future__ import annotations

import pytest

import threading
from types import SimpleNamespace

from dlprof_plugin.http_server import LaneDispatcher
from tests.waiting import wait_until


class FakeChannel:
    """What the dispatcher sees of a waitress channel: its first request's path; service() blocks until released."""

    def __init__(self, path: str, log: list, running: dict, lock: threading.Lock):
        self.requests = [SimpleNamespace(path=path, error=None)]
        self.path, self.log, self.running, self.lock = path, log, running, lock
        self.release = threading.Event()
        self.cancelled = False

    def service(self):
        heavy = self.path != "/runs"
        with self.lock:
            self.log.append(self.path)
            if heavy:
                self.running["now"] += 1
                self.running["max"] = max(self.running["max"], self.running["now"])
        self.release.wait(30)
        with self.lock:
            if heavy:
                self.running["now"] -= 1

    def cancel(self):
        self.cancelled = True


@pytest.mark.slow
def test_light_requests_pass_queued_heavy_ones_and_heavy_ones_are_bounded():
    log, running, lock = [], {"now": 0, "max": 0}, threading.Lock()
    dispatcher = LaneDispatcher(heavy=2, light=1, is_light=lambda path: path == "/runs")
    heavy = [FakeChannel(f"/timeline?{i}", log, running, lock) for i in range(6)]
    try:
        for channel in heavy:
            dispatcher.add_task(channel)
        wait_until(lambda: len(log) == 2, 30, "two heavy requests to start")
        light = FakeChannel("/runs", log, running, lock)
        dispatcher.add_task(light)
        # the third worker takes /runs although four heavy requests were queued before it
        wait_until(lambda: "/runs" in log, 30, "/runs to be served")
        assert log == [heavy[0].path, heavy[1].path, "/runs"]
        light.release.set()
        for channel in heavy:
            channel.release.set()
        wait_until(lambda: len(log) == 7 and running["now"] == 0, 30, "every request to be served")
        assert running["max"] == 2  # never more heavy requests at once than the lane allows
        assert log[3:] == [c.path for c in heavy[2:]]  # first come, first served within the lane
    finally:
        for channel in heavy:
            channel.release.set()
        dispatcher.shutdown(timeout=5)


def test_shutdown_cancels_what_is_still_queued():
    log, running, lock = [], {"now": 0, "max": 0}, threading.Lock()
    dispatcher = LaneDispatcher(heavy=1, light=0, is_light=lambda path: False)
    first, queued = FakeChannel("/a", log, running, lock), FakeChannel("/b", log, running, lock)
    dispatcher.add_task(first)
    wait_until(lambda: log == ["/a"], 30, "the first request to start")
    dispatcher.add_task(queued)
    stopping = threading.Thread(target=dispatcher.shutdown, kwargs={"timeout": 30})
    stopping.start()
    wait_until(lambda: dispatcher.stopping, 30, "the shutdown to begin")
    first.release.set()  # the running request finishes; the queued one is not started but cancelled
    stopping.join(30)
    assert not stopping.is_alive() and log == ["/a"] and queued.cancelled
