"""DLRM-DCNv2 embeddings sharded (hybrid model parallel) vs replicated (pure data parallel), and the
sharded tables' sparse vs dense gradients: memory per rank and step time, under mpiexec.

Both models are built in the same job from the same seed: the MLPerf table sizes scaled by
``1/--scale`` (the reference's 40M-row tables become 40M/scale rows; tables smaller than that
keep their size), embedding dim 128, the real multi-hot bag sizes, and small MLPs (``--mlp small``:
bottom 13-128, one cross layer of rank 64, top 256-1) so that the embeddings dominate as they do
at full size on GPUs. One timed step is what the harness does: zero the flat gradient, forward,
BCE loss scaled to the global mean, backward, gradient sync, Adagrad on the flat buffer.

* baseline ``replicated``: every rank holds every table; the whole flat gradient (tables included,
  dense) is all-reduced;
* ``sharded``: tables with >= ``--min-rows`` rows live on one rank each (``hybrid.ShardingPlan``),
  ids and pooled embeddings cross in two all-to-alls; only the replicated part is all-reduced;
* ``sparse`` (baseline for it: ``sharded``): the same sharding, the owned tables with sparse gradients
  outside the flat buffer (``model.sparse_grads``), updated by the row-wise Adagrad
  (``hpcbench.common.sparse_optim``); gradient memory = the flat gradient + the sparse gradients' values and
  indices as autograd produced them (one row per looked-up id).

Memory per rank = parameters + gradients + Adagrad state held by the flat buffers (exact bytes),
plus each rank's resident set size after the steps. Steps alternate between the two (interleaved,
so contention hits both); medians are compared. ``--budget-s`` stops the steps (rank 0 decides).

    mpiexec -n 4 python -m benchmarks.dlrm_embeddings [--scale 400] [--batch 512] [--steps 6]
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path


import torch
import torch.distributed as dist
import torch.nn.functional as F

from hpcbench.common.dist import init_distributed
from hpcbench.common.flat import FlatParams
from hpcbench.common.optim import build_optimizer
from hpcbench.common.runconfig import OptimConfig
from hpcbench.workloads.mlperf_training.dlrm_dcnv2.criteo import CARDINALITIES, MULTI_HOT_SIZES
from hpcbench.workloads.mlperf_training.dlrm_dcnv2.hybrid import (ShardingPlan, model_parallel_parameters, parallelize,
                                               sparse_parameters, use_sparse_grads)
from hpcbench.workloads.mlperf_training.dlrm_dcnv2.model import DLRMDCNv2, ModelConfig

from benchmarks.budget import Budget, add_budget_argument, say
from benchmarks.machine import describe, header


def rss_mib() -> float:
    """This process's resident set size now (MiB), from /proc (0 where there is none)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return 0.0
    import os

    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


class Setup:
    """One model as a rank holds it, its flat buffers and optimizer, and whether it is sharded."""

    def __init__(self, cfg: ModelConfig, plan: ShardingPlan | None, rank: int, world: int,
                 sparse: bool = False) -> None:
        torch.manual_seed(0)
        model = DLRMDCNv2(cfg)
        if plan is not None:
            model = parallelize(model, plan, rank)
            if sparse:
                use_sparse_grads(model, plan, rank)
        self.model = model
        self.flat = FlatParams(model, model_parallel_parameters(model), sparse_parameters(model))
        self.opt = build_optimizer(self.flat, OptimConfig(name="adagrad", lr=0.005, eps=1e-8), world, rank)
        outside = sum(p.numel() for p in self.flat.outside)
        # params + Adagrad sum (the row-wise part's included); gradients are counted per step
        self.state_bytes = 4 * (self.flat.size + outside + self.opt.state_numel())
        self.grad_bytes = self.coalesced_bytes = 4 * self.flat.size  # measured by measure_grads

    def step(self, dense: torch.Tensor, labels: torch.Tensor, sparse: list[torch.Tensor], world: int,
             global_batch: int) -> None:
        self.flat.zero_grad()
        loss = F.binary_cross_entropy_with_logits(self.model(dense, sparse), labels, reduction="sum")
        (loss * world / global_batch).backward()
        self.flat.check_grads()
        self.opt.step(torch.tensor(0.005))

    def measure_grads(self, dense: torch.Tensor, labels: torch.Tensor, sparse: list[torch.Tensor], world: int,
                      global_batch: int) -> None:
        """Gradient bytes of one forward/backward (untimed, no update): the flat gradient plus the sparse
        ones as autograd made them (one row per looked-up id) and coalesced (one row per distinct id)."""
        self.flat.zero_grad()
        loss = F.binary_cross_entropy_with_logits(self.model(dense, sparse), labels, reduction="sum")
        (loss * world / global_batch).backward()
        grads = [p.grad for p in self.flat.outside if p.grad is not None]

        def nbytes(g: torch.Tensor) -> int:
            return g._values().numel() * g._values().element_size() + g._indices().numel() * 8

        self.grad_bytes = 4 * self.flat.size + sum(nbytes(g) for g in grads)
        self.coalesced_bytes = 4 * self.flat.size + sum(nbytes(g.coalesce()) for g in grads)
        self.flat.zero_grad()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=float, default=400.0, help="table rows = min(reference rows, 40M / scale)")
    ap.add_argument("--min-rows", type=int, default=10_000, help="tables with at least this many rows are sharded")
    ap.add_argument("--batch", type=int, default=512, help="samples per rank per step")
    ap.add_argument("--steps", type=int, default=6, help="timed interleaved steps of each (at most)")
    add_budget_argument(ap, 240.0)
    args = ap.parse_args()
    budget = Budget(args.budget_s)
    env = init_distributed()
    world, rank = env.layout.instance_size, env.layout.instance_rank
    cap = int(max(CARDINALITIES) / args.scale)
    cards = tuple(min(c, cap) for c in CARDINALITIES)
    cfg = ModelConfig(cardinalities=cards, embedding_dim=128, bottom_mlp=(128,), top_mlp=(256, 1), dcn_layers=1,
                      dcn_low_rank=64)
    plan = ShardingPlan.build(cards, world, args.min_rows)
    if rank == 0:
        say(header(describe()))
        say(f"{world} ranks x {args.batch} samples/rank; {len(cards)} tables, {sum(cards):,} rows x dim 128 "
            f"(largest {cap:,}); {sum(o is not None for o in plan.owners)} tables sharded (>= {args.min_rows:,} rows), "
            f"{len(plan.replicated)} replicated; torch threads/rank {torch.get_num_threads()}")
    base_rss = rss_mib()
    setups = {"replicated": Setup(cfg, None, rank, world), "sharded": Setup(cfg, plan, rank, world),
              "sparse": Setup(cfg, plan, rank, world, sparse=True)}
    gen = torch.Generator().manual_seed(100 + rank)
    dense = torch.rand(args.batch, 13, generator=gen) * 3
    labels = (torch.rand(args.batch, generator=gen) < 0.3).float()
    sparse = [torch.randint(0, c, (args.batch, h), generator=gen, dtype=torch.int32)
              for c, h in zip(cards, MULTI_HOT_SIZES)]
    times: dict[str, list[float]] = {k: [] for k in setups}
    pair_s = 0.0
    for step in range(args.steps + 1):
        if budget.stop_together(step, args.steps, pair_s, rank):
            break
        for name, s in setups.items():
            dist.barrier()
            t0 = time.perf_counter()
            s.step(dense, labels, sparse, world, args.batch * world)
            dist.barrier()
            if step:  # step 0 warms up the allocator and gloo buffers
                times[name].append(time.perf_counter() - t0)
        pair = [times[k][-1] if step else 0.0 for k in setups]
        pair_s = sum(pair) if step == 1 else min(pair_s, sum(pair))
        if rank == 0 and step:
            say(f"  step {step}: " + ", ".join(f"{k} {1000 * t:.1f} ms" for k, t in zip(setups, pair)))
    med = {k: statistics.median(v) for k, v in times.items() if v}
    for s in setups.values():
        s.measure_grads(dense, labels, sparse, world, args.batch * world)
    mem = {k: (s.state_bytes + s.grad_bytes) / 2**20 for k, s in setups.items()}
    grads = {k: s.grad_bytes / 2**20 for k, s in setups.items()}
    grads["sparse, coalesced"] = setups["sparse"].coalesced_bytes / 2**20
    rows = env.instance_comm.gather((rank, mem, rss_mib() - base_rss, grads), root=0)
    if rank == 0 and len(med) == len(setups):
        n = len(times["replicated"])
        for name in setups:
            per_rank = ", ".join(f"r{r}={m[name]:.0f}" for r, m, _, _ in sorted(rows))
            say(f"{name:10s}: {med[name] * 1000:8.1f} ms/step (median of {n}); model state MiB/rank: {per_rank}")
        worst = {k: max(m[k] for _, m, _, _ in rows) for k in setups}
        say(f"memory ratio sharded/replicated (largest rank) = {worst['sharded'] / worst['replicated']:.3f} "
            f"(the replicated part and the MLPs stay on every rank; tables alone would give 1/{world})")
        say(f"step time ratio sharded/replicated = {med['sharded'] / med['replicated']:.3f}")
        kinds = ("sharded", "sparse", "sparse, coalesced")
        say("gradient MiB/rank (one step): " + "; ".join(
            f"{k} " + ", ".join(f"r{r}={g[k]:.1f}" for r, _, _, g in sorted(rows)) for k in kinds))
        gw = {k: max(g[k] for _, _, _, g in rows) for k in kinds}
        say(f"gradient memory ratio sparse/sharded-dense (largest rank) = {gw['sparse'] / gw['sharded']:.3f} as "
            f"autograd makes it, {gw['sparse, coalesced'] / gw['sharded']:.3f} coalesced; model state ratio = "
            f"{worst['sparse'] / worst['sharded']:.3f} (tables here: 40M/scale rows; a sparse gradient grows with "
            f"the ids looked up, the dense one with the rows)")
        say(f"step time ratio sparse/sharded-dense = {med['sparse'] / med['sharded']:.3f}")
        say("resident memory added by the three models, per rank (MiB): "
            + ", ".join(f"r{r}={d:.0f}" for r, _, d, _ in sorted(rows)))
    if rank == 0:
        budget.done()
    env.close()


if __name__ == "__main__":
    main()
