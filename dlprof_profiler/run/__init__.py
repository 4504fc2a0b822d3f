"""Runs: one profile, several ranks, a re-aggregation; which files `--database` names."""
