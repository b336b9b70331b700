"""The page cache of files we wrote: drop their clean pages, and measure how much of a file is cached.

Staging writes every file a run reads first; left in the page cache, those pages would make the first
epoch read memory, not the node-local disk, whatever the job's ``drop_caches`` did (or failed to do).
So each staged file is evicted once it is durable (``fsync`` first: only clean pages can be dropped).
:func:`resident_fraction` (``mincore(2)``) tells how much of a file is in memory, for tests and checks.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
from pathlib import Path


def evict(fd: int) -> None:
    """Drop the file's clean cached pages (``POSIX_FADV_DONTNEED``); call after ``fsync``. A no-op
    where the platform has no ``posix_fadvise``; the kernel may keep pages another process maps."""
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)


def evict_path(path: Path) -> None:
    """fsync and evict one file by name (files written by someone else, e.g. before a timed read)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        evict(fd)
    finally:
        os.close(fd)


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    libc = ctypes.CDLL(name, use_errno=True)
    if not all(hasattr(libc, f) for f in ("mincore", "mmap", "munmap")):
        return None
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.mmap.restype = ctypes.c_void_p
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    return libc


def resident_fraction(path: Path) -> float | None:
    """The fraction of ``path``'s pages in the page cache (``mincore(2)`` on a read-only mapping, which
    reads nothing); None where it cannot be told; 0.0 for an empty file."""
    libc = _libc()
    size = os.path.getsize(path)
    if libc is None:
        return None
    if size == 0:
        return 0.0
    pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            return None
        try:
            vec = (ctypes.c_ubyte * pages)()
            if libc.mincore(addr, size, vec) != 0:
                return None
            return sum(v & 1 for v in vec) / pages
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)
