"""ResNet-50 config: the shared run sections plus ``data`` (image sizes, decoded cache) and ``model``."""
from __future__ import annotations

from dataclasses import dataclass, field

from hpcbench.common.errors import ConfigError
from hpcbench.common.runconfig import DataConfig, OptimConfig, RunConfig


@dataclass
class ResNetDataConfig(DataConfig):
    """``root`` holds ``train/<wnid>/*.JPEG`` and ``val/<wnid>/*.JPEG``. ``data.cache = "host"`` keeps
    the decoded training images (before augmentation: every epoch still draws new crops) and the
    evaluation crops, so epochs after the first skip the JPEG decode."""

    image_size: int = 224  # the crop the model sees (training and evaluation)
    eval_resize: int = 256  # evaluation: the shorter side before the centre crop (the reference: 256 for 224)
    # training images: the shorter side bounded to this at decode time (libjpeg's reduced-scale decode,
    # then a resize); 0 keeps the full resolution. Makes the decoded cache smaller and the decode cheaper,
    # at the price of detail in small crops (a crop of area 5% is upsampled from fewer pixels)
    decode_short_side: int = 0

    def validate(self) -> None:
        super().validate()
        if self.image_size < 8 or self.eval_resize < self.image_size:
            raise ConfigError(f"config keys 'data.image_size' >= 8 and 'data.eval_resize' >= data.image_size, got "
                              f"{self.image_size} and {self.eval_resize}")
        if self.decode_short_side and self.decode_short_side < self.image_size:
            raise ConfigError(f"config key 'data.decode_short_side': 0 (full resolution) or >= data.image_size "
                              f"{self.image_size}, got {self.decode_short_side}")


@dataclass
class ResNetModelConfig:
    """ResNet v1.5 bottleneck stages (defaults: ResNet-50 on ImageNet-1k)."""

    depths: tuple[int, ...] = (3, 4, 6, 3)
    width: int = 64
    num_classes: int = 1000  # must equal the dataset's class folders
    # gamma 0 for the last BatchNorm of each bottleneck (NVIDIA's --bn-gamma-init0); the reference: all gammas 1
    zero_init_residual: bool = False

    def validate(self) -> None:
        if not self.depths or min(self.depths) < 1 or self.width < 1 or self.num_classes < 2:
            raise ConfigError(f"config keys 'model.depths' (each >= 1), 'model.width' >= 1, 'model.num_classes' >= 2; "
                              f"got {list(self.depths)}, {self.width}, {self.num_classes}")


#: training_rules.adoc, resnet ``lars_opt_momentum``: "0.9 for batch<32k, otherwise arbitrary constant"
LARS_FREE_MOMENTUM_BATCH = 32_768


def check_schedule(o: OptimConfig) -> None:
    """What the MLPerf ResNet keys can describe: the polynomial decay after a linear warmup (the optimizer,
    LARS or SGD, is the record's: ``BENCHMARK.keys``)."""
    if o.schedule != "poly" or not o.poly_from_warmup:
        raise ConfigError("config keys 'optim.schedule' = \"poly\" and 'optim.poly_from_warmup' = true: resnet "
                          f"logs the polynomial decay after a linear warmup; got schedule {o.schedule!r}, "
                          f"poly_from_warmup = {o.poly_from_warmup}")


@dataclass
class ResNetConfig(RunConfig):
    data: ResNetDataConfig = field(default_factory=ResNetDataConfig)
    model: ResNetModelConfig = field(default_factory=ResNetModelConfig)

    def validate(self) -> None:
        check_schedule(self.optim)
        t, d, o = self.train, self.data, self.optim
        lars = o.name == "lars"
        self.require_closed([
            ("model.zero_init_residual", self.model.zero_init_residual, False, "training_rules.adoc 'Weight and Bias "
             "Initialization': the reference's initialisation; its BatchNorm gammas all start at 1"),
            ("optim.momentum", o.momentum,
             lambda m: not lars or t.global_batch_size >= LARS_FREE_MOMENTUM_BATCH or m == 0.9,
             f"training_rules.adoc, resnet lars_opt_momentum: 0.9 for a global batch < {LARS_FREE_MOMENTUM_BATCH}"),
            ("optim.trust_coefficient", o.trust_coefficient, lambda c: not lars or c == 0.001,
             "LARS eta 0.001: the reference LARSOptimizer's eeta, not a tunable hyperparameter"),
            ("train.eval_every", t.eval_every, 4, "the rules: every 4 epochs, with offset 0-3 (train.eval_offset)"),
            ("train.eval_every_samples", t.eval_every_samples, 0, "the cadence is in whole epochs"),
            ("data.image_size", d.image_size, 224, "the reference's crop"),
            ("data.eval_resize", d.eval_resize, 256, "the reference's evaluation resize before the 224 crop"),
            ("data.last_batch", d.last_batch, "pad", "training_rules.adoc: every image once per epoch; only DLRMv2 "
             "may drop the last partial batch")])
