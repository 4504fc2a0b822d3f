"""A DLProf database writer fed from the trace frames (not from an nsys SQLite file), for inputs that have
no SQLite file to copy from: Kineto traces.

Temporary: the database writer on main is being rebuilt to read the frames for every input; once it
lands this module goes away and Kineto traces use that writer.
"""
from __future__ import annotations

import sqlite3

import numpy as np

from dlprof_profiler import DB_SCHEMA_VERSION, __version__
from dlprof_profiler.database import SCHEMA, DatabaseWriter, _insert, _text, bulk_insert
from dlprof_profiler.trace import API_COLUMNS, GPU_COLUMNS


class FramesDatabaseWriter(DatabaseWriter):
    """DatabaseWriter whose raw tables (ranges, API calls, GPU activities) come from trace frames."""

    def _copy_raw(self) -> None:
        trace = self.trace
        try:
            con = sqlite3.connect(self.path)
            try:
                con.execute("PRAGMA journal_mode=OFF")
                con.execute("PRAGMA synchronous=OFF")
                con.executescript(SCHEMA)
                con.execute("BEGIN")
                con.execute("INSERT INTO db_version VALUES (?, ?, ?)",
                            (DB_SCHEMA_VERSION, DB_SCHEMA_VERSION, f"dlprof {__version__}"))
                system = dict(trace.system)
                system.update({f"nsys:{k}": v for k, v in trace.meta.items()})
                con.executemany("INSERT INTO read_only_system_config VALUES (?, ?)",
                                [(str(k), _text(v)) for k, v in system.items()])
                _insert(con, "read_only_gpu_infos", trace.devices, list(trace.devices.columns))
                _insert(con, "read_only_processes", trace.processes, ["pid", "name"])
                _insert(con, "read_only_threads", trace.threads, ["global_tid", "pid", "tid", "name"])
                _insert(con, "read_only_cuda_syncs", trace.syncs, list(trace.syncs.columns))
                _insert(con, "read_only_io_calls", trace.io_calls, ["start", "end", "global_tid", "pid", "name"])
                con.execute("COMMIT")
            finally:
                con.close()
            ranges = trace.ranges
            bulk_insert(self.path, "read_only_ranges", {
                "range_id": ranges["range_id"].to_numpy(np.int64),
                "domain_id": ranges["domain"].map(self.domain_ids).fillna(-1).to_numpy(np.int64),
                "text": ranges["text"].to_numpy(dtype=object), "start": ranges["start"].to_numpy(np.int64),
                "end": ranges["end"].to_numpy(np.int64), "global_tid": ranges["global_tid"].to_numpy(np.int64),
                "pid": ranges["pid"].to_numpy(np.int64), "event_type": ranges["event_type"].to_numpy(np.int64),
                "unclosed": ranges["unclosed"].to_numpy().astype(np.int64)})
            bulk_insert(self.path, "read_only_cuda_calls", _columns(trace.api_calls, API_COLUMNS, ("name",)))
            bulk_insert(self.path, "read_only_gpu_activities",
                        _columns(trace.gpu, GPU_COLUMNS, ("name", "long_name")))
        except BaseException as exc:  # re-raised in finish() on the main thread
            self._error = exc


def _columns(frame, columns, texts) -> dict:
    return {c: (frame[c].astype(object).to_numpy(dtype=object) if c in texts else frame[c].to_numpy(np.int64))
            for c in columns}
