"""DeepCAM training-step throughput: optimized path vs fp32 eager NCHW, same batch, same process.

Both paths run the harness's real iteration (forward, weighted cross-entropy, backward, LAMB on the
flat buffer, LR schedule). The baseline is fp32 + NCHW + eager; the optimized path is bf16 autocast +
channels-last (+ ``--graph compile``). Timed blocks alternate so machine contention hits both. The
matmul peak is measured here (a GEMM in bf16 where bf16 is native, else in fp32: an emulated bf16
GEMM is no peak) and the model's FLOPs per step are counted with torch's FlopCounterMode, so the
achieved fraction of that peak is printed too. Where bf16 is emulated the optimized path is
labelled so: it measures the emulation.

Each block is printed when it is measured. ``--budget-s`` bounds the whole run: steps per block and
the number of blocks shrink to what fits (``--steps``/``--repeats`` are the most); what the budget
does not reach is printed as skipped.

    python -m benchmarks.deepcam_step --preset mini --batch 8 --repeats 5
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
from torch.utils.flop_counter import FlopCounterMode

from hpcbench.common.flat import FlatParams
from hpcbench.common.optim import build_optimizer
from hpcbench.common.precision import Precision, module_to_channels_last
from hpcbench.common.schedule import Schedule
from hpcbench.common.step import TrainStep, prepare_batch
from hpcbench.workloads.deepcam.synth import make_sample
from hpcbench.workloads.deepcam.workload import DeepCAMWorkload

from benchmarks.budget import Budget, add_budget_argument, say
from benchmarks.machine import bf16_native, describe, header, matmul_peak, peak_dtype


def make_batch(batch: int, h: int, w: int) -> tuple[torch.Tensor, torch.Tensor]:
    samples = [make_sample((99, i), h, w) for i in range(batch)]
    x = torch.from_numpy(np.stack([s[0] for s in samples]))
    x = (x - x.amin((0, 1, 2))) / (x.amax((0, 1, 2)) - x.amin((0, 1, 2)))
    y = torch.from_numpy(np.stack([s[1] for s in samples])).long()
    return x.permute(0, 3, 1, 2).contiguous(), y


def build(wl: DeepCAMWorkload, precision: str, channels_last: bool, graph: str, device: torch.device) -> TrainStep:
    torch.manual_seed(0)
    model = wl.build_model().to(device)
    if channels_last:  # as the harness does: 2-D and 3-D conv weights alike (loader_limit builds CosmoFlow too)
        model = module_to_channels_last(model)
    flat = FlatParams(model)
    opt = build_optimizer(flat, wl.cfg.optim)
    sched = Schedule.from_config(wl.cfg.optim, 100, 10)
    return TrainStep(wl, model, flat, opt, sched, Precision(precision, device), graph)


CPU_SECONDS: dict[int, list[float]] = {}  # id(step) -> process CPU seconds per step, per block


def time_steps(step: TrainStep, batch: tuple, n: int, device: torch.device) -> float:
    """Wall seconds per step over a block of ``n`` steps (also records CPU seconds per step)."""
    t0, c0 = time.perf_counter(), time.process_time()
    loss = torch.zeros((), device=device)
    for _ in range(n):
        loss += step(batch)
    float(loss)  # one read-back, after the block
    CPU_SECONDS.setdefault(id(step), []).append((time.process_time() - c0) / n)
    return (time.perf_counter() - t0) / n


def step_flops(step: TrainStep, batch: tuple) -> int:
    with FlopCounterMode(display=False) as counter:
        step.eager(batch)
    return counter.get_total_flops()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="mini")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--height", type=int, default=96)
    p.add_argument("--width", type=int, default=144)
    p.add_argument("--steps", type=int, default=3, help="steps per timed block (at most)")
    p.add_argument("--repeats", type=int, default=5, help="alternating blocks per path (at most)")
    p.add_argument("--graph", default="eager", choices=["eager", "compile", "cuda_graph"])
    p.add_argument("--set", dest="overrides", action="append", default=[])
    add_budget_argument(p, 180.0)
    a = p.parse_args()
    budget = Budget(a.budget_s)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    say(header(describe()))
    native, why = bf16_native(device)
    emu = "" if native else "[emulated]"
    say(f"device={device} threads={torch.get_num_threads()} preset={a.preset} batch={a.batch} "
        f"grid={a.height}x{a.width}; up to {a.repeats} blocks x {a.steps} steps per path, --budget-s {a.budget_s:g}")
    say(f"bf16 {'native' if native else 'EMULATED'}: {why}"
        + ("" if native else "; the bf16 path measures that emulation (labelled [emulated])"))
    pdtype = peak_dtype(device)
    pname = "bf16" if pdtype == torch.bfloat16 else "fp32"
    peak_s = max(0.5, min(2.0, 0.05 * a.budget_s))
    peak, n = matmul_peak(pdtype, seconds=peak_s, max_n=8192 if device.type == "cuda" else 2048, device=device)
    say(f"measured {pname} matmul peak: {peak / 1e9:.1f} GFLOP/s ({n}^3 GEMM, best of <= {peak_s:g} s)")
    wl = DeepCAMWorkload(DeepCAMWorkload.load_config(a.preset, a.overrides))
    x, y = make_batch(a.batch, a.height, a.width)
    base_batch = prepare_batch((x, y), device, channels_last=False)
    opt_batch = prepare_batch((x, y), device, channels_last=True)
    base_name, opt_name = "fp32-eager-nchw", f"bf16{emu}-{a.graph}-channels_last"
    specs = {base_name: ("fp32", False, base_batch), opt_name: ("bf16", True, opt_batch)}
    paths: dict[str, tuple[TrainStep, tuple]] = {}
    step_s: dict[str, float] = {}
    for name, (prec, cl, batch) in specs.items():  # warm up (and compile) outside the timing
        if name != base_name and budget.left() < 3 * max(step_s.values()):
            budget.skip(f"path {name}")
            continue
        t = time.perf_counter()
        paths[name] = (build(wl, prec, cl, a.graph if name == opt_name else "eager", device), batch)
        step_s[name] = time_steps(paths[name][0], batch, 2, device)
        say(f"  warm-up {name:36s} {time.perf_counter() - t:6.2f} s (build + 2 steps)")
    flops = step_flops(paths[base_name][0], base_batch)
    say(f"model_flops_per_step={flops / 1e9:.2f} GFLOP")
    times: dict[str, list[float]] = {k: [] for k in paths}
    for r in range(a.repeats):
        block_s = sum(step_s.values())
        if r and budget.left() < block_s:
            budget.skip(f"blocks {r + 1}-{a.repeats} of {a.repeats} (one step per path needs ~{block_s:.1f} s)")
            break
        n_steps = budget.fit(block_s, a.steps, share=1.0 / (a.repeats - r))
        for name, (step, batch) in paths.items():
            times[name].append(time_steps(step, batch, n_steps, device))
            step_s[name] = min(step_s[name], times[name][-1])
            say(f"  block {r + 1}/{a.repeats} {name:36s} {n_steps} steps {times[name][-1] * 1e3:8.1f} ms/step "
                f"{a.batch / times[name][-1]:7.2f} samples/s")
    blocks = len(times[base_name])
    say(f"median of {blocks} blocks:")
    for name, (step, _) in paths.items():
        med = statistics.median(times[name])
        cpu = statistics.median(CPU_SECONDS[id(step)][-blocks:])
        say(f"{name:36s} median {med * 1e3:8.1f} ms/step ({cpu * 1e3:8.1f} CPU-ms/step)  {a.batch / med:7.2f} "
            f"samples/s  {flops / med / 1e9:7.2f} GFLOP/s = {flops / med / peak:.3f} of {pname} peak")
    if opt_name in times:
        ratio = statistics.median(times[base_name]) / statistics.median(times[opt_name])
        say(f"speedup {opt_name} vs {base_name}: {ratio:.2f}x (goal >= 2x)")
    else:
        say(f"speedup {opt_name} vs {base_name}: not measured ({opt_name} skipped)")
    budget.done()


if __name__ == "__main__":
    main()
