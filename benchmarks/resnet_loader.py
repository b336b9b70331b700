"""ResNet loader throughput (images/s) vs the training step rate of the same config, in one run.

Loaders (the workload's own, as ``hpcbench train`` builds them): Pillow in reader threads and DALI
on the CPU, each without and with the decoded-image cache (``data.cache = "host"``), at
``data.threads`` 0 (the training thread reads) and N. Each is timed over two epochs: epoch 1
decodes every JPEG (and fills the cache), epoch 2 is what every later epoch costs (from the cache
when on: no JPEG decode, new crops). Baseline: the harness's training step (the preset's model,
optimizer, precision) on a batch from the loader, in images/s, with channels-last off and on and
torch threads 1 and all cores; the fastest counts (what ``channels_last = "auto"`` and a good thread
count give; on a shared box the OpenMP threads of a 2-thread step can wait on each other for a
descheduled core). Printed: each loader's images/s and its ratio to the step rate (goal >= 2x: the
loader must not be what a GPU waits for, and on a CPU it takes the cores the step needs less than
half the time). The loader and the step are each timed alone; in a run they share the cores.
Rows ``dali ibm=K``: DALI with the input batch multiplier (``data.dali_batch_multiplier``: the pipeline
runs on K batches at once, cut back into K). Rounds interleave every measurement; the best of each counts.

  python -m benchmarks.resnet_loader --work /tmp/rnl            # writes the mini dataset there when missing
  python -m benchmarks.resnet_loader --data DIR --preset full --set model.num_classes=4 --batch 16
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from hpcbench.common.data.dali import dali_available
from hpcbench.common.flat import FlatParams
from hpcbench.common.optim import build_optimizer
from hpcbench.common.precision import Precision, module_to_channels_last
from hpcbench.common.schedule import Schedule
from hpcbench.common.step import TrainStep, prepare_batch
from hpcbench.common.workload import DataShard
from hpcbench.workloads.mlperf_training.resnet.workload import ResNetWorkload

from benchmarks.budget import Budget, add_budget_argument, say
from benchmarks.machine import describe, header


def workload(preset: str, root: Path, overrides: list[str], loader: str, cache: str, threads: int,
             multiplier: int = 1) -> ResNetWorkload:
    cfg = ResNetWorkload.load_config(preset, [*overrides, f"data.root={root}", f"train.loader={loader}",
                                              f"data.cache={cache}", f"data.threads={threads}",
                                              f"data.dali_batch_multiplier={multiplier}"])
    return ResNetWorkload(cfg)


def loader_epochs(wl: ResNetWorkload, batch: int, budget: Budget) -> list[float]:
    """images/s of epoch 1 and epoch 2 (the second only if the budget allows)."""
    ld = wl.train_loader(DataShard(rank=0, size=1, seed=1, local_batch_size=batch, device=torch.device("cpu")))
    rates = []
    for epoch in range(2):
        if epoch and budget.spent():
            break
        ld.set_epoch(epoch)
        t, n = time.perf_counter(), 0
        for x, _ in ld:
            n += x.shape[0]
        rates.append(n / (time.perf_counter() - t))
    return rates


def step_rate(wl: ResNetWorkload, batch: int, channels_last: bool, steps: int) -> float:
    """images/s of the harness's training step (eager) on one loader batch."""
    torch.manual_seed(0)
    model = wl.build_model()
    if channels_last:
        model = module_to_channels_last(model)
    flat = FlatParams(model)
    exempt = [wl.no_weight_decay(n) for n, _ in model.named_parameters()]
    opt = build_optimizer(flat, wl.cfg.optim, decay_exempt=exempt)
    sched = Schedule.from_config(wl.cfg.optim, 100, wl.cfg.train.max_epochs)
    prec = wl.cfg.train.precision if wl.cfg.train.precision != "auto" else "fp32"
    step = TrainStep(wl, model, flat, opt, sched, Precision(prec, torch.device("cpu")), "eager")
    wl.dataset().channels_last = channels_last
    ld = wl.train_loader(DataShard(rank=0, size=1, seed=1, local_batch_size=batch, device=torch.device("cpu")))
    x = prepare_batch(next(iter(ld)), torch.device("cpu"), channels_last=channels_last)
    float(step(x))  # warm-up
    t = time.perf_counter()
    loss = torch.zeros(())
    for _ in range(steps):
        loss += step(x)
    float(loss)
    return batch * steps / (time.perf_counter() - t)


def ensure_data(work: Path, args: list[str], budget: Budget) -> Path:
    out = work / "resnet-mini"
    if (out / ".done").exists():
        return out
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "hpcbench", "datagen", "resnet", "--out", str(out), "--workers", "2", "--quiet", *args]
    say("+ " + " ".join(cmd[1:]))
    subprocess.run(cmd, check=True, timeout=budget.timeout(600))
    (out / ".done").touch()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, help="an ImageNet-layout folder (default: the mini dataset under --work)")
    p.add_argument("--work", type=Path, default=Path("/tmp/resnet_loader"))
    p.add_argument("--preset", default="mini")
    p.add_argument("--set", dest="overrides", action="append", default=[], help="config overrides key=value")
    p.add_argument("--batch", type=int, default=0, help="images per batch (default: the preset's global batch)")
    p.add_argument("--threads", type=int, default=2, help="reader threads of the threaded runs (and DALI's)")
    p.add_argument("--steps", type=int, default=10, help="timed training steps per layout")
    p.add_argument("--rounds", type=int, default=2, help="interleaved rounds; the best of each measurement counts")
    p.add_argument("--multiplier", type=int, default=4,
                   help="DALI input batch multiplier of the extra 'dali ibm=K' rows (1: no such rows)")
    p.add_argument("--torch-threads", type=int, default=1,
                   help="torch intra-op threads while the loaders run (each of 2 ranks on 2 cores gets 1)")
    p.add_argument("--json", type=Path)
    add_budget_argument(p, 300.0)
    a = p.parse_args()
    budget = Budget(a.budget_s)
    info = describe()
    cores = int(info["cores"] or 1)
    say(header(info))
    root = a.data or ensure_data(a.work, ResNetWorkload.embedded_datagen_args(), budget)
    base = workload(a.preset, root, a.overrides, "torch", "none", 0)
    batch = a.batch or base.cfg.train.global_batch_size
    n_train = len(base.source("train"))
    say(f"data {root}: {n_train} training images; preset {a.preset}, crop {base.cfg.data.image_size} px, "
        f"batch {batch}, decode_short_side {base.cfg.data.decode_short_side}")

    steps: dict[bool, float] = {}
    results: dict[str, Any] = {}
    variants = [("pillow", "torch", 1), ("dali", "dali", 1)] if dali_available() else [("pillow", "torch", 1)]
    if dali_available() and a.multiplier > 1:
        variants.append((f"dali ibm={a.multiplier}", "dali", a.multiplier))
    if not dali_available():
        say("DALI is not installed: the DALI rows are left out")
    for r in range(a.rounds):  # rounds interleave every measurement; the best of each counts (a shared box)
        say(f"-- round {r + 1} of {a.rounds}")
        for tt in sorted({1, cores}):
            for cl in (False, True):
                what = f"torch_threads={tt} channels_last={cl}"
                if budget.spent():
                    budget.skip(f"round {r + 1} step {what}")
                    continue
                torch.set_num_threads(tt)
                rate = step_rate(workload(a.preset, root, a.overrides, "torch", "none", 0), batch, cl, a.steps)
                steps[what] = max(rate, steps.get(what, 0.0))
                say(f"training step, {what}: {rate:8.1f} images/s")
        torch.set_num_threads(a.torch_threads)
        for name, loader, mult in variants:
            for cache in ("none", "host"):
                for threads in (0, a.threads):
                    key = f"{name} cache={cache} threads={threads}"
                    if budget.spent():
                        budget.skip(f"round {r + 1} {key}")
                        continue
                    wl = workload(a.preset, root, a.overrides, loader, cache, threads, mult)
                    rates = loader_epochs(wl, batch, budget)
                    best = results.setdefault(key, {"epoch1": 0.0, "epoch2": None})
                    best["epoch1"] = max(best["epoch1"], rates[0])
                    if len(rates) > 1:
                        best["epoch2"] = max(best["epoch2"] or 0.0, rates[1])
                    say(f"{key:32s} epoch 1 {rates[0]:8.1f} images/s"
                        + (f", epoch 2 {rates[1]:8.1f} images/s" if len(rates) > 1 else ""))
    if not steps:
        raise SystemExit("the budget did not reach one training-step measurement")
    step = max(steps.values())
    say(f"step rate (best round, the fastest setting): {step:.1f} images/s ("
        + ", ".join(f"{k} {v:.1f}" for k, v in steps.items()) + f"); goal: loader >= {2 * step:.1f} images/s")
    say("ratios: loader images/s / step images/s (best rounds), goal >= 2.00x; epoch 2 = every later epoch")
    for key, r in results.items():
        later = r["epoch2"] if r["epoch2"] is not None else r["epoch1"]
        say(f"  {key:32s} epoch 1 {r['epoch1'] / step:6.2f}x, later epochs {later / step:6.2f}x  "
            f"{'meets' if later >= 2 * step else 'BELOW'} the goal")
    budget.done()
    if a.json:
        a.json.write_text(json.dumps({"machine": info, "step_images_s": steps,
                                      "batch": batch, "results": results, "budget": budget.summary()}, indent=1))


if __name__ == "__main__":
    main()
