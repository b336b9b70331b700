"""The DeepCAM workload spec: data, DeepLabv3+ model, weighted cross-entropy, IoU, LAMB keys."""
from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from common.errors import ConfigError
from common.workload import DataShard, EpochLoader, Workload

from . import datagen
from .config import DeepCAMConfig
from .data import NUM_CLASSES, Normalizer, ThreadedLoader, list_samples
from .metric import class_weights, iou_per_sample, weighted_cross_entropy_sum
from .model import DeepLabV3Plus

Batch = tuple[torch.Tensor, torch.Tensor]  # (inputs N x C x H x W, labels N x H x W)


class DeepCAMWorkload(Workload[DeepCAMConfig]):
    name = "deepcam"
    benchmark = "deepcam"
    config_cls = DeepCAMConfig
    metric_key = "eval_accuracy"
    higher_is_better = True

    def __init__(self, cfg: DeepCAMConfig) -> None:
        super().__init__(cfg)
        self.weights = class_weights(cfg.data.class_frequencies, cfg.data.loss_weight_pow)
        self._device_weights: dict[torch.device, torch.Tensor] = {}

    # data ---------------------------------------------------------------------------------
    def _root(self) -> Path:
        if not self.cfg.data.root:
            raise ConfigError("config key 'data.root' is empty; pass --data DIR (see `hpcbench datagen deepcam`)")
        return Path(self.cfg.data.root)

    def dataset_sizes(self) -> tuple[int, int]:
        d = self.cfg.data
        return len(list_samples(self._root(), d.train_split)), len(list_samples(self._root(), d.eval_split))

    def _loader(self, split: str, shard: DataShard, train: bool) -> EpochLoader:
        d, t = self.cfg.data, self.cfg.train
        files = list_samples(self._root(), split)  # the clearer error first when the dataset is missing
        norm = Normalizer.from_stats(self._root() / d.stats_file, d.channels)
        loader = ThreadedLoader(files, norm, d.channels, shard.local_batch_size,
                                rank=shard.rank, size=shard.size, seed=shard.seed, shuffle=train,
                                drop_uneven=train, threads=d.threads, prefetch=d.prefetch,
                                channels_last=t.channels_last, pin_memory=shard.device.type == "cuda")
        if t.loader == "dali":
            from .dali import DALILoader

            return DALILoader(loader, device=shard.device)
        return loader

    def train_loader(self, shard: DataShard) -> EpochLoader:
        return self._loader(self.cfg.data.train_split, shard, train=True)

    def eval_loader(self, shard: DataShard) -> EpochLoader:
        return self._loader(self.cfg.data.eval_split, shard, train=False)

    # model and maths ----------------------------------------------------------------------
    def build_model(self) -> nn.Module:
        return DeepLabV3Plus(self.cfg.model)

    def forward(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        return model(batch[0])

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
        o = self.cfg.optim
        names = {"lamb": "LAMB", "adam": "Adam", "adamw": "AdamW", "sgd": "SGD"}
        steps_per_epoch = max(1, self.dataset_sizes()[0] // self.cfg.train.global_batch_size)
        to_steps = steps_per_epoch if o.unit == "epochs" else 1
        keys: dict[str, Any] = {
            "batchnorm_group_size": self.cfg.train.bn_group_size,
            "opt_name": names[o.name],
            "opt_lr": o.lr,
            "opt_betas": list(o.betas),
            "opt_eps": o.eps,
            "opt_weight_decay": o.weight_decay,
            "scheduler_type": {"cosine": "cosine_annealing"}.get(o.schedule, o.schedule),
            "scheduler_lr_warmup_steps": int(round(o.warmup * to_steps)),
            "scheduler_lr_warmup_factor": max(1.0, o.warmup_factor),
        }
        if o.name == "lamb":
            keys.update(opt_bias_correction=o.bias_correction, opt_grad_averaging=o.grad_averaging,
                        opt_max_grad_norm=o.max_grad_norm)
        if o.schedule == "multistep":
            keys.update(scheduler_milestones=[int(round(m * to_steps)) for m in o.milestones],
                        scheduler_decay_rate=o.decay_factor)
        elif o.schedule == "cosine":
            total = o.total * to_steps if o.total > 0 else self.cfg.train.max_epochs * steps_per_epoch
            keys.update(scheduler_t_max=int(round(total)), scheduler_eta_min=o.min_lr)
        return keys

    # synthetic data -----------------------------------------------------------------------
    @classmethod
    def add_datagen_args(cls, parser: argparse.ArgumentParser) -> None:
        datagen.add_args(parser)

    @classmethod
    def embedded_datagen_args(cls) -> list[str]:
        """The dataset the ``mini`` preset is tuned on (see configs/mini.toml)."""
        return ["--samples", "384", "--eval-samples", "64", "--height", "96", "--width", "144"]

    @classmethod
    def datagen(cls, args: argparse.Namespace) -> None:
        datagen.run(args)

