"""Run under mpiexec: hybrid-parallel DLRM-DCNv2 (sharded large tables, replicated small ones) vs the
single-rank model with the same weights on the whole batch: outputs, gradients, one Adagrad step and
the outputs after it; plus the distributed exact AUROC vs the single-rank one.

Argument: ``sparse`` or ``dense`` (embedding gradients). Rank 0 prints one JSON line: a list with one result per rank.
"""
from __future__ import annotations

import json
import sys

import numpy as np
import torch
import torch.distributed as dist

from hpcbench.common.dist import init_distributed
from hpcbench.common.parallel import Parallel
from hpcbench.workloads.mlperf_training.dlrm_dcnv2.auroc import auroc, distributed_auroc
from hpcbench.workloads.mlperf_training.dlrm_dcnv2.hybrid import (ShardingPlan, data_parallel_parameters, model_parallel_parameters,
                                               parallelize)
from hpcbench.workloads.mlperf_training.dlrm_dcnv2.model import DLRMDCNv2, ModelConfig

GLOBAL_BATCH = 13  # split unevenly over 2 and 4 ranks


def adagrad(params: list[torch.nn.Parameter]) -> torch.optim.Adagrad:
    # the closed-division values: lr_decay 0, weight_decay 0, initial accumulator 0, eps 1e-8
    return torch.optim.Adagrad(params, lr=0.1, lr_decay=0, weight_decay=0, initial_accumulator_value=0, eps=1e-8,
                               foreach=False)


def dense_grad(p: torch.Tensor) -> torch.Tensor:
    g = p.grad
    assert g is not None
    return g.coalesce().to_dense() if g.is_sparse else g


def main() -> None:
    sparse_grads = sys.argv[1] == "sparse"
    # float64: Adagrad's first step is lr * g / (|g| + 1e-8), which turns float32 rounding of tiny
    # gradients into visible weight differences; in float64 the comparison can be tight
    torch.set_default_dtype(torch.float64)
    env = init_distributed(device="cpu")
    world, rank = dist.get_world_size(), dist.get_rank()
    cfg = ModelConfig(cardinalities=(1000, 7, 500, 3, 2000, 50), bag_sizes=(3, 1, 2, 1, 4, 2), embedding_dim=8,
                      bottom_mlp=(16, 8), top_mlp=(32, 16, 1), dcn_layers=2, dcn_low_rank=4, sparse_grads=sparse_grads)
    torch.manual_seed(0)
    ref = DLRMDCNv2(cfg)
    torch.manual_seed(0)
    model = parallelize(DLRMDCNv2(cfg), ShardingPlan.build(cfg.cardinalities, world, min_rows=100), rank)
    plan = model.sparse_arch.plan

    g = torch.Generator().manual_seed(1)
    dense = torch.randn(GLOBAL_BATCH, 13, generator=g)
    sparse = [torch.randint(0, c, (GLOBAL_BATCH, h), generator=g, dtype=torch.int32)
              for c, h in zip(cfg.cardinalities, cfg.bag_sizes)]
    labels = torch.randint(0, 2, (GLOBAL_BATCH,), generator=g).to(torch.float64)
    rows = torch.from_numpy(np.array_split(np.arange(GLOBAL_BATCH), world)[rank])
    bce = torch.nn.functional.binary_cross_entropy_with_logits

    def step(m: torch.nn.Module, local: bool) -> torch.Tensor:
        if local:  # this rank's samples; the loss is the sum over them / the global batch (global mean)
            out = m(dense[rows], [s[rows] for s in sparse])
            (bce(out, labels[rows], reduction="sum") / GLOBAL_BATCH).backward()
        else:
            out = m(dense, sparse)
            bce(out, labels).backward()
        return out.detach()

    out_ref = step(ref, local=False)
    out = step(model, local=True)
    diffs = {"forward": (out - out_ref[rows]).abs().max().item()}

    ref_params = dict(ref.named_parameters())

    def ref_name(name: str) -> str:
        return name.replace("sparse_arch.sharded.", "sparse_arch.bags.").replace("sparse_arch.replicated.",
                                                                              "sparse_arch.bags.")

    names = {id(p): n for n, p in model.named_parameters()}
    for p in data_parallel_parameters(model):  # the harness's all-reduce of data-parallel gradients
        grad = dense_grad(p).clone()
        dist.all_reduce(grad)
        p.grad = grad
    grad_diff = 0.0
    for p in model.parameters():
        grad_diff = max(grad_diff, (dense_grad(p) - dense_grad(ref_params[ref_name(names[id(p)])])).abs().max().item())
    diffs["grad"] = grad_diff

    adagrad(list(model.parameters())).step()
    adagrad(list(ref.parameters())).step()
    diffs["param_after_step"] = max((p - ref_params[ref_name(names[id(p)])]).abs().max().item()
                                    for p in model.parameters())
    moved = max((p - q).abs().max().item() for p, q in zip(ref.parameters(), fresh_model(cfg).parameters()))
    with torch.no_grad():
        out2 = model(dense[rows], [s[rows] for s in sparse])
        out2_ref = ref(dense, sparse)
    diffs["forward_after_step"] = (out2 - out2_ref[rows]).abs().max().item()

    # exact AUROC from this rank's samples vs all samples (scores rounded: ties across ranks)
    scores = torch.round(torch.sigmoid(out2_ref) * 4) / 4
    diffs["auroc"] = abs(distributed_auroc(scores[rows], labels[rows].long(), Parallel.of_default_group()) - auroc(scores, labels.long()))

    held = sum(p.numel() for p in model.parameters())
    result = {"rank": rank, "world": world, "diffs": diffs, "moved": moved, "owners": list(plan.owners),
              "sharded_here": sorted(int(k) for k in model.sparse_arch.sharded.keys()),
              "sharded_numel": sum(p.numel() for p in model_parallel_parameters(model)),
              "held": held, "full": sum(p.numel() for p in ref.parameters())}
    results: list[object] = [None] * world
    dist.all_gather_object(results, result)  # one line from rank 0: mpiexec may interleave ranks' lines
    if rank == 0:
        print(json.dumps(results), flush=True)
    # every rank done before the group goes, and none exits (rank 0 hosts the store) while others tear down
    env.barrier()
    env.close()
    env.barrier()


def fresh_model(cfg: ModelConfig) -> DLRMDCNv2:
    torch.manual_seed(0)
    return DLRMDCNv2(cfg)


if __name__ == "__main__":
    main()
