"""What one training run of one instance returns (the same on all its ranks), and what its evaluations share."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from .workload import QualityTarget


@dataclass
class RunResult:
    """The outcome of one training run of one instance (identical on all its ranks)."""

    status: Literal["success", "aborted"]
    instance: int
    epochs: int  # epochs trained
    steps: int
    time_to_solution_s: float  # run_stop - run_start
    final_metric: float | None  # the last evaluation's metric
    metric_key: str
    # (epoch_num as logged, metric) per evaluation: whole epochs, fractional epochs or samples (common/cadence.py)
    metrics: list[tuple[int | float, float]] = field(default_factory=list)
    samples_per_s: float = 0.0  # training throughput of the instance (train samples / train time)
    epoch_losses: list[float] = field(default_factory=list)
    timers: dict[str, dict[str, float]] = field(default_factory=dict)
    # per epoch trained on this rank: its training seconds (evaluations excluded, as in tracked_stats), its steps,
    # and the seconds of the step's two timed parts in it: waiting for the loader's batch (``data_wait_s``) and the
    # training step as the host sees it (``step_s``; on a GPU the launches, or the wait where the step syncs). The
    # rest of an epoch is the harness's own per-step work, the epoch's start, and the device's queue drained at its end.
    epoch_phases: list[dict[str, float]] = field(default_factory=list)
    run_start_ms: float = 0.0
    run_stop_ms: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class _RunState:
    """What the evaluations of one run share: the result they fill and where the last one was."""

    result: RunResult
    target: QualityTarget
    start_ms: float
    evaluated_at: int = -1  # global step of the last evaluation
    stop_ms: float | None = None  # when the result that met the target arrived (dedicated evaluation ranks)
    diverged: bool = False  # an evaluation the workload calls diverged (Workload.diverged) ended the run, aborted
