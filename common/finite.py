"""Stop a run whose training loss stops being a finite number.

The step returns the loss as a device tensor and the harness never reads it back per step, so the check
must not either: :class:`LossWatch` keeps, on the device, the first step of the epoch whose loss was NaN or
inf and that loss (a few tiny device ops per step, no host sync, nothing added inside a captured CUDA
graph), and :meth:`LossWatch.check` reads them back only where the harness already waits for the
device: every ``train.log_every`` steps (the progress read-back), before an evaluation inside the epoch and
at the epoch's end. A NaN therefore stops the run at the next of those points (at once with
``train.log_every = 1``; within the epoch with the default ``log_every = 0``), and the error names the step
where it happened.

What is checked is the loss value itself (unscaled, fp32). With fp16 loss scaling an overflow of the
*scaled gradients* leaves that loss finite and the scaler skips the step: that is not an error. A loss
that is NaN or inf before scaling is one in every precision (scaling acts after the forward pass and
cannot cure it).

The ranks of an instance agree: at a check point the first bad step over the instance's training ranks
is all-reduced (one host collective of a tuple, at the check points only), so every rank stops with the
same :class:`NonFiniteLossError` instead of the healthy ones blocking in the next step's collective.
"""
from __future__ import annotations

import math
from typing import Any

import torch

from .dist import bounded
from .errors import HpcbenchError


class NonFiniteLossError(HpcbenchError):
    """The training loss became NaN or inf: the run stops (MLPerf ``run_stop`` status aborted)."""


def _kind(value: float) -> str:
    return "NaN" if math.isnan(value) else ("+inf" if value > 0 else "-inf")


class LossWatch:
    """The first non-finite loss of one epoch on this rank, kept on the device."""

    NONE = -1

    def __init__(self, device: torch.device) -> None:
        self.first = torch.full((), self.NONE, dtype=torch.int64, device=device)  # step (1-based) or NONE
        self.value = torch.zeros((), dtype=torch.float32, device=device)

    def observe(self, loss: torch.Tensor, step: int) -> None:
        """Record ``loss`` of this epoch's step ``step`` (1-based); device ops only."""
        loss = loss.detach().reshape(()).float()
        new = torch.logical_and(~torch.isfinite(loss), self.first < 0)
        self.first = torch.where(new, step, self.first)
        self.value = torch.where(new, loss, self.value)

    def check(self, comm: Any, rank: int, where: str, epoch: int, steps_per_epoch: int,
              steps_before_epoch: int) -> None:
        """Read the record back (the caller is at a point where the harness syncs anyway); raise
        :class:`NonFiniteLossError` on every rank of the instance when any of them saw a non-finite loss.
        ``comm``: the instance's training ranks (MPI, None for one rank); ``where``: the workload's name."""
        first, value = int(self.first.item()), float(self.value.item())
        mine = (first, rank, value) if first != self.NONE else None
        if comm is not None and comm.Get_size() > 1:
            with bounded("the non-finite loss check (MPI allgather)"):
                seen = [s for s in comm.allgather(mine) if s is not None]
            bad = min(seen, key=lambda s: (s[0], s[1])) if seen else None
        else:
            bad = mine
        if bad is None:
            return
        step, at_rank, loss = bad
        raise NonFiniteLossError(
            f"{where}: the training loss is {_kind(loss)} at epoch {epoch}, step {step}/{steps_per_epoch} "
            f"(global step {steps_before_epoch + step}) on rank {at_rank} of the instance; the run stops "
            "(run_stop status aborted). Look for a non-finite input or label, a too high learning rate, or "
            "fp16 overflow in the forward pass")
