"""Find result logs: the official HPC submission layout is
``ROOT/results/<system>/{strong,weak}/<benchmark>/result_*.txt`` with ``ROOT/systems/<system>.json``."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common.errors import DataError

from .logs import RunLog, parse_log

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


def _load_system(root: Path, system: str) -> dict[str, Any] | None:
    f = root / "systems" / f"{system}.json"
    if not f.exists():
        return None
    try:
        return json.loads(f.read_text())
    except json.JSONDecodeError as exc:
        raise DataError(f"system file {f} is not valid JSON: {exc}") from None


def discover(path: Path) -> list[Group]:
    path = Path(path)
    if not path.exists():
        raise DataError(f"results directory {path} does not exist")
    root = submission_root(path)
    groups: list[Group] = []
    if root is not None:
        for sysdir in sorted(p for p in (root / "results").iterdir() if p.is_dir()):
            desc = _load_system(root, sysdir.name)
            for mode in MODES:
                for bdir in sorted(p for p in (sysdir / mode).glob("*") if p.is_dir()):
                    files = sorted(bdir.glob("result_*.txt"), key=_sort_key)
                    if files:
                        groups.append(Group(sysdir.name, mode, bdir.name, bdir,
                                            [parse_log(f) for f in files], desc))
    else:  # loose logs: group by folder, mode from the folder name when it says so
        by_folder: dict[Path, list[Path]] = {}
        for f in sorted(path.rglob("result_*.txt"), key=_sort_key):
            by_folder.setdefault(f.parent, []).append(f)
        for folder, files in sorted(by_folder.items()):
            runs = [parse_log(f) for f in files]
            mode = next((m for m in MODES if m in folder.parts), "weak" if len(runs) > 1 and _overlap(runs) else "strong")
            bench = runs[0].benchmark or folder.name
            groups.append(Group(runs[0].platform or "unknown", mode, bench, folder, runs, None, False))
    if not groups:
        raise DataError(f"no result_*.txt logs under {path} (expected results/<system>/<strong|weak>/<benchmark>/)")
    return groups


def _overlap(runs: list[RunLog]) -> bool:
    """Runs that overlap in time are concurrent instances (weak scaling), not repeats."""
    spans = sorted((r.run_start_ms, r.run_stop_ms) for r in runs if r.complete)
    return any(b[0] < a[1] for a, b in zip(spans, spans[1:]))  # type: ignore[operator]
