"""Closed configs that leave the rules or the reference where the official checker does not look (augmentations,
cadence, model variants) are refused when the config loads, naming the key; the open division keeps them. Found
by rule audits of the full presets (BERT, CosmoFlow, DLRM, OC20, ResNet, U-Net)."""
from __future__ import annotations

import pytest

from hpcbench import registry
from hpcbench.common.cadence import cadence_of
from hpcbench.common.errors import ConfigError


@pytest.mark.parametrize(("workload", "override", "key"), [
    ("bert", "model.hidden_dropout=0", "model.hidden_dropout"),
    ("bert", "model.attention_dropout=0", "model.attention_dropout"),
    ("bert", "data.eval_samples=5000", "data.eval_samples"),
    ("cosmoflow", "optim.weight_decay_form=torch", "optim.weight_decay_form"),
    ("dlrm_dcnv2", "train.eval_every=0.01", "train.eval_every"),
    ("oc20", "optim.weight_decay=0", "optim.weight_decay"),
    ("oc20", "optim.eps=1e-6", "optim.eps"),
    ("oc20", "optim.betas=[0.9, 0.99]", "optim.betas"),
    ("oc20", "optim.warmup_factor=5", "optim.warmup_factor"),
    ("oc20", "optim.decay_factor=2", "optim.decay_factor"),  # docs/closed.md, OC20 optimizer row
    ("oc20", "data.last_batch=drop", "data.last_batch"),
    ("cosmoflow", "optim.momentum_form=torch", "optim.momentum_form"),
    ("cosmoflow", "optim.nesterov=true", "optim.nesterov"),
    ("resnet", "train.eval_every=2", "train.eval_every"),
    ("resnet", "data.image_size=128", "data.image_size"),
    ("resnet", "data.eval_resize=288", "data.eval_resize"),
    ("unet3d", "data.flips=false", "data.flips"),
    ("unet3d", "data.intensity_augment=false", "data.intensity_augment"),
    ("unet3d", "model.norm=batchnorm", "model.norm"),
    ("unet3d", "model.activation=leaky_relu", "model.activation"),
])
def test_a_closed_config_off_the_reference_is_refused_by_key(workload: str, override: str, key: str) -> None:
    cls = registry.get(workload)
    with pytest.raises(ConfigError, match=rf"config key '{key}' = .* \(closed: .*train\.division = 'open'"):
        cls.load_config("full", [override])
    assert cls.load_config("full", [override, "train.division=open"])  # the open division may


def test_a_range_rule_names_the_value_and_the_range() -> None:
    with pytest.raises(ConfigError, match=r"config key 'optim.warmup_factor' = 5.0 \(closed: in \[0, 1\]"):
        registry.get("oc20").load_config("full", ["optim.warmup_factor=5"])
    assert registry.get("cosmoflow").load_config("full").optim.momentum_form == "keras"


def test_two_departures_are_named_together() -> None:
    with pytest.raises(ConfigError, match=r"config keys 'data.flips' = False .*; 'model.norm' = 'batchnorm'"):
        registry.get("unet3d").load_config("full", ["data.flips=false", "model.norm=batchnorm"])


def test_closed_dlrm_evaluates_on_the_cadence_only() -> None:
    """The reference's MLPerf command evaluates every floor(samples / (batch x 20)) iterations and not at the end
    of its one epoch (no --evaluate_on_epoch_end): a closed run has no final evaluation, an open one keeps it."""
    cls = registry.get("dlrm_dcnv2")
    assert cls.record.closed_cadence_only
    closed = cls.load_config("full")
    assert not cadence_of(cls.record, closed.train, 64_013).final
    assert cadence_of(cls.record, cls.load_config("full", ["train.division=open"]).train, 64_013).final
