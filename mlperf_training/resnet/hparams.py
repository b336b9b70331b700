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

The record (``BENCHMARK.keys``) names them and :mod:`hpcbench.common.mlperf_keys` computes them from the
poly-with-warmup schedule (``optim.schedule = "poly"``, ``optim.poly_from_warmup = true``,
common/schedule.py; any other schedule is refused rather than logged under these names; the decay steps
are ``T - W`` as the schedule counts them); only ``model_bn_span`` is ResNet's own.
"""
from __future__ import annotations

from typing import Any

from hpcbench.common.errors import ConfigError
from hpcbench.common.mlperf_keys import optimizer_keys as record_keys
from hpcbench.common.runconfig import OptimConfig

from . import BENCHMARK
from .config import check_schedule


def optimizer_keys(optim: OptimConfig, steps_per_epoch: int, max_epochs: int, bn_span: int) -> dict[str, Any]:
    """The ``opt_name`` and ``lars_*``/``sgd_*`` keys for this run; ``bn_span``: the samples one
    BatchNorm's statistics cover (the per-rank batch times ``train.bn_group_size``), logged for every optimizer
    as the reference logs it (resnet_ctl_imagenet_main.py, unconditionally; NVIDIA's LARS logs carry it and the
    RCPs' LARS entries list it)."""
    BENCHMARK.check_optimizer(optim.name)
    check_schedule(optim)
    if steps_per_epoch < 1:
        raise ConfigError(f"optimizer_keys: steps_per_epoch must be >= 1, got {steps_per_epoch}")
    keys = record_keys(BENCHMARK, optim, steps_per_epoch, max_epochs)
    keys["model_bn_span"] = bn_span
    return keys
