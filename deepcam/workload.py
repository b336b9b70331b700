"""The DeepCAM workload spec: data, DeepLabv3+ model, weighted cross-entropy, IoU, LAMB keys."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from hpcbench.common.workload import Workload

from . import BENCHMARK
from .config import DeepCAMConfig
from .data import NUM_CLASSES
from .datagen import DeepCAMDatagen
from .dataset import Batch, DeepCAMData
from .metric import class_weights, iou_per_sample, weighted_cross_entropy_sum
from .model import OUTPUT_STRIDE, DeepLabV3Plus


class DeepCAMWorkload(DeepCAMDatagen, Workload[DeepCAMConfig]):
    record = BENCHMARK
    config_cls = DeepCAMConfig

    def __init__(self, cfg: DeepCAMConfig) -> None:
        super().__init__(cfg)
        d = cfg.data
        self.weights = class_weights(d.class_frequencies, d.loss_weight_pow)
        self._device_weights: dict[torch.device, torch.Tensor] = {}
        self._spec = DeepCAMData(d.channels, cfg.train.channels_last is True, d.stats_file, d.train_split,
                                 d.eval_split, grid_multiple=OUTPUT_STRIDE)

    # data ---------------------------------------------------------------------------------
    def dataset(self) -> DeepCAMData:
        return self._spec

    # model and maths ----------------------------------------------------------------------
    def build_model(self) -> nn.Module:
        return DeepLabV3Plus(self.cfg.model)

    def forward(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        return model(batch[0])

    def on_device(self, device: torch.device) -> None:
        self.class_weights_on(device)  # filled here, not in the first compiled step (a recompile)

    def class_weights_on(self, device: torch.device) -> torch.Tensor:
        """The class weights on ``device``, copied there once (a step never copies from the host)."""
        if device not in self._device_weights:
            self._device_weights[device] = self.weights.to(device)
        return self._device_weights[device]

    def loss(self, outputs: torch.Tensor, batch: Batch) -> torch.Tensor:
        return weighted_cross_entropy_sum(outputs, batch[1], self.class_weights_on(outputs.device))

    def loss_count(self, batch: Batch) -> torch.Tensor:
        labels = batch[1]
        return labels.new_full((), labels.numel(), dtype=torch.float32)  # pixels, made on the device

    def eval_sums(self, outputs: torch.Tensor, batch: Batch) -> Mapping[str, torch.Tensor]:
        iou = iou_per_sample(outputs.argmax(1), batch[1], NUM_CLASSES)
        return {"iou_sum": iou.sum(), "samples": iou.new_full((), iou.numel())}

    def metric(self, sums: Mapping[str, float]) -> float:
        return float(sums["iou_sum"]) / max(1.0, float(sums["samples"]))

    def hyperparameters(self) -> dict[str, Any]:
        return {"batchnorm_group_size": self.cfg.train.bn_group_size, **super().hyperparameters()}


