"""CosmoFlow config: the shared run sections plus ``data`` and ``model``."""
from __future__ import annotations

from dataclasses import dataclass, field

from hpcbench.common.errors import ConfigError
from hpcbench.common.runconfig import DataConfig, RunConfig


@dataclass
class CosmoDataConfig(DataConfig):
    """``root`` (with train/ and validation/), ``node_local``, ``threads`` and ``prefetch`` are the
    shared data options."""

    size: int = 128  # cube edge S of the int16 [S,S,S,4] samples
    n_train: int = 0  # the first N files of train/; 0: every file
    n_eval: int = 0  # the first N files of validation/; 0: every file

    def validate(self) -> None:
        super().validate()
        if self.size < 2:
            raise ConfigError(f"config key 'data.size': must be >= 2, got {self.size}")
        if self.n_train < 0 or self.n_eval < 0:
            raise ConfigError("config keys 'data.n_train'/'data.n_eval' must be >= 0 (0 = all files)")


@dataclass
class CosmoModelConfig:
    conv_layers: int = 5  # each: Conv3d k3 same -> LeakyReLU -> MaxPool3d(2)
    conv_channels: int = 32  # channels of the first conv; doubled by each next layer
    fc_sizes: tuple[int, ...] = (128, 64)
    dropout: float = 0.5
    leaky_slope: float = 0.3  # Keras LeakyReLU default alpha
    output_scale: float = 1.2  # tanh(x) * scale

    def validate(self) -> None:
        if self.conv_layers < 1 or self.conv_channels < 1:
            raise ConfigError("config keys 'model.conv_layers' and 'model.conv_channels' must be >= 1")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"config key 'model.dropout': must be in [0, 1), got {self.dropout}")


@dataclass
class CosmoFlowConfig(RunConfig):
    data: CosmoDataConfig = field(default_factory=CosmoDataConfig)
    model: CosmoModelConfig = field(default_factory=CosmoModelConfig)

    def validate(self) -> None:
        # the reference's weight decay is its model.l2: Keras l2(wd) on the two hidden Dense kernels only
        # (gradient 2 wd w; CosmoFlowWorkload.no_weight_decay keeps every other tensor out of it)
        self.require_closed([("optim.weight_decay_form", self.optim.weight_decay_form, "keras_l2",
                              "the reference's weight decay is Keras' l2 regularizer (gradient 2 x wd x w) on the two "
                              "hidden Dense kernels"),
                             ("optim.momentum_form", self.optim.momentum_form, "keras",
                              "the reference's Keras SGD keeps the rate inside the velocity"),
                             ("optim.nesterov", self.optim.nesterov, False, "the reference's SGD has no Nesterov")])
        if self.data.size % (2 ** self.model.conv_layers):
            raise ConfigError(f"config key 'data.size' = {self.data.size} must be divisible by "
                              f"2**model.conv_layers = {2 ** self.model.conv_layers} (one pool per conv layer)")
