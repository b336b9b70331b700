"""CUDA-graph replay vs eager on the toy workload (needs a GPU; used by a test and a benchmark).

Two copies of the same model train on the same batches, one with ``TrainStep(mode="eager")``, one
with ``mode="cuda_graph"``; after every step the parameters and losses are compared, and the mean
step times of both are measured (interleaved, so contention hits both alike).
"""
from __future__ import annotations

import time
from typing import Any

import torch

from common.flat import FlatParams
from common.optim import build_optimizer
from common.precision import Precision
from common.schedule import Schedule
from common.step import TrainStep
from tests.harness_toy import ToyWorkload


def _stepper(workload: ToyWorkload, mode: str, device: torch.device) -> tuple[TrainStep, FlatParams]:
    torch.manual_seed(0)
    model = workload.build_model().to(device)
    flat = FlatParams(model)
    cfg = workload.cfg
    opt = build_optimizer(flat, cfg.optim)
    schedule = Schedule.from_config(cfg.optim, steps_per_epoch=10, max_epochs=cfg.train.max_epochs)
    return TrainStep(workload, model, flat, opt, schedule, Precision(cfg.train.precision, device), mode), flat


def compare(steps: int = 20, overrides: tuple[str, ...] = (), batch: int = 64) -> dict[str, Any]:
    device = torch.device("cuda")
    workload = ToyWorkload(ToyWorkload.load_config("mini", ["optim.name=lamb", "optim.weight_decay=0.01",
                                                            "optim.max_grad_norm=1.0", *overrides]))
    eager, flat_e = _stepper(workload, "eager", device)
    graph, flat_g = _stepper(workload, "cuda_graph", device)
    g = torch.Generator().manual_seed(5)
    feats = workload.cfg.data.features
    max_diff = loss_diff = 0.0
    times = {"eager": 0.0, "cuda_graph": 0.0}
    for i in range(steps):
        b = {"x": torch.randn(batch, feats, generator=g).to(device), "y": torch.rand(batch, 4, generator=g).to(device)}
        for name, fn in (("eager", eager), ("cuda_graph", graph)):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            loss = fn(b)
            torch.cuda.synchronize()
            if i >= 3:  # the graph's first call includes warm-up and capture
                times[name] += time.perf_counter() - t0
            if name == "eager":
                loss_e = loss
            else:
                loss_diff = max(loss_diff, (loss - loss_e).abs().item())
        max_diff = max(max_diff, (flat_e.params - flat_g.params).abs().max().item())
    n = max(1, steps - 3)
    return {"steps": steps, "max_diff": max_diff, "loss_diff": loss_diff,
            "eager_step_ms": 1000 * times["eager"] / n, "graph_step_ms": 1000 * times["cuda_graph"] / n}
