"""Run under mpiexec: the spatial-parallel 3D U-Net against the single-rank model, in float64.

    mpiexec -n N python tests/mpi_scripts/unet3d_spatial.py CHECK[,CHECK...] [SPATIAL]

CHECK is ``layers`` (a small net of every layer type spatial.py handles, k3/k5 and stride-2 convs;
``naive``: the same without overlap), ``unet`` (the real UNet3D with few channels; ``unet_width``:
split along width, batch 2), ``dice`` (the Dice + cross-entropy loss from partial
sums) or ``step`` (two SGD steps through the harness's TrainStep with SPATIAL ranks per sample and
N / SPATIAL data-parallel groups, against one rank on the whole global batch). Every rank holds
the single-rank reference itself (same seed), and prints one JSON line per check of the largest
(relative) differences.
"""
from __future__ import annotations

import copy
import dataclasses
import json
import sys
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from hpcbench.common.dist import init_distributed
from hpcbench.common.flat import FlatParams
from hpcbench.common.optim import build_optimizer
from hpcbench.common.precision import Precision
from hpcbench.common.runconfig import OptimConfig
from hpcbench.common.schedule import Schedule
from hpcbench.common.step import TrainStep
from hpcbench.workloads.mlperf_training.unet3d.config import UNetModelConfig
from hpcbench.workloads.mlperf_training.unet3d.model import UNet3D
from hpcbench.workloads.mlperf_training.unet3d.spatial import (SpatialGroup, dice_ce_from_sums, dice_ce_loss, dice_ce_sums,
                                            new_spatial_groups, spatial_parallel, take_slab)


def layers_net() -> nn.Module:
    """Every layer kind of the U-Net plus a biased k5 convolution (wider halos, a bias gradient); a bias before
    an instance norm has a zero gradient, so none is there."""
    return nn.Sequential(
        nn.Conv3d(2, 4, 3, padding=1, bias=False), nn.InstanceNorm3d(4, affine=True), nn.LeakyReLU(0.01),
        nn.Conv3d(4, 6, 3, stride=2, padding=1, bias=False), nn.InstanceNorm3d(6, affine=True), nn.ReLU(),
        nn.Conv3d(6, 6, 5, padding=2, bias=True), nn.ReLU(),
        nn.ConvTranspose3d(6, 4, kernel_size=2, stride=2, bias=True),
        nn.Conv3d(4, 4, 3, padding=1, bias=False), nn.InstanceNorm3d(4, affine=True), nn.ReLU(),
        nn.Conv3d(4, 3, 1, bias=True))


def unet() -> nn.Module:
    return UNet3D(UNetModelConfig(channels=(4, 8, 16), in_channels=1, n_class=3))


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest |a - b| relative to the largest |b| (1 where b is all zeros)."""
    a, b = a.detach(), b.detach()
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-300))


def check_model(build: Any, sg: SpatialGroup, shape: tuple[int, ...], overlap: bool = True) -> dict[str, float]:
    """Forward and backward of the spatial model on slabs vs the single-rank model on the volume."""
    torch.manual_seed(0)
    ref = build()
    model = spatial_parallel(copy.deepcopy(ref), sg, overlap)
    x = torch.randn(shape).requires_grad_()
    out_ref = ref(x)
    weights = torch.randn(out_ref.shape)  # a loss that reaches every output voxel differently
    (out_ref * weights).sum().backward()
    xs = take_slab(x.detach(), sg).clone().requires_grad_()
    out = model(xs)
    (out * take_slab(weights, sg)).sum().backward()  # the group's objective: the sum of the ranks' losses
    grads = []
    for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        g = p.grad.clone()
        dist.all_reduce(g, group=sg.group)  # each rank's part of the parameter gradient
        grads.append(max_diff(g, q.grad))
    return {"out": max_diff(out, take_slab(out_ref, sg)), "x_grad": max_diff(xs.grad, take_slab(x.grad, sg)),
            "param_grad": max(grads), "params": len(grads),
            "halo_convs": sum(type(m).__name__ == "HaloConv3d" for m in model.modules())}


def check_dice(sg: SpatialGroup) -> dict[str, float]:
    """Per-sample loss and logit gradients: the group's objective is S x the loss (module docstring)."""
    torch.manual_seed(1)
    logits = torch.randn(2, 3, 16, 8, 8).requires_grad_()
    labels = torch.randint(0, 3, (2, 1, 16, 8, 8))
    ref = dice_ce_from_sums(dice_ce_sums(logits, labels))
    ref.sum().backward()
    ls = take_slab(logits.detach(), sg).clone().requires_grad_()
    loss = dice_ce_loss(ls, take_slab(labels, sg), sg)
    loss.sum().backward()
    ce = nn.functional.cross_entropy(logits.detach(), labels[:, 0], reduction="none").mean(dim=(1, 2, 3))
    return {"loss": max_diff(loss, ref), "grad": max_diff(ls.grad, sg.size * take_slab(logits.grad, sg)),
            "ce_half_of_loss_vs_torch": max_diff(dice_ce_sums(logits.detach(), labels)[:, -2] / (16 * 64), ce)}


class SpatialToy:
    """The smallest workload the harness's TrainStep drives: the U-Net on slabs, Dice + CE as a sum
    over samples, ``loss_count`` = the samples (each spatial rank counts its whole volumes)."""

    name = "spatial_toy"
    static_shapes = True

    def __init__(self, sg: SpatialGroup) -> None:
        self.sg = sg

    def forward(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return model(take_slab(batch["x"], self.sg))

    def loss(self, outputs: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return dice_ce_loss(outputs, take_slab(batch["y"], self.sg), self.sg).sum()

    def loss_count(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.tensor(float(batch["x"].shape[0]))


def check_step(sg: SpatialGroup, world: int, rank: int) -> dict[str, float]:
    """Two SGD (momentum) steps: ``world / S`` data-parallel groups of S spatial ranks vs one rank."""
    dp, dp_rank, per_group = world // sg.size, rank // sg.size, 2
    torch.manual_seed(2)
    x = torch.randn(2, dp * per_group, 1, 32, 16, 16)  # two steps of the global batch
    y = torch.randint(0, 3, (2, dp * per_group, 1, 32, 16, 16))
    cfg = OptimConfig(name="sgd", lr=0.5, momentum=0.9)
    torch.manual_seed(0)
    ref = unet()
    model = spatial_parallel(copy.deepcopy(ref), sg)

    def stepper(m: nn.Module, workload: Any, ranks: int) -> tuple[TrainStep, FlatParams]:
        flat = FlatParams(m, dtype=torch.float64)
        opt = build_optimizer(flat, cfg, ranks, rank if ranks > 1 else 0)
        return TrainStep(workload, m, flat, opt, Schedule.from_config(cfg, 1, 2),
                         Precision("fp32", torch.device("cpu"), ranks), "eager", world=ranks), flat

    step, flat = stepper(model, SpatialToy(sg), world)
    ref_step, ref_flat = stepper(ref, SpatialToy(SpatialGroup(None, 1, 0)), 1)
    mine = slice(dp_rank * per_group, (dp_rank + 1) * per_group)
    losses = []
    for i in range(2):
        step({"x": x[i, mine], "y": y[i, mine]})
        losses.append(float(ref_step({"x": x[i], "y": y[i]})))
    moved = float((ref_flat.params - FlatParams(unet(), dtype=torch.float64).params).abs().max())
    return {"params": max_diff(flat.params, ref_flat.params), "moved": moved, "ref_loss": losses[-1]}


def main() -> None:
    checks = sys.argv[1].split(",")
    env = init_distributed(device="cpu")
    world, rank = env.layout.instance_size, env.layout.instance_rank
    torch.set_default_dtype(torch.float64)
    size = int(sys.argv[2]) if len(sys.argv) > 2 else world
    sg = new_spatial_groups(size)
    for check in checks:
        if check == "layers":
            result = check_model(layers_net, sg, (2, 2, 16, 6, 5))
        elif check == "naive":  # halos waited for before computing: the benchmark's comparison
            result = check_model(layers_net, sg, (2, 2, 16, 6, 5), overlap=False)
        elif check == "unet":
            result = check_model(unet, sg, (1, 1, 32, 16, 16))
        elif check == "unet_width":  # slabs along the last axis (model.spatial_axis = width)
            result = check_model(unet, dataclasses.replace(sg, axis=4), (2, 1, 16, 8, 32))
        elif check == "dice":
            result = check_dice(sg)
        elif check == "step":
            result = check_step(sg, world, rank)
        else:
            raise SystemExit(f"unknown check {check!r}")
        print(json.dumps({"rank": rank, "check": check, "world": world, "spatial": sg.size, **result}), flush=True)
    env.close()


if __name__ == "__main__":
    main()
