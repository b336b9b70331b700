"""3D U-Net spatial parallelism: step time and memory per rank on 1, 2 and 4 ranks at one global volume.

One sample of ``--size`` cubed voxels (default 64^3) through a UNet3D of ``--channels`` (default
8,16,32,64), forward + Dice/cross-entropy loss + backward (no optimizer: the gradient all-reduce is the
data-parallel part, the same at every S):

* ``1 rank``: the plain single-device model on the whole volume (the baseline);
* ``S = 2, 4``: :func:`hpcbench.workloads.mlperf_training.unet3d.spatial.spatial_parallel` with each rank a slab of
  ``size / S`` rows along depth, halos overlapped with the slab's convolution (``depth``); the same
  with the halos waited for before computing (``depth_naive``); and slabs along width (``width``:
  torch's CPU convolution picks its kernel from N x C x D x H, which a depth split shrinks and a
  width split does not); and the plain model on the whole volume on rank 0 while the other ranks
  wait (``single``: the time baseline taken under the same load); and the plain model on one rank's
  slab without any communication (``depth_local``, ``width_local``: wrong maths, the same kernels
  and shapes: what spatial parallelism itself adds is spatial/local). All are interleaved step by
  step in one job, since other work on a shared machine changes speed from one job to the next.

Per rank: the median step time (barrier to barrier), the bytes autograd saves for backward (the
activations, counted once per storage by a saved-tensor hook: exact and noise-free) and how far the
peak RSS rose above the RSS at the start of a step after the warm-up (``/proc/self/status`` VmHWM,
reset per variant through ``/proc/self/clear_refs`` after glibc's ``malloc_trim``: activations plus
the step's temporaries and gradients, not the one-time kernel caches; not measured where the reset
is refused).
Memory ratios are against the 1-rank job of the same invocation; time ratios against the ``single``
step of the same job (and, for reference, the 1-rank job). Each S runs as its own ``mpiexec -n S`` job
(this script launches them; ``--worker`` is that job's entry point); ``--budget-s`` bounds the whole run.

    python -m benchmarks.unet3d_spatial [--size 64] [--channels 8,16,32,64] [--steps 5] [--budget-s 300]

Every rank runs one torch thread (a rank stands for one device). On a 2-core machine 4 ranks
oversubscribe the cores: the S = 4 times measure contention as much as scaling; the memory per rank
is the figure that carries over to one accelerator per rank.
"""
from __future__ import annotations

import argparse
import ctypes
import dataclasses
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
from benchmarks.budget import Budget, add_budget_argument, mpiexec, one_thread_rank_env, say
from benchmarks.machine import describe, header


def _rss() -> tuple[int, int]:
    """(peak, current) resident bytes of this process (Linux /proc: VmHWM, VmRSS)."""
    status = Path("/proc/self/status").read_text()
    kib = {k: int(re.search(rf"{k}:\s+(\d+)", status).group(1)) for k in ("VmHWM", "VmRSS")}  # type: ignore[union-attr]
    return kib["VmHWM"] * 1024, kib["VmRSS"] * 1024


def _reset_peak_rss() -> bool:
    """Hand freed heap memory back (glibc ``malloc_trim``, so a variant does not run in pages an earlier
    one left resident), then restart the peak-RSS count (Linux >= 4.0); False where not allowed."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def worker(args: argparse.Namespace) -> None:
    """One ``mpiexec -n S`` job: every rank prints one JSON line of its measurements."""
    import torch
    import torch.distributed as dist

    from hpcbench.common.dist import init_distributed
    from hpcbench.workloads.mlperf_training.unet3d.config import UNetModelConfig
    from hpcbench.workloads.mlperf_training.unet3d.model import UNet3D, divisor
    from hpcbench.workloads.mlperf_training.unet3d.spatial import dice_ce_loss, new_spatial_groups, spatial_parallel, take_slab

    env = init_distributed(device="cpu")
    world, rank = env.layout.instance_size, env.layout.instance_rank
    cfg = UNetModelConfig(channels=tuple(int(c) for c in args.channels.split(",")))
    depth = new_spatial_groups(world)
    torch.manual_seed(0)
    x = torch.randn(args.batch, 1, args.size, args.size, args.size)
    y = (torch.rand(args.batch, 1, args.size, args.size, args.size) * 3).long()
    multiple = divisor(cfg)
    # name -> (model, input slab, label slab, group); slabs cloned so they are not views of the volume
    variants: dict[str, tuple[Any, Any, Any, Any]] = {}
    for name, sg, overlap in (("depth", depth, True), ("depth_naive", depth, False),
                              ("width", dataclasses.replace(depth, axis=4), True)):
        if world == 1 and name != "depth":
            continue  # one rank: the plain model, no axis
        variants[name] = (spatial_parallel(UNet3D(cfg), sg, overlap=overlap),
                          take_slab(x, sg, multiple).clone(), take_slab(y, sg, multiple).clone(), sg)
    if world > 1:
        alone = dataclasses.replace(depth, group=None, size=1, index=0)
        for name, axis in (("depth_local", 2), ("width_local", 4)):  # the slab's compute, no communication
            sg = dataclasses.replace(depth, axis=axis)
            variants[name] = (UNet3D(cfg), take_slab(x, sg, multiple).clone(), take_slab(y, sg, multiple).clone(), alone)
        # the 1-rank step inside this job, on rank 0 while the others wait: the time baseline
        variants["single"] = (UNet3D(cfg), x, y, alone)
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
        if name != "single" or rank == 0:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                loss = dice_ce_loss(model(xs), ys, sg).sum()
            loss.backward()
        dist.barrier()
        return time.perf_counter() - t0

    saved: dict[str, int] = {}
    rss_growth: dict[str, int] = {}
    for name in variants:  # warm-up of each (kernel choices, caches), counting the activations it saves
        step(name, saved)
    for name in variants:  # then each one's step: its peak RSS over its start (activations and temporaries)
        if _reset_peak_rss():
            start = _rss()[1]
            step(name)
            rss_growth[name] = _rss()[0] - start
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
    ap.add_argument("--batch", type=int, default=1, help="samples per step (the same volume size each)")
    ap.add_argument("--steps", type=int, default=5, help="timed steps per variant (at most)")
    ap.add_argument("--ranks", default="1,2,4", help="spatial group sizes to run (1 first: the baseline)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--worker-budget-s", type=float, default=60.0, help=argparse.SUPPRESS)
    add_budget_argument(ap, 300.0)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    budget = Budget(args.budget_s)
    import torch

    torch.set_num_threads(1)  # the header names the ranks' thread count (HPCBENCH_TORCH_THREADS=1 below)
    say(header(describe()))
    say(f"UNet3D channels {args.channels}, {args.batch} sample(s) of {args.size}^3, forward + Dice/CE + backward, "
        f"up to {args.steps} timed steps per variant; launched as mpiexec -n S per spatial size")
    ranks = [int(r) for r in args.ranks.split(",")]
    results: dict[int, list[dict[str, Any]]] = {}
    for i, n in enumerate(ranks):
        if budget.left() < 10:
            budget.skip(f"S = {n}")
            continue
        share = budget.left() / (len(ranks) - i)
        # one torch thread per rank at every S: a rank stands for one device, and S ranks use S cores
        env = one_thread_rank_env()
        cmd = [mpiexec(), "-n", str(n), sys.executable, "-m", "benchmarks.unet3d_spatial", "--worker",
               "--size", str(args.size), "--batch", str(args.batch), "--channels", args.channels, "--steps", str(args.steps),
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
                            f"{r['saved_bytes'].get(k, 0) / 2**20:.1f} MiB, peak RSS growth "
                            + (f"{r['rss_growth_bytes'][k] / 2**20:.1f} MiB" if k in r["rss_growth_bytes"] else "-")
                            for k in r["step_s"] if k != "single" or r["rank"] == 0))
    if 1 not in results:
        say("no 1-rank baseline measured: no ratios")
        budget.done()
        return
    base = results[1][0]
    b_t, b_saved, b_rss = base["step_s"]["depth"], base["saved_bytes"]["depth"], base["rss_growth_bytes"]["depth"]
    say(f"ratios vs 1 rank (plain model on the whole volume: step {b_t * 1000:.0f} ms, saved activations "
        f"{b_saved / 2**20:.1f} MiB, peak RSS growth {b_rss / 2**20:.1f} MiB); the slowest rank of the group counts:")
    for n, rows in results.items():
        if n == 1:
            continue
        t = {k: max(r["step_s"][k] for r in rows) for k in rows[0]["step_s"]}
        single = rows[0]["step_s"]["single"]  # rank 0's plain step in the same job, interleaved with the others
        saved = {k: max(r["saved_bytes"][k] for r in rows) for k in ("depth", "width")}
        rss = {k: max(r["rss_growth_bytes"][k] for r in rows) for k in rows[0]["rss_growth_bytes"] if k != "single"}
        say(f"  S={n}: step time vs the 1-rank step interleaved in the same job ({single * 1000:.0f} ms): depth "
            f"{t['depth'] / single:.2f}x, width {t['width'] / single:.2f}x (ideal {1 / n:.2f}x); vs the 1-rank job: depth "
            f"{t['depth'] / b_t:.2f}x, width {t['width'] / b_t:.2f}x; "
            f"depth overlapped/naive {t['depth'] / t['depth_naive']:.2f}; spatial/local (the plain model on one "
            f"slab, no communication) depth {t['depth'] / t['depth_local']:.2f}, width {t['width'] / t['width_local']:.2f}; "
            f"saved activations per rank depth "
            f"{saved['depth'] / b_saved:.3f}x, width {saved['width'] / b_saved:.3f}x (ideal {1 / n:.3f}x); peak RSS "
            "growth per rank " + ", ".join(f"{k} {v / max(1, b_rss):.3f}x" for k, v in rss.items() if k in rows[0]["slabs"]))
    budget.done()


if __name__ == "__main__":
    main()
