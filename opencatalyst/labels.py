"""Label normalisation as the MLPerf HPC OC20 reference does it (``ocpmodels.modules.normalizer`` and
its ``mlperf_forces`` trainer): with ``normalize_labels`` the energy target is ``(y - target_mean) /
target_std`` and the force target ``(F - grad_target_mean) / grad_target_std``; the model learns the
normalised quantities and its outputs are de-normalised (``x * std + mean``) before any metric."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from hpcbench.common.errors import ConfigError

# the reference config (configs/mlperf_hpc.yml, pm_b2048.yml): the S2EF-2M training split's statistics
REFERENCE_TARGET_MEAN = -0.7554450631141663
REFERENCE_TARGET_STD = 2.887317180633545
REFERENCE_GRAD_TARGET_MEAN = 0.0
REFERENCE_GRAD_TARGET_STD = 2.887317180633545


@dataclass(frozen=True)
class Normalizer:
    """``norm(x) = (x - mean) / std``, ``denorm(x) = x * std + mean``; the identity when not enabled."""

    mean: float = 0.0
    std: float = 1.0

    @classmethod
    def checked(cls, mean: float, std: float, where: str) -> "Normalizer":
        """A normaliser from config values; ``where`` names the keys for the error."""
        if not (math.isfinite(mean) and math.isfinite(std)) or std <= 0:
            raise ConfigError(f"config keys {where}: mean {mean!r} and std {std!r}; expected a finite mean and a "
                              "finite std > 0 (the training split's label statistics)")
        return cls(float(mean), float(std))

    def norm(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std

    def denorm(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.std + self.mean


IDENTITY = Normalizer()


@dataclass(frozen=True)
class LabelNormalizers:
    energy: Normalizer = IDENTITY
    force: Normalizer = IDENTITY


def label_normalizers(enabled: bool, target_mean: float, target_std: float, grad_target_mean: float,
                      grad_target_std: float) -> LabelNormalizers:
    """The energy and force normalisers of ``data.normalize_labels`` and its statistics (identities when off)."""
    if not enabled:
        return LabelNormalizers()
    return LabelNormalizers(
        Normalizer.checked(target_mean, target_std, "'data.target_mean'/'data.target_std'"),
        Normalizer.checked(grad_target_mean, grad_target_std, "'data.grad_target_mean'/'data.grad_target_std'"))
