"""Run under mpiexec: the per-rank loss sum, normalised as the harness does (common/step.py: times
the ranks, divided by the all-reduced loss count), gives after the gradient average the same
gradient as the whole global batch on one process."""
from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist

from hpcbench.common.data.sampler import EpochSampler
from hpcbench.common.dist import init_distributed
from hpcbench.workloads.opencatalyst.batch import collate
from hpcbench.workloads.opencatalyst.model import energy_and_forces
from hpcbench.workloads.opencatalyst.workload import OC20Workload

GLOBAL_BATCH = 6


def main(data: str) -> None:
    env = init_distributed(1, device="cpu")  # 3 ranks on CPU tensors (gloo), also on a GPU node
    rank, world = env.layout.instance_rank, env.layout.instance_size
    cfg = OC20Workload.load_config("mini", [f"data.root={data}", "data.preload=false", "model.hidden=16",
                                            "model.out_emb=16", "model.int_emb=8", "model.blocks=1"])
    w = OC20Workload(cfg)
    ds = w.source("train")
    torch.manual_seed(0)
    model = w.build_model()
    with torch.no_grad():
        model.out.final.normal_(0, 0.1)
    model.train()

    def sampler(r: int) -> EpochSampler:
        return EpochSampler(len(ds), GLOBAL_BATCH // world, r, world, seed=3, partition="balanced", costs=ds.costs())

    mine = sampler(rank).batches()[0].tolist()
    everything = [i for r in range(world) for i in sampler(r).batches()[0].tolist()]
    batch = collate([ds[i] for i in mine])
    count = w.loss_count(batch)
    dist.all_reduce(count)
    loss = w.loss(w.forward(model, batch), batch) * world / count
    loss.backward()
    grads = torch.cat([p.grad.flatten() for p in model.parameters()])
    dist.all_reduce(grads)
    grads /= world
    model.zero_grad()
    full = collate([ds[i] for i in everything])
    # single-process reference: the reference's DDPLoss mean, the L1 summed over every free atom's force
    # components divided by the number of free atoms (the mini preset: raw forces, coefficient 1)
    _, f = energy_and_forces(model, full.z, full.pos, full.edge_index, full.shift, full.idx_kj, full.idx_ji,
                             full.batch, full.num_graphs, create_graph=True)
    ((f - full.force).abs()[full.free].sum() / full.free.sum()).backward()
    ref = torch.cat([p.grad.flatten() for p in model.parameters()])
    err = float((grads - ref).norm() / ref.norm())
    # one write(2) per line: ranks share the pipe, and print() writes the text and the newline
    # separately, so lines of different ranks could interleave
    sys.stdout.flush()
    os.write(1, f"rank {rank}: samples {len(mine)} rel_grad_err {err:.2e}\n".encode())
    assert err < 1e-5, err
    # the first step: the global batch's worth of distinct samples of the first window (here the whole split)
    assert len(set(everything)) == GLOBAL_BATCH and set(everything) <= set(sampler(rank).order().tolist())
    env.close()


if __name__ == "__main__":
    main(sys.argv[1])
