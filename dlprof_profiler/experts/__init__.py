"""Expert-system detectors, one module per group; `detect` runs them all over one aggregation of one domain.

Each detector documents its inputs and thresholds in its docstring and module constants (and in
docs/expert_systems.md). Findings are dicts: id, severity (error | warning | info), problem (with the figures
that triggered it), recommendation, link (https), action (None or a dict the viewer/CLI can apply), data.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from dlprof_profiler import log
from dlprof_profiler.experts.base import Context
from dlprof_profiler.experts.framework import (
    batch_size_detector,
    cudnn_benchmark_detector,
    emit_nvtx_detector,
    slow_api_detector,
)
from dlprof_profiler.experts.gaps import gpu_gap_detector
from dlprof_profiler.experts.launches import short_kernels_detector
from dlprof_profiler.experts.iterations import bad_iteration_range_detector, no_iterations_detector
from dlprof_profiler.experts.missed_tensor_cores import missed_tensor_cores_detector
from dlprof_profiler.experts.tensor_cores import amp_detector, bad_tensor_shape_detector
from dlprof_profiler.experts.transfers import pageable_memcpy_detector, sync_api_detector, sync_memcpy_detector
from dlprof_profiler.experts.utilization import (
    dataloader_detector,
    imbalanced_gpus_detector,
    no_fusion_detector,
    underutilized_gpu_detector,
)

# Run order = order of the findings (the viewer sorts by severity, then by this order).
DETECTORS = {
    "no_iterations_detector": no_iterations_detector,
    "bad_iteration_range_detector": bad_iteration_range_detector,
    "slow_api_detector": slow_api_detector,
    "underutilized_gpu_detector": underutilized_gpu_detector,
    "imbalanced_gpus_detector": imbalanced_gpus_detector,
    "gpu_gap_detector": gpu_gap_detector,
    "dataloader_detector": dataloader_detector,
    "amp_detector": amp_detector,
    "bad_tensor_shape_detector": bad_tensor_shape_detector,
    "missed_tensor_cores_detector": missed_tensor_cores_detector,
    "no_fusion_detector": no_fusion_detector,
    "short_kernels_detector": short_kernels_detector,
    "cudnn_benchmark_detector": cudnn_benchmark_detector,
    "emit_nvtx_detector": emit_nvtx_detector,
    "batch_size_detector": batch_size_detector,
    "pageable_memcpy_detector": pageable_memcpy_detector,
    "sync_memcpy_detector": sync_memcpy_detector,
    "sync_api_detector": sync_api_detector,
}

DB_PLACEHOLDER = "<db>"


def detect(trace, corr, dm, agg, iterations, strict: bool = False, only=None, data=None) -> list[dict]:
    """Findings for one aggregation of one domain. A detector that fails is reported as a warning and
    skipped (the analysis goes on), unless `strict`. `only`: ids of the detectors to run (default all);
    `data`: the detectors' reads (experts/data.py; default: from the in-memory trace)."""
    ctx = Context(trace, corr, dm, agg, iterations, data)
    findings = []
    for exp_sys_id, detector in DETECTORS.items():
        if only is not None and exp_sys_id not in only:
            continue
        try:
            findings += detector(ctx)
        except Exception as exc:  # noqa: BLE001 - one broken rule must not cost the user the whole analysis
            if strict:
                raise
            log.warning(f"expert system {exp_sys_id} failed on domain '{dm.domain}': {type(exc).__name__}: {exc}")
    where = f" (domain '{dm.domain}')" if len(corr.domains) > 1 else ""
    for exp_sys_id, fact in ctx.silent:
        log.detail(f"Expert systems{where}: {exp_sys_id} stayed silent: unknown {fact}")
    return findings


_DATABASE_NAME = re.compile(r"(?P<base>.+)_dldb\.sqlite")


def render_command(
    action: dict | None, database, profile_name: str | None = None, options: tuple | list = ()
) -> str | None:
    """The CLI command of a finding's action, for the run whose DLProf database is `database`: `<db>` becomes
    its path, followed by `--output_path=<the database's folder>` (and `--base_name`, `--profile_name` when
    the run used other names than the defaults), so the command updates that run (the database gains the new
    aggregation, the TensorBoard run shows it) instead of writing into the current folder. Updating replaces
    the run's reports and event file, hence `--force=true`; `options` (`--reports=...` of the run) follow.
    Paths and options are quoted for the shell."""
    if not action or not action.get("command"):
        return None
    path = Path(database)
    parts = [f"--database={shlex.quote(str(path))}", f"--output_path={shlex.quote(str(path.parent))}"]
    named = _DATABASE_NAME.fullmatch(path.name)
    if named:
        base = named.group("base")
        if base != "dlprof":
            parts.append(f"--base_name={shlex.quote(base)}")
        if profile_name and profile_name != base:
            parts.append(f"--profile_name={shlex.quote(profile_name)}")
        parts.append("--force=true")
    parts += [shlex.quote(str(o)) for o in options]
    return action["command"].replace(f"--database={DB_PLACEHOLDER}", " ".join(parts))
