"""LARS on the flat buffer vs LARS per tensor, on ResNet-50's 161 parameter tensors (25.6M parameters).

Three optimizer steps over the same parameters and gradients, interleaved (so contention on a shared
machine hits all of them), medians compared:

* ``flat LARS`` (``hpcbench.common.optim.LARS``): segment norms and a handful of whole-buffer kernels;
* ``per-tensor LARS`` (the baseline): the reference's shape, one norm pair and one momentum update per
  tensor in a Python loop (what an optimizer over ``model.parameters()`` does), same maths;
* ``flat SGD`` (``hpcbench.common.optim.SGD``, momentum): the floor, how much LARS's trust ratios cost on top.

The two LARS variants are checked equal after the timed steps. Prints each round as it runs; the
``--budget-s`` bounds the rounds.

    python -m benchmarks.lars_flat [--steps 10] [--budget-s 60]
"""
from __future__ import annotations

import argparse
import statistics
import time


import torch

from hpcbench.common.flat import FlatParams
from hpcbench.common.optim import LARS, SGD
from hpcbench.common.runconfig import OptimConfig
from hpcbench.workloads.mlperf_training.resnet.model import ResNet, no_weight_decay

from benchmarks.budget import Budget, add_budget_argument, say
from benchmarks.machine import describe, header


class PerTensorLARS:
    """The baseline: LARS over a list of tensors, one tensor at a time (rate inside the momentum)."""

    def __init__(self, params: list[torch.Tensor], exempt: list[bool], cfg: OptimConfig) -> None:
        self.params, self.exempt, self.cfg = params, exempt, cfg
        self.bufs = [torch.zeros_like(p) for p in params]

    @torch.no_grad()
    def step(self, grads: list[torch.Tensor], lr: float) -> None:
        c = self.cfg
        for p, g, buf, exempt in zip(self.params, grads, self.bufs, self.exempt):
            if exempt:
                buf.mul_(c.momentum).add_(g, alpha=lr)
            else:
                wn, gn = p.norm(), g.norm()
                local = torch.where((wn > 0) & (gn > 0), c.trust_coefficient * wn / (gn + c.weight_decay * wn + c.eps),
                                    torch.ones_like(wn))
                buf.mul_(c.momentum).add_(g.add(p, alpha=c.weight_decay) * (lr * local))
            p.sub_(buf)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10, help="timed interleaved rounds (at most)")
    add_budget_argument(ap, 60.0)
    args = ap.parse_args()
    budget = Budget(args.budget_s)
    say(header(describe()))
    cfg = OptimConfig(name="lars", lr=1.0, momentum=0.9, weight_decay=5e-5, eps=0.0)
    torch.manual_seed(0)
    model = ResNet()
    names = [n for n, _ in model.named_parameters()]
    exempt = [no_weight_decay(n) for n in names]
    start = [p.detach().clone() for p in model.parameters()]
    flat = FlatParams(model)
    grads = [torch.randn(p.shape, generator=torch.Generator().manual_seed(i)) * 1e-3 for i, p in enumerate(start)]
    flat_grad = flat.flatten(grads)
    lars = LARS(flat, cfg, decay_exempt=exempt)
    sgd_flat = FlatParams(ResNet())
    sgd = SGD(sgd_flat, OptimConfig(name="sgd", momentum=0.9, weight_decay=5e-5))
    ref_params = [p.clone() for p in start]
    ref = PerTensorLARS(ref_params, exempt, cfg)
    lr = 0.1
    lr_t = torch.tensor(lr)
    say(f"ResNet-50: {flat.numel / 1e6:.2f}M parameters in {flat.num_tensors} tensors "
        f"({sum(exempt)} exempt from decay and trust ratio); torch threads={torch.get_num_threads()}")

    def run_flat() -> None:
        flat.grads.copy_(flat_grad)
        lars.step(lr_t)

    def run_ref() -> None:
        ref.step(grads, lr)

    def run_sgd() -> None:
        sgd_flat.grads.copy_(flat_grad)
        sgd.step(lr_t)

    runs = {"flat LARS": run_flat, "per-tensor LARS": run_ref, "flat SGD": run_sgd}
    times: dict[str, list[float]] = {k: [] for k in runs}
    round_s = 0.0
    for step in range(args.steps + 1):
        if step > 1 and budget.left() < round_s:
            budget.skip(f"rounds {step}-{args.steps} of {args.steps} (one round needs ~{round_s:.1f} s)")
            break
        t_round = time.perf_counter()
        row = []
        for name, fn in runs.items():
            t0 = time.perf_counter()
            fn()
            dt = time.perf_counter() - t0
            row.append(dt)
            if step:  # round 0 warms up the allocator
                times[name].append(dt)
        round_s = time.perf_counter() - t_round
        if step:
            say(f"  round {step}: " + ", ".join(f"{k} {1000 * t:.1f} ms" for k, t in zip(runs, row)))
    diff = max(float((a.detach() - b).abs().max()) for a, b in zip(model.parameters(), ref_params))
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"{len(times['flat LARS'])} interleaved rounds each (median):")
    for name in runs:
        print(f"  {name:16s}: {1000 * med[name]:8.1f} ms/step")
    print(f"speedup per-tensor LARS / flat LARS = {med['per-tensor LARS'] / med['flat LARS']:.2f}x")
    print(f"cost of the trust ratios: flat LARS / flat SGD = {med['flat LARS'] / med['flat SGD']:.2f}x")
    print(f"max |flat - per-tensor| after {len(times['flat LARS']) + 1} steps: {diff:.2e}", flush=True)
    budget.done()


if __name__ == "__main__":
    main()
