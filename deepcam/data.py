"""Reader for the DeepCAM on-disk format and a threaded, sharded, shuffled batch loader.

Layout (MLPerf HPC DeepCAM): ``<root>/{train,validation}/data-*.h5``, one sample per file with
``climate/data`` float32 (H, W, C) and ``climate/labels_0`` (H, W) with classes {0 background,
1 tropical cyclone, 2 atmospheric river}; ``<root>/stats.h5`` holds per-channel
``climate/{count,mean,sqmean,minval,maxval}``. Inputs are normalized as (x - min) / (max - min).

h5py releases the GIL while it reads, and the numpy normalization runs in C, so a pool of
threads keeps up with the training step without worker processes.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import h5py
import numpy as np
import torch

from common.errors import DataError

NUM_CLASSES = 3
T = TypeVar("T")
R = TypeVar("R")
STATS_KEYS = ("count", "mean", "sqmean", "minval", "maxval")


def list_samples(root: str | Path, split: str) -> list[Path]:
    folder = Path(root) / split
    if not folder.is_dir():
        raise DataError(f"DeepCAM dataset folder '{folder}' does not exist (expected {split}/data-*.h5 under "
                        f"the dataset root; write one with `hpcbench datagen deepcam --out DIR`)")
    files = sorted(folder.glob("data-*.h5"))
    if not files:
        raise DataError(f"no data-*.h5 files in '{folder}'")
    return files


@dataclass(frozen=True)
class Normalizer:
    """Per-channel (x - shift) * scale with shift = min and scale = 1 / (max - min)."""

    shift: np.ndarray  # (C,) float32
    scale: np.ndarray  # (C,) float32

    @classmethod
    def from_stats(cls, path: str | Path, channels: Sequence[int]) -> Normalizer:
        path = Path(path)
        if not path.is_file():
            raise DataError(f"DeepCAM statistics file '{path}' does not exist")
        with h5py.File(path, "r") as f:
            missing = [k for k in STATS_KEYS if f"climate/{k}" not in f]
            if missing:
                raise DataError(f"'{path}': missing datasets {', '.join('climate/' + k for k in missing)}")
            lo, hi = (np.asarray(f[f"climate/{k}"][...], dtype=np.float64) for k in ("minval", "maxval"))
        if lo.ndim != 1 or hi.shape != lo.shape or max(channels) >= lo.shape[0]:
            raise DataError(f"'{path}': climate/minval and climate/maxval must be 1-D per-channel arrays "
                            f"covering channels {list(channels)}, got shapes {lo.shape} and {hi.shape}")
        lo, hi = lo[list(channels)], hi[list(channels)]
        if np.any(hi <= lo):
            raise DataError(f"'{path}': maxval must exceed minval for every channel")
        return cls(lo.astype(np.float32), (1.0 / (hi - lo)).astype(np.float32))

    def apply(self, hwc: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        out = np.subtract(hwc, self.shift, out=out)
        return np.multiply(out, self.scale, out=out)


def read_sample(path: Path, channels: Sequence[int], shape: tuple[int, int] | None = None,
                check_labels: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """(data (H, W, len(channels)) float32, labels (H, W) uint8) of one file, validated."""
    try:
        with h5py.File(path, "r") as f:
            if "climate/data" not in f or "climate/labels_0" not in f:
                raise DataError(f"'{path}': expected datasets climate/data and climate/labels_0")
            dset, lset = f["climate/data"], f["climate/labels_0"]
            if dset.ndim != 3 or dset.shape[2] <= max(channels):
                raise DataError(f"'{path}': climate/data has shape {dset.shape}; expected (H, W, C) "
                                f"with C > {max(channels)}")
            if shape is not None and tuple(dset.shape[:2]) != tuple(shape):
                raise DataError(f"'{path}': climate/data is {dset.shape[0]}x{dset.shape[1]}, expected "
                                f"{shape[0]}x{shape[1]} like the rest of the dataset")
            if tuple(lset.shape) != tuple(dset.shape[:2]):
                raise DataError(f"'{path}': climate/labels_0 has shape {lset.shape}; expected {dset.shape[:2]}")
            all_channels = list(channels) == list(range(dset.shape[2]))
            data = dset[...] if all_channels else dset[...][..., list(channels)]
            labels = lset[...]
    except OSError as exc:
        raise DataError(f"cannot read DeepCAM sample '{path}': {exc}") from None
    data = np.ascontiguousarray(data, dtype=np.float32)
    if check_labels:
        bad = (labels < 0) | (labels >= NUM_CLASSES) | (labels != np.round(labels))
        if bad.any():
            raise DataError(f"'{path}': climate/labels_0 holds value {labels[bad].flat[0].item():g} at "
                            f"{int(bad.sum())} pixel(s); classes must be 0, 1 or 2")
    return data, labels.astype(np.uint8)


def shard_indices(n: int, rank: int, size: int, seed: int, epoch: int, shuffle: bool, drop_uneven: bool) -> np.ndarray:
    """This rank's sample indices for one epoch: a seeded global permutation, dealt round-robin.

    With ``drop_uneven`` every rank gets ``n // size`` samples (training); without it the ranks
    together cover every sample exactly once (evaluation)."""
    order = np.random.default_rng([seed, epoch]).permutation(n) if shuffle else np.arange(n)
    if drop_uneven:
        order = order[: (n // size) * size]
    return order[rank::size]


class ThreadedLoader:
    """Batches of (inputs NCHW float32, labels N x H x W int64) for one rank.

    ``channels_last`` returns the inputs as a zero-copy NCHW view of the HWC batch (memory format
    channels-last), which is how the files store them; otherwise they are made contiguous NCHW.
    """

    def __init__(self, files: Sequence[Path], norm: Normalizer, channels: Sequence[int], batch_size: int,
                 rank: int = 0, size: int = 1, seed: int = 0, shuffle: bool = True, drop_uneven: bool = True,
                 threads: int = 4, prefetch: int = 2, channels_last: bool = True, pin_memory: bool = False) -> None:
        if not files:
            raise DataError("DeepCAM loader got an empty file list")
        self.files, self.norm, self.channels = list(files), norm, list(channels)
        self.batch_size, self.rank, self.size, self.seed = batch_size, rank, size, seed
        self.shuffle, self.drop_uneven, self.threads, self.prefetch = shuffle, drop_uneven, max(1, threads), max(1, prefetch)
        self.channels_last, self.pin_memory = channels_last, pin_memory
        self.epoch = 0
        with h5py.File(self.files[0], "r") as f:
            if "climate/data" not in f:
                raise DataError(f"'{self.files[0]}': expected dataset climate/data")
            self.shape = tuple(f["climate/data"].shape[:2])

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def indices(self) -> np.ndarray:
        return shard_indices(len(self.files), self.rank, self.size, self.seed, self.epoch, self.shuffle, self.drop_uneven)

    def __len__(self) -> int:
        n = len(self.indices())
        return n // self.batch_size if self.drop_uneven else -(-n // self.batch_size)

    def read_batch(self, idx: np.ndarray, normalize: bool = True, label_dtype: type = np.int64) -> tuple[np.ndarray, np.ndarray]:
        """(inputs N x H x W x C float32, labels N x H x W) of the given samples."""
        h, w = self.shape
        x = np.empty((len(idx), h, w, len(self.channels)), np.float32)
        y = np.empty((len(idx), h, w), label_dtype)
        for j, i in enumerate(idx):
            data, labels = read_sample(self.files[i], self.channels, self.shape)
            if normalize:
                self.norm.apply(data, out=x[j])
            else:
                x[j] = data
            y[j] = labels
        return x, y

    def batch_indices(self) -> list[np.ndarray]:
        """This epoch's batches of sample indices for this rank."""
        idx = self.indices()
        stop = min(len(self) * self.batch_size, len(idx))
        return [idx[s:s + self.batch_size] for s in range(0, stop, self.batch_size)]

    def _batch(self, idx: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.read_batch(idx)
        xt, yt = torch.from_numpy(x), torch.from_numpy(y)
        if self.pin_memory:
            xt, yt = xt.pin_memory(), yt.pin_memory()
        xt = xt.permute(0, 3, 1, 2)
        return (xt if self.channels_last else xt.contiguous()), yt

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        yield from prefetch_map(self._batch, self.batch_indices(), self.threads, self.prefetch)


def prefetch_map(fn: Callable[[T], R], items: Sequence[T], threads: int, depth: int) -> Iterator[R]:
    """Yield ``fn(item)`` in order, computing up to ``threads * depth`` items ahead in a thread pool."""
    with ThreadPoolExecutor(threads, thread_name_prefix="deepcam-read") as pool:
        pending: deque[Future[R]] = deque(pool.submit(fn, it) for it in items[: threads * depth])
        rest = iter(items[threads * depth:])
        try:
            while pending:
                out = pending.popleft().result()
                nxt = next(rest, _END)
                if nxt is not _END:
                    pending.append(pool.submit(fn, nxt))
                yield out
        finally:
            for fut in pending:
                fut.cancel()


_END = object()
