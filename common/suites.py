"""The two suites that share the harness, and what each one's MLPerf rules ask of a log and a result folder.

* ``hpc``: MLPerf HPC, ruleset hpc 3.0.0. Results go to
  ``results/<system>/{strong,weak}/<benchmark>/``; strong scaling (time to solution) and weak scaling
  (models per minute) are both scored.
* ``training``: MLPerf Training, one named training ruleset per benchmark (the ``ruleset`` of the workload's
  record, :mod:`hpcbench.common.benchmark`). Results go to ``results/<system>/<benchmark>/`` (no mode folder: the
  training summarizer and package checker read that layout); the score is the olympic mean of the
  time to train. Concurrent instances of one job are independent runs there, one result file each.

The keys a log must carry differ only a little: hpc names gradient accumulation
``gradient_accumulation_frequency``, training ``gradient_accumulation_steps``. Everything else the
harness logs (cache_clear, init/run start and stop, epochs, evaluations with ``epoch_num``,
train/eval samples, global batch size, seed, the workload's ``opt_*`` keys) both rulesets require or accept.
"""
from __future__ import annotations

from dataclasses import dataclass

from .errors import ConfigError


@dataclass(frozen=True)
class Suite:
    name: str  # hpc | training
    usage: str  # the mlperf_logging --usage of its tools
    default_ruleset: str  # the ruleset a workload of the suite logs for unless it names one
    grad_accum_key: str  # the MLLOG key for gradient accumulation
    modes: tuple[str, ...]  # result folders between <system> and <benchmark>; () for none
    # epoch counts of the MLPerf keys (opt_*_epochs): True logs a whole number as an integer (the training
    # references' 2; the HPC rules' CosmoFlow boundaries are "a list of positive integers", [32, 64] as its
    # reference logs them), False as configured (2.0); common/mlperf_keys.py
    whole_epochs: bool

    def ruleset(self, named: str = "") -> str:
        return named or self.default_ruleset


HPC = Suite("hpc", "hpc", "3.0.0", "gradient_accumulation_frequency", ("strong", "weak"), whole_epochs=True)
TRAINING = Suite("training", "training", "5.1.0", "gradient_accumulation_steps", (), whole_epochs=True)
SUITES: dict[str, Suite] = {s.name: s for s in (HPC, TRAINING)}


def suite(name: str) -> Suite:
    if name not in SUITES:
        raise ConfigError(f"unknown suite {name!r}; expected one of {', '.join(SUITES)}")
    return SUITES[name]
