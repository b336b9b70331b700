"""ResNet's MLPerf optimizer keys against the installed checker's closed_resnet_{lars,sgd}.yaml
(training 4.0.0): every required key present and every CHECK expression true for a closed config."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml
from mlperf_logging.compliance_checker import mlp_compliance

from hpcbench.common.errors import ConfigError
from hpcbench.common.runconfig import OptimConfig
from hpcbench.workloads.mlperf_training.resnet.hparams import optimizer_keys

RULES = Path(mlp_compliance.__file__).parent / "training_4.0.0"


def _closed(name: str, **over: object) -> OptimConfig:
    base = dict(name=name, lr=10.0 if name == "lars" else 2.048, momentum=0.9, weight_decay=5e-5, eps=0.0,
                schedule="poly", poly_from_warmup=True, power=2.0, min_lr=1e-4, unit="epochs", warmup=2, total=37)
    return OptimConfig(**{**base, **over})  # type: ignore[arg-type]


def _failed_checks(keys: dict[str, object], name: str) -> list[str]:
    enqueue = yaml.safe_load((RULES / "closed_resnet.yaml").read_text())
    post = next(r["KEY"]["POST"] for r in enqueue if r["KEY"]["NAME"] == "opt_name")
    assert f"closed_resnet_{{}}.yaml" in post and name in ("lars", "sgd")
    records = yaml.safe_load((RULES / f"closed_resnet_{name}.yaml").read_text())
    failed = []
    for record in records:
        key = record["KEY"]
        if key["NAME"] not in keys:
            failed.append(f"missing {key['NAME']}")
        elif "CHECK" in key and not eval(key["CHECK"].strip(), {"math": math, "is_integer": mlp_compliance.is_integer},
                                          {"v": {"value": keys[key["NAME"]]}}):
            failed.append(f"{key['NAME']}={keys[key['NAME']]}")
    return failed


@pytest.mark.parametrize("name", ["lars", "sgd"])
def test_closed_config_gives_every_required_key_and_passes_the_checks(name: str) -> None:
    keys = optimizer_keys(_closed(name), steps_per_epoch=390, max_epochs=40, bn_span=32)
    assert _failed_checks(keys, name) == []
    assert keys["opt_name"] == name and keys[f"{name}_opt_learning_rate_decay_steps"] == (37 - 2) * 390
    warmup_key = "lars_opt_learning_rate_warmup_epochs" if name == "lars" else "opt_learning_rate_warmup_epochs"
    assert keys[warmup_key] == 2


def test_a_config_outside_the_closed_rules_fails_the_checks() -> None:
    keys = optimizer_keys(_closed("lars", eps=1e-8, weight_decay=3e-5, min_lr=0.0), 390, 40, 32)
    assert sorted(_failed_checks(keys, "lars")) == ["lars_epsilon=1e-08", "lars_opt_end_learning_rate=0.0",
                                                    "lars_opt_weight_decay=3e-05"]


def test_other_optimizers_and_schedules_are_refused() -> None:
    with pytest.raises(ConfigError, match="optim.name"):
        optimizer_keys(_closed("lamb"), 390, 40, 32)
    with pytest.raises(ConfigError, match="poly_from_warmup"):
        optimizer_keys(_closed("lars", poly_from_warmup=False), 390, 40, 32)
