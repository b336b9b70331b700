"""Convert original (pickled) OC20 LMDBs to the pickle-free encoding, each file with its samples'
sizes (the ``"sizes"`` key, see :mod:`hpcbench.workloads.opencatalyst.lmdbio`: natoms, edges, triplets, what the
cost-balanced sampler reads).

Published S2EF files preprocessed without edges (``r_edges=False``, the usual case) carry no
``edge_index``/``cell_offsets``; decoding them builds the reference's periodic radius graph (6 A,
at most 50 neighbours, :func:`hpcbench.workloads.opencatalyst.graph.add_missing_graph`), so the output always has one.

Reading the source requires the user's explicit ``trust_pickle`` opt-in: unpickling runs code from
the file. Each output file goes through :func:`hpcbench.common.data.datagen.generate`: written under a
temporary name, verified, then renamed.
"""
from __future__ import annotations

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


def convert_split(src: Path, dst: Path, trust_pickle: bool, progress: bool = True, workers: int = 1) -> int:
    """Convert every ``data.*.lmdb`` in ``src`` to ``dst`` (same file names); returns samples."""
    if not trust_pickle:
        raise ConfigError("reading original OC20 LMDBs unpickles Python objects, which runs code from the file; "
                          "pass --trust-pickle (`hpcbench convert oc20 --src DIR --out NEW_DIR --trust-pickle`) if "
                          "you trust where these files came from")
    if src.resolve() == dst.resolve():
        raise ConfigError(f"--out must differ from the source folder {src}")
    dst = dst.resolve()
    sources = {path.name: path for path in lmdbio.shard_paths(src)}
    jobs = [FileJob(dst.name, name, tuple(range(len(lmdbio.Shard(path, trust_pickle=True)))))
            for name, path in sources.items()]
    empty = [name for name, job in zip(sources, jobs) if not job.indices]
    if empty:
        raise DataError(f"{src}: {', '.join(empty)} hold(s) no samples (an empty or unfinished LMDB); "
                        "nothing was converted")
    created = not dst.exists()
    try:
        generate(dst.parent, jobs, partial(convert_file, sources), verify_file, workers, progress=progress,
                 desc=f"convert {src.name}")
    except BaseException:
        if created and dst.is_dir() and not any(dst.iterdir()):
            dst.rmdir()  # no empty split folder left behind by a failed conversion
        raise
    return sum(len(j.indices) for j in jobs)


def _holds_shards(folder: Path) -> bool:
    return any(p.is_file() and LAYOUT.is_sample(p.name) for p in folder.iterdir())


def convert(src: Path, dst: Path, trust_pickle: bool, progress: bool = True, workers: int = 1) -> dict[str, int]:
    """A dataset root with split folders (train/, validation/, ...) or a single split folder."""
    if not src.is_dir():
        raise ConfigError(f"{src}: source folder does not exist")
    if _holds_shards(src):
        return {src.name: convert_split(src, dst, trust_pickle, progress, workers)}
    splits = sorted(p for p in src.iterdir() if p.is_dir() and _holds_shards(p))
    if not splits:
        raise ConfigError(f"{src}: no data.NNNN.lmdb files in it or in its sub-folders")
    return {p.name: convert_split(p, dst / p.name, trust_pickle, progress, workers) for p in splits}
