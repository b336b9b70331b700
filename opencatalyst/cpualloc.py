"""Keep freed large CPU tensors in the process heap instead of returning them to the kernel.

glibc serves allocations above its mmap threshold (at most 32 MiB, dynamic) with fresh mmap()s and
unmaps them on free, so every large temporary of a training step (the [triplets, 64] tensors of
DimeNet++ are 20-90 MB) is page-faulted in and zeroed by the kernel again. Raising the mmap and trim
thresholds makes glibc reuse those pages; the same effect as MALLOC_MMAP_THRESHOLD_ /
MALLOC_TRIM_THRESHOLD_ / MALLOC_TOP_PAD_ in the environment, but settable from inside the process.
"""
from __future__ import annotations

import ctypes
import ctypes.util

_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3


def keep_freed_memory(mmap_threshold: int = 1 << 30, top_pad: int = 256 << 20) -> bool:
    """Tune glibc malloc for big, short-lived tensors; True when applied (False: not glibc)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    ok = mallopt(_M_MMAP_THRESHOLD, min(mmap_threshold, (1 << 31) - 1))
    ok &= mallopt(_M_TRIM_THRESHOLD, (1 << 31) - 1)
    ok &= mallopt(_M_TOP_PAD, top_pad)
    return bool(ok)
