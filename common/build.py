"""The builders of a run's parts, called once by the trainer in this order: the layout object, the
model (seeded, moved, precision/layout chosen, distributed, flattened, broadcast), then - on training
ranks - optimizer, data, schedule and step. The workload provides the pieces it owns (``build_model``,
``distribute``, its loaders and degrees) or inherits the defaults; the parts come back as one
:class:`RunParts` that the trainer, the evaluation ranks and the checkpoint manager share.
"""
from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from .auto import Choice, autocast_loss, choose_channels_last, choose_precision, has_conv_weights, probe_channels_last
from .checkpoint import recorded_settings
from .data.instance import agree, reader_group
from .dist import idle_barrier
from .errors import ConfigError, HpcbenchError
from .evaluator import Evaluator
from .flat import FlatParams
from .flat_optim import FlatOptimizer
from .optim import build_optimizer
from .parallel import Parallel
from .parts import DataPosition, DataState, RankWeights, RNGStreams, SharedWeights, Stateful, ToDevice
from .precision import Precision, module_to_channels_last
from .progress import Progress
from .runconfig import TrainConfig
from .schedule import Schedule
from .sharded import ShardedAdamW, ShardedModel, ShardedParams
from .step import TrainStep, prepare_batch
from .swa import WeightAverage
from .workload import DataShard, DataSizes, EpochLoader, Workload


@dataclass
class RunParts:
    """Everything a run is made of, built once. ``optimizer``/``schedule``/``step``/``train_loader`` are None
    on a dedicated evaluation rank."""

    parallel: Parallel
    model: nn.Module
    flat: FlatParams
    precision: Precision
    evaluator: Evaluator
    local_batch: int
    seed: int
    choices: list[Choice]
    sizes: DataSizes | None = None
    optimizer: FlatOptimizer | None = None
    schedule: Schedule | None = None
    step: TrainStep | None = None
    train_loader: EpochLoader | None = None
    position: DataPosition = field(default_factory=DataPosition)
    average: WeightAverage | None = None  # the evaluated weight average (optim.swa_decay > 0)
    data_state: DataState = field(default_factory=lambda: DataState({}))
    rng: RNGStreams = field(default_factory=RNGStreams)

    def checkpointed(self) -> tuple[dict[str, Stateful], dict[str, Stateful], dict[str, Stateful]]:
        """(replicated, per-rank, sharded) parts by name, for the checkpoint manager."""
        assert self.optimizer is not None, "evaluation ranks take no checkpoints"
        device = self.parallel.device
        if isinstance(self.flat, ShardedParams):  # the model and its optimizer as DTensors
            per: dict[str, Stateful] = {"precision": ToDevice(self.precision, device), "rng": self.rng,
                                        "data": self.data_state}
            return {"position": self.position}, per, {"model": ShardedModel(self.model),
                                                      "optimizer": self.optimizer}  # type: ignore[dict-item]
        replicated: dict[str, Stateful] = {"weights": SharedWeights(self.flat), "position": self.position}
        if self.average is not None:
            replicated["weight_average"] = self.average
        per_rank: dict[str, Stateful] = {
            "rank_weights": RankWeights(self.model, self.flat),
            "optimizer": ToDevice(self.optimizer, device),
            "precision": ToDevice(self.precision, device),
            "rng": self.rng,
            "data": self.data_state,
        }
        return replicated, per_rank, {}


def dataset_spec(workload: Workload) -> Any:  # noqa: ANN401
    """The workload's dataset spec, or None for a workload with its own loaders."""
    try:
        return workload.dataset()
    except HpcbenchError:
        return None


def node_local(workload: Workload) -> bool:
    """Whether each node holds only its part of the data (``data.node_local``, set by node-local staging)."""
    if not getattr(getattr(workload.cfg, "data", None), "node_local", False):
        return False
    spec = dataset_spec(workload)
    # every node was given the whole dataset: the instance's ranks split it once
    return not (spec is not None and spec.layout.whole_on_every_node)


def build_parallel(workload: Workload, env: Any) -> Parallel:  # noqa: ANN401
    """The instance's layout object from the workload's degrees and the harness's own keys. That the global
    batch splits over the training ranks is checked first, on every rank from the layout alone: a rank that
    stopped on it inside the collective set-up would leave the others with a transport error instead."""
    tc = workload.cfg.train
    degrees = dataclasses.replace(workload.parallel_degrees(), eval_ranks=tc.eval_ranks, bn_group=tc.bn_group_size)
    group = max(degrees.spatial, degrees.tensor_parallel)
    if 0 <= degrees.eval_ranks < env.layout.instance_size and min(degrees.spatial, degrees.tensor_parallel) >= 1 \
            and (env.layout.instance_size - degrees.eval_ranks) // group >= 1:  # else Parallel names the wrong degree
        _split_batch(workload, (env.layout.instance_size - degrees.eval_ranks) // group, bool(degrees.eval_ranks))
    return Parallel(env, degrees, node_local(workload))


def _split_batch(workload: Workload, dp: int, eval_split: bool) -> int:
    tc = workload.cfg.train
    rows = workload.loader_batch_size()
    if rows % dp:
        what = "data-parallel training ranks" if eval_split else "data-parallel ranks"
        per = "" if rows == tc.global_batch_size else f" ({rows} rows per step)"
        raise ConfigError(f"config key 'train.global_batch_size': {tc.global_batch_size}{per} does not split over "
                          f"the instance's {dp} {what}; use a multiple of {dp}")
    return rows // dp


def local_batch(workload: Workload, parallel: Parallel) -> int:
    """The per-rank batch: the global batch over the data-parallel training ranks."""
    return _split_batch(workload, parallel.train_dp_size, parallel.roles is not None)


def build_model(workload: Workload, parallel: Parallel, seed: int, batch: int, progress: Progress) -> tuple[nn.Module, FlatParams, list[Choice]]:
    """The model as this rank holds it, its flat parameters (rank 0's broadcast) and the hardware choices."""
    tc = workload.cfg.train
    torch.manual_seed(seed)
    model = workload.build_model()
    on_meta = any(p.is_meta for p in model.parameters())  # a sharded model that distribute() materialises
    if on_meta and not workload.shards_parameters:
        raise ConfigError(f"workload {workload.name}: build_model() returned parameters on the meta device, which "
                          "only a workload that shards its parameters (shards_parameters) may do")
    model = parallel.sync_batchnorm(model)
    if not on_meta:
        model = model.to(parallel.device)
    choices = choose_for_hardware(workload, model, parallel, batch, progress)
    if tc.channels_last:
        model = module_to_channels_last(model)
    model = workload.distribute(model, parallel)
    left = [n for n, p in model.named_parameters() if p.is_meta]
    if left:
        raise ConfigError(f"workload {workload.name}: distribute() left {len(left)} parameters on the meta device "
                          f"(first: {left[0]}); it must give them storage (to_empty) and initial values")
    if workload.shards_parameters:  # every rank built the same seeded model and kept its shards of it
        return model, ShardedParams(model, parallel.size), choices  # type: ignore[return-value]
    flat = FlatParams(model, workload.local_parameters(model), workload.sparse_parameters(model))
    parallel.broadcast_model(model, flat)
    return model, flat, choices


def parameter_count(workload: Workload, parts: RunParts) -> int:
    """Every parameter of the instance's model, each counted once: what every rank holds once, plus the
    model-parallel shards (``workload.local_parameters``) summed over the instance's training ranks. A
    collective over ``parts.parallel.comm`` (every training rank calls it)."""
    params = {id(p): p for p in parts.model.parameters()}
    local = {id(p) for p in workload.local_parameters(parts.model)}
    shared = sum(p.numel() for i, p in params.items() if i not in local)
    own = sum(p.numel() for i, p in params.items() if i in local)
    comm = parts.parallel.comm
    return shared + (int(comm.allreduce(own)) if comm is not None else own)


def choose_for_hardware(workload: Workload, model: nn.Module, parallel: Parallel, batch: int,
                        progress: Progress) -> list[Choice]:
    """Resolve ``train.precision``/``train.channels_last`` = "auto" (:mod:`hpcbench.common.auto`): rank 0 of
    the whole instance decides, the others take its choice, so the instance's ranks agree. The config
    then holds the resolved values and the dataset spec lays batches out accordingly."""
    tc, device = workload.cfg.train, parallel.device
    inst = parallel.instance_env
    choices = None
    if inst.layout.instance_rank == 0:  # a training rank, also with evaluation ranks
        # a resumed run takes the choices its checkpoint was trained with (a new timing probe on a busier box
        # could pick the other layout and the resumed epochs would not be the uninterrupted run's numbers)
        kept = recorded_settings(tc.checkpoint_dir, inst.layout.instance) if tc.resume and tc.checkpoint_dir else {}
        prec = (_kept_choice("train.precision", tc.precision, kept, lambda v: v in ("fp32", "bf16", "fp16"))
                or choose_precision(tc.precision, device))
        layout = _kept_choice("train.channels_last", tc.channels_last, kept, lambda v: isinstance(v, bool))
        if layout is None:
            probe = None
            if tc.channels_last == "auto" and device.type == "cpu" and has_conv_weights(model):
                probe = lambda: _probe_layouts(workload, model, prec.value, batch, device)  # noqa: E731
            layout = choose_channels_last(tc.channels_last, device, model, prec.value, probe)
        choices = [prec, layout]
    # the other ranks sleep while rank 0 probes: spinning in the broadcast (MPICH busy-polls) they would take
    # the cores the probe is timed on where the instance's ranks share a node
    idle_barrier(inst.instance_comm)
    choices = inst.instance_comm.bcast(choices, root=0)
    tc.precision, tc.channels_last = choices[0].value, choices[1].value
    spec = dataset_spec(workload)
    if spec is not None and hasattr(spec, "channels_last"):
        spec.channels_last = tc.channels_last
    if inst.layout.instance_rank == 0:
        for c in choices:
            if progress.lines:
                progress.say(c.describe())
            elif "WARNING" in c.reason and inst.layout.instance == 0:
                print(f"hpcbench: {c.describe()}", file=sys.stderr, flush=True)
    return choices


def resolved_settings(train: TrainConfig) -> dict[str, Any]:
    """The settings :func:`choose_for_hardware` resolved, as a checkpoint's manifest records them."""
    return {"train.precision": train.precision, "train.channels_last": train.channels_last}


def _kept_choice(key: str, requested: Any, kept: dict[str, Any], valid: Callable[[Any], bool]) -> Choice | None:
    """For a setting left at "auto", the value the checkpoint being resumed recorded under ``key`` (see
    :func:`resolved_settings`); None when the setting is explicit or nothing valid was recorded."""
    if requested != "auto" or not valid(kept.get(key)):
        return None
    return Choice(key, "auto", kept[key], "as the checkpoint it resumes from")


def _probe_layouts(workload: Workload, model: nn.Module, precision: str, batch: int,
                   device: torch.device) -> tuple[float, float]:
    """Time the model's forward + backward on one real training batch in both layouts."""
    spec = dataset_spec(workload)
    if spec is None:
        return (0.0, 0.0)  # nothing to measure on: the default layout is kept (gain 0)
    source = workload.source(spec.train_split)
    n = max(1, min(len(source), batch))
    sample = prepare_batch(spec.model_batch(source, n), device, False)
    loss = autocast_loss(lambda m, b: workload.loss(workload.forward(m, b), b), precision, device)
    return probe_channels_last(model, sample, loss)


def build_training(parts: RunParts, workload: Workload) -> None:
    """On a training rank: optimizer, data (loaders and sizes of the instance), schedule and step."""
    cfg, tc, par = workload.cfg, workload.cfg.train, parts.parallel
    torch.manual_seed(parts.seed * 1000 + par.rank)  # per-rank randomness (dropout) from here on
    exempt = [workload.no_weight_decay(n) for n in parts.flat.names]
    if isinstance(parts.flat, ShardedParams):
        parts.optimizer = ShardedAdamW(parts.flat, cfg.optim, exempt)  # type: ignore[assignment]
    else:
        parts.optimizer = build_optimizer(parts.flat, cfg.optim, par.size, par.rank, allow_apex=tc.precision != "fp16",
                                          decay_exempt=exempt)
    if not isinstance(parts.flat, ShardedParams):
        initial = workload.initial_optimizer_state(list(parts.flat.names))
        if initial is not None:
            parts.optimizer.load_initial(initial, f"workload '{workload.name}'")
    group = reader_group(par.env, node_local(workload))
    dp_rank, dp_size = par.reader_shard(group.rank, group.size)
    shard = DataShard(rank=dp_rank, size=dp_size, seed=parts.seed, local_batch_size=parts.local_batch,
                      device=par.device, host_ranks=par.env.layout.host_local_size)

    def loaders() -> tuple[Any, Any, tuple[int, int]]:
        return workload.train_loader(shard), workload.eval_loader(shard), workload.dataset_sizes()

    data = agree(par.env, group, loaders)
    parts.train_loader, parts.evaluator.loader = data.train, data.eval
    spec = dataset_spec(workload)
    parts.data_state = DataState({"train_loader": data.train,
                                  **({"train_split": workload.source(spec.train_split)} if spec is not None else {})})
    parts.sizes = workload.sizes = DataSizes(data.train_samples, data.eval_samples, data.steps_per_epoch,
                                             parts.local_batch)
    parts.schedule = Schedule.from_config(cfg.optim, data.steps_per_epoch, tc.max_epochs)
    parts.average = weight_average(parts, workload)
    parts.step = TrainStep(workload, parts.model, parts.flat, parts.optimizer, parts.schedule, parts.precision,
                           tc.graph, world=par.size, accum=tc.grad_accum, average=parts.average)


def weight_average(parts: RunParts, workload: Workload) -> WeightAverage | None:
    """The weight average the evaluations use (``optim.swa_decay`` > 0), or None."""
    decay = workload.cfg.optim.swa_decay
    if not decay:
        return None
    if isinstance(parts.flat, ShardedParams):
        raise ConfigError(f"config key 'optim.swa_decay': workload '{workload.name}' shards its parameters, which the "
                          "weight average does not cover; set it to 0")
    if workload.cfg.train.eval_ranks:
        raise ConfigError("config keys 'optim.swa_decay' and 'train.eval_ranks': dedicated evaluation ranks receive "
                          "the trained weights, not their average; set train.eval_ranks = 0 with a weight average")
    return WeightAverage(parts.flat, decay)


def build_eval_data(parts: RunParts, workload: Workload) -> None:
    """On an evaluation rank: its part of the validation split, in the training ranks' local batch."""
    par = parts.parallel
    shard = DataShard(rank=par.rank, size=par.size, seed=parts.seed, local_batch_size=parts.local_batch,
                      device=par.device, host_ranks=par.env.layout.host_local_size)
    parts.evaluator.loader = workload.eval_loader(shard)
    train, evaluate = workload.dataset_sizes()
    parts.sizes = workload.sizes = DataSizes(train, evaluate, 0, parts.local_batch)


def build_parts(workload: Workload, parallel: Parallel, progress: Progress) -> RunParts:
    """Every part of the run on this rank, on the layout object :func:`build_parallel` made (collective over
    the instance). On an evaluation rank the data is loaded later (:func:`build_eval_data`, by the
    evaluation side, which reports a failure to all)."""
    tc = workload.cfg.train
    batch = local_batch(workload, parallel)
    seed = tc.seed + parallel.instance_env.layout.instance
    model, flat, choices = build_model(workload, parallel, seed, batch, progress)
    precision = Precision(tc.precision, parallel.device, parallel.size)
    evaluator = Evaluator(workload, model, precision, parallel, bool(tc.channels_last))
    parts = RunParts(parallel, model, flat, precision, evaluator, batch, seed, choices)
    if not parallel.is_eval:
        build_training(parts, workload)
    return parts
