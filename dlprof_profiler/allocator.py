"""The allocators' policy for an in-memory analysis: freed large blocks are kept for reuse, not handed
back to the kernel (glibc's heap, which Arrow's buffers then come from too).

The analysis allocates and frees arrays of hundreds of MB many times over. By default glibc serves each
from a fresh mmap and unmaps it when freed, so every new array faults in (and the kernel zeroes) its pages
again; Arrow's mimalloc pool did the same. At 10^6 kernels that was about 2.5 s of system time. With the
thresholds raised, freed blocks go back to the heap and the next array reuses them; the peak resident
memory stays that of the largest working set (it was even a little lower), as it is never lower than the
live arrays anyway.
"""
from __future__ import annotations

import ctypes
import ctypes.util

import pyarrow as pa

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3     # glibc mallopt parameters
KEEP_BYTES = (1 << 31) - 1                       # mallopt takes an int: the largest it accepts


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds (process-wide) and let Arrow allocate through them too; False
    where the C library is not glibc (nothing is changed then)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    if not (mallopt(M_MMAP_THRESHOLD, 1 << 30) and mallopt(M_TRIM_THRESHOLD, KEEP_BYTES)):
        return False
    # Arrow's own allocator (mimalloc or jemalloc) hands freed pages back on its own schedule: the same
    # faulting-in again. Its buffers come from the C heap as well from now on.
    pa.set_memory_pool(pa.system_memory_pool())
    return True
