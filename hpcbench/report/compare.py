"""Our numbers next to the official tools' numbers; every difference becomes a listed disagreement."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from .official import Official
from .scoring import Score

TOL_MIN = 1e-6  # minutes (the logs have millisecond resolution: 1.7e-5 min)


@dataclass
class Check:
    what: str
    ours: Any
    official: Any
    agree: bool

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
        ours_ok = row.status == "success"
        checks.append(Check(f"{row.name}: counted (ours: status=success / official: compliance)", ours_ok, passed,
                            ours_ok == passed))
        if ours_ok and row.name in off.per_run_min and row.time_to_solution_s is not None:
            mine = row.time_to_solution_s / 60.0
            theirs = off.per_run_min[row.name]
            checks.append(Check(f"{row.name}: run time (min)", round(mine, 6), round(theirs, 6), _num_eq(mine, theirs)))
    if score.mode == "strong":
        checks.append(Check("olympic mean (min)", score.score_min, off.score_min, _num_eq(score.score_min, off.score_min)))
    else:
        checks.append(Check("M' (converged models)", score.M_prime, off.number_of_models, score.M_prime == off.number_of_models))
        checks.append(Check("S (instance scale)", score.S, off.instance_scale, score.S == off.instance_scale))
        checks.append(Check("TTTa (min)", score.ttta_min, off.score_min, _num_eq(score.ttta_min, off.score_min)))
        checks.append(Check("scored (M' >= required)", score.valid, off.scored, score.valid == off.scored))
    return checks


def disagreements(checks: list[Check]) -> list[Check]:
    return [c for c in checks if not c.agree]
