"""The MLPerf optimizer and learning-rate-schedule keys of a run, and the keys several benchmarks share, built in
one place.

A benchmark's record names the keys its rules want (:class:`~hpcbench.common.benchmark.HyperparameterKeys`);
each key name has one definition here, computed from the ``optim`` config and the :class:`Schedule` the
harness trains with, so a warmup or a decay is converted between epochs and steps exactly as the run uses
it. Units follow the key's name: ``*_steps`` are whole optimizer steps; ``*_epochs`` are epochs as
configured in the hpc suite and, in the training suite, integers where whole (the training references
log ``2``, not ``2.0``). A key ``<optimizer>_opt_*`` (``lars_opt_momentum``) is ``opt_*`` of that optimizer.
Boundaries and decay factor describe a multistep decay (``[]`` and ``1.0`` for another schedule); with
``optim.decay_factors`` (absolute factors of the peak, one per boundary) the decay factor is their list,
as the MLPerf HPC rules allow for CosmoFlow ("you may use a different value for each decay") and NVIDIA's
CosmoFlow logs write it (``[0.25, 0.0625]`` for a rate that went ``lr``, ``lr/4``, ``lr/16``).

Shared keys of the data (:func:`data_keys`): ``max_sequence_length``, the tokens of a sample that the
language-model benchmarks log (BERT's packed rows, Llama 3.1 8B's ``seq_len``; the references log
``constants.MAX_SEQUENCE_LENGTH``), from the value the workload reports (``Workload.max_sequence_length``).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from .benchmark import Benchmark
from .errors import ConfigError
from .runconfig import OptimConfig
from .schedule import Schedule
from .suites import suite


@dataclass(frozen=True)
class _Run:
    optim: OptimConfig
    schedule: Schedule
    steps_per_epoch: int  # 0: not known (a unit test); conversions between units then give 0
    whole_epochs: bool
    opt_name: str

    def steps(self, value: float) -> int:
        return int(round(value))

    def epochs(self, configured: float, in_steps: float) -> float | int:
        if self.optim.unit == "epochs":
            value = configured
        else:
            value = in_steps / self.steps_per_epoch if self.steps_per_epoch else 0.0
        return int(value) if self.whole_epochs and float(value).is_integer() else value

    @property
    def multistep(self) -> bool:
        return self.schedule.kind == "multistep"

    @property
    def decays_after_warmup(self) -> bool:  # Schedule.decay_steps counts T - W
        return self.schedule.kind == "cosine" or self.schedule.poly_from_warmup

    @property
    def poly_power(self) -> float:
        return self.optim.power if self.schedule.kind == "poly" else 0.0


def _decay_factor(r: _Run) -> float | list[float]:
    if not r.multistep:
        return 1.0
    return list(r.optim.decay_factors) if r.optim.decay_factors else r.optim.decay_factor


def _one_decay_rate(r: _Run) -> float:
    if r.optim.decay_factors:  # the key names one rate applied at every milestone
        raise ConfigError(f"config key 'optim.decay_factors': scheduler_decay_rate is one rate multiplied in at "
                          f"each milestone; give optim.decay_factor instead of {list(r.optim.decay_factors)}")
    return r.optim.decay_factor


_VALUES: dict[str, Callable[[_Run], Any]] = {
    "opt_name": lambda r: r.opt_name,
    "opt_base_learning_rate": lambda r: r.optim.lr,
    "opt_lr": lambda r: r.optim.lr,
    "opt_end_learning_rate": lambda r: r.optim.min_lr,
    "opt_momentum": lambda r: r.optim.momentum,
    "sgd_opt_momentum": lambda r: r.optim.momentum,  # the HPC rules' CosmoFlow name, logged whatever the optimizer
    "opt_weight_decay": lambda r: r.optim.weight_decay,
    "opt_betas": lambda r: list(r.optim.betas),
    "opt_eps": lambda r: r.optim.eps,
    "opt_bias_correction": lambda r: r.optim.bias_correction,
    "opt_grad_averaging": lambda r: r.optim.grad_averaging,
    "opt_max_grad_norm": lambda r: r.optim.max_grad_norm,
    "opt_lamb_epsilon": lambda r: r.optim.eps,
    "opt_epsilon": lambda r: r.optim.eps,  # BERT's name for it in training_rules.adoc's table
    "opt_lamb_beta_1": lambda r: r.optim.betas[0],
    "opt_lamb_beta_2": lambda r: r.optim.betas[1],
    "opt_lamb_weight_decay_rate": lambda r: r.optim.weight_decay,
    "opt_lamb_learning_rate_decay_poly_power": lambda r: r.poly_power,
    "opt_adagrad_learning_rate_decay": lambda r: r.optim.lr_decay,
    "opt_adagrad_initial_accumulator_value": lambda r: r.optim.initial_accumulator,
    "opt_adagrad_epsilon": lambda r: r.optim.eps,
    "lars_epsilon": lambda r: r.optim.eps,
    "opt_adamw_beta_1": lambda r: r.optim.betas[0],
    "opt_adamw_beta_2": lambda r: r.optim.betas[1],
    "opt_adamw_epsilon": lambda r: r.optim.eps,
    "opt_adamw_weight_decay": lambda r: r.optim.weight_decay,
    "opt_gradient_clip_norm": lambda r: r.optim.max_grad_norm,
    "opt_gradient_clipping": lambda r: r.optim.max_grad_norm > 0,
    "opt_adam_beta_1": lambda r: r.optim.betas[0],
    "opt_adam_beta_2": lambda r: r.optim.betas[1],
    "opt_adam_epsilon": lambda r: r.optim.eps,
    "opt_amsgrad": lambda r: False,  # the flat Adam has no AMSGrad variant
    # the weight average the evaluations use (common/swa.py; MLPerf HPC OpenFold's "SWA")
    "swa_enabled": lambda r: r.optim.swa_decay > 0,
    "swa_decay_rate": lambda r: r.optim.swa_decay,
    # the training 6.0 LLMs' words for the schedule ("cosine with linear warmup")
    "opt_learning_rate_decay_schedule": lambda r: (f"{r.schedule.kind} with linear warmup" if r.schedule.warmup_steps
                                                   else r.schedule.kind),
    # warmup
    "opt_learning_rate_warmup_factor": lambda r: r.optim.warmup_factor,
    "opt_learning_rate_warmup_epochs": lambda r: r.epochs(r.optim.warmup, r.schedule.warmup_steps),
    "opt_learning_rate_warmup_steps": lambda r: r.steps(r.schedule.warmup_steps),
    # the rate of the first step: where a warmup starts (the peak rate without one); a linspace warmup's
    # configured start, with or without warmup steps (the OpenFold reference logs its warmup_lr_init always)
    "opt_learning_rate_warmup_init": lambda r: (r.optim.warmup_start_lr if r.schedule.warmup_style == "linspace"
                                                else float(r.schedule(torch.zeros(()))) if r.schedule.warmup_steps > 0
                                                else r.optim.lr),
    "num_warmup_steps": lambda r: r.steps(r.schedule.warmup_steps),
    "start_warmup_step": lambda r: r.steps(r.schedule.warmup_start),  # optim.warmup_start (zero_start), else 0
    # decay
    "opt_learning_rate_decay_boundary_epochs": lambda r: [r.epochs(c, m) for c, m in
                                                          zip(r.optim.milestones, r.schedule.milestones)]
    if r.multistep else [],
    "opt_learning_rate_decay_boundary_steps": lambda r: [r.steps(m) for m in r.schedule.milestones]
    if r.multistep else [],
    "opt_learning_rate_decay_factor": lambda r: _decay_factor(r),
    "opt_learning_rate_decay_poly_power": lambda r: r.poly_power,
    "opt_learning_rate_training_steps": lambda r: r.steps(r.schedule.total_steps),
    "opt_learning_rate_decay_start_step": lambda r: r.steps(r.schedule.warmup_steps) if r.decays_after_warmup else 0,
    "opt_learning_rate_decay_steps": lambda r: 0 if r.schedule.kind == "constant" else r.steps(r.schedule.decay_steps),
    # the scheduler_* names (MLPerf HPC DeepCAM's reference), all in steps; with schedule_semantics "held_warmup"
    # the reference's own arguments: its warmup factor as given, the milestones before its shift by the warmup
    # (as it logs them) and T_max, the cosine's length after the warmup (common/schedule.py)
    "scheduler_type": lambda r: {"cosine": "cosine_annealing"}.get(r.schedule.kind, r.schedule.kind),
    "scheduler_lr_warmup_steps": lambda r: r.steps(r.schedule.warmup_steps),
    "scheduler_lr_warmup_factor": lambda r: (r.optim.warmup_factor if r.schedule.semantics == "held_warmup"
                                             else max(1.0, r.optim.warmup_factor)),
    "scheduler_milestones": lambda r: [r.steps(m) for m in r.schedule.milestones],
    "scheduler_decay_rate": lambda r: _one_decay_rate(r),
    "scheduler_t_max": lambda r: r.steps(r.schedule.decay_steps if r.schedule.semantics == "held_warmup"
                                         else r.schedule.total_steps),
    "scheduler_eta_min": lambda r: r.optim.min_lr,
}


def _value(key: str, run: _Run) -> Any:
    prefix = f"{run.optim.name}_"
    if key not in _VALUES and key.startswith(prefix + "opt_"):
        key = key[len(prefix):]
    if key not in _VALUES:
        raise KeyError(f"no definition of the MLPerf key {key!r} in hpcbench.common.mlperf_keys")
    return _VALUES[key](run)


def optimizer_keys(record: Benchmark, optim: OptimConfig, steps_per_epoch: int, max_epochs: int) -> dict[str, Any]:
    """The optimizer and schedule keys ``record`` names for a run of ``optim`` (``{}`` if it names none);
    an optimizer the record's keys cannot describe is a ``ConfigError`` naming ``optim.name``."""
    if record.keys is None:
        return {}
    record.check_optimizer(optim.name)
    run = _Run(optim, Schedule.from_config(optim, steps_per_epoch, max_epochs), steps_per_epoch,
               suite(record.suite).whole_epochs, record.keys.names.get(optim.name, optim.name))
    return {key: _value(key, run) for key in record.keys.keys_for(optim.name, optim.schedule)}


def data_keys(max_sequence_length: int | None) -> dict[str, Any]:
    """The data keys several benchmarks log: ``max_sequence_length`` where the workload has one (``{}`` else)."""
    if max_sequence_length is None:
        return {}
    if int(max_sequence_length) != max_sequence_length or max_sequence_length < 1:
        raise ConfigError(f"max_sequence_length must be a positive whole number of tokens, got {max_sequence_length!r}")
    return {"max_sequence_length": int(max_sequence_length)}
