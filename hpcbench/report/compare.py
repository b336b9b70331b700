"""Our numbers next to what the official tools produced; every difference becomes a listed disagreement.
Where the official summarizer produced nothing there is nothing to compare: the check says so
(``agree=None``) instead of inventing an official figure."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from .official import Official
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
        checks.append(Check(f"{row.name}: counted (target met, as the official compliance checker decides)",
                            row.converged, passed, row.converged == passed))
    for name, _ in score.skipped:
        passed = off.compliance.get(name, (False, ""))[0]
        checks.append(Check(f"{name}: counted (ours: unreadable, left out / official: compliance checker)",
                            False, passed, not passed))
    official_scored = off.produced if off.summarizer_ran else None
    ours_scored = score.score_min is not None if score.mode == "strong" else score.valid
    if score.mode == "strong":
        checks.append(_figure("olympic mean (min)", score.score_min, off))
    else:
        checks.append(_count("M' (converged models)", score.M_prime, off.number_of_models, off))
        checks.append(_count("S (instance scale)", score.S, off.instance_scale, off))
        checks.append(_figure("TTTa (min)", score.ttta_min, off))
    checks.append(Check("scored by the summarizer" if score.mode == "weak" else "olympic mean produced",
                        ours_scored, official_scored,
                        None if official_scored is None else ours_scored == official_scored))
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
