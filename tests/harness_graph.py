"""CUDA-graph replay vs eager (needs a GPU; used by tests and a benchmark).

Two copies of the same model train on the same batches, one with ``TrainStep(mode="eager")``, one
with ``mode="cuda_graph"``; after every step the parameters and losses are compared, and the mean
step times of both are measured (interleaved, so contention hits both alike). :func:`compare` runs
the toy workload on random batches; :func:`compare_workload` a registered static-shape workload on
batches read from real files by its dataset spec (collated on the host, copied, then transformed
on the device, as the loader does on a GPU) with the harness's model set-up (channels-last).
"""
from __future__ import annotations

import time
from typing import Any

import torch

from hpcbench.common.flat import FlatParams
from hpcbench.common.optim import build_optimizer
from hpcbench.common.precision import Precision
from hpcbench.common.schedule import Schedule
from hpcbench.common.precision import module_to_channels_last
from hpcbench.common.step import TrainStep, prepare_batch
from tests.harness_toy import ToyWorkload


def stepper(workload: Any, mode: str, device: torch.device) -> tuple[TrainStep, FlatParams]:
    """The harness's step for ``workload`` on ``device``. ``auto`` precision/channels-last are resolved
    as the trainer does (channels-last on a CPU without the timing probe: off) and written back to
    ``workload.cfg.train``, so that callers lay out their batches to match."""
    from hpcbench.common.auto import choose_channels_last, choose_precision

    torch.manual_seed(0)
    cfg = workload.cfg
    model = workload.build_model().to(device)
    cfg.train.precision = choose_precision(cfg.train.precision, device).value
    cfg.train.channels_last = choose_channels_last(cfg.train.channels_last, device, model, cfg.train.precision,
                                                   None).value
    if cfg.train.channels_last:
        model = module_to_channels_last(model)
    flat = FlatParams(model)
    opt = build_optimizer(flat, cfg.optim)
    schedule = Schedule.from_config(cfg.optim, steps_per_epoch=10, max_epochs=cfg.train.max_epochs)
    return TrainStep(workload, model, flat, opt, schedule, Precision(cfg.train.precision, device), mode), flat


def compare(steps: int = 20, overrides: tuple[str, ...] = (), batch: int = 64) -> dict[str, Any]:
    device = torch.device("cuda")
    workload = ToyWorkload(ToyWorkload.load_config("mini", ["optim.name=lamb", "optim.weight_decay=0.01",
                                                            "optim.max_grad_norm=1.0", *overrides]))
    steppers = [stepper(workload, mode, device) for mode in ("eager", "cuda_graph")]
    g = torch.Generator().manual_seed(5)
    feats = workload.cfg.data.features
    batches = [{"x": torch.randn(batch, feats, generator=g).to(device), "y": torch.rand(batch, 4, generator=g).to(device)}
               for _ in range(steps)]
    return _interleave(steppers, batches, warm=3)  # the graph's first call includes warm-up and capture


def _interleave(steppers: list[tuple[TrainStep, FlatParams]], batches: list[Any], warm: int) -> dict[str, Any]:
    """Both steppers (reference first) on each batch in turn: max parameter and loss differences,
    mean step times (``eager_step_ms`` is the first's, ``graph_step_ms`` the second's)."""
    (_, ref_flat), (_, other_flat) = steppers
    sync = torch.cuda.synchronize if ref_flat.device.type == "cuda" else (lambda: None)
    max_diff = loss_diff = loss_scale = 0.0
    times = [0.0, 0.0]
    for i, b in enumerate(batches):
        losses = []
        for k, (fn, _) in enumerate(steppers):
            sync()
            t0 = time.perf_counter()
            losses.append(fn(b))
            sync()
            if i >= warm:
                times[k] += time.perf_counter() - t0
        loss_diff = max(loss_diff, (losses[0] - losses[1]).abs().item())
        loss_scale = max(loss_scale, losses[0].abs().item())
        max_diff = max(max_diff, (ref_flat.params - other_flat.params).abs().max().item())
    n = max(1, len(batches) - warm)
    return {"steps": len(batches), "max_diff": max_diff, "loss_diff": loss_diff, "loss_scale": loss_scale,
            "param_scale": ref_flat.params.abs().max().item(),
            "eager_step_ms": 1000 * times[0] / n, "graph_step_ms": 1000 * times[1] / n}


def compare_workload(name: str, root: str, steps: int = 6, overrides: tuple[str, ...] = (),
                     config: str = "mini", device: str = "cuda",
                     modes: tuple[str, str] = ("eager", "cuda_graph")) -> dict[str, Any]:
    """Training steps of workload ``name`` in ``modes[0]`` vs ``modes[1]`` (default: eager vs CUDA
    graph) on ``steps`` batches of the training files under ``root`` (cycling through them)."""
    from hpcbench import registry

    dev = torch.device(device)
    cls = registry.get(name)
    workload = cls(cls.load_config(config, [f"data.root={root}", *overrides]))
    if not getattr(workload, "static_shapes", True):
        raise ValueError(f"workload {name!r} has dynamic shapes: CUDA graphs do not apply")
    spec = workload.dataset()
    source = spec.open(workload.data_root(), spec.train_split)
    bs = workload.cfg.train.global_batch_size
    batches = []
    for s in range(steps):
        host = spec.collate([source[(s * bs + j) % len(source)] for j in range(bs)])
        batches.append(spec.transform(prepare_batch(host, dev, channels_last=False)))
    steppers = [stepper(workload, mode, dev) for mode in modes]
    return _interleave(steppers, batches, warm=1)
