"""Find result logs in the official submission layouts: hpc
``ROOT/results/<system>/{strong,weak}/<benchmark>/result_*.txt``, training
``ROOT/results/<system>/<benchmark>/result_*.txt``, with ``ROOT/systems/<system>.json``. A training
folder is scored like a strong-scaling one (time to train, olympic mean); its suite and ruleset come
from the registry's entry for the benchmark."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcbench.common.errors import DataError
from hpcbench import registry

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
    ruleset: str = "3.0.0"

    def __post_init__(self) -> None:
        self.suite, self.ruleset = registry.suite_of(self.benchmark)

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


def discover(path: Path) -> list[Group]:
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
                                        root / "systems" / f"{sysdir.name}.json", desc_problem))
    else:  # loose logs: group by folder, mode from the folder name when it says so
        by_folder: dict[Path, list[Path]] = {}
        for f in sorted(path.rglob("result_*.txt"), key=_sort_key):
            by_folder.setdefault(f.parent, []).append(f)
        for folder, files in sorted(by_folder.items()):
            runs, skipped = _parse_all(files)
            bench = next((r.benchmark for r in runs if r.benchmark), folder.name)
            mode = next((m for m in MODES if m in folder.parts), "weak" if len(runs) > 1 and _overlap(runs) else "strong")
            if registry.suite_of(bench)[0] == "training":
                mode = "strong"  # training runs are scored by time to train, concurrent or not
            system = next((r.platform for r in runs if r.platform), "unknown")
            groups.append(Group(system, mode, bench, folder, runs, None, False, skipped))
    if not groups:
        raise DataError(f"no result_*.txt logs under {path} (expected results/<system>/<strong|weak>/<benchmark>/ "
                        "for the hpc suite or results/<system>/<benchmark>/ for the training suite)")
    return groups


def _overlap(runs: list[RunLog]) -> bool:
    """Runs that overlap in time are concurrent instances (weak scaling), not repeats."""
    spans = sorted((r.run_start_ms, r.run_stop_ms) for r in runs if r.timed)
    return any(b[0] < a[1] for a, b in zip(spans, spans[1:]))  # type: ignore[operator]
