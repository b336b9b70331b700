"""CUDA-graph replay vs eager: equality over N steps and the step time of each (GPU only).

Two copies of the toy model (tests/harness_toy.py) with LAMB + clipping train on the same batches,
one eagerly, one by replaying the captured full iteration; calls alternate (interleaved timing). A
short probe run (10 steps, printed) sizes the main run to ``--budget-s``; fewer steps than asked are said.

    python -m benchmarks.harness_graph [--steps 200] [--batch 256] [--hidden 1024]
"""
from __future__ import annotations

import argparse
import sys
import time


import torch

from benchmarks.budget import Budget, add_budget_argument, say
from benchmarks.machine import describe, header


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200, help="steps of each (at most)")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--hidden", type=int, default=1024)
    add_budget_argument(ap, 60.0)
    args = ap.parse_args()
    budget = Budget(args.budget_s)
    say(header(describe()))
    if not torch.cuda.is_available():
        say("no CUDA device: CUDA-graph capture cannot be measured on this machine")
        return 0
    from tests.harness_graph import compare

    overrides = (f"model.hidden={args.hidden}",)
    t = time.perf_counter()
    probe = compare(steps=10, overrides=overrides, batch=args.batch)
    probe_s = time.perf_counter() - t
    say(f"probe (10 steps, incl. capture): eager {probe['eager_step_ms']:.3f} ms/step, graph "
        f"{probe['graph_step_ms']:.3f} ms/step, {probe_s:.1f} s in all")
    steps = budget.fit(probe_s / 10, args.steps)
    if steps < args.steps:
        budget.skip(f"steps {steps + 1}-{args.steps} of {args.steps}")
    out = compare(steps=max(steps, 4), overrides=overrides, batch=args.batch)
    say(f"device {torch.cuda.get_device_name()}: toy MLP hidden={args.hidden}, batch={args.batch}, "
        f"{out['steps']} steps")
    say(f"max |param diff| graph vs eager = {out['max_diff']:.3g}, max |loss diff| = {out['loss_diff']:.3g}")
    say(f"eager {out['eager_step_ms']:.3f} ms/step, graph {out['graph_step_ms']:.3f} ms/step, "
        f"speedup eager/graph = {out['eager_step_ms'] / out['graph_step_ms']:.2f}x")
    budget.done()
    return 0


if __name__ == "__main__":
    sys.exit(main())
