"""Per-step load imbalance of the edge-balanced LPT sampler vs a plain strided distributed sampler.

For every step of one epoch at R ranks: max over ranks / mean over ranks of the edges (or triplets)
each rank processes; printed as the mean over the epoch's steps, for both samplers on the same
global batches. Costs come from a split's metadata.npz, or from OC20-like synthetic sizes.

    python benchmarks/oc20_sampler_balance.py --ranks 8 --global-batch 64 [--data DIR/train]
"""
from __future__ import annotations

import argparse

import numpy as np

from opencatalyst.sampler import BalancedBatchSampler


def imbalance(costs: np.ndarray, ranks: int, global_batch: int, balanced: bool, seed: int) -> tuple[float, float]:
    samplers = [BalancedBatchSampler(costs, global_batch, r, ranks, seed, balanced=balanced) for r in range(ranks)]
    loads = np.array([[costs[idx].sum() for idx in step] for step in zip(*[list(s) for s in samplers])])
    ratio = loads.max(1) / loads.mean(1)
    return float(ratio.mean()), float(ratio.max())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--global-batch", type=int, default=64)
    ap.add_argument("--data", help="a split folder with metadata.npz (default: OC20-like synthetic sizes)")
    ap.add_argument("--cost", choices=["neighbors", "triplets"], default="neighbors")
    ap.add_argument("--samples", type=int, default=20_000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.data:
        from pathlib import Path

        with np.load(Path(args.data) / "metadata.npz") as z:
            costs = z[args.cost]
        source = f"{args.data}/metadata.npz ({args.cost})"
    else:  # OC20 S2EF: ~20-225 atoms per system, ~30 edges per atom with the 50-neighbour cap
        rng = np.random.default_rng(args.seed)
        natoms = rng.integers(20, 226, args.samples)
        costs = (natoms * rng.uniform(25, 40, args.samples)).astype(np.int64)
        source = f"synthetic OC20-like sizes, {args.samples} samples"
    print(f"costs: {source}; {args.ranks} ranks, global batch {args.global_batch}, "
          f"{costs.size // args.global_batch} steps")
    for name, balanced in (("plain strided sampler (baseline)", False), ("edge-balanced LPT sampler", True)):
        mean, worst = imbalance(costs, args.ranks, args.global_batch, balanced, args.seed)
        print(f"{name:34s}: max/mean edges per rank per step = {mean:.3f} (worst step {worst:.3f})")
    print("goal for the balanced sampler: <= 1.05")


if __name__ == "__main__":
    main()
