"""A helper process that decodes one part of a Kineto trace's events (`kineto_decode.decode_part`) and
sends what it decoded to its parent on standard output, one pickled message per chunk.

    python -m dlprof_profiler.ingest.kineto_part FILE START STOP CHUNK_BYTES RETRIES SIZE MTIME_NS

RETRIES is -1 for no bound.
"""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

from dlprof_profiler.ingest.kineto_decode import decode_part


def main(argv: list[str]) -> int:
    """Decode the part and send its messages; non-zero when it could not be decoded."""
    path, start, stop, chunk_bytes, retries, size, mtime_ns = argv
    bound = None if int(retries) < 0 else int(retries)
    out = sys.stdout.buffer
    try:
        messages = decode_part(Path(path), int(start), int(stop), int(chunk_bytes), bound, (int(size), int(mtime_ns)))
        for message in messages:
            pickle.dump(message, out, protocol=pickle.HIGHEST_PROTOCOL)
            if message[0] == "error":
                return 1
    except Exception as exc:  # the parent decodes this part itself, which reports any error
        pickle.dump(("error", f"{type(exc).__name__}: {exc}"), out, protocol=pickle.HIGHEST_PROTOCOL)
        return 1
    finally:
        out.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
