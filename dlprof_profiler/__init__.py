"""DLProf profiler: Nsight Systems traces correlated with deep-learning framework ops."""

from dlprof_profiler.contract import DB_SCHEMA_VERSION  # noqa: F401 - the database schema this version writes

__version__ = "2.0.0"
