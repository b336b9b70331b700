"""Find result logs in the official submission layouts: hpc
``ROOT/results/<system>/{strong,weak}/<benchmark>/result_*.txt``, training
``ROOT/results/<system>/<benchmark>/result_*.txt``, with ``ROOT/systems/<system>.json``. A training
folder is scored like a strong-scaling one (time to train, olympic mean).

Suite and ruleset: a benchmark's suite is its workload's (the registry's record) or, for one no workload here
implements, the suite whose rules in the installed mlperf-logging define it (:mod:`.unimplemented`). A
benchmark no suite defines is never taken as another suite's: each of its logs is rejected, naming it. The
ruleset is one per suite for the whole folder (a submission is one round, and the official tools check a
folder under one), chosen, first that applies:

1. ``--ruleset`` (``X.Y.Z`` or ``SUITE=X.Y.Z``);
2. the logs, where they name one (``hpcbench_ruleset``, which hpcbench's own logs carry; no log of the official
   references does: the v4.0 and v5.1 training and v3.0 HPC results carry no ruleset or mlperf-logging version
   key);
3. hpcbench's default: the one ruleset of the folder's benchmarks' records (``common.suites``' default for a
   benchmark without a workload), when it defines every benchmark of the folder;
4. the folder's benchmarks: the newest installed ruleset that defines all of them (one of the defaults where
   one is), e.g. training 4.0.0 for a folder of bert, dlrm_dcnv2 and resnet (resnet is in no later round);
5. else the newest default, and the logs of a benchmark it does not define are rejected, naming it.

``Group.ruleset_source`` says which one set it; the report prints it on each folder's ``rules:`` line."""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcbench.common.errors import ConfigError, DataError
from hpcbench.common.suites import SUITES, suite as suite_named
from hpcbench import registry

from . import unimplemented
from .logs import NotAResultLog, RunLog, parse_log

MODES = ("strong", "weak")


@dataclass
class Group:
    """All result logs of one (system, mode, benchmark) folder."""

    system: str
    mode: str  # strong | weak
    benchmark: str
    folder: Path
    runs: list[RunLog] = field(default_factory=list)
    system_desc: dict[str, Any] | None = None
    official_layout: bool = True  # False: loose files the official summarizer cannot read
    skipped: list[tuple[Path, str]] = field(default_factory=list)  # result files left out, and why
    system_file: Path | None = None
    system_problem: str | None = None  # the systems JSON is missing or unreadable
    suite: str = "hpc"  # hpc | training: whose rules score it and which official tools check it
    ruleset: str = "3.0.0"  # one per suite for the whole folder (see the module's docstring)
    ruleset_source: str = ""  # what chose the ruleset: --ruleset, the logs, hpcbench's default, the benchmarks
    layout_suite: str = "hpc"  # the suite the folder's layout says (a mode folder: hpc; none: training)

    @property
    def rules(self) -> str:
        """'training 4.0.0 (set by ...)'."""
        return f"{self.suite} {self.ruleset}" + (f" ({self.ruleset_source})" if self.ruleset_source else "")

    @property
    def label(self) -> str:
        """strong | weak for hpc; training for a training-suite folder (no mode)."""
        return self.mode if self.suite == "hpc" else "training"


def _parse_all(files: list[Path]) -> tuple[list[RunLog], list[tuple[Path, str]]]:
    """Every file that is an MLPerf log at all; the others are named with the reason and left out
    (the official summarizer likewise drops a file it cannot read and scores the rest)."""
    runs, skipped = [], []
    for f in files:
        try:
            runs.append(parse_log(f))
        except NotAResultLog as exc:
            skipped.append((f, str(exc)))
    return runs, skipped


def submission_root(path: Path) -> Path | None:
    """The folder holding results/ (and systems/), if ``path`` is or is inside such a tree."""
    path = path.resolve()
    if (path / "results").is_dir():
        return path
    if path.name == "results" and path.is_dir():
        return path.parent
    return None


def _sort_key(p: Path) -> tuple[int, str]:
    stem = p.stem.rsplit("_", 1)[-1]
    return (int(stem), p.name) if stem.isdigit() else (1 << 30, p.name)


def _load_system(root: Path, system: str) -> tuple[dict[str, Any] | None, str | None]:
    """(the system description, or None; why it could not be used, or None)."""
    f = root / "systems" / f"{system}.json"
    if not f.exists():
        return None, f"no system description {f}"
    try:
        desc = json.loads(f.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        return None, f"system file {f} is not valid JSON: {exc}"
    if not isinstance(desc, dict):
        return None, f"system file {f}: expected a JSON object"
    return desc, None


def parse_rulesets(values: list[str] | None) -> dict[str, str]:
    """``--ruleset`` values: ``X.Y.Z`` (every suite of the folder) or ``SUITE=X.Y.Z``; suite -> ruleset, with
    ``*`` for the plain form. Each must be a ruleset the installed mlperf-logging has."""
    out: dict[str, str] = {}
    installed = unimplemented.known_rulesets()
    for value in values or []:
        name, sep, ruleset = value.strip().rpartition("=")
        key = name.strip() if sep else "*"
        ruleset = ruleset.strip()
        if key != "*" and key not in SUITES:
            raise ConfigError(f"--ruleset {value}: unknown suite {key!r}; expected X.Y.Z or SUITE=X.Y.Z with SUITE "
                              f"one of {', '.join(SUITES)}")
        if len(unimplemented.version_key(ruleset)) != 3 or ruleset.count(".") != 2:
            raise ConfigError(f"--ruleset {value}: expected a ruleset X.Y.Z (e.g. 4.0.0) or SUITE=X.Y.Z")
        suites = [key] if key != "*" else list(SUITES)
        if any(installed[s] for s in suites) and not any(ruleset in installed[s] for s in suites):
            raise ConfigError(f"--ruleset {value}: the installed mlperf-logging has no such ruleset (it has "
                              f"{unimplemented.describe_installed()})")
        if key in out and out[key] != ruleset:
            raise ConfigError(f"--ruleset given twice for {'every suite' if key == '*' else key}: {out[key]} and "
                              f"{ruleset}")
        out[key] = ruleset
    return out


def _suite_of(g: Group) -> str:
    """The group's suite: the one whose rules define its benchmark, else the one its layout says (its logs
    are then rejected, :func:`_reject`)."""
    return registry.known_suite(g.benchmark) or g.layout_suite


def _logged_rulesets(groups: list[Group]) -> set[str]:
    """Rulesets the logs name (hpcbench_ruleset: 'X.Y.Z' or 'SUITE X.Y.Z')."""
    return {str(r.settings["ruleset"]).split()[-1] for g in groups for r in g.runs if r.settings.get("ruleset")}


def _choose(suite: str, groups: list[Group], explicit: Mapping[str, str]) -> tuple[str, str]:
    """(the ruleset of the folder's ``suite`` groups, what chose it): see the module's docstring."""
    installed = unimplemented.known_rulesets().get(suite, {})
    given = explicit.get(suite) or explicit.get("*")
    if given:
        if installed and given not in installed:
            raise ConfigError(f"--ruleset {given}: the folder has {suite}-suite benchmarks and the installed "
                              f"mlperf-logging has no {suite} {given} ({unimplemented.describe_installed()}); give "
                              f"SUITE=X.Y.Z per suite")
        return given, "set by --ruleset"
    benches = sorted({g.benchmark for g in groups if registry.known_suite(g.benchmark) == suite})
    named = _logged_rulesets(groups)
    logged = {r for r in named if r in installed or not installed}
    if named - logged:
        return _fallback(suite, benches, installed, f"the logs name {', '.join(sorted(named - logged))}, which the "
                         f"installed mlperf-logging does not have; ")
    if len(logged) == 1:
        (ruleset,) = logged
        return ruleset, "named by the logs (hpcbench_ruleset)"
    return _fallback(suite, benches, installed,
                     f"the logs name several ({', '.join(sorted(logged))}); " if logged else "the logs name none; ")


def _fallback(suite: str, benches: list[str], installed: Mapping[str, frozenset[str]],
              none_said: str) -> tuple[str, str]:
    """Steps 3 to 5 of the module's docstring: hpcbench's default, else the folder's benchmarks."""
    defaults = sorted({registry.suite_of(b)[1] for b in benches} or {suite_named(suite).default_ruleset},
                      key=unimplemented.version_key)
    defining = [r for r, known in installed.items() if set(benches) <= known]
    listed = ", ".join(benches) or "none known"
    if len(defaults) == 1 and (defaults[0] in defining or not installed):
        return defaults[0], f"hpcbench's default for {listed}; {none_said}--ruleset sets another"
    if defining:
        preferred = [r for r in defining if r in defaults]
        ruleset = (preferred or defining)[-1]
        return ruleset, (f"inferred: the newest installed {suite} ruleset that defines every benchmark of the folder "
                         f"({listed}); {none_said}--ruleset sets another")
    return defaults[-1], (f"hpcbench's default; no installed {suite} ruleset defines every benchmark of the "
                          f"folder ({listed}); {none_said}--ruleset sets another")


def _reject(g: Group) -> None:
    """Reject every log of a benchmark that no suite defines, or that the folder's ruleset does not, naming
    it: no rules check or score it there (the official checker fails such a log on a missing rules file)."""
    suite = registry.known_suite(g.benchmark)
    if suite is None:
        why = str(registry.UnknownBenchmark(g.benchmark))
        if not any(r.benchmark for r in g.runs):
            why += " (the name is the folder's: no log states submission_benchmark)"
    else:
        installed = unimplemented.known_rulesets().get(suite, {})
        if not installed or g.benchmark in installed.get(g.ruleset, frozenset()):
            return
        having = unimplemented.rulesets_of(g.benchmark).get(suite, [])
        why = (f"benchmark {g.benchmark!r} is not in {suite} {g.ruleset}, the ruleset this folder is checked under "
               f"({g.ruleset_source.split(';')[0]}): the official checker has no rules for it there"
               + (f"; {suite} {', '.join(having)} define it" if having else ""))
    for run in g.runs:
        run.rejections.append(why)


def _set_rules(groups: list[Group], explicit: Mapping[str, str]) -> None:
    """One ruleset per suite for all of ``groups`` (one folder), and the rejections it implies."""
    for g in groups:
        g.suite = _suite_of(g)
    for suite in sorted({g.suite for g in groups}):
        mine = [g for g in groups if g.suite == suite]
        ruleset, source = _choose(suite, mine, explicit)
        for g in mine:
            g.ruleset, g.ruleset_source = ruleset, source
    for g in groups:
        _reject(g)


def discover(path: Path, rulesets: Mapping[str, str] | None = None) -> list[Group]:
    """Every benchmark folder under ``path``; ``rulesets`` (:func:`parse_rulesets`) overrides the rulesets
    the folder's logs and benchmarks would choose."""
    path = Path(path)
    if not path.exists():
        raise DataError(f"results directory {path} does not exist")
    root = submission_root(path)
    groups: list[Group] = []
    if root is not None:
        for sysdir in sorted(p for p in (root / "results").iterdir() if p.is_dir()):
            desc, desc_problem = _load_system(root, sysdir.name)
            folders = [(mode, bdir) for mode in MODES
                       for bdir in sorted(p for p in (sysdir / mode).glob("*") if p.is_dir())]
            # the training layout: benchmark folders straight under the system
            folders += [("strong", bdir) for bdir in sorted(p for p in sysdir.iterdir() if p.is_dir())
                        if bdir.name not in MODES]
            for mode, bdir in folders:
                files = sorted(bdir.glob("result_*.txt"), key=_sort_key)
                if files:
                    runs, skipped = _parse_all(files)
                    groups.append(Group(sysdir.name, mode, bdir.name, bdir, runs, desc, True, skipped,
                                        root / "systems" / f"{sysdir.name}.json", desc_problem,
                                        layout_suite="hpc" if bdir.parent.name in MODES else "training"))
    else:  # loose logs: group by folder, mode from the folder name when it says so
        by_folder: dict[Path, list[Path]] = {}
        for f in sorted(path.rglob("result_*.txt"), key=_sort_key):
            by_folder.setdefault(f.parent, []).append(f)
        for folder, files in sorted(by_folder.items()):
            runs, skipped = _parse_all(files)
            bench = next((r.benchmark for r in runs if r.benchmark), folder.name)
            mode = next((m for m in MODES if m in folder.parts), "weak" if len(runs) > 1 and _overlap(runs) else "strong")
            if registry.known_suite(bench) == "training":
                mode = "strong"  # training runs are scored by time to train, concurrent or not
            system = next((r.platform for r in runs if r.platform), "unknown")
            groups.append(Group(system, mode, bench, folder, runs, None, False, skipped))
    if not groups:
        raise DataError(f"no result_*.txt logs under {path} (expected results/<system>/<strong|weak>/<benchmark>/ "
                        "for the hpc suite or results/<system>/<benchmark>/ for the training suite)")
    _set_rules(groups, rulesets or {})
    return groups


def _overlap(runs: list[RunLog]) -> bool:
    """Runs that overlap in time are concurrent instances (weak scaling), not repeats."""
    spans = sorted((r.run_start_ms, r.run_stop_ms) for r in runs if r.timed)
    return any(b[0] < a[1] for a, b in zip(spans, spans[1:]))  # type: ignore[operator]
