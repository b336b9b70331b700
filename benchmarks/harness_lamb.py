"""DistributedLAMB vs LAMB: step time and per-rank optimizer-state memory, under mpiexec.

A flat model of ``--params`` parameters (default ~50M, in tensors of mixed sizes) lives in one
FlatParams buffer per rank. Each timed step starts from fresh per-rank gradients and includes the
instance's communication:

* baseline ``LAMB``: all-reduce of the whole flat gradient, then the full LAMB update on every rank;
* ``DistributedLAMB``: reduce-scatter of the gradient, LAMB update of this rank's 1/N shard (one
  all-reduce of per-tensor partial norms), all-gather of the updated parameters.

Steps alternate between the two (interleaved, so contention hits both); medians are compared. Rank 0
prints each step pair as it runs; ``--budget-s`` stops the steps (rank 0 decides for all ranks) when
the time left cannot hold another pair, and says so.

    mpiexec -n 4 python -m benchmarks.harness_lamb [--params 50e6] [--steps 5]
"""
from __future__ import annotations

import argparse
import statistics
import time


import torch
import torch.distributed as dist
from torch import nn

from hpcbench.common.dist import init_distributed
from hpcbench.common.flat import FlatParams
from hpcbench.common.optim import LAMB, DistributedLAMB
from hpcbench.common.runconfig import OptimConfig

from benchmarks.budget import Budget, add_budget_argument, say
from benchmarks.machine import describe, header


class FlatModel(nn.Module):
    """Parameters only: matrices of 1M..4M elements plus small bias/norm vectors."""

    def __init__(self, total: int) -> None:
        super().__init__()
        sizes, n, i = [], 0, 0
        while n < total:
            big = min((1 + i % 4) * 1_000_000, total - n)
            sizes += [big, min(1024, max(1, total - n - big))]
            n += sum(sizes[-2:])
            i += 1
        self.ps = nn.ParameterList(nn.Parameter(torch.randn(s) * 0.02) for s in sizes if s > 0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", type=float, default=50e6)
    ap.add_argument("--steps", type=int, default=5, help="timed interleaved steps of each (at most)")
    add_budget_argument(ap, 120.0)
    args = ap.parse_args()
    budget = Budget(args.budget_s)
    env = init_distributed()
    world, rank = env.layout.instance_size, env.layout.instance_rank
    if rank == 0:
        say(header(describe()))
    cfg = OptimConfig(name="lamb", lr=1e-3, weight_decay=0.01, max_grad_norm=1.0)
    torch.manual_seed(0)
    flat = FlatParams(FlatModel(int(args.params)))
    opts = {"LAMB": LAMB(flat, cfg, world, rank), "DistributedLAMB": DistributedLAMB(flat, cfg, world, rank)}
    grad = torch.randn(flat.size, generator=torch.Generator().manual_seed(rank)) * 1e-3
    lr = torch.tensor(cfg.lr)
    times: dict[str, list[float]] = {k: [] for k in opts}
    if rank == 0:
        say(f"{world} ranks, {flat.numel / 1e6:.1f}M parameters; up to {args.steps} timed steps each (+1 warm-up)")
    pair_s = 0.0
    for step in range(args.steps + 1):
        if budget.stop_together(step, args.steps, pair_s, rank):
            break
        for name, opt in opts.items():
            flat.grads.copy_(grad)
            dist.barrier()
            t0 = time.perf_counter()
            opt.step(lr)
            dist.barrier()
            if step:  # step 0 warms up allocator and gloo buffers
                times[name].append(time.perf_counter() - t0)
        pair = [times[k][-1] if step else 0.0 for k in opts]
        pair_s = sum(pair) if step == 1 else min(pair_s, sum(pair))
        if rank == 0 and step:
            say(f"  step {step}: " + ", ".join(f"{k} {1000 * t:.1f} ms" for k, t in zip(opts, pair)))
    med = {k: statistics.median(v) for k, v in times.items()}
    state = {k: o.state_numel() * 4 for k, o in opts.items()}
    rows = env.instance_comm.gather((rank, state), root=0)
    if rank == 0:
        print(f"{world} ranks, {flat.numel / 1e6:.1f}M parameters in {flat.num_tensors} tensors, "
              f"torch threads/rank={torch.get_num_threads()}, {len(times['LAMB'])} interleaved steps each (median)")
        for name in opts:
            print(f"{name:16s}: {med[name] * 1000:8.1f} ms/step, optimizer state {state[name] / 2**20:7.1f} MiB/rank")
        print(f"step time ratio DistributedLAMB/LAMB = {med['DistributedLAMB'] / med['LAMB']:.3f}")
        print(f"state memory ratio DistributedLAMB/LAMB = {state['DistributedLAMB'] / state['LAMB']:.3f} "
              f"(ideal 1/{world} = {1 / world:.3f}); per rank: "
              + ", ".join(f"r{r}={s['DistributedLAMB'] / 2**20:.1f} MiB" for r, s in sorted(rows)), flush=True)
        budget.done()
    env.close()


if __name__ == "__main__":
    main()
