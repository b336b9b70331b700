"""CosmoFlow on the harness: the spec (data, model, loss, metric, target, MLPerf keys)."""
from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from hpcbench.common.workload import Workload

from . import BENCHMARK
from .config import CosmoFlowConfig
from .dataset import CosmoFlowData
from .synth import CosmoFlowDatagen

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from torch import nn

Batch = tuple["torch.Tensor", "torch.Tensor"]


class CosmoFlowWorkload(CosmoFlowDatagen, Workload[CosmoFlowConfig]):
    record = BENCHMARK
    config_cls = CosmoFlowConfig

    def __init__(self, cfg: CosmoFlowConfig) -> None:
        super().__init__(cfg)
        d = cfg.data
        self._spec = CosmoFlowData(d.size, d.n_train, d.n_eval, cfg.train.channels_last is True)


    # data ---------------------------------------------------------------------------------
    def dataset(self) -> CosmoFlowData:
        return self._spec

    # model and maths ----------------------------------------------------------------------
    def build_model(self) -> "nn.Module":
        from .model import CosmoFlowNet

        return CosmoFlowNet(self.cfg.model, self.cfg.data.size)

    def no_weight_decay(self, name: str) -> bool:
        """Every tensor but the hidden Dense kernels: the reference's l2 regularizer is on those alone."""
        from .model import decayed_names

        return name not in decayed_names(self.cfg.model)

    def forward(self, model: "nn.Module", batch: Batch) -> "torch.Tensor":
        return model(batch[0])

    def loss(self, outputs: "torch.Tensor", batch: Batch) -> "torch.Tensor":
        """Sum of squared errors over the batch's samples and parameters, in float32."""
        return (outputs.float() - batch[1]).square().sum()

    def loss_count(self, batch: Batch) -> "torch.Tensor":
        """The number of target values, made on the targets' device (no host copy)."""
        import torch

        y = batch[1]
        return y.new_full((), float(y.numel()), dtype=torch.float32)

    def eval_sums(self, outputs: "torch.Tensor", batch: Batch) -> Mapping[str, "torch.Tensor"]:
        err = (outputs.float() - batch[1]).abs()
        return {"abs_error": err.sum(), "count": err.new_full((), float(err.numel()))}

    def metric(self, sums: Mapping[str, float]) -> float:
        """Mean absolute error over every validation sample and all 4 parameters."""
        return float(sums["abs_error"]) / max(float(sums["count"]), 1.0)

    def hyperparameters(self) -> dict[str, Any]:
        return {**super().hyperparameters(), "dropout": self.cfg.model.dropout}
