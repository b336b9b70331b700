"""Harness overhead: the harness's training epoch vs a bare hand-written loop, same model and data.

Both sides train the toy MLP (tests/harness_toy.py) with SGD + momentum on the same in-memory
batches. The harness side is ``Trainer.train_epoch`` (loader, device placement, flat-buffer
optimizer, device-side LR schedule, loss accumulation, phase timers, MLPerf epoch events); the
baseline is ``for batch: zero_grad; loss = mse(model(x), y); backward; torch.optim.SGD.step``.
Epochs alternate between the two (interleaved, so machine contention hits both); the median epoch
time of each is compared. Goal: harness within 5% of the bare loop. Each epoch pair is printed as
it runs; ``--budget-s`` stops the epochs when the time left cannot hold another pair (said).

    python -m benchmarks.harness_overhead [--epochs 15] [--hidden 256] [--batch 64]
"""
from __future__ import annotations

import argparse
import statistics
import time


import torch
from torch import nn

from hpcbench.common.dist import init_distributed
from hpcbench.common.mllog import MLPerfLogger
from hpcbench.common.system import SystemDescription
from hpcbench.common.trainer import Trainer
from tests.harness_toy import ToyWorkload

from benchmarks.budget import Budget, add_budget_argument, say
from benchmarks.machine import describe, header


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=15, help="interleaved epochs of each (at most)")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--samples", type=int, default=8192)
    add_budget_argument(ap, 120.0)
    args = ap.parse_args()
    budget = Budget(args.budget_s)
    say(header(describe()))
    env = init_distributed()
    cfg = ToyWorkload.load_config("mini", [
        f"model.hidden={args.hidden}", f"train.global_batch_size={args.batch}", f"data.train={args.samples}",
        "optim.schedule=constant", "optim.warmup=0", "optim.lr=0.01"])
    tr = Trainer(ToyWorkload(cfg), env, MLPerfLogger(None), SystemDescription(), progress=False)
    parts = tr.setup()
    torch.manual_seed(0)
    bare_model = ToyWorkload(cfg).build_model()
    bare_opt = torch.optim.SGD(bare_model.parameters(), lr=0.01, momentum=0.9)
    loader = parts.train_loader

    def bare_epoch(epoch: int) -> float:
        t0 = time.perf_counter()
        bare_model.train()
        loader.set_epoch(epoch)
        for batch in loader:
            bare_opt.zero_grad(set_to_none=True)
            loss = nn.functional.mse_loss(bare_model(batch["x"]), batch["y"])
            loss.backward()
            bare_opt.step()
        return time.perf_counter() - t0

    steps = len(loader)
    say(f"model: toy MLP hidden={args.hidden}, batch={args.batch}, {steps} steps/epoch, up to "
        f"{args.epochs} interleaved epochs each (+1 warm-up), torch threads={torch.get_num_threads()}")
    harness, bare = [], []
    pair_s = 0.0
    for epoch in range(1, args.epochs + 2):
        if epoch > 2 and budget.left() < pair_s:
            budget.skip(f"epochs {epoch - 1}-{args.epochs} of {args.epochs} (one pair needs ~{pair_s:.1f} s)")
            break
        h = tr.train_epoch(parts, epoch)[0]
        b = bare_epoch(epoch)
        pair_s = h + b if epoch == 1 else min(pair_s, h + b)
        if epoch > 1:  # first epoch of each warms caches and the allocator
            harness.append(h)
            bare.append(b)
        say(f"  epoch {epoch - 1 if epoch > 1 else 'warm-up'}: harness {1000 * h / steps:.3f} ms/step, "
            f"bare {1000 * b / steps:.3f} ms/step")
    h_ms, b_ms = 1000 * statistics.median(harness) / steps, 1000 * statistics.median(bare) / steps
    say(f"bare loop (torch.optim.SGD)      : {b_ms:.3f} ms/step (median of {len(bare)} epochs)")
    say(f"harness (Trainer.train_epoch)   : {h_ms:.3f} ms/step (median of {len(harness)} epochs)")
    say(f"ratio harness/bare = {h_ms / b_ms:.3f}  (goal <= 1.05)")
    budget.done()
    env.close()


if __name__ == "__main__":
    main()
