"""An initial optimizer state (a checkpoint's Adam moments and step, OpenFold's) starts Adam's bias correction
from the checkpoint's step, while the learning-rate schedule and the run's step count start from 0: the OpenFold
reference calls its scheduler with the run's own iteration (train.py ``lr_scheduler(iteration)``)."""
from __future__ import annotations

import pytest
import torch

from hpcbench.common.flat import FlatParams
from hpcbench.common.optim import build_optimizer
from hpcbench.common.precision import Precision
from hpcbench.common.schedule import Schedule
from hpcbench.common.step import TrainStep
from tests.harness_toy import ToyWorkload


def test_schedule_counts_the_runs_steps_after_an_initial_optimizer_state() -> None:
    torch.manual_seed(0)
    w = ToyWorkload(ToyWorkload.load_config("mini", ["optim.name=adam", "optim.schedule=constant", "optim.unit=steps",
                                                     "optim.lr=0.001", "optim.warmup=3", "optim.warmup_style=linspace",
                                                     "optim.warmup_start_lr=0.00001"]))
    model = w.build_model()
    flat = FlatParams(model)
    opt = build_optimizer(flat, w.cfg.optim)
    zeros = [torch.zeros(n) for n in flat.numels]
    opt.load_initial({"exp_avg": list(zeros), "exp_avg_sq": [z + 1e-4 for z in zeros], "step": 1400.0}, "test")
    assert opt.step_origin == 1400.0 and float(opt.step_count) == 1400.0
    schedule = Schedule.from_config(w.cfg.optim, steps_per_epoch=10, max_epochs=1)
    step = TrainStep(w, model, flat, opt, schedule, Precision("fp32", torch.device("cpu")))
    used: list[float] = []
    inner = opt.step

    def spy(lr: torch.Tensor, skip: torch.Tensor | None = None) -> None:
        used.append(float(lr))
        inner(lr, skip)

    opt.step = spy  # type: ignore[method-assign]
    batch = {"x": torch.randn(8, w.cfg.data.features), "y": torch.rand(8, 4)}
    for _ in range(5):
        step(batch)
    # the reference's linspace(1e-5, 1e-3, 3) over iterations 1..3, then 1e-3 (at step 1400 it would be 1e-3 always)
    assert used == pytest.approx([1e-5, 5.05e-4, 1e-3, 1e-3, 1e-3], rel=1e-6)
    assert float(opt.step_count) == 1405.0  # Adam's own count goes on from the checkpoint's
