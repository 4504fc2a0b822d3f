"""Startup hook of `dlprof --backend=torch`: this folder goes on the profiled program's PYTHONPATH so that
its `sitecustomize.py` runs at interpreter start (see that file)."""
