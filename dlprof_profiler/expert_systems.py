"""Detect: expert-system detectors over an aggregation -> problems with recommendations."""
from __future__ import annotations


def detect(trace, corr, dm, agg, iterations) -> list[dict]:
    """Findings for one aggregation of one domain (dicts: id, severity, problem, recommendation, link, action)."""
    findings = []
    if not iterations.found:
        key = iterations.key_node or ""
        findings.append({
            "id": "no_iterations_detector", "severity": "warning",
            "problem": f"Unable to split profile into training iterations: key op {key} not found",
            "recommendation": "Specify key op by setting the --key_node argument",
            "link": "", "action": None, "data": {"key_node": key}})
    return findings
