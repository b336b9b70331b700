"""The plain torch loader: worker processes read and decode files, ``log1p`` on the fly."""
from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from common.workload import DataShard

from .data import log1p_input, read_sample

Batch = tuple[torch.Tensor, torch.Tensor]


class _Files(Dataset):
    def __init__(self, files: Sequence[Path], size: int) -> None:
        self.files, self.size = list(files), size

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        s = read_sample(self.files[i], self.size)
        return torch.from_numpy(log1p_input(s.x)), torch.from_numpy(np.array(s.y))


class TorchLoader:
    """An :class:`~common.workload.EpochLoader` over this rank's files, batches on ``shard.device``."""

    def __init__(self, files_for_epoch: Callable[[int], list[Path]], size: int, shard: DataShard,
                 workers: int = 0, prefetch: int = 2) -> None:
        self.files_for_epoch, self.size, self.shard = files_for_epoch, size, shard
        self.workers, self.prefetch, self.epoch = workers, prefetch, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        n = len(self.files_for_epoch(self.epoch))
        return -(-n // self.shard.local_batch_size)

    def __iter__(self) -> Iterator[Batch]:
        device = self.shard.device
        loader = DataLoader(_Files(self.files_for_epoch(self.epoch), self.size),
                            batch_size=self.shard.local_batch_size, shuffle=False,
                            num_workers=self.workers, pin_memory=device.type == "cuda",
                            prefetch_factor=self.prefetch if self.workers else None)
        for x, y in loader:
            yield x.to(device, non_blocking=True), y.to(device, non_blocking=True)
