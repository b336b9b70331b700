"""3D U-Net spatial parallelism: step time and memory per rank on 1, 2 and 4 ranks at one global volume.

One sample of ``--size`` cubed voxels (default 64^3) through a UNet3D of ``--channels`` (default
8,16,32,64), forward + Dice/cross-entropy loss + backward (no optimizer: the gradient all-reduce is the
data-parallel part, the same at every S):

* ``1 rank``: the plain single-device model on the whole volume (the baseline);
* ``S = 2, 4``: :func:`mlperf_training.unet3d.spatial.spatial_parallel` with each rank a slab of
  ``size / S`` rows along depth, halos overlapped with the slab's convolution (``depth``); the same
  with the halos waited for before computing (``depth_naive``); and slabs along width (``width``:
  torch's CPU convolution picks its kernel from N x C x D x H, which a depth split shrinks and a
  width split does not). The three are interleaved step by step in one job.

Per rank: the median step time (barrier to barrier), the bytes autograd saves for backward (the
activations, counted once per storage by a saved-tensor hook: exact and noise-free) and the growth of
peak RSS over the first step (``ru_maxrss``: activations plus the step's temporaries, gradients and
allocator slack).
Ratios are against the 1-rank run of the same invocation. Each S runs as its own ``mpiexec -n S`` job
(this script launches them; ``--worker`` is that job's entry point); ``--budget-s`` bounds the whole run.

    python benchmarks/unet3d_spatial.py [--size 64] [--channels 8,16,32,64] [--steps 5] [--budget-s 300]

Every rank runs one torch thread (a rank stands for one device). On a 2-core machine 4 ranks
oversubscribe the cores: the S = 4 times measure contention as much as scaling; the memory per rank
is the figure that carries over to one accelerator per rank.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from budget import Budget, add_budget_argument, say  # noqa: E402 - sibling benchmark module
from machine import describe, header  # noqa: E402 - sibling benchmark module


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def worker(args: argparse.Namespace) -> None:
    """One ``mpiexec -n S`` job: every rank prints one JSON line of its measurements."""
    import torch
    import torch.distributed as dist

    from common.dist import init_distributed
    from mlperf_training.unet3d.config import UNetModelConfig
    from mlperf_training.unet3d.model import UNet3D, divisor
    from mlperf_training.unet3d.spatial import dice_ce_loss, new_spatial_groups, spatial_parallel, take_slab

    env = init_distributed(device="cpu")
    world, rank = env.layout.instance_size, env.layout.instance_rank
    cfg = UNetModelConfig(channels=tuple(int(c) for c in args.channels.split(",")))
    depth = new_spatial_groups(world)
    torch.manual_seed(0)
    x = torch.randn(1, 1, args.size, args.size, args.size)
    y = (torch.rand(1, 1, args.size, args.size, args.size) * 3).long()
    multiple = divisor(cfg)
    # name -> (model, input slab, label slab, group); slabs cloned so they are not views of the volume
    variants: dict[str, tuple[Any, Any, Any, Any]] = {}
    for name, sg, overlap in (("depth", depth, True), ("depth_naive", depth, False),
                              ("width", dataclasses.replace(depth, axis=4), True)):
        if world == 1 and name != "depth":
            continue  # one rank: the plain model, no axis
        variants[name] = (spatial_parallel(UNet3D(cfg), sg, overlap=overlap),
                          take_slab(x, sg, multiple).clone(), take_slab(y, sg, multiple).clone(), sg)
    del x, y

    def step(name: str, measure: dict[str, int] | None = None) -> float:
        model, xs, ys, sg = variants[name]
        model.zero_grad(set_to_none=True)
        seen: set[int] = set()

        def pack(t: torch.Tensor) -> torch.Tensor:
            if measure is not None:
                key = t.untyped_storage().data_ptr()
                if key not in seen:
                    seen.add(key)
                    measure[name] = measure.get(name, 0) + t.untyped_storage().nbytes()
            return t

        dist.barrier()
        t0 = time.perf_counter()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = dice_ce_loss(model(xs), ys, sg).sum()
        loss.backward()
        dist.barrier()
        return time.perf_counter() - t0

    base_rss = _peak_rss_bytes()
    saved: dict[str, int] = {}
    step("depth", saved)  # warm-up, and the activations it saves
    rss_growth = _peak_rss_bytes() - base_rss  # one step's peak, before any other variant ran
    for name in variants:
        if name != "depth":
            step(name, saved)
    times: dict[str, list[float]] = {k: [] for k in variants}
    round_s, deadline = 0.0, time.monotonic() + args.worker_budget_s
    for i in range(args.steps):
        stop = torch.tensor(int(i > 0 and time.monotonic() + round_s > deadline))
        dist.broadcast(stop, 0)  # rank 0's clock decides, so the ranks stop together
        if stop.item():
            break
        for name in variants:  # interleaved: contention from the rest of the machine hits each alike
            times[name].append(step(name))
        round_s = sum(t[-1] for t in times.values())
    row = {"rank": rank, "world": world, "threads": torch.get_num_threads(),
           "slabs": {k: list(v[1].shape[2:]) for k, v in variants.items()}, "steps": len(times["depth"]),
           "saved_bytes": saved, "rss_growth_bytes": rss_growth,
           "step_s": {k: statistics.median(v) for k, v in times.items()},
           "all_s": {k: [round(t, 4) for t in v] for k, v in times.items()}}
    print("ROW " + json.dumps(row), flush=True)
    env.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=64, help="global volume edge (voxels); a multiple of 4 x divisor")
    ap.add_argument("--channels", default="8,16,32,64", help="UNet3D channels per level")
    ap.add_argument("--steps", type=int, default=5, help="timed steps per variant (at most)")
    ap.add_argument("--ranks", default="1,2,4", help="spatial group sizes to run (1 first: the baseline)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--worker-budget-s", type=float, default=60.0, help=argparse.SUPPRESS)
    add_budget_argument(ap, 300.0)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    budget = Budget(args.budget_s)
    say(header(describe()))
    say(f"UNet3D channels {args.channels}, one {args.size}^3 sample, forward + Dice/CE + backward, "
        f"up to {args.steps} timed steps per variant; launched as mpiexec -n S per spatial size")
    mpiexec = Path(sys.executable).parent / "mpiexec"
    ranks = [int(r) for r in args.ranks.split(",")]
    results: dict[int, list[dict[str, Any]]] = {}
    for i, n in enumerate(ranks):
        if budget.left() < 10:
            budget.skip(f"S = {n}")
            continue
        share = budget.left() / (len(ranks) - i)
        # one torch thread per rank at every S: a rank stands for one device, and S ranks use S cores
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HPCBENCH_TORCH_THREADS": "1"}
        cmd = [str(mpiexec if mpiexec.exists() else "mpiexec"), "-n", str(n), sys.executable, __file__, "--worker",
               "--size", str(args.size), "--channels", args.channels, "--steps", str(args.steps),
               "--worker-budget-s", f"{max(5.0, share - 10):.0f}"]
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=budget.timeout(share + 60))
        except subprocess.TimeoutExpired:
            budget.skip(f"S = {n} (mpiexec job over its time)")
            continue
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
        rows = sorted((json.loads(line[4:]) for line in proc.stdout.splitlines() if line.startswith("ROW ")),
                      key=lambda r: r["rank"])
        results[n] = rows
        for r in rows:
            say(f"S={n} rank {r['rank']}: {r['threads']} thread(s), {r['steps']} steps; "
                + "; ".join(f"{k} slab {r['slabs'][k]}: step {r['step_s'][k] * 1000:.0f} ms, saved activations "
                            f"{r['saved_bytes'][k] / 2**20:.1f} MiB" for k in r["step_s"])
                + f"; peak RSS growth (depth, first step) {r['rss_growth_bytes'] / 2**20:.1f} MiB")
    if 1 not in results:
        say("no 1-rank baseline measured: no ratios")
        budget.done()
        return
    base = results[1][0]
    b_t, b_saved, b_rss = base["step_s"]["depth"], base["saved_bytes"]["depth"], base["rss_growth_bytes"]
    say(f"ratios vs 1 rank (plain model on the whole volume: step {b_t * 1000:.0f} ms, saved activations "
        f"{b_saved / 2**20:.1f} MiB, peak RSS growth {b_rss / 2**20:.1f} MiB); the slowest rank of the group counts:")
    for n, rows in results.items():
        if n == 1:
            continue
        t = {k: max(r["step_s"][k] for r in rows) for k in rows[0]["step_s"]}
        saved = {k: max(r["saved_bytes"][k] for r in rows) for k in rows[0]["saved_bytes"]}
        rss = max(r["rss_growth_bytes"] for r in rows)
        say(f"  S={n}: step time depth {t['depth'] / b_t:.2f}x, width {t['width'] / b_t:.2f}x (ideal {1 / n:.2f}x); "
            f"depth overlapped/naive {t['depth'] / t['depth_naive']:.2f}; saved activations per rank depth "
            f"{saved['depth'] / b_saved:.3f}x, width {saved['width'] / b_saved:.3f}x (ideal {1 / n:.3f}x); peak RSS "
            f"growth per rank (depth) {rss / max(1, b_rss):.3f}x")
    budget.done()


if __name__ == "__main__":
    main()
