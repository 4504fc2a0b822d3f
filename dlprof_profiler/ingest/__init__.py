"""Ingest: one adapter per raw format (nsys export, Nsight Systems report, Kineto JSON) to trace frames."""
