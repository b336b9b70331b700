"""The two suites that share the harness, and what each one's MLPerf rules ask of a log and a result folder.

* ``hpc``: MLPerf HPC, ruleset hpc 3.0.0 (cosmoflow, deepcam, oc20). Results go to
  ``results/<system>/{strong,weak}/<benchmark>/``; strong scaling (time to solution) and weak scaling
  (models per minute) are both scored.
* ``training``: MLPerf Training, one named training ruleset per benchmark (the workload's ``ruleset``;
  e.g. 5.1.0 for dlrm_dcnv2). Results go to ``results/<system>/<benchmark>/`` (no mode folder: the
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

    def ruleset(self, named: str = "") -> str:
        return named or self.default_ruleset


HPC = Suite("hpc", "hpc", "3.0.0", "gradient_accumulation_frequency", ("strong", "weak"))
TRAINING = Suite("training", "training", "5.1.0", "gradient_accumulation_steps", ())
SUITES: dict[str, Suite] = {s.name: s for s in (HPC, TRAINING)}


# How a benchmark's log reports training progress in ``epoch_num`` (the training rules' "Epoch
# reporting" table; common/cadence.py): BERT in training samples, DLRM-DCNv2 in fractional epochs
# (0.05, 0.1, ...); every other benchmark (the HPC ones) in whole epochs.
EPOCH_REPORTING: dict[str, str] = {"bert": "samples", "dlrm_dcnv2": "fraction"}


def epoch_reporting(benchmark: str) -> str:
    """``epoch``, ``fraction`` or ``samples`` for an MLPerf benchmark key."""
    return EPOCH_REPORTING.get(benchmark, "epoch")


# How many fastest and slowest runs the olympic mean drops (a non-converged run stands for one of the
# slowest): the training summarizer drops 4 for unet3d, whose rules ask for 40 runs, and 1 for every
# other benchmark (mlperf_logging.result_summarizer; the HPC rules drop 1).
MAX_DROPPED_RUNS: dict[str, int] = {"unet3d": 4}


def max_dropped_runs(benchmark: str) -> int:
    """Fastest and slowest runs dropped by the olympic mean of ``benchmark`` (and the most non-converged
    runs a valid score allows)."""
    return MAX_DROPPED_RUNS.get(benchmark, 1)


def suite(name: str) -> Suite:
    if name not in SUITES:
        raise ConfigError(f"unknown suite {name!r}; expected one of {', '.join(SUITES)}")
    return SUITES[name]
