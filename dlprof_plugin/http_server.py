"""dlprofviewer's HTTP server: waitress, a production WSGI server, with the limits a viewer needs under load.

Why waitress and not cheroot, measured (benchmarks/bench_viewer_load.py; README.md has the figures): waitress reads
every request whole (headers and body) in one I/O thread that polls all connections, and only then hands it to a
worker, so an idle or slowly drip-fed connection costs a few kilobytes and no thread. cheroot gives a connection
to a worker thread as soon as its first byte arrives, and that thread then blocks reading the rest: with 4,000
drip-fed connections (slowloris) cheroot answered none of 2,000 requests nor `/runs` in 120 s, with 10 or 200
threads; this server answered all of them, `/runs` in under 1 s (p99 0.3-0.8 s). Without the slow connections
cheroot was as fast through the 2,000 (41 s, 43 s here) but kept `/runs` waiting 12-28 s behind them (its pool is
one FIFO queue).

What is added to waitress here:
- An event loop on epoll whose turn costs what the active connections need, not all the open ones (waitress's
  asks each of them at every turn: ~30 ms per turn with 6,000 open connections, paid several times a request).
- Two lanes of workers: at most `heavy_workers` requests of the routes that read a profile (tables, timeline,
  compare, ...) run at once, and `light_workers` more threads are always free for the light ones (the page, its
  static files, `runs`, `aggregations`, `domains`, `reaggregate`, `reaggregate_status`), which also go first.
  Thousands of queued timeline requests therefore never delay `/runs` or the page.
- Deadlines: a request must arrive whole (request line, headers and body) within `request_timeout` of its first
  byte; a connection with no request in progress is closed after `idle_timeout` without traffic; a client that
  stops reading a response larger than waitress's buffer is dropped after `idle_timeout` too.
- A connection limit: beyond `connection_limit` open connections, new ones wait in the kernel's accept queue
  until some close (the process never runs out of file descriptors); several are accepted per poll.
- Bodies over security.MAX_BODY are refused by `Content-Length` before any is read; a chunked one is cut at the
  limit. Headers are limited to `max_header` bytes.
- The errors waitress answers itself (400 malformed request, 413 body, 431 headers, 501) are JSON
  `{"error": ...}` like every answer of the API.
"""

from __future__ import annotations

import gc
import json
import logging
import resource
import select
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable

from waitress import wasyncore
from waitress.adjustments import Adjustments
from waitress.channel import HTTPChannel
from waitress.server import TcpWSGIServer
from waitress.task import ErrorTask

from dlprof_plugin import security

log = logging.getLogger("dlprof_plugin.viewer")
ACCEPT_BATCH = 64  # connections accepted per poll of the listening socket
FD_RESERVE = 64  # file descriptors kept for the databases, the jobs and the workers' temporary files
SWITCH_INTERVAL_S = 0.001


@dataclass(frozen=True)
class Limits:
    """The server's limits (http_api.md, "The standalone viewer's server")."""

    connection_limit: int = 10_000
    request_timeout: float = 10.0  # seconds for a request to arrive whole, from its first byte
    idle_timeout: int = 60  # seconds a connection may stay without traffic between requests
    # One: the GIL runs one thread's Python at a time, and a second heavy worker measured no faster through 2,000
    # requests while it doubled the event loop's waits for the GIL (/runs p99 0.7 s with one, 1.0-1.5 s with two).
    heavy_workers: int = 1
    light_workers: int = 2
    max_header: int = 64 * 1024  # bytes of request line and headers


class LaneDispatcher:
    """waitress's task dispatcher in two lanes: light requests first and on any worker; at most `heavy`
    workers on heavy requests at once, so `light` workers are always free for light ones."""

    def __init__(self, heavy: int, light: int, is_light: Callable[[str], bool]):
        self.heavy, self.is_light = heavy, is_light
        self.queues = {True: deque(), False: deque()}
        self.heavy_running = 0
        self.stopping = False
        self.cv = threading.Condition()
        self.threads = [
            threading.Thread(target=self._work, name=f"dlprofviewer-{i}", daemon=True) for i in range(heavy + light)
        ]
        for t in self.threads:
            t.start()

    def _lane(self, channel) -> bool:
        request = channel.requests[0] if channel.requests else None
        return request is None or request.error is not None or self.is_light(request.path)

    def add_task(self, channel) -> None:
        """Called by waitress with a channel whose first request is complete (under its requests lock)."""
        light = self._lane(channel)
        with self.cv:
            self.queues[light].append(channel)
            self.cv.notify()

    def _next(self):
        with self.cv:
            while not self.stopping:
                if self.queues[True]:
                    return self.queues[True].popleft(), False
                if self.queues[False] and self.heavy_running < self.heavy:
                    self.heavy_running += 1
                    return self.queues[False].popleft(), True
                self.cv.wait()
            return None, False

    def _work(self) -> None:
        while True:
            channel, heavy = self._next()
            if channel is None:
                return
            try:
                channel.service()
            except BaseException:  # noqa: BLE001 - waitress's own dispatcher logs and goes on too
                log.exception("dlprofviewer: serving a request failed")
            finally:
                if heavy:
                    with self.cv:
                        self.heavy_running -= 1
                        self.cv.notify()

    def shutdown(self, cancel_pending: bool = True, timeout: float = 5) -> bool:
        with self.cv:
            self.stopping = True
            self.cv.notify_all()
        deadline = time.monotonic() + timeout
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))
        if cancel_pending:
            with self.cv:
                for queue in self.queues.values():
                    while queue:
                        queue.popleft().cancel()
        return True


class _JsonErrorTask(ErrorTask):
    """waitress's own error answers (malformed request, body or headers too large) as the API's JSON."""

    def execute(self):
        error = self.request.error
        if error.code == 413:
            message = security.too_large(None if self.request.chunked else self.request.content_length)
        else:
            message = f"{error.reason.lower()}: {error.body}"
        body = json.dumps({"error": message}, separators=(",", ":")).encode()
        self.status = f"{error.code} {error.reason}"
        self.response_headers.append(("Content-Type", "application/json"))
        self.set_close_on_finish()
        self.content_length = len(body)
        self.write(body)


class _Channel(HTTPChannel):
    """A connection that knows since when its current request is being read (None: between requests), and
    tells the server's event loop whenever a worker thread changed what it waits for."""

    error_task_class = _JsonErrorTask
    reading_since = None

    def received(self, data):
        partial = self.request
        result = super().received(data)
        if self.request is None:
            self.reading_since = None
        elif self.request is not partial:
            self.reading_since = time.time()
        return result

    def send_continue(self):
        if self.request.error is not None:  # refused by its headers (a body too large): answer that at once,
            self.request.expect_continue = False  # rather than invite the body and refuse it after 64 KiB
            return
        super().send_continue()

    def add_channel(self, map=None):
        super().add_channel(map)
        self.server.touch(self)

    def service(self):
        try:
            super().service()
        finally:
            self.server.touch(self)  # done: it reads again, or has a response left to send, or closes
            self.server.pull_trigger()

    def write_soon(self, data):
        written = super().write_soon(data)
        if self.total_outbufs_len:  # what the worker could not send now is the event loop's to send
            self.server.touch(self)
            self.server.pull_trigger()
        return written


class ViewerServer(TcpWSGIServer):
    """waitress's TCP server with the connection limit, batched accepts, the deadlines of Limits, and an event
    loop whose cost follows the connections that have something to do, not all the open ones.

    waitress's own loop asks every connection what it waits for and registers all of them anew with poll() at
    every turn: with 6,000 open connections that is ~30 ms of Python per turn, which a request waits several
    times. Here the registrations stay in an epoll set and only the connections that had an event, a new one,
    or a worker's change ("touched") are asked again."""

    channel_class = _Channel

    def __init__(self, app, limits: Limits, is_light: Callable[[str], bool], host: str, port: int):
        ipv6 = ":" in host
        adj = Adjustments(
            host=host,
            port=port,
            ipv4=not ipv6,
            ipv6=ipv6,
            ident="dlprofviewer",
            channel_timeout=limits.idle_timeout,
            cleanup_interval=1,
            max_request_header_size=limits.max_header,
            max_request_body_size=security.MAX_BODY + 1,  # waitress refuses from this size on
            asyncore_use_poll=True,  # (waitress's loop, without epoll) select() stops at 1024 descriptors
            backlog=min(limits.connection_limit, 4096),
        )
        self.limits = limits
        self.connection_limit = open_file_budget(limits.connection_limit)
        self.at_limit = False
        self.touched: set = set()
        self.touched_lock = threading.Lock()
        self.registered: dict = {}  # fd -> (dispatcher, event mask) in the epoll set
        dispatcher = LaneDispatcher(limits.heavy_workers, limits.light_workers, is_light)
        super().__init__(app, map={}, dispatcher=dispatcher, adj=adj, sockinfo=adj.listen[0])

    # ---------------------------------------------------------------- accepting
    def readable(self):
        now = time.time()
        if now >= self.next_channel_cleanup:
            self.next_channel_cleanup = now + self.adj.cleanup_interval
            self.maintenance(now)
        full = len(self.active_channels) >= self.connection_limit
        if full and not self.at_limit:
            log.warning("dlprofviewer: %d connections open (the limit); new ones wait", self.connection_limit)
        self.at_limit = full
        return self.accepting and not full

    def handle_accept(self):
        for _ in range(ACCEPT_BATCH):
            before = len(self.active_channels)
            if before >= self.connection_limit:
                return
            super().handle_accept()
            if len(self.active_channels) == before:  # nothing was waiting (or accept failed)
                return

    def maintenance(self, now):
        """Close what overstayed: idle connections, requests arriving too slowly, clients not reading."""
        idle = now - self.adj.channel_timeout
        started = now - self.limits.request_timeout
        for channel in list(self.active_channels.values()):
            if channel.requests:  # a worker has it; dropped only if blocked on a client that stopped reading
                late = channel.total_outbufs_len > self.adj.outbuf_high_watermark and channel.last_activity < idle
            elif channel.reading_since is not None:
                late = channel.reading_since < started
            else:
                late = channel.last_activity < idle
            if late:
                channel.will_close = True
                self.touch(channel)

    # ---------------------------------------------------------------- workers and the event loop
    def add_task(self, channel):
        self.touch(channel)
        self.task_dispatcher.add_task(channel)

    def touch(self, channel) -> None:
        """Ask `channel` again what it waits for before the next poll (workers call this too)."""
        with self.touched_lock:
            self.touched.add(channel)

    def run(self):
        if not hasattr(select, "epoll"):
            return super().run()
        self.epoll = select.epoll()
        # The ~65,000 objects of the imports and the app's setup live as long as the process: frozen, they are
        # not traversed by every full collection (100 ms each, which paused every request), only what came after.
        gc.collect()
        gc.freeze()
        # The event loop gives up the GIL at every system call and waits for it to come back while the heavy
        # lane computes: by default up to 5 ms a time, hundreds of times in a busy turn. 1 ms cuts that wait.
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        try:
            while self._map:
                self.poll_once(self.adj.asyncore_loop_timeout)
        except (SystemExit, KeyboardInterrupt):
            self.task_dispatcher.shutdown()
        finally:
            self.epoll.close()

    def poll_once(self, timeout: float) -> None:
        with self.touched_lock:
            touched, self.touched = self.touched, set()
        for obj in (self, self.trigger, *touched):
            self._register(obj)
        for fd, flags in self.epoll.poll(timeout):
            obj = self._map.get(fd)
            if obj is None:
                continue
            if obj is not self and obj is not self.trigger:
                self.touch(obj)
                if flags & select.POLLIN and not obj.readable():
                    flags &= ~select.POLLIN
            wasyncore.readwrite(obj, flags)

    def _register(self, obj) -> None:
        """Keep obj's epoll registration what waitress's poll loop would ask for (nothing: not registered)."""
        fd = obj._fileno
        old = self.registered.get(fd)
        if fd is None or self._map.get(fd) is not obj:  # closed (the kernel left the epoll set with it)
            if old is not None and old[0] is obj:
                del self.registered[fd]
            return
        mask = (select.POLLIN | select.POLLPRI) if obj.readable() else 0
        if obj.writable() and not obj.accepting:
            mask |= select.POLLOUT
        if old is not None and old[0] is obj and old[1] == mask:
            return
        if old is not None and old[0] is obj:
            if mask:
                self.epoll.modify(fd, mask)
            else:
                self.epoll.unregister(fd)
        elif mask:
            try:
                self.epoll.register(fd, mask)
            except FileExistsError:  # a closed connection's registration on a reused number
                self.epoll.modify(fd, mask)
        if mask:
            self.registered[fd] = (obj, mask)
        else:
            self.registered.pop(fd, None)

    @property
    def port(self) -> int:
        return int(self.effective_port)


def open_file_budget(connections: int) -> int:
    """The connection limit that fits the process's open-file limit, raising its soft limit as far as allowed."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = connections + FD_RESERVE
    if soft != resource.RLIM_INFINITY and soft < want:
        new = want if hard == resource.RLIM_INFINITY else min(want, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
            soft = new
        except (ValueError, OSError):
            pass
    if soft != resource.RLIM_INFINITY and soft < want:
        log.warning("dlprofviewer: the open-file limit (%d) allows %d connections", soft, soft - FD_RESERVE)
        return max(1, soft - FD_RESERVE)
    return connections
