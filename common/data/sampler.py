"""Which samples a data-parallel rank reads in an epoch: one sampler, three partition rules.

Every rule starts from the same order on every rank, seeded from ``(seed, epoch)`` (training) or
the natural order (evaluation), so no communication is needed:

* ``contiguous``: the permutation is cut into ``size`` equal contiguous parts (the remainder that
  does not fill a part is left out this epoch, a different one each epoch); each rank drops its
  incomplete last batch so all ranks take the same number of steps.
* ``strided``: the permutation, cut to a multiple of ``size``, is dealt round-robin.
* ``balanced`` (training): the permutation, cut to whole global batches of ``local_batch * size``,
  is taken a window of ``window`` steps at a time (:func:`window_steps`); inside a window every
  rank-step gets exactly ``local_batch`` samples chosen so that their summed costs are close
  (largest samples first, each round to the lightest rank-steps), and the rank-steps of similar
  cost make up a step, so in every step the ranks have even work; the window's steps and each
  step's ranks are then shuffled from ``(seed, epoch)``. A window holds what a step alone cannot:
  at 2 samples per rank one global batch has too few samples to split evenly (1.09-1.13 max/mean
  per step on OC20-like sizes, 1.006 with 16-step windows, 1.003 with 32; benchmarks/oc20_sampler_balance.py).
  Evaluation splits each global batch by greedy longest-processing-time (:func:`lpt_partition`),
  so ranks get different sample counts but similar work, and every sample is seen once.

``shuffle="local"`` (training, ``contiguous``/``strided``): each rank keeps a fixed part of the
natural order for the whole run (its ``n // size`` samples: a contiguous block, or every ``size``-th
sample) and only the order inside it changes each epoch, seeded from ``(seed, epoch, rank)``; a rank
then reads, and can cache, 1/size of the split.

``last_batch="pad"`` (training, any partition with the global shuffle; ``balanced`` then balances the padded
permutation's windows): instead of leaving
out the permutation's remainder that does not fill a global batch, the permutation is padded with its own
first samples up to whole global batches (``ceil(n / (local_batch * size))`` steps), so every sample is
read at least once each epoch and the pad's few samples twice: the MLPerf training rules let the last
batch of an epoch be the remainder, padded, or mixed with the next epoch, and only DLRMv2 may drop it
(``training_rules.adoc``, data handling; PyTorch's DistributedSampler pads the same way).

Evaluation (``train=False``) never shuffles or drops: over the ranks every sample is seen exactly
once (``contiguous`` and ``strided`` deal round-robin, ``balanced`` splits each global batch).
"""
from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import Literal, get_args

import numpy as np

from hpcbench.common.errors import ConfigError

Partition = Literal["contiguous", "strided", "balanced"]
Shuffle = Literal["global", "local"]
LastBatch = Literal["drop", "pad"]
PARTITIONS: tuple[str, ...] = get_args(Partition)
BALANCE_WINDOW = 32  # steps per window of the balanced training partition


def window_steps(costs: np.ndarray, ranks: int, per_rank: int, rng: np.random.Generator) -> np.ndarray:
    """Positions into ``costs`` (``steps * ranks * per_rank`` of them) as ``[steps, ranks, per_rank]``, every
    position once, each step's ranks of even summed cost. Rank-steps ("bins") are filled in ``per_rank``
    rounds: the costs sorted largest first (ties: lowest position), each round's next ``steps * ranks``
    go one per bin, the heaviest to the lightest bin so far; then bins sorted by load, ``ranks`` neighbours
    per step. ``rng`` only shuffles the steps and the ranks inside a step (the balance does not depend on it)."""
    costs = np.asarray(costs, dtype=np.float64)
    bins = costs.size // per_rank
    if costs.size != bins * per_rank or bins % ranks:
        raise ValueError(f"{costs.size} costs are not whole steps of {ranks} ranks x {per_rank} samples")
    order = np.lexsort((np.arange(costs.size), -costs))  # descending cost, then position
    load = np.zeros(bins)
    members = np.empty((bins, per_rank), dtype=np.int64)
    for k in range(per_rank):
        items = order[k * bins:(k + 1) * bins]  # descending
        lightest = np.argsort(load, kind="stable")  # ascending load, ties: lowest bin
        load[lightest] += costs[items]
        members[lightest, k] = items
    steps = members[np.argsort(load, kind="stable")].reshape(bins // ranks, ranks, per_rank)
    steps = steps[rng.permutation(steps.shape[0])]
    return np.take_along_axis(steps, rng.permuted(np.broadcast_to(np.arange(ranks), steps.shape[:2]), axis=1)
                              [..., None], axis=1)


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


def too_few_samples(n: int, local_batch: int, ranks: int, where: str = "") -> str:
    """Why ``n`` training samples give no step: each of the ``ranks`` reading them needs a whole
    local batch, and what to change (``where`` names the data, e.g. the split folder)."""
    found = f"{n} training samples" + (f" in {where}" if where else "")
    fix = (f"lower config key 'train.global_batch_size' (--set train.global_batch_size=N) so that each rank's "
           f"batch is at most {n // ranks}, or add samples" if n >= ranks else
           f"fewer samples than ranks: add samples or use fewer ranks")
    return (f"{found} cannot fill one batch per rank: local batch {local_batch} x {ranks} rank(s) reading them = "
            f"{local_batch * ranks} samples per step (train.global_batch_size is the local batch times the "
            f"instance's ranks); {fix}")


class EpochSampler:
    """This rank's batches of sample indices for each epoch (``set_epoch`` then ``batches()``)."""

    def __init__(self, n: int, local_batch: int, rank: int, size: int, seed: int,
                 partition: Partition = "contiguous", train: bool = True,
                 costs: np.ndarray | None = None, shuffle: Shuffle = "global", where: str = "",
                 window: int = BALANCE_WINDOW, last_batch: LastBatch = "drop") -> None:
        if partition not in PARTITIONS:
            raise ConfigError(f"unknown partition {partition!r}; expected one of {', '.join(PARTITIONS)}")
        if shuffle not in ("global", "local"):
            raise ConfigError(f"config key 'data.shuffle': expected 'global' or 'local', got {shuffle!r}")
        if shuffle == "local" and partition == "balanced" and train:
            raise ConfigError("config key 'data.shuffle' = 'local' does not apply to this workload: its sampler "
                              "balances the cost of every global batch over the ranks, which needs the whole "
                              "split; use 'global'")
        if not 0 <= rank < size or local_batch < 1:
            raise ValueError(f"rank {rank} of {size} with local batch {local_batch}")
        if partition == "balanced" and (costs is None or len(costs) != n):
            raise ValueError(f"the balanced partition needs one cost per sample ({n})")
        self.n, self.local_batch, self.rank, self.size, self.seed = n, local_batch, rank, size, seed
        if window < 1:
            raise ValueError(f"balance window of {window} steps; expected >= 1")
        if last_batch not in ("drop", "pad"):
            raise ConfigError(f"config key 'data.last_batch': expected 'drop' or 'pad', got {last_batch!r}")
        if last_batch == "pad" and train and shuffle == "local":
            raise ConfigError("config key 'data.last_batch' = 'pad' applies to the global shuffle (every rank's part "
                              "of one permutation), not to data.shuffle = 'local'")
        self.partition, self.train, self.shuffle, self.window = partition, train, shuffle, window
        self.pad = train and last_batch == "pad"
        self.costs = None if costs is None else np.asarray(costs, dtype=np.float64)
        self.epoch = 0
        if train and len(self) < 1:
            raise ConfigError(too_few_samples(n, local_batch, size, where))

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def order(self) -> np.ndarray:
        if self.train:
            perm = np.random.default_rng([self.seed, self.epoch]).permutation(self.n)
            if self.pad:  # whole global batches: the permutation continued with its own first samples
                need = len(self) * self.local_batch * self.size - self.n
                perm = np.concatenate([perm, np.resize(perm, need)])
            return perm
        return np.arange(self.n)

    def __len__(self) -> int:
        """Batches per epoch on this rank (the same on every rank when training)."""
        n, b, s = self.n, self.local_batch, self.size
        if self.pad:
            return -(-n // (b * s))
        if self.partition == "balanced":
            return n // (b * s) if self.train else -(-n // (b * s))
        if self.train:
            return (n // s) // b
        mine = len(range(self.rank, n, s))
        return -(-mine // b)

    def indices(self) -> np.ndarray:
        """This rank's samples this epoch, in reading order."""
        batches = self.batches()
        return np.concatenate(batches) if batches else np.zeros(0, np.int64)

    def batches(self) -> list[np.ndarray]:
        order, b = self.order(), self.local_batch
        if self.partition == "balanced" and self.train:
            return self._windows(order)
        if self.partition == "balanced":
            return [part for part in (self._split(g) for g in self._global_batches(order)) if part.size]
        if not self.train:
            mine = order[self.rank::self.size]
        elif self.shuffle == "local":
            mine = np.random.default_rng([self.seed, self.epoch, self.rank]).permutation(self.fixed_part())
        elif self.partition == "contiguous":
            per_rank = order.size // self.size
            mine = order[self.rank * per_rank:(self.rank + 1) * per_rank]
        else:  # strided
            mine = order[: (order.size // self.size) * self.size][self.rank::self.size]
        if self.train:
            mine = mine[: len(self) * b]
        return [mine[i:i + b] for i in range(0, len(mine), b)]

    def fixed_part(self) -> np.ndarray:
        """With ``shuffle="local"``: the samples this rank reads in every epoch, in natural order."""
        per_rank = self.n // self.size
        if self.partition == "contiguous":
            return np.arange(self.rank * per_rank, (self.rank + 1) * per_rank, dtype=np.int64)
        return np.arange(per_rank * self.size, dtype=np.int64)[self.rank::self.size]

    def _global_batches(self, order: np.ndarray) -> list[np.ndarray]:
        g = self.local_batch * self.size
        stop = self.n - self.n % g if self.train else self.n
        return [order[i:i + g] for i in range(0, stop, g)]

    def _windows(self, order: np.ndarray) -> list[np.ndarray]:
        """This rank's training batches of the balanced partition: :func:`window_steps` over each window
        of ``window`` steps of the permutation (the last window may be shorter)."""
        assert self.costs is not None
        g, steps = self.local_batch * self.size, len(self)
        rng = np.random.default_rng([self.seed, self.epoch, 1])  # not the permutation's stream
        out: list[np.ndarray] = []
        for start in range(0, steps, self.window):
            chunk = order[start * g:min(start + self.window, steps) * g]
            out.extend(chunk[window_steps(self.costs[chunk], self.size, self.local_batch, rng)[:, self.rank]])
        return out

    def _split(self, batch: np.ndarray) -> np.ndarray:
        if batch.size < self.size:
            return batch[self.rank::self.size]
        assert self.costs is not None
        part = lpt_partition(self.costs[batch], self.size)[self.rank]
        return batch[np.asarray(part, dtype=np.int64)]


class _StoredBatches(Sequence[np.ndarray]):
    """One rank's batches of :class:`StoredOrderSampler`, each computed when asked for (slices stay lazy)."""

    def __init__(self, sampler: StoredOrderSampler, ids: range) -> None:
        self.sampler, self.ids = sampler, ids

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, k):  # type: ignore[override]
        if isinstance(k, slice):
            return _StoredBatches(self.sampler, self.ids[k])
        return self.sampler.batch(self.ids[k])


class StoredOrderSampler:
    """The stored order, no shuffling (MLPerf DLRMv2: the preprocessing shuffled the training set once
    with a fixed seed, "any other extra dataset shuffling is prohibited"). Global batch ``g`` is the rows
    ``[g * B, (g + 1) * B)`` of the split (``B = local_batch * size``) and rank ``r`` reads its ``r``-th
    contiguous part, as the reference's ``MultiHotCriteoIterDataPipe`` hands batch ``i`` of the file order to
    rank ``i % world_size``; every epoch reads the same order. Training drops the last partial global batch
    (the rules allow it for DLRMv2); evaluation splits it over the ranks as evenly as rows allow, so every
    sample is seen once. Indices are computed per batch: memory is O(local batch) whatever the split's size
    (a permutation of the full DLRM training set would be 4.2e9 int64, about 34 GB per rank)."""

    partition = "contiguous"
    shuffle = "global"
    order = "stored"  # each rank reads the same rows every epoch (a cache holds only those)

    def __init__(self, n: int, local_batch: int, rank: int, size: int, train: bool = True, where: str = "",
                 shuffle: str = "global") -> None:
        if shuffle != "global":
            raise ConfigError(f"config key 'data.shuffle' = {shuffle!r} does not apply to this workload: it reads its "
                              f"training data in the stored order (the preprocessing's shuffle; the rules prohibit "
                              f"any other); use 'global'")
        if not 0 <= rank < size or local_batch < 1:
            raise ValueError(f"rank {rank} of {size} with local batch {local_batch}")
        self.n, self.local_batch, self.rank, self.size, self.train = n, local_batch, rank, size, train
        self.epoch = 0
        if train and len(self) < 1:
            raise ConfigError(too_few_samples(n, local_batch, size, where))

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch  # the order does not depend on it

    @property
    def global_batch(self) -> int:
        return self.local_batch * self.size

    def _global_batches(self) -> int:
        g = self.global_batch
        return self.n // g if self.train else -(-self.n // g)

    def _bounds(self, g: int) -> tuple[int, int]:
        """This rank's rows ``[start, stop)`` of global batch ``g``."""
        lo = g * self.global_batch
        rows = min(self.global_batch, self.n - lo)
        return lo + self.rank * rows // self.size, lo + (self.rank + 1) * rows // self.size

    def _mine(self) -> range:
        """The global batches in which this rank has rows."""
        total = self._global_batches()
        if total and not self.train:
            start, stop = self._bounds(total - 1)
            if stop == start:  # a last partial global batch with fewer rows than ranks left none here
                total -= 1
        return range(total)

    def __len__(self) -> int:
        return len(self._mine())

    def batch(self, g: int) -> np.ndarray:
        start, stop = self._bounds(g)
        return np.arange(start, stop, dtype=np.int64)

    def batches(self) -> Sequence[np.ndarray]:
        return _StoredBatches(self, self._mine())

    def indices(self) -> np.ndarray:
        """This rank's samples this epoch, in reading order (materialised: for tests and small splits)."""
        batches = self.batches()
        return np.concatenate(list(batches)) if len(batches) else np.zeros(0, np.int64)
