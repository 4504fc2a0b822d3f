"""dlprof's startup hook for Python programs: this folder goes first on the profiled program's PYTHONPATH, so
its `sitecustomize.py` runs at interpreter start and acts when the program imports torch (see that file).

Two things can be asked of it, each by an environment variable holding JSON:

- `DLPROF_PYTORCH_INIT` (both backends, unless `--pytorch_init=false`): run `dlprof_profiler.pytorch.init()`
  with the given backend (`auto`: NVTX for Nsight Systems; `record_function`: torch.profiler), loading
  dlprof_profiler from `root` (the folder holding this installation's package: only the package itself
  becomes importable, not the site-packages around it, which could shadow the program's own packages);
- `DLPROF_TORCH_CAPTURE` (`--backend=torch`): start torch.profiler and write the trace (`capture/torch_profiler.py`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

HOOK_DIR = Path(__file__).resolve().parent
PACKAGE_ROOT = HOOK_DIR.parents[2]  # the folder dlprof_profiler is in (this folder is two below it)
INIT_ENV = "DLPROF_PYTORCH_INIT"  # read by sitecustomize.py (which cannot import dlprof_profiler)
CAPTURE_ENV = "DLPROF_TORCH_CAPTURE"


def init_config(backend: str) -> dict:
    """What the hook needs to run `dlprof_profiler.pytorch.init(backend=...)` in the profiled program."""
    return {"root": str(PACKAGE_ROOT), "backend": backend}


def environment(init: dict | None = None, capture: dict | None = None, base: dict | None = None) -> dict:
    """The environment of the profiled command: the hook folder first on PYTHONPATH and the hook's configs
    (none given: the environment unchanged, so the program runs exactly as without dlprof)."""
    env = dict(os.environ if base is None else base)
    if init is None and capture is None:
        return env
    rest = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = str(HOOK_DIR) + (os.pathsep + rest if rest else "")
    for name, config in ((INIT_ENV, init), (CAPTURE_ENV, capture)):
        if config is not None:
            env[name] = json.dumps(config)
        else:
            env.pop(name, None)
    return env
