"""The mini preset's initial checkpoint, made by our code from the training chains (docs/openfold.md).

The closed benchmark fine-tunes the reference's pretrained AlphaFold; the ``mini`` preset does the same with a
checkpoint of its own small model: :func:`pretrain` trains the model a preset describes, from its seeded random
initialisation or from a start checkpoint's weights (fine-tuning the pinned one for other data), on the dataset's
training chains (the same weighted draws, crops and MSA sampling as a run,
under a seed of its own), and writes the reference's resumable layout (the weights' moving average and Adam's
state) that ``model.init_checkpoint`` loads (its sha256 is then logged as ``init_checkpoint_sha256sum``).
The validation targets are never trained on: :func:`evaluate`, and a :class:`StartGate`'s checks, only score
where the checkpoint starts a run.
``hpcbench datagen openfold --pretrain-steps N`` calls it after writing the data. On the data ``hpcbench run``
trains on by default the checkpoint is not made again: :mod:`.pinned` ships the one this made there once from
random weights, and for other data datagen ``--pinned-checkpoint`` fine-tunes that one.
"""
from __future__ import annotations

import io
import time
from collections.abc import Callable
from copy import deepcopy
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcbench.common.atomic import atomic_write
from hpcbench.common.errors import ConfigError, DistributedError
from hpcbench.common.system import usable_cores

from .config import OpenFoldConfig
from .spec import EvalChains, TrainChains

if TYPE_CHECKING:  # pragma: no cover
    from torch import nn

    from hpcbench.common.flat import FlatParams

    from .workload import OpenFoldWorkload

#: the file name ``configs/mini.toml`` loads (relative to data.root; the layout replicates ``*_checkpoint.pt``)
MINI_CHECKPOINT = "mini_pretrained_checkpoint.pt"


#: samples per pretraining step: the gradients of two draws averaged. On the mini's data the steps to a given
#: score fall ~1.7x against one sample per step (docs/openfold.md), and two processes compute the two
#: gradients at once where the host has two cores, so a step costs about what a one-sample step does.
PRETRAIN_BATCH = 2

#: the pretraining's learning rate: ``PRETRAIN_LR_FACTOR`` x the preset's ``optim.lr``, reached linearly over the
#: first ``PRETRAIN_WARMUP_STEPS`` steps, then constant (:func:`pretrain_lr`). On the mini's data this reaches a
#: given score in fewer steps than the preset's rate; without the warm-up a doubled rate stalled
#: (docs/openfold.md, learning curves in its results file).
PRETRAIN_LR_FACTOR = 2.0
PRETRAIN_WARMUP_STEPS = 150


#: the checkpoint holds the weights' exponential moving average (each step ``avg + (w - avg) x (1 - decay)``, the
#: first step's weights copied, as the run's own average), not the last weights: along one pretraining the last
#: weights' score swings by up to 0.15 between evaluations 100 steps apart, the average's by a few hundredths
#: (docs/openfold.md)
PRETRAIN_AVERAGE_DECAY = 0.99


def pretrain_lr(base: float, step: int) -> float:
    """The learning rate of pretraining step ``step`` (from 0) for the preset's rate ``base``."""
    return base * PRETRAIN_LR_FACTOR * min(1.0, (step + 1) / PRETRAIN_WARMUP_STEPS)


@dataclass(frozen=True)
class StartGate:
    """Where a pretraining stops: at the first check (step ``first``, then every ``every`` steps) where the
    weights' moving average, the checkpoint it would write, scores at least ``score`` avg lDDT-Ca on the
    validation targets; :func:`pretrain` raises if no check up to its step limit does. A run then starts from a
    checkpoint of a known quality on any machine, which a fixed step count does not give: the score after a
    given number of steps depends on the order of float sums (docs/openfold.md)."""
    score: float
    first: int = 1000
    every: int = 100

    def __post_init__(self) -> None:
        if not 0.0 < self.score <= 1.0 or self.first < 1 or self.every < 1:
            raise ConfigError(f"pretraining: a start gate needs 0 < score <= 1 and first/every >= 1, got {self}")

    def checks(self, step: int) -> bool:
        """Whether the gate is checked after ``step`` steps."""
        return step >= self.first and (step - self.first) % self.every == 0


@dataclass(frozen=True)
class PretrainResult:
    path: Path
    sha256: str
    steps: int
    batch: int  # samples per step
    processes: int
    seconds: float
    final_loss: float
    score: float | None = None  # the checkpoint's avg lDDT-Ca at the gate's last check (None: no gate)


class GateNotReached(ConfigError):
    """The pretraining reached its step limit with the weights' average below the start gate."""


def _workload(workload: "type[OpenFoldWorkload]", cfg: OpenFoldConfig, root: Path,
              start: Path | None = None) -> "OpenFoldWorkload":
    """``workload`` over a copy of ``cfg`` reading ``root``, its model from the seeded random initialisation or,
    with ``start``, from that checkpoint's weights (Adam's state in it is not used: the pretraining's Adam starts
    afresh, with its warm-up)."""
    cfg = deepcopy(cfg)
    cfg.data.root = str(root)
    cfg.model = replace(cfg.model, init_checkpoint=str(start) if start is not None else "",
                        init_checkpoint_sha256="", init_optimizer_state=False)
    return workload(cfg)


#: what :func:`pretrain` reports after each step: (step, the step's mean loss, the average's score at a gate check
#: or None)
Progress = Callable[[int, float, "float | None"], None]


def pretrain(workload: "type[OpenFoldWorkload]", cfg: OpenFoldConfig, root: Path, steps: int, seed: int, out: Path,
             progress: Progress | None = None, processes: int = 0, gate: StartGate | None = None,
             start: Path | None = None) -> PretrainResult:
    """Train ``cfg``'s model (built by ``workload``, the workload class that calls this) for ``steps`` steps of
    :data:`PRETRAIN_BATCH` samples on the training chains under ``root`` with ``cfg.optim``'s Adam (betas, epsilon,
    global-norm clipping; the learning rate of :func:`pretrain_lr`, from the preset's constant rate), starting
    from ``torch.manual_seed(seed)``; write the reference's resumable layout to ``out`` (write, read back,
    rename): ``iteration`` (the steps), ``alphafold_state_dict`` (the weights' moving average,
    :data:`PRETRAIN_AVERAGE_DECAY`) and ``optimizer_state_dict`` (Adam's step and moments, torch's layout, which
    a run continues from: ``model.init_optimizer_state``). ``processes``: how many processes share each step's
    samples (0: one per usable core, at most the batch); each is one torch thread, and more than one averages the
    gradients with a gloo all-reduce. The samples, their order and the mean are the same for any count.
    ``gate``: stop at its first check that the average passes, ``steps`` being the limit; :class:`GateNotReached`
    (nothing written) if none does. ``start``: begin from that checkpoint's weights instead of the random
    initialisation (fine-tuning a checkpoint of the same model for other data: the pinned one, :mod:`.pinned`)."""
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
    world = processes or min(PRETRAIN_BATCH, usable_cores())
    if world < 1 or PRETRAIN_BATCH % world:
        raise ConfigError(f"pretraining: {world} processes cannot share steps of {PRETRAIN_BATCH} samples evenly")
    t0 = time.perf_counter()
    if world == 1:
        done = _train(workload, cfg, root, steps, seed, 0, 1, progress, gate, start)
    else:
        done = _train_spawned(workload, cfg, root, steps, seed, world, progress, gate, start)
    if gate is not None and (done.score is None or done.score < gate.score):
        got = "was never checked" if done.score is None else f"scored avg lDDT-Ca {done.score:.3f}"
        raise GateNotReached(
            f"pretraining: after {done.steps} steps (the limit) the weights' average {got} on the validation "
            f"targets, below the start gate {gate.score} (checked from step {gate.first} every {gate.every}); "
            f"nothing was written to {out}. Allow more steps, or lower the gate")
    state = done.state

    with torch.device("meta"):
        meta_model = _workload(workload, cfg, root).build_model()
        names, n_params = set(meta_model.state_dict()), len(list(meta_model.parameters()))

    def verify(tmp: Path) -> None:
        back = torch.load(tmp, map_location="cpu", weights_only=True)
        if set(back.get("alphafold_state_dict", {})) != names or \
                len(back.get("optimizer_state_dict", {}).get("state", {})) != n_params:
            raise ConfigError(f"{tmp}: the written checkpoint does not hold the model's state dict and Adam state")

    with atomic_write(out, "wb", verify=verify) as fh:
        fh.write(state)
    return PretrainResult(out, hashlib.sha256(state).hexdigest(), done.steps, PRETRAIN_BATCH, world,
                          time.perf_counter() - t0, done.loss, done.score)


@dataclass(frozen=True)
class _Trained:
    state: bytes  # the resumable checkpoint (torch.save bytes; rank 0 only, b"" elsewhere)
    loss: float  # the last step's mean loss
    steps: int  # steps taken
    score: float | None  # the average's avg lDDT-Ca at the last gate check (rank 0; None: never checked)


def score(wl: "OpenFoldWorkload", model: "nn.Module", source: EvalChains) -> float:
    """The average lDDT-Ca of ``model`` over the validation targets ``source`` (eval mode, no gradients; the
    model's mode is restored)."""
    import torch

    was_training = model.training
    model.eval()
    total = {"lddt_ca": 0.0, "samples": 0.0}
    try:
        with torch.no_grad():
            for i in range(len(source)):
                batch = wl.dataset().collate([source[i]])
                for k, v in wl.eval_sums(model(batch), batch).items():
                    total[k] += float(v)
    finally:
        model.train(was_training)
    return wl.metric(total)


def _train(workload: "type[OpenFoldWorkload]", cfg: OpenFoldConfig, root: Path, steps: int, seed: int, rank: int,
           world: int, progress: Progress | None, gate: StartGate | None, start: Path | None = None) -> _Trained:
    """The training loop of one of ``world`` processes (an initialised gloo group when more than one): step k's
    samples are draws k * B ... k * B + B - 1 of the training chains (epoch = draw // chains), rank r computes
    the loss of its B / world of them divided by B, and the summed gradients are the batch's mean. At the
    ``gate``'s checks rank 0 scores the weights' average on the validation targets and tells the others whether
    to stop (a broadcast). Rank 0 returns the resumable checkpoint as ``torch.save`` bytes; the others, whose
    weights are the same, keep no average and return none."""
    import torch
    import torch.distributed as dist

    from hpcbench.common.flat import FlatParams

    o = cfg.optim
    wl = _workload(workload, cfg, root, start)
    source = wl.dataset().open(root, wl.dataset().train_split)
    assert isinstance(source, TrainChains)
    source.seed = seed
    torch.manual_seed(seed)
    model = wl.build_model()
    model.train()
    # the parameters and their gradients as views into two flat buffers (the harness's FlatParams): one
    # all-reduce, one norm and one fused Adam kernel over the whole model per step instead of a loop over its
    # ~430 tensors (Adam is elementwise and the buffers' alignment gaps hold zeros, so the update is the same)
    flat = FlatParams(model)
    weights = flat.params
    weights.grad = flat.grads
    adam = dict(lr=o.lr, betas=tuple(o.betas), eps=o.eps, weight_decay=o.weight_decay)
    try:
        opt = torch.optim.Adam([weights], fused=True, **adam)
    except RuntimeError:  # a torch build without a fused CPU Adam
        opt = torch.optim.Adam([weights], foreach=True, **adam)
    per, n = PRETRAIN_BATCH // world, len(source)
    targets = wl.dataset().open(root, wl.dataset().eval_split) if gate is not None and rank == 0 else None
    loss_value, last_score, taken = float("nan"), None, 0
    average: torch.Tensor | None = None  # of the flat weights (PRETRAIN_AVERAGE_DECAY), kept by rank 0
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = pretrain_lr(o.lr, step)
        flat.zero_grad()
        local = torch.zeros(())
        for j in range(rank * per, (rank + 1) * per):
            draw = step * PRETRAIN_BATCH + j
            source.epoch = draw // n
            batch = wl.dataset().collate([source[draw % n]])
            loss = wl.loss(model(batch), batch) / PRETRAIN_BATCH
            loss.backward()
            local += loss.detach()
        flat.check_grads()
        if world > 1:  # the batch's mean gradient and loss: sums of the ranks' shares
            dist.all_reduce(flat.grads)
            dist.all_reduce(local)
        if o.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_([weights], o.max_grad_norm)
        opt.step()
        if rank == 0:  # it writes the checkpoint (the ranks hold the same weights)
            average = weights.detach().clone() if average is None else \
                average.lerp_(weights, 1.0 - PRETRAIN_AVERAGE_DECAY)
        loss_value, taken, checked = float(local), step + 1, None
        if gate is not None and gate.checks(taken):
            stop = torch.zeros((), dtype=torch.int32)
            if rank == 0:
                assert average is not None and isinstance(targets, EvalChains)
                with torch.no_grad():
                    last = weights.detach().clone()
                    weights.copy_(average)  # score what the checkpoint would hold
                    checked = last_score = score(wl, model, targets)
                    weights.copy_(last)
                stop.fill_(int(checked >= gate.score))
            if world > 1:
                dist.broadcast(stop, 0)
            if progress is not None:
                progress(taken, loss_value, checked)
            if int(stop):
                break
        elif progress is not None:
            progress(taken, loss_value, None)
    if rank != 0:
        return _Trained(b"", loss_value, taken, None)
    if average is not None:
        with torch.no_grad():
            weights.copy_(average)  # the model's parameters are views into ``weights``
    buf = io.BytesIO()
    weights_sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    torch.save({"iteration": taken, "alphafold_state_dict": weights_sd,
                "optimizer_state_dict": _adam_state_dict(opt, weights, flat)}, buf)
    return _Trained(buf.getvalue(), loss_value, taken, last_score)


def _adam_state_dict(opt: "torch.optim.Optimizer", weights: "torch.Tensor", flat: "FlatParams") -> dict[str, Any]:
    """The Adam over the flat buffer as torch's ``optimizer.state_dict()`` of an Adam over
    ``model.parameters()`` in one group (the reference's resumable layout): per parameter index its step and
    moments, shaped like the parameter."""
    st = opt.state[weights]
    moments = {k: flat.unflatten(st[k]) for k in ("exp_avg", "exp_avg_sq")}
    state = {i: {"step": st["step"].detach().clone(), **{k: v[i].detach().clone() for k, v in moments.items()}}
             for i in range(flat.num_tensors)}
    group = {k: v for k, v in opt.param_groups[0].items() if k != "params"}
    group["params"] = list(range(flat.num_tensors))
    return {"state": state, "param_groups": [group]}


def _train_spawned(workload: "type[OpenFoldWorkload]", cfg: OpenFoldConfig, root: Path, steps: int, seed: int,
                   world: int, progress: Progress | None, gate: StartGate | None, start: Path | None) -> _Trained:
    """:func:`_train` in ``world`` spawned processes (gloo over a file store in a temporary folder). Rank 0
    reports each step's loss and at the end the state dict through a queue; a process that fails ends the
    others (torch's ProcessContext) and its error is raised here as a DistributedError (the CLI prints it
    without a traceback), and a rank left waiting in the all-reduce gives up after the group's timeout, so
    nothing hangs."""
    import queue as queue_mod
    import tempfile

    import torch.multiprocessing as tmp

    ctx = tmp.get_context("spawn")
    messages = ctx.Queue()
    result: list[_Trained] = []
    with tempfile.TemporaryDirectory(prefix="hpcbench-pretrain-") as store:
        procs = tmp.start_processes(_rank_main, args=(workload, cfg, root, steps, seed, world, gate, start,
                                                      str(Path(store) / "store"), messages),
                                    nprocs=world, join=False, start_method="spawn")

        def drain() -> None:
            while True:
                try:
                    kind, *payload = messages.get_nowait()
                except queue_mod.Empty:
                    return
                if kind == "step" and progress is not None:
                    progress(*payload)
                elif kind == "done":
                    result.append(payload[0])

        try:
            while not procs.join(timeout=0.2):
                drain()
        except tmp.ProcessRaisedException as exc:
            raise DistributedError(f"pretraining: a process failed: {str(exc).strip().splitlines()[-1]}") from None
        except tmp.ProcessExitedException as exc:
            raise DistributedError(f"pretraining: a process ended without finishing ({exc})") from None
        finally:  # also on Ctrl-C here: no process is left training on its own
            for proc in procs.processes:
                if proc.is_alive():
                    proc.terminate()
        deadline = time.monotonic() + 30
        while not result and time.monotonic() < deadline:
            drain()
            time.sleep(0.05)
    if not result:
        raise DistributedError("pretraining: the processes ended but rank 0 sent no checkpoint")
    return result[0]


def _rank_main(rank: int, workload: "type[OpenFoldWorkload]", cfg: OpenFoldConfig, root: Path, steps: int, seed: int,
               world: int, gate: StartGate | None, start: Path | None, store: str, messages: Any) -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world,
                            timeout=timedelta(seconds=300))
    try:
        report = (lambda step, loss, checked: messages.put(("step", step, loss, checked))) if rank == 0 else None
        done = _train(workload, cfg, root, steps, seed, rank, world, report, gate, start)
        if rank == 0:
            messages.put(("done", done))
    finally:
        dist.destroy_process_group()


def evaluate(workload: "type[OpenFoldWorkload]", cfg: OpenFoldConfig, root: Path, checkpoint: Path) -> float:
    """The average lDDT-Ca over the validation targets of the weights in ``checkpoint`` (what a run starting
    from it measures before its first step)."""
    from .model.checkpoint import load_initial_checkpoint

    wl = _workload(workload, cfg, root)
    source = wl.dataset().open(root, wl.dataset().eval_split)
    assert isinstance(source, EvalChains)
    model: nn.Module = wl.build_model()
    load_initial_checkpoint(checkpoint, model)
    return score(wl, model, source)
