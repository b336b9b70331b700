"""Run under mpiexec (1 or more ranks): DLRM-DCNv2 through the harness's own step (``TrainStep``:
flat buffer, gradient sync, schedule, Adagrad) with ``model.sparse_grads`` true vs false, same seed,
same batches, in float64: the weights after a few steps must be equal. Also the memory accounting of
the sparse path: the owned tables are outside the flat buffer, their gradient is sparse with one row
per distinct id routed to this rank, and nothing dense of their size exists.

Rank 0 prints one JSON line: a list with one result per rank.
"""
from __future__ import annotations

import json

import numpy as np
import torch
import torch.distributed as dist

from hpcbench.common.dist import init_distributed
from hpcbench.common.flat import FlatParams
from hpcbench.common.parallel import Parallel
from hpcbench.common.optim import build_optimizer
from hpcbench.common.precision import Precision
from hpcbench.common.schedule import Schedule
from hpcbench.common.step import TrainStep
from hpcbench.workloads.mlperf_training.dlrm_dcnv2.workload import DLRMWorkload

GLOBAL_BATCH = 24
STEPS = 3
CARDS = [1000, 7, 500, 3, 2000, 50] * 4 + [1000, 7]  # 26 tables: the large ones are sharded/sparse


def build(sparse: bool, rank: int, world: int) -> tuple[DLRMWorkload, torch.nn.Module, FlatParams, TrainStep]:
    overrides = [f"model.cardinalities={CARDS}", "model.embedding_dim=8", "model.bottom_mlp=[16, 8]",
                 "model.top_mlp=[32, 16, 1]", "model.dcn_layers=2", "model.dcn_low_rank=4",
                 "model.shard_min_rows=100", f"model.sparse_grads={str(sparse).lower()}", "optim.lr=0.05"]
    wl = DLRMWorkload(DLRMWorkload.load_config("mini", overrides))
    torch.manual_seed(0)
    model = wl.distribute(wl.build_model(), Parallel.of_default_group())
    flat = FlatParams(model, wl.local_parameters(model), wl.sparse_parameters(model), dtype=torch.float64)
    opt = build_optimizer(flat, wl.cfg.optim, world, rank)
    step = TrainStep(wl, model, flat, opt, Schedule.from_config(wl.cfg.optim, 10, 1),
                     Precision("fp32", torch.device("cpu"), world), "eager", world=world)
    return wl, model, flat, step


def main() -> None:
    torch.set_default_dtype(torch.float64)  # Adagrad's first step amplifies float32 rounding of tiny gradients
    env = init_distributed(device="cpu")
    world, rank = dist.get_world_size(), dist.get_rank()
    runs = {s: build(s, rank, world) for s in (False, True)}
    g = torch.Generator().manual_seed(1)
    rows = torch.from_numpy(np.array_split(np.arange(GLOBAL_BATCH), world)[rank])
    batches, global_ids = [], []
    for _ in range(STEPS):
        dense = torch.randn(GLOBAL_BATCH, 13, generator=g)
        labels = torch.randint(0, 2, (GLOBAL_BATCH,), generator=g).to(torch.float32)
        sparse = [torch.randint(0, c, (GLOBAL_BATCH, h), generator=g, dtype=torch.int32)
                  for c, h in zip(CARDS, runs[True][0].dataset().bag_sizes)]
        batches.append((dense[rows], labels[rows], [s[rows] for s in sparse]))
        global_ids.append(sparse)
    start = {n: p.detach().clone() for n, p in runs[True][1].named_parameters()}
    for b in batches:
        for _, _, _, step in runs.values():
            step(b)

    dense_params = dict(runs[False][1].named_parameters())
    diff = max((p - dense_params[n]).abs().max().item() for n, p in runs[True][1].named_parameters())
    moved = max((p - start[n]).abs().max().item() for n, p in runs[True][1].named_parameters())

    # memory accounting on one more forward/backward of the sparse model (before its optimizer consumes it)
    wl, model, flat, _ = runs[True]
    flat.zero_grad()
    wl.loss(wl.forward(model, batches[0]), batches[0]).backward()
    outside = {id(p) for p in flat.outside}
    tables = []
    for name, p in model.named_parameters():
        if id(p) not in outside:
            continue
        grad = p.grad
        assert grad is not None and grad.is_sparse, name
        c = grad.coalesce()
        k = int(name.split(".")[-2])  # sparse_arch.{bags,sharded}.<feature>.weight
        tables.append({"name": name, "rows": p.shape[0], "nnz": int(c._nnz()),
                       "distinct_ids": len(set(global_ids[0][k].reshape(-1).tolist())),
                       "grad_elems": int(c.values().numel()), "table_elems": p.numel()})
    result = {"rank": rank, "world": world, "diff": diff, "moved": moved, "tables": tables,
              "flat_numel": flat.numel, "dense_flat_numel": runs[False][2].numel,
              "outside_numel": sum(p.numel() for p in flat.outside),
              "state_numel": runs[True][3].optimizer.state_numel(),
              "dense_state_numel": runs[False][3].optimizer.state_numel()}
    results: list[object] = [None] * world
    dist.all_gather_object(results, result)
    if rank == 0:
        print(json.dumps(results), flush=True)
    env.barrier()
    env.close()
    env.barrier()


if __name__ == "__main__":
    main()
