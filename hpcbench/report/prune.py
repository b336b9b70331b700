"""``hpcbench report --prune-failed``: move the logs of failed weak-scaling instances out of the results folder.

A weak-scaling job keeps every instance's log, failed ones too (aborted, target missed, no run_stop, an
unreadable file). The official package checker counts each of them as a non-compliant file and rejects a
folder with two or more, while M', TTTa and the summarizer's score use only the converged instances. Pruning
moves each failed instance's log to ``ROOT/hpcbench/<system>/weak/<benchmark>/pruned_failed/`` (beside the
job's own summary, outside what the official tools read): nothing is deleted, nothing is overwritten, and
either every planned move happens or none does (a failed rename moves the earlier ones back).

Rejected logs (a duplicated run, absurd times, or a log the official compliance checker rejects for more than a
missed target, e.g. another benchmark's log) are not failed instances but broken or edited files: they stay in
place for the user to look at, and the report keeps calling the folder not valid. The compliance checker is run
here on each candidate, as the report runs it, so that the two agree on which logs are rejected.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from hpcbench.common.errors import ConfigError, HpcbenchError
from hpcbench.results_layout import extras_dir

from .discover import Group, discover, submission_root

PRUNED = "pruned_failed"


@dataclass(frozen=True)
class Move:
    source: Path
    dest: Path
    why: str  # the instance's outcome: aborted, target_missed, incomplete, unreadable, ...


def failed_logs(group: Group) -> list[tuple[Path, str]]:
    """(log, outcome) of every failed instance of a weak-scaling group: not a converged model, not rejected."""
    if group.mode != "weak":
        return []
    return ([(r.path, r.outcome) for r in group.runs if not r.converged and not r.rejected]
            + [(path, "unreadable") for path, _ in group.skipped])


def plan(results: Path, rulesets: Mapping[str, str] | None = None) -> tuple[list[Move], list[tuple[Path, str]]]:
    """(the moves, the rejected logs left in place with why) for every weak-scaling folder under ``results``, its logs
    checked under the rulesets the report uses (``rulesets``: ``--ruleset``, as :func:`.discover.discover` takes it)."""
    root = submission_root(Path(results))
    if root is None:
        raise ConfigError(f"--prune-failed: {results} is not a submission folder (results/<system>/weak/<benchmark>/ "
                          "and systems/<system>.json); nothing was moved")
    moves: list[Move] = []
    kept: list[tuple[Path, str]] = []
    for g in discover(Path(results), rulesets):
        if g.mode != "weak" or not g.official_layout:
            continue
        dest = extras_dir(root, g.system, "weak", g.benchmark) / PRUNED
        _official_rejections(g)
        moves += [Move(path, dest / path.name, why) for path, why in failed_logs(g)]
        kept += [(r.path, "; ".join(r.rejections) or f"official compliance checker: {r.official_rejection}")
                 for r in g.runs if r.rejected]
    return moves, kept


def _official_rejections(group: Group) -> None:
    """Set each not-converged run's ``official_rejection`` as the report sets it (the compliance checker with
    the group's suite and ruleset); without mlperf-logging installed, only our own checks reject."""
    from .official import available, check_compliance, rejection

    if not available():
        return
    for run in group.runs:
        if not run.converged and not run.rejected:
            passed, output = check_compliance(run.path, group.suite, group.ruleset)
            run.official_rejection = rejection(run, passed, output)


def prune_failed(results: Path, rulesets: Mapping[str, str] | None = None) -> tuple[list[Move], list[tuple[Path, str]]]:
    """Move every failed weak-scaling instance's log aside; (what moved, the rejected logs left in place).
    Refuses before moving anything when a destination exists (an earlier prune of a log of the same name)."""
    moves, kept = plan(results, rulesets)
    taken = [m.dest for m in moves if m.dest.exists() or m.dest.is_symlink()]
    if taken:
        raise ConfigError("--prune-failed: " + ", ".join(str(p) for p in taken) + " already exist(s) (pruned "
                          "from an earlier job?); move them elsewhere first. Nothing was moved")
    done: list[Move] = []
    try:
        for m in moves:
            m.dest.parent.mkdir(parents=True, exist_ok=True)
            os.rename(m.source, m.dest)  # atomic within one file system; never a copy and delete
            done.append(m)
    except OSError as exc:
        undone = []
        for m in reversed(done):
            try:
                os.rename(m.dest, m.source)
            except OSError:
                undone.append(m)
        left = ("; could not move back: " + ", ".join(f"{m.dest} (belongs at {m.source})" for m in undone)
                if undone else "; the logs moved before it were moved back")
        raise HpcbenchError(f"--prune-failed: could not move {exc.filename} to {exc.filename2}: "
                            f"{exc.strerror}{left}") from None
    return done, kept
