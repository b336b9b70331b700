"""The MLPerf HPC scoring rules, computed from our own parse of the logs.

Strong scaling: score = olympic mean of the runs' time to solution (run_stop - run_start): sort,
drop the fastest and the slowest, average the rest. A run that did not converge counts as the
dropped slowest one; more than one such run means no valid score. The rules ask for a number of
runs per benchmark (``registry.required_runs``); with fewer the mean is still shown but marked incomplete.

Weak scaling: M' models (instances) of scale S converge in a system of scale T; TTTa is
max(run_stop) - min(run_start) over all instances of the job (an instance that failed still held
its nodes); throughput = M' / TTTa in models per minute. The official summarizer scores a weak
result only when at least that many models converged.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hpcbench import registry

from .discover import Group
from .logs import RunLog

MAX_FAILED_RUNS = 1


def olympic_mean(times: list[float], failed: int, max_dropped: int = MAX_FAILED_RUNS) -> float | None:
    """Drop ``max_dropped`` fastest and slowest; failed runs already stand for dropped slowest ones."""
    if failed > max_dropped:
        return None
    ordered = sorted(times)
    kept = ordered[max_dropped:len(ordered) - (max_dropped - failed)]
    return sum(kept) / len(kept) if kept else None


@dataclass
class RunRow:
    name: str
    seed: int | None
    status: str
    time_to_solution_s: float | None
    start_offset_s: float | None
    epochs: int
    samples_per_s: float | None
    staging_s: float | None
    staging_offset_s: float | None  # staging_start relative to the group's first run_start
    final_metric: float | None
    problems: list[str]

    @classmethod
    def of(cls, run: RunLog, t0_ms: float | None) -> "RunRow":
        status = run.status if run.complete and run.status else "incomplete"
        offset = (run.run_start_ms - t0_ms) / 1000.0 if t0_ms is not None and run.run_start_ms is not None else None
        staged = (run.staging_start_ms - t0_ms) / 1000.0 if t0_ms is not None and run.staging_start_ms is not None else None
        return cls(run.name, run.seed, status, run.time_to_solution_s, offset, run.epochs, run.samples_per_s,
                   run.staging_ms / 1000.0 if run.staging_ms is not None else None, staged,
                   run.metrics[-1][1] if run.metrics else None, list(run.problems))


@dataclass
class Score:
    system: str
    mode: str
    benchmark: str
    division: str | None
    required_runs: int
    runs: list[RunRow]
    notes: list[str] = field(default_factory=list)
    # strong
    score_min: float | None = None
    # weak
    T: int | None = None
    S: int | None = None
    M: int = 0
    M_prime: int = 0
    ttta_min: float | None = None
    models_per_min: float | None = None

    @property
    def valid(self) -> bool:
        if self.mode == "strong":
            return self.score_min is not None and len(self.runs) >= self.required_runs
        return self.ttta_min is not None and self.M_prime >= self.required_runs

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return {**asdict(self), "valid": self.valid}


def _division(group: Group) -> str | None:
    divs = {r.division for r in group.runs if r.division}
    return divs.pop() if len(divs) == 1 else ("mixed" if divs else None)


def score_strong(group: Group) -> Score:
    runs = group.runs
    required = registry.required_runs(group.benchmark)
    s = Score(group.system, "strong", group.benchmark, _division(group), required, [RunRow.of(r, None) for r in runs])
    ok = [r.time_to_solution_s for r in runs if r.converged]
    failed = len(runs) - len(ok)
    s.M, s.M_prime = len(runs), len(ok)
    scales = [r.instance_scale for r in runs if r.instance_scale is not None]
    s.S = max(scales) if scales else None
    mean = olympic_mean([t / 60.0 for t in ok], failed)  # type: ignore[operator]
    s.score_min = mean
    if failed > MAX_FAILED_RUNS:
        s.notes.append(f"{failed} runs did not converge; the rules allow at most {MAX_FAILED_RUNS}: no score")
    elif failed:
        s.notes.append(f"{failed} non-converged run counted as the dropped slowest run (olympic rule)")
    if len(runs) < required:
        s.notes.append(f"incomplete: {len(runs)} of the {required} runs the rules require for {group.benchmark}; "
                       "the mean is shown but is not a valid MLPerf score")
    if mean is None and failed <= MAX_FAILED_RUNS:
        s.notes.append("too few runs for an olympic mean (need 3 or more after dropping)")
    return s


def score_weak(group: Group) -> Score:
    runs = group.runs
    required = registry.required_runs(group.benchmark)
    complete = [r for r in runs if r.complete]
    t0 = min((r.run_start_ms for r in complete), default=None)  # type: ignore[type-var]
    s = Score(group.system, "weak", group.benchmark, _division(group), required, [RunRow.of(r, t0) for r in runs])
    s.M = len(runs)
    s.M_prime = sum(r.converged for r in runs)
    scales = {r.instance_scale for r in runs if r.instance_scale is not None}
    if len(scales) > 1:
        s.notes.append(f"instances have different scales {sorted(scales)}: S is not well defined")
    s.S = max(scales) if scales else None
    desc = group.system_desc or {}
    if desc.get("number_of_nodes") is not None:
        s.T = int(desc["number_of_nodes"]) * max(int(desc.get("accelerators_per_node") or 0), 1)
    elif s.S is not None:
        s.T = s.S * s.M
        s.notes.append("no systems/<system>.json: T taken as M x S")
    if complete:
        stop = max(r.run_stop_ms for r in complete)  # type: ignore[type-var]
        s.ttta_min = (stop - t0) / 60000.0  # type: ignore[operator]
        s.models_per_min = s.M_prime / s.ttta_min if s.ttta_min > 0 else None
    if s.M - s.M_prime:
        s.notes.append(f"{s.M - s.M_prime} of {s.M} instances failed or did not converge; they are not in M' "
                       "but their time is in TTTa")
    if s.M_prime < required:
        s.notes.append(f"M'={s.M_prime} < {required} converged models the rules require for a scored "
                       f"{group.benchmark} weak-scaling result")
    return s


def score(group: Group) -> Score:
    return score_strong(group) if group.mode == "strong" else score_weak(group)
