"""Per-step load imbalance of OC20's cost-balanced training partition against the plain strided one
and against the previous rule (LPT over each global batch alone).

For every step of one epoch at R ranks: max over ranks / mean over ranks of the cost (edges or
triplets) each rank processes; printed as the mean over the epoch's steps (and the worst step), for
each local batch of ``--per-rank``, on the same permutation:

* plain strided partition (baseline): each global batch dealt round-robin;
* LPT per global batch (before): each global batch split alone by greedy longest-processing-time
  (``lpt_partition``), ranks with different sample counts (the sampler's rule until 2026-11-25);
* window-balanced partition (the sampler now, ``EpochSampler(partition="balanced")``): exactly
  ``per-rank`` samples per rank-step, balanced over windows of ``--window`` steps.

Costs come from the sizes stored in a split's LMDB files, or from OC20-like synthetic sizes. Each
line is printed when it is computed; with ``--budget-s`` spent after the baseline, the rest is
skipped (said). Goal: the window-balanced partition <= 1.05 at every local batch (moonshot 1.02).

    python -m benchmarks.oc20_sampler_balance --ranks 8 --per-rank 2,8 [--data DIR/train]
"""
from __future__ import annotations

import argparse

import numpy as np

from hpcbench.common.data.sampler import BALANCE_WINDOW, EpochSampler, lpt_partition

from benchmarks.budget import Budget, add_budget_argument, say
from benchmarks.machine import describe, header

GOAL, MOONSHOT = 1.05, 1.02


def step_loads(costs: np.ndarray, ranks: int, per_rank: int, rule: str, seed: int, window: int) -> np.ndarray:
    """[steps, ranks] summed cost of each rank's samples per step of epoch 0 under ``rule``."""
    if rule == "lpt":
        g = per_rank * ranks
        order = EpochSampler(costs.size, per_rank, 0, ranks, seed).order()
        batches = [order[i:i + g] for i in range(0, costs.size - costs.size % g, g)]
        return np.array([[costs[b[part]].sum() for part in lpt_partition(costs[b], ranks)] for b in batches])
    partition = "balanced" if rule == "window" else "strided"
    samplers = [EpochSampler(costs.size, per_rank, r, ranks, seed, partition, costs=costs, window=window)
                for r in range(ranks)]
    return np.array([[costs[idx].sum() for idx in step] for step in zip(*[s.batches() for s in samplers])])


def imbalance(loads: np.ndarray) -> tuple[float, float]:
    """(mean over steps, worst step) of max / mean over the ranks."""
    ratio = loads.max(1) / loads.mean(1)
    return float(ratio.mean()), float(ratio.max())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--per-rank", default="2,8", help="local batches (samples per rank per step), comma-separated")
    ap.add_argument("--window", type=int, default=BALANCE_WINDOW, help="steps per balancing window")
    ap.add_argument("--data", help="a split folder of data.NNNN.lmdb files (default: OC20-like synthetic sizes)")
    ap.add_argument("--cost", choices=["edges", "triplets"], default="edges")
    ap.add_argument("--trust-pickle", action="store_true", help="--data holds original pickled OC20 files")
    ap.add_argument("--samples", type=int, default=20_000)
    ap.add_argument("--seed", type=int, default=0)
    add_budget_argument(ap, 120.0)
    args = ap.parse_args()
    budget = Budget(args.budget_s)
    say(header(describe()))
    per_rank = [int(v) for v in args.per_rank.split(",")]
    if args.data:
        from hpcbench.workloads.opencatalyst.lmdbio import SplitDataset, shard_paths

        costs = SplitDataset(shard_paths(args.data), args.trust_pickle).sizes()[args.cost]
        source = f"{args.data} ({args.cost})"
    else:  # OC20 S2EF: ~20-225 atoms per system, ~30 edges per atom with the 50-neighbour cap
        rng = np.random.default_rng(args.seed)
        natoms = rng.integers(20, 226, args.samples)
        costs = (natoms * rng.uniform(25, 40, args.samples)).astype(np.int64)
        source = f"synthetic OC20-like sizes, {args.samples} samples"
    verdicts = []
    for b in per_rank:
        say(f"costs: {source}; {args.ranks} ranks x {b} samples per rank = global batch {args.ranks * b}, "
            f"{costs.size // (args.ranks * b)} steps; window {args.window} steps")
        for name, rule in (("plain strided partition (baseline)", "strided"), ("LPT per global batch (before)", "lpt"),
                           ("window-balanced partition (now)", "window")):
            if rule != "strided" and budget.spent():
                budget.skip(f"{name} at {b} per rank")
                continue
            mean, worst = imbalance(step_loads(costs, args.ranks, b, rule, args.seed, args.window))
            say(f"  {name:36s}: max/mean {args.cost} per rank per step = {mean:.3f} (worst step {worst:.3f})")
            if rule == "window":
                verdicts.append(f"{b} per rank: {mean:.3f} -> goal <= {GOAL}: {'met' if mean <= GOAL else 'MISSED'}; "
                                f"moonshot <= {MOONSHOT}: {'met' if mean <= MOONSHOT else 'missed'}")
    say("window-balanced partition, goal <= 1.05 (moonshot 1.02), mean over the epoch's steps:")
    for v in verdicts:
        say(f"  {v}")
    budget.done()


if __name__ == "__main__":
    main()
