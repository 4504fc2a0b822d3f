"""How the analysing process holds memory: no transparent huge pages for the in-memory analysis, freed memory
handed back to the system between the stages of an out-of-core analysis.

The in-memory analysis allocates and frees arrays of tens to hundreds of MB many times over. With transparent huge
pages (the kernel's `always` setting, and numpy asks for them on large arrays under `madvise`), every fresh
array faults in 2 MB pages, and when the machine's free memory is fragmented the kernel compacts memory to
find them: at 10^6 kernels that was 1.5-2 s of system time (three paired runs: 4.7-5.1 s with them, 3.1-3.3
s without; user time +0.3 s; wall 0.5-1.2 s shorter). The process keeps using ordinary 4 KB pages.

An out-of-core analysis works a part of the profile at a time, but the allocators keep what it frees for
reuse: Arrow's (mimalloc) and glibc's malloc (one arena per thread). After staging 3·10^6 kernels on four
threads, 0.8 GB of the process's 1.0 GB was such free memory. Handing it back between stages keeps the peak
the size of the largest stage's work. Once the export is read, through the analysis (classification, while a
thread still stages the API calls and GPU activities, then correlation one time segment after another, then
aggregation one chunk after another: work of about the same shape each time) glibc's heap is kept instead, as
in memory below: trimmed after every segment, the main thread faulted the same pages in again (at 10^7
kernels 2.7 million page faults and 20-24 s of system time on it; kept, 0.9-1.0 million and 12-13 s). With
segments of 10^6 events instead of 2·10^6, the peak stays near 2 GB.

The in-memory analysis does the opposite with glibc's malloc: it keeps what it frees (up to 32 MB a block) for
reuse instead of handing each block back and faulting fresh pages in for the next (`reuse_freed_memory`). At
10^6 kernels that halved the page faults (1.3 -> 0.7 million) and the system time (5.0 -> 3.3 s) for 0.2 GB
more at the peak; at 1.5·10^6 kernels, the largest profile analysed in memory by default, 3.51 GB against
3.46 GB, 24.4 s against 26.3 s.

The stages of an analysis ask for freed memory to be handed back (`release_unused_memory`) where a large
profile needs it to stay within its memory bound: a Kineto trace is analysed in memory at any size. An nsys
export analysed in memory is bounded by the engine choice instead, and trimming glibc's heap there only
made the next stage fault the same pages in again: at 10^6 kernels (3·10^6 ranges, above correlation's
threshold) 0.3 million of its 1.0 million page faults, 0.5-1 s of CPU, for about 0.1 GB less at the peak. Such
an analysis runs inside `freed_memory_kept()`, where the trim is skipped (Arrow's pool is still emptied: it
cost nothing measurable)."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys
from contextlib import contextmanager
from pathlib import Path

PR_SET_THP_DISABLE = 41  # linux/prctl.h, Linux 3.15+
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # malloc.h
REUSED_BLOCK = 32 << 20  # glibc's largest mmap threshold on 64-bit: larger blocks are always mapped apart

# inside freed_memory_kept(): glibc's heap is not trimmed (a process-wide setting, as the allocators' are)
_heap_kept = False


@functools.cache
def _libc():
    """The C library, looked up once (find_library runs ldconfig: milliseconds, and this is called per batch)."""
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def avoid_huge_pages() -> bool:
    """Turn transparent huge pages off for this process and the processes it starts from now on; False where
    that is not possible (not Linux, or the call is refused): nothing changes then."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return _libc().prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def release_unused_memory() -> None:
    """Hand the memory the allocators keep after frees back to the system (Arrow's pool; glibc's malloc_trim
    on Linux)."""
    import pyarrow as pa

    pa.default_memory_pool().release_unused()
    if sys.platform.startswith("linux") and not _heap_kept:
        try:
            _libc().malloc_trim(0)
        except (OSError, AttributeError):  # not glibc: nothing to trim
            pass


def reuse_freed_memory() -> bool:
    """Keep glibc's freed blocks of up to 32 MB in the heap for reuse, never trimming its top (see the module
    docstring); False where that is not possible (not glibc)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = _libc()
        # a fixed threshold (glibc's own adapts, and trims the heap's top above twice it)
        return bool(libc.mallopt(M_MMAP_THRESHOLD, REUSED_BLOCK)) and bool(libc.mallopt(M_TRIM_THRESHOLD, 0x7FFFFFFF))
    except (OSError, AttributeError):
        return False


def heap_kept() -> bool:
    """Whether `release_unused_memory` leaves glibc's heap untrimmed now (inside `freed_memory_kept`)."""
    return _heap_kept


@contextmanager
def freed_memory_kept(keep: bool = True):
    """Inside: `release_unused_memory` leaves glibc's heap untrimmed when `keep` (see the module docstring)."""
    global _heap_kept
    before, _heap_kept = _heap_kept, bool(keep) or _heap_kept
    try:
        yield
    finally:
        _heap_kept = before


def available_memory() -> int | None:
    """The memory this process can still have, in bytes: the machine's available memory, and the cgroup's
    limit less its usage; None where neither is known."""
    found = []
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    found.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    for limit, usage in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"),
    ):
        try:
            found.append(int(Path(limit).read_text()) - int(Path(usage).read_text()))
            break
        except (OSError, ValueError):  # no such cgroup file, or "max"
            continue
    return min(found) if found else None
