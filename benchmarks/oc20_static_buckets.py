"""Padding overhead of OC20's static-shape buckets (``data.static_shapes``, opencatalyst/static.py).

Per-sample sizes (atoms, edges, triplets) come from the synthetic generator (``hpcbench datagen oc20``:
its default graphs, 6 A / 50 neighbours, and the mini preset's, 4 A / 12 neighbours), from OC20-like
sizes (20-225 atoms, 25-40 edges per atom, as ``oc20_sampler_balance.py`` draws them; triplets ~ edges x
(edges per atom - 1)), or from a split's stored ``"sizes"`` (``--data DIR/train``). Batches are the ones
the workload's sampler forms on rank 0 (``EpochSampler``, edge-balanced LPT over ``--ranks``). The
buckets are chosen exactly as the workload chooses them (the sampler's first epochs, at least
``SIMULATED_BATCHES`` batches), then measured on *later* epochs the choice did not see: padded minus
real over real per dimension, the distinct shapes, and the batches that fell beyond the largest bucket.

    python -m benchmarks.oc20_static_buckets --batches 4,16 --buckets 2,4,8,0 --ranks 4
"""
from __future__ import annotations

import argparse
import math
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from hpcbench.common.data.sampler import EpochSampler
from hpcbench.workloads.opencatalyst import datagen, lmdbio, static
from hpcbench.workloads.opencatalyst.workload import SIMULATED_BATCHES

from benchmarks.budget import Budget, add_budget_argument, say
from benchmarks.machine import describe, header

GOAL = 0.10  # padding <= 10% of the real work in every dimension


def _sizes_of(args: tuple[datagen.GenSpec, int]) -> tuple[int, int, int]:
    spec, k = args
    return lmdbio.sample_sizes(datagen.make_sample(spec, 0, "train", k))


def generated(spec: datagen.GenSpec, count: int, workers: int) -> np.ndarray:
    with ProcessPoolExecutor(workers) as pool:
        return np.asarray(list(pool.map(_sizes_of, [(spec, k) for k in range(count)], chunksize=8)), np.int64)


def oc20_like(count: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    natoms = rng.integers(20, 226, count)
    per_atom = rng.uniform(25, 40, count)
    edges = (natoms * per_atom).astype(np.int64)
    triplets = (edges * (per_atom - 1) * rng.uniform(0.9, 1.0, count)).astype(np.int64)
    return np.stack([natoms, edges, triplets], axis=1)


def measure(sizes: np.ndarray, batch: int, ranks: int, per_dim: int, seed: int) -> dict[str, float]:
    sampler = EpochSampler(len(sizes), batch, 0, ranks, seed, "balanced", costs=sizes[:, 1].astype(np.float64))
    epochs = max(1, math.ceil(SIMULATED_BATCHES / max(1, len(sampler))))
    chosen_on = static.sampler_totals(sampler, sizes, 0, epochs)
    buckets = static.choose_buckets(chosen_on, per_dim)
    later = static.sampler_totals(sampler, sizes, epochs, max(2, epochs // 2))
    out = static.padding_overhead(later, buckets)
    top = (buckets.atoms[-1], buckets.edges[-1], buckets.triplets[-1])
    out["beyond"] = float(sum(any(s > t for s, t in zip((r[1] + 1, r[2] + 1, r[3]), top)) for r in later))
    out["batches"] = float(len(later))
    out["buckets"] = buckets  # type: ignore[assignment]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="4,16", help="local batch sizes (NVIDIA's OC20 H100 runs: 4 and 16)")
    ap.add_argument("--buckets", default="2,4,8,0", help="bucket sizes per dimension to try (0: the workload's "
                    "default, per dimension the fewest with <= 8%% padding on the simulated epochs)")
    ap.add_argument("--ranks", type=int, default=4, help="ranks the edge-balanced partition splits over")
    ap.add_argument("--samples", type=int, default=192, help="generated samples per synthetic distribution")
    ap.add_argument("--oc20-like", type=int, default=20_000, help="OC20-like sizes drawn (0: skip)")
    ap.add_argument("--data", help="a split folder of data.NNNN.lmdb files (its stored sizes), instead")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    add_budget_argument(ap, 600.0)
    args = ap.parse_args()
    budget = Budget(args.budget_s)
    say(header(describe()))
    batches = [int(b) for b in args.batches.split(",")]
    per_dims = [int(k) for k in args.buckets.split(",")]
    dists: list[tuple[str, np.ndarray]] = []
    if args.data:
        from hpcbench.workloads.opencatalyst.lmdbio import SplitDataset, shard_paths

        s = SplitDataset(shard_paths(args.data)).sizes()
        dists.append((f"stored sizes of {args.data}", np.stack([s["natoms"], s["edges"], s["triplets"]], 1)))
    else:
        for name, spec in (("datagen default (2x2x3 slabs, 6 A, 50 neighbours)", datagen.GenSpec()),
                           ("datagen mini preset (4 A, 12 neighbours)", datagen.GenSpec(cutoff=4.0, max_neighbors=12))):
            if budget.spent():
                budget.skip(name)
                continue
            dists.append((f"{name}, {args.samples} samples", generated(spec, args.samples, args.workers)))
        if args.oc20_like:
            dists.append((f"OC20-like sizes, {args.oc20_like} samples", oc20_like(args.oc20_like, args.seed)))
    met = True
    for name, sizes in dists:
        mean = sizes.mean(0)
        say(f"## {name}: per sample mean atoms {mean[0]:.1f}, edges {mean[1]:.0f} (min {sizes[:, 1].min()}, max "
            f"{sizes[:, 1].max()}), triplets {mean[2]:.0f} (min {sizes[:, 2].min()}, max {sizes[:, 2].max()})")
        for b in batches:
            for k in per_dims:
                if budget.spent():
                    budget.skip(f"batch {b}, {k} buckets")
                    continue
                r = measure(sizes, b, args.ranks, k, args.seed)
                worst = max(r["atoms"], r["edges"], r["triplets"])
                bk = r["buckets"]
                mark = "ok" if worst <= GOAL else "over"
                if k == 0:  # the default data.shape_buckets
                    met &= worst <= GOAL
                what = f"{k}/dim" if k else f"auto {len(bk.atoms)},{len(bk.edges)},{len(bk.triplets)}"
                say(f"  local batch {b:2d}, {what:15s}: padding atoms {100 * r['atoms']:5.1f}%  edges "
                    f"{100 * r['edges']:5.1f}%  triplets {100 * r['triplets']:5.1f}%  [{mark}]  shapes used "
                    f"{int(r['shapes'])}, {int(r['beyond'])}/{int(r['batches'])} batches beyond the largest;  triplets "
                    f"{list(bk.triplets)}")
    say(f"goal: padding <= {100 * GOAL:.0f}% of the real atoms, edges and triplets with the default shape choice "
        f"(data.shape_buckets = 0), on epochs the choice did not see: {'met' if met else 'MISSED'}")
    budget.done()


if __name__ == "__main__":
    main()
