"""Where results go: the layout the official MLPerf result summarizer reads.

    ROOT/results/<system>/strong/<benchmark>/result_<n>.txt   hpc suite: one file per run (n = next free index)
    ROOT/results/<system>/weak/<benchmark>/result_<k>.txt     hpc suite: one file per instance k of the job
    ROOT/results/<system>/<benchmark>/result_<n>.txt          training suite: one file per run (no mode folder)
    ROOT/systems/<system>.json                                 the system description
    ROOT/hpcbench/<system>/[<mode>/]<benchmark>/train_summary.json  our per-job summary

A training-suite folder has no mode (``mode = ""`` below): the training summarizer scores time to
train only, and the concurrent instances of one job are separate runs with a result file each.

The official package checker warns about any file beside the result_*.txt logs ("Unknown files in
result directory") and reads only results/, systems/ and benchmarks/<benchmark>/ below ROOT, so
files of ours live in their own top-level folder.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from hpcbench.common.errors import ConfigError

MODES = ("strong", "weak")
EXTRAS = "hpcbench"  # top-level folder of our own files (never looked at by the official tools)


def mode_for(instances: int, suite: str = "hpc") -> str:
    """The results folder's mode: strong (one instance) or weak (several) for hpc; "" for training."""
    if suite == "training":
        return ""
    return "strong" if instances == 1 else "weak"


def system_dirname(name: str) -> str:
    """A system name usable as a folder name (the summarizer takes it from the folder)."""
    clean = re.sub(r"[^A-Za-z0-9_.+-]+", "_", name.strip()).strip("._")
    if not clean:
        raise ConfigError(f"system name {name!r} has no usable characters for a results folder")
    return clean


def benchmark_dir(root: Path, system: str, mode: str, benchmark: str) -> Path:
    """``mode`` "" is the training suite's layout (no mode folder)."""
    base = Path(root) / "results" / system_dirname(system)
    return base / mode / benchmark if mode else base / benchmark


def extras_dir(root: Path, system: str, mode: str, benchmark: str) -> Path:
    """Our own files about one benchmark folder, outside what the official checkers read."""
    base = Path(root) / EXTRAS / system_dirname(system)
    return base / mode / benchmark if mode else base / benchmark


def summary_file(bench_dir: Path) -> Path:
    """``train_summary.json`` of the job that wrote the logs in ``bench_dir`` (a :func:`benchmark_dir`)."""
    bench_dir = Path(bench_dir)
    if bench_dir.parents[1].name == "results" and bench_dir.parent.name not in MODES:  # training layout
        root, system, mode = bench_dir.parents[2], bench_dir.parent.name, ""
    else:
        root, system, mode = bench_dir.parents[3], bench_dir.parent.parent.name, bench_dir.parent.name
    return extras_dir(root, system, mode, bench_dir.name) / "train_summary.json"


def system_file(root: Path, system: str) -> Path:
    return Path(root) / "systems" / f"{system_dirname(system)}.json"


def logged_division(log: Path) -> str | None:
    """The ``submission_division`` a result log states (None: none, or unreadable)."""
    needle = '"key": "submission_division"'
    try:
        with open(log, errors="replace") as fh:
            for line in fh:
                if needle in line:
                    value = json.loads(line.split(":::MLLOG", 1)[1]).get("value")
                    return value if isinstance(value, str) else None
    except (OSError, ValueError, IndexError):
        return None
    return None


def other_division_logs(root: Path, system: str, division: str) -> list[Path]:
    """Result logs of ``system`` (any benchmark, any mode) whose division is not ``division``:
    ``systems/<system>.json`` states one division for all of them."""
    base = Path(root) / "results" / system_dirname(system)
    return [p for p in sorted(base.rglob("result_*.txt")) if logged_division(p) not in (None, division)]


def existing_results(folder: Path) -> list[Path]:
    return sorted(folder.glob("result_*.txt"))


def _used(folder: Path) -> set[int]:
    return {int(p.stem.split("_", 1)[1]) for p in existing_results(folder) if p.stem.split("_", 1)[1].isdigit()}


def next_free_index(folder: Path) -> int:
    used = _used(folder)
    n = 0
    while n in used:
        n += 1
    return n


def next_free_block(folder: Path, count: int) -> int:
    """The first index n with result_n .. result_{n+count-1} all free (runs of one job stay together)."""
    used = _used(folder)
    n = 0
    while any(n + k in used for k in range(count)):
        n += 1
    return n
