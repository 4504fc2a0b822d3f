"""`python -m dlprof_profiler.run.reaggregate --database FILE [--key_node K] [--iter_start N] [--iter_stop N]`:
append a new aggregation to a DLProf database in place (what the viewer's Reaggregate runs, in its own
process). Prints one JSON line: {"status": "succeeded", "aggr_id": N} or {"status": "failed", "message": ...}."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dlprof_profiler import log
from dlprof_profiler.errors import DLProfError
from dlprof_profiler.run.single import reaggregate_in_place


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dlprof_profiler.run.reaggregate")
    parser.add_argument("--database", required=True, type=Path)
    parser.add_argument("--key_node")
    parser.add_argument("--iter_start", type=int)
    parser.add_argument("--iter_stop", type=int)
    args = parser.parse_args(argv)
    log.set_verbosity(log.MINIMAL)

    try:
        aggr_id = reaggregate_in_place(args.database, args.key_node or None, args.iter_start, args.iter_stop)
    except DLProfError as exc:
        print(json.dumps({"status": "failed", "message": str(exc)}), flush=True)
        return exc.exit_code or 1
    except Exception as exc:  # reported to the viewer rather than lost in a traceback
        print(json.dumps({"status": "failed", "message": f"{type(exc).__name__}: {exc}"}), flush=True)
        return 1
    print(json.dumps({"status": "succeeded", "aggr_id": aggr_id}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
