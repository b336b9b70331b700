"""CosmoFlow training-step throughput: optimized path vs plain fp32 eager NCDHW, same process.

Variants of one model and batch (forward + the workload's sum-of-squares loss over its count +
backward + SGD momentum step), measured in interleaved rounds so that load from other processes
hits all of them alike. The input is what the loader gives: int16 counts [B,S,S,S,4] through the
dataset spec's transform (log1p, then [B,4,S,S,S] contiguous, or the channels_last_3d view):
  baseline     fp32, eager, NCDHW
  cl           fp32, eager, channels_last_3d
  bf16_cl      bf16 autocast (fp32 master weights), channels_last_3d
  bf16_cl_comp bf16 + channels_last_3d + torch.compile (with --compile)
Prints samples/s, the ratio to the baseline and the achieved FLOP/s as a fraction of the matmul
peak measured here (a GEMM in bf16 where bf16 is native, else in fp32: an emulated bf16 GEMM is no
peak), so results are comparable across machines. Where bf16 is emulated the bf16 variants are
labelled so: they measure the emulation.

Each block is printed when it is measured. ``--budget-s`` bounds the whole run: steps per block and
rounds shrink to what fits (``--steps``/``--rounds`` are the most), and variants or rounds the budget
does not reach are listed as skipped (also in the JSON).

  python -m benchmarks.cosmoflow_step --size 32 --batch 4 --rounds 3
"""
from __future__ import annotations

import argparse
import contextlib
import json
import time
from collections.abc import Callable

import torch

from hpcbench.workloads.cosmoflow.config import CosmoModelConfig
from hpcbench.workloads.cosmoflow.dataset import CosmoFlowData
from hpcbench.workloads.cosmoflow.model import CosmoFlowNet, conv_flops_per_sample
from hpcbench.workloads.cosmoflow.workload import CosmoFlowWorkload
from benchmarks.budget import Budget, add_budget_argument, say
from benchmarks.machine import bf16_native, describe, header, matmul_peak, peak_dtype


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
    p.add_argument("--steps", type=int, default=3, help="timed steps per variant per round (at most)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (at most)")
    p.add_argument("--compile", action="store_true", help="add the torch.compile variant")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: leave default)")
    p.add_argument("--json", default="", help="also write the results here")
    add_budget_argument(p, 180.0)
    a = p.parse_args()
    budget = Budget(a.budget_s)
    if a.threads:
        torch.set_num_threads(a.threads)
    machine = describe()
    say(header(machine))
    native, why = bf16_native()
    emu = "" if native else "[emulated]"
    cfg = CosmoModelConfig(conv_layers=a.conv_layers, conv_channels=a.conv_channels, dropout=0.5)
    flops_per_sample = 3.0 * conv_flops_per_sample(cfg, a.size)  # forward + backward (2x)
    say(f"CosmoFlow step: size {a.size}^3 x 4, batch {a.batch}, conv {a.conv_layers}x{a.conv_channels}.., "
        f"torch threads {torch.get_num_threads()}, up to {a.rounds} rounds x {a.steps} steps (best round), "
        f"--budget-s {a.budget_s:g}; model {flops_per_sample / 1e9:.2f} GFLOP/sample/step")
    say(f"bf16 {'native' if native else 'EMULATED'}: {why}"
        + ("" if native else "; the bf16 variants measure that emulation (labelled [emulated])"))
    pdtype = peak_dtype()
    pname = str(pdtype).removeprefix("torch.").replace("bfloat16", "bf16").replace("float32", "fp32")
    peak_s = max(0.5, min(2.0, 0.05 * a.budget_s))
    peak, n = matmul_peak(pdtype, seconds=peak_s)
    say(f"measured {pname} matmul peak: {peak / 1e9:.1f} GFLOP/s ({n}^3 GEMM, best of <= {peak_s:g} s)")
    variants = {"baseline": (False, False, False), "cl": (False, True, False), "bf16_cl": (True, True, False)}
    if a.compile:
        variants["bf16_cl_comp"] = (True, True, True)
    steps: dict[str, Callable[[], None]] = {}
    step_s: dict[str, float] = {}
    for k, v in variants.items():  # build and warm up (and compile); the baseline always runs
        if k != "baseline" and budget.left() < 3 * max(step_s.values()):  # its warm-up + one timed step
            budget.skip(f"variant {k}")
            continue
        steps[k] = make_step(cfg, a.size, a.batch, *v)
        t = time.perf_counter()
        steps[k]()
        t1 = time.perf_counter()
        steps[k]()
        step_s[k] = time.perf_counter() - t1
        say(f"  warm-up {k + (emu if v[0] else ''):20s} first step {t1 - t:6.2f} s, second {step_s[k]:6.3f} s")
    times: dict[str, list[float]] = {k: [] for k in steps}
    rounds_done = 0
    for r in range(a.rounds):
        round_s = sum(step_s.values())  # one step of each
        if r and budget.left() < round_s:
            budget.skip(f"rounds {r + 1}-{a.rounds} of {a.rounds} (one round of one step each needs ~{round_s:.1f} s)")
            break
        n_steps = budget.fit(round_s, a.steps, share=1.0 / (a.rounds - r))
        for k, fn in steps.items():
            t = time.perf_counter()
            for _ in range(n_steps):
                fn()
            times[k].append((time.perf_counter() - t) / n_steps)
            step_s[k] = min(step_s[k], times[k][-1])
            sps = a.batch / times[k][-1]
            say(f"  round {r + 1}/{a.rounds} {k + (emu if variants[k][0] else ''):20s} {n_steps} steps "
                f"{times[k][-1]:7.3f} s/step {sps:8.2f} samples/s")
        rounds_done += 1
    base = min(times["baseline"])
    results = {}
    say(f"best round of {rounds_done}:")
    for k, ts in times.items():
        best = min(ts)
        sps = a.batch / best
        results[k] = {"samples_per_s": sps, "speedup": base / best, "flops_frac_of_peak": sps * flops_per_sample / peak,
                      "bf16_emulated": variants[k][0] and not native}
        say(f"  {k + (emu if variants[k][0] else ''):20s} {sps:8.2f} samples/s  x{base / best:5.2f} vs baseline  "
            f"{sps * flops_per_sample / 1e9:7.2f} GFLOP/s = {100 * sps * flops_per_sample / peak:5.1f}% of {pname} peak")
    best_k = max(results, key=lambda k: results[k]["samples_per_s"])
    say(f"optimized path ({best_k}) vs fp32 eager NCDHW: x{results[best_k]['speedup']:.2f} (goal >= 2)")
    budget.done()
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"args": vars(a), "machine": machine, "bf16_native": native, "bf16_reason": why,
                       "peak_dtype": pname, "peak_flops": peak, "peak_n": n, "rounds_done": rounds_done,
                       "results": results, "budget": budget.summary()}, fh, indent=1)


if __name__ == "__main__":
    main()
