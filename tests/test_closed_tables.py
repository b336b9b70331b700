"""The rows of docs/closed.md for DeepCAM, ResNet-50 and DLRM-DCNv2: each `full` preset against the value the
closed rules, the installed checker's closed YAMLs and the reference fix (no training, no data).

Checker YAMLs: hpc_3.0.0/closed_deepcam{,_lamb,_multistep}.yaml, training_4.0.0/closed_resnet{,_lars}.yaml,
training_5.1.0/closed_dlrm_dcnv2.yaml. Every CHECK of those files is evaluated on the keys the `full` preset logs
(the harness's own keys -- sizes, batch, seed, accumulation -- filled in as the harness logs them)."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from mlperf_logging.compliance_checker import mlp_compliance

from hpcbench.common.cadence import TrainPoint, cadence_of
from hpcbench.common.workload import DataSizes
from hpcbench.workloads.deepcam import BENCHMARK as DEEPCAM
from hpcbench.workloads.deepcam.workload import DeepCAMWorkload
from hpcbench.workloads.mlperf_training.dlrm_dcnv2 import BENCHMARK as DLRM
from hpcbench.workloads.mlperf_training.dlrm_dcnv2.criteo import CARDINALITIES, EVAL_SAMPLES, MULTI_HOT_SIZES
from hpcbench.workloads.mlperf_training.dlrm_dcnv2.workload import DLRMWorkload
from hpcbench.workloads.mlperf_training.resnet import BENCHMARK as RESNET
from hpcbench.workloads.mlperf_training.resnet.loss import LABEL_SMOOTHING
from hpcbench.workloads.mlperf_training.resnet.workload import ResNetWorkload

CHECKER = Path(mlp_compliance.__file__).parent

DEEPCAM_TRAIN, DEEPCAM_EVAL = 121_266, 15_158
IMAGENET_TRAIN, IMAGENET_EVAL = 1_281_167, 50_000
CRITEO_TRAIN = 4_195_197_692  # days 0..22 of the Criteo 1TB click logs


def _records(ruleset: str, name: str, logged: dict[str, Any]) -> list[dict[str, Any]]:
    """The KEY records of ``name`` and of every file its POST lines enqueue for these logged values."""
    records = [r["KEY"] for r in yaml.safe_load((CHECKER / ruleset / f"{name}.yaml").read_text())]
    out = list(records)
    for key in records:
        post = key.get("POST", "")
        if "enqueue_config" in post and key["NAME"] in logged:
            v = {"value": logged[key["NAME"]]}
            queued: list[str] = []
            exec(post.strip(), {"enqueue_config": queued.append}, {"v": v})  # noqa: S102 - the checker's own line
            for q in queued:
                sub_ruleset, sub = q.split("/")
                out += _records(sub_ruleset, sub.removesuffix(".yaml"), logged)
    return out


def _failed(ruleset: str, name: str, logged: dict[str, Any]) -> list[str]:
    failed = []
    for key in _records(ruleset, name, logged):
        if key["NAME"] == "eval_accuracy":
            continue  # logged at each evaluation; the target is checked against the record below
        if key["NAME"] not in logged:
            failed.append(f"missing {key['NAME']}")
            continue
        check = key.get("CHECK")
        if isinstance(check, str) and not eval(check.strip(), {"math": math, "is_integer": mlp_compliance.is_integer},
                                               {"v": {"value": logged[key["NAME"]]}}):
            failed.append(f"{key['NAME']}={logged[key['NAME']]!r}: {check.strip()}")
    return failed


def _target(ruleset: str, name: str) -> str:
    return next(k["ATLEAST_ONE_CHECK"] for k in _records(ruleset, name, {}) if k["NAME"] == "eval_accuracy")


# DeepCAM -------------------------------------------------------------------------------------------------------

def _deepcam_logged() -> tuple[Any, dict[str, Any]]:
    cfg = DeepCAMWorkload.load_config("full")
    wl = DeepCAMWorkload(cfg)
    wl.sizes = DataSizes(train_samples=DEEPCAM_TRAIN, eval_samples=DEEPCAM_EVAL,
                         steps_per_epoch=DEEPCAM_TRAIN // cfg.train.global_batch_size, local_batch_size=2)
    logged = {**wl.hyperparameters(), "train_samples": DEEPCAM_TRAIN, "eval_samples": DEEPCAM_EVAL,
              "global_batch_size": cfg.train.global_batch_size, "seed": cfg.train.seed,
              "gradient_accumulation_frequency": cfg.train.grad_accum}
    return cfg, logged


def test_deepcam_full_preset_is_the_reference_lamb_run() -> None:
    """The mlcommons/hpc deepcam reference run script: LAMB, start lr 0.0055, multistep at step 800 by 0.1,
    400 warmup steps with factor 1, weight decay 0.01, 64 epochs, batchnorm group 1, evaluation every epoch."""
    cfg, logged = _deepcam_logged()
    o, t = cfg.optim, cfg.train
    assert (t.division, t.global_batch_size, t.max_epochs, t.eval_every, t.eval_offset, t.eval_start) == \
        ("closed", 2048, 64, 1, 0, 0)
    assert (t.grad_accum, t.bn_group_size) == (1, 1)
    assert (o.name, o.lr, tuple(o.betas), o.eps, o.weight_decay, o.max_grad_norm) == \
        ("lamb", 0.0055, (0.9, 0.999), 1e-6, 0.01, 1.0)
    assert (o.bias_correction, o.grad_averaging) == (True, True)
    assert (o.schedule, o.unit, o.warmup, o.warmup_factor, tuple(o.milestones), o.decay_factor) == \
        ("multistep", "steps", 400, 1.0, (800,), 0.1)
    assert logged["opt_name"] == "LAMB" and logged["scheduler_type"] == "multistep"
    assert (logged["scheduler_lr_warmup_steps"], logged["scheduler_lr_warmup_factor"]) == (400, 1.0)
    assert (logged["scheduler_milestones"], logged["scheduler_decay_rate"]) == ([800], 0.1)
    assert logged["batchnorm_group_size"] == 1 and logged["opt_betas"] == [0.9, 0.999]


def test_deepcam_full_preset_passes_every_check_of_the_closed_yamls() -> None:
    _, logged = _deepcam_logged()
    names = {k["NAME"] for k in _records("hpc_3.0.0", "closed_deepcam", logged)}
    assert {"opt_bias_correction", "opt_max_grad_norm", "scheduler_milestones"} <= names  # lamb + multistep
    assert _failed("hpc_3.0.0", "closed_deepcam", logged) == []
    assert _failed("hpc_3.0.0", "closed_deepcam", {**logged, "opt_eps": 1e-8, "train_samples": 1000}) == [
        "opt_eps=1e-08:  math.isclose(v['value'], 1e-6)".replace(":  ", ": "),
        "train_samples=1000: v['value'] == 121266"]


def test_deepcam_target_cadence_and_dataset_sizes_are_the_rules() -> None:
    assert _target("hpc_3.0.0", "closed_deepcam") == "v['value'] >= 0.82 and v['value'] <= 1."
    assert (DEEPCAM.target.key, DEEPCAM.target.low, DEEPCAM.target.low_inclusive) == ("eval_accuracy", 0.82, True)
    assert DeepCAMWorkload.load_config("full").train.target == 0.82
    c = DEEPCAM.closed
    assert c is not None and (c.train_samples, c.eval_samples) == (DEEPCAM_TRAIN, DEEPCAM_EVAL)
    assert c.parameters == (56_454_720,) and c.fixed == {"opt_eps": 1e-6}
    cfg = DeepCAMWorkload.load_config("full")
    steps = DEEPCAM_TRAIN // cfg.train.global_batch_size
    assert cadence_of(DEEPCAM, cfg.train, steps).epochs() == list(range(1, 65))


# ResNet-50 -----------------------------------------------------------------------------------------------------

def _resnet_logged() -> tuple[Any, dict[str, Any]]:
    """The full preset's logged keys at the steps its sampler gives on ImageNet (8 ranks of 408, data.last_batch)."""
    from hpcbench.common.data.sampler import EpochSampler

    cfg = ResNetWorkload.load_config("full")
    wl = ResNetWorkload(cfg)
    steps = len(EpochSampler(IMAGENET_TRAIN, 408, 0, 8, 1, last_batch=cfg.data.last_batch))
    wl.sizes = DataSizes(train_samples=IMAGENET_TRAIN, eval_samples=IMAGENET_EVAL,
                         steps_per_epoch=steps, local_batch_size=408)
    return cfg, {**wl.hyperparameters(), "global_batch_size": cfg.train.global_batch_size}


def test_resnet_full_preset_is_the_lars_configuration_the_rules_allow() -> None:
    cfg, logged = _resnet_logged()
    o, t = cfg.optim, cfg.train
    assert (t.division, t.global_batch_size, t.max_epochs, t.target) == ("closed", 3264, 37, 0.759)
    assert (o.name, o.lr, o.momentum, o.weight_decay, o.eps, o.trust_coefficient) == \
        ("lars", 10.5, 0.9, 5e-5, 0.0, 0.001)
    assert (o.schedule, o.poly_from_warmup, o.power, o.min_lr, o.unit, o.warmup) == \
        ("poly", True, 2.0, 1e-4, "epochs", 2)
    assert LABEL_SMOOTHING == 0.1
    assert (cfg.data.image_size, cfg.data.eval_resize, cfg.model.num_classes) == (224, 256, 1000)
    # the preset pads the last batch (data.last_batch = "pad"): 393 steps per epoch, (37 - 2) x 393 = 13,755
    assert cfg.data.last_batch == "pad" and logged["lars_opt_learning_rate_decay_steps"] == 13_755
    assert _failed("training_4.0.0", "closed_resnet", logged) == []
    # the checker: weight decay 1e-4 x 2^k (5e-5 is k = -1), end lr 1e-4, power 2, epsilon 0
    assert _failed("training_4.0.0", "closed_resnet", {**logged, "lars_opt_weight_decay": 3e-5}) == [
        "lars_opt_weight_decay=3e-05: is_integer(math.log2(v['value'] / 0.0001))"]


def test_resnet_target_and_dataset_sizes() -> None:
    assert _target("training_4.0.0", "closed_resnet") == "v['value'] >= 0.7590 and v['value'] < 1.0"
    assert (RESNET.target.low, RESNET.target.high) == (0.759, 1.0)
    c = RESNET.closed
    assert c is not None and (c.train_samples, c.eval_samples) == (IMAGENET_TRAIN, IMAGENET_EVAL)
    assert 25_557_032 in c.parameters


# DLRM-DCNv2 ----------------------------------------------------------------------------------------------------

def _dlrm_logged() -> tuple[Any, dict[str, Any]]:
    cfg = DLRMWorkload.load_config("full")
    wl = DLRMWorkload(cfg)
    wl.sizes = DataSizes(train_samples=CRITEO_TRAIN, eval_samples=EVAL_SAMPLES,
                         steps_per_epoch=CRITEO_TRAIN // cfg.train.global_batch_size, local_batch_size=8192)
    return cfg, {**wl.hyperparameters(), "global_batch_size": cfg.train.global_batch_size,
                 "eval_samples": EVAL_SAMPLES}


def test_dlrm_full_preset_is_the_reference_model_and_adagrad() -> None:
    cfg, logged = _dlrm_logged()
    o, t, m = cfg.optim, cfg.train, cfg.model
    assert (t.division, t.global_batch_size, t.max_epochs, t.target, t.eval_every) == \
        ("closed", 65536, 1, 0.80275, 0.05)
    assert (o.name, o.lr, o.eps, o.lr_decay, o.initial_accumulator, o.weight_decay, o.schedule, o.warmup) == \
        ("adagrad", 0.005, 1e-8, 0.0, 0.0, 0.0, "constant", 0)
    assert (m.embedding_dim, tuple(m.bottom_mlp), tuple(m.top_mlp), m.dcn_layers, m.dcn_low_rank) == \
        (128, (512, 256, 128), (1024, 1024, 512, 256, 1), 3, 512)
    assert tuple(m.cardinalities) == CARDINALITIES and sum(CARDINALITIES) == 204_184_588
    assert MULTI_HOT_SIZES == (3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1)
    assert DLRMWorkload(cfg).dataset().bag_sizes == MULTI_HOT_SIZES and cfg.data.days == 24
    assert _failed("training_5.1.0", "closed_dlrm_dcnv2", logged) == []
    assert _failed("training_5.1.0", "closed_dlrm_dcnv2", {**logged, "opt_adagrad_epsilon": 1e-10}) == [
        "opt_adagrad_epsilon=1e-10: v['value'] == 1e-8"]


def test_dlrm_evaluates_every_twentieth_of_the_epoch_and_targets_the_auc() -> None:
    assert _target("training_5.1.0", "closed_dlrm_dcnv2") == "v['value'] >= 0.80275 and v['value'] <= 1.0"
    assert (DLRM.target.low, DLRM.target.high) == (0.80275, 1.0)
    c = DLRM.closed
    assert c is not None and c.eval_samples == EVAL_SAMPLES == 89_137_319
    cfg = DLRMWorkload.load_config("full")
    steps = CRITEO_TRAIN // cfg.train.global_batch_size
    assert steps == 64_013
    cad = cadence_of(DLRM, cfg.train, steps)
    assert cad.within_epoch
    points = [s for s in range(1, steps + 1) if cad.after_step(TrainPoint(1, s, s))]
    # every FLOOR(64,013 / 20) = 3,200 steps (the reference's eval_every 0.05 epoch), and not at the epoch's end
    # (its MLPerf command has no --evaluate_on_epoch_end: the record's closed_cadence_only)
    assert points == [3200 * k for k in range(1, 21)] and not cad.at_epoch_end(1)
    assert cad.epoch_num(TrainPoint(1, 3200, 3200)) == pytest.approx(0.05, abs=1e-4)


@pytest.mark.parametrize(("ranks", "local"), [(1024, 2), (256, 8)])
def test_deepcam_epoch_drops_the_remainder_as_the_reference_does(ranks: int, local: int) -> None:
    """The reference drops the last partial batch (``DistributedSampler(drop_last=True)`` and
    ``DataLoader(drop_last=True)`` in ``deepcam/src/deepCam/data/__init__.py``): at the full preset's global batch
    2,048, 59 steps per epoch and 434 of the 121,266 training samples left out, on any split of the batch. The
    training rules name the remainder, padding or a mixed batch (and dropping for DLRMv2 only); DeepCAM follows
    its reference here, as docs/closed.md says. Ours: the full preset keeps ``data.last_batch = "drop"``."""
    import numpy as np
    from torch.utils.data import DistributedSampler

    from hpcbench.common.data.sampler import EpochSampler

    cfg = DeepCAMWorkload.load_config("full")
    n, gbs = 121_266, cfg.train.global_batch_size
    assert (cfg.data.last_batch, cfg.data.shuffle, ranks * local) == ("drop", "global", gbs)
    ours = [EpochSampler(n, local, r, ranks, seed=3, partition="strided", last_batch=cfg.data.last_batch)
            for r in range(ranks)]
    for s in ours:
        s.set_epoch(1)
    reference = len(DistributedSampler(range(n), num_replicas=ranks, rank=0, drop_last=True)) // local
    assert {len(s) for s in ours} == {reference} == {59}
    kept = np.concatenate([s.indices() for s in ours])
    assert kept.size == np.unique(kept).size == 59 * gbs == n - 434
