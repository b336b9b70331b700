"""Row-wise Adagrad for parameters with sparse gradients (embedding tables) kept outside the flat buffer.

Why: a dense gradient of a 40M x 128 fp32 table is 20 GB, and the flat buffer holds every parameter
and gradient densely. An ``EmbeddingBag(sparse=True)`` gives a COO gradient with one row per looked-up
id, so gradient memory follows the rows a step touched, not the table.

Semantics are :class:`hpcbench.common.optim.Adagrad`'s (torch's): ``sum += g^2``,
``p -= lr / (1 + t * lr_decay) * g / (sqrt(sum) + eps)``, ``sum`` starting at ``initial_accumulator``,
applied to the touched rows only. On untouched rows the dense update is exactly zero (zero gradient),
so this equals dense Adagrad over the table. Weight decay would change every row every step: like
torch's sparse Adagrad it is refused. The gradients are those of the model-parallel tables, which
arrive as the sum over the instance's ranks (through the all-to-all's backward): they are divided by
``world``, as the flat optimizer divides its model-parallel part. The learning rate arrives as a device
tensor from the harness's schedule; ``coalesce`` needs the row count on the host (a sync on GPUs),
which is the price of sparse rows.
"""
from __future__ import annotations

from typing import Any

from collections.abc import Sequence

import torch
from torch import nn

from .errors import ConfigError
from .runconfig import OptimConfig


class SparseAdagrad:
    """Adagrad over ``params`` whose ``.grad`` is sparse (COO, rows along dim 0) or dense; consumes the
    gradient (sets ``.grad`` to None after the update, so its memory goes before the next forward)."""

    def __init__(self, params: Sequence[nn.Parameter], cfg: OptimConfig, world: int = 1) -> None:
        if cfg.name != "adagrad":
            raise ConfigError(f"config key 'optim.name': parameters with sparse gradients are updated by Adagrad "
                              f"only (the row-wise optimizer), got {cfg.name!r}")
        if cfg.weight_decay:
            raise ConfigError(f"config key 'optim.weight_decay': weight decay changes every row of a table every "
                              f"step, which sparse gradients cannot express; got {cfg.weight_decay}, expected 0")
        self.params, self.cfg, self.world = list(params), cfg, world
        self.sums = [torch.full_like(p, float(cfg.initial_accumulator), requires_grad=False) for p in self.params]

    @torch.no_grad()
    def step(self, lr: torch.Tensor, step_count: torch.Tensor, skip: torch.Tensor | None = None) -> None:
        """One update with the learning rate ``lr`` at ``step_count`` steps applied before this one."""
        c = self.cfg
        clr = lr / (1.0 + step_count * c.lr_decay) if c.lr_decay else lr
        for p, acc in zip(self.params, self.sums):
            g = p.grad
            if g is None:
                continue  # not used by this step's loss: nothing to update (dense Adagrad: a zero update)
            if g.is_sparse:
                g = g.coalesce()  # duplicate ids summed
                rows, values = g.indices()[0], g.values()
            else:
                rows, values = torch.arange(p.shape[0], device=p.device), g
            if self.world > 1:
                values = values / self.world
            new_acc = acc.index_select(0, rows).addcmul_(values, values)
            update = values * clr / new_acc.sqrt().add_(c.eps)
            if skip is not None:  # fp16 overflow on some rank: keep rows and sums as they are
                new_acc = torch.where(skip > 0, acc.index_select(0, rows), new_acc)
                update = update * (1.0 - skip)
            acc.index_copy_(0, rows, new_acc)
            p.index_add_(0, rows, update, alpha=-1.0)
            p.grad = None

    def state_numel(self) -> int:
        return sum(s.numel() for s in self.sums)

    # checkpoints: this rank's accumulators (its rows of the tables it holds) -------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"sums": [s.clone() for s in self.sums]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        sums = state["sums"]
        if len(sums) != len(self.sums) or any(a.shape != b.shape for a, b in zip(sums, self.sums)):
            raise ConfigError(f"sparse Adagrad state: {len(sums)} accumulators of shapes "
                              f"{[tuple(a.shape) for a in sums][:4]} saved, {len(self.sums)} of shapes "
                              f"{[tuple(b.shape) for b in self.sums][:4]} here")
        for dst, src in zip(self.sums, sums):
            dst.copy_(src)
