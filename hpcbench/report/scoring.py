"""The MLPerf HPC scoring rules, computed from our own parse of the logs.

Strong scaling: score = olympic mean of the runs' time to solution (run_stop - run_start): sort,
drop the fastest and the slowest, average the rest (unet3d, 40 runs: the 4 fastest and 4 slowest, as the
training summarizer does; ``registry.max_dropped_runs``, the record's ``dropped_runs``). A run that did not converge counts as a
dropped slowest one; more such runs than are dropped means no valid score. The rules ask for a number of
runs per benchmark (``registry.required_runs``); with fewer the mean is still shown but marked incomplete.

Weak scaling: M' models (instances) of scale S converge in a system of scale T; TTTa is
max(run_stop) - min(run_start) over the converged instances, exactly as the official result summarizer
computes it (a file that fails the compliance checker is dropped from every figure); throughput =
M' / TTTa in models per minute. The official summarizer scores a weak result only when at least the
required number of models converged. Our own extra figure, the span of the whole job including
instances that did not converge, is labelled as ours wherever it is shown.

"Converged" (see :mod:`.targets` and ``RunLog.converged``): a complete log in which at least one
evaluation meets the benchmark's target as the official compliance checker defines it (the status
of run_stop is not read, as the checker does not read it).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hpcbench import registry

from .closed import cache_clear_problem, claims_closed, folder_division, readiness
from .discover import Group
from .logs import RunLog
from .scaling import apply_scaling
from .targets import target_for

def olympic_mean(times: list[float], failed: int, max_dropped: int = 1) -> float | None:
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
    status: str  # RunLog.outcome: success, aborted, target_missed, unreadable, rejected, incomplete
    converged: bool  # counted in M' / the olympic mean
    time_to_solution_s: float | None
    start_offset_s: float | None
    epochs: int
    samples_per_s: float | None
    staging_s: float | None
    staging_offset_s: float | None  # staging_start relative to the group's first run_start
    final_metric: float | None
    problems: list[str]
    rejected: list[str] = field(default_factory=list)  # why the log is not scored (ours, then the official checker's)
    # why the log is not closed-ready (hpcbench.report.closed); None: not judged (the folder is open)
    closed_reasons: list[str] | None = None

    @property
    def closed_ready(self) -> bool | None:
        return None if self.closed_reasons is None else not self.closed_reasons

    @classmethod
    def of(cls, run: RunLog, t0_ms: float | None) -> "RunRow":
        sane = not run.rejections  # times of a log our checks reject (NaN, 1e20 ms, ...) are not shown or plotted
        offset = ((run.run_start_ms - t0_ms) / 1000.0 if sane and t0_ms is not None and run.run_start_ms is not None
                  else None)
        staged = ((run.staging_start_ms - t0_ms) / 1000.0 if sane and t0_ms is not None and run.staging_start_ms is not None
                  else None)
        why = list(run.rejections) + ([f"official compliance checker: {run.official_rejection}"]
                                      if run.official_rejection is not None else [])
        return cls(run.name, run.seed, run.outcome, run.converged, run.time_to_solution_s if sane else None, offset,
                   run.epochs, run.samples_per_s if sane else None,
                   run.staging_ms / 1000.0 if run.staging_ms is not None else None, staged,
                   run.metrics[-1].value if run.metrics else None, list(run.problems), why)


@dataclass
class Score:
    system: str
    mode: str
    benchmark: str
    division: str | None
    required_runs: int
    runs: list[RunRow]
    notes: list[str] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)  # inconsistencies: errors under --strict
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (file, why) left out of every figure
    target: str | None = None  # the quality target as the official checker defines it
    run_target: str | None = None  # the runs' own train.target (hpcbench_target), when they agree
    suite: str = "hpc"  # hpc | training
    ruleset: str = "3.0.0"
    system_division: str | None = None  # division in systems/<system>.json
    folder_division: str | None = None  # closed/ or open/ above <org>/results (MLPerf's package layout)
    closed: bool = False  # the logs, the system JSON or the folder claim the closed division: logs judged closed-ready
    # strong
    score_min: float | None = None
    olympic_min: float | None = None  # the olympic mean; score_min is it x scaling_factor (hpcbench.report.scaling)
    scaling_factor: float | None = None  # from the folder's shipped scaling.json; None: no file
    scaling_file: str | None = None
    # weak
    T: int | None = None
    S: int | None = None
    M: int = 0
    M_prime: int = 0
    ttta_min: float | None = None  # official definition: over the converged instances only
    models_per_min: float | None = None
    job_span_min: float | None = None  # ours: max(run_stop) - min(run_start) over every instance

    @property
    def rejected(self) -> list[tuple[str, str]]:
        """(log, why) for every log that is not scored because it was rejected (not merely non-converged)."""
        return [(r.name, "; ".join(r.rejected)) for r in self.runs if r.rejected]

    @property
    def count_met(self) -> bool:
        """The rules' run count: runs (strong) or converged models (weak)."""
        return (self.M if self.mode == "strong" else self.M_prime) >= self.required_runs

    @property
    def scored(self) -> bool:
        """Our figure exists and the run count is met (what the summarizer would score); whether it is a
        valid MLPerf result also needs the official tools and no rejected log: see ``compare.verdict``."""
        return (self.score_min if self.mode == "strong" else self.ttta_min) is not None and self.count_met

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return {**asdict(self), "scored": self.scored, "rejected": [list(x) for x in self.rejected],
                "not_closed_ready": [list(x) for x in self.not_closed_ready]}

    @property
    def not_closed_ready(self) -> list[tuple[str, str]]:
        """(log, why) for every log of a closed folder that is not closed-ready."""
        return [(r.name, "; ".join(r.closed_reasons)) for r in self.runs if r.closed_reasons]

    @property
    def failed_instances(self) -> list[tuple[str, str]]:
        """Weak scaling: (log, outcome) of every instance log that is not a converged model and not rejected
        (those are named as rejected), unreadable files included: what ``--prune-failed`` moves aside."""
        if self.mode != "weak":
            return []
        return ([(r.name, r.status) for r in self.runs if not r.converged and not r.rejected]
                + [(name, "unreadable") for name, _ in self.skipped])


def _start(group: Group, mode: str, t0_ms: float | None) -> Score:
    """The fields both modes share, and the checks of the logs against each other and the system file."""
    runs = group.runs
    required = registry.required_runs(group.benchmark)
    divs = sorted({r.division for r in runs if r.division})
    division = divs[0] if len(divs) == 1 else ("mixed" if divs else None)
    s = Score(group.system, mode, group.benchmark, division, required, [RunRow.of(r, t0_ms) for r in runs],
              skipped=[(p.name, why) for p, why in group.skipped], suite=group.suite, ruleset=group.ruleset)
    tgt = target_for(group.benchmark, division)
    s.target = tgt.describe() if tgt else None
    own = {str(r.settings["target"]) for r in runs if "target" in r.settings}
    s.run_target = own.pop() if len(own) == 1 else None
    if tgt is not None and tgt.low == float("-inf"):
        s.notes.append(f"the {division} division of {group.suite} {group.ruleset} sets no quality threshold for "
                       f"{group.benchmark} ({tgt.describe()}): every complete log counts, as the official summarizer "
                       "counts it; whether a run met its preset's own target is its run_stop status")
    if tgt is None:
        s.notes.append(f"no official quality target is known for '{group.benchmark}': runs count on "
                       "run_stop status=success alone")
    if len(divs) > 1:
        by_div = "; ".join(f"{d}: " + ", ".join(r.name for r in runs if r.division == d) for d in divs)
        s.flags.append(f"the logs disagree on submission_division ({by_div}); one results folder holds one "
                       "division (systems/<system>.json states it for all of them)")
    if group.system_problem and group.official_layout:
        s.flags.append(group.system_problem)
    desc = group.system_desc or {}
    s.system_division = desc.get("division") if isinstance(desc.get("division"), str) else None
    if group.system_desc is not None and s.system_division != division:
        odd = [r.name for r in runs if r.division != s.system_division]
        s.flags.append(f"division mismatch: {group.system_file or 'the system file'} says "
                       f"{s.system_division!r} but the logs say {division!r} ({', '.join(odd[:5])}"
                       f"{', ...' if len(odd) > 5 else ''})")
    s.folder_division = folder_division(group.folder) if group.official_layout else None
    if s.folder_division is not None and any(r.division != s.folder_division for r in runs):
        odd = [r.name for r in runs if r.division != s.folder_division]
        s.flags.append(f"division mismatch: the submission folder is under {s.folder_division}/ but "
                       f"{', '.join(odd[:5])}{', ...' if len(odd) > 5 else ''} say(s) otherwise in submission_division")
    s.closed = claims_closed([*(r.division for r in runs), s.system_division, s.folder_division])
    if s.closed:
        for row, run in zip(s.runs, runs):
            row.closed_reasons = readiness(run, s.system_division, s.folder_division)
    # the official checker asks only that cache_clear has a value; the rules ask for the cache flushed, which true
    # says, or null as the HPC references log it (closed.cache_clear_problem; hpcbench's own logs: only true)
    uncleared = [r.name for r in runs if r.division == "closed" and cache_clear_problem(r) is not None]
    if uncleared:
        s.flags.append(f"closed division: {len(uncleared)} run(s) did not log cache_clear true ("
                       f"{', '.join(uncleared[:5])}{', ...' if len(uncleared) > 5 else ''}): the page cache was "
                       "not (known to be) dropped before them; closed results need it cleared before each run")
    for r in runs:
        for p in r.problems:
            if any(why in p for why in FLAGGED_PROBLEMS):
                s.flags.append(f"{r.name}: {p}")
    for key in sorted({k for r in runs for k in r.settings}):
        having = [r for r in runs if key in r.settings]  # a run that failed before choosing logged none
        seen = {str(r.settings[key]) for r in having}
        if len(seen) > 1:  # e.g. channels-last "auto" decided by each instance's own probe
            by = ", ".join(f"{r.name}={r.settings[key]}" for r in having[:6]) + (", ..." if len(having) > 6 else "")
            s.notes.append(f"the runs used different {key} settings ({by}): times compare different settings; "
                           f"set train.{key} explicitly for a uniform set")
    late = [r for r in runs if r.after_stop]
    if late:  # NVIDIA's and HPE's HPC v3.0 CosmoFlow keep training after run_stop
        names = ", ".join(r.name for r in late[:5]) + (", ..." if len(late) > 5 else "")
        s.notes.append(f"{len(late)} log(s) keep training or evaluating after run_stop ({names}): those records are "
                       "not used; epochs, evaluations and throughput count up to run_stop, as the rules time the run")
    for name, why in s.skipped:
        s.notes.append(f"{name} left out: {why}")
    return s


#: a log's problems that contradict the log itself, flagged (``--strict`` exits 1): the timed run starting before
#: initialization ends, a negative run, a status that denies an evaluation which met the target, settings logged
#: twice with two values
FLAGGED_PROBLEMS = ("before init_stop", "run_stop is before run_start", "but an evaluation met the target",
                    "logged again with another value")


def shared_seeds(runs: list[RunLog]) -> list[tuple[int, list[str], bool]]:
    """(seed, the runs that log it, whether two of them log it from the same file and line: what the official seed
    check compares) for every seed that more than one run logs."""
    by_seed: dict[int, list[RunLog]] = {}
    for r in runs:
        if r.seed is not None:
            by_seed.setdefault(r.seed, []).append(r)
    out = []
    for seed, having in sorted(by_seed.items()):
        if len(having) > 1:
            places = [r.seed_at for r in having]
            out.append((seed, [r.name for r in having], len(set(places)) < len(places)))
    return out


def score_strong(group: Group) -> Score:
    runs = group.runs
    s = _start(group, "strong", None)
    ok = [r.time_to_solution_s for r in runs if r.converged]
    failed = len(runs) + len(group.skipped) - len(ok)  # as the official summarizer: unreadable files count as dropped
    s.M, s.M_prime = len(runs) + len(group.skipped), len(ok)
    _note_rejected(s, "counted as failed runs, as the official summarizer counts a file its checker rejects")
    scales = [r.instance_scale for r in runs if r.instance_scale is not None]
    s.S = max(scales) if scales else None
    shared = shared_seeds(runs)
    if shared:
        if s.division != "closed":
            checker = "the official package checker checks seeds in the closed division only"
        elif any(same for _, _, same in shared):
            checker = "the official seed check fails"
        else:
            checker = ("the official seed check does not see it: it compares seeds logged from the same file and "
                       "line only")
        s.flags.append(f"runs share a seed (the rules require a different seed for each run; {checker}): "
                       + "; ".join(f"seed {seed}: {', '.join(names)}" for seed, names, _ in shared))
    dropped = registry.max_dropped_runs(group.benchmark)
    mean = olympic_mean([t / 60.0 for t in ok], failed, dropped)  # type: ignore[operator]
    s.score_min = mean
    if failed > dropped:
        s.notes.append(f"{failed} runs did not converge; the rules allow at most {dropped}: no score")
    elif failed:
        s.notes.append(f"{failed} non-converged or rejected run{'s' if failed > 1 else ''} counted as dropped slowest "
                       f"run{'s' if failed > 1 else ''} (olympic rule: {dropped} fastest and {dropped} slowest "
                       f"dropped)")
    if s.M < s.required_runs:
        s.notes.append(f"incomplete: {s.M} of the {s.required_runs} runs the rules require for {group.benchmark}; "
                       + ("the mean is shown but is not a valid MLPerf score" if mean is not None
                          else "no valid MLPerf score"))
    if mean is None and failed <= dropped:
        s.notes.append(f"too few runs for an olympic mean (need {2 * dropped + 1} or more)")
    return s


def _note_rejected(s: Score, how: str) -> None:
    bad = s.rejected
    if bad:
        s.notes.append(f"{len(bad)} rejected log{'s' if len(bad) > 1 else ''} not scored ({how}): "
                       + "; ".join(f"{n}: {why}" for n, why in bad))


def _not_overlapping(runs: list[RunLog]) -> list[str]:
    """Instances of one weak-scaling job run concurrently: every one must start before the earliest
    run_stop. Names the instances that started after some other instance had already stopped."""
    complete = [r for r in runs if r.timed]
    if len(complete) < 2:
        return []
    first_stop = min(r.run_stop_ms for r in complete)  # type: ignore[type-var]
    return [r.name for r in complete if r.run_start_ms > first_stop]  # type: ignore[operator]


def score_weak(group: Group) -> Score:
    runs = group.runs
    complete = [r for r in runs if r.timed]
    counted = [r for r in runs if r.converged]
    # offsets from the earliest run_start of any log, finished or not (no negative start for a truncated one);
    # a log whose times our checks reject is left out
    t0 = min((r.run_start_ms for r in runs if r.run_start_ms is not None and not r.rejections), default=None)
    s = _start(group, "weak", t0)
    s.M = len(runs) + len(group.skipped)
    s.M_prime = len(counted)
    _note_rejected(s, "not in M' and not in TTTa")
    scales = {r.instance_scale for r in runs if r.instance_scale is not None}
    if len(scales) > 1:
        s.notes.append(f"instances have different scales {sorted(scales)}: S is not well defined")
    s.S = max(scales) if scales else None
    desc = group.system_desc or {}
    try:
        s.T = int(desc["number_of_nodes"]) * max(int(desc.get("accelerators_per_node") or 0), 1)
    except (KeyError, TypeError, ValueError):
        if s.S is not None:
            s.T = s.S * s.M
            s.notes.append("no usable number_of_nodes in systems/<system>.json: T taken as M x S")
    if counted:  # the official definition: max(run_stop) - min(run_start) over the converged instances
        start = min(r.run_start_ms for r in counted)  # type: ignore[type-var]
        stop = max(r.run_stop_ms for r in counted)  # type: ignore[type-var]
        s.ttta_min = (stop - start) / 60000.0  # type: ignore[operator]
        s.models_per_min = s.M_prime / s.ttta_min if s.ttta_min > 0 else None
    if complete:
        s.job_span_min = (max(r.run_stop_ms for r in complete) - t0) / 60000.0  # type: ignore[operator,type-var]
    left = [r for r in runs if not r.converged]
    if left or group.skipped:
        parts = [f"{r.name.removesuffix('.txt')} {r.outcome}" for r in left]
        why = ", ".join(parts + [f"{n.removesuffix('.txt')} unreadable" for n, _ in s.skipped])
        s.notes.append(f"{s.M - s.M_prime} of {s.M} instances are not in M' ({why}); as in the official summarizer, "
                       "TTTa spans only the converged instances")
        if s.job_span_min is not None and s.ttta_min is not None and s.job_span_min > s.ttta_min + 1e-9:
            s.notes.append(f"ours, not an MLPerf figure: the whole job (every instance that logged run_start "
                           f"and run_stop) spanned {s.job_span_min:.4f} min")
    late = _not_overlapping(runs)
    if late:
        s.flags.append(f"instances of this weak-scaling set do not overlap in time: {', '.join(late)} started "
                       "after another instance had stopped (separate jobs in one folder?)")
    if s.M_prime < s.required_runs:
        s.notes.append(f"M'={s.M_prime} < {s.required_runs} converged models the rules require for a scored "
                       f"{group.benchmark} weak-scaling result")
    return s


def score(group: Group) -> Score:
    s = score_strong(group) if group.mode == "strong" else score_weak(group)
    apply_scaling(s, group)  # scaling.json's factor, as the official summarizer applies it
    return s
