"""Ordered, bounded prefetch over a thread pool (the one used by every loader)."""
from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


def prefetch_map(fn: Callable[[T], R], items: Sequence[T], threads: int, depth: int,
                 name: str = "hpcbench-read") -> Iterator[R]:
    """Yield ``fn(item)`` in order, computing at most ``threads * depth`` items ahead. ``threads`` 0
    runs ``fn`` in the calling thread. The work should release the GIL (file reads, zlib, crc32c,
    h5py, numpy and torch kernels do); an exception is re-raised in order, pending work cancelled."""
    if threads <= 0:
        for it in items:
            yield fn(it)
        return
    ahead = max(1, threads * max(1, depth))
    with ThreadPoolExecutor(threads, thread_name_prefix=name) as pool:
        pending: deque[Future[R]] = deque(pool.submit(fn, it) for it in items[:ahead])
        rest = iter(items[ahead:])
        try:
            while pending:
                out = pending.popleft().result()
                nxt = next(rest, _END)
                if nxt is not _END:
                    pending.append(pool.submit(fn, nxt))  # type: ignore[arg-type]
                yield out
        finally:
            for fut in pending:
                fut.cancel()


_END = object()
