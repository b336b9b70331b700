"""Spatial parallelism of the 3D U-Net (mlperf_training/unet3d/spatial.py) against the single-rank model.

Under mpiexec with real gloo groups, float64: outputs, input gradients and every parameter gradient
(summed over the group) equal the single-rank model's on 2 and 4 ranks, first for a small net of every
layer kind, then for the real UNet3D; the Dice + cross-entropy loss from partial sums equals the
single-rank one with its gradients; two SGD steps through the harness's TrainStep with spatial groups
(and data-parallel groups beside them) equal one rank on the whole global batch; `hpcbench train unet3d`
with ``model.spatial_group=2`` on 2 ranks logs the losses and Dice of the 1-rank run.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from hpcbench.common.parallel import reader_shard
import torch
from torch import nn

from hpcbench.common.errors import ConfigError
from hpcbench.workloads.mlperf_training.unet3d.spatial import SpatialGroup, slab_range, spatial_parallel, take_slab
from tests.conftest import first_events, project_env, result_log, run_cli, run_mpi

SCRIPT = "tests/mpi_scripts/unet3d_spatial.py"
TIGHT = 1e-12  # float64: the sums only change order


def _rows(stdout: str, n: int, checks: list[str]) -> dict[str, list[dict]]:
    rows = [json.loads(m) for m in re.findall(r'\{"rank"[^{}]*\}', stdout)]
    out = {c: [r for r in rows if r["check"] == c] for c in checks}
    for c, got in out.items():
        assert sorted(r["rank"] for r in got) == list(range(n)), (c, stdout)
    return out


@pytest.mark.parametrize("ranks", [2, 4])
def test_spatial_model_and_dice_equal_single_rank_forward_and_backward(ranks: int) -> None:
    """One launch per rank count: the layer-kinds net (halos overlapped, then waited for), the real UNet3D
    split along depth and along width, then the Dice + CE loss."""
    checks = ["layers", "naive", "unet", "unet_width", "dice"]
    found = _rows(run_mpi(ranks, [SCRIPT, ",".join(checks)], timeout=120).stdout, ranks, checks)
    for check in ("layers", "naive", "unet", "unet_width"):
        for row in found[check]:
            assert row["spatial"] == ranks
            assert row["halo_convs"] >= 4  # the k3/k5 convolutions were replaced (1x1 and transposed ones stay)
            assert row["params"] >= 15
            for key in ("out", "x_grad", "param_grad"):
                assert row[key] < TIGHT, (check, key, row)
    for row in found["dice"]:
        assert row["loss"] < TIGHT and row["grad"] < TIGHT, row
        assert row["ce_half_of_loss_vs_torch"] < TIGHT, row  # the cross-entropy part is torch's


@pytest.mark.parametrize("ranks,spatial", [(2, 2), (4, 2)])
def test_sgd_steps_with_spatial_groups_equal_one_rank(ranks: int, spatial: int) -> None:
    """Harness maths: partial gradients summed over the instance, loss_count = S x samples."""
    for row in _rows(run_mpi(ranks, [SCRIPT, "step", str(spatial)], timeout=120).stdout, ranks, ["step"])["step"]:
        assert row["spatial"] == spatial
        assert row["moved"] > 0.1  # the steps changed the weights
        assert row["params"] < 1e-12, row


def test_slabs_must_stay_aligned_with_the_downsampling() -> None:
    sg = SpatialGroup(None, 4, 1)
    assert slab_range(64, sg, multiple=8) == (16, 16)
    with pytest.raises(ConfigError, match="multiple of 4 ranks x 8"):
        slab_range(48, sg, multiple=8)
    x = torch.arange(8.0).view(1, 1, 8, 1, 1)
    assert take_slab(x, SpatialGroup(None, 2, 1)).flatten().tolist() == [4.0, 5.0, 6.0, 7.0]


def test_layers_that_would_mix_slabs_are_refused_by_name() -> None:
    sg = SpatialGroup(None, 2, 0)
    with pytest.raises(ConfigError, match=r"1 is MaxPool3d"):
        spatial_parallel(nn.Sequential(nn.Conv3d(1, 1, 3, padding=1), nn.MaxPool3d(2)), sg)
    with pytest.raises(ConfigError, match="only 'same' convolutions"):
        spatial_parallel(nn.Sequential(nn.Conv3d(1, 1, 3, padding=0)), sg)
    with pytest.raises(ConfigError, match="kernel = stride"):
        spatial_parallel(nn.Sequential(nn.ConvTranspose3d(1, 1, 3, stride=2, padding=1)), sg)
    plain = nn.Sequential(nn.Conv3d(1, 1, 3, padding=1))
    assert spatial_parallel(plain, SpatialGroup(None, 1, 0)) is plain  # one rank: nothing to change


def _log_values(results: Path) -> tuple[list[float], list[float], dict]:
    """(train_loss per epoch, eval_accuracy per evaluation, first value of each key) of a run's log."""
    events = [json.loads(line.split(":::MLLOG ", 1)[1]) for line in result_log(results).read_text().splitlines()
              if ":::MLLOG " in line]
    losses = [e["value"]["train_loss"] for e in events if e["key"] == "tracked_stats"]
    accuracy = [e["value"] for e in events if e["key"] == "eval_accuracy"]
    return losses, accuracy, first_events(result_log(results))


@pytest.mark.mpi
def test_training_with_a_spatial_group_of_two_follows_the_one_rank_run(tmp_path: Path) -> None:
    """`hpcbench train unet3d` on 2 ranks with model.spatial_group=2 (both ranks read the same patches,
    each trains a depth slab) logs the same losses and Dice as one rank on the same global batch."""
    data = tmp_path / "data"
    proc = run_cli(["datagen", "unet3d", "--out", str(data), "--cases", "10", "--eval-cases", "2",
                    "--min-shape", "32,32,32", "--max-shape", "40,40,40", "--workers", "1", "--quiet"])
    assert proc.returncode == 0, proc.stderr
    sets = ["train.max_epochs=2", "train.eval_every=1", "data.threads=1"]
    env = project_env(HPCBENCH_TORCH_THREADS="1")
    runs = {}
    for ranks, extra in ((2, ["model.spatial_group=2"]), (1, [])):
        results = tmp_path / f"r{ranks}"
        args = ["-m", "hpcbench", "train", "unet3d", "--config", "mini", "--data", str(data), "--results",
                str(results), "--no-progress", "--device", "cpu"]
        for kv in sets + extra:
            args += ["--set", kv]
        proc = run_mpi(ranks, args, timeout=300, env=env, check=False)
        assert proc.returncode in (0, 4), proc.stdout + proc.stderr  # 4: the target was not reached (2 epochs)
        runs[ranks] = _log_values(results)
    (loss2, acc2, keys2), (loss1, acc1, keys1) = runs[2], runs[1]
    assert len(loss2) == len(loss1) == 2 and len(acc2) == len(acc1) == 2
    assert loss1[1] < loss1[0]  # it trains
    assert loss2 == pytest.approx(loss1, rel=1e-4)  # fp32: the sums only change order
    assert acc2 == pytest.approx(acc1, rel=1e-3, abs=1e-6)
    assert keys2["train_samples"] == keys1["train_samples"] == 8
    assert keys2["global_batch_size"] == keys1["global_batch_size"]
    assert keys2["number_of_nodes"] == keys1["number_of_nodes"]


def test_spatial_group_config_errors_name_the_key() -> None:
    from hpcbench.workloads.mlperf_training.unet3d.workload import UNet3DWorkload

    with pytest.raises(ConfigError, match="model.spatial_group = 4 the depth must be a multiple of 4 slabs x 8"):
        UNet3DWorkload.load_config("mini", ["model.spatial_group=4", "data.patch=[48, 32, 32]",
                                            "data.roi=[32, 32, 32]"])
    with pytest.raises(ConfigError, match="model.spatial_group"):
        UNet3DWorkload.load_config("mini", ["model.spatial_group=2", "model.norm=batchnorm"])
    with pytest.raises(ConfigError, match="'train.graph': cuda_graph is not supported"):
        UNet3DWorkload.load_config("mini", ["model.spatial_group=2", "train.graph=cuda_graph"])
    with pytest.raises(ConfigError, match="'model.spatial_axis'"):
        UNet3DWorkload.load_config("mini", ["model.spatial_axis=time"])
    assert UNet3DWorkload.load_config("mini", ["model.spatial_group=2", "model.spatial_axis=width"]).model.spatial_axis == "width"
    wl = UNet3DWorkload(UNet3DWorkload.load_config("mini", ["model.spatial_group=2"]))
    assert reader_shard(3, 4, wl.parallel_degrees()) == (1, 2)
    with pytest.raises(ConfigError, match="'model.spatial_group': 2 must divide the 3 ranks"):
        reader_shard(0, 3, wl.parallel_degrees())


def test_loss_from_partial_sums_is_the_workloads_loss() -> None:
    """The spatial path's Dice + CE (sums, then the formula) equals the single-device loss of loss.py."""
    from hpcbench.workloads.mlperf_training.unet3d.loss import dice_ce_per_sample
    from hpcbench.workloads.mlperf_training.unet3d.spatial import dice_ce_from_sums, dice_ce_sums

    g = torch.Generator().manual_seed(3)
    logits = torch.randn(3, 3, 8, 8, 8, generator=g)
    labels = torch.randint(0, 3, (3, 1, 8, 8, 8), generator=g)
    labels[2] = 0  # a patch without foreground: Dice's smoothing terms decide it
    ours = dice_ce_from_sums(dice_ce_sums(logits, labels))
    assert ours == pytest.approx(dice_ce_per_sample(logits, labels).tolist(), rel=1e-5)
