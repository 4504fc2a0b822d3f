"""Command line: `dlprof` options parsed into run options, and the dispatch to a run."""
