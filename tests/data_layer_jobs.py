"""Picklable writer/verifier pairs for tests of common.data.datagen (spawned workers import this)."""
from __future__ import annotations

from pathlib import Path

from hpcbench.common.data.datagen import FileJob
from hpcbench.common.errors import DataError


def write_indices(job: FileJob, tmp: Path) -> int:
    tmp.write_text(",".join(str(i) for i in job.indices))
    return sum(job.indices)


def verify_nonempty(tmp: Path, job: FileJob) -> None:
    if not tmp.read_text():
        raise DataError(f"{tmp}: empty")


def write_empty_for_odd(job: FileJob, tmp: Path) -> int:
    tmp.write_text("" if job.indices[0] % 2 else "ok")
    return 0
