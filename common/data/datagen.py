"""The one synthetic-data driver: a process pool, a progress bar, and write-verify-rename per file.

A workload supplies the files to write (:class:`FileJob`: split, file name, sample indices), a
picklable ``write(job, tmp_path) -> info`` that writes those samples in the real format, and a
picklable ``verify(tmp_path, job)`` that reads the file back with the workload's validating reader.
The driver writes under a hidden temporary name, fsyncs, verifies and only then renames, so a file
under its final name is always complete. ``info`` values (e.g. per-sample statistics) come back in
job order for the workload to finish the split (``stats.h5``, size metadata).
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Writer = Callable[["FileJob", Path], Any]
Verifier = Callable[[Path, "FileJob"], None]


@dataclass(frozen=True)
class FileJob:
    split: str
    name: str  # file name inside the split folder
    indices: tuple[int, ...]  # sample indices of the split that go into this file

    def path(self, out: Path) -> Path:
        return out / self.split / self.name


def _run_one(out: Path, job: FileJob, write: Writer, verify: Verifier) -> Any:
    final = job.path(out)
    tmp = final.with_name(f".{final.name}.{os.getpid()}.tmp")
    try:
        info = write(job, tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        verify(tmp, job)
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)
        Path(f"{tmp}-lock").unlink(missing_ok=True)  # LMDB writers leave one
    return info


def _run_packed(args: tuple[Path, FileJob, Writer, Verifier]) -> Any:
    return _run_one(*args)


def generate(out: str | Path, jobs: Sequence[FileJob], write: Writer, verify: Verifier, workers: int = 1,
             progress: bool = True, desc: str = "datagen") -> list[Any]:
    """Write every job's file under ``out/<split>/``; returns each job's ``info`` in job order.
    Processes are started with ``spawn`` (no fork of a threaded parent)."""
    from tqdm import tqdm

    out = Path(out)
    for split in {j.split for j in jobs}:
        (out / split).mkdir(parents=True, exist_ok=True)
    results: list[Any] = [None] * len(jobs)
    total = sum(len(j.indices) for j in jobs)
    workers = max(1, min(workers, len(jobs)))
    with tqdm(total=total, desc=desc, unit="sample", disable=not progress) as bar:
        if workers == 1:
            for k, job in enumerate(jobs):
                results[k] = _run_one(out, job, write, verify)
                bar.update(len(job.indices))
        else:
            ctx = multiprocessing.get_context("spawn")
            with ProcessPoolExecutor(workers, mp_context=ctx) as pool:
                futures = {pool.submit(_run_packed, (out, job, write, verify)): k for k, job in enumerate(jobs)}
                from concurrent.futures import as_completed

                for fut in as_completed(futures):
                    k = futures[fut]
                    results[k] = fut.result()
                    bar.update(len(jobs[k].indices))
    return results


class Datagen:
    """Writes a workload's synthetic data in its real on-disk format: the options of ``hpcbench datagen NAME``,
    the dataset ``hpcbench run`` trains the ``mini`` preset on, and the writer. A workload package declares its
    subclass in a module that imports no model code (the record's ``datagen`` part, e.g.
    ``"synth:CosmoFlowDatagen"``) and derives its workload class from it, so that ``hpcbench datagen`` and
    ``hpcbench run`` do not import torch and the model to write files; a workload class that overrides these
    classmethods itself (an out-of-tree workload) works as well."""

    @classmethod
    def add_datagen_args(cls, parser: argparse.ArgumentParser) -> None:
        """Options of ``hpcbench datagen <name>`` beyond --out, --seed, --workers."""

    @classmethod
    def embedded_datagen_args(cls) -> list[str]:
        """``hpcbench datagen`` options that write the tiny dataset ``hpcbench run`` trains its
        ``mini`` preset on (beyond --out/--seed/--workers)."""
        from hpcbench.common.errors import HpcbenchError

        raise HpcbenchError(f"workload '{getattr(cls, 'name', cls.__name__)}' has no embedded default dataset for "
                            "`hpcbench run`")

    @classmethod
    def datagen(cls, args: argparse.Namespace) -> None:
        from hpcbench.common.errors import HpcbenchError

        raise HpcbenchError(f"workload '{getattr(cls, 'name', cls.__name__)}' has no synthetic data generator yet")
