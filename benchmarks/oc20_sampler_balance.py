"""Per-step load imbalance of the edge-balanced LPT partition vs the plain strided one.

For every step of one epoch at R ranks: max over ranks / mean over ranks of the edges (or triplets)
each rank processes; printed as the mean over the epoch's steps, for both partitions of
``hpcbench.common.data.sampler.EpochSampler`` on the same global batches. Costs come from the sizes stored in
a split's LMDB files, or from OC20-like synthetic sizes. Each partition's line is printed when it is
computed; with ``--budget-s`` spent after the baseline, the balanced partition is skipped (said).

    python -m benchmarks.oc20_sampler_balance --ranks 8 --global-batch 64 [--data DIR/train]
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from hpcbench.common.data.sampler import EpochSampler

from benchmarks.budget import Budget, add_budget_argument, say
from benchmarks.machine import describe, header


def imbalance(costs: np.ndarray, ranks: int, global_batch: int, balanced: bool, seed: int) -> tuple[float, float]:
    partition = "balanced" if balanced else "strided"
    samplers = [EpochSampler(costs.size, global_batch // ranks, r, ranks, seed, partition, costs=costs)
                for r in range(ranks)]
    loads = np.array([[costs[idx].sum() for idx in step] for step in zip(*[s.batches() for s in samplers])])
    ratio = loads.max(1) / loads.mean(1)
    return float(ratio.mean()), float(ratio.max())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--global-batch", type=int, default=64)
    ap.add_argument("--data", help="a split folder of data.NNNN.lmdb files (default: OC20-like synthetic sizes)")
    ap.add_argument("--cost", choices=["edges", "triplets"], default="edges")
    ap.add_argument("--trust-pickle", action="store_true", help="--data holds original pickled OC20 files")
    ap.add_argument("--samples", type=int, default=20_000)
    ap.add_argument("--seed", type=int, default=0)
    add_budget_argument(ap, 120.0)
    args = ap.parse_args()
    budget = Budget(args.budget_s)
    say(header(describe()))
    if args.global_batch % args.ranks:
        ap.error(f"--global-batch {args.global_batch} does not split over {args.ranks} ranks")
    if args.data:
        from hpcbench.workloads.opencatalyst.lmdbio import SplitDataset, shard_paths

        costs = SplitDataset(shard_paths(args.data), args.trust_pickle).sizes()[args.cost]
        source = f"{args.data} ({args.cost})"
    else:  # OC20 S2EF: ~20-225 atoms per system, ~30 edges per atom with the 50-neighbour cap
        rng = np.random.default_rng(args.seed)
        natoms = rng.integers(20, 226, args.samples)
        costs = (natoms * rng.uniform(25, 40, args.samples)).astype(np.int64)
        source = f"synthetic OC20-like sizes, {args.samples} samples"
    say(f"costs: {source}; {args.ranks} ranks, global batch {args.global_batch}, "
          f"{costs.size // args.global_batch} steps")
    for name, balanced in (("plain strided partition (baseline)", False), ("edge-balanced LPT partition", True)):
        if balanced and budget.spent():
            budget.skip(name)
            continue
        mean, worst = imbalance(costs, args.ranks, args.global_batch, balanced, args.seed)
        say(f"{name:34s}: max/mean edges per rank per step = {mean:.3f} (worst step {worst:.3f})")
    say("goal for the balanced partition: <= 1.05")
    budget.done()


if __name__ == "__main__":
    main()
