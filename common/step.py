"""One training iteration, three ways (``train.graph``): ``eager``, ``compile`` and ``cuda_graph``.

An iteration is: zero the flat gradient, forward + loss under autocast, (scaled) backward, gradient
sync inside the optimizer, LR from the device step counter, optimizer step, loss-scale update. It
returns the loss as a device tensor and never reads anything back to the host.

* ``eager``: the iteration as plain PyTorch ops; always available.
* ``compile``: forward + loss go through ``torch.compile`` (backward through AOTAutograd); the
  collectives and the optimizer stay eager. Works on CPU (needs a C compiler) and GPU.
* ``cuda_graph`` (CUDA and static shapes only): the *whole* iteration - forward, loss, backward,
  all-reduce/reduce-scatter, optimizer, LR schedule, loss scale - is captured once into a CUDA graph
  on static input buffers after a warm-up on a side stream, then replayed each step. The warm-up
  steps are undone (parameters, optimizer and scaler state restored), so replay follows exactly the
  eager trajectory. A batch whose shapes differ from the captured one (a short last batch) runs eagerly.
  A workload whose batches are padded to a few fixed shapes (``static_shape_count`` > 1, e.g. OC20 with
  ``data.static_shapes``) gets one graph per shape, up to that many (all in one memory pool: they are
  never replayed at the same time); further shapes run eagerly.

With ``static_shape_count`` > 1, ``compile`` compiles each shape statically (``dynamic=False``; dynamo's
recompile limit is raised to the shape count).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from .errors import ConfigError
from .flat import FlatParams
from .optim import FlatOptimizer
from .precision import Precision, to_channels_last
from .schedule import Schedule


def tree_map(fn: Callable[[torch.Tensor], torch.Tensor], batch: Any) -> Any:
    """Apply ``fn`` to every tensor in nested dicts/lists/tuples (other objects are kept)."""
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(batch, Mapping):
        return {k: tree_map(fn, v) for k, v in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # namedtuple
        return type(batch)(*(tree_map(fn, v) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(tree_map(fn, v) for v in batch)
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):  # e.g. OC20's GraphBatch
        return dataclasses.replace(batch, **{f.name: tree_map(fn, getattr(batch, f.name))
                                             for f in dataclasses.fields(batch) if f.init})
    return batch  # other objects (e.g. a torch_geometric Batch) are left to the workload


def tensors_of(batch: Any) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    tree_map(lambda t: out.append(t) or t, batch)
    return out


def prepare_batch(batch: Any, device: torch.device, channels_last: bool) -> Any:
    """Batch on the device (non-blocking copies), image tensors channels-last when asked."""
    def move(t: torch.Tensor) -> torch.Tensor:
        t = t.to(device, non_blocking=True) if t.device != device else t
        return to_channels_last(t) if channels_last else t

    if hasattr(batch, "to") and not isinstance(batch, torch.Tensor) and not isinstance(batch, (Mapping, list, tuple)):
        batch = batch.to(device)  # objects with their own .to (torch_geometric Batch)
    return tree_map(move, batch)


def split_batch(batch: Any, parts: int) -> list[Any]:
    """``batch`` cut into ``parts`` micro-batches along every tensor's first (sample) dimension."""
    if parts == 1:
        return [batch]
    n = tensors_of(batch)[0].shape[0]
    if n % parts:
        raise ConfigError(f"config key 'train.grad_accum' = {parts}: a rank's batch of {n} samples does not split "
                          f"into {parts} equal micro-batches")
    return [tree_map(lambda t, i=i: t.tensor_split(parts)[i], batch) for i in range(parts)]


class TrainStep:
    """Callable ``step(batch) -> loss tensor`` for the configured graph mode."""

    def __init__(self, workload: Any, model: nn.Module, flat: FlatParams, optimizer: FlatOptimizer,
                 schedule: Schedule, precision: Precision, mode: str = "eager", warmup_iters: int = 3,
                 world: int = 1, accum: int = 1, average: Any = None) -> None:
        self.workload, self.model, self.flat = workload, model, flat
        self.average = average  # common.swa.WeightAverage, updated after every optimizer step (or None)
        self.world = world
        self.accum = accum  # micro-batches per step (gradient accumulation, train.grad_accum)
        self.optimizer, self.schedule, self.precision = optimizer, schedule, precision
        self._origin = float(optimizer.step_origin)  # FlatOptimizer.step_origin (0: no initial state)
        self.mode = mode
        self.warmup_iters = warmup_iters
        # CUDA graphs by the shapes of the batch's tensors: (graph, static batch, static loss)
        self._graphs: dict[tuple[tuple[int, ...], ...], tuple[Any, Any, torch.Tensor]] = {}
        self._pool: Any = None
        self.max_graphs = max(1, int(getattr(workload, "static_shape_count", 1)))
        self._fwd_loss: Callable[[Any], torch.Tensor] = self._forward_loss
        on_device = getattr(workload, "on_device", None)  # device constants, before anything is compiled
        if on_device is not None:
            on_device(flat.device)
        if mode == "compile":
            static = getattr(workload, "static_shapes", True)
            dynamic = None if static else True
            if static and self.max_graphs > 1:  # a few fixed shapes: each compiled as it is
                import torch._dynamo.config as dynamo_config

                dynamic = False
                for key in ("cache_size_limit", "recompile_limit"):
                    if hasattr(dynamo_config, key):
                        setattr(dynamo_config, key, max(getattr(dynamo_config, key), self.max_graphs + 1))
            self._fwd_loss = torch.compile(self._forward_loss, dynamic=dynamic)
        elif mode == "cuda_graph":
            if flat.device.type != "cuda":
                raise ConfigError("config key 'train.graph': cuda_graph needs a CUDA device; use compile or eager")
            if not getattr(workload, "static_shapes", True):
                raise ConfigError(f"config key 'train.graph': workload '{workload.name}' has dynamic shapes; "
                                  "CUDA graphs need static ones (use compile or eager)")
        elif mode != "eager":
            raise ConfigError(f"config key 'train.graph': expected eager, compile or cuda_graph, got {mode!r}")
        if flat.outside and mode == "cuda_graph":
            raise ConfigError("config key 'train.graph': the model has sparse embedding gradients (their row count "
                              "changes every step), which a CUDA graph cannot capture; use eager or compile, or "
                              "set the workload's sparse-gradient switch (e.g. model.sparse_grads) to false")
        if getattr(optimizer, "sharded", False) and getattr(flat, "tensors", None) is not None:
            if mode == "cuda_graph":
                raise ConfigError("config key 'train.graph': the model shards its own parameters (FSDP/tensor "
                                  "parallel), whose collectives this harness does not capture; use eager or compile")
            if precision.scaled:
                raise ConfigError("config key 'train.precision': fp16 loss scaling is not offered for a model that "
                                  "shards its own parameters; use bf16 or fp32")
        if accum < 1:
            raise ConfigError(f"config key 'train.grad_accum': must be >= 1, got {accum}")
        if accum > 1 and mode == "cuda_graph":
            raise ConfigError("config keys 'train.grad_accum' > 1 and 'train.graph' = cuda_graph are not combined; "
                              "use eager or compile")
        if flat.outside and precision.scaled:
            raise ConfigError("config key 'train.precision': fp16 loss scaling covers the flat gradient only, not the "
                              "sparse embedding gradients; use bf16 or fp32")

    def _forward_loss(self, batch: Any) -> torch.Tensor:
        outputs = self.workload.forward(self.model, batch)
        return self.workload.loss(outputs, batch)

    def _loss_count(self, batch: Any) -> tuple[torch.Tensor | None, Any]:
        """The workload's loss count summed over the instance, started before the forward pass so
        the all-reduce overlaps it: (count, pending handle)."""
        count = self.workload.loss_count(batch)
        if count is None:
            return None, None
        if count.device != self.flat.device and self.mode == "cuda_graph":
            # a host tensor copied inside a captured step is an error in CUDA (and a sync outside it)
            raise ConfigError(f"workload '{self.workload.name}': loss_count() returned a tensor on {count.device}, "
                              f"the step runs on {self.flat.device}; make it on the batch's device "
                              "(e.g. labels.new_full((), n)) so the step can be captured in a CUDA graph")
        count = count.detach().to(self.flat.device, torch.float32).reshape(())
        handle = None
        if self.world > 1:
            import torch.distributed as dist

            handle = dist.all_reduce(count, async_op=True)
        return count, handle

    def eager(self, batch: Any) -> torch.Tensor:
        self.flat.zero_grad()
        count, handle = self._loss_count(batch)
        micro = split_batch(batch, self.accum)
        sync = getattr(self.model, "set_requires_gradient_sync", None)  # FSDP2: reduce after the last one only
        total: torch.Tensor | None = None
        for i, part in enumerate(micro):
            if sync is not None and len(micro) > 1:
                sync(i == len(micro) - 1)
            with self.precision.autocast():
                loss = self._fwd_loss(part)
            if count is not None:
                if handle is not None:
                    handle.wait()
                    handle = None
                # gradients are averaged over the ranks: scale so the result is the global mean
                loss = loss.float() * self.world / count.clamp(min=1.0)
            elif len(micro) > 1:
                loss = loss / len(micro)  # per-rank means: the step's is their mean
            self.precision.backward(loss)
            total = loss.detach() if total is None else total + loss.detach()
        assert total is not None
        loss = total
        self.flat.check_grads()
        skip = self.precision.unscale_(self.flat.grads)
        # the schedule counts this run's steps (the OpenFold reference's scheduler gets the run's iteration, while
        # Adam goes on from the initial checkpoint's step)
        lr = self.schedule(self.optimizer.step_count - self._origin if self._origin else self.optimizer.step_count)
        self.optimizer.step(lr, skip)
        if self.average is not None:
            self.average.update()
        self.precision.update(skip)
        return loss.detach().float()

    def __call__(self, batch: Any) -> torch.Tensor:
        if self.mode != "cuda_graph":
            return self.eager(batch)
        tensors = tensors_of(batch)
        key = tuple(tuple(t.shape) for t in tensors)
        if key not in self._graphs:
            if len(self._graphs) >= self.max_graphs:
                return self.eager(batch)  # e.g. a short last batch
            self._graphs[key] = self._capture(batch)
        graph, static_batch, static_loss = self._graphs[key]
        for dst, src in zip(tensors_of(static_batch), tensors):
            dst.copy_(src, non_blocking=True)
        graph.replay()
        return static_loss.clone()

    @property
    def graph_count(self) -> int:
        """CUDA graphs captured so far (one per batch shape)."""
        return len(self._graphs)

    # CUDA graph -------------------------------------------------------------------------------
    def _snapshot(self) -> list[torch.Tensor]:
        return [t.clone() for t in self._live()]

    def _live(self) -> list[torch.Tensor]:
        """Every tensor a training step mutates: parameters, optimizer, scaler, module buffers."""
        opt = self.optimizer
        averaged = self.average.tensors() if self.average is not None else []
        return [self.flat.params, opt.step_count, *opt.state.values(), self.precision.scale,
                self.precision.growth_tracker, *self.model.buffers(), *averaged]

    def _restore(self, saved: list[torch.Tensor]) -> None:
        for dst, src in zip(self._live(), saved):
            dst.copy_(src)

    def _capture(self, batch: Any) -> tuple[Any, Any, torch.Tensor]:
        """Warm up on ``batch``'s shapes (undone), then capture one step on static copies of its tensors."""
        static_batch = tree_map(lambda t: t.clone(), batch)
        saved = self._snapshot()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(self.warmup_iters):
                self.eager(static_batch)
        torch.cuda.current_stream().wait_stream(side)
        self._restore(saved)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):  # records the kernels; nothing runs until replay
            static_loss = self.eager(static_batch)
        if self._pool is None:
            self._pool = graph.pool()  # later shapes share the first graph's memory pool
        torch.cuda.synchronize()
        return graph, static_batch, static_loss
