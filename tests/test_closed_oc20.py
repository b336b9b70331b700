"""OC20's closed preset against the MLPerf HPC reference (mlcommons/hpc ``open_catalyst``) and the hpc 3.0.0 checker.

The reference at global batch 2048 is its ``configs/pm_b2048.yml`` (the same as ``mlperf_hpc.yml`` but for
batch, rate and schedule): label normalisation ``target_mean -0.7554450631141663``, ``target_std`` and
``grad_target_std`` 2.887317180633545, ``grad_target_mean`` 0; AdamW (no ``weight_decay`` key, so torch's
default 0.01 on every parameter), ``lr_initial`` 0.0016, ``warmup_steps`` 3908, ``warmup_factor`` 0.2,
``lr_milestones`` [23448, 31264], ``lr_gamma`` 0.1, ``max_epochs`` 48, ``energy_coefficient`` 0,
``force_coefficient`` 50, free atoms only. Its ``warmup_lr_lambda`` (``ocpmodels/common/utils.py``) is
re-written below from its definition; its loss is ``DDPLoss(L1Loss)``: the L1 summed over the free atoms'
force components, times the world size, divided by the all-reduced ``input.shape[0]`` (free atoms).
docs/closed.md lists what each test here proves.
"""
from __future__ import annotations

import json
from bisect import bisect
from pathlib import Path

import pytest
import torch

from hpcbench.common.errors import ConfigError
from hpcbench.common.mlperf_keys import optimizer_keys
from hpcbench.common.schedule import Schedule
from hpcbench.workloads.opencatalyst import BENCHMARK
from hpcbench.workloads.opencatalyst.batch import GraphBatch
from hpcbench.workloads.opencatalyst.labels import Normalizer, label_normalizers
from hpcbench.workloads.opencatalyst.workload import OC20Workload, Outputs

REFERENCE = {"lr_initial": 0.0016, "warmup_steps": 3908, "warmup_factor": 0.2, "lr_milestones": [23448, 31264],
             "lr_gamma": 0.1, "max_epochs": 48, "energy_coefficient": 0.0, "force_coefficient": 50.0,
             "target_mean": -0.7554450631141663, "target_std": 2.887317180633545, "grad_target_mean": 0.0,
             "grad_target_std": 2.887317180633545, "weight_decay": 0.01, "betas": (0.9, 0.999), "eps": 1e-8}
TRAIN_SAMPLES = 2_000_000  # S2EF-2M


def reference_multiplier(step: int) -> float:
    """The reference's ``warmup_lr_lambda`` at scheduler step ``step`` (its LambdaLR steps once per batch)."""
    r = REFERENCE
    if step <= r["warmup_steps"]:
        alpha = step / float(r["warmup_steps"])
        return r["warmup_factor"] * (1.0 - alpha) + alpha
    return r["lr_gamma"] ** bisect(r["lr_milestones"], step)


def test_full_preset_is_the_reference_config_at_batch_2048() -> None:
    cfg = OC20Workload.load_config("full")
    o, t, d, m, r = cfg.optim, cfg.train, cfg.data, cfg.model, REFERENCE
    assert t.division == "closed" and t.global_batch_size == 2048 and t.max_epochs == r["max_epochs"]
    assert t.eval_every == 1 and t.target == 0.036
    assert (o.name, o.lr, o.warmup, o.warmup_factor) == ("adamw", r["lr_initial"], r["warmup_steps"], r["warmup_factor"])
    assert (o.schedule, o.unit, list(o.milestones), o.decay_factor) == ("multistep", "steps", r["lr_milestones"],
                                                                         r["lr_gamma"])
    assert o.weight_decay == r["weight_decay"] == torch.optim.AdamW([torch.zeros(1)]).defaults["weight_decay"]
    assert tuple(o.betas) == r["betas"] and o.eps == r["eps"]
    assert d.normalize_labels and (d.target_mean, d.target_std, d.grad_target_mean, d.grad_target_std) == (
        r["target_mean"], r["target_std"], r["grad_target_mean"], r["grad_target_std"])
    assert (m.force_coefficient, m.energy_coefficient) == (r["force_coefficient"], r["energy_coefficient"])
    assert (m.hidden, m.out_emb, m.int_emb, m.basis_emb, m.blocks, m.num_spherical, m.num_radial, m.cutoff) == (
        192, 192, 64, 8, 3, 7, 6, 6.0)


def test_full_preset_runs_past_the_second_milestone_and_the_rcp_epochs() -> None:
    """48 epochs: the second milestone (31264 steps ~ epoch 32 at batch 2048) and every RCP run (30-34 epochs)
    fit; the old 30 would have aborted 9 of the 10 reference runs."""
    cfg = OC20Workload.load_config("full")
    steps_per_epoch = -(-TRAIN_SAMPLES // 2048)  # the reference's DistributedSampler pads: 977
    assert cfg.optim.milestones[-1] / steps_per_epoch == pytest.approx(32.0, abs=0.01)
    rcp = json.loads((Path(__import__("mlperf_logging").__file__).parent / "rcp_checker" / "hpc_3.0.0"
                      / "rcps_oc20.json").read_text())["oc20_ref_2048"]
    assert max(rcp["Epochs to converge"]) <= cfg.train.max_epochs
    assert cfg.train.max_epochs * steps_per_epoch > cfg.optim.milestones[-1]


@pytest.mark.parametrize("steps_per_epoch", [977, 976])
def test_full_preset_lr_of_every_step_is_the_reference_lambda(steps_per_epoch: int) -> None:
    cfg = OC20Workload.load_config("full")
    s = Schedule.from_config(cfg.optim, steps_per_epoch, cfg.train.max_epochs)
    steps = list(range(0, 40)) + list(range(3900, 3920)) + list(range(23440, 23460)) + list(range(31255, 31275))
    got = s(torch.tensor(steps, dtype=torch.float32)).tolist()
    want = [REFERENCE["lr_initial"] * reference_multiplier(k) for k in steps]
    assert got == pytest.approx(want, rel=1e-5)


def test_full_preset_logs_the_rcp_hyperparameters() -> None:
    """The keys the closed checker requires, with the values of the checker's RCP record at batch 2048."""
    cfg = OC20Workload.load_config("full")
    keys = optimizer_keys(BENCHMARK, cfg.optim, 977, cfg.train.max_epochs)
    rcp = json.loads((Path(__import__("mlperf_logging").__file__).parent / "rcp_checker" / "hpc_3.0.0"
                      / "rcps_oc20.json").read_text())["oc20_ref_2048"]["Hyperparams"]
    assert keys["opt_name"] == "AdamW" and cfg.train.global_batch_size == rcp.pop("global_batch_size")
    for key, value in rcp.items():
        assert keys[key] == value, key


def test_normalizer_round_trip_and_reference_values() -> None:
    n = label_normalizers(True, REFERENCE["target_mean"], REFERENCE["target_std"], 0.0, REFERENCE["grad_target_std"])
    x = torch.randn(50, 3, dtype=torch.float64) * 4 - 1
    assert torch.allclose(n.energy.denorm(n.energy.norm(x)), x) and torch.allclose(n.force.norm(n.force.denorm(x)), x)
    assert torch.allclose(n.force.norm(x), x / 2.887317180633545)  # grad_target_mean 0: a pure division
    assert torch.allclose(n.energy.norm(x), (x + 0.7554450631141663) / 2.887317180633545)
    off = label_normalizers(False, 5.0, 0.0, 5.0, 0.0)  # off: the statistics are not used
    assert torch.equal(off.force.norm(x), x) and torch.equal(off.energy.denorm(x), x)


@pytest.mark.parametrize("key,value", [("target_std", "0"), ("grad_target_std", "-1"), ("grad_target_std", "nan"),
                                       ("target_mean", "inf")])
def test_bad_label_statistics_are_refused_by_name(key: str, value: str) -> None:
    with pytest.raises(ConfigError, match=f"data.{key}"):  # a non-finite number already when the config loads
        OC20Workload(OC20Workload.load_config("full", [f"data.{key}={value}"]))


def test_bad_loss_coefficients_are_refused_by_name() -> None:
    with pytest.raises(ConfigError, match="model.force_coefficient"):
        OC20Workload(OC20Workload.load_config("full", ["model.force_coefficient=-1"]))
    with pytest.raises(ConfigError, match="both 0"):
        OC20Workload(OC20Workload.load_config("full", ["model.force_coefficient=0"]))


def toy_batch(seed: int = 0) -> GraphBatch:
    g = torch.Generator().manual_seed(seed)
    n = 7
    free = torch.tensor([True, False, True, True, False, True, True])
    return GraphBatch(z=torch.ones(n, dtype=torch.long), pos=torch.zeros(n, 3), batch=torch.tensor([0, 0, 0, 1, 1, 1, 1]),
                      edge_index=torch.zeros(2, 0, dtype=torch.long), shift=torch.zeros(0, 3),
                      idx_kj=torch.zeros(0, dtype=torch.long), idx_ji=torch.zeros(0, dtype=torch.long),
                      force=torch.randn(n, 3, generator=g) * 3, free=free,
                      energy=torch.randn(2, generator=g) * 5 - 1, num_graphs=2)


def test_loss_is_the_reference_ddp_loss_by_hand() -> None:
    w = OC20Workload(OC20Workload.load_config("full"))
    b = toy_batch()
    g = torch.Generator().manual_seed(1)
    out = Outputs(energy=torch.randn(2, generator=g), forces=torch.randn(7, 3, generator=g))
    std = REFERENCE["grad_target_std"]
    by_hand = 0.0
    for atom in range(7):
        if b.free[atom]:
            by_hand += sum(abs(float(out.forces[atom, c]) - float(b.force[atom, c]) / std) for c in range(3))
    n_free = int(b.free.sum())
    # one rank: the harness divides the loss by the all-reduced count (world x loss / count with world 1)
    got = float(w.loss(out, b)) / float(w.loss_count(b))
    assert got == pytest.approx(50.0 * by_hand / n_free, rel=1e-6)
    # with an energy coefficient the energy L1 of the normalised energies is added (same divisor)
    w2 = OC20Workload(OC20Workload.load_config("full", ["model.energy_coefficient=2"]))
    e_hand = sum(abs(float(out.energy[k]) - (float(b.energy[k]) - REFERENCE["target_mean"]) / REFERENCE["target_std"])
                 for k in range(2))
    assert float(w2.loss(out, b)) == pytest.approx(50.0 * by_hand + 2.0 * e_hand, rel=1e-6)


def test_metric_is_computed_on_de_normalised_forces() -> None:
    w = OC20Workload(OC20Workload.load_config("full"))
    b = toy_batch()
    std = REFERENCE["grad_target_std"]
    exact = Outputs(energy=torch.zeros(2), forces=b.force / std)  # the model predicts normalised forces
    sums = {k: float(v) for k, v in w.eval_sums(exact, b).items()}
    assert w.metric(sums) == pytest.approx(0.0, abs=1e-6) and sums["force_components"] == 3 * int(b.free.sum())
    off = Outputs(energy=torch.zeros(2), forces=b.force / std + 0.01)  # 0.01 normalised = 0.0289 eV/A
    assert w.metric({k: float(v) for k, v in w.eval_sums(off, b).items()}) == pytest.approx(0.01 * std, rel=1e-4)
    raw = OC20Workload(OC20Workload.load_config("full", ["data.normalize_labels=false"]))
    assert raw.metric({k: float(v) for k, v in raw.eval_sums(exact, b).items()}) > 0.5  # not de-normalised: wrong


def test_preload_happens_after_run_start(cpu_env, tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    """The rules start the clock before the training data is touched: with ``data.preload`` the splits are
    decoded after ``run_start`` (the harness's ``start_data``), and the run still trains on the cached samples."""
    from hpcbench.common.mllog import MLPerfLogger
    from hpcbench.common.system import SystemDescription
    from hpcbench.common.trainer import Trainer
    from hpcbench.workloads.opencatalyst.lmdbio import SplitDataset
    from tests.conftest import log_records, run_cli

    data = tmp_path / "data"
    proc = run_cli(["datagen", "oc20", "--out", str(data), "--seed", "3", "--workers", "1", "--train", "6",
                    "--val", "3", "--size", "2,2,2", "--cutoff", "4", "--max-neighbors", "10", "--no-progress"])
    assert proc.returncode == 0, proc.stderr
    log = tmp_path / "log.txt"
    seen: list[tuple[int, list[str]]] = []
    original = SplitDataset.preload

    def recording(self: SplitDataset, threads: int = 2) -> None:
        seen.append((len(self), [r["key"] for r in log_records(log)] if log.exists() else []))
        original(self, threads)

    monkeypatch.setattr(SplitDataset, "preload", recording)
    cfg = OC20Workload.load_config("mini", [f"data.root={data}", "train.max_epochs=1", "train.eval_every=1",
                                            "train.target=10", "train.global_batch_size=2", "model.hidden=16",
                                            "model.out_emb=16", "model.int_emb=8", "model.blocks=1"])
    w = OC20Workload(cfg)
    tr = Trainer(w, cpu_env, MLPerfLogger(log), SystemDescription(), progress=False)
    result = tr.run()
    tr.log.close()
    assert sorted(n for n, _ in seen) == [3, 6]  # both splits, once each
    for _, before in seen:
        assert "init_stop" in before and before[-1] == "run_start", before  # right after run_start
    assert all(src._cache is not None for src in w._sources.values())
    keys = [r["key"] for r in log_records(log)]
    assert keys.index("run_start") < keys.index("epoch_start") and result.status == "success"
