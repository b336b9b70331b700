"""Run under mpiexec: DistributedLAMB on N ranks vs single-process LAMB on the averaged gradients.

Prints one JSON line per rank: max |difference| of the parameters after the steps, the rank's
optimizer-state elements and the full model's parameter count.
"""
from __future__ import annotations

import json
import sys

import torch
from torch import nn

from hpcbench.common.dist import init_distributed
from hpcbench.common.flat import FlatParams
from hpcbench.common.optim import LAMB, DistributedLAMB
from hpcbench.common.runconfig import OptimConfig


def model() -> nn.Module:
    torch.manual_seed(0)  # odd sizes, so rank shards cut through tensors
    return nn.Sequential(nn.Linear(7, 13), nn.LayerNorm(13), nn.Linear(13, 5), nn.Linear(5, 3, bias=False))


def grads(step: int, rank: int, n: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(n, generator=g) * (1 + rank)


def main() -> None:
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    env = init_distributed(device="cpu")  # CPU tensors and gloo, also on a GPU node
    world, rank = env.layout.instance_size, env.layout.instance_rank
    cfg = OptimConfig(name="lamb", lr=0.01, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01, max_grad_norm=1.0,
                      distributed=True)
    dist_flat = FlatParams(model())
    ref_flat = FlatParams(model())
    dist_opt = DistributedLAMB(dist_flat, cfg, world, rank)
    ref_opt = LAMB(ref_flat, cfg)
    n = dist_flat.numel
    for step in range(steps):
        lr = torch.tensor(0.01 * (1 + step % 3))
        dist_flat.unpack(grads(step, rank, n), dist_flat.grads)
        dist_opt.step(lr)
        ref_flat.unpack(sum(grads(step, r, n) for r in range(world)) / world, ref_flat.grads)
        ref_opt.step(lr)
    diff = (dist_flat.params - ref_flat.params).abs().max().item()  # gaps included: they must stay zero
    moved = (ref_flat.params - FlatParams(model()).params).abs().max().item()
    print(json.dumps({"rank": rank, "world": world, "max_diff": diff, "moved": moved, "numel": n,
                      "state": dist_opt.state_numel(), "ref_state": ref_opt.state_numel()}), flush=True)
    env.close()


if __name__ == "__main__":
    main()
