"""Where results go: the layout the official MLPerf result summarizer reads.

    ROOT/results/<system>/strong/<benchmark>/result_<n>.txt   one file per run (n = next free index)
    ROOT/results/<system>/weak/<benchmark>/result_<k>.txt     one file per instance k of the job
    ROOT/systems/<system>.json                                 the system description
"""
from __future__ import annotations

import re
from pathlib import Path

from common.errors import ConfigError

MODES = ("strong", "weak")


def mode_for(instances: int) -> str:
    return "strong" if instances == 1 else "weak"


def system_dirname(name: str) -> str:
    """A system name usable as a folder name (the summarizer takes it from the folder)."""
    clean = re.sub(r"[^A-Za-z0-9_.+-]+", "_", name.strip()).strip("._")
    if not clean:
        raise ConfigError(f"system name {name!r} has no usable characters for a results folder")
    return clean


def benchmark_dir(root: Path, system: str, mode: str, benchmark: str) -> Path:
    return Path(root) / "results" / system_dirname(system) / mode / benchmark


def system_file(root: Path, system: str) -> Path:
    return Path(root) / "systems" / f"{system_dirname(system)}.json"


def existing_results(folder: Path) -> list[Path]:
    return sorted(folder.glob("result_*.txt"))


def next_free_index(folder: Path) -> int:
    used = {int(p.stem.split("_", 1)[1]) for p in existing_results(folder) if p.stem.split("_", 1)[1].isdigit()}
    n = 0
    while n in used:
        n += 1
    return n
