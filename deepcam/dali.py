"""DALI input pipeline: the threaded HDF5 reader feeds an external source, DALI normalizes.

The reader threads deliver raw HWC float32 batches; the pipeline applies (x - min) * 1/(max - min)
per channel (on the GPU when there is one, on the CPU otherwise) and, unless channels-last is
wanted, transposes to CHW. DALI is imported only when this loader is selected.
"""
from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from .data import ThreadedLoader, prefetch_map


class DALILoader:
    """An :class:`~common.workload.EpochLoader` with the same batches as the plain loader."""

    def __init__(self, reader: ThreadedLoader, device: torch.device, queue_depth: int = 2) -> None:
        from nvidia.dali import fn, pipeline_def, types

        self.reader, self.device = reader, device
        self._source: Iterator[tuple[np.ndarray, np.ndarray]] = iter(())
        gpu = device.type == "cuda"
        c = len(reader.channels)
        shift = reader.norm.shift.reshape(1, 1, c)
        scale = reader.norm.scale.reshape(1, 1, c)

        @pipeline_def(batch_size=reader.batch_size, num_threads=1, prefetch_queue_depth=queue_depth,
                      device_id=device.index if gpu else None, exec_dynamic=True)
        def pipe():  # noqa: ANN202
            x, y = fn.external_source(source=self._next, num_outputs=2, batch=True,
                                      layout=["HWC", "HW"], dtype=[types.FLOAT, types.INT64], no_copy=True)
            if gpu:
                x, y = x.gpu(), y.gpu()
            x = (x - types.Constant(shift, device="gpu" if gpu else "cpu")) * types.Constant(scale, device="gpu" if gpu else "cpu")
            if not reader.channels_last:
                x = fn.transpose(x, perm=[2, 0, 1])
            return x, y

        self.pipe = pipe()
        self.pipe.build()

    def _next(self) -> tuple[np.ndarray, np.ndarray]:
        return next(self._source)  # StopIteration ends DALI's epoch

    def set_epoch(self, epoch: int) -> None:
        self.reader.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.reader)

    def _to_torch(self, out) -> torch.Tensor:  # noqa: ANN001 - a DALI TensorList
        if self.device.type == "cuda":
            from nvidia.dali.plugin.pytorch import feed_ndarray, to_torch_type

            dense = out.as_tensor()
            t = torch.empty(dense.shape(), dtype=to_torch_type[dense.dtype], device=self.device)
            feed_ndarray(dense, t, cuda_stream=torch.cuda.current_stream(self.device))
            return t
        return torch.from_numpy(out.as_array())

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        r = self.reader
        raw = lambda idx: r.read_batch(idx, normalize=False)  # noqa: E731
        self._source = prefetch_map(raw, r.batch_indices(), r.threads, r.prefetch)
        try:
            while True:
                x, y = self.pipe.run()
                xt, yt = self._to_torch(x), self._to_torch(y)
                yield (xt.permute(0, 3, 1, 2) if r.channels_last else xt), yt
        except StopIteration:
            pass
        finally:
            self.pipe.reset()
