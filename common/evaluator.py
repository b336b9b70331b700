"""The evaluator part: the quality metric of the model as it is, over the whole validation split.

Used by the training ranks (inline evaluations) and by dedicated evaluation ranks
(:mod:`hpcbench.common.async_eval`) alike; it gets the parts it needs (workload maths, model, precision,
the loader of this rank's share, the layout object for the sums), never the trainer.

Two kinds (the workload's ``eval_kind``): ``sums``, additive statistics per batch summed over the
batches and the part's ranks, then ``metric``; ``samples``, every sample's outputs kept on its rank and
combined by ``metric_of_samples`` with the layout object's gathers (exact AUROC).
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from .dist import bounded
from .precision import Precision
from .step import prepare_batch

if TYPE_CHECKING:  # pragma: no cover
    from .parallel import Parallel
    from .workload import EpochLoader, Workload


class Evaluator:
    def __init__(self, workload: "Workload", model: nn.Module, precision: Precision, parallel: "Parallel",
                 channels_last: bool) -> None:
        self.workload, self.model, self.precision, self.parallel = workload, model, precision, parallel
        self.device = parallel.device
        self.channels_last = channels_last
        self.loader: "EpochLoader | None" = None  # this rank's share of the validation split (set once loaded)

    def metric(self, epoch: int) -> float:
        """The metric over the whole validation split, split over the part's ranks; no logging, BatchNorm
        statistics as they are."""
        self.model.eval()
        assert self.loader is not None, "the evaluator's loader is set before the first evaluation"
        self.loader.set_epoch(epoch)
        value = self._samples() if self.workload.eval_kind == "samples" else self._sums()
        self.model.train()
        return value

    def _forward(self, batch: Any) -> Any:  # noqa: ANN401
        with self.precision.autocast():
            return self.workload.forward(self.model, batch)

    def _batches(self) -> Iterator[Any]:
        assert self.loader is not None
        for batch in self.loader:
            yield prepare_batch(batch, self.device, self.channels_last)

    def _grad(self) -> Any:  # noqa: ANN401
        return torch.enable_grad() if self.workload.eval_needs_grad else torch.no_grad()

    def _sums(self) -> float:
        sums: dict[str, torch.Tensor] = {}
        for batch in self._batches():
            with self._grad():
                stats = self.workload.eval_sums(self._forward(batch), batch)
            for k, v in stats.items():
                v = torch.as_tensor(v).detach().to(self.device, torch.float64).sum()
                sums[k] = sums[k] + v if k in sums else v
        with bounded("the evaluation's metric keys (MPI allgather)"):
            keys = sorted(set().union(*self.parallel.comm.allgather(sorted(sums))))
        packed = torch.stack([sums.get(k, torch.zeros((), dtype=torch.float64, device=self.device)) for k in keys])
        self.parallel.sum(packed)
        return float(self.workload.metric(dict(zip(keys, packed.tolist()))))

    def _samples(self) -> float:
        kept: dict[str, list[torch.Tensor]] = {}
        with self._grad():
            for batch in self._batches():
                for k, v in self.workload.eval_samples(self._forward(batch), batch).items():
                    kept.setdefault(k, []).append(v.detach())
        return float(self.workload.metric_of_samples({k: torch.cat(v) for k, v in kept.items()}, self.parallel))
