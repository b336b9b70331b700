"""DLRM-DCNv2 on the harness (training suite): the mini preset reaches its AUROC target under mpiexec with
2 ranks (tables sharded over them) and its log passes the official training 5.1.0 checker; K instances
are K runs in the training results layout; Adagrad on the flat buffer equals torch's; model-parallel
parameters sit after the shared prefix that the gradient sync covers."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from hpcbench.common.flat import FlatParams
from hpcbench.common.mllog import check_log
from hpcbench.common.optim import build_optimizer
from hpcbench.common.runconfig import OptimConfig
from conftest import first_events, run_cli, run_mpi
from hpcbench import registry
from hpcbench import results_layout as rl
from hpcbench.workloads.mlperf_training.dlrm_dcnv2.workload import DLRMWorkload

TRAIN = ["-m", "hpcbench", "train", "dlrm_dcnv2", "--config", "mini", "--system-name", "box", "--no-progress",
         "--device", "cpu"]


@pytest.fixture(scope="module")
def mini_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dlrm_mini")
    proc = run_cli(["datagen", "dlrm_dcnv2", "--out", str(out), "--workers", "2", "--quiet",
                    *DLRMWorkload.embedded_datagen_args()])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


def test_mini_reaches_target_on_two_ranks_and_passes_the_training_checker(mini_data: Path, tmp_path: Path) -> None:
    proc = run_mpi(2, [*TRAIN, "--data", str(mini_data), "--results", str(tmp_path)], timeout=300)
    log = rl.benchmark_dir(tmp_path, "box", "", "dlrm_dcnv2") / "result_0.txt"
    assert log == tmp_path / "results" / "box" / "dlrm_dcnv2" / "result_0.txt"
    assert "instance 0: success" in proc.stdout, proc.stdout + proc.stderr
    ev = first_events(log)
    assert ev["submission_benchmark"] == "dlrm_dcnv2" and ev["submission_division"] == "open"
    assert ev["gradient_accumulation_steps"] == 1 and "gradient_accumulation_frequency" not in ev
    assert ev["opt_name"] == "adagrad" and ev["opt_adagrad_epsilon"] == 1e-8
    assert ev["eval_samples"] == 16384 and ev["train_samples"] == 3 * 32768
    aurocs = [json.loads(ln.split(":::MLLOG ", 1)[1])["value"] for ln in log.read_text().splitlines()
              if '"key": "eval_accuracy"' in ln]
    assert aurocs and max(aurocs) >= 0.77 > 0.5  # the target; a constant predictor scores 0.5
    ok, out = check_log(log, "5.1.0", "training")
    assert ok, out
    assert check_log(log, "6.0.0", "training")[0]  # the newest ruleset that still has dlrm_dcnv2


def test_instances_are_runs_of_the_training_layout(mini_data: Path, tmp_path: Path) -> None:
    # with sparse gradients (the full preset's path, off in mini): one rank per instance owns the large tables
    run_mpi(2, [*TRAIN, "--data", str(mini_data), "--results", str(tmp_path), "--instances", "2",
                "--set", "train.max_epochs=1", "--set", "model.sparse_grads=true"], timeout=300, check=False)
    folder = tmp_path / "results" / "box" / "dlrm_dcnv2"
    assert sorted(p.name for p in folder.iterdir()) == ["result_0.txt", "result_1.txt"]
    summary = json.loads(rl.summary_file(folder).read_text())
    assert rl.summary_file(folder) == tmp_path / "hpcbench" / "box" / "dlrm_dcnv2" / "train_summary.json"
    assert [s["instance"] for s in summary] == [0, 1]
    assert all(not s["errors"] and s["result"]["epochs"] == 1 and s["result"]["final_metric"] > 0.7
               for s in summary), summary  # trained (a constant predictor scores 0.5)
    assert {first_events(folder / f"result_{k}.txt")["seed"] for k in (0, 1)} == {1, 2}  # independent runs


def test_registry_entry() -> None:
    e = registry.entry("dlrm_dcnv2")
    assert (e.suite, e.ruleset, e.required_runs) == ("training", "5.1.0", 10)
    assert registry.suite_of("dlrm_dcnv2") == ("training", "5.1.0") and registry.suite_of("cosmoflow") == ("hpc", "3.0.0")
    cls = registry.get("dlrm_dcnv2")
    full = cls.load_config("full")
    assert (full.train.global_batch_size, full.optim.lr, full.train.target) == (65536, 0.005, 0.80275)
    assert full.train.division == "closed" and full.optim.name == "adagrad"
    assert full.train.eval_every == 0.05 and full.train.eval_every_samples == 0  # 20 evaluations per epoch


@pytest.mark.parametrize("wd,lr_decay,acc", [(0.0, 0.0, 0.0), (0.01, 0.1, 0.1)])
def test_adagrad_on_the_flat_buffer_equals_torch(wd: float, lr_decay: float, acc: float) -> None:
    torch.manual_seed(0)
    a = nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 1))
    b = nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 1))
    b.load_state_dict(a.state_dict())
    cfg = OptimConfig(name="adagrad", lr=0.1, eps=1e-8, weight_decay=wd, lr_decay=lr_decay, initial_accumulator=acc)
    flat = FlatParams(a)
    ours = build_optimizer(flat, cfg)
    ref = torch.optim.Adagrad(b.parameters(), lr=0.1, eps=1e-8, weight_decay=wd, lr_decay=lr_decay,
                              initial_accumulator_value=acc)
    for step in range(4):
        x = torch.randn(16, 5)
        flat.zero_grad()
        a(x).square().sum().backward()
        flat.check_grads()
        ours.step(torch.tensor(cfg.lr))
        ref.zero_grad()
        b(x).square().sum().backward()
        ref.step()
        for p, q in zip(a.parameters(), b.parameters()):
            torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7, msg=f"step {step}")


def test_local_parameters_come_after_the_shared_prefix() -> None:
    m = nn.Sequential(nn.Linear(3, 70), nn.Linear(70, 2))
    local = list(m[0].parameters())
    flat = FlatParams(m, local=local)
    assert flat.has_local and flat.names[:2] == ["1.weight", "1.bias"]
    assert flat.shared_size == flat.offsets[2] and flat.shared_size % 64 == 0
    assert all(off >= flat.shared_size for off in flat.offsets[2:])
    assert not FlatParams(nn.Linear(2, 2)).has_local
