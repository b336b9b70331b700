"""Parameters that the model shards itself (FSDP2 ``fully_shard`` over the data-parallel ranks, tensor
parallelism's DTensors over the tensor-parallel ranks): the harness's counterparts of the flat buffer, its
optimizer and its checkpoint part.

A workload whose ``distribute`` returns such a model sets ``Workload.shards_parameters``; the harness then
builds, instead of :class:`~hpcbench.common.flat.FlatParams` and a flat optimizer:

* :class:`ShardedParams`: the model's parameters as they are (DTensors on a sharded run, plain tensors on one
  process), with the flat buffer's interface the step uses (``zero_grad``, ``check_grads``, ``grads``);
  gradients arrive already reduced (FSDP2's reduce-scatter averages over the data-parallel ranks, the
  tensor-parallel collectives run inside the model), so nothing here all-reduces them;
* :class:`ShardedAdamW`: decoupled AdamW (PyTorch's formula) on each rank's local shards, with clipping by the
  global gradient norm: every rank adds the squares of its local shard of each gradient divided by how many
  ranks hold that same shard (a DTensor replicated over a mesh dimension, a plain tensor every rank holds), one
  all-reduce gives the exact global sum. Sync-free: the rate and the step counter are device tensors;
* :class:`ShardedModel` / the optimizer as checkpoint parts whose state dicts hold DTensors: the checkpoint
  manager writes them with ``torch.distributed.checkpoint`` (each rank its own shards, one metadata file) and
  loads them back into the same layout (:mod:`hpcbench.common.checkpoint`).
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from .errors import ConfigError
from .runconfig import OptimConfig

_DTENSOR: type | None = None


def dtensor_class() -> type:
    """torch's DTensor class, imported on first use: importing it costs every process ~0.6 s (the symbolic
    shape code and sympy), and only a sharded model needs it (the harness imports this module always)."""
    global _DTENSOR
    if _DTENSOR is None:
        try:  # torch >= 2.4
            from torch.distributed.tensor import DTensor
        except ImportError:  # pragma: no cover - older torch
            from torch.distributed._tensor import DTensor  # type: ignore[no-redef]
        _DTENSOR = DTensor
    return _DTENSOR


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of ``t`` (the tensor itself when it is not a DTensor); a view that in-place ops update."""
    return t._local_tensor if isinstance(t, dtensor_class()) else t


def holders(t: torch.Tensor, world: int) -> int:
    """How many of the ``world`` ranks hold this rank's part of ``t``: every rank for a plain tensor, ``world``
    over the number of distinct shards for a DTensor (a mesh dimension it is replicated over repeats them)."""
    if not isinstance(t, dtensor_class()):
        return world
    shards = 1
    for size, placement in zip(t.device_mesh.shape, t.placements):
        if not (placement.is_replicate() or placement.is_partial()):  # Shard, and FSDP's _StridedShard over TP
            shards *= size
    return max(1, world // shards)


class ShardedParams:
    """The model's trainable parameters as the model holds them (see the module docstring)."""

    outside: list[nn.Parameter] = []
    has_local = False

    def __init__(self, model: nn.Module, world: int = 1) -> None:
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.names = [n for n, _ in named]
        self.tensors: list[nn.Parameter] = [p for _, p in named]
        self.world = world
        if not self.tensors:
            raise ConfigError("the model has no trainable parameters")
        self.device = local(self.tensors[0]).device
        self.num_tensors = len(self.tensors)
        self.numel = sum(p.numel() for p in self.tensors)  # the whole model's (a DTensor's global numel)

    def __iter__(self) -> Iterator[nn.Parameter]:
        return iter(self.tensors)

    def zero_grad(self) -> None:
        for p in self.tensors:
            p.grad = None

    def check_grads(self) -> None:
        """Autograd's gradients are the ones used (nothing to repair: there are no views into a buffer)."""

    @property
    def grads(self) -> list[torch.Tensor]:
        return [local(p.grad) for p in self.tensors if p.grad is not None]

    def local_numel(self) -> int:
        return sum(local(p).numel() for p in self.tensors)


class ShardedAdamW:
    """AdamW over :class:`ShardedParams` (betas, eps, decoupled weight decay ``weight_decay`` except on the tensors
    ``decay_exempt`` flags, clipping at ``max_grad_norm`` by the global norm); ``step(lr, skip=None)`` as the flat
    optimizers'. State: ``step`` and per parameter ``exp_avg``/``exp_avg_sq`` shaped (and sharded) like it."""

    sharded = True

    def __init__(self, params: ShardedParams, cfg: OptimConfig, decay_exempt: Sequence[bool] = ()) -> None:
        if cfg.name != "adamw":
            raise ConfigError(f"config key 'optim.name': a model that shards its parameters (FSDP/tensor parallel) "
                              f"is trained with adamw here, got {cfg.name!r}")
        if decay_exempt and len(decay_exempt) != params.num_tensors:
            raise ConfigError(f"{len(decay_exempt)} weight-decay flags for {params.num_tensors} parameter tensors")
        self.params, self.cfg = params, cfg
        self.flat = params  # what the harness's step reads (device)
        self.decay = [0.0 if (decay_exempt and decay_exempt[i]) else cfg.weight_decay for i in range(params.num_tensors)]
        self.step_count = torch.zeros((), device=params.device)
        self.step_origin = 0.0  # as FlatOptimizer's: no initial optimizer state is loaded into a sharded one
        self.exp_avg = [torch.zeros_like(p) for p in params.tensors]
        self.exp_avg_sq = [torch.zeros_like(p) for p in params.tensors]
        self.last_grad_norm: torch.Tensor | None = None

    @property
    def state(self) -> dict[str, torch.Tensor]:
        """The local moments by name (a flat optimizer's ``state``; the CUDA-graph snapshot reads it)."""
        out: dict[str, torch.Tensor] = {}
        for n, m, v in zip(self.params.names, self.exp_avg, self.exp_avg_sq):
            out[f"exp_avg.{n}"], out[f"exp_avg_sq.{n}"] = local(m), local(v)
        return out

    def grad_norm(self, grads: list[torch.Tensor]) -> torch.Tensor:
        """The global L2 norm of the gradients over every rank (one all-reduce)."""
        world = self.params.world
        total = torch.zeros((), device=self.params.device, dtype=torch.float64)
        for p, g in zip(self.params.tensors, grads):
            g_local = local(g)
            total = total + g_local.double().pow(2).sum() / holders(g, world)
        if world > 1 and dist.is_initialized():
            dist.all_reduce(total)
        return total.sqrt()

    @torch.no_grad()
    def step(self, lr: torch.Tensor, skip: torch.Tensor | None = None) -> None:
        c = self.cfg
        b1, b2 = c.betas
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params.tensors]
        scale = None
        if c.max_grad_norm > 0:
            norm = self.grad_norm(grads)
            self.last_grad_norm = norm
            scale = torch.clamp(c.max_grad_norm / (norm + 1e-6), max=1.0)
        t = self.step_count + 1
        bc1, bc2 = 1 - b1**t, 1 - b2**t
        keep = None if skip is None else (1.0 - skip)
        for p, g, m, v, wd in zip(self.params.tensors, grads, self.exp_avg, self.exp_avg_sq, self.decay):
            pl, gl, ml, vl = local(p), local(g), local(m), local(v)
            if scale is not None:
                gl = gl * scale.to(gl.dtype)
            new_m = torch.lerp(ml, gl, 1 - b1)
            new_v = vl * b2 + (1 - b2) * gl * gl
            denom = (new_v / bc2).sqrt() + c.eps
            new_p = pl * (1 - lr * wd) if wd else pl
            new_p = new_p - (lr / bc1) * new_m / denom
            if keep is None:
                ml.copy_(new_m)
                vl.copy_(new_v)
                pl.copy_(new_p)
            else:
                ml.copy_(torch.where(keep > 0, new_m, ml))
                vl.copy_(torch.where(keep > 0, new_v, vl))
                pl.copy_(torch.where(keep > 0, new_p, pl))
        self.step_count.add_(1.0 if skip is None else 1.0 - skip)

    # checkpoints: DTensors, written by torch.distributed.checkpoint ------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"step": self.step_count.detach().clone()}
        for n, m, v in zip(self.params.names, self.exp_avg, self.exp_avg_sq):
            out[f"exp_avg.{n}"], out[f"exp_avg_sq.{n}"] = m, v
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        missing = [k for k in self.state_dict() if k not in state]
        if missing:
            raise ConfigError(f"optimizer state {missing[:3]} missing from the checkpoint (another model or optimizer?)")
        self.step_count.copy_(state["step"])
        for n, m, v in zip(self.params.names, self.exp_avg, self.exp_avg_sq):
            if state[f"exp_avg.{n}"] is not m:  # loaded in place by torch.distributed.checkpoint otherwise
                m.copy_(state[f"exp_avg.{n}"])
                v.copy_(state[f"exp_avg_sq.{n}"])

    def state_numel(self) -> int:
        return 2 * self.params.local_numel()


class ShardedModel:
    """Checkpoint part: the model's parameters and persistent buffers as it holds them (DTensors on a sharded run)."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def state_dict(self) -> dict[str, Any]:
        return dict(self.model.state_dict())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        have = self.model.state_dict()
        if sorted(have) != sorted(state):
            extra = sorted(set(have) ^ set(state))[:3]
            raise ConfigError(f"the checkpoint was written for a different model (differing: {', '.join(extra)}); "
                              "remove it or change train.checkpoint_dir")
        self.model.load_state_dict(state)


def is_sharded_part(part: Any) -> bool:  # noqa: ANN401
    return isinstance(part, (ShardedModel, ShardedAdamW))
