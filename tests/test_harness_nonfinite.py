"""A non-finite training loss stops the run with a named error (common.finite)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from hpcbench.common.finite import LossWatch, NonFiniteLossError
from hpcbench.common.mllog import check_log
from hpcbench.results_layout import benchmark_dir
from tests.conftest import log_records, run_cli, run_mpi
from tests.harness_toy import ToyWorkload, toy_trainer

STEPS = 512 // 16  # steps per epoch of the toy's mini preset on one rank


class NaNToy(ToyWorkload):
    """The toy whose training loss is NaN at global step ``nan_at`` (1-based; the weights then turn NaN)."""

    nan_at = 40  # epoch 2, step 8

    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg)
        self.calls = 0

    def loss(self, outputs: torch.Tensor, batch: Any) -> torch.Tensor:
        self.calls += 1
        loss = super().loss(outputs, batch)
        return loss * float("nan") if self.calls == self.nan_at else loss


class NaNToyEarly(NaNToy):
    nan_at = 5


class NaNOnRank1(NaNToy):
    """NaN at step 5 on the instance's rank 1 only (its peers' losses are finite at that step)."""

    nan_at = 5

    def loss(self, outputs: torch.Tensor, batch: Any) -> torch.Tensor:
        import torch.distributed as dist

        if dist.get_rank() == 1:
            return super().loss(outputs, batch)
        return ToyWorkload.loss(self, outputs, batch)


class _InfGrad(torch.autograd.Function):
    """Identity forward, inf gradient: a step whose loss is finite but whose gradients overflow."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:  # noqa: ANN401
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:  # noqa: ANN401
        return grad * float("inf")


class OverflowToy(NaNToy):
    """Step ``nan_at`` has a finite loss and inf gradients (what fp16 loss scaling overflows look like)."""

    nan_at = 5

    def loss(self, outputs: torch.Tensor, batch: Any) -> torch.Tensor:
        self.calls += 1
        loss = ToyWorkload.loss(self, outputs, batch)
        return _InfGrad.apply(loss) if self.calls == self.nan_at else loss


def test_loss_watch_names_the_first_non_finite_step_and_kind() -> None:
    w = LossWatch(torch.device("cpu"))
    for step, value in enumerate([1.0, 0.5, float("inf"), float("nan")], start=1):
        w.observe(torch.tensor(value), step)
    with pytest.raises(NonFiniteLossError, match=r"toy: the training loss is \+inf at epoch 3, step 3/10 "
                                                 r"\(global step 23\) on rank 0"):
        w.check(None, 0, "toy", 3, 10, 20)
    ok = LossWatch(torch.device("cpu"))
    ok.observe(torch.tensor(2.0), 1)
    ok.check(None, 0, "toy", 1, 10, 0)  # finite: nothing


def test_nan_loss_stops_the_run_in_its_epoch_naming_epoch_and_step(cpu_env, tmp_path: Path) -> None:  # noqa: ANN001
    """Default ``train.log_every = 0``: read back at the epoch's end, which names the step it happened."""
    log = tmp_path / "result_0.txt"
    tr = toy_trainer(cpu_env, NaNToyEarly, ["train.max_epochs=3"], log)
    with pytest.raises(NonFiniteLossError, match=rf"toy: the training loss is NaN at epoch 1, step 5/{STEPS} "
                                                 r"\(global step 5\)"):
        tr.run()
    tr.log.close()
    keys = [r["key"] for r in log_records(log)]
    # stopped before a NaN reaches tracked_stats or an evaluation; the runner writes run_stop aborted
    assert keys.count("epoch_start") == 1 and "tracked_stats" not in keys and "eval_error" not in keys
    assert "run_stop" not in keys


def test_nan_loss_with_log_every_1_stops_at_that_step_and_the_log_is_aborted(tmp_path: Path) -> None:
    proc = run_cli(["train", "tests.test_harness_nonfinite:NaNToy", "--results", str(tmp_path), "--no-progress",
                    "--system-name", "toy", "--set", "train.log_every=1"], timeout=240)
    assert proc.returncode == 4, proc.stdout + proc.stderr
    msg = f"NonFiniteLossError: toy: the training loss is NaN at epoch 2, step 8/{STEPS} (global step 40)"
    assert msg in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert "instance 0: FAILED" in proc.stdout, proc.stdout
    log = benchmark_dir(tmp_path, "toy", "strong", "cosmoflow") / "result_0.txt"
    recs = log_records(log)
    assert recs[-1]["key"] == "run_stop" and recs[-1]["metadata"]["status"] == "aborted"
    assert "NaN at epoch 2, step 8" in recs[-1]["metadata"]["error"]
    keys = [r["key"] for r in recs]
    assert keys.count("epoch_start") == 2 and keys.count("epoch_stop") == 1  # stopped inside epoch 2
    _, output = check_log(log)  # an aborted run never meets the target: that is the checker's only complaint
    complaints = [ln for ln in output.splitlines() if ln.startswith(("WARNING", "ERROR")) and "FAILED" not in ln]
    assert len(complaints) == 1 and "Failed checks for eval_error" in complaints[0], output


@pytest.mark.mpi
def test_the_ranks_of_an_instance_stop_together_naming_the_rank_that_saw_it(tmp_path: Path) -> None:
    proc = run_mpi(2, ["-m", "hpcbench", "train", "tests.test_harness_nonfinite:NaNOnRank1", "--results", str(tmp_path),
                       "--no-progress", "--device", "cpu", "--system-name", "toy", "--set", "train.log_every=1"],
                   timeout=240, check=False)
    assert proc.returncode == 4, proc.stdout + proc.stderr
    msg = f"the training loss is NaN at epoch 1, step 5/{STEPS} (global step 5) on rank 1 of the instance"
    assert proc.stderr.count(msg) == 2, proc.stderr  # both ranks, the same named error (no peer-gone errors)
    assert "Connection closed by peer" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    recs = log_records(benchmark_dir(tmp_path, "toy", "strong", "cosmoflow") / "result_0.txt")
    assert recs[-1]["key"] == "run_stop" and recs[-1]["metadata"]["status"] == "aborted"


def test_an_overflow_step_skipped_by_loss_scaling_is_not_an_error(cpu_env, monkeypatch) -> None:  # noqa: ANN001
    """With loss scaling the inf gradients of step 5 are skipped (the loss itself is finite): the run goes
    on. Without it (fp32) the inf gradients reach the weights and the next loss is non-finite: stopped."""
    from hpcbench.common.precision import Precision

    with pytest.raises(NonFiniteLossError, match=r"at epoch 1, step 6/"):
        toy_trainer(cpu_env, OverflowToy, ["train.max_epochs=1", "train.target=0.0"]).run()
    # fp16 needs CUDA; on this CPU test the dynamic scaler is switched on for fp32 math (no autocast)
    monkeypatch.setattr(Precision, "scaled", property(lambda self: True))
    tr = toy_trainer(cpu_env, OverflowToy, ["train.max_epochs=1", "train.target=0.0"])
    result = tr.run()
    assert result.status == "aborted" and result.epochs == 1  # ran to max_epochs: not stopped
    assert float(tr.parts.step.precision.scale) == 2.0**15  # the scaler saw the overflow and backed off
    assert all(torch.isfinite(torch.tensor(result.epoch_losses)))
