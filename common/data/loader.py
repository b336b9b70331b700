"""The one prefetching loader: a sampler's index batches, read and collated by GIL-releasing
threads into a bounded queue, pinned and copied to the device without blocking.

``transform`` (the spec's torch batch transform) runs in the reader thread on the CPU and after the
non-blocking copy on a GPU, so what crosses the bus is the storage dtype (e.g. int16 counts).

With ``data.cache`` (:mod:`hpcbench.common.data.cache`) the samples a batch needs that are not cached yet are
read as above and stored; every batch is then gathered from the cache and transformed the same way
(on the CPU, a spec may transform straight from the cache's rows instead: ``transform_rows``), so cached
and uncached epochs give bit-identical batches.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, ClassVar

import numpy as np
import torch

from hpcbench.common.step import prepare_batch, tree_map
from hpcbench.common.system import usable_cores

from .cache import BatchCache, SampleCache, build_cache
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
    return max(1, min(4, usable_cores()))


def pin(batch: Any) -> Any:
    """Page-locked copy of a host batch (objects with their own ``pin_memory`` pin themselves)."""
    if hasattr(batch, "pin_memory") and not isinstance(batch, (torch.Tensor, dict, list, tuple)):
        return batch.pin_memory()
    return tree_map(lambda t: t.pin_memory(), batch)


class Loader:
    """An :class:`~common.workload.EpochLoader` over one split for one rank."""

    samples_only: ClassVar[bool] = False  # consumes validated samples, not collated batches (DALI)

    def __init__(self, spec: DatasetSpec, source: SampleSource, sampler: EpochSampler, device: torch.device,
                 threads: int = 2, prefetch: int = 2, cache: str = "none", host_ranks: int = 1) -> None:
        self.spec, self.source, self.sampler, self.device = spec, source, sampler, device
        self.threads, self.prefetch = threads, prefetch
        self.cuda = device.type == "cuda"
        what = f"the {'training' if sampler.train else 'evaluation'} loader of {type(spec).__name__}"
        self.cache = build_cache(cache, spec, source, sampler, device, host_ranks, self.samples_only, what,
                                 in_flight=max(1, threads) * prefetch + 2)
        if isinstance(self.cache, SampleCache):
            self.source = self.cache  # samples kept in host memory, collated (or fed to DALI) again

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.sampler)

    def read(self, idx: Sequence[int]) -> Any:
        """One host batch: validated samples, collated (pinned on a GPU, transformed on the CPU)."""
        batch = self.spec.read_batch(self.source, idx, pin=self.cuda)
        return pin(batch) if self.cuda else self.spec.transform(batch)

    def __iter__(self) -> Iterator[Any]:
        if isinstance(self.cache, BatchCache):
            yield from self._cached(self.cache)
            return
        for host in prefetch_map(self.read, self.sampler.batches(), self.threads, self.prefetch):
            yield self.spec.transform(prepare_batch(host, self.device, channels_last=False)) if self.cuda else host

    def _cached(self, cache: BatchCache) -> Iterator[Any]:
        """Batches gathered from the cache; samples not cached yet are read, collated and stored
        first (in the reader threads for a host cache, by this thread for a device cache)."""
        batches = self.sampler.batches()
        if not batches:
            return
        on_device = cache.device.type != "cpu"
        bounds = np.cumsum([0] + [len(b) for b in batches])
        slots = torch.from_numpy(cache.slots(np.concatenate(batches)))
        if on_device:
            slots = slots.to(cache.device)  # the epoch's order crosses the bus once, as indices

        def read(k: int) -> tuple[np.ndarray, Any]:
            idx = batches[k]
            new = cache.missing(idx)
            host = self.spec.read_batch(self.source, new, pin=self.cuda) if new.size else None
            if on_device:
                return new, (pin(host) if host is not None and self.cuda else host)
            if host is not None:
                cache.put(new, host)
            if new.size == len(idx):  # read whole (the first epoch): the collated batch is the batch
                batch = pin(host) if self.cuda else host
            else:
                rows = slots[bounds[k]:bounds[k + 1]]
                if not self.cuda:  # transformed straight from the cache's rows where the spec offers it
                    done = self.spec.transform_rows(cache.stored(), rows.numpy())
                    if done is not None:
                        return new, done
                batch = cache.take(rows, pinned_out=self.cuda)
            return new, (batch if self.cuda else self.spec.transform(batch))

        # threads only while reads are left (a complete device cache needs no host work at all)
        threads = 0 if on_device and cache.complete() else self.threads
        for k, (new, got) in enumerate(prefetch_map(read, range(len(batches)), threads, self.prefetch)):
            if on_device:
                fresh = prepare_batch(got, cache.device, channels_last=False) if new.size else None
                if fresh is not None:
                    cache.put(new, fresh)  # a copy: an in-place transform of ``fresh`` leaves it alone
                whole = fresh is not None and new.size == bounds[k + 1] - bounds[k]
                yield self.spec.transform(fresh if whole else cache.take(slots[bounds[k]:bounds[k + 1]]))
            elif self.cuda:
                yield self.spec.transform(prepare_batch(got, self.device, channels_last=False))
            else:
                yield got
