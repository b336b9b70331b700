"""The MLPerf hyperparameter keys of ResNet's optimizer, from the run's ``optim`` config.

Training 4.0.0's ``closed_resnet.yaml`` requires ``opt_name`` in {``sgd``, ``lars``} and enqueues
``closed_resnet_<opt_name>.yaml`` (the same files as in 3.1.0), which require:

* ``lars``: ``lars_opt_base_learning_rate``, ``lars_opt_end_learning_rate`` (== 1e-4),
  ``lars_opt_learning_rate_decay_poly_power`` (== 2), ``lars_opt_learning_rate_decay_steps``,
  ``lars_epsilon`` (== 0.0), ``lars_opt_learning_rate_warmup_epochs``, ``lars_opt_momentum``,
  ``lars_opt_weight_decay`` (1e-4 times a power of two);
* ``sgd``: ``sgd_opt_base_learning_rate`` (a multiple of 0.001), ``sgd_opt_end_learning_rate``
  (== 1e-4), ``sgd_opt_learning_rate_decay_poly_power``, ``sgd_opt_learning_rate_decay_steps``,
  ``sgd_opt_weight_decay`` (1e-4 times a power of two), ``sgd_opt_momentum``, ``model_bn_span``,
  ``opt_learning_rate_warmup_epochs``.

The values describe the poly-with-warmup schedule (``optim.schedule = "poly"``,
``optim.poly_from_warmup = true``, common/schedule.py); any other schedule is refused rather than
logged under these names. The decay steps are ``T - W`` as the schedule counts them.
"""
from __future__ import annotations

from typing import Any

from hpcbench.common.errors import ConfigError
from hpcbench.common.runconfig import OptimConfig
from hpcbench.common.schedule import Schedule

from .config import check_optimizer


def optimizer_keys(optim: OptimConfig, steps_per_epoch: int, max_epochs: int, bn_span: int) -> dict[str, Any]:
    """The ``opt_name`` and ``lars_*``/``sgd_*`` keys for this run; ``bn_span``: the samples one
    BatchNorm's statistics cover (the per-rank batch times ``train.bn_group_size``), logged for SGD."""
    check_optimizer(optim)
    if steps_per_epoch < 1:
        raise ConfigError(f"optimizer_keys: steps_per_epoch must be >= 1, got {steps_per_epoch}")
    schedule = Schedule.from_config(optim, steps_per_epoch, max_epochs)
    warmup_epochs = schedule.warmup_steps / steps_per_epoch
    if float(warmup_epochs).is_integer():
        warmup_epochs = int(warmup_epochs)
    p = optim.name
    keys: dict[str, Any] = {
        "opt_name": p,
        f"{p}_opt_base_learning_rate": optim.lr,
        f"{p}_opt_end_learning_rate": optim.min_lr,
        f"{p}_opt_learning_rate_decay_poly_power": optim.power,
        f"{p}_opt_learning_rate_decay_steps": int(round(schedule.decay_steps)),
        f"{p}_opt_weight_decay": optim.weight_decay,
        f"{p}_opt_momentum": optim.momentum,
    }
    if p == "lars":
        keys["lars_epsilon"] = optim.eps
        keys["lars_opt_learning_rate_warmup_epochs"] = warmup_epochs
    else:
        keys["opt_learning_rate_warmup_epochs"] = warmup_epochs
        keys["model_bn_span"] = bn_span
    return keys
