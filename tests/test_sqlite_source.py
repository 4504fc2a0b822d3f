"""Reading input SQLite files (ingest/sqlite_source.py): a Ctrl-C while ADBC reads on the main thread ends the
read, as anywhere else. ADBC's own SIGINT handling turned it into an error that passed for unreadable data (the
query was read again leniently) or lost it as a short call ended: the run went on."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest


@pytest.mark.parametrize("reader", ["record_batches", "int_columns", "many_short_reads"])
def test_ctrl_c_during_an_adbc_read_interrupts_it(tmp_path, reader):
    """SIGINT arrives while the main thread waits in ADBC's execute of a slow query (a three-way cross join):
    the read raises KeyboardInterrupt (before the fix it printed "finished": the error ADBC raised for the
    cancel passed for undecodable text and the query ran again through the sqlite3 module). Or it arrives
    among many short reads, where ADBC lost it."""
    db = tmp_path / "slow.sqlite"
    script = textwrap.dedent(f"""
        import os, signal, sqlite3, threading
        import pyarrow as pa
        from dlprof_profiler.ingest.sqlite_source import SqliteSource

        con = sqlite3.connect({str(db)!r})
        con.execute("CREATE TABLE t (x INTEGER)")
        con.executemany("INSERT INTO t VALUES (?)", [(i,) for i in range(1000)])
        con.commit()
        con.close()
        src = SqliteSource({str(db)!r})
        # 6·10^7 rows counted: about 1.5 s, which SQLite's ADBC driver cannot cancel (it runs on after the signal)
        query = "SELECT count(*) FROM t a, t b, (SELECT x FROM t LIMIT 60) c"
        started = threading.Event()
        threading.Thread(target=lambda: (started.wait(), __import__("time").sleep(0.6),
                                         os.kill(os.getpid(), signal.SIGINT)), daemon=True).start()
        try:
            started.set()
            if {reader!r} == "record_batches":
                list(src.record_batches(query, pa.schema([("n", pa.int64())])))
            elif {reader!r} == "many_short_reads":  # the signal arrives as one ends: it must not be lost
                for _ in range(200_000):
                    src.int_columns("SELECT count(*) FROM t", ["n"])
            else:
                src.int_columns(query, ["n"])
            print("finished")
        except KeyboardInterrupt:
            print("interrupted")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "interrupted", done.stderr[-2000:]
