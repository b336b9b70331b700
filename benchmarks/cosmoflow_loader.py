"""CosmoFlow loader throughput (the shared layer's torch and DALI loaders) vs the training step rate.

Rounds interleave: one pass of each loader over this rank's training files (a new shuffle each
round: the reader threads read, inflate and validate every file, then the log1p transform runs in
torch or in DALI), then timed training steps of the configured model on a batch already in memory
(harness-like: the preset's precision and memory format, the workload's sum/count loss, SGD
momentum). Prints samples/s and decoded GB/s (int16 counts out of the reader) per loader, and the
ratio to the step rate (goal >= 2x: the loader must never be the bottleneck).

  python -m hpcbench datagen cosmoflow --out /tmp/cf16 --samples 512 --val-samples 8 --size 16
  python benchmarks/cosmoflow_loader.py --data /tmp/cf16 --config mini
"""
from __future__ import annotations

import argparse
import contextlib
import json
import time

import torch

from common.workload import DataShard
from cosmoflow.data import x_bytes
from cosmoflow.workload import CosmoFlowWorkload
from machine import describe, header  # noqa: E402 - sibling benchmark module


def loader_rate(wl: CosmoFlowWorkload, kind: str, shard: DataShard, epoch: int) -> float:
    wl.cfg.train.loader = kind  # type: ignore[assignment]
    loader = wl.train_loader(shard)
    loader.set_epoch(epoch)
    t, n = time.perf_counter(), 0
    for x, _ in loader:
        n += x.shape[0]
    if shard.device.type == "cuda":
        torch.cuda.synchronize(shard.device)
    return n / (time.perf_counter() - t)


def step_rate(wl: CosmoFlowWorkload, batch: int, steps: int, device: torch.device) -> float:
    tc = wl.cfg.train
    torch.manual_seed(0)
    model = wl.build_model().to(device)
    s = wl.cfg.data.size
    counts = torch.poisson(torch.ones(batch, s, s, s, 4)).to(torch.int16)
    x, y = wl.dataset().transform((counts.to(device), (torch.rand(batch, 4) * 2 - 1).to(device)))
    if tc.channels_last:
        model = model.to(memory_format=torch.channels_last_3d)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    bf16 = tc.precision == "bf16"
    ctx = (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if bf16 else contextlib.nullcontext
    t = 0.0
    for i in range(steps + 1):
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with ctx():
            out = wl.forward(model, (x, y))
        (wl.loss(out, (x, y)) / wl.loss_count((x, y))).backward()
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i:  # first step is warm-up
            t += time.perf_counter() - start
    return batch * steps / t


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True)
    p.add_argument("--config", default="mini")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config overrides")
    p.add_argument("--threads", type=int, default=0, help="reader threads (data.threads; 0: the preset's)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--steps", type=int, default=20, help="timed training steps per round (0: no step rate)")
    p.add_argument("--json", default="")
    a = p.parse_args()
    overrides = [f"data.root={a.data}", *([f"data.threads={a.threads}"] if a.threads else []), *a.set]
    wl = CosmoFlowWorkload(CosmoFlowWorkload.load_config(a.config, overrides))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    bs = wl.cfg.train.global_batch_size
    shard = DataShard(rank=0, size=1, seed=1, local_batch_size=bs, device=device)
    kinds = ["torch"]
    try:
        import nvidia.dali  # noqa: F401

        kinds.append("dali")
    except ImportError:
        pass
    machine = describe()
    rates: dict[str, list[float]] = {k: [] for k in [*kinds, "step"]}
    for r in range(a.rounds):
        for kind in kinds:
            rates[kind].append(loader_rate(wl, kind, shard, r))
        if a.steps:
            rates["step"].append(step_rate(wl, bs, a.steps, device))
    best = {k: max(v) for k, v in rates.items() if v}
    d = wl.cfg.data
    sample_gb = x_bytes(d.size) / 1e9
    print(header(machine))
    print(f"CosmoFlow loaders: {wl.dataset_sizes()[0]} files of {d.size}^3 x 4 in {a.data}, batch {bs}, "
          f"device {device}, reader threads {d.threads}, prefetch {d.prefetch}, best of {a.rounds} interleaved rounds")
    if "step" in best:
        print(f"  training step ({wl.cfg.train.precision}, channels_last={wl.cfg.train.channels_last}): "
              f"{best['step']:8.1f} samples/s")
    for k in kinds:
        ratio = f" = x{best[k] / best['step']:.2f} the step rate (goal >= 2)" if "step" in best else ""
        print(f"  {k:5s} loader: {best[k]:8.1f} samples/s, {best[k] * sample_gb:6.3f} GB/s decoded{ratio}")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"args": vars(a), "machine": machine, "rates": rates, "best": best,
                       "decoded_gb_per_s": {k: best[k] * sample_gb for k in kinds}}, fh, indent=1)


if __name__ == "__main__":
    main()
