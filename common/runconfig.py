"""The config sections every workload shares: optimizer/schedule and training loop settings.

A workload's config class subclasses :class:`RunConfig` and adds its own ``data`` and ``model``
sections; presets live in ``<workload>/configs/{mini,full}.toml``.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from .errors import ConfigError


#: the largest train.seed: instances add their index (and ranks derive seeds from it); numpy seeds are 32-bit
MAX_SEED = 2**31 - 1


@dataclass
class OptimConfig:
    name: Literal["sgd", "lamb", "lars", "adamw", "adam", "adagrad"] = "sgd"
    lr: float = 0.001  # base (peak) learning rate, reached at the end of warmup
    momentum: float = 0.9  # sgd, lars
    # sgd: "torch" (v = m v + g, p -= lr v) or "keras" (v = m v + lr g, p -= v: the rate inside the velocity,
    # as Keras' SGD, the CosmoFlow reference's optimizer); the two differ in the steps after the rate changes
    momentum_form: Literal["torch", "keras"] = "torch"
    nesterov: bool = False  # sgd, lars
    trust_coefficient: float = 0.001  # lars: eta of the per-tensor trust ratio (MLPerf ResNet: 0.001)
    betas: tuple[float, ...] = (0.9, 0.999)  # adam/adamw/lamb
    eps: float = 1e-8  # adam/adamw/lamb; lars: epsilon of the trust ratio (MLPerf ResNet closed: 0)
    weight_decay: float = 0.0
    # sgd: "torch" (the gradient gains weight_decay x p, torch's L2) or "keras_l2" (it gains 2 x weight_decay x p:
    # the gradient of the weight_decay x sum(p^2) that Keras' regularizers.l2(weight_decay) adds to the loss,
    # the CosmoFlow reference's model.l2, logged as opt_weight_decay); the workload says which tensors decay
    weight_decay_form: Literal["torch", "keras_l2"] = "torch"
    lr_decay: float = 0.0  # adagrad: lr / (1 + (step - 1) * lr_decay)
    initial_accumulator: float = 0.0  # adagrad: starting value of the squared-gradient sum
    bias_correction: bool = True  # lamb
    grad_averaging: bool = True  # lamb
    max_grad_norm: float = 0.0  # clip by global norm; 0 disables (adam/adamw: torch's clip_grad_norm_)
    # > 0: evaluate on an exponential moving average of the weights with this decay, updated after every
    # step (the MLPerf HPC OpenFold reference's "SWA", decay 0.9; common/swa.py); 0: the trained weights
    swa_decay: float = 0.0
    distributed: bool = False  # lamb: shard optimizer state across the instance's ranks
    apex: bool = False  # lamb: NVIDIA apex's fused kernel where importable on CUDA (not with fp16)
    # schedule, in epochs or steps (``unit``)
    schedule: Literal["constant", "multistep", "cosine", "poly"] = "constant"
    unit: Literal["epochs", "steps"] = "epochs"
    warmup: float = 0.0  # length of linear warmup in ``unit``
    warmup_factor: float = 1.0  # lr at warmup start = lr * warmup_factor / ... see schedule docs
    # the per-step warmup's shape (common/schedule.py): "harness" (from warmup_factor), "nemo" (NeMo's
    # lr (s + 1) / (W + 1), peak at step W: the Llama 3.1 8B reference) or "linspace" (the W rates of
    # torch.linspace(warmup_start_lr, lr, W): the OpenFold reference) or "zero_start" (lr (s - warmup_start) / W
    # from rate 0, then the schedule at the global step: TF BERT's, the MLPerf BERT reference)
    warmup_style: Literal["harness", "nemo", "linspace", "zero_start"] = "harness"
    # zero_start: the step (in ``unit``, may be negative) the warmup counts from (the BERT reference's
    # start_warmup_step); the decay after the warmup is not shifted by it
    warmup_start: float = 0.0
    milestones: tuple[float, ...] = ()  # multistep boundaries in ``unit``
    decay_factor: float = 0.1  # multistep multiplier per boundary (cumulative: decay_factor ** boundaries passed)
    # multistep: absolute factors of the peak lr, one per milestone (the rate after milestone i is
    # lr * decay_factors[i], not a product; the reference CosmoFlow's decay_schedule); replaces decay_factor
    decay_factors: tuple[float, ...] = ()
    # the rate is set once per epoch from its 0-based index e, as a Keras LearningRateScheduler callback
    # (the reference CosmoFlow's) computes it: warmup at e, a milestone m passed when m < e; common/schedule.py
    lr_per_epoch: bool = False
    # the warmup's absolute start rate instead of lr / warmup_factor (0: warmup_factor decides): lr_per_epoch's
    # as the reference 3D U-Net's lr_warmup (runtime/training.py; its init_learning_rate, 1e-4), or the
    # linspace warmup's first rate (the OpenFold reference's warmup_lr_init, 1e-5, logged as
    # opt_learning_rate_warmup_init)
    warmup_start_lr: float = 0.0
    # lr_per_epoch warmup: the number the first epoch counts as, 0 (a Keras callback's 0-based index: the first
    # epoch runs at the start rate) or 1 (the U-Net reference's 1-based epoch loop: the first epoch runs at
    # start + (lr - start) / W and epoch W at lr)
    warmup_first_epoch: int = 0
    min_lr: float = 0.0  # cosine floor
    total: float = 0.0  # cosine/poly length in ``unit`` (0: the run's max length)
    power: float = 1.0  # poly: exponent of the polynomial decay (BERT: 1, linear; ResNet: 2)
    # poly: decay over the T - warmup steps after the warmup (MLPerf ResNet) instead of over T from
    # step 0 (the reference BERT); common/schedule.py
    poly_from_warmup: bool = False
    # whose per-step rates the multistep/cosine schedule reproduces (common/schedule.py): "harness" (the rules
    # above) or "held_warmup" (the MLPerf HPC DeepCAM reference's MultiStepLRWarmup / CosineAnnealingLRWarmup as its
    # train.py builds them: warmup lr (s + 1) / W that holds its last rate, milestones after the warmup)
    schedule_semantics: Literal["harness", "held_warmup"] = "harness"

    def validate(self) -> None:
        if self.lr < 0:
            raise ConfigError(f"config key 'optim.lr': must be >= 0, got {self.lr}")
        for key, ok, want in (
                ("warmup", self.warmup >= 0, ">= 0"), ("warmup_factor", self.warmup_factor >= 0, ">= 0"),
                ("momentum", 0 <= self.momentum < 1, "in [0, 1)"), ("weight_decay", self.weight_decay >= 0, ">= 0"),
                ("eps", self.eps >= 0, ">= 0"), ("total", self.total >= 0, ">= 0 (0: the run's length)"),
                ("power", self.power > 0, "> 0"), ("min_lr", self.min_lr >= 0, ">= 0"),
                ("decay_factor", self.decay_factor >= 0, ">= 0"), ("lr_decay", self.lr_decay >= 0, ">= 0"),
                ("initial_accumulator", self.initial_accumulator >= 0, ">= 0"),
                ("milestones", all(m >= 0 for m in self.milestones), "all >= 0")):
            if not ok:
                raise ConfigError(f"config key 'optim.{key}': must be {want}, got {getattr(self, key)!r}")
        if any(not 0 <= b < 1 for b in self.betas):
            raise ConfigError(f"config key 'optim.betas': each must be in [0, 1), got {list(self.betas)}")
        if self.schedule in ("cosine", "poly") and self.min_lr > self.lr:
            raise ConfigError(f"config key 'optim.min_lr': the {self.schedule} schedule decays from optim.lr "
                              f"({self.lr:g}) down to it; got {self.min_lr:g}, above it")
        if not 0.0 <= self.swa_decay < 1.0:
            raise ConfigError(f"config key 'optim.swa_decay': must be in [0, 1) (0: no weight average), got {self.swa_decay}")
        if self.max_grad_norm < 0:
            raise ConfigError(f"config key 'optim.max_grad_norm': must be >= 0 (0: no clipping), got {self.max_grad_norm}")
        if self.trust_coefficient <= 0:
            raise ConfigError(f"config key 'optim.trust_coefficient': must be > 0, got {self.trust_coefficient}")
        if len(self.betas) != 2:
            raise ConfigError(f"config key 'optim.betas': expected 2 values, got {list(self.betas)}")
        if list(self.milestones) != sorted(self.milestones):
            raise ConfigError(f"config key 'optim.milestones': must be increasing, got {list(self.milestones)}")
        if self.decay_factors:
            if self.schedule != "multistep":
                raise ConfigError(f"config key 'optim.decay_factors': applies to the multistep schedule only, got "
                                  f"schedule {self.schedule!r}")
            if len(self.decay_factors) != len(self.milestones):
                raise ConfigError(f"config key 'optim.decay_factors': one factor per milestone, got "
                                  f"{len(self.decay_factors)} for {len(self.milestones)} milestone(s) "
                                  f"{list(self.milestones)}")
            if any(not f > 0 for f in self.decay_factors):
                raise ConfigError(f"config key 'optim.decay_factors': factors of the peak lr must be > 0, got "
                                  f"{list(self.decay_factors)}")
        if self.warmup_start_lr < 0:
            raise ConfigError(f"config key 'optim.warmup_start_lr': must be >= 0 (0: from warmup_factor), got "
                              f"{self.warmup_start_lr}")
        if self.warmup_first_epoch not in (0, 1):
            raise ConfigError(f"config key 'optim.warmup_first_epoch': must be 0 or 1, got {self.warmup_first_epoch}")
        if self.warmup_first_epoch and not self.lr_per_epoch:
            raise ConfigError("config key 'optim.warmup_first_epoch': applies to optim.lr_per_epoch = true only")
        if self.warmup_start_lr and not (self.lr_per_epoch or self.warmup_style == "linspace"):
            raise ConfigError("config key 'optim.warmup_start_lr': applies to optim.lr_per_epoch = true or "
                              "optim.warmup_style = 'linspace' only")
        if self.weight_decay_form not in ("torch", "keras_l2"):
            raise ConfigError(f"config key 'optim.weight_decay_form': expected 'torch' or 'keras_l2', got "
                              f"{self.weight_decay_form!r}")
        if self.weight_decay_form == "keras_l2" and self.name != "sgd":
            raise ConfigError(f"config key 'optim.weight_decay_form': 'keras_l2' applies to optim.name = 'sgd' only, "
                              f"got {self.name!r}")
        if self.momentum_form not in ("torch", "keras"):
            raise ConfigError(f"config key 'optim.momentum_form': expected 'torch' or 'keras', got {self.momentum_form!r}")
        if self.warmup_style not in ("harness", "nemo", "linspace", "zero_start"):
            raise ConfigError(f"config key 'optim.warmup_style': expected 'harness', 'nemo', 'linspace' or "
                              f"'zero_start', got {self.warmup_style!r}")
        if self.warmup_start and (self.warmup_style != "zero_start" or self.schedule == "cosine"
                                  or self.poly_from_warmup):
            raise ConfigError(f"config key 'optim.warmup_start': applies to optim.warmup_style = 'zero_start' with a "
                              f"schedule of the global step (constant, multistep, poly without poly_from_warmup); "
                              f"got warmup_style {self.warmup_style!r}, schedule {self.schedule!r}, poly_from_warmup "
                              f"{self.poly_from_warmup}")
        if self.warmup_start > 0:
            raise ConfigError(f"config key 'optim.warmup_start': must be <= 0 (a later start gives the steps before it "
                              f"a negative rate), got {self.warmup_start:g}")
        if self.warmup_style != "harness" and (self.lr_per_epoch or self.warmup_factor != 1.0):
            raise ConfigError(f"config key 'optim.warmup_style': {self.warmup_style!r} is a per-step warmup with its "
                              f"own start; it does not combine with optim.lr_per_epoch or optim.warmup_factor "
                              f"(got lr_per_epoch {self.lr_per_epoch}, warmup_factor {self.warmup_factor})")
        if self.lr_per_epoch and (self.unit != "epochs" or self.schedule not in ("constant", "multistep")):
            raise ConfigError(f"config key 'optim.lr_per_epoch': needs unit 'epochs' and the constant or multistep "
                              f"schedule, got unit {self.unit!r} and schedule {self.schedule!r}")
        if self.schedule_semantics not in ("harness", "held_warmup"):
            raise ConfigError(f"config key 'optim.schedule_semantics': expected 'harness' or 'held_warmup', got "
                              f"{self.schedule_semantics!r}")
        if self.schedule_semantics == "held_warmup" and (
                self.schedule not in ("multistep", "cosine") or self.warmup_style != "harness" or self.lr_per_epoch
                or self.decay_factors or self.warmup_start_lr):
            raise ConfigError(f"config key 'optim.schedule_semantics': 'held_warmup' is the DeepCAM reference's multistep or "
                              f"cosine_annealing scheduler with its own warmup; got schedule {self.schedule!r}, "
                              f"warmup_style {self.warmup_style!r}, lr_per_epoch {self.lr_per_epoch}, decay_factors "
                              f"{list(self.decay_factors)}, warmup_start_lr {self.warmup_start_lr}")


@dataclass
class DataConfig:
    """The data options every workload shares; a workload's ``data`` section subclasses it."""

    root: str = ""  # dataset folder (``--data DIR``)
    node_local: bool = False  # root holds this node's part only (node-local staging; set by the runner)
    # with node_local: refuse a root without staging's completion marker (false: a folder made by hand)
    require_staged: bool = True
    threads: int = -1  # reader threads per rank; 0: read in the training thread; -1: auto (loader.reader_threads)
    prefetch: int = 2  # batches in flight per reader thread
    # keep this rank's samples after their first read (common/data/cache.py): "host" (pinned on a GPU
    # run), "device" (GPU memory; host memory when training on the CPU), "none"
    cache: Literal["none", "host", "device"] = "none"
    # training order: "global" reshuffles the whole split over the ranks each epoch (the reference
    # loaders); "local" gives each rank a fixed part and shuffles inside it (NVIDIA's DeepCAM strong-
    # scaling submissions), so a rank's cache holds 1/ranks of the split instead of all of it
    shuffle: Literal["global", "local"] = "global"
    # the training permutation's remainder that does not fill a global batch: "drop" it (a different one
    # each epoch) or "pad" the last batch with the permutation's first samples, so that every sample is read
    # each epoch (the MLPerf training rules name dropping for DLRMv2 only; DeepCAM's reference drops it too, and its
    # full preset follows the reference: docs/closed.md; common/data/sampler.py)
    last_batch: Literal["drop", "pad"] = "drop"
    # train.loader = "dali": run the pipeline on super-batches of this many batches and cut them back
    # (the input batch multiplier; common/data/dali.py); 1 = off
    dali_batch_multiplier: int = 1

    def validate(self) -> None:
        if self.threads < -1 or self.prefetch < 1:
            raise ConfigError(f"config keys 'data.threads' >= -1 (auto) and 'data.prefetch' >= 1, got "
                              f"{self.threads} and {self.prefetch}")
        if self.dali_batch_multiplier < 1:
            raise ConfigError(f"config key 'data.dali_batch_multiplier': must be >= 1, got {self.dali_batch_multiplier}")
        if self.shuffle not in ("global", "local"):
            raise ConfigError(f"config key 'data.shuffle': {self.shuffle!r} is not allowed; expected 'global' or 'local'")
        if self.last_batch not in ("drop", "pad"):
            raise ConfigError(f"config key 'data.last_batch': {self.last_batch!r} is not allowed; expected 'drop' or 'pad'")
        if self.cache not in ("none", "host", "device"):
            raise ConfigError(f"config key 'data.cache': {self.cache!r} is not allowed; expected one of "
                              "'none', 'host', 'device'")


@dataclass
class TrainConfig:
    division: Literal["open", "closed"] = "open"
    # quality target threshold for the workload's metric; none: the benchmark's closed target (its record).
    # A closed run always has that one (Workload.load_config refuses another)
    target: float | None = None
    seed: int = 1
    global_batch_size: int = 8  # per instance (summed over its ranks)
    max_epochs: int = 10
    # > 0: the run ends after this many optimizer steps (the reference BERT's max_steps), evaluated there
    # unless it just was; status "success" only if that evaluation meets the target, else "aborted"
    max_steps: int = 0
    # epochs between evaluations: a whole number, or a fraction below 1 to evaluate inside each epoch
    # every floor(eval_every x steps per epoch) steps (DLRM: 0.05); common/cadence.py
    eval_every: float = 1
    # with a whole-epoch eval_every = N: evaluate after the epochs e with e % N == eval_offset % N, i.e. first
    # after eval_offset epochs (0: after N); MLPerf ResNet: every 4 epochs "with offset 0 or 1 or 2 or 3"
    eval_offset: int = 0
    # with a whole-epoch eval_every = N: > 0 evaluates the epochs S, S + N, S + 2N, ... only (the first at epoch
    # S; MLPerf 3D U-Net: from CEILING(1000 x 168 / samples per epoch)); 0: no start (eval_offset decides)
    eval_start: int = 0
    # > 0: evaluate after the step at which the training samples seen (steps x global batch) cross
    # each multiple of this (BERT); replaces eval_every
    eval_every_samples: int = 0
    # "auto": bf16 where the hardware does it natively, else fp32 (common/auto.py)
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "fp32"
    # "auto": measured on a CPU, by rule on a GPU (common/auto.py)
    channels_last: bool | Literal["auto"] = False
    graph: Literal["eager", "compile", "cuda_graph"] = "eager"
    # micro-batches per optimizer step (gradient accumulation): each rank's batch is cut into this many
    grad_accum: int = 1
    loader: Literal["torch", "dali"] = "torch"
    bn_group_size: int = 1  # >1: SyncBatchNorm over groups of this many ranks of the instance (CUDA)
    checkpoint_dir: str = ""
    checkpoint_every: int = 0  # epochs; 0 disables
    # continue from the latest checkpoint in checkpoint_dir, if there is one (none: a fresh start, said on the
    # console); without it a checkpoint_dir that already holds checkpoints of the instance is refused
    resume: bool = False
    log_every: int = 0  # steps between loss read-backs for the progress bar; 0 = per epoch
    # > 0: the instance's last eval_ranks ranks only evaluate, on weights the training ranks send them at
    # each evaluation point while training goes on (common/async_eval.py); 0: the training ranks evaluate
    eval_ranks: int = 0
    # with eval_ranks: seconds the training ranks wait at the run's end for results still owed
    eval_timeout_s: float = 600.0

    def validate(self) -> None:
        if not 0 <= self.seed <= MAX_SEED:
            raise ConfigError(f"config key 'train.seed': must be in [0, {MAX_SEED}] (instances add their index to it and "
                              f"numpy seeds take 32 bits; the references' `date +%s` fits), got {self.seed}")
        if self.global_batch_size < 1:
            raise ConfigError(f"config key 'train.global_batch_size': must be >= 1, got {self.global_batch_size}")
        if self.max_epochs < 1:
            raise ConfigError(f"config key 'train.max_epochs': must be >= 1, got {self.max_epochs}")
        if self.max_steps < 0:
            raise ConfigError(f"config key 'train.max_steps': must be >= 0 (0: no step limit), got {self.max_steps}")
        if not (0 < self.eval_every < 1 or (self.eval_every >= 1 and float(self.eval_every).is_integer())):
            raise ConfigError(f"config key 'train.eval_every': expected a whole number of epochs (1, 2, ...) or a "
                              f"fraction of an epoch between 0 and 1 (e.g. 0.05), got {self.eval_every}")
        if self.eval_offset and not (self.eval_every >= 1 and not self.eval_every_samples):
            raise ConfigError(f"config key 'train.eval_offset': applies to a whole-epoch train.eval_every only, got "
                              f"eval_every {self.eval_every:g} and eval_every_samples {self.eval_every_samples}")
        if self.eval_offset and not 0 <= self.eval_offset < self.eval_every:
            raise ConfigError(f"config key 'train.eval_offset': must be in [0, train.eval_every) = "
                              f"[0, {self.eval_every:g}), got {self.eval_offset}")
        if self.eval_start < 0:
            raise ConfigError(f"config key 'train.eval_start': must be >= 0 (0: off), got {self.eval_start}")
        if self.eval_start and not (self.eval_every >= 1 and not self.eval_every_samples and not self.eval_offset):
            raise ConfigError(f"config key 'train.eval_start': applies to a whole-epoch train.eval_every without "
                              f"train.eval_offset only, got eval_every {self.eval_every:g}, eval_every_samples "
                              f"{self.eval_every_samples}, eval_offset {self.eval_offset}")
        if self.eval_every_samples < 0:
            raise ConfigError(f"config key 'train.eval_every_samples': must be >= 0 (0: off), got "
                              f"{self.eval_every_samples}")
        if self.eval_every_samples and self.eval_every != 1:
            raise ConfigError(f"config keys 'train.eval_every' ({self.eval_every:g}) and 'train.eval_every_samples' "
                              f"({self.eval_every_samples}) both set the evaluation cadence; give only one")
        if self.grad_accum < 1:
            raise ConfigError(f"config key 'train.grad_accum': must be >= 1, got {self.grad_accum}")
        if self.bn_group_size < 1:
            raise ConfigError(f"config key 'train.bn_group_size': must be >= 1, got {self.bn_group_size}")
        if self.eval_ranks < 0:
            raise ConfigError(f"config key 'train.eval_ranks': must be >= 0 (0: the training ranks evaluate), "
                              f"got {self.eval_ranks}")
        if self.eval_timeout_s <= 0:
            raise ConfigError(f"config key 'train.eval_timeout_s': must be > 0 seconds, got {self.eval_timeout_s}")
        if self.checkpoint_every < 0:
            raise ConfigError(f"config key 'train.checkpoint_every': must be >= 0 epochs (0: no checkpoints), got "
                              f"{self.checkpoint_every}")
        if (self.checkpoint_every or self.resume) and not self.checkpoint_dir:
            key = "train.checkpoint_every" if self.checkpoint_every else "train.resume"
            raise ConfigError(f"config key '{key}' needs 'train.checkpoint_dir' (the folder checkpoints are written to "
                              "and resumed from); none is set, so nothing would be written or resumed")


@dataclass
class RunConfig:
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def require_closed(self, rows: Sequence[tuple[str, object, object, str]]) -> None:
        """In the closed division, every ``(key, value, required, why)`` row must have ``value == required`` (or,
        with a callable ``required``, ``required(value)`` true, ``why`` then saying what it allows): a config that
        leaves the rules or the reference where the official checker does not look (augmentations, cadence,
        model variants) is refused before the run, naming each key, its value and what is required."""
        if self.train.division != "closed":
            return
        bad = [f"'{key}' = {got!r} (closed: {why})" if callable(want) else
               f"'{key}' = {got!r} (closed: {want!r}, {why})"
               for key, got, want, why in rows if not (want(got) if callable(want) else got == want)]
        if bad:
            raise ConfigError("config key" + ("s " if len(bad) > 1 else " ") + "; ".join(bad)
                              + "; change it or set train.division = 'open'")

