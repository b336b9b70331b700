"""Our numbers next to what the official tools produced; every difference becomes a listed disagreement.
Where the official summarizer produced nothing there is nothing to compare: the check says so
(``agree=None``) instead of inventing an official figure."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from .official import Official, SubmissionChecks
from .scoring import Score

TOL_MIN = 1e-6  # minutes (the logs have millisecond resolution: 1.7e-5 min)
NOT_PRODUCED = "none produced"


@dataclass
class Check:
    what: str
    ours: Any
    official: Any
    agree: bool | None  # None: the official tools gave no figure to compare with

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _num_eq(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return abs(a - b) <= TOL_MIN


def compare(score: Score, off: Official) -> list[Check]:
    checks: list[Check] = []
    for row in score.runs:
        passed = off.compliance.get(row.name, (False, ""))[0]
        ours: Any = row.converged if not row.rejected else f"no (rejected: {'; '.join(row.rejected)})"
        checks.append(Check(f"{row.name}: counted (target met, as the official compliance checker decides)",
                            ours, passed, row.converged == passed))
    for name, _ in score.skipped:
        passed = off.compliance.get(name, (False, ""))[0]
        checks.append(Check(f"{name}: counted (ours: unreadable, left out / official: compliance checker)",
                            False, passed, not passed))
    # a summarizer that crashed (e.g. on a log of an unknown benchmark) judged nothing: no agreement to
    # check; the verdict names the failed tool
    official_scored = off.produced if off.summarizer_ran and not (off.crashed and not off.produced) else None
    ours_scored = score.score_min is not None if score.mode == "strong" else score.scored
    if score.mode == "strong":
        checks.extend(_strong_figures(score, off))
    else:
        checks.append(_count("M' (converged models)", score.M_prime, off.number_of_models, off))
        checks.append(_count("S (instance scale)", score.S, off.instance_scale, off))
        checks.append(_figure("TTTa (min)", score.ttta_min, off))
    checks.append(Check("scored by the summarizer" if score.mode == "weak" else "olympic mean produced",
                        ours_scored, official_scored,
                        None if official_scored is None else ours_scored == official_scored))
    return checks


SCORE = "score = olympic mean x scaling_factor (min)"


def _strong_figures(score: Score, off: Official) -> list[Check]:
    """The olympic mean; where the folder ships a scaling.json (or the summarizer applied a factor other than 1),
    the raw mean, the factor and the normalized score, which is what the summarizer writes out. Where the package
    checker's RCP check would leave another scaling.json than the shipped one, that factor is shown (not used)."""
    factor = score.scaling_factor
    theirs = off.scaling_factor
    if factor is None and (theirs is None or theirs == 1.0) and not score.scaling_file:
        checks = [_figure("olympic mean (min)", score.score_min, off)]
    else:
        src = "the folder's scaling.json, as shipped" if score.scaling_file else "no scaling.json shipped: 1"
        checks = [Check("olympic mean before scaling (min)", score.olympic_min, None, None),
                  Check(f"scaling_factor ({src})", factor,
                        theirs if off.produced else NOT_PRODUCED,
                        None if not off.produced or theirs is None
                        else abs((factor if factor is not None else 1.0) - theirs) <= 1e-12 * max(1.0, abs(theirs))),
                  _figure(SCORE, score.score_min, off)]
    if off.rcp_rewrote:
        checks.append(Check("scaling_factor the package checker's RCP check writes to scaling.json (on a copy; "
                            "not used: the figures use the shipped file)", factor if factor is not None else "none",
                            "file removed" if off.rcp_factor is None else off.rcp_factor, None))
    return checks


def _count(what: str, ours: int | None, theirs: int | None, off: Official) -> Check:
    if not off.produced:
        return Check(what, ours, NOT_PRODUCED, None)
    return Check(what, ours, theirs, ours == theirs)


def _figure(what: str, ours: float | None, off: Official) -> Check:
    if not off.produced:
        return Check(what, ours, NOT_PRODUCED, None)
    return Check(what, ours, off.score_min, _num_eq(ours, off.score_min))


def disagreements(checks: list[Check]) -> list[Check]:
    return [c for c in checks if c.agree is False]


@dataclass
class Verdict:
    """Whether a folder is a valid MLPerf result: every official tool passes (compliance checker,
    result summarizer, package and system-description checkers), the run count is met, no log was
    rejected, hpcbench agrees with the official tools and flagged no inconsistency, and (weak scaling) no
    failed instance's log is left in the folder. A folder that claims the closed division (a log, the
    system JSON or the folder says closed) is "a valid closed result" only when every log is also
    closed-ready (:mod:`.closed`: model parameter count, dataset sample counts, fixed hyperparameters,
    divisions). ``failures`` says which of these fails, per log where it applies."""

    valid: bool
    label: str
    failures: list[str]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


SCOPE_OPEN = "open-division checks: the official tools pass, the run count is met, no log was rejected"
SCOPE_CLOSED = ("a valid closed result: the official tools pass, the run count is met, no log was rejected, every "
                "log is closed-ready: the benchmark's parameter count, dataset sample counts and fixed "
                "hyperparameters, closed in the log, the system JSON and the folder")
PRUNE_HINT = "`hpcbench report --prune-failed` moves them aside"


def verdict(score: Score, off: Official | None, submission: SubmissionChecks | None, checks: list[Check],
            official_note: str = "", unchecked: int = 0) -> Verdict:
    """``unchecked``: logs of a closed folder with closed-readiness items not checked (logs hpcbench did not write
    do not log them); the valid label then says so instead of claiming every item was compared."""
    fails: list[str] = []
    if off is None:
        fails.append("official tools: not run" + (f" ({official_note})" if official_note else ""))
    elif not off.produced:
        fails.append(f"official result summarizer: no score for this folder ({off.why_none})")
    if off is not None:
        if submission is None or submission.package is None:
            fails.append("official package checker: not run")
        else:
            if not submission.package.ok:
                fails.append(f"official package checker: {submission.package.verdict()}")
            for name, run in submission.systems.items():
                if not run.ok:
                    fails.append(f"official system_desc_checker {name}: {run.verdict()}")
    for name, why in score.rejected:
        fails.append(f"{name}: rejected, not scored ({why})")
    if not score.count_met:
        fails.append(f"run count: {score.M} of the {score.required_runs} runs the rules require" if score.mode == "strong"
                     else f"run count: M'={score.M_prime} converged models of the {score.required_runs} the rules require")
    if (score.score_min if score.mode == "strong" else score.ttta_min) is None:
        fails.append("no score (see the notes)")
    for name, why in score.not_closed_ready:
        fails.append(f"{name}: not closed-ready ({why})")
    failed = score.failed_instances
    if failed:
        fails.append(f"weak scaling: {len(failed)} failed instance log(s) left in the folder ("
                     + ", ".join(f"{n} {o}" for n, o in failed) + "): each is a non-compliant file to the official "
                     f"package checker, which rejects a folder with two or more; {PRUNE_HINT}")
    for c in disagreements(checks):
        fails.append(f"hpcbench and the official tools disagree: {c.what}")
    for flag in score.flags:
        fails.append(f"inconsistency: {flag}")
    if fails:
        return Verdict(False, f"no ({len(fails)} failing: see below)", fails)
    scope = SCOPE_CLOSED if score.closed else SCOPE_OPEN
    if score.closed and unchecked:
        scope += (f"; in {unchecked} log(s) hpcbench did not write, what they do not log was not checked (the "
                  "'closed, not checked' lines)")
    return Verdict(True, "yes (" + scope + ")", [])
