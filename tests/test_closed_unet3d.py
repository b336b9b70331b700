"""3D U-Net's closed evaluation cadence, from the cadence object (no training).

training_rules.adoc (the U-Net3D row of the evaluation-frequency table): "Starting at
CEILING(1000*168/samples_per_epoch) epochs, then every CEILING(20*168/samples_per_epoch) epochs. Where
samples_per_epoch is the number of samples processed in a given epoch assuming that in the case of uneven
batches the last batch is padded, e.g. CEILING(168/global_batch_size) * global_batch_size". The reference
(image_segmentation/pytorch main.py, runtime/training.py) evaluates at ``start_eval_at`` and then every
``evaluate_every`` epochs. docs/closed.md has the table.
"""
from __future__ import annotations

import pytest

from hpcbench.common.cadence import ClosedEvalEpochs, cadence_of
from hpcbench.common.errors import ConfigError
from hpcbench.workloads.mlperf_training.unet3d import BENCHMARK
from hpcbench.workloads.mlperf_training.unet3d.workload import UNet3DWorkload

STEPS = 168 // 2  # the 168 KiTS19 training cases at the full preset's global batch


def test_full_preset_evaluates_from_epoch_1000_then_every_20() -> None:
    cfg = UNet3DWorkload.load_config("full")
    assert (cfg.train.division, cfg.train.global_batch_size, cfg.train.eval_start, cfg.train.eval_every) == \
        ("closed", 2, 1000, 20)
    epochs = cadence_of(BENCHMARK, cfg.train, STEPS).epochs()
    assert epochs[:3] == [1000, 1020, 1040]
    assert min(epochs) == 1000  # nothing before epoch 1000 (the preset used to evaluate from epoch 20)
    assert epochs[-2:] == [9980, 10000]  # max_epochs 10000 (the non-convergence limit) is on the cadence
    assert len(epochs) == (10000 - 1000) // 20 + 1


@pytest.mark.parametrize("batch, start, every", [
    (2, 1000, 20), (1, 1000, 20), (8, 1000, 20), (5, 989, 20), (32, 875, 18), (56, 1000, 20), (100, 840, 17)])
def test_the_rule_from_samples_per_epoch(batch: int, start: int, every: int) -> None:
    """Uneven batches pad the last one: 168 at batch 5 counts as 170 samples, at 32 as 192, at 100 as 200."""
    assert BENCHMARK.closed_eval == ClosedEvalEpochs(start=1000, every=20, dataset=168, limit=10000)
    assert BENCHMARK.closed_eval.at(batch) == (start, every)


def test_a_closed_config_off_the_rule_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"train.eval_start=875 train.eval_every=18"):
        cfg = UNet3DWorkload.load_config("full", ["train.global_batch_size=32", "train.max_epochs=8750"])
        cadence_of(BENCHMARK, cfg.train, 168 // 32)
    cfg = UNet3DWorkload.load_config("full", ["train.global_batch_size=32", "train.eval_start=875",
                                              "train.eval_every=18", "train.max_epochs=8750"])
    assert cadence_of(BENCHMARK, cfg.train, 168 // 32).epochs()[:3] == [875, 893, 911]
    for wrong in (["train.eval_start=20"], ["train.eval_start=0"], ["train.eval_every=10"]):
        cfg = UNet3DWorkload.load_config("full", wrong)
        with pytest.raises(ConfigError, match="closed division of unet3d"):
            cadence_of(BENCHMARK, cfg.train, STEPS)


def test_open_and_mini_keep_their_own_cadence() -> None:
    mini = UNet3DWorkload.load_config("mini").train
    assert mini.division == "open" and mini.eval_start == 0
    assert cadence_of(BENCHMARK, mini, 16).epochs() == list(range(3, mini.max_epochs + 1, 3))
    opened = UNet3DWorkload.load_config("full", ["train.division=open", "train.eval_start=0"]).train
    assert cadence_of(BENCHMARK, opened, STEPS).epochs()[:2] == [20, 40]


def test_eval_start_is_a_whole_epoch_key() -> None:
    from hpcbench.common.cadence import EvalCadence
    cad = EvalCadence.from_config(3, 0, 10, 2, 12, "epoch", start=5)
    assert cad.epochs() == [5, 8, 11, 12]  # and the open division's final evaluation
    with pytest.raises(ConfigError, match="'train.eval_start'"):
        EvalCadence.from_config(0.5, 0, 10, 2, 12, "epoch", start=5)
    with pytest.raises(ConfigError, match="'train.eval_start'"):
        UNet3DWorkload.load_config("mini", ["train.eval_start=-1"])
    with pytest.raises(ConfigError, match="'train.eval_start'"):
        UNet3DWorkload.load_config("mini", ["train.eval_start=4", "train.eval_offset=1"])


@pytest.mark.parametrize("batch, limit", [(2, 10000), (1, 10000), (5, 9883), (32, 8750), (56, 10000), (100, 8400)])
def test_non_convergence_limit_from_samples_per_epoch(batch: int, limit: int) -> None:
    """training_rules.adoc (UNET3D): "A run is classified as non-converged if the target quality metric is not
    reached within CEILING(10000*168/samples_in_epoch) epochs" (the reference's run_and_time.sh stops at 4000)."""
    assert BENCHMARK.closed_eval is not None and BENCHMARK.closed_eval.max_epochs(batch) == limit


def test_full_preset_trains_to_the_non_convergence_limit_and_not_past_it() -> None:
    cfg = UNet3DWorkload.load_config("full")
    assert cfg.train.max_epochs == BENCHMARK.closed_eval.max_epochs(cfg.train.global_batch_size) == 10000
    cadence_of(BENCHMARK, cfg.train, STEPS)  # accepted
    shorter = UNet3DWorkload.load_config("full", ["train.max_epochs=4000"])  # stopping earlier: allowed
    assert cadence_of(BENCHMARK, shorter.train, STEPS).epochs()[-1] == 4000
    past = UNet3DWorkload.load_config("full", ["train.max_epochs=10001"])
    with pytest.raises(ConfigError, match=r"'train.max_epochs'.*CEILING\(10000 x 168 / samples_per_epoch\) = 10000"):
        cadence_of(BENCHMARK, past.train, STEPS)
    opened = UNet3DWorkload.load_config("full", ["train.division=open", "train.eval_start=0", "train.max_epochs=20000"])
    assert cadence_of(BENCHMARK, opened.train, STEPS).epochs()[-1] == 20000  # the open division: no limit


def test_a_run_past_max_epochs_is_logged_aborted(cpu_env, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """What a non-converged run logs: the harness stops at train.max_epochs with run_stop status aborted."""
    from tests.conftest import log_records
    from tests.harness_toy import ToyWorkload, toy_trainer

    log = tmp_path / "log.txt"
    tr = toy_trainer(cpu_env, ToyWorkload, ["train.max_epochs=2", "train.target=1e-9"], log)
    result = tr.run()
    tr.log.close()
    stops = [r for r in log_records(log) if r["key"] == "run_stop"]
    assert result.status == "aborted" and result.epochs == 2 and stops[0]["metadata"]["status"] == "aborted"


def _reference_lr_of_epoch(epoch: int, lr: float = 0.8, init: float = 1e-4, warmup: int = 200) -> float:
    """The reference's loop (image_segmentation/pytorch runtime/training.py), re-written: the optimizer is
    built at ``lr``; at the start of each 1-based ``epoch <= warmup`` ``lr_warmup`` sets
    ``init + (lr - init) * epoch / warmup``; no decay (``lr_decay_epochs`` empty in run_and_time.sh)."""
    rate = lr
    for e in range(1, epoch + 1):
        if e <= warmup and warmup > 0:
            rate = init + (lr - init) * (e / warmup)
    return rate


def test_full_preset_lr_of_every_step_is_the_reference_warmup() -> None:
    """The full preset's rate at every step of the first 203 epochs (84 steps each at global batch 2) is the
    reference's per-epoch warmup from its init_learning_rate 1e-4: constant inside an epoch, epoch 1 at
    1e-4 + (0.8 - 1e-4) / 200, epoch 200 at 0.8, and 0.8 after."""
    import torch

    from hpcbench.common.schedule import Schedule

    cfg = UNet3DWorkload.load_config("full")
    assert (cfg.optim.lr_per_epoch, cfg.optim.warmup_start_lr, cfg.optim.warmup_first_epoch) == (True, 1e-4, 1)
    sched = Schedule.from_config(cfg.optim, STEPS, cfg.train.max_epochs)
    steps = torch.arange(203 * STEPS, dtype=torch.float64)
    ours = sched(steps)
    per_epoch = torch.tensor([_reference_lr_of_epoch(e) for e in range(1, 204)], dtype=torch.float64)
    want = per_epoch.repeat_interleave(STEPS)  # the step s runs in the 1-based epoch s // STEPS + 1
    assert torch.allclose(ours, want, rtol=1e-12, atol=0), (ours - want).abs().max()
    assert float(ours[0]) == pytest.approx(1e-4 + (0.8 - 1e-4) / 200, rel=1e-12)
    assert float(ours[199 * STEPS]) == pytest.approx(0.8, rel=1e-12) and float(ours[199 * STEPS - 1]) < 0.8


def test_warmup_start_and_first_epoch_keys_are_checked_by_name() -> None:
    from hpcbench.common.runconfig import OptimConfig

    for kwargs, key in (({"warmup_start_lr": -1.0, "lr_per_epoch": True}, "optim.warmup_start_lr"),
                        ({"warmup_first_epoch": 2, "lr_per_epoch": True}, "optim.warmup_first_epoch"),
                        ({"warmup_start_lr": 1e-4}, "optim.warmup_start_lr': applies to optim.lr_per_epoch = true or"),
                        ({"warmup_first_epoch": 1}, "optim.warmup_first_epoch': applies to optim.lr_per_epoch = true only")):
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            OptimConfig(unit="epochs", **kwargs).validate()


@pytest.mark.parametrize("batch", [2, 28, 32])
def test_epoch_num_counts_samples_as_the_training_4_0_rcps(batch: int) -> None:
    """training 4.0.0's rcps_unet3d.json is in samples (396,480 = 2,360 epochs x 168), as every v4.0 submitter's
    log (NVIDIA eos_n9 unet3d: first eval_accuracy at epoch_num 168,000); with epoch numbers the package checker's
    RCP test fails a converged closed run. epoch_num = epochs x samples_per_epoch (the padded epoch at batch 32:
    6 steps of 32 = 192 per epoch)."""
    from hpcbench.common.cadence import TrainPoint

    rule = BENCHMARK.closed_eval
    assert rule is not None
    start, every = rule.at(batch)  # the rule's epochs at this batch (the record refuses others in a closed config)
    cfg = UNet3DWorkload.load_config("full", [f"train.global_batch_size={batch}", f"train.eval_start={start}",
                                              f"train.eval_every={every}", f"train.max_epochs={rule.max_epochs(batch)}"])
    steps = -(-168 // batch)
    cad = cadence_of(BENCHMARK, cfg.train, steps)
    first = cad.epochs()[0]
    point = TrainPoint(epoch=first, step=steps, global_step=first * steps)
    assert BENCHMARK.epoch_reporting == "samples"
    assert cad.epoch_num(point) == first * steps * batch
    if batch == 2:
        assert cad.epoch_num(point) == 168_000
    assert cad.epoch_marker(first, first * steps) == first * steps * batch
