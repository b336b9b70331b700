"""DeepCAM training-step throughput: optimized path vs fp32 eager NCHW, same batch, same process.

Both paths run the harness's real iteration (forward, weighted cross-entropy, backward, LAMB on the
flat buffer, LR schedule). The baseline is fp32 + NCHW + eager; the optimized path is bf16 autocast +
channels-last (+ ``--graph compile``). Timed blocks alternate so machine contention hits both. The
bf16 matmul peak is measured here (a large bf16 GEMM) and the model's FLOPs per step are counted
with torch's FlopCounterMode, so the achieved fraction of that peak is printed too.

    python benchmarks/deepcam_step.py --preset mini --batch 8 --repeats 5
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
from torch.utils.flop_counter import FlopCounterMode

from common.flat import FlatParams
from common.optim import build_optimizer
from common.precision import Precision, module_to_channels_last
from common.schedule import Schedule
from common.step import TrainStep, prepare_batch
from deepcam.synth import make_sample
from deepcam.workload import DeepCAMWorkload


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


def bf16_matmul_peak(device: torch.device, n: int = 2048, reps: int = 5) -> float:
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    a @ b
    best = float("inf")
    for _ in range(reps):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        (a @ b).sum().item()
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best


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
    p.add_argument("--steps", type=int, default=3, help="steps per timed block")
    p.add_argument("--repeats", type=int, default=5, help="alternating blocks per path")
    p.add_argument("--graph", default="eager", choices=["eager", "compile", "cuda_graph"])
    p.add_argument("--set", dest="overrides", action="append", default=[])
    a = p.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    wl = DeepCAMWorkload(DeepCAMWorkload.load_config(a.preset, a.overrides))
    x, y = make_batch(a.batch, a.height, a.width)
    base_batch = prepare_batch((x, y), device, channels_last=False)
    opt_batch = prepare_batch((x, y), device, channels_last=True)
    paths = {"fp32-eager-nchw": (build(wl, "fp32", False, "eager", device), base_batch),
             f"bf16-{a.graph}-channels_last": (build(wl, "bf16", True, a.graph, device), opt_batch)}
    for step, batch in paths.values():  # warm up (and compile) outside the timing
        time_steps(step, batch, 2, device)
    times: dict[str, list[float]] = {k: [] for k in paths}
    for _ in range(a.repeats):
        for name, (step, batch) in paths.items():
            times[name].append(time_steps(step, batch, a.steps, device))
    peak = bf16_matmul_peak(device)
    flops = step_flops(paths["fp32-eager-nchw"][0], base_batch)
    base_name, opt_name = list(paths)
    print(f"device={device} threads={torch.get_num_threads()} preset={a.preset} batch={a.batch} "
          f"grid={a.height}x{a.width} model_flops_per_step={flops / 1e9:.2f} GFLOP")
    print(f"measured bf16 matmul peak: {peak / 1e9:.1f} GFLOP/s")
    for name, (step, _) in paths.items():
        med = statistics.median(times[name])
        cpu = statistics.median(CPU_SECONDS[id(step)][-a.repeats:])
        print(f"{name:28s} median {med * 1e3:8.1f} ms/step ({cpu * 1e3:8.1f} CPU-ms/step)  {a.batch / med:7.2f} "
              f"samples/s  {flops / med / 1e9:7.2f} GFLOP/s = {flops / med / peak:.3f} of bf16 peak")
    ratio = statistics.median(times[base_name]) / statistics.median(times[opt_name])
    print(f"speedup {opt_name} vs {base_name}: {ratio:.2f}x (goal >= 2x)")


if __name__ == "__main__":
    main()
