"""DALI behind the same loader: the reader threads read and *validate* samples exactly as the torch
loader does (a corrupt file fails with its name either way) and feed a DALI pipeline through an
external source; the pipeline runs the workload's transform (on the GPU on clusters, on the CPU
here). DALI is imported only when this loader is chosen. ``data.cache = "host"`` sits in front of the
graph: the validated raw samples it consumes are kept in host memory after the first read;
``"device"`` is refused with this loader (the external source takes host arrays).

``data.dali_batch_multiplier = k`` (the source documents' *input batch multiplier*, NVIDIA's ResNet at
small per-GPU batches): the pipeline runs on super-batches of ``k`` consecutive batches of the sampler
(the same samples in the same order) and each output is cut back into those ``k`` batches (views),
so DALI's per-batch cost is paid once per ``k`` steps."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from hpcbench.common.errors import ConfigError

from .loader import Loader
from .prefetch import prefetch_map
from .sampler import EpochSampler
from .spec import DaliGraph, DatasetSpec, SampleSource


def dali_available() -> bool:
    try:
        import nvidia.dali  # noqa: F401
    except ImportError:
        return False
    return True


def tensor_to_torch(tl: Any, device: torch.device) -> torch.Tensor:
    """A DALI TensorList (CPU or GPU) as one dense torch tensor on ``device``."""
    dense = tl.as_tensor()
    if device.type == "cuda":
        from nvidia.dali.plugin.pytorch import feed_ndarray, to_torch_type

        out = torch.empty(dense.shape(), dtype=to_torch_type[dense.dtype], device=device)
        feed_ndarray(dense, out, cuda_stream=torch.cuda.current_stream(device))
        return out
    return torch.from_numpy(np.array(dense))


class DaliLoader(Loader):
    """:class:`Loader` whose transform is a DALI pipeline built from the spec's :class:`DaliGraph`."""

    samples_only = True  # data.cache keeps the raw samples the graph consumes (host memory only)

    def __init__(self, spec: DatasetSpec, source: SampleSource, sampler: EpochSampler, *args: Any,
                 batch_multiplier: int = 1, **kwargs: Any) -> None:
        if batch_multiplier < 1:
            raise ConfigError(f"config key 'data.dali_batch_multiplier': must be >= 1, got {batch_multiplier}")
        graph = spec.dali_for(sampler.train)
        if graph is None:
            raise ConfigError(f"config key 'train.loader': the {spec.layout.name} dataset has no DALI "
                              "pipeline; use loader = \"torch\"")
        if not dali_available():
            raise ConfigError("config key 'train.loader' = \"dali\" needs NVIDIA DALI (nvidia-dali-cuda120), "
                              "which is not installed; use loader = \"torch\"")
        super().__init__(spec, source, sampler, *args, **kwargs)
        self.graph: DaliGraph = graph
        self.multiplier = batch_multiplier
        self._source: Iterator[list[list[np.ndarray]]] = iter(())
        self._error: BaseException | None = None

    def _next(self) -> list[list[np.ndarray]]:
        try:
            return next(self._source)  # StopIteration ends DALI's epoch
        except StopIteration:
            raise
        except BaseException as exc:  # re-raised as itself by __iter__ (DALI would wrap it)
            self._error = exc
            raise

    def _pipeline(self) -> Any:
        from nvidia.dali import fn, pipeline_def

        g, gpu = self.graph, self.cuda

        @pipeline_def(batch_size=self.sampler.local_batch * self.multiplier, num_threads=max(1, self.threads),
                      prefetch_queue_depth=max(1, self.prefetch),
                      device_id=(self.device.index or 0) if gpu else None, exec_dynamic=True)
        def pipe():  # noqa: ANN202
            inputs = fn.external_source(source=self._next, num_outputs=len(g.layouts()), batch=True,
                                        layout=g.layouts(), dtype=g.dtypes())
            if gpu and not getattr(g, "host_inputs", False):
                inputs = [x.gpu() for x in inputs]
            return tuple(g.graph(list(inputs), "gpu" if gpu else "cpu"))

        p = pipe()
        p.build()
        return p

    def __iter__(self) -> Iterator[Any]:
        raw = lambda idx: self.graph.inputs([self.source[int(i)] for i in idx])  # noqa: E731
        batches = self.sampler.batches()
        k = self.multiplier
        groups = [batches[i:i + k] for i in range(0, len(batches), k)]  # the super-batches' parts
        supers = [np.concatenate(g) for g in groups] if k > 1 else batches
        self._source = prefetch_map(raw, supers, self.threads, self.prefetch)
        parts = iter(groups)
        self._error = None
        pipe = self._pipeline()
        try:
            while True:
                try:
                    outs = pipe.run()
                except StopIteration:
                    return
                except Exception:
                    if self._error is not None:
                        raise self._error from None
                    raise
                whole = self.graph.to_batch([tensor_to_torch(o, self.device) for o in outs])
                if k == 1:
                    yield whole
                    continue
                yield from zip_batches(whole, [len(b) for b in next(parts)])
        finally:
            del pipe


def zip_batches(batch: Any, sizes: list[int]) -> Iterator[Any]:
    """A super-batch cut along dim 0 into batches of ``sizes`` (views; tuples/lists/dicts of tensors)."""
    from hpcbench.common.data.cache import rebuild, tensor_leaves

    leaves = tensor_leaves(batch)
    if leaves is None:
        raise TypeError("data.dali_batch_multiplier > 1 needs batches that are trees of tensors")
    parts = [torch.split(t, sizes) for t in leaves]
    for j in range(len(sizes)):
        yield rebuild(batch, [p[j] for p in parts])
