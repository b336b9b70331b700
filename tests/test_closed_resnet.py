"""ResNet's closed evaluation cadence, from the cadence object (no training), and the closed rows the checker
does not test: the reference's initialisation and LARS's momentum and eta.

training_rules.adoc (the ResNet-50 row of the evaluation-frequency table, last in v4.0): "Every 4 epochs
with offset 0 or 1 or 2 or 3"; the reference's README: "We evaluate after every 4 epochs; the first
evaluation can happen after 1, 2, 3, or 4 epochs of training". The checker (training_4.0.0
closed_resnet.yaml) only requires an eval_accuracy with epoch_num. docs/closed.md has the table.
"""
from __future__ import annotations

import pytest

from hpcbench.common.cadence import cadence_of
from hpcbench.common.errors import ConfigError
from hpcbench.workloads.mlperf_training.resnet import BENCHMARK
from hpcbench.workloads.mlperf_training.resnet.workload import ResNetWorkload

STEPS = 1_281_167 // 3264  # ImageNet at the full preset's global batch


def test_full_preset_evaluates_every_4_epochs_from_epoch_1_and_ends_on_the_cadence() -> None:
    cfg = ResNetWorkload.load_config("full")
    assert (cfg.train.division, cfg.train.eval_every, cfg.train.eval_offset, cfg.train.max_epochs) == \
        ("closed", 4, 1, 37)
    epochs = cadence_of(BENCHMARK, cfg.train, STEPS).epochs()
    assert epochs == [1, 5, 9, 13, 17, 21, 25, 29, 33, 37]
    assert all(b - a == 4 for a, b in zip(epochs, epochs[1:])) and epochs[0] in (1, 2, 3, 4)


@pytest.mark.parametrize("offset", [0, 1, 2, 3])
@pytest.mark.parametrize("max_epochs", [36, 37, 38, 41])
def test_a_closed_run_never_evaluates_off_the_cadence(offset: int, max_epochs: int) -> None:
    assert BENCHMARK.closed_cadence_only
    cfg = ResNetWorkload.load_config("full", [f"train.eval_offset={offset}", f"train.max_epochs={max_epochs}"])
    epochs = cadence_of(BENCHMARK, cfg.train, STEPS).epochs()
    first = offset or 4
    assert epochs == list(range(first, max_epochs + 1, 4))  # the last epoch only when it is on the cadence


def test_the_open_division_still_ends_with_a_metric() -> None:
    cfg = ResNetWorkload.load_config("full", ["train.division=open", "train.eval_offset=0"])
    assert cadence_of(BENCHMARK, cfg.train, STEPS).epochs() == [4, 8, 12, 16, 20, 24, 28, 32, 36, 37]
    mini = ResNetWorkload.load_config("mini").train  # open, every epoch: unchanged
    assert cadence_of(BENCHMARK, mini, 46).epochs() == list(range(1, mini.max_epochs + 1))


def test_closed_initialisation_is_the_references_every_gamma_one() -> None:
    """training_rules.adoc, Weight and Bias Initialization: "CLOSED: ... the same constant or random value
    distribution as the reference". The reference TF2 resnet_model.py leaves every BatchNorm gamma at Keras's
    ones; NVIDIA's closed v4.0 logs initialise every bn3_gamma with MLPerfInit (--bn-gamma-init0 not passed)."""
    full = ResNetWorkload.load_config("full")
    assert full.model.zero_init_residual is False
    assert ResNetWorkload(full).model_config().zero_init_residual is False
    with pytest.raises(ConfigError, match=r"model\.zero_init_residual"):
        ResNetWorkload.load_config("full", ["model.zero_init_residual=true"])
    assert ResNetWorkload.load_config("full", ["model.zero_init_residual=true", "train.division=open"]).model \
        .zero_init_residual
    assert ResNetWorkload.load_config("mini").model.zero_init_residual  # open: allowed


def test_closed_lars_momentum_is_0_9_below_32k_and_eta_is_the_references() -> None:
    """training_rules.adoc, resnet lars_opt_momentum: "0.9 for batch<32k, otherwise arbitrary constant" (the
    checker's closed_resnet_lars.yaml does not test it); eta: the reference LARSOptimizer's eeta = 0.001."""
    full = ResNetWorkload.load_config("full")
    assert (full.optim.name, full.optim.momentum, full.optim.trust_coefficient) == ("lars", 0.9, 0.001)
    with pytest.raises(ConfigError, match=r"optim\.momentum"):
        ResNetWorkload.load_config("full", ["optim.momentum=0.95"])
    assert ResNetWorkload.load_config("full", ["optim.momentum=0.95", "train.global_batch_size=32768"]) \
        .optim.momentum == 0.95
    with pytest.raises(ConfigError, match=r"optim\.trust_coefficient"):
        ResNetWorkload.load_config("full", ["optim.trust_coefficient=0.002"])
    with pytest.raises(ConfigError, match=r"optim\.momentum"):  # the boundary: 32,767 is below 32k
        ResNetWorkload.load_config("full", ["optim.momentum=0.95", "train.global_batch_size=32767"])


def test_closed_sgd_is_not_held_to_the_lars_rows() -> None:
    """The momentum-below-32k and eta rows are LARS's (lars_opt_momentum, the LARS optimizer's eeta); a closed
    SGD run is held to its own sgd_opt_* rows, which the checker tests, not to these."""
    cfg = ResNetWorkload.load_config("full", ["optim.name=sgd", "optim.momentum=0.95", "optim.trust_coefficient=0.002"])
    assert (cfg.train.division, cfg.optim.name, cfg.optim.momentum) == ("closed", "sgd", 0.95)
