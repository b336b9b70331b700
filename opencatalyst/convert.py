"""Convert original (pickled) OC20 LMDBs to the pickle-free encoding, each file with its samples'
sizes (the ``"sizes"`` key, see :mod:`hpcbench.workloads.opencatalyst.lmdbio`: natoms, edges, triplets, what the
cost-balanced sampler reads).

Published S2EF files preprocessed without edges (``r_edges=False``, the usual case) carry no
``edge_index``/``cell_offsets``; decoding them builds the reference's periodic radius graph (6 A,
at most 50 neighbours, :func:`hpcbench.workloads.opencatalyst.graph.add_missing_graph`), so the output always has one.

Reading the source requires the user's explicit ``trust_pickle`` opt-in: unpickling runs code from
the file. Each output file goes through :func:`hpcbench.common.data.datagen.generate`: written under a
temporary name, verified, then renamed.

A split is converted into a hidden staging folder beside its output folder and renamed (or, with
``replace``, moved file by file) into place only once every file is written and verified, so a
crashed or interrupted conversion leaves no output folder that looks complete. An output folder
that already holds something is refused (every ``data.*.lmdb`` in a split folder is part of the
dataset, so an older file left beside the new ones would add its samples); ``replace`` removes the
converter's own outputs there (``data.*.lmdb`` and their ``-lock`` files) and keeps anything else.
"""
from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from functools import partial
from pathlib import Path

import numpy as np

from hpcbench.common.data.datagen import FileJob, generate
from hpcbench.common.errors import ConfigError, DataError

from . import lmdbio
from .layout import LAYOUT


def convert_file(sources: Mapping[str, Path], job: FileJob, tmp: Path) -> np.ndarray:
    """Re-encode the samples of the job's source file (``sources[job.name]``) into ``tmp``."""
    shard = lmdbio.Shard(sources[job.name], trust_pickle=True)
    return lmdbio.write_shard(tmp, (shard[k] for k in job.indices))


def verify_file(tmp: Path, job: FileJob) -> None:
    lmdbio.verify_shard(tmp, len(job.indices))


def _own_outputs(folder: Path) -> list[Path]:
    """What a conversion writes into a split folder: ``data.*.lmdb`` files and LMDB's ``-lock`` files."""
    return sorted(p for p in folder.iterdir()
                  if LAYOUT.is_sample(p.name) or (p.name.endswith("-lock") and LAYOUT.is_sample(p.name[:-5])))


def _check_out(dst: Path, replace: bool) -> None:
    """Refuse an output split folder that holds anything, unless ``replace`` (then only a non-folder)."""
    if not dst.exists():
        return
    if not dst.is_dir():
        raise ConfigError(f"--out {dst}: exists and is not a folder")
    held = sorted(p.name + ("/" if p.is_dir() else "") for p in dst.iterdir())
    if held and not replace:
        shown = ", ".join(held[:5]) + (f" and {len(held) - 5} more" if len(held) > 5 else "")
        raise ConfigError(f"--out {dst}: the output folder is not empty (it holds {shown}); every data.*.lmdb in "
                          "a split folder is read as part of the dataset, so files left beside the converted ones "
                          "would add their samples. Choose a new or empty --out, or pass --replace to remove the "
                          "converter's own outputs (data.*.lmdb) there first")


def convert_split(src: Path, dst: Path, trust_pickle: bool, progress: bool = True, workers: int = 1,
                  replace: bool = False) -> int:
    """Convert every ``data.*.lmdb`` in ``src`` to ``dst`` (same file names); returns samples.
    ``dst`` must be new or empty unless ``replace`` (see the module's description)."""
    if not trust_pickle:
        raise ConfigError("reading original OC20 LMDBs unpickles Python objects, which runs code from the file; "
                          "pass --trust-pickle (`hpcbench convert oc20 --src DIR --out NEW_DIR --trust-pickle`) if "
                          "you trust where these files came from")
    if src.resolve() == dst.resolve():
        raise ConfigError(f"--out must differ from the source folder {src}")
    dst = dst.resolve()
    _check_out(dst, replace)
    sources = {path.name: path for path in lmdbio.shard_paths(src)}
    stage = dst.parent / f".{dst.name}.converting.{os.getpid()}"
    jobs = [FileJob(stage.name, name, tuple(range(len(lmdbio.Shard(path, trust_pickle=True)))))
            for name, path in sources.items()]
    empty = [name for name, job in zip(sources, jobs) if not job.indices]
    if empty:
        raise DataError(f"{src}: {', '.join(empty)} hold(s) no samples (an empty or unfinished LMDB); "
                        "nothing was converted")
    try:
        generate(dst.parent, jobs, partial(convert_file, sources), verify_file, workers, progress=progress,
                 desc=f"convert {src.name}")
        if not dst.exists():
            os.replace(stage, dst)  # the split folder appears complete, in one rename
        else:  # an empty folder, or --replace: the old outputs go, the new ones move in
            for old in _own_outputs(dst):
                old.unlink()
            for new in sorted(stage.iterdir()):
                os.replace(new, dst / new.name)
            stage.rmdir()
    finally:
        shutil.rmtree(stage, ignore_errors=True)  # nothing of a failed conversion stays behind
    return sum(len(j.indices) for j in jobs)


def _holds_shards(folder: Path) -> bool:
    return any(p.is_file() and LAYOUT.is_sample(p.name) for p in folder.iterdir())


def convert(src: Path, dst: Path, trust_pickle: bool, progress: bool = True, workers: int = 1,
            replace: bool = False) -> dict[str, int]:
    """A dataset root with split folders (train/, validation/, ...) or a single split folder. Every
    output split folder is checked (new or empty, unless ``replace``) before anything is converted."""
    if not src.is_dir():
        raise ConfigError(f"{src}: source folder does not exist")
    if _holds_shards(src):
        return {src.name: convert_split(src, dst, trust_pickle, progress, workers, replace)}
    splits = sorted(p for p in src.iterdir() if p.is_dir() and _holds_shards(p))
    if not splits:
        raise ConfigError(f"{src}: no data.NNNN.lmdb files in it or in its sub-folders")
    for p in splits:
        _check_out(dst / p.name, replace)
    return {p.name: convert_split(p, dst / p.name, trust_pickle, progress, workers, replace) for p in splits}
