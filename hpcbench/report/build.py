"""Build a whole report: discover, score, cross-check with the official tools, write files and plots."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import plots
from .compare import Check, compare
from .discover import Group, discover
from .official import Official, run_official
from .scoring import Score, score


@dataclass
class GroupReport:
    group: Group
    score: Score
    official: Official | None
    checks: list[Check]
    plots: list[Path] = field(default_factory=list)

    @property
    def disagreements(self) -> list[Check]:
        return [c for c in self.checks if not c.agree]

    def to_dict(self) -> dict[str, Any]:
        return {"score": self.score.to_dict(), "official": None if self.official is None else self.official.to_dict(),
                "checks": [c.to_dict() for c in self.checks], "plots": [str(p) for p in self.plots],
                "folder": str(self.group.folder)}


def build(results: Path, out: Path, official: bool = True, make_plots: bool = True) -> list[GroupReport]:
    reports = []
    for group in discover(results):
        sc = score(group)
        off = run_official(group) if official and group.official_layout else None
        reports.append(GroupReport(group, sc, off, compare(sc, off) if off is not None else []))
    if make_plots:
        out.mkdir(parents=True, exist_ok=True)
        for rep in reports:
            stem = f"{rep.score.system}_{rep.score.mode}_{rep.score.benchmark}"
            if rep.score.mode == "weak":
                rep.plots.append(plots.timeline(rep.score, out / f"{stem}_timeline.png"))
            rep.plots.append(plots.throughput(rep.score, out / f"{stem}_throughput.png"))
        by_bench: dict[tuple[str, str], list[Score]] = {}
        for rep in reports:
            by_bench.setdefault((rep.score.mode, rep.score.benchmark), []).append(rep.score)
        for (mode, bench), scores in by_bench.items():
            scales = {s.T if mode == "weak" else s.S for s in scores}
            if len(scales) > 1:
                path = plots.scaling_curve(scores, out / f"{mode}_{bench}_scaling.png")
                for rep in reports:
                    if rep.score in scores:
                        rep.plots.append(path)
    return reports
