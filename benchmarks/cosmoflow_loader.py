"""CosmoFlow loader throughput (torch and DALI) vs the training step rate, in one process.

Rounds interleave: one pass of each loader over this rank's training files, then timed training
steps of the configured model on a batch already in memory (harness-like: the preset's precision
and memory format, SGD momentum). The loader must deliver at least 2x the samples/s the step
consumes so it never is the bottleneck.

  python -m hpcbench datagen cosmoflow --out /tmp/cf16 --samples 512 --val-samples 8 --size 16
  python benchmarks/cosmoflow_loader.py --data /tmp/cf16 --config mini
"""
from __future__ import annotations

import argparse
import contextlib
import json
import time

import torch
import torch.nn.functional as F

from common.workload import DataShard
from cosmoflow.workload import CosmoFlowWorkload


def loader_rate(wl: CosmoFlowWorkload, kind: str, shard: DataShard, epoch: int) -> float:
    wl.cfg.train.loader = kind  # type: ignore[assignment]
    loader = wl.train_loader(shard)
    loader.set_epoch(epoch)
    t, n = time.perf_counter(), 0
    for x, _ in loader:
        n += x.shape[0]
    return n / (time.perf_counter() - t)


def step_rate(wl: CosmoFlowWorkload, batch: int, steps: int) -> float:
    tc = wl.cfg.train
    torch.manual_seed(0)
    model = wl.build_model()
    s = wl.cfg.data.size
    x = torch.log1p(torch.poisson(torch.ones(batch, 4, s, s, s)))
    y = torch.rand(batch, 4) * 2 - 1
    if tc.channels_last:
        model, x = model.to(memory_format=torch.channels_last_3d), x.contiguous(memory_format=torch.channels_last_3d)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    ctx = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if tc.precision == "bf16" else contextlib.nullcontext
    t = 0.0
    for i in range(steps + 1):
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with ctx():
            out = model(x)
        F.mse_loss(out.float(), y).backward()
        opt.step()
        if i:  # first step is warm-up
            t += time.perf_counter() - start
    return batch * steps / t


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True)
    p.add_argument("--config", default="mini")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--json", default="")
    a = p.parse_args()
    wl = CosmoFlowWorkload(CosmoFlowWorkload.load_config(a.config, [f"data.root={a.data}", *a.set]))
    bs = wl.cfg.train.global_batch_size
    shard = DataShard(rank=0, size=1, seed=1, local_batch_size=bs, device=torch.device("cpu"))
    rates: dict[str, list[float]] = {"torch": [], "dali": [], "step": []}
    for r in range(a.rounds):
        rates["torch"].append(loader_rate(wl, "torch", shard, r))
        rates["dali"].append(loader_rate(wl, "dali", shard, r))
        rates["step"].append(step_rate(wl, bs, a.steps))
    best = {k: max(v) for k, v in rates.items()}
    d = wl.cfg.data
    print(f"CosmoFlow loaders: {wl.dataset_sizes()[0]} files of {d.size}^3 x 4 in {a.data}, batch {bs}, "
          f"torch workers {wl.cfg.train.loader_workers}, DALI threads {d.dali_threads}, "
          f"torch threads {torch.get_num_threads()}, best of {a.rounds} interleaved rounds")
    print(f"  training step ({wl.cfg.train.precision}, channels_last={wl.cfg.train.channels_last}): "
          f"{best['step']:8.1f} samples/s")
    for k in ("torch", "dali"):
        print(f"  {k:5s} loader: {best[k]:8.1f} samples/s = x{best[k] / best['step']:.2f} the step rate (goal >= 2)")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"args": vars(a), "rates": rates, "best": best}, fh, indent=1)


if __name__ == "__main__":
    main()
