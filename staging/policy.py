"""Per-dataset staging policies: which files are samples, how splits are named, what every node needs.

Staging is generic over files; a policy only says how to find them. Workload packages are never
imported here. ``known`` holds the real datasets' published sizes so ``stage --dry-run`` can plan a
full-scale cluster layout without the data.
"""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from pathlib import Path

from common.errors import ConfigError, DataError

MiB = 1 << 20


@dataclass(frozen=True)
class KnownSplit:
    """Published size of one split of the real dataset (for planning without data)."""

    files: int
    raw_bytes_per_file: int
    compression_ratio: float  # packed bytes / raw bytes, measured or from the source documents


@dataclass(frozen=True)
class Policy:
    name: str
    patterns: tuple[str, ...]  # file-name globs that are samples
    splits: tuple[str, ...] | None = None  # None: every top-level folder with matching files
    replicate: tuple[str, ...] = ()  # globs (relative paths) every node needs, e.g. stats.h5
    chunk_bytes: int = 64 * MiB  # big files (an LMDB) are cut into independently compressed frames
    known: dict[str, KnownSplit] = field(default_factory=dict)

    def is_sample(self, name: str) -> bool:
        return any(fnmatch.fnmatch(name, p) for p in self.patterns)

    def is_replicated(self, rel: str) -> bool:
        return any(fnmatch.fnmatch(rel, p) for p in self.replicate)


# CosmoFlow: 128^3 x 4 int16 = 16 MiB raw per sample; the source document reports ~85% fewer bytes
# after merge + compression on the real data.
_COSMO_SAMPLE = 128 ** 3 * 4 * 2 + 64
# DeepCAM: 768 x 1152 x 16 float32 + int labels, about 56 MiB per HDF5 file.
_DEEPCAM_SAMPLE = 768 * 1152 * 16 * 4 + 768 * 1152 * 4

POLICIES: dict[str, Policy] = {
    "cosmoflow": Policy(
        "cosmoflow", ("*.tfrecord", "*.tfrecord.gz", "*.tfrecords", "*.tfrecords.gz"), ("train", "validation"),
        known={"train": KnownSplit(524_288, _COSMO_SAMPLE, 0.15),
               "validation": KnownSplit(65_536, _COSMO_SAMPLE, 0.15)},
    ),
    "deepcam": Policy(
        "deepcam", ("data-*.h5",), ("train", "validation"), replicate=("stats.h5",),
        known={"train": KnownSplit(121_266, _DEEPCAM_SAMPLE, 0.6),
               "validation": KnownSplit(15_158, _DEEPCAM_SAMPLE, 0.6)},
    ),
    "oc20": Policy(
        "oc20", ("*.lmdb",), None, replicate=("*/metadata.npz",),
        known={"train": KnownSplit(80, 1_200 * MiB, 0.5), "val_id": KnownSplit(1, 1_000 * MiB, 0.5)},
    ),
    "generic": Policy("generic", ("*",), None),
}


def get_policy(name: str) -> Policy:
    try:
        return POLICIES[name]
    except KeyError:
        raise ConfigError(f"--dataset: unknown dataset {name!r}; expected one of {', '.join(POLICIES)}") from None


#: the name of the pseudo-split holding files every node needs
REPLICATED = "_replicated"


def scan(root: Path, policy: Policy) -> dict[str, list[str]]:
    """Relative paths (sorted, POSIX) per split, plus ``REPLICATED`` for files every node needs."""
    if not root.is_dir():
        raise DataError(f"dataset folder {root} does not exist or is not a folder")
    out: dict[str, list[str]] = {}
    reps = sorted(p.relative_to(root).as_posix() for p in root.rglob("*")
                  if p.is_file() and policy.is_replicated(p.relative_to(root).as_posix()))
    if reps:
        out[REPLICATED] = reps
    split_dirs = [root / s for s in policy.splits] if policy.splits else sorted(p for p in root.iterdir() if p.is_dir())
    for d in split_dirs:
        if not d.is_dir():
            continue
        files = sorted(p.relative_to(root).as_posix() for p in d.rglob("*")
                       if p.is_file() and policy.is_sample(p.name) and not p.name.startswith("."))
        files = [f for f in files if f not in reps]
        if files:
            out[d.name] = files
    if not any(k != REPLICATED for k in out):
        want = ", ".join(policy.splits or ("<any folder>",))
        raise DataError(f"no {policy.name} sample files ({', '.join(policy.patterns)}) found under {root} "
                        f"in split folders {want}")
    return out
