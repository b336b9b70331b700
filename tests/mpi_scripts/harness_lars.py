"""Run under mpiexec: LARS on N ranks (each with its own gradients, synced by the optimizer's
all-reduce) vs single-process LARS on the ranks' mean gradient, with the exemption mask.

Prints one JSON line per rank: max |difference| of the flat parameters after the steps (the zero
gaps included) and how far the parameters moved.
"""
from __future__ import annotations

import json
import sys

import torch
from torch import nn

from hpcbench.common.dist import init_distributed
from hpcbench.common.flat import FlatParams
from hpcbench.common.optim import build_optimizer
from hpcbench.common.runconfig import OptimConfig


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 6, 3, bias=False), nn.BatchNorm2d(6), nn.Flatten(), nn.Linear(6 * 9, 5))


def grads(step: int, rank: int, n: int) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(1000 * step + rank)) * (1 + rank)


def main() -> None:
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 6
    env = init_distributed(device="cpu")
    world, rank = env.layout.instance_size, env.layout.instance_rank
    cfg = OptimConfig(name="lars", momentum=0.9, weight_decay=1e-4, eps=0.0, trust_coefficient=0.01)
    ours, ref = FlatParams(model()), FlatParams(model())
    exempt = [n.endswith("bias") or n.startswith("1.") for n in ours.names]
    opt = build_optimizer(ours, cfg, world, rank, decay_exempt=exempt)
    ref_opt = build_optimizer(ref, cfg, decay_exempt=exempt)
    n = ours.numel
    for step in range(steps):
        lr = torch.tensor(0.2 * (1 + step % 3))
        ours.unpack(grads(step, rank, n), ours.grads)
        opt.step(lr)
        ref.unpack(sum(grads(step, r, n) for r in range(world)) / world, ref.grads)
        ref_opt.step(lr)
    diff = (ours.params - ref.params).abs().max().item()
    moved = (ref.params - FlatParams(model()).params).abs().max().item()
    print(json.dumps({"rank": rank, "world": world, "max_diff": diff, "moved": moved}), flush=True)
    env.close()


if __name__ == "__main__":
    main()
