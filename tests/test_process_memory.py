"""The in-memory analysis turns transparent huge pages off for its own process (process_memory.py)."""

import json
import subprocess
import sys

import pytest

# The setting is inherited: a test process that ran an analysis in process already has it off, so the probe
# turns it back on first.
PROBE = """
import ctypes, ctypes.util, json
from dlprof_profiler.process_memory import PR_SET_THP_DISABLE, avoid_huge_pages
ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").prctl(PR_SET_THP_DISABLE, 0, 0, 0, 0)
def thp():
    return [line.split()[1] for line in open('/proc/self/status') if line.startswith('THP_enabled')]
before = thp()
print(json.dumps([avoid_huge_pages(), before, thp()]))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a Linux process setting")
def test_huge_pages_off_for_the_process_after_the_call():
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True)
    turned_off, before, after = json.loads(done.stdout)
    assert turned_off is True
    if before:  # Linux 5.x and later report it in /proc/<pid>/status
        assert before == ["1"] and after == ["0"]
