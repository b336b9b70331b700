"""The quality targets as the official compliance checker defines them, read from the workloads' records
(:class:`hpcbench.common.benchmark.Benchmark`: hpc 3.0.0; training: each benchmark's ruleset).

A run converged when *at least one* of its evaluations meets the target (the checker's
``ATLEAST_ONE_CHECK`` on the metric key in ``<suite>_<ruleset>/{closed,open}_<benchmark>.yaml``). The hpc
rules use the same threshold in both divisions; the training rulesets set it in closed_<benchmark>.yaml
only (open_<benchmark>.yaml checks the upper bound alone, so in the open division the official tools count
every complete log). The official result summarizer counts a run only if that checker passes, so this is
what M' and the strong-scaling "converged" use. ``tests/test_report_official.py`` and
``tests/test_report_training.py`` read the installed checker's YAML files and fail if a record differs.
"""
from __future__ import annotations

from hpcbench import registry
from hpcbench.common.benchmark import Target

__all__ = ["TARGETS", "TRAINING_TARGETS", "Target", "target_for"]

#: hpc benchmarks: the same target in both divisions
TARGETS: dict[str, Target] = {r.benchmark: r.target for r in registry.RECORDS.values() if r.suite == "hpc"}

#: training benchmarks, per division
TRAINING_TARGETS: dict[tuple[str, str], Target] = {
    (r.benchmark, division): r.target_in(division)
    for r in registry.RECORDS.values() if r.suite == "training" for division in ("closed", "open")
}


def target_for(benchmark: str | None, division: str | None = None) -> Target | None:
    """The target of ``benchmark`` in ``division`` (hpc: the same in both; training: per division,
    closed when the division is unknown)."""
    record = registry.record_of(benchmark or "")
    return record.target_in(division) if record is not None else None
