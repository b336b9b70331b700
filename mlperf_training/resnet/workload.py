"""ResNet-50 v1.5 on the harness (training suite, ruleset training 4.0.0): ImageNet data, model,
label-smoothed loss, top-1 accuracy, MLPerf keys.

Data: :mod:`.dataset` (Pillow reader threads, or ``train.loader = "dali"``; ``data.cache = "host"``
keeps decoded images). Loss: cross entropy with label smoothing 0.1, summed over the rank's samples
(the harness divides by the instance's count). ``eval_accuracy`` is top-1 over the whole validation
set: (correct, count) summed over batches and ranks. The optimizer is LARS on the flat buffer (or SGD)
with BatchNorm parameters and biases exempt from weight decay and the trust ratio
(:meth:`no_weight_decay`), on the poly-with-warmup schedule; :mod:`.hparams` gives the ``lars_*`` /
``sgd_*`` keys the closed rules require.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from hpcbench.common.errors import ConfigError
from hpcbench.common.workload import Workload

from . import BENCHMARK
from .config import ResNetConfig
from .dataset import Batch, ImageNetData
from .synth import ResNetDatagen

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from torch import nn

    from hpcbench.common.data.spec import SampleSource


class ResNetWorkload(ResNetDatagen, Workload[ResNetConfig]):
    record = BENCHMARK
    config_cls = ResNetConfig

    def __init__(self, cfg: ResNetConfig) -> None:
        super().__init__(cfg)
        d, t = cfg.data, cfg.train
        # DALI decodes the JPEGs itself unless the decoded cache is on (then it is fed decoded images)
        self._spec = ImageNetData(d.image_size, d.eval_resize, d.decode_short_side, t.seed,
                                  encoded_for_dali=t.loader == "dali" and d.cache == "none",
                                  channels_last=t.channels_last is True)

    def dataset(self) -> ImageNetData:
        return self._spec

    def source(self, split: str) -> "SampleSource":
        """The split's images; the class folders must number ``model.num_classes``."""
        src = super().source(split)
        classes = len(src.images.wnids)  # type: ignore[attr-defined]
        if classes != self.cfg.model.num_classes:
            raise ConfigError(f"config key 'model.num_classes' = {self.cfg.model.num_classes}, but "
                              f"{self.data_root() / split} holds {classes} class folders")
        return src

    # model ----------------------------------------------------------------------------------
    def model_config(self) -> Any:
        from .model import ModelConfig

        m = self.cfg.model
        return ModelConfig(depths=tuple(m.depths), width=m.width, num_classes=m.num_classes,
                           zero_init_residual=m.zero_init_residual)

    def build_model(self) -> "nn.Module":
        from .model import ResNet

        return ResNet(self.model_config())

    def no_weight_decay(self, name: str) -> bool:
        from .model import no_weight_decay

        return no_weight_decay(name)

    def forward(self, model: "nn.Module", batch: Batch) -> "torch.Tensor":
        return model(batch[0])

    def loss(self, outputs: "torch.Tensor", batch: Batch) -> "torch.Tensor":
        """Label-smoothed (0.1) cross entropy, summed over the batch."""
        from .loss import smoothed_cross_entropy_sum

        return smoothed_cross_entropy_sum(outputs, batch[1])

    def loss_count(self, batch: Batch) -> "torch.Tensor":
        import torch

        return torch.full((), float(batch[1].numel()), dtype=torch.float32, device=batch[1].device)

    # evaluation -----------------------------------------------------------------------------
    def eval_sums(self, outputs: "torch.Tensor", batch: Batch) -> Mapping[str, "torch.Tensor"]:
        import torch

        from .loss import top1_correct

        labels = batch[1].to(outputs.device)
        return {"correct": top1_correct(outputs, labels),
                "count": torch.full((), float(labels.numel()), dtype=torch.float32, device=outputs.device)}

    def metric(self, sums: Mapping[str, float]) -> float:
        return float(sums["correct"]) / max(float(sums["count"]), 1.0)

    def hyperparameters(self) -> dict[str, Any]:
        """``opt_name`` and the ``lars_*``/``sgd_*`` keys of closed_resnet_<opt>.yaml (:mod:`.hparams`)."""
        from .hparams import optimizer_keys

        steps = self.sizes.steps_per_epoch if self.sizes is not None else 1
        # the harness's per-rank batch (0 when not known: one rank holds the global batch)
        local = self.sizes.local_batch_size if self.sizes is not None else 0
        bn_span = (local or self.cfg.train.global_batch_size) * self.cfg.train.bn_group_size
        return optimizer_keys(self.cfg.optim, steps, self.cfg.train.max_epochs, bn_span)

