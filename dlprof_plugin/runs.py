"""Which runs have a DLProf profile, and where their databases are.

Runs come only from the data provider (TensorBoard) or from the viewer's command line; a request names a
run and gets that run's entry or 404, so no file path is ever built from request text. A run's database
path (relative to the run directory, from the event file's `dlprof/profile` summary) must resolve, symlinks
followed, to a file inside the logdir.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import dataclass, field

from dlprof_profiler.contract import PLUGIN_NAME, PROFILE_TAG
from dlprof_profiler.outputs.publish import publication_pending

CACHE_SECONDS = 5.0  # how long a run listing is reused
MISS_REFRESH_S = 1.0  # an unknown run triggers a refresh at most this often

log = logging.getLogger("dlprof_plugin")


@dataclass
class RunInfo:
    run: str
    database: str  # real path of the database file
    shown_database: str  # path shown to users (relative to the logdir)
    meta: dict = field(default_factory=dict)


def inside(path: str, root: str) -> bool:
    try:
        return os.path.commonpath([path, root]) == root
    except ValueError:  # different drives
        return False


def resolve_database(root: str, run: str, relative) -> str | None:
    """Real path of a run's database, or None if it is missing or resolves outside `root` (a real path)."""
    if not isinstance(relative, str) or not relative or "\x00" in relative:
        return None
    run_dir = root if run in ("", ".") else os.path.join(root, run)
    candidate = os.path.realpath(os.path.join(run_dir, relative))
    if not inside(candidate, root) or not os.path.isfile(candidate):
        return None
    return candidate


def half_published(database: str) -> bool:
    """A run whose outputs are being put in place, or were when dlprof was killed (until the next run into its
    folder completes them): its database and reports may not be one set yet, so the run is not shown."""
    return publication_pending(os.path.dirname(database))


def parse_metadata(raw) -> dict | None:
    if raw is None:
        return None
    if hasattr(raw, "tolist"):  # numpy array (a scalar string tensor)
        raw = raw.tolist()
        while isinstance(raw, list) and raw:
            raw = raw[-1]
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8", "replace")
    if not isinstance(raw, str) or not raw.strip():
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


class ProviderRuns:
    """Runs of a TensorBoard data provider (the Rust data server or the multiplexer): list_tensors for the
    runs having the `dlprof/profile` tag, read_tensors for the metadata (its plugin content as fallback)."""

    def __init__(self, data_provider, logdir: str | None):
        self._provider = data_provider
        self.root = None
        if logdir and "://" not in logdir and os.path.isdir(logdir):
            self.root = os.path.realpath(logdir)
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[float, dict]] = {}

    def available(self) -> bool:
        return self._provider is not None and self.root is not None

    def _fetch(self, ctx, eid: str) -> dict[str, RunInfo]:
        from tensorboard.data import provider as prov

        if not self.available():
            return {}
        flt = prov.RunTagFilter(tags=[PROFILE_TAG])
        listing = self._provider.list_tensors(ctx, experiment_id=eid, plugin_name=PLUGIN_NAME, run_tag_filter=flt)
        if not listing:
            return {}
        values = {}
        try:
            data = self._provider.read_tensors(
                ctx, experiment_id=eid, plugin_name=PLUGIN_NAME, downsample=100, run_tag_filter=flt
            )
            for run, tags in (data or {}).items():
                datums = tags.get(PROFILE_TAG) or []
                if datums:
                    latest = max(datums, key=lambda d: (d.step, d.wall_time))
                    values[run] = parse_metadata(latest.numpy)
        except Exception as exc:  # noqa: BLE001 - fall back to the summary metadata
            log.warning("dlprof: read_tensors failed (%s); using the summary metadata", exc)
        runs = {}
        for run, tags in listing.items():
            series = tags.get(PROFILE_TAG)
            meta = values.get(run) or (parse_metadata(series.plugin_content) if series is not None else None)
            if not meta:
                continue
            path = resolve_database(self.root, run, meta.get("database"))
            if path is None:
                log.warning(
                    "dlprof: run %r: database %r is missing or outside the logdir; skipped", run, meta.get("database")
                )
                continue
            if half_published(path):
                log.debug("dlprof: run %r: its outputs are being put in place; hidden until they all are", run)
                continue
            runs[run] = RunInfo(run=run, database=path, shown_database=os.path.relpath(path, self.root), meta=meta)
        return runs

    def runs(self, ctx, eid: str, max_age: float = CACHE_SECONDS) -> dict[str, RunInfo]:
        now = time.monotonic()
        with self._lock:
            hit = self._cache.get(eid)
        if hit and now - hit[0] < max_age:
            return hit[1]
        runs = self._fetch(ctx, eid)
        with self._lock:
            self._cache[eid] = (time.monotonic(), runs)
        return runs

    def lookup(self, ctx, eid: str, run: str) -> RunInfo | None:
        runs = self.runs(ctx, eid)
        if run not in runs:
            runs = self.runs(ctx, eid, max_age=MISS_REFRESH_S)
        return runs.get(run)


class StaticRuns:
    """The viewer's runs: fixed at start (each hidden while its outputs are being put in place)."""

    def __init__(self, runs: dict[str, RunInfo]):
        self._runs = runs

    def runs(self, ctx=None, eid: str = "", max_age: float = 0) -> dict[str, RunInfo]:
        return {name: info for name, info in self._runs.items() if not half_published(info.database)}

    def lookup(self, ctx, eid: str, run: str) -> RunInfo | None:
        info = self._runs.get(run)
        return None if info is None or half_published(info.database) else info
