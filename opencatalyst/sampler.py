"""Load-balanced partition of each global batch across an instance's ranks.

Every rank draws the same global batch order from (seed, epoch) and splits each global batch by
greedy longest-processing-time on a per-sample cost (edges or triplets from the metadata):
largest sample first, each to the rank with the smallest load so far. The result is the same on
every rank, so no communication is needed; ranks get different sample counts but similar work.
"""
from __future__ import annotations

import heapq
from collections.abc import Iterator, Sequence

import numpy as np


def lpt_partition(costs: Sequence[float] | np.ndarray, parts: int) -> list[list[int]]:
    """Indices into ``costs`` split into ``parts`` lists by greedy LPT (deterministic ties)."""
    costs = np.asarray(costs, dtype=np.float64)
    order = np.lexsort((np.arange(costs.size), -costs))  # descending cost, then index
    heap = [(0.0, r) for r in range(parts)]  # (load, rank): ties go to the lowest rank
    out: list[list[int]] = [[] for _ in range(parts)]
    for idx in order:
        load, r = heapq.heappop(heap)
        out[r].append(int(idx))
        heapq.heappush(heap, (load + float(costs[idx]), r))
    return out


class BalancedBatchSampler:
    """Per-rank index lists, one per step; ``balanced=False`` gives the plain strided split
    (rank r takes positions r, r+R, ... of each global batch), the usual distributed sampler."""

    def __init__(self, costs: np.ndarray, global_batch: int, rank: int, world: int, seed: int,
                 shuffle: bool = True, drop_last: bool = True, balanced: bool = True) -> None:
        if global_batch < world:
            raise ValueError(f"global batch {global_batch} is smaller than the {world} ranks of the instance")
        self.costs = np.asarray(costs)
        self.global_batch, self.rank, self.world, self.seed = global_batch, rank, world, seed
        self.shuffle, self.drop_last, self.balanced = shuffle, drop_last, balanced
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def global_batches(self) -> list[np.ndarray]:
        n = self.costs.size
        order = (np.random.default_rng([self.seed, self.epoch]).permutation(n) if self.shuffle
                 else np.arange(n))
        stop = n - n % self.global_batch if self.drop_last else n
        return [order[i:i + self.global_batch] for i in range(0, stop, self.global_batch)]

    def split(self, batch: np.ndarray) -> list[list[int]]:
        if not self.balanced or batch.size < self.world:
            return [batch[r::self.world].tolist() for r in range(self.world)]
        return [[int(batch[i]) for i in part] for part in lpt_partition(self.costs[batch], self.world)]

    def __iter__(self) -> Iterator[list[int]]:
        for batch in self.global_batches():
            yield self.split(batch)[self.rank]

    def __len__(self) -> int:
        n = self.costs.size
        return n // self.global_batch if self.drop_last else -(-n // self.global_batch)
