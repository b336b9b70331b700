"""The CosmoFlow dataset spec: file layout (for pack/stage), validated reader, collate, DALI graph.

A sample is one ``<split>/*.tfrecord[.gz]`` file read and validated by
:func:`hpcbench.workloads.cosmoflow.data.read_sample`: (x int16 [S,S,S,4], y float32 [4]). ``read_batch`` reads and
validates the batch's files straight into one reused (or pinned) int16 batch buffer, as ``collate``
would stack them, so the counts cross to the device as int16; ``transform`` takes
``log1p`` in float32 and gives x as [B,4,S,S,S]: with ``train.channels_last`` the permuted view of
the NDHWC batch (already ``channels_last_3d``, no copy), else contiguous NCDHW. The DALI graph does
the same from the raw samples. Light to import (``hpcbench pack``/``stage`` load :data:`LAYOUT`):
the format code, torch and DALI are imported where they are used.
"""
from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from hpcbench.common.data.buffers import HostBuffers
from hpcbench.common.data.pointwise import Int16Table
from hpcbench.common.data.spec import DatasetSpec, FileSamples, SampleSource

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from .data import Sample

from .layout import LAYOUT  # noqa: F401 - the dataset's layout, also the spec's

Batch = tuple["torch.Tensor", "torch.Tensor"]  # (x, y float32 [B,4])


class CosmoFlowData(DatasetSpec):
    layout = LAYOUT
    partition = "contiguous"

    def __init__(self, size: int, n_train: int = 0, n_eval: int = 0, channels_last: bool = False) -> None:
        self.size = size  # cube edge S
        self.limits = {self.train_split: n_train, self.eval_split: n_eval}  # first N files; 0: all
        self.channels_last = channels_last
        self._buffers = HostBuffers()  # the int16 batches read
        self._outputs = HostBuffers()  # the float32 batches ``transform`` writes on the host
        self._log1p: Int16Table | None = None  # log1p of every int16 value, made at the first host batch

    def open(self, root: Path, split: str) -> FileSamples:
        from .data import list_files, read_sample

        files = list_files(root, split)
        limit = self.limits.get(split, 0)
        return FileSamples(files[:limit] if limit else files, partial(read_sample, size=self.size))

    def collate(self, samples: Sequence["Sample"]) -> Batch:
        """(x int16 [B,S,S,S,4], y float32 [B,4]): one copy of each sample into the batch."""
        import torch

        x = np.empty((len(samples), *samples[0].x.shape), np.int16)  # every sample is [S,S,S,4]
        for j, sample in enumerate(samples):
            x[j] = sample.x
        y = np.stack([sample.y for sample in samples])
        return torch.from_numpy(x), torch.from_numpy(y)

    def read_batch(self, source: SampleSource, indices: Sequence[int], pin: bool = False) -> Batch:
        """``collate`` of the samples, each file read and validated straight into its batch slot."""
        import torch

        from .data import PAD, buffer_bytes, read_into, x_bytes

        files = getattr(source, "files", None)
        if files is None:
            return super().read_batch(source, indices, pin)
        n, s = len(indices), self.size
        buf, raw = self._buffers.take(buffer_bytes(s, n), pin)
        y = np.stack([read_into(files[int(i)], s, buf, j) for j, i in enumerate(indices)])
        x = raw[PAD:PAD + n * x_bytes(s)].view(torch.int16).view(n, s, s, s, 4)
        return x, torch.from_numpy(y)

    def transform(self, batch: Batch) -> Batch:
        """x as float32 log(1 + counts) [B,4,S,S,S]: a channels_last_3d view, or contiguous. On the host
        a lookup of the int16 counts in a table of ``torch.log1p`` of every int16 value (bit-equal to the
        cast-then-``log1p`` formula, one pass; :class:`Int16Table`) written into a reused output
        (:meth:`HostBuffers.output`); on a device the formula itself."""
        x, y = batch
        if x.device.type != "cpu":
            return self._device_transform(x), y
        return self._host_transform(np.ascontiguousarray(x.numpy())), y

    def transform_rows(self, stored: Batch, rows: np.ndarray) -> Batch:
        """``transform`` of rows ``rows`` of the host cache's ``stored`` batch, each sample looked up
        straight from its cache row (no gather copy of the int16 batch first)."""
        import torch

        x, y = stored
        xs = x.numpy()
        return (self._host_transform([xs[r] for r in rows.tolist()]),
                y.index_select(0, torch.from_numpy(np.asarray(rows, np.int64))))

    def _host_transform(self, samples: Sequence[np.ndarray]) -> "torch.Tensor":
        """The float32 [B,4,S,S,S] of int16 NDHWC ``samples`` (a batch's rows, or cache rows)."""
        import torch

        b, (*s, c) = len(samples), samples[0].shape
        if self._log1p is None:
            self._log1p = Int16Table(torch.log1p)
        if self.channels_last:  # NDHWC memory, seen as [B,4,S,S,S]: the batch's own order, no layout change
            out = self._outputs.output((b, *s, c), torch.float32, torch.device("cpu"))
            self._log1p.into(samples, out.numpy())
            return out.permute(0, 4, 1, 2, 3)
        out = self._outputs.output((b, c, *s), torch.float32, torch.device("cpu"))
        self._log1p.into(samples, out.numpy(), channels_first=True)
        return out

    def _device_transform(self, x: "torch.Tensor") -> "torch.Tensor":
        import torch

        b, s = x.shape[0], x.shape[1:4]
        if self.channels_last:
            out = self._outputs.output((b, *s, x.shape[4]), torch.float32, x.device)
            out.copy_(x)
            return out.log1p_().permute(0, 4, 1, 2, 3)
        out = self._outputs.output((b, x.shape[4], *s), torch.float32, x.device)
        out.copy_(x.permute(0, 4, 1, 2, 3))  # cast and layout change in one pass
        return out.log1p_()

    def dali(self) -> "DaliLog1p":
        return DaliLog1p(self.channels_last)


class DaliLog1p:
    """The spec's transform as a DALI graph on the raw samples: cast to float, log(x + 1), then CDHW
    unless channels-last (then the batch is permuted to [B,4,S,S,S] as a view, like the torch path)."""

    def __init__(self, channels_last: bool) -> None:
        self.channels_last = channels_last

    def inputs(self, samples: Sequence["Sample"]) -> list[list[np.ndarray]]:
        return [[s.x for s in samples], [s.y for s in samples]]

    def layouts(self) -> list[str]:
        return ["DHWC", ""]

    def dtypes(self) -> list[Any]:
        from nvidia.dali import types

        return [types.INT16, types.FLOAT]

    def graph(self, inputs: list[Any], device: str) -> list[Any]:
        import nvidia.dali.math as dmath
        from nvidia.dali import fn, types

        x, y = inputs
        x = dmath.log(fn.cast(x, dtype=types.FLOAT) + 1.0)
        if not self.channels_last:
            x = fn.transpose(x, perm=[3, 0, 1, 2], output_layout="CDHW")
        return [x, y]

    def to_batch(self, outputs: list["torch.Tensor"]) -> Batch:
        x, y = outputs
        return (x.permute(0, 4, 1, 2, 3) if self.channels_last else x), y
