"""Which files a data-parallel rank reads in an epoch: one definition shared by every loader.

Training: a permutation of all files seeded by (seed, epoch), identical on every rank, cut into
``size`` equal contiguous parts (the remainder that does not fill a part is left out this epoch,
a different one each epoch); each rank then drops its incomplete last batch so all ranks take the
same number of steps. Evaluation: no shuffle, rank r reads files r, r+size, ... so every sample
is seen exactly once over the ranks.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from common.errors import ConfigError


def train_files(files: Sequence[Path], rank: int, size: int, seed: int, epoch: int,
                local_batch: int) -> list[Path]:
    per_rank = len(files) // size
    n_batches = per_rank // local_batch
    if n_batches < 1:
        raise ConfigError(f"{len(files)} training files cannot fill one batch of {local_batch} on each of "
                          f"{size} ranks; lower train.global_batch_size or generate more samples")
    perm = np.random.default_rng([seed, epoch]).permutation(len(files))
    mine = perm[rank * per_rank:(rank + 1) * per_rank][: n_batches * local_batch]
    return [files[i] for i in mine]


def eval_files(files: Sequence[Path], rank: int, size: int) -> list[Path]:
    return list(files[rank::size])


def batches(items: Sequence[Path], local_batch: int) -> list[list[Path]]:
    return [list(items[i:i + local_batch]) for i in range(0, len(items), local_batch)]
