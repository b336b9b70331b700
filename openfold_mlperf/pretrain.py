"""The mini preset's initial checkpoint, made by our code from the training chains (docs/openfold.md).

The closed benchmark fine-tunes the reference's pretrained AlphaFold; the ``mini`` preset does the same with a
checkpoint of its own small model: :func:`pretrain` trains the model a preset describes, from its seeded random
initialisation, on the dataset's training chains (the same weighted draws, crops and MSA sampling as a run,
under a seed of its own), and writes the weights as a bare state dict that ``model.init_checkpoint`` loads
(its sha256 is then logged as ``init_checkpoint_sha256sum``). The validation targets are never trained on:
:func:`evaluate` only measures where the checkpoint starts a run. ``hpcbench datagen openfold
--pretrain-steps N`` calls it after writing the data.
"""
from __future__ import annotations

import io
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from hpcbench.common.atomic import atomic_write
from hpcbench.common.errors import ConfigError

from .config import OpenFoldConfig
from .spec import EvalChains, TrainChains

if TYPE_CHECKING:  # pragma: no cover
    from torch import nn

    from .workload import OpenFoldWorkload

#: the file name ``configs/mini.toml`` loads (relative to data.root; the layout replicates ``*_checkpoint.pt``)
MINI_CHECKPOINT = "mini_pretrained_checkpoint.pt"


@dataclass(frozen=True)
class PretrainResult:
    path: Path
    sha256: str
    steps: int
    seconds: float
    final_loss: float


def _workload(workload: "type[OpenFoldWorkload]", cfg: OpenFoldConfig, root: Path) -> "OpenFoldWorkload":
    cfg.data.root = str(root)
    cfg.model = replace(cfg.model, init_checkpoint="", init_checkpoint_sha256="")  # from the seeded random init
    return workload(cfg)


def pretrain(workload: "type[OpenFoldWorkload]", cfg: OpenFoldConfig, root: Path, steps: int, seed: int, out: Path,
             progress: Callable[[int, float], None] | None = None) -> PretrainResult:
    """Train ``cfg``'s model (built by ``workload``, the workload class that calls this) for ``steps`` samples (batch 1) on the training chains under ``root`` with
    ``cfg.optim``'s Adam (constant learning rate, betas, epsilon, global-norm clipping), starting from
    ``torch.manual_seed(seed)``; write its state dict to ``out`` (write, read back, rename)."""
    import hashlib

    import torch

    if steps < 1:
        raise ConfigError(f"pretraining: steps must be >= 1, got {steps}")
    o = cfg.optim
    if o.name != "adam":
        raise ConfigError(f"pretraining: config key 'optim.name' must be 'adam' (the preset's optimizer), got {o.name!r}")
    if o.schedule != "constant":
        raise ConfigError(f"pretraining: config key 'optim.schedule' must be 'constant' (pretraining steps at the "
                          f"preset's learning rate), got {o.schedule!r}")
    wl = _workload(workload, cfg, root)
    source = wl.dataset().open(root, wl.dataset().train_split)
    assert isinstance(source, TrainChains)
    source.seed = seed
    torch.manual_seed(seed)
    model = wl.build_model()
    model.train()
    # one fused kernel per step (torch's default on a CPU is a Python loop over the ~430 tensors: 10 ms of
    # a ~110 ms step); torch builds without a fused CPU Adam take the multi-tensor one
    adam = dict(lr=o.lr, betas=tuple(o.betas), eps=o.eps, weight_decay=o.weight_decay)
    try:
        opt = torch.optim.Adam(model.parameters(), fused=True, **adam)
    except RuntimeError:
        opt = torch.optim.Adam(model.parameters(), foreach=True, **adam)
    t0, step, loss_value = time.perf_counter(), 0, float("nan")
    while step < steps:
        for i in range(len(source)):
            batch = wl.dataset().collate([source[i]])
            loss = wl.loss(model(batch), batch)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if o.max_grad_norm > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), o.max_grad_norm, foreach=True)
            opt.step()
            step += 1
            loss_value = float(loss.detach())
            if progress is not None:
                progress(step, loss_value)
            if step == steps:
                break
        source.epoch += 1
    buf = io.BytesIO()
    torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, buf)
    data = buf.getvalue()

    def verify(tmp: Path) -> None:
        back = torch.load(tmp, map_location="cpu", weights_only=True)
        if set(back) != set(model.state_dict()):
            raise ConfigError(f"{tmp}: the written checkpoint does not hold the model's state dict")

    with atomic_write(out, "wb", verify=verify) as fh:
        fh.write(data)
    return PretrainResult(out, hashlib.sha256(data).hexdigest(), step, time.perf_counter() - t0, loss_value)


def evaluate(workload: "type[OpenFoldWorkload]", cfg: OpenFoldConfig, root: Path, checkpoint: Path) -> float:
    """The average lDDT-Ca over the validation targets of the weights in ``checkpoint`` (what a run starting
    from it measures before its first step)."""
    import torch

    from .model.checkpoint import load_initial_checkpoint

    wl = _workload(workload, cfg, root)
    source = wl.dataset().open(root, wl.dataset().eval_split)
    assert isinstance(source, EvalChains)
    model: nn.Module = wl.build_model()
    load_initial_checkpoint(checkpoint, model)
    model.eval()
    total = {"lddt_ca": 0.0, "samples": 0.0}
    with torch.no_grad():
        for i in range(len(source)):
            batch = wl.dataset().collate([source[i]])
            for k, v in wl.eval_sums(model(batch), batch).items():
                total[k] += float(v)
    return wl.metric(total)
