"""The base of the optimizers over a :class:`~hpcbench.common.flat.FlatParams` buffer (:mod:`hpcbench.common.optim`
has the algorithms, :mod:`hpcbench.common.apex_optim` apex's fused LAMB): step counter, gradient sync, state."""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from .errors import ConfigError
from .flat import FlatParams
from .runconfig import OptimConfig
from .sparse_optim import SparseAdagrad


def _assign(dst: torch.Tensor, new: torch.Tensor, skip: torch.Tensor | None) -> None:
    dst.copy_(new if skip is None else torch.where(skip > 0, dst, new))


def _momentum_skipping(buf: torch.Tensor, d: torch.Tensor, momentum: float, nesterov: bool,
                       skip: torch.Tensor | None) -> torch.Tensor:
    """Heavy-ball (or Nesterov) momentum on the step ``d`` that leaves ``buf`` as it was when ``skip`` is
    set (fp16 overflow: the step is dropped on the device, no host sync; None: never skipped); returns the
    update direction."""
    new_buf = momentum * buf + d
    _assign(buf, new_buf, skip)
    return d + momentum * new_buf if nesterov else new_buf


class FlatOptimizer:
    """Base: owns the step counter, the instance's gradient sync and the state for checkpoints."""

    sharded = False

    def __init__(self, flat: FlatParams, cfg: OptimConfig, world: int = 1, rank: int = 0) -> None:
        self.flat, self.cfg, self.world, self.rank = flat, cfg, world, rank
        self.step_count = torch.zeros((), device=flat.device)  # applied steps, float32 on the device
        #: the step count an initial optimizer state brought (:meth:`load_initial`): Adam's bias correction
        #: goes on from it, while the schedule and the run's step count start at 0 (``step_count - step_origin``)
        self.step_origin = 0.0
        self.state: dict[str, torch.Tensor] = {}
        #: the row-wise optimizer of the parameters outside the flat buffer (sparse gradients), if any
        self.sparse: SparseAdagrad | None = None

    def sync_grads(self) -> None:
        """Average the gradients over the instance. A model-parallel part (after ``shared_size``)
        already holds the sum of every rank's gradient: it is divided, not reduced."""
        if self.world > 1:
            flat = self.flat
            dist.all_reduce(flat.grads[: flat.shared_size] if flat.has_local else flat.grads)
            flat.grads.div_(self.world)

    def step(self, lr: torch.Tensor, skip: torch.Tensor | None = None) -> None:
        self.sync_grads()
        self._update(self.flat.params, self.flat.grads, lr, skip)
        if self.sparse is not None:
            self.sparse.step(lr, self.step_count, skip)
        self.step_count.add_(1.0 if skip is None else 1.0 - skip)

    def _update(self, p: torch.Tensor, g: torch.Tensor, lr: torch.Tensor, skip: torch.Tensor | None) -> None:
        raise NotImplementedError

    def _zeros(self, n: int) -> torch.Tensor:
        return torch.zeros(n, device=self.flat.device, dtype=self.flat.params.dtype)

    # checkpoints (this rank's state; sharded optimizers hold only their shard) ------------------
    def state_dict(self) -> dict[str, Any]:
        out = {"step": self.step_count.clone(), **{k: v.clone() for k, v in self.state.items()}}
        if self.sparse is not None:
            out["sparse"] = self.sparse.state_dict()
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if (self.sparse is None) != ("sparse" not in state):
            raise ConfigError("optimizer state: the checkpoint " + ("has" if "sparse" in state else "lacks")
                              + " the row-wise (sparse-gradient) part that this run " + ("lacks" if self.sparse is None else "has"))
        if self.sparse is not None:
            self.sparse.load_state_dict(state["sparse"])
        self.step_count.copy_(state["step"])
        for k, v in self.state.items():
            if k not in state:
                raise ConfigError(f"optimizer state '{k}' is missing from the checkpoint (another optimizer?)")
            if state[k].shape != v.shape:
                raise ConfigError(f"optimizer state '{k}' has shape {tuple(state[k].shape)}, expected {tuple(v.shape)}")
            v.copy_(state[k])

    def load_initial(self, state: dict[str, Any], where: str) -> None:
        """Start from per-parameter state (:meth:`Workload.initial_optimizer_state`): each state buffer from its
        list of tensors, one per parameter in the flat buffer's order, and the step count."""
        if self.sharded or self.sparse is not None:
            raise ConfigError(f"{where}: an initial optimizer state is loaded into a whole flat optimizer only "
                              "(not a sharded one, not with sparse-gradient parameters)")
        for name, buf in self.state.items():
            tensors = state.get(name)
            if not isinstance(tensors, list) or len(tensors) != self.flat.num_tensors:
                raise ConfigError(f"{where}: initial optimizer state '{name}' needs one tensor per parameter "
                                  f"({self.flat.num_tensors}), got {type(tensors).__name__}"
                                  + (f" of {len(tensors)}" if isinstance(tensors, list) else ""))
            for t, n, pname in zip(tensors, self.flat.numels, self.flat.names):
                if t.numel() != n:
                    raise ConfigError(f"{where}: initial optimizer state '{name}' of {pname} has {t.numel()} "
                                      f"elements, the parameter {n}")
            buf.copy_(self.flat.flatten([t.to(buf.device, buf.dtype) for t in tensors]))
        self.step_origin = float(state.get("step", 0))
        self.step_count.fill_(self.step_origin)

    def state_numel(self) -> int:
        """Elements of optimizer state this rank holds (the row-wise part's included)."""
        return sum(v.numel() for v in self.state.values()) + (self.sparse.state_numel() if self.sparse else 0)
