"""Build a whole report: discover, score, cross-check with the official tools, write files and plots.

The report folder is replaced as a whole: everything is written to a temporary sibling, checked,
and renamed into place, so a reader never sees a half-written report or old numbers beside new
ones. When no report can be produced at all, an old report folder is removed (its numbers would
describe files that have since changed) and the error says so.
"""
from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcbench.common.errors import ConfigError, DataError, HpcbenchError

from . import plots
from .closed import closed_not_checked
from .compare import Check, Verdict, compare, disagreements, verdict
from .discover import Group, discover, submission_root
from .official import Official, SubmissionChecks, available, rejection, run_tools
from .scoring import Score, score

MARKER = "report.json"  # a folder holding this is one of ours and may be replaced


@dataclass
class GroupReport:
    group: Group
    score: Score
    official: Official | None
    checks: list[Check]
    verdict: Verdict
    plots: list[Path] = field(default_factory=list)

    @property
    def disagreements(self) -> list[Check]:
        return disagreements(self.checks)

    def to_dict(self) -> dict[str, Any]:
        return {"score": self.score.to_dict(), "official": None if self.official is None else self.official.to_dict(),
                "checks": [c.to_dict() for c in self.checks], "verdict": self.verdict.to_dict(),
                "plots": [str(p) for p in self.plots],
                "folder": str(self.group.folder),
                "rules": {"suite": self.group.suite, "ruleset": self.group.ruleset,
                          "source": self.group.ruleset_source},
                "closed_not_checked": closed_not_checked(self.group, self.score)}


@dataclass
class Report:
    groups: list[GroupReport]
    submission: SubmissionChecks | None  # None: not in the submission layout, or --no-official
    official_note: str = ""  # why the official tools did not run, if they did not

    def to_dict(self) -> dict[str, Any]:
        return {"groups": [g.to_dict() for g in self.groups],
                "submission_checks": None if self.submission is None else self.submission.to_dict(),
                "official_note": self.official_note}


def build(results: Path, plot_dir: Path | None, official: bool = True, plots_as: Path | None = None,
          rulesets: Mapping[str, str] | None = None) -> Report:
    """Score every benchmark folder under ``results``; plots go to ``plot_dir`` (None: no plots) and
    are recorded under the name they will have in ``plots_as`` (default ``plot_dir``); ``rulesets``:
    ``--ruleset`` (:func:`.discover.parse_rulesets`)."""
    groups = discover(results, rulesets)
    root = submission_root(Path(results))
    offs: dict[int, Official] = {}
    checks_root: SubmissionChecks | None = None
    note = ""
    if not official:
        note = "the official tools were not run (--no-official)"
    elif not available():
        note = "the official tools (mlperf-logging) are not installed: no official figures"
    elif root is None:
        note = ("not in a submission layout (results/<system>/<mode>/<benchmark>/ or results/<system>/<benchmark>/): "
                "the official tools were not run")
    else:
        offs, checks_root = run_tools(root, [g for g in groups if g.official_layout])
    reports = []
    for group in groups:
        off = offs.get(id(group))
        if off is not None:  # a log the official checker rejects is never scored
            for run in group.runs:
                passed, output = off.compliance.get(run.name, (False, "not checked"))
                run.official_rejection = rejection(run, passed, output)
        sc = score(group)
        checks = compare(sc, off) if off is not None else []
        unchecked = len(closed_not_checked(group, sc))
        reports.append(GroupReport(group, sc, off, checks, verdict(sc, off, checks_root, checks, note, unchecked)))
    if plot_dir is not None:
        _plots(reports, plot_dir, plots_as or plot_dir)
    return Report(reports, checks_root, note)


def _plots(reports: list[GroupReport], out: Path, final: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for rep in reports:
        stem = f"{rep.score.system}_{rep.group.label}_{rep.score.benchmark}"
        made = []
        if rep.score.mode == "weak":
            made.append(plots.timeline(rep.score, out / f"{stem}_timeline.png"))
        made.append(plots.quality(rep.score, rep.group.runs, out / f"{stem}_quality.png"))
        made.append(plots.throughput(rep.score, out / f"{stem}_throughput.png"))
        rep.plots.extend(final / p.name for p in made)
    by_bench: dict[tuple[str, str], list[GroupReport]] = {}
    for rep in reports:
        by_bench.setdefault((rep.score.mode, rep.score.benchmark), []).append(rep)
    for (mode, bench), reps in by_bench.items():
        scores = [r.score for r in reps]
        if len({s.T if mode == "weak" else s.S for s in scores}) > 1:
            path = plots.scaling_curve(scores, out / f"{mode}_{bench}_scaling.png")
            for rep in reps:
                rep.plots.append(final / path.name)


def _is_ours(folder: Path) -> bool:
    return folder.is_dir() and ((folder / MARKER).is_file() or not any(folder.iterdir()))


def write_report(results: Path, out: Path, official: bool = True, make_plots: bool = True,
                 rulesets: Mapping[str, str] | None = None) -> Report:
    """Build the report into a temporary sibling of ``out``, verify it and rename it into place."""
    from .tables import write_csv, write_json

    out = Path(out)
    if not Path(results).exists():
        raise DataError(f"results directory {results} does not exist")
    if out.exists() and not _is_ours(out):
        raise ConfigError(f"{out} exists and is not a report folder (no {MARKER}); choose another --out")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        rep = build(results, tmp if make_plots else None, official, plots_as=out, rulesets=rulesets)
        write_json(tmp / MARKER, rep.to_dict())
        write_csv(tmp / "report.csv", [(g.score, g.official, g.verdict) for g in rep.groups])
        _verify(tmp, rep)
        _swap(tmp, out)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if out.exists() and _is_ours(out):
            # its numbers may describe other logs: out of the way under a name that says so, not lost
            stale = stale_path(out)
            shutil.rmtree(stale, ignore_errors=True)
            out.rename(stale)
        if isinstance(exc, Exception) and not isinstance(exc, HpcbenchError):
            raise HpcbenchError(f"could not write the report {out}: {type(exc).__name__}: {exc}") from exc
        raise
    return rep


def stale_path(out: Path) -> Path:
    """Where a previous report goes when a new one cannot be made."""
    return out.with_name(out.name + ".stale")


def _verify(tmp: Path, rep: Report) -> None:
    data = json.loads((tmp / MARKER).read_text())
    if len(data["groups"]) != len(rep.groups):
        raise DataError(f"{tmp / MARKER}: wrote {len(data['groups'])} groups, expected {len(rep.groups)}")
    for g in rep.groups:
        for p in g.plots:
            f = tmp / p.name
            if not f.is_file() or f.stat().st_size == 0:
                raise DataError(f"plot {f} was not written")


def _swap(tmp: Path, out: Path) -> None:
    old = out.with_name(f".{out.name}.old-{os.getpid()}")
    if out.exists():
        out.rename(old)
    tmp.rename(out)
    shutil.rmtree(old, ignore_errors=True)
