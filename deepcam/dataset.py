"""The DeepCAM dataset spec: file layout (for pack/stage), validated reader, collate, DALI graph.

A sample is one ``<split>/data-*.h5`` file read by :func:`hpcbench.workloads.deepcam.data.read_sample` (format, shape
against the split's first file, label values): raw (H, W, C) float32 data and (H, W) uint8 labels.
``stats.h5`` at the root holds the per-channel statistics every node needs (the layout replicates
it); opening a split loads it. ``read_batch`` has HDF5 read each file straight into its slot of one
reused (or pinned) batch buffer in the stored dtypes (what ``collate`` stacks): float32 data and
uint8 labels cross to the device like that. ``transform`` (on the device on a GPU, in the reader
thread on the CPU) normalizes (x - min) / (max - min), makes the labels int64 and gives the inputs
as N, C, H, W: a channels-last view of the HWC batch with ``train.channels_last``, else contiguous.
The DALI graph does the same from the raw samples. Light to import (``hpcbench pack``/``stage``
load :data:`LAYOUT`): h5py and torch are imported where they are used.
"""
from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from hpcbench.common.data.buffers import HostBuffers
from hpcbench.common.data.pointwise import ShiftScale
from hpcbench.common.data.spec import DatasetSpec, FileSamples, SampleSource

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from .data import Normalizer

from .layout import LAYOUT  # noqa: F401 - the dataset's layout, also the spec's

Sample = tuple[np.ndarray, np.ndarray]  # (data H x W x C float32 raw, labels H x W uint8)
Batch = tuple["torch.Tensor", "torch.Tensor"]  # host: (N x H x W x C float32 raw, N x H x W uint8);
# after transform: (inputs N x C x H x W normalized, labels N x H x W int64)


class SplitFiles(FileSamples):
    """A split's sample files and the grid (H, W) of its first file, which every sample must have."""

    def __init__(self, files: Sequence[Path], channels: Sequence[int], shape: tuple[int, int]) -> None:
        from .data import read_sample

        super().__init__(files, partial(read_sample, channels=channels, shape=shape))
        self.shape = shape


class DeepCAMData(DatasetSpec):
    layout = LAYOUT
    partition = "strided"

    def __init__(self, channels: Sequence[int], channels_last: bool, stats_file: str = "stats.h5",
                 train_split: str = "train", eval_split: str = "validation", grid_multiple: int = 1) -> None:
        self.channels = list(channels)
        self.grid_multiple = grid_multiple  # the model's output stride: the grid must divide by it
        self.channels_last = channels_last
        self.stats_file = stats_file
        self.train_split, self.eval_split = train_split, eval_split
        self._norm: Normalizer | None = None
        self._norm_on: dict["torch.device", tuple["torch.Tensor", "torch.Tensor"]] = {}
        self._buffers = HostBuffers()  # the raw batches read
        self._outputs = HostBuffers()  # the normalized inputs and int64 labels ``transform`` writes on the host
        self._shift_scale: tuple[Normalizer, ShiftScale] | None = None  # for host batches, made from ``norm``

    def open(self, root: Path, split: str) -> SplitFiles:
        from .data import Normalizer, list_samples, sample_shape

        files = list_samples(root, split)  # the clearer error first when the dataset is missing
        self._norm = Normalizer.from_stats(Path(root) / self.stats_file, self.channels)
        self._norm_on = {}
        return SplitFiles(files, self.channels, sample_shape(files[0], self.grid_multiple))

    @property
    def norm(self) -> "Normalizer":
        """The statistics of the opened dataset (``stats.h5``)."""
        if self._norm is None:
            raise RuntimeError("DeepCAMData.open() loads stats.h5; open a split before making batches")
        return self._norm

    def collate(self, samples: Sequence[Sample]) -> Batch:
        """(data N x H x W x C float32 raw, labels N x H x W uint8), as stored."""
        import torch

        return torch.from_numpy(np.stack([d for d, _ in samples])), torch.from_numpy(np.stack([l for _, l in samples]))

    def read_batch(self, source: SampleSource, indices: Sequence[int], pin: bool = False) -> Batch:
        """``collate`` of the samples, each file read by HDF5 straight into its slots of the batch."""
        import torch

        from .data import read_into

        if not isinstance(source, SplitFiles):
            return super().read_batch(source, indices, pin)
        (h, w), c, n = source.shape, len(self.channels), len(indices)
        xb = n * h * w * c * 4
        buf, raw = self._buffers.take(xb + n * h * w, pin)
        x, y = buf[:xb].view(np.float32).reshape(n, h, w, c), buf[xb:].reshape(n, h, w)
        for j, i in enumerate(indices):
            read_into(source.files[int(i)], self.channels, x[j], y[j])
        return raw[:xb].view(torch.float32).view(n, h, w, c), raw[xb:].view(n, h, w)

    def transform(self, batch: Batch) -> Batch:
        """Inputs normalized, as N x C x H x W (the channels-last view of the HWC batch, or
        contiguous NCHW); labels int64. On the host both are written into reused outputs
        (:meth:`HostBuffers.output`: a fresh 56 MiB batch per step costs more in page faults than
        the arithmetic), the inputs in one pass of L2-sized pieces (:class:`ShiftScale`, the layout
        change inside the piece), bit-equal to the torch formula used on a device."""
        x, y = batch
        if x.device.type != "cpu":
            return self._device_transform(x, y)
        return self._host_transform(np.ascontiguousarray(x.numpy()), np.ascontiguousarray(y.numpy()))

    def transform_rows(self, stored: Batch, rows: np.ndarray) -> Batch:
        """``transform`` of rows ``rows`` of the host cache's ``stored`` batch, each sample normalized
        straight from its cache row (no gather copy of the raw batch first)."""
        x, y = stored
        xs, ys = x.numpy(), y.numpy()
        picked = rows.tolist()
        return self._host_transform([xs[r] for r in picked], [ys[r] for r in picked])

    def _host_transform(self, data: Sequence[np.ndarray], labels: Sequence[np.ndarray]) -> Batch:
        """Normalized N x C x H x W float32 and int64 labels of HWC ``data`` and HW uint8 ``labels``
        (a batch's rows, or cache rows)."""
        import torch

        cpu = torch.device("cpu")
        norm = self.norm
        if self._shift_scale is None or self._shift_scale[0] is not norm:  # made once per opened stats.h5
            self._shift_scale = norm, ShiftScale(norm.shift, norm.scale)
        shift_scale = self._shift_scale[1]
        n, (h, w, c) = len(data), data[0].shape
        if self.channels_last:  # NHWC memory seen as N x C x H x W
            out = self._outputs.output((n, h, w, c), torch.float32, cpu)
            shift_scale.into(data, out.numpy())
            out = out.permute(0, 3, 1, 2)
        else:
            out = self._outputs.output((n, c, h, w), torch.float32, cpu)
            shift_scale.into(data, out.numpy(), channels_first=True)
        target = self._outputs.output((n, h, w), torch.int64, cpu)
        t = target.numpy()
        for j, lab in enumerate(labels):
            np.copyto(t[j], lab, casting="safe")
        return out, target

    def _device_transform(self, x: "torch.Tensor", y: "torch.Tensor") -> Batch:
        import torch

        shift, scale = self._norm_tensors(x.device)
        n, h, w, c = x.shape
        if self.channels_last:  # NHWC memory seen as N x C x H x W
            out = self._outputs.output((n, h, w, c), torch.float32, x.device)
            torch.sub(x, shift, out=out).mul_(scale)
            out = out.permute(0, 3, 1, 2)
        else:  # the layout change in the same pass as the shift
            out = self._outputs.output((n, c, h, w), torch.float32, x.device)
            torch.sub(x.permute(0, 3, 1, 2), shift.view(c, 1, 1), out=out).mul_(scale.view(c, 1, 1))
        labels = self._outputs.output(tuple(y.shape), torch.int64, y.device)
        labels.copy_(y)
        return out, labels

    def _norm_tensors(self, device: "torch.device") -> tuple["torch.Tensor", "torch.Tensor"]:
        """min and 1 / (max - min) per channel on ``device``, copied there once."""
        import torch

        if device not in self._norm_on:
            self._norm_on[device] = (torch.from_numpy(self.norm.shift).to(device),
                                     torch.from_numpy(self.norm.scale).to(device))
        return self._norm_on[device]

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
