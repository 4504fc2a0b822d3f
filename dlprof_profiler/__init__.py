"""DLProf profiler: Nsight Systems traces correlated with deep-learning framework ops."""

__version__ = "2.0.0"
DB_SCHEMA_VERSION = "2.0.0"
