"""Detect: expert-system detectors over an aggregation -> problems with recommendations.

The detectors live in `dlprof_profiler.experts` (one module per group); this module is the engine's entry
point. See docs/expert_systems.md for every detector's inputs, thresholds and texts.
"""

from __future__ import annotations

from dlprof_profiler.experts import DB_PLACEHOLDER, DETECTORS, detect, render_command

__all__ = ["detect", "DETECTORS", "DB_PLACEHOLDER", "render_command"]
