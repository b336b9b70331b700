"""CosmoFlow training-step throughput: optimized path vs plain fp32 eager NCDHW, same process.

Variants of one model and batch (forward + the workload's sum-of-squares loss over its count +
backward + SGD momentum step), measured in interleaved rounds so that load from other processes
hits all of them alike. The input is what the loader gives: int16 counts [B,S,S,S,4] through the
dataset spec's transform (log1p, then [B,4,S,S,S] contiguous, or the channels_last_3d view):
  baseline     fp32, eager, NCDHW
  cl           fp32, eager, channels_last_3d
  bf16_cl      bf16 autocast (fp32 master weights), channels_last_3d
  bf16_cl_comp bf16 + channels_last_3d + torch.compile (with --compile)
Prints samples/s, the ratio to the baseline and the achieved FLOP/s as a fraction of the bf16
matmul peak measured here (a large bf16 GEMM), so results are comparable across machines.

  python benchmarks/cosmoflow_step.py --size 32 --batch 4 --rounds 3
"""
from __future__ import annotations

import argparse
import contextlib
import json
import time
from collections.abc import Callable

import torch

from cosmoflow.config import CosmoModelConfig
from cosmoflow.dataset import CosmoFlowData
from cosmoflow.model import CosmoFlowNet, conv_flops_per_sample
from cosmoflow.workload import CosmoFlowWorkload
from machine import describe, header  # noqa: E402 - sibling benchmark module


def matmul_peak(dtype: torch.dtype, n: int = 2048, reps: int = 5) -> float:
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    a @ b
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t)
    return 2.0 * n ** 3 / best


def make_step(cfg: CosmoModelConfig, size: int, batch: int, bf16: bool, channels_last: bool,
              compile_: bool) -> Callable[[], None]:
    torch.manual_seed(0)
    model = CosmoFlowNet(cfg, size)
    counts = torch.poisson(torch.ones(batch, size, size, size, 4)).to(torch.int16)
    x, y = CosmoFlowData(size, channels_last=channels_last).transform((counts, torch.rand(batch, 4) * 2 - 1))
    if channels_last:
        model = model.to(memory_format=torch.channels_last_3d)
    wl = CosmoFlowWorkload(CosmoFlowWorkload.load_config("mini"))  # loss and loss_count only
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)

    def fwd_loss() -> torch.Tensor:
        ctx = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
        with ctx:
            out = model(x)
        return wl.loss(out, (x, y)) / wl.loss_count((x, y))

    fn = torch.compile(fwd_loss) if compile_ else fwd_loss

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        fn().backward()
        opt.step()
    return step


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", type=int, default=32, help="cube edge (128 = MLPerf)")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--conv-layers", type=int, default=5)
    p.add_argument("--conv-channels", type=int, default=32)
    p.add_argument("--steps", type=int, default=3, help="timed steps per variant per round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--compile", action="store_true", help="add the torch.compile variant")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: leave default)")
    p.add_argument("--json", default="", help="also write the results here")
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    cfg = CosmoModelConfig(conv_layers=a.conv_layers, conv_channels=a.conv_channels, dropout=0.5)
    flops_per_sample = 3.0 * conv_flops_per_sample(cfg, a.size)  # forward + backward (2x)
    variants = {"baseline": (False, False, False), "cl": (False, True, False), "bf16_cl": (True, True, False)}
    if a.compile:
        variants["bf16_cl_comp"] = (True, True, True)
    steps = {k: make_step(cfg, a.size, a.batch, *v) for k, v in variants.items()}
    for fn in steps.values():  # warm up (and compile)
        fn()
        fn()
    times: dict[str, list[float]] = {k: [] for k in steps}
    peaks = []
    for _ in range(a.rounds):
        peaks.append(matmul_peak(torch.bfloat16))
        for k, fn in steps.items():
            t = time.perf_counter()
            for _ in range(a.steps):
                fn()
            times[k].append((time.perf_counter() - t) / a.steps)
    peak = max(peaks)
    machine = describe()
    print(header(machine))
    print(f"CosmoFlow step: size {a.size}^3 x 4, batch {a.batch}, conv {a.conv_layers}x{a.conv_channels}.., "
          f"torch threads {torch.get_num_threads()}, {a.rounds} rounds x {a.steps} steps (best round)")
    print(f"measured bf16 matmul peak: {peak / 1e9:.1f} GFLOP/s; model {flops_per_sample / 1e9:.2f} GFLOP/sample/step")
    base = min(times["baseline"])
    results = {}
    for k, ts in times.items():
        best = min(ts)
        sps = a.batch / best
        results[k] = {"samples_per_s": sps, "speedup": base / best, "flops_frac_of_bf16_peak": sps * flops_per_sample / peak}
        print(f"  {k:13s} {sps:8.2f} samples/s  x{base / best:5.2f} vs baseline  "
              f"{sps * flops_per_sample / 1e9:7.2f} GFLOP/s = {100 * sps * flops_per_sample / peak:5.1f}% of bf16 peak")
    best_k = max(results, key=lambda k: results[k]["samples_per_s"])
    print(f"optimized path ({best_k}) vs fp32 eager NCDHW: x{results[best_k]['speedup']:.2f} (goal >= 2)")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"args": vars(a), "machine": machine, "bf16_peak_flops": peak, "results": results}, fh, indent=1)


if __name__ == "__main__":
    main()
