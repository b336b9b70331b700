"""DeepCAM on the real harness: a 2-rank mpiexec run writes an MLPerf log with the benchmark keys."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from hpcbench.common.workload import DataSizes
from hpcbench.workloads.deepcam.datagen import write_dataset
from hpcbench.workloads.deepcam.workload import DeepCAMWorkload

from conftest import run_mpi
from tests.conftest import result_log


def _events(path: Path) -> list[dict]:
    return [json.loads(line.split(":::MLLOG ", 1)[1]) for line in path.read_text().splitlines() if ":::MLLOG" in line]


def test_hyperparameters_cover_the_closed_lamb_rules() -> None:
    for schedule, extra in (("multistep", {"scheduler_milestones", "scheduler_decay_rate"}),
                            ("cosine", {"scheduler_t_max", "scheduler_eta_min"})):
        cfg = DeepCAMWorkload.load_config("full", [f"optim.schedule={schedule}"])
        wl = DeepCAMWorkload(cfg)
        wl.sizes = DataSizes(train_samples=4, eval_samples=1, steps_per_epoch=1)  # the harness sets these
        keys = wl.hyperparameters()
        assert keys["opt_name"] == "LAMB" and keys["opt_eps"] == 1e-6 and keys["opt_max_grad_norm"] == 1.0
        assert {"opt_lr", "opt_betas", "opt_bias_correction", "opt_grad_averaging", "batchnorm_group_size",
                "scheduler_lr_warmup_steps", "scheduler_lr_warmup_factor", *extra} <= set(keys)
        assert keys["scheduler_type"] in ("multistep", "cosine_annealing")


@pytest.mark.mpi
def test_two_rank_training_run_logs_iou(tmp_path: Path) -> None:
    data = tmp_path / "data"
    write_dataset(data, samples=8, eval_samples=3, height=32, width=48, seed=1, workers=1)
    results = tmp_path / "results"
    proc = run_mpi(2, ["-m", "hpcbench", "train", "deepcam", "--config", "mini", "--data", str(data),
                "--results", str(results), "--no-progress", "--set", "train.max_epochs=1",
                "--set", "train.global_batch_size=4", "--set", "optim.distributed=true",
                "--set", "data.threads=1", "--set", "optim.warmup=1"], timeout=300, check=False)
    events = _events(result_log(results))
    status = [e for e in events if e["key"] == "run_stop"][0]["metadata"]["status"]
    # `hpcbench train` exits 4 when an instance ends without reaching its target (1 epoch here)
    assert proc.returncode == (0 if status == "success" else 4), proc.stderr
    by_key = {e["key"]: e for e in events}
    assert by_key["submission_benchmark"]["value"] == "deepcam"
    assert by_key["train_samples"]["value"] == 8 and by_key["eval_samples"]["value"] == 3
    assert by_key["opt_name"]["value"] == "LAMB" and by_key["opt_eps"]["value"] == 1e-6
    iou = by_key["eval_accuracy"]
    assert iou["metadata"]["epoch_num"] == 1 and 0.0 <= iou["value"] <= 1.0
    assert by_key["run_stop"]["metadata"]["status"] in ("success", "aborted")


def test_hyperparameters_take_steps_per_epoch_from_the_harness() -> None:
    cfg = DeepCAMWorkload.load_config("mini", ["optim.unit=epochs", "optim.warmup=2", "optim.schedule=multistep",
                                               "optim.milestones=[3]"])
    wl = DeepCAMWorkload(cfg)
    wl.sizes = DataSizes(train_samples=1000, eval_samples=10, steps_per_epoch=7)
    keys = wl.hyperparameters()
    assert keys["scheduler_lr_warmup_steps"] == 14 and keys["scheduler_milestones"] == [21]
    assert keys["batchnorm_group_size"] == cfg.train.bn_group_size


def _full_schedule(*overrides: str):
    from hpcbench.common.schedule import Schedule

    cfg = DeepCAMWorkload.load_config("full", list(overrides))
    return cfg, Schedule.from_config(cfg.optim, steps_per_epoch=121_266 // 2048, max_epochs=cfg.train.max_epochs)


def test_full_preset_schedule_is_the_reference_scheduler_at_every_step() -> None:
    """The reference's MultiStepLRWarmup (warmup 400, milestone 800, gamma 0.1), built with last_epoch 0 and stepped
    after each optimizer step: 0.0055 (k + 1) / 400 for steps 0..398, then 0.0055 x 399 / 400 held (never 0.0055),
    x 0.1 from step 1200 (the milestone shifted by the warmup + 1 in the scheduler's count, k + 1)."""
    cfg, s = _full_schedule()
    assert cfg.optim.schedule_semantics == "held_warmup"
    for k in range(1301):
        if k <= 398:
            want = 0.0055 * (k + 1) / 400
        elif k <= 1199:
            want = 0.0055 * 399 / 400
        else:
            want = 0.0055 * 399 / 400 * 0.1
        assert s.value(k) == pytest.approx(want, rel=1e-13), k
    assert [s.value(k) for k in (0, 398, 399, 1199, 1200)] == pytest.approx(
        [1.375e-05, 0.00548625, 0.00548625, 0.00548625, 0.000548625], rel=1e-13)
    assert max(s.value(k) for k in range(5000)) < 0.0055
    # the device form: a float32 step counter
    steps = torch.tensor([0.0, 398.0, 399.0, 1199.0, 1200.0])
    assert s(steps).tolist() == pytest.approx([1.375e-05, 0.00548625, 0.00548625, 0.00548625, 0.000548625], rel=1e-6)


def test_full_preset_cosine_variant_is_the_reference_scheduler() -> None:
    """CosineAnnealingLRWarmup (T_max 500 = total 900 - warmup 400, eta_min 1e-4): from the held warmup rate
    0.0055 x 399 / 400 down to eta_min at step 899, then periodically between eta_min and 0.0055 itself."""
    lr, lo, held = 0.0055, 1e-4, 0.0055 * 399 / 400
    cfg, s = _full_schedule("optim.schedule=cosine", "optim.total=900", "optim.min_lr=1e-4")
    for k in range(2301):
        t = k + 1 - 400
        if t < 0:
            want = lr * (k + 1) / 400
        else:
            want = lo + ((held if t <= 500 else lr) - lo) * (1 + math.cos(math.pi * t / 500)) / 2
        assert s.value(k) == pytest.approx(want, rel=1e-12), k
    # four rates printed by the reference class itself (torch 2.13, run outside the tests)
    assert [s.value(k) for k in (400, 899, 900, 1399)] == pytest.approx(
        [0.005486196840018184, 0.0001, 0.0001000532956884298, 0.005500000000000134], rel=1e-12)
    wl = DeepCAMWorkload(cfg)
    wl.sizes = DataSizes(train_samples=121_266, eval_samples=15_158, steps_per_epoch=59)
    keys = wl.hyperparameters()
    assert (keys["scheduler_type"], keys["scheduler_t_max"], keys["scheduler_eta_min"]) == \
        ("cosine_annealing", 500, 1e-4)
    assert (keys["scheduler_lr_warmup_steps"], keys["scheduler_lr_warmup_factor"]) == (400, 1.0)


def test_closed_deepcam_needs_the_reference_schedule_semantics() -> None:
    from hpcbench.common.errors import ConfigError

    with pytest.raises(ConfigError, match="schedule_semantics"):
        DeepCAMWorkload.load_config("full", ["optim.schedule_semantics=harness"])
    open_cfg = DeepCAMWorkload.load_config("full", ["optim.schedule_semantics=harness", "train.division=open"])
    assert open_cfg.optim.schedule_semantics == "harness"
    assert DeepCAMWorkload.load_config("mini").optim.schedule_semantics == "held_warmup"
