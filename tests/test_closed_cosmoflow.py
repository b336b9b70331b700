"""CosmoFlow's closed preset against the reference (mlcommons/hpc cosmoflow) and the hpc 3.0.0 checker.

The reference's schedule, as its ``utils/optimizers.py`` defines it and its ``train.py`` runs it (a Keras
``LearningRateScheduler``: the rate is set at the start of each epoch from the 0-based epoch index):
``peak = base_lr x global_batch / base_batch_size``; while ``epoch < n_warmup_epochs`` the rate is
``base_lr + epoch x (peak - base_lr) / n_warmup_epochs``; after it ``peak x d`` for the ``decay_schedule``
entry ``e: d`` with the largest ``e < epoch`` (1 before the first). Its config (``configs/cosmo.yaml``):
base_lr 0.001, base_batch_size 64, linear scaling, 4 warmup epochs, decay_schedule {32: 0.25, 64: 0.125},
128 epochs, SGD momentum 0.9, dropout 0.5, no L2 (its model's ``l2``, 0 there, is Keras' ``regularizers.l2`` on the
two hidden Dense kernels; the RCPs at batch 64 and 512 set 0.01). docs/closed.md lists what each test here proves.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from hpcbench.common.errors import ConfigError
from hpcbench.common.mllog import check_log
from hpcbench.common.mlperf_keys import optimizer_keys
from hpcbench.common.runconfig import OptimConfig
from hpcbench.common.schedule import Schedule
from hpcbench.workloads.cosmoflow import BENCHMARK
from hpcbench.workloads.cosmoflow.workload import CosmoFlowWorkload

REFERENCE = {"base_lr": 0.001, "base_batch_size": 64, "n_warmup_epochs": 4, "decay_schedule": {32: 0.25, 64: 0.125},
             "n_epochs": 128, "momentum": 0.9, "dropout": 0.5, "l2": 0.0}
TRAIN_SAMPLES = 524_288  # the reference config's n_train


def reference_lr(epoch: int, global_batch: int) -> float:
    """The reference's rate in the epoch of 0-based index ``epoch`` (written from its definition above)."""
    r = REFERENCE
    peak = r["base_lr"] * global_batch / r["base_batch_size"]
    if epoch < r["n_warmup_epochs"]:
        return r["base_lr"] + epoch * (peak - r["base_lr"]) / r["n_warmup_epochs"]
    passed = [d for e, d in sorted(r["decay_schedule"].items()) if e < epoch]
    return peak * (passed[-1] if passed else 1.0)


def test_full_preset_hyperparameters_are_the_reference_config() -> None:
    cfg = CosmoFlowWorkload.load_config("full")
    o, t, r = cfg.optim, cfg.train, REFERENCE
    scale = t.global_batch_size / r["base_batch_size"]  # the reference's linear scaling
    assert o.name == "sgd" and o.momentum == r["momentum"] and o.weight_decay == r["l2"] and not o.nesterov
    assert cfg.model.dropout == r["dropout"] and t.max_epochs == r["n_epochs"] and t.eval_every == 1
    assert o.lr == pytest.approx(r["base_lr"] * scale) and o.warmup_factor == pytest.approx(scale)
    assert (o.schedule, o.unit, o.warmup, o.lr_per_epoch) == ("multistep", "epochs", r["n_warmup_epochs"], True)
    assert list(o.milestones) == list(r["decay_schedule"])
    assert list(o.decay_factors) == list(r["decay_schedule"].values())


@pytest.mark.parametrize("steps_per_epoch", [TRAIN_SAMPLES // 512, 7])
def test_full_preset_lr_of_every_step_is_the_reference_rate_of_its_epoch(steps_per_epoch: int) -> None:
    cfg = CosmoFlowWorkload.load_config("full")
    s = Schedule.from_config(cfg.optim, steps_per_epoch, cfg.train.max_epochs)
    epochs = cfg.train.max_epochs
    steps = torch.arange(epochs * steps_per_epoch, dtype=torch.float32)  # the device's float32 step counter
    got = s(steps).view(epochs, steps_per_epoch)
    want = torch.tensor([reference_lr(e, cfg.train.global_batch_size) for e in range(epochs)])
    torch.testing.assert_close(got, want[:, None].expand_as(got), rtol=1e-6, atol=0.0)
    # the points that matter, spelled out (0-based epoch index: rate)
    marks = {0: 0.001, 1: 0.00275, 3: 0.00625, 4: 0.008, 32: 0.008, 33: 0.002, 64: 0.002, 65: 0.001, 127: 0.001}
    for e, lr in marks.items():
        assert s.value(e * steps_per_epoch) == pytest.approx(lr) == reference_lr(e, 512)
        assert s.value((e + 1) * steps_per_epoch - 1) == pytest.approx(lr)


def test_absolute_factors_are_not_multiplied_and_scalar_decay_is_unchanged() -> None:
    absolute = OptimConfig(lr=1.0, schedule="multistep", unit="epochs", milestones=(2, 4), decay_factors=(0.25, 0.125))
    cumulative = OptimConfig(lr=1.0, schedule="multistep", unit="epochs", milestones=(2, 4), decay_factor=0.25)
    a, c = Schedule.from_config(absolute, 3, 6), Schedule.from_config(cumulative, 3, 6)
    assert [a.value(k) for k in (0, 5, 6, 11, 12, 17)] == pytest.approx([1, 1, 0.25, 0.25, 0.125, 0.125])
    assert [c.value(k) for k in (0, 5, 6, 11, 12, 17)] == pytest.approx([1, 1, 0.25, 0.25, 0.0625, 0.0625])
    # the mini preset's one factor is the same rate at every step as the scalar it replaced
    mini = CosmoFlowWorkload.load_config("mini").optim
    assert list(mini.decay_factors) == [0.25]
    old = Schedule.from_config(OptimConfig(**{**mini.__dict__, "decay_factors": (), "decay_factor": 0.25}), 512, 12)
    new = Schedule.from_config(mini, 512, 12)
    steps = torch.arange(12 * 512, dtype=torch.float32)
    assert torch.equal(old(steps), new(steps))


@pytest.mark.parametrize("override, key", [
    (dict(milestones=(2, 4), decay_factors=(0.5,)), "optim.decay_factors"),
    (dict(milestones=(2,), decay_factors=(0.0,)), "optim.decay_factors"),
    (dict(schedule="cosine", decay_factors=(0.5,)), "optim.decay_factors"),
    (dict(unit="steps", lr_per_epoch=True), "optim.lr_per_epoch"),
    (dict(schedule="poly", lr_per_epoch=True), "optim.lr_per_epoch"),
])
def test_bad_decay_factors_and_per_epoch_rates_name_the_key(override: dict, key: str) -> None:
    cfg = OptimConfig(**{"schedule": "multistep", **override})
    with pytest.raises(ConfigError, match=key):
        cfg.validate()


def test_full_preset_logs_the_boundaries_and_each_absolute_factor(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    cfg = CosmoFlowWorkload.load_config("full")
    keys = optimizer_keys(BENCHMARK, cfg.optim, TRAIN_SAMPLES // 512, cfg.train.max_epochs)
    hp = {**keys, "dropout": cfg.model.dropout}
    want = {"opt_name": "sgd", "opt_base_learning_rate": 0.008, "opt_momentum": 0.9, "sgd_opt_momentum": 0.9,
            "opt_learning_rate_warmup_epochs": 4, "opt_learning_rate_warmup_factor": 8.0,
            "opt_learning_rate_decay_boundary_epochs": [32, 64], "opt_learning_rate_decay_factor": [0.25, 0.125],
            "opt_weight_decay": 0.0, "dropout": 0.5}
    assert json.dumps(hp) == json.dumps(want)  # the types too: epochs are integers ("list of positive integers")
    # what ran: the rate after each boundary is the logged peak x the logged factor
    s = Schedule.from_config(cfg.optim, 1, cfg.train.max_epochs)
    for boundary, factor in zip(hp["opt_learning_rate_decay_boundary_epochs"], hp["opt_learning_rate_decay_factor"]):
        assert s.value(boundary + 1) == pytest.approx(hp["opt_base_learning_rate"] * factor)
    # and a closed log with these values passes the official hpc 3.0.0 checker
    import mllog_synth

    monkeypatch.setattr(mllog_synth, "COSMOFLOW_HPARAMS", hp)
    log = mllog_synth.write_log(tmp_path / "result_0.txt", mllog_synth.SynthRun(0.0, 60.0), division="closed")
    logged = {e["key"]: e["value"] for e in (json.loads(line.split(":::MLLOG ", 1)[1])
                                             for line in log.read_text().splitlines() if ":::MLLOG " in line)}
    assert logged["opt_learning_rate_decay_factor"] == [0.25, 0.125]
    ok, out = check_log(log, "3.0.0", "hpc")
    assert ok, out


def test_a_key_that_names_one_cumulative_rate_refuses_absolute_factors() -> None:
    from hpcbench.workloads.deepcam import BENCHMARK as DEEPCAM

    optim = OptimConfig(name="adam", schedule="multistep", unit="steps", milestones=(10, 20), decay_factors=(0.5, 0.1))
    with pytest.raises(ConfigError, match="optim.decay_factors"):
        optimizer_keys(DEEPCAM, optim, 7, 3)


def test_weight_decay_is_the_references_keras_l2_on_the_hidden_dense_kernels() -> None:
    """``optim.weight_decay`` with the closed ``weight_decay_form = "keras_l2"`` trains as the reference's ``l2``
    (the RCP points at batch 64 and 512 use 0.01): the loss gains ``l2 x sum(k^2)`` over the two hidden Dense
    kernels only (``kernel_regularizer=l2(l2)``), under Keras' SGD. Ours: the harness's flat SGD with the
    workload's decay mask; the reference's maths written with autograd on a copy with the same weights."""
    from hpcbench.common.flat import FlatParams
    from hpcbench.common.optim import build_optimizer
    from hpcbench.workloads.cosmoflow.model import CosmoFlowNet

    l2, lr, m = 0.01, 0.05, 0.9
    cfg = CosmoFlowWorkload.load_config("full", [f"optim.weight_decay={l2}", "model.conv_layers=2",
                                                 "model.conv_channels=2", "data.size=8", "model.fc_sizes=[6, 5]"])
    assert cfg.optim.weight_decay_form == "keras_l2"
    wl = CosmoFlowWorkload(cfg)
    torch.manual_seed(0)
    ours = CosmoFlowNet(cfg.model, cfg.data.size).eval()  # eval: no dropout draw, the same forward in both
    ref = CosmoFlowNet(cfg.model, cfg.data.size).eval()
    start = {k: v.clone() for k, v in ours.state_dict().items()}
    ref.load_state_dict(start)
    names = [n for n, _ in ours.named_parameters()]
    decayed = [n for n in names if not wl.no_weight_decay(n)]
    assert decayed == ["head.1.weight", "head.4.weight"]  # the two hidden Dense kernels, not the output's
    flat = FlatParams(ours)
    opt = build_optimizer(flat, cfg.optim, decay_exempt=[wl.no_weight_decay(n) for n in names])
    velocity = {n: torch.zeros_like(p) for n, p in ref.named_parameters()}

    def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(step)
        return torch.randn(3, 4, 8, 8, 8, generator=g), torch.rand(3, 4, generator=g) - 0.5

    for step in range(4):
        x, y = batch(step)
        loss = wl.loss(ours(x), (x, y)) / y.numel()
        ours.zero_grad(set_to_none=False)
        loss.backward()
        opt.step(torch.tensor(lr))
        # the reference: mse + the regularizer's loss term, Keras SGD (v = m v - lr g, w += v)
        ref_loss = (ref(x) - y).square().mean() + l2 * sum(p.square().sum() for n, p in ref.named_parameters()
                                                           if n in decayed)
        grads = torch.autograd.grad(ref_loss, list(ref.parameters()))
        with torch.no_grad():
            for (n, p), g in zip(ref.named_parameters(), grads):
                velocity[n] = m * velocity[n] - lr * g
                p.add_(velocity[n])
    for (n, a), b in zip(ours.named_parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5, msg=n)
    # the decay is really in it: torch's form (wd x w, half the regularizer's gradient) ends elsewhere
    half = CosmoFlowNet(cfg.model, cfg.data.size).eval()
    half.load_state_dict(start)
    opt = build_optimizer(FlatParams(half), dataclasses.replace(cfg.optim, weight_decay_form="torch"),
                          decay_exempt=[wl.no_weight_decay(n) for n in names])
    for step in range(4):
        x, y = batch(step)
        half.zero_grad(set_to_none=False)
        (wl.loss(half(x), (x, y)) / y.numel()).backward()
        opt.step(torch.tensor(lr))
    assert (half.state_dict()["head.1.weight"] - ours.state_dict()["head.1.weight"]).abs().max() > 1e-4


def test_keras_l2_is_refused_outside_sgd_and_a_bad_form_is_named() -> None:
    with pytest.raises(ConfigError, match="optim.weight_decay_form.*'keras_l2' applies to optim.name = 'sgd' only"):
        CosmoFlowWorkload.load_config("full", ["optim.name=adamw", "train.division=open"])
    with pytest.raises(ConfigError, match="optim.weight_decay_form': 'l2' is not allowed; expected one of 'torch', 'keras_l2'"):
        CosmoFlowWorkload.load_config("mini", ["optim.weight_decay_form=l2"])
