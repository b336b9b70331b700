"""The DeepCAM dataset spec: file layout (for pack/stage), validated reader, collate, DALI graph.

A sample is one ``<split>/data-*.h5`` file read by :func:`deepcam.data.read_sample` (format, shape
against the split's first file, label values): raw (H, W, C) float32 data and (H, W) uint8 labels.
``stats.h5`` at the root holds the per-channel statistics every node needs (the layout replicates
it); opening a split loads it. ``collate`` normalizes (x - min) / (max - min) into the batch on the
reader thread; ``transform`` gives the inputs as N, C, H, W: a zero-copy channels-last view of the
HWC batch with ``train.channels_last``, else contiguous. The DALI graph does both from the raw
samples. Light to import (``hpcbench pack``/``stage`` load :data:`LAYOUT`): h5py and torch are
imported where they are used.
"""
from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from common.data.layout import FileLayout, KnownSplit
from common.data.spec import DatasetSpec, FileSamples

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from .data import Normalizer

# 768 x 1152 x 16 float32 + int labels, about 56 MiB per HDF5 file.
_SAMPLE_BYTES = 768 * 1152 * 16 * 4 + 768 * 1152 * 4

LAYOUT = FileLayout(
    "deepcam", ("data-*.h5",), ("train", "validation"), replicate=("stats.h5",),
    known={"train": KnownSplit(121_266, _SAMPLE_BYTES, 0.6),
           "validation": KnownSplit(15_158, _SAMPLE_BYTES, 0.6)},
    describe="data-*.h5 files",
)

Sample = tuple[np.ndarray, np.ndarray]  # (data H x W x C float32 raw, labels H x W uint8)
Batch = tuple["torch.Tensor", "torch.Tensor"]  # (inputs, labels N x H x W int64)


class DeepCAMData(DatasetSpec):
    layout = LAYOUT
    partition = "strided"

    def __init__(self, channels: Sequence[int], channels_last: bool, stats_file: str = "stats.h5",
                 train_split: str = "train", eval_split: str = "validation") -> None:
        self.channels = list(channels)
        self.channels_last = channels_last
        self.stats_file = stats_file
        self.train_split, self.eval_split = train_split, eval_split
        self._norm: Normalizer | None = None

    def open(self, root: Path, split: str) -> FileSamples:
        from .data import Normalizer, list_samples, read_sample, sample_shape

        files = list_samples(root, split)  # the clearer error first when the dataset is missing
        self._norm = Normalizer.from_stats(Path(root) / self.stats_file, self.channels)
        shape = sample_shape(files[0])
        return FileSamples(files, partial(read_sample, channels=self.channels, shape=shape))

    @property
    def norm(self) -> "Normalizer":
        """The statistics of the opened dataset (``stats.h5``)."""
        if self._norm is None:
            raise RuntimeError("DeepCAMData.open() loads stats.h5; open a split before making batches")
        return self._norm

    def collate(self, samples: Sequence[Sample]) -> Batch:
        """(inputs N x H x W x C float32 normalized, labels N x H x W int64)."""
        import torch

        norm = self.norm
        h, w, c = samples[0][0].shape  # every sample of a split has its first file's shape
        x = np.empty((len(samples), h, w, c), np.float32)
        y = np.empty((len(samples), h, w), np.int64)
        for j, (data, labels) in enumerate(samples):
            norm.apply(data, out=x[j])
            y[j] = labels
        return torch.from_numpy(x), torch.from_numpy(y)

    def transform(self, batch: Batch) -> Batch:
        """Inputs as N x C x H x W: the channels-last view of the HWC batch, or contiguous NCHW."""
        x, y = batch
        x = x.permute(0, 3, 1, 2)
        return (x if self.channels_last else x.contiguous()), y

    def dali(self) -> "DaliNormalize":
        return DaliNormalize(self.norm, self.channels_last)


class DaliNormalize:
    """The spec's collate normalization and transform as a DALI graph on the raw samples:
    (x - min) * 1/(max - min) per channel, then CHW unless channels-last; labels to int64."""

    def __init__(self, norm: "Normalizer", channels_last: bool) -> None:
        self.shift = norm.shift.reshape(1, 1, -1)
        self.scale = norm.scale.reshape(1, 1, -1)
        self.channels_last = channels_last

    def inputs(self, samples: Sequence[Sample]) -> list[list[np.ndarray]]:
        return [[data for data, _ in samples], [labels for _, labels in samples]]

    def layouts(self) -> list[str]:
        return ["HWC", "HW"]

    def dtypes(self) -> list[Any]:
        from nvidia.dali import types

        return [types.FLOAT, types.UINT8]

    def graph(self, inputs: list[Any], device: str) -> list[Any]:
        from nvidia.dali import fn, types

        x, y = inputs
        x = (x - types.Constant(self.shift, device=device)) * types.Constant(self.scale, device=device)
        if not self.channels_last:
            x = fn.transpose(x, perm=[2, 0, 1])
        return [x, fn.cast(y, dtype=types.INT64)]

    def to_batch(self, outputs: list["torch.Tensor"]) -> Batch:
        x, y = outputs
        return (x.permute(0, 3, 1, 2) if self.channels_last else x), y
