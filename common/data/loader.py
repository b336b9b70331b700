"""The one prefetching loader: a sampler's index batches, read and collated by GIL-releasing
threads into a bounded queue, pinned and copied to the device without blocking.

``transform`` (the spec's torch batch transform) runs in the reader thread on the CPU and after the
non-blocking copy on a GPU, so what crosses the bus is the storage dtype (e.g. int16 counts).
"""
from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from common.step import prepare_batch, tree_map

from .prefetch import prefetch_map
from .sampler import EpochSampler
from .spec import DatasetSpec, SampleSource


def reader_threads(configured: int, device: torch.device | None) -> int:
    """Reader threads for ``data.threads`` (-1 = auto). Auto: none when training on the CPU (the step
    already uses every core, and reader threads take cores and the GIL from it: measured 0.41x on
    OC20 mini and 0.66x on CosmoFlow mini with 2 threads on 2 cores, benchmarks/data_layer.py); up
    to 4 on a GPU, where the host cores are otherwise idle; up to 4 for set-up work (``device`` None,
    e.g. preloading a split)."""
    if configured >= 0:
        return configured
    if device is not None and device.type == "cpu":
        return 0
    return max(1, min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))


def pin(batch: Any) -> Any:
    """Page-locked copy of a host batch (objects with their own ``pin_memory`` pin themselves)."""
    if hasattr(batch, "pin_memory") and not isinstance(batch, (torch.Tensor, dict, list, tuple)):
        return batch.pin_memory()
    return tree_map(lambda t: t.pin_memory(), batch)


class Loader:
    """An :class:`~common.workload.EpochLoader` over one split for one rank."""

    def __init__(self, spec: DatasetSpec, source: SampleSource, sampler: EpochSampler, device: torch.device,
                 threads: int = 2, prefetch: int = 2) -> None:
        self.spec, self.source, self.sampler, self.device = spec, source, sampler, device
        self.threads, self.prefetch = threads, prefetch
        self.cuda = device.type == "cuda"

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.sampler)

    def read(self, idx: Sequence[int]) -> Any:
        """One host batch: validated samples, collated (pinned on a GPU, transformed on the CPU)."""
        batch = self.spec.read_batch(self.source, idx, pin=self.cuda)
        return pin(batch) if self.cuda else self.spec.transform(batch)

    def __iter__(self) -> Iterator[Any]:
        for host in prefetch_map(self.read, self.sampler.batches(), self.threads, self.prefetch):
            yield self.spec.transform(prepare_batch(host, self.device, channels_last=False)) if self.cuda else host
