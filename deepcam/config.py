"""DeepCAM configuration: the shared run sections plus ``data`` and ``model``."""
from __future__ import annotations

from dataclasses import dataclass, field

from hpcbench.common.errors import ConfigError
from hpcbench.common.runconfig import DataConfig, OptimConfig, RunConfig

from .model import ModelConfig

#: class frequencies of the real training set (background, cyclone, river), from the reference
REFERENCE_FREQUENCIES = (0.986267818390377, 0.0004578708870701058, 0.01327431072255291)


@dataclass
class DeepCAMDataConfig(DataConfig):
    """``root``, ``node_local``, ``threads`` and ``prefetch`` are the shared data options."""

    threads: int = 4  # reader threads per rank
    channels: tuple[int, ...] = tuple(range(16))
    train_split: str = "train"
    eval_split: str = "validation"
    stats_file: str = "stats.h5"  # relative to root
    class_frequencies: tuple[float, ...] = REFERENCE_FREQUENCIES
    loss_weight_pow: float = -0.125

    def validate(self) -> None:
        super().validate()
        if len(self.class_frequencies) != 3 or any(f <= 0 for f in self.class_frequencies):
            raise ConfigError("config key 'data.class_frequencies': expected 3 positive numbers "
                              f"(background, cyclone, river), got {list(self.class_frequencies)}")
        if not self.channels or min(self.channels) < 0:
            raise ConfigError(f"config key 'data.channels': expected channel indices >= 0, got {list(self.channels)}")


def _lamb() -> OptimConfig:
    return OptimConfig(name="lamb", lr=0.0055, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01,
                       max_grad_norm=1.0, schedule="multistep", unit="steps", warmup=400, warmup_factor=1.0,
                       milestones=(800,), decay_factor=0.1, schedule_semantics="held_warmup")


@dataclass
class DeepCAMConfig(RunConfig):
    optim: OptimConfig = field(default_factory=_lamb)
    data: DeepCAMDataConfig = field(default_factory=DeepCAMDataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)

    def validate(self) -> None:
        self.require_closed([("optim.schedule_semantics", self.optim.schedule_semantics, "held_warmup",
                              "the reference's warmup scheduler: the warmup's last rate held, milestones counted "
                              "after the warmup")])
        if self.model.in_channels != len(self.data.channels):
            raise ConfigError(f"config key 'model.in_channels': {self.model.in_channels} does not match the "
                              f"{len(self.data.channels)} entries of 'data.channels'")
