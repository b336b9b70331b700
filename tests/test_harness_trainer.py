"""The harness end to end on the toy workload: MLPerf logs, instances, resume, eval reduction,
graph modes and precision. Multi-rank cases run under real mpiexec with gloo groups."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from hpcbench.common.dist import init_distributed
from hpcbench.common.errors import ConfigError
from hpcbench.common.mllog import MLPerfLogger, check_log
from hpcbench.common.system import SystemDescription
from hpcbench.common.trainer import Trainer, run_training
from hpcbench.results_layout import benchmark_dir, summary_file
from tests.conftest import run_cli, run_mpi
from tests.harness_toy import ToyWorkload

TOY = "tests.harness_toy:ToyWorkload"


@pytest.fixture(scope="module")
def env():  # noqa: ANN201 - one singleton-MPI torch group for the in-process runs of this module
    e = init_distributed(device="cpu")  # these runs check CPU behaviour (gloo), also on a GPU node
    yield e
    e.close()


def _rows(stdout: str) -> list[dict]:
    """The JSON line of every rank (ranks' lines may interleave on the shared stdout)."""
    return [json.loads(m) for m in re.findall(r'\{"rank"[^{}]*\}', stdout)]


def _trainer(env, overrides: list[str], log: Path | None = None) -> Trainer:  # noqa: ANN001
    cfg = ToyWorkload.load_config("mini", overrides)
    return Trainer(ToyWorkload(cfg), env, MLPerfLogger(log), SystemDescription(), progress=False)


def _keys(log: Path) -> list[str]:
    return [json.loads(line.split(":::MLLOG ", 1)[1])["key"] for line in log.read_text().splitlines() if ":::MLLOG" in line]


def test_cli_run_reaches_target_and_log_passes_the_official_checker(tmp_path: Path) -> None:
    proc = run_cli(["train", TOY, "--results", str(tmp_path), "--no-progress", "--system-name", "toy"], timeout=240)
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"instance 0: success after \d+ epochs, eval_error=0\.0\d+", proc.stdout), proc.stdout
    folder = benchmark_dir(tmp_path, "toy", "strong", "cosmoflow")  # the runner's results layout
    log = folder / "result_0.txt"
    ok, output = check_log(log)
    assert ok, output
    keys = _keys(log)
    order = ["cache_clear", "init_start", "submission_benchmark", "number_of_nodes", "seed", "global_batch_size",
             "train_samples", "eval_samples", "gradient_accumulation_frequency", "opt_name", "init_stop",
             "run_start", "epoch_start", "epoch_stop", "tracked_stats", "eval_start", "eval_stop", "eval_error",
             "run_stop"]
    positions = [keys.index(k) for k in order]
    assert positions == sorted(positions), keys
    stop = [json.loads(line.split(":::MLLOG ", 1)[1]) for line in log.read_text().splitlines() if "run_stop" in line]
    assert stop[0]["metadata"]["status"] == "success"
    summary = json.loads((summary_file(folder)).read_text())
    assert summary[0]["status"] == "success" and summary[0]["result"]["final_metric"] <= 0.1


def test_max_epochs_without_target_is_aborted(env, tmp_path: Path) -> None:  # noqa: ANN001
    log = tmp_path / "result_0.txt"
    tr = _trainer(env, ["train.target=0.0", "train.max_epochs=2"], log)
    result = tr.run()
    tr.log.close()
    assert result.status == "aborted" and result.epochs == 2 and len(result.metrics) == 2
    assert result.steps == 2 * 512 // 16 and result.samples_per_s > 0
    assert {"data_wait", "step", "eval"} <= set(result.timers)
    # each epoch's own split: its training seconds hold its loader waits and its steps (the evaluation is not in them)
    assert [p["epoch"] for p in result.epoch_phases] == [1, 2] and all(p["steps"] == 512 // 16 for p in result.epoch_phases)
    assert all(0 < p["data_wait_s"] + p["step_s"] <= p["seconds"] for p in result.epoch_phases)
    assert sum(p["step_s"] for p in result.epoch_phases) == pytest.approx(result.timers["step"]["seconds"], abs=1e-5)
    assert '"status": "aborted"' in log.read_text()
    assert _keys(log).count("tracked_stats") == 2


def test_a_diverged_evaluation_ends_the_run_aborted(env, tmp_path: Path) -> None:  # noqa: ANN001
    """Workload.diverged (3D U-Net's reference: mean Dice < 1e-6) stops the run at that evaluation, aborted."""
    log = tmp_path / "result_0.txt"
    tr = _trainer(env, ["train.target=0.0", "train.max_epochs=5"], log)
    tr.workload.diverged = lambda value: True  # type: ignore[method-assign]
    result = tr.run()
    tr.log.close()
    assert result.status == "aborted" and result.epochs == 1 and len(result.metrics) == 1
    assert '"status": "aborted"' in log.read_text() and _keys(log).count("eval_error") == 1


def test_unet3d_diverges_below_the_references_dice() -> None:
    from hpcbench import registry

    cls = registry.get("unet3d")
    w = cls(cls.load_config("full"))
    assert w.diverged(9e-7) and not w.diverged(1e-6) and not w.diverged(0.5)
    assert not cls(cls.load_config("mini")).diverged(0.0)  # open: early evaluations may score 0


@pytest.mark.mpi
def test_two_instances_of_two_ranks_write_one_compliant_log_each(tmp_path: Path) -> None:
    proc = run_mpi(4, ["-m", "hpcbench", "train", TOY, "--results", str(tmp_path), "--instances", "2",
                       "--no-progress", "--device", "cpu", "--system-name", "toy", "--set", "optim.name=lamb", "--set", "optim.distributed=true",
                       "--set", "optim.lr=0.01"], timeout=240)
    assert "instance 0: success" in proc.stdout and "instance 1: success" in proc.stdout, proc.stdout
    folder = benchmark_dir(tmp_path, "toy", "weak", "cosmoflow")  # the runner's results layout
    for k in (0, 1):
        log = folder / f"result_{k}.txt"
        ok, output = check_log(log)
        assert ok, output
        text = log.read_text()
        assert '"key": "number_of_nodes", "value": 1' in text
        assert f'"key": "seed", "value": {1 + k}' in text  # each instance trains with its own seed
    assert sorted(p.name for p in folder.glob("result_*.txt")) == ["result_0.txt", "result_1.txt"]


@pytest.mark.mpi
def test_resume_continues_the_same_run_with_sharded_optimizer_state(tmp_path: Path) -> None:
    proc = run_mpi(2, ["tests/mpi_scripts/harness_train.py", "resume", str(tmp_path)], timeout=240)
    rows = _rows(proc.stdout)
    assert len(rows) == 2
    for row in rows:
        assert row["moved"] > 0.01
        assert row["max_diff"] == 0.0  # bitwise the same parameters
        assert row["losses_resumed"] == row["losses_full"][2:]
        assert row["steps"][0] == row["steps"][1]
    ckpts = sorted(p.name for p in (tmp_path / "instance_0").iterdir())
    assert ckpts == ["epoch_0003", "epoch_0004", "latest"]


@pytest.mark.mpi
def test_eval_sums_over_ranks_and_batchnorm_stats_are_averaged() -> None:
    proc = run_mpi(4, ["tests/mpi_scripts/harness_train.py", "eval"], timeout=180)
    rows = _rows(proc.stdout)
    assert len(rows) == 4
    for row in rows:  # 130 samples over 4 ranks: unequal shares, so a mean of means would differ
        assert row["metric"] == pytest.approx(row["single"], rel=1e-6)
        assert row["bn_diff"] < 1e-6


def test_resume_refuses_a_checkpoint_of_another_model(env, tmp_path: Path) -> None:  # noqa: ANN001
    _trainer(env, ["train.max_epochs=1", f"train.checkpoint_dir={tmp_path}", "train.checkpoint_every=1"]).run()
    tr = _trainer(env, ["train.max_epochs=2", f"train.checkpoint_dir={tmp_path}", "train.resume=true",
                        "model.hidden=8"])
    with pytest.raises(ConfigError, match="different model"):
        tr.run()


def _params_after(env, graph: str, precision: str = "fp32", epochs: int = 1) -> tuple[torch.Tensor, list[float]]:  # noqa: ANN001
    tr = _trainer(env, ["train.target=0.0", f"train.max_epochs={epochs}", f"train.graph={graph}",
                        f"train.precision={precision}", "data.train=128"])
    result = tr.run()
    return tr.parts.flat.params.clone(), result.epoch_losses


@pytest.mark.slow  # inductor compiles C++ kernels: ~30 s with a warm cache, ~2 min cold on 2 shared cores
def test_compile_path_equals_eager(env) -> None:  # noqa: ANN001
    eager, eager_losses = _params_after(env, "eager")
    compiled, compiled_losses = _params_after(env, "compile")
    torch.testing.assert_close(compiled, eager, atol=1e-4, rtol=1e-4)
    assert compiled_losses == pytest.approx(eager_losses, rel=1e-4)


def test_bf16_autocast_trains_with_fp32_master_weights(env) -> None:  # noqa: ANN001
    fp32, fp32_losses = _params_after(env, "eager")
    bf16, bf16_losses = _params_after(env, "eager", "bf16")
    assert bf16.dtype == torch.float32
    assert torch.isfinite(bf16).all() and not torch.equal(bf16, fp32)
    assert bf16_losses[0] == pytest.approx(fp32_losses[0], rel=0.1)


@pytest.mark.parametrize("override,match", [
    ("train.precision=fp16", "fp16 needs a CUDA device"),
    ("train.graph=cuda_graph", "cuda_graph needs a CUDA device"),
])
def test_gpu_only_settings_on_cpu_are_config_errors(env, override: str, match: str) -> None:  # noqa: ANN001
    assert env.device.type == "cpu"  # --device cpu, also on a GPU node
    with pytest.raises(ConfigError, match=match):
        _trainer(env, [override]).run()


@pytest.mark.mpi
def test_batch_that_does_not_split_over_ranks_is_reported_by_key(tmp_path: Path) -> None:
    proc = run_mpi(2, ["-m", "hpcbench", "train", TOY, "--results", str(tmp_path), "--no-progress", "--device", "cpu",
                       "--set", "train.global_batch_size=7"], timeout=120, check=False)
    assert proc.returncode != 0
    assert "train.global_batch_size" in proc.stderr and "multiple of 2" in proc.stderr


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graph capture needs a GPU")
def test_cuda_graph_replay_equals_eager_for_20_steps() -> None:
    from tests.harness_graph import compare

    out = compare(steps=20)
    assert out["max_diff"] <= 1e-5 and out["loss_diff"] <= 1e-5


class _ForceToy(ToyWorkload):
    """Outputs that need autograd inside forward (like OC20 forces = -dE/dpos)."""

    eval_needs_grad = True

    def forward(self, model, batch):  # noqa: ANN001, ANN201
        x = batch["x"].clone().requires_grad_(True)
        out = model(x)
        force = torch.autograd.grad(out.sum(), x, create_graph=True)[0]
        return out + 0.0 * force.sum()


def test_eval_keeps_autograd_for_workloads_that_need_it(env) -> None:  # noqa: ANN001
    cfg = ToyWorkload.load_config("mini", ["train.max_epochs=1", "data.train=64"])
    result = Trainer(_ForceToy(cfg), env, MLPerfLogger(None), SystemDescription(), progress=False).run()
    assert result.final_metric is not None and result.final_metric > 0
    _ForceToy.eval_needs_grad = False  # the same workload under the default no_grad evaluation fails
    try:
        with pytest.raises(RuntimeError, match="does not require grad|grad_fn"):
            Trainer(_ForceToy(cfg), env, MLPerfLogger(None), SystemDescription(), progress=False).run()
    finally:
        _ForceToy.eval_needs_grad = True


def test_evaluations_see_the_weight_average(env, tmp_path: Path) -> None:  # noqa: ANN001
    """optim.swa_decay (common/swa.py): every evaluation runs on the average of the weights, the training on
    its own ones; the last logged metric is the average's, not the trained weights'."""
    tr = _trainer(env, ["train.target=0.0", "train.max_epochs=2", "optim.swa_decay=0.9"], tmp_path / "result_0.txt")
    result = tr.run()
    tr.log.close()
    parts = tr.parts
    assert parts is not None and parts.average is not None and int(parts.average.count) == result.steps
    trained = parts.evaluator.metric(2)
    with parts.average.applied():
        averaged = parts.evaluator.metric(2)
    assert result.metrics[-1][1] == pytest.approx(averaged) and averaged != pytest.approx(trained)
    assert not torch.equal(parts.flat.params, parts.average.average)
    with pytest.raises(ConfigError, match="optim.swa_decay"):
        _trainer(env, ["optim.swa_decay=1.5"])
