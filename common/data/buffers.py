"""Reusable host batch buffers, so that a spec can read samples straight into their batch slots and
its CPU transform can write into a reused output.

Why: a fresh multi-MiB buffer per batch costs its page faults (the kernel zeroes every page on
first touch), about a third of the read rate at full CosmoFlow shapes (benchmarks/loader_limit.py).
Pinned buffers (training on a GPU) come from torch's caching host allocator, which recycles a block
only once the non-blocking copies that read it are done. Pageable buffers are recycled here: a
buffer goes back to the free list when the last tensor viewing it is gone (a ``weakref.finalize``
on the array the tensor holds), never while any batch tensor still uses it.
"""
from __future__ import annotations

import math
import threading
from collections.abc import Sequence
import weakref

import numpy as np
import torch


class HostBuffers:
    """Free lists of uint8 host buffers by size (at most ``keep`` free buffers per size)."""

    def __init__(self, keep: int = 8) -> None:
        self.keep = keep
        self._free: dict[int, list[np.ndarray]] = {}
        self._lock = threading.Lock()

    def take(self, nbytes: int, pinned: bool = False) -> tuple[np.ndarray, torch.Tensor]:
        """A buffer of ``nbytes`` as (numpy array, torch tensor on the same memory); contents undefined.
        Drop both when done: the memory is reused once every tensor made from the tensor is gone."""
        if pinned:
            t = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
            return t.numpy(), t
        with self._lock:
            free = self._free.get(nbytes)
            base = free.pop() if free else None
        if base is None:
            base = np.empty(nbytes, np.uint8)
        view = base[:]  # its own array object: the tensor keeps it alive, its end returns ``base``
        weakref.finalize(view, self._give_back, base)
        return view, torch.from_numpy(view)

    def _give_back(self, base: np.ndarray) -> None:
        with self._lock:
            free = self._free.setdefault(base.nbytes, [])
            if len(free) < self.keep:
                free.append(base)

    def output(self, shape: Sequence[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """An uninitialised tensor of ``shape`` and ``dtype`` for a batch transform to write into. On the
        host: a pooled buffer (see :meth:`take`), reused only once every tensor viewing it is gone, so a
        batch the loader still holds (``prefetch`` batches in flight) or the model still uses is never
        overwritten; a fresh output per batch costs its page faults (DeepCAM's 56 MiB normalized batch:
        32 ms fresh vs 16 ms into a reused output). On a device: ``torch.empty`` (its caching allocator
        already reuses memory)."""
        if device.type != "cpu":
            return torch.empty(tuple(shape), dtype=dtype, device=device)
        itemsize = torch.empty((), dtype=dtype).element_size()
        _, raw = self.take(math.prod(shape) * itemsize)
        return raw.view(dtype).view(tuple(shape))
