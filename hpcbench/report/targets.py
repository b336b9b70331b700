"""The quality targets as the official compliance checker defines them (hpc 3.0.0; training: each
benchmark's ruleset, 5.1.0 for dlrm_dcnv2, 5.0.0 for bert, 4.0.0 for unet3d).

A run converged when *at least one* of its evaluations meets the target (the checker's
``ATLEAST_ONE_CHECK`` on the metric key in ``hpc_3.0.0/{closed,open}_<benchmark>.yaml``; both divisions
use the same threshold). The official result summarizer counts a run only if that checker passes,
so this is what M' and the strong-scaling "converged" use. ``tests/test_report_targets.py`` reads
the installed checker's YAML files and fails if this table ever differs from them.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Target:
    key: str  # MLLOG key of the quality metric
    low: float  # inclusive/exclusive bounds exactly as the checker writes them
    high: float
    low_inclusive: bool
    high_inclusive: bool

    def met(self, value: float) -> bool:
        above = value >= self.low if self.low_inclusive else value > self.low
        below = value <= self.high if self.high_inclusive else value < self.high
        return above and below

    @property
    def threshold(self) -> float:
        """The number a plot draws as the target line (the bound that is not 0 or 1)."""
        return self.high if self.key == "eval_error" else self.low

    def describe(self) -> str:
        if self.low == float("-inf"):
            return f"{self.key} <= {self.high:g} (no quality threshold)"
        return f"{self.key} {'<=' if self.key == 'eval_error' else '>='} {self.threshold:g}"


#: ``v['value'] <= 0.124 and v['value'] > 0.`` etc.
TARGETS: dict[str, Target] = {
    "cosmoflow": Target("eval_error", 0.0, 0.124, False, True),
    "deepcam": Target("eval_accuracy", 0.82, 1.0, True, True),
    "oc20": Target("eval_error", 0.0, 0.036, False, True),
}


#: the training rulesets set the threshold in closed_<benchmark>.yaml only; open_<benchmark>.yaml checks
#: the upper bound alone, so in the open division the official tools count every complete log
TRAINING_TARGETS: dict[tuple[str, str], Target] = {
    ("dlrm_dcnv2", "closed"): Target("eval_accuracy", 0.80275, 1.0, True, True),
    ("dlrm_dcnv2", "open"): Target("eval_accuracy", float("-inf"), 1.0, True, True),
    # training 5.0.0 (the newest whose common rules accept bert): ``(v['value'] >= 0.720) and v['value'] < 1.0``
    ("bert", "closed"): Target("eval_accuracy", 0.720, 1.0, True, False),
    ("bert", "open"): Target("eval_accuracy", float("-inf"), 1.0, True, False),
    # training 4.0.0: closed ``v['value'] >= 0.908`` (no upper bound), open ``v['value'] < 1.0``
    ("unet3d", "closed"): Target("eval_accuracy", 0.908, float("inf"), True, True),
    ("unet3d", "open"): Target("eval_accuracy", float("-inf"), 1.0, True, False),
}


def target_for(benchmark: str | None, division: str | None = None) -> Target | None:
    """The target of ``benchmark`` in ``division`` (hpc: the same in both; training: per division,
    closed when the division is unknown)."""
    if (benchmark, division or "closed") in TRAINING_TARGETS:
        return TRAINING_TARGETS[(benchmark or "", division or "closed")]
    return TARGETS.get(benchmark or "")
