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


# A 20 MB block allocated, touched and freed twice in a fresh process. glibc maps the first apart (above its
# initial 128 KB threshold) and the second, after raising the threshold, from a heap top it has not touched
# yet: both fault their pages in. With reuse_freed_memory the first comes from the heap and the second reuses
# its pages: next to no faults.
REUSE_PROBE = """
import ctypes, ctypes.util, json, resource, sys
from dlprof_profiler.process_memory import reuse_freed_memory
libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
size = 20 << 20
done = reuse_freed_memory() if sys.argv[1] == "reuse" else None
faults = []
for _ in range(2):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    block = libc.malloc(size)
    ctypes.memset(block, 1, size)
    libc.free(block)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps([done, faults]))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_freed_blocks_are_reused_after_the_call():
    def probe(mode):
        done = subprocess.run([sys.executable, "-c", REUSE_PROBE, mode], capture_output=True, text=True, check=True)
        return json.loads(done.stdout)

    pages = (20 << 20) // 4096
    _, default_faults = probe("default")
    assert default_faults[1] > pages // 2  # glibc's own setting: the second block faults its pages in again
    done, reuse_faults = probe("reuse")
    assert done is True
    assert reuse_faults[0] > pages // 2  # the first block is new memory either way
    assert reuse_faults[1] < pages // 20  # the second reuses the first's pages


# 64 MB in 1 MB blocks (below the mmap threshold: in the heap), touched and freed, then a stage asks for freed
# memory back. The heap's pages go back to the system unless the analysis keeps what it frees.
KEEP_PROBE = """
import ctypes, ctypes.util, json, os, sys
import pyarrow  # (imported by release_unused_memory: before the measurement)
from dlprof_profiler.process_memory import freed_memory_kept, release_unused_memory, reuse_freed_memory
libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
def resident():
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
reuse_freed_memory()
blocks = [libc.malloc(1 << 20) for _ in range(64)]
for b in blocks:
    ctypes.memset(b, 1, 1 << 20)
for b in blocks:
    libc.free(b)
held = resident()
with freed_memory_kept(sys.argv[1] == "keep"):
    release_unused_memory()
print(json.dumps(held - resident()))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_a_bounded_analysis_keeps_its_freed_memory_when_a_stage_asks_for_it_back():
    def handed_back(mode):
        done = subprocess.run([sys.executable, "-c", KEEP_PROBE, mode], capture_output=True, text=True, check=True)
        return json.loads(done.stdout)

    assert handed_back("release") > 48 << 20  # the trim hands the freed heap back
    assert handed_back("keep") < 8 << 20  # kept for the next stage's allocations
