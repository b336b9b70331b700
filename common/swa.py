"""Weight averaging for evaluation (``optim.swa_decay``): an exponential moving average of the parameters that
the evaluations use instead of the trained weights.

After every optimizer step the average moves towards the new parameters: the first update copies them, each
later one computes ``avg + (params - avg) * (1 - decay)``, as ``torch.optim.swa_utils.AveragedModel`` with the
averaging function the MLPerf HPC OpenFold reference gives it (``openfold/swa.py``, "SWA" in its logs and in
``closed_openfold.yaml``: ``swa_enabled``, ``swa_decay_rate``). The average is one flat buffer beside
:class:`~hpcbench.common.flat.FlatParams` (alignment gaps stay zero), updated on the device without a host read,
so it is captured with the rest of a CUDA-graph step. An evaluation swaps it in for its duration
(:meth:`WeightAverage.applied`); module buffers (BatchNorm statistics) stay the trained model's, as
``AveragedModel(use_buffers=False)`` keeps them out of the average.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from .errors import ConfigError
from .flat import FlatParams


class WeightAverage:
    def __init__(self, flat: FlatParams, decay: float) -> None:
        if not 0.0 < decay < 1.0:
            raise ConfigError(f"config key 'optim.swa_decay': the averaging decay must be in (0, 1) (0 turns the "
                              f"average off), got {decay}")
        if flat.outside:
            raise ConfigError("config key 'optim.swa_decay': parameters with sparse gradients live outside the flat "
                              "buffer and are not averaged; set optim.swa_decay = 0")
        self.flat, self.decay = flat, decay
        self.average = flat.params.detach().clone()
        self.count = torch.zeros((), dtype=torch.int64, device=flat.params.device)  # updates so far

    def tensors(self) -> list[torch.Tensor]:
        """What an update mutates (a CUDA-graph capture snapshots and restores them)."""
        return [self.average, self.count]

    @torch.no_grad()
    def update(self) -> None:
        """Fold the current parameters in (call after each optimizer step)."""
        weight = torch.where(self.count == 0, 1.0, 1.0 - self.decay).to(self.average.dtype)
        self.average.add_((self.flat.params - self.average) * weight)
        self.count.add_(1)

    @contextmanager
    def applied(self) -> Iterator[None]:
        """The averaged weights in the model for the block's duration, the trained ones restored after it.
        Before the first update the average equals the starting weights."""
        saved = self.flat.params.detach().clone()
        with torch.no_grad():
            self.flat.params.copy_(self.average)
        try:
            yield
        finally:
            with torch.no_grad():
                self.flat.params.copy_(saved)

    def state_dict(self) -> dict[str, Any]:
        return {"average": self.average.detach().cpu().clone(), "count": int(self.count), "decay": self.decay}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        avg = state["average"]
        if tuple(avg.shape) != tuple(self.average.shape):
            raise ConfigError(f"the checkpoint's weight average has {avg.numel()} elements, the model's flat buffer "
                              f"{self.average.numel()}: written for a different model; remove it or change "
                              "train.checkpoint_dir")
        self.average.copy_(avg.to(self.average.device, self.average.dtype))
        self.count.fill_(int(state["count"]))
