"""The benchmark record: everything the rules and the tools need to know about one workload, declared once.

A workload package declares its :class:`Benchmark` in a module that is light to import (the package's
``__init__.py``: no torch, no model code), because ``hpcbench report``, ``pack`` and ``stage`` read it through
:mod:`hpcbench.registry` without training anything. The workload class points at the same record
(``Workload.record``); an out-of-tree workload (``package.module:Class``) declares its own on the class.

What a record holds: the CLI name, the MLPerf benchmark key, the suite and ruleset its logs are written and
checked for, the quality target exactly as the official checker's ``closed_<benchmark>.yaml`` writes it
(the metric key, bounds and inclusivity; the open division's, when it differs), the direction of the metric,
the runs a result needs, how ``epoch_num`` is reported, whether a closed run evaluates on the cadence only,
how many runs the olympic mean drops, a one-line summary, where the light parts live (the dataset layout, a
converter), which MLPerf optimizer and schedule keys the benchmark logs (:class:`HyperparameterKeys`, built
by :mod:`hpcbench.common.mlperf_keys`) and what a closed-division run must have trained
(:class:`ClosedDefinition`: the model's parameter count, the real dataset's sample counts, the hyperparameter
values the rules fix), which ``hpcbench report`` compares each closed log with.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from .cadence import ClosedEvalEpochs
from .errors import ConfigError
from .suites import suite


@dataclass(frozen=True)
class Target:
    """A quality target as the compliance checker's ``ATLEAST_ONE_CHECK`` writes it."""

    key: str  # MLLOG key of the quality metric
    low: float  # inclusive/exclusive bounds exactly as the checker writes them
    high: float
    low_inclusive: bool
    high_inclusive: bool
    # the metric improves downwards: always for eval_error; for an eval_accuracy that is a loss (an LLM's
    # log perplexity, whose closed check is "v <= 3.3 and v > 0")
    lower_is_better: bool = False

    def __post_init__(self) -> None:
        if self.key == "eval_error":
            object.__setattr__(self, "lower_is_better", True)

    def met(self, value: float) -> bool:
        above = value >= self.low if self.low_inclusive else value > self.low
        below = value <= self.high if self.high_inclusive else value < self.high
        return above and below

    @property
    def threshold(self) -> float:
        """The number a plot draws as the target line (the bound that is not 0 or 1)."""
        return self.high if self.lower_is_better else self.low

    def describe(self) -> str:
        if self.low == -math.inf and not self.lower_is_better:
            return f"{self.key} <= {self.high:g} (no quality threshold)"
        return f"{self.key} {'<=' if self.lower_is_better else '>='} {self.threshold:g}"


def upper_bound_only(key: str, high: float, inclusive: bool, lower_is_better: bool = False) -> Target:
    """A target that only bounds ``key`` from above: the training rulesets' open division, which sets no
    quality threshold (every complete log counts); for a metric that improves downwards (``lower_is_better``)
    the bound is the open division's threshold."""
    return Target(key, -math.inf, high, True, inclusive, lower_is_better)


EPOCH_REPORTING = ("epoch", "fraction", "samples")
ANY_OPTIMIZER = "*"


@dataclass(frozen=True)
class HyperparameterKeys:
    """Which MLPerf optimizer and schedule keys a benchmark's rules name, in the order they are logged.

    ``by_optimizer`` maps each ``optim.name`` the keys can describe to its keys (a config naming another
    optimizer is refused, naming ``optim.name``; ``"*"``: the keys of any optimizer); ``by_schedule`` adds keys for an ``optim.schedule``;
    ``names`` is ``opt_name`` as logged where it is not ``optim.name`` (``{"adamw": "AdamW"}``). The values
    come from :mod:`hpcbench.common.mlperf_keys` (one definition per key name)."""

    by_optimizer: Mapping[str, tuple[str, ...]]
    by_schedule: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    names: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("by_optimizer", "by_schedule", "names"):  # read-only, as the record is frozen
            object.__setattr__(self, name, MappingProxyType(dict(getattr(self, name))))

    def describes(self, optimizer: str) -> bool:
        return optimizer in self.by_optimizer or ANY_OPTIMIZER in self.by_optimizer

    def keys_for(self, optimizer: str, schedule: str) -> tuple[str, ...]:
        keys = self.by_optimizer.get(optimizer, self.by_optimizer.get(ANY_OPTIMIZER, ()))
        return (*keys, *self.by_schedule.get(schedule, ()))


#: the hpcbench key that states the model's parameter count in a log (every parameter of the instance's model,
#: each counted once: model-parallel shards summed over the ranks); the checkers ignore ``hpcbench_*`` keys
PARAMETERS_KEY = "hpcbench_model_parameters"


#: how close a logged number must be to a closed definition's fixed one (relative)
SAME_VALUE_REL_TOL = 1e-9


def same_value(got: Any, want: Any) -> bool:
    """A logged value equals a fixed one: strings case-insensitively, numbers to 1e-9 relative (a float logged
    for an integer is the same number), lists element by element."""
    if isinstance(want, str):
        return isinstance(got, str) and got.casefold() == want.casefold()
    if isinstance(want, (list, tuple)):
        return (isinstance(got, (list, tuple)) and len(got) == len(want)
                and all(same_value(g, w) for g, w in zip(got, want)))
    if isinstance(want, bool) or isinstance(got, bool):
        return got is want
    if isinstance(want, (int, float)) and isinstance(got, (int, float)):
        return math.isclose(got, want, rel_tol=SAME_VALUE_REL_TOL, abs_tol=0.0) or got == want
    return bool(got == want)


@dataclass(frozen=True)
class ClosedDefinition:
    """What a closed-division run of the benchmark trains, as the rules, the official checker's closed YAML and
    the reference fix it; ``hpcbench report`` compares every closed log with it (``hpcbench.report.closed``).

    ``parameters``: the parameter counts a closed model may have (several where the reference allows a layout
    difference, e.g. BERT's vocabulary padded to a multiple of 8); empty: not compared. ``train_samples`` /
    ``eval_samples``: the real dataset's counts as the ``train_samples``/``eval_samples`` keys log them (None:
    the key is not a dataset count, e.g. BERT's reference logs the samples trained). ``fixed``: MLPerf keys whose
    logged value the closed rules fix (strings compare case-insensitively, numbers to 1e-9 relative, lists
    element by element); ``fixed_by_optimizer``: more of them for the ``opt_name`` a log states;
    ``also_allowed``: values the closed rules allow besides a fixed one (e.g. an optimizer the rules' list of
    compliant optimizers names for another framework). ``source``: where the numbers come from, for the report
    and the docs."""

    parameters: tuple[int, ...] = ()
    train_samples: int | None = None
    eval_samples: int | None = None
    fixed: Mapping[str, object] = field(default_factory=dict)
    fixed_by_optimizer: Mapping[str, Mapping[str, object]] = field(default_factory=dict)
    also_allowed: Mapping[str, tuple[object, ...]] = field(default_factory=dict)
    source: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "fixed", MappingProxyType(dict(self.fixed)))
        object.__setattr__(self, "also_allowed", MappingProxyType({k: tuple(v) for k, v in self.also_allowed.items()}))
        object.__setattr__(self, "fixed_by_optimizer", MappingProxyType(
            {k: MappingProxyType(dict(v)) for k, v in self.fixed_by_optimizer.items()}))
        if any(isinstance(n, bool) or not isinstance(n, int) or n <= 0 for n in self.parameters):
            raise ValueError(f"ClosedDefinition.parameters: positive integers expected, got {self.parameters!r}")

    def fixed_for(self, optimizer: object) -> dict[str, object]:
        """The fixed keys of a log whose ``opt_name`` is ``optimizer`` (any case)."""
        extra = {k.casefold(): v for k, v in self.fixed_by_optimizer.items()}
        name = optimizer.casefold() if isinstance(optimizer, str) else None
        return {**self.fixed, **(extra.get(name, {}) if name is not None else {})}

    def differing(self, values: Mapping[str, object]) -> list[tuple[str, object, object]]:
        """(key, value, fixed value) of each fixed key of ``values`` (the keys a run logs) whose value is not the
        fixed one; keys ``values`` lacks are not compared (the report names those)."""
        fixed = self.fixed_for(values.get("opt_name"))
        return [(k, values[k], want) for k, want in fixed.items() if k in values and not same_value(values[k], want)]


@dataclass(frozen=True)
class Benchmark:
    name: str  # CLI/registry name, e.g. "cosmoflow"
    benchmark: str  # MLPerf submission_benchmark key
    suite: str  # hpc | training (common.suites)
    target: Target  # the closed division's quality target, exactly as the checker writes it
    higher_is_better: bool  # direction of target.key
    required_runs: int  # runs (or converged models) a result needs (mlperf_logging.benchmark_meta)
    summary: str  # one line for `hpcbench --help` and the docs
    ruleset: str = ""  # the suite's ruleset version the logs are written for; "" = the suite's default
    # the open division's target where the checker's open_<benchmark>.yaml differs (None: the closed one)
    open_target: Target | None = None
    epoch_reporting: str = "epoch"  # how epoch_num counts progress: epoch | fraction | samples
    # True: a closed run evaluates on the rules' cadence only; the harness's extra evaluation at the end of
    # the last epoch (a run ends with a metric) is for the open division (common/cadence.py; ResNet)
    closed_cadence_only: bool = False
    # the rules' whole-epoch cadence of a closed run from the samples per epoch (None: the preset's); a closed
    # config must name it (common/cadence.py: cadence_of; 3D U-Net: from epoch 1000 every 20 at 168 per epoch)
    closed_eval: ClosedEvalEpochs | None = None
    # how train.eval_every_samples = N is counted (common/cadence.py): "crossing" = after the step whose samples
    # cross a multiple of N (BERT); "steps" = every CEILING(N / global batch) steps (Llama 3.1 8B's reference)
    samples_cadence: str = "crossing"
    dropped_runs: int = 1  # fastest and slowest runs the olympic mean drops
    # the MLLOG key of train.grad_accum where the reference logs another than its suite's (common/suites.py;
    # "": the suite's): the OpenFold reference logs gradient_accumulation_steps, DeepCAM's (the hpc suite's)
    # gradient_accumulation_frequency
    grad_accum_key: str = ""
    # light parts, relative to the workload's package: the module with LAYOUT, the workload class,
    # the converter behind `hpcbench convert NAME` ("module:function"; "" for none), the class whose
    # classmethods add_datagen_args / embedded_datagen_args / datagen write the synthetic data ("module:Class",
    # a base of the workload class that imports no model code; "": the workload class's own)
    layout: str = ""
    workload: str = ""
    converter: str = ""
    datagen: str = ""
    keys: HyperparameterKeys | None = None  # the MLPerf optimizer/schedule keys (None: the workload logs its own)
    # what a closed run trains (model size, dataset counts, fixed hyperparameters); None: not declared, and a
    # closed log of the benchmark is then never called closed-ready
    closed: ClosedDefinition | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "ruleset", suite(self.suite).ruleset(self.ruleset))
        if self.epoch_reporting not in EPOCH_REPORTING:
            raise ValueError(f"{self.name}: epoch_reporting {self.epoch_reporting!r} is not one of {EPOCH_REPORTING}")
        if self.samples_cadence not in ("crossing", "steps"):
            raise ValueError(f"{self.name}: samples_cadence {self.samples_cadence!r} is not 'crossing' or 'steps'")
        if self.higher_is_better == self.target.lower_is_better:
            raise ValueError(f"{self.name}: higher_is_better={self.higher_is_better} contradicts the target "
                             f"{self.target.key} (lower_is_better={self.target.lower_is_better})")

    @property
    def metric_key(self) -> str:
        return self.target.key

    def target_in(self, division: str | None) -> Target:
        """The checker's target in ``division`` (closed when unknown)."""
        if division == "open" and self.open_target is not None:
            return self.open_target
        return self.target

    def resolve_target(self, value: float | None, division: str) -> float:
        """``train.target`` of a run: a closed run meets the record's threshold (left out of the preset, or
        the same number); an open run sets its own or takes the closed one."""
        closed = self.target.threshold
        if division == "closed" and value is not None and value != closed:
            raise ConfigError(f"config key 'train.target': the closed division of {self.benchmark} has the target "
                              f"{self.target.describe()} (the official checker's); got {value:g}. Leave "
                              f"train.target out of a closed preset, or use the open division")
        return closed if value is None else value

    def check_optimizer(self, optimizer: str) -> None:
        """Refuse an optimizer the benchmark's MLPerf keys cannot describe."""
        if self.keys is not None and not self.keys.describes(optimizer):
            allowed = " or ".join(repr(o) for o in self.keys.by_optimizer)
            raise ConfigError(f"config key 'optim.name': {self.name} logs the MLPerf keys of {allowed} (ruleset "
                              f"{self.suite} {self.ruleset}), got {optimizer!r}")
