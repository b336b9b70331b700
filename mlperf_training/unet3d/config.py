"""3D U-Net config: the shared run sections plus ``data`` and ``model`` (defaults are the reference's)."""
from __future__ import annotations

from dataclasses import dataclass, field

from hpcbench.common.errors import ConfigError
from hpcbench.common.runconfig import DataConfig, RunConfig


@dataclass
class UNetDataConfig(DataConfig):
    """``root`` is one folder of ``case_XXXXX_{x,y}.npy`` pairs (the reference's preprocessed KiTS19);
    the cases named in the reference's evaluation list are the validation split, the rest train."""

    patch: tuple[int, ...] = (128, 128, 128)  # training crop (D, H, W): the reference's input_shape
    oversampling: float = 0.4  # probability that a training crop is placed around foreground
    flips: bool = True  # random flip of each axis with probability 1/3 (the reference's RandFlip)
    # the reference's RandomBrightnessAugmentation (factor 0.3, p 0.1) and GaussianNoise (std 0.1, p 0.1)
    intensity_augment: bool = True
    roi: tuple[int, ...] = (128, 128, 128)  # sliding-window size at evaluation (val_input_shape)
    overlap: float = 0.5  # sliding-window overlap at evaluation
    padding_value: float = -2.2  # image value of the padding around a volume at evaluation (the reference's)
    # windows per model call in the sliding-window evaluation: 1 is the reference's one at a time; more give
    # the same logits up to float rounding (eval mode; instance norm is per window) in fewer, larger calls
    window_batch: int = 1

    def validate(self) -> None:
        super().validate()
        for key, shape in (("patch", self.patch), ("roi", self.roi)):
            if len(shape) != 3 or min(shape) < 1:
                raise ConfigError(f"config key 'data.{key}': expected 3 sizes >= 1 (D, H, W), got {list(shape)}")
        if len(set(self.roi)) != 1:
            raise ConfigError(f"config key 'data.roi': the Gaussian importance map is cubic; expected equal sizes, "
                              f"got {list(self.roi)}")
        if not 0.0 <= self.oversampling <= 1.0:
            raise ConfigError(f"config key 'data.oversampling': a probability in [0, 1], got {self.oversampling}")
        if self.window_batch < 1:
            raise ConfigError(f"config key 'data.window_batch': windows per model call in evaluation, expected an "
                              f"integer >= 1, got {self.window_batch}")
        if not 0.0 <= self.overlap < 1.0:
            raise ConfigError(f"config key 'data.overlap': expected 0 <= overlap < 1, got {self.overlap}")
        if self.cache != "none":
            raise ConfigError(f"config key 'data.cache': unet3d crops a new random patch from each case every "
                              f"epoch while reading it, so collated batches cannot be cached; use 'none', got "
                              f"{self.cache!r}")


#: the axes of a (D, H, W) volume a spatial group can split, in order
SPATIAL_AXES = ("depth", "height", "width")


@dataclass
class UNetModelConfig:
    channels: tuple[int, ...] = (32, 64, 128, 256, 320)  # per level; len(channels) halvings (the last: bottleneck)
    in_channels: int = 1
    n_class: int = 3  # background, kidney, tumour
    norm: str = "instancenorm"  # instancenorm (affine) | batchnorm | none
    activation: str = "relu"  # relu (the reference's default) | leaky_relu (slope 0.01)
    # ranks that share each volume, each a slab along spatial_axis (spatial parallelism, .spatial); 1: off
    spatial_group: int = 1
    spatial_axis: str = "depth"  # depth | height | width (docs/unet3d.md: which is faster on a CPU)

    def validate(self) -> None:
        if len(self.channels) < 2 or min(self.channels) < 1:
            raise ConfigError(f"config key 'model.channels': at least 2 sizes >= 1, got {list(self.channels)}")
        if self.in_channels < 1 or self.n_class < 2:
            raise ConfigError(f"config keys 'model.in_channels' >= 1 and 'model.n_class' >= 2, got "
                              f"{self.in_channels} and {self.n_class}")
        if self.norm not in ("instancenorm", "batchnorm", "none"):
            raise ConfigError(f"config key 'model.norm': expected 'instancenorm', 'batchnorm' or 'none', got {self.norm!r}")
        if self.activation not in ("relu", "leaky_relu"):
            raise ConfigError(f"config key 'model.activation': expected 'relu' or 'leaky_relu', got {self.activation!r}")
        if self.spatial_group < 1:
            raise ConfigError(f"config key 'model.spatial_group': ranks per volume, >= 1, got {self.spatial_group}")
        if self.spatial_axis not in SPATIAL_AXES:
            raise ConfigError(f"config key 'model.spatial_axis': expected one of {', '.join(SPATIAL_AXES)}, got "
                              f"{self.spatial_axis!r}")
        if self.spatial_group > 1 and self.norm == "batchnorm":
            raise ConfigError("config key 'model.spatial_group': spatial parallelism needs model.norm = "
                              "'instancenorm' or 'none' (BatchNorm statistics over slabs are not implemented)")


@dataclass
class UNetConfig(RunConfig):
    data: UNetDataConfig = field(default_factory=UNetDataConfig)
    model: UNetModelConfig = field(default_factory=UNetModelConfig)

    def validate(self) -> None:
        d, m = self.data, self.model
        self.require_closed([
            ("data.flips", d.flips, True, "the reference's RandFlip"),
            ("data.intensity_augment", d.intensity_augment, True, "the reference's brightness and noise"),
            ("model.norm", m.norm, "instancenorm", "the reference's Unet3D(normalization='instancenorm')"),
            ("model.activation", m.activation, "relu", "the reference's Unet3D(activation='relu')")])
        k = 2 ** len(self.model.channels)
        for key, shape in (("patch", self.data.patch), ("roi", self.data.roi)):
            if any(s % k for s in shape):
                raise ConfigError(f"config key 'data.{key}': every size must be a multiple of {k} (the model halves "
                                  f"each axis {len(self.model.channels)} times), got {list(shape)}")
        s, axis = self.model.spatial_group, self.model.spatial_axis
        if s > 1 and self.train.graph == "cuda_graph":
            raise ConfigError("config key 'train.graph': cuda_graph is not supported with model.spatial_group > 1 "
                              "(the halo exchanges are point-to-point sends that a captured graph does not replay "
                              "here); use eager or compile")
        for key, shape in (("patch", self.data.patch), ("roi", self.data.roi)):
            size = shape[SPATIAL_AXES.index(axis)] if axis in SPATIAL_AXES else 0
            if s > 1 and size % (s * k):
                raise ConfigError(f"config key 'data.{key}': with model.spatial_group = {s} the {axis} must be a "
                                  f"multiple of {s} slabs x {k} (the model's halvings) = {s * k}, got {size}")
        # the optimizer: the record's (BENCHMARK.keys, sgd as the reference)
        if self.optim.schedule not in ("constant", "multistep"):
            raise ConfigError(f"config key 'optim.schedule': unet3d logs warmup epochs and decay boundaries (the "
                              f"reference's schedule); use 'constant' or 'multistep', got {self.optim.schedule!r}")
