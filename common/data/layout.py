"""Where a dataset's files are: which files are samples, how splits are named, what every node needs.

A :class:`FileLayout` is pure data. Each workload declares one as ``LAYOUT`` in its ``dataset.py``
(its :class:`~common.data.spec.DatasetSpec` points at it); ``hpcbench pack``/``stage`` and
``stage --dry-run`` get it through the registry, so staging never names a workload or a file format. :data:`GENERIC` (every file is a sample) is the layout for
datasets that no workload owns.
"""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from hpcbench.common.errors import DataError

P = TypeVar("P", str, Path)

MiB = 1 << 20

#: the name of the pseudo-split holding files every node needs
REPLICATED = "_replicated"


@dataclass(frozen=True)
class KnownSplit:
    """Published size of one split of the real dataset (for planning without the data)."""

    files: int
    raw_bytes_per_file: int
    compression_ratio: float  # packed bytes / raw bytes, measured or from the source documents


@dataclass(frozen=True)
class FileLayout:
    name: str  # dataset name recorded in manifests (``--dataset NAME``)
    patterns: tuple[str, ...]  # file-name globs that are samples
    splits: tuple[str, ...] | None = None  # None: every top-level folder with matching files
    replicate: tuple[str, ...] = ()  # globs (paths relative to the root) every node needs, e.g. stats.h5
    chunk_bytes: int = 64 * MiB  # big files (an LMDB) are cut into independently compressed frames
    known: dict[str, KnownSplit] = field(default_factory=dict)
    describe: str = ""  # what the sample files are called in messages (default: "<name> sample files")
    # split -> glob: where some of the split's sample files match it, only those are its samples (a folder that
    # holds the whole evaluation data beside the file of the chosen subset; the workload's dataset.py says which)
    prefer: dict[str, str] = field(default_factory=dict)

    def narrow(self, split: str, files: list[P]) -> list[P]:
        """``files`` (paths) of ``split``, only those whose name matches the split's ``prefer`` glob where any does."""
        glob = self.prefer.get(split)
        if not glob:
            return files
        picked = [f for f in files if fnmatch.fnmatch(Path(f).name, glob)]
        return picked or files

    @property
    def whole_on_every_node(self) -> bool:
        """No file is a per-node sample: every file is replicated (e.g. DLRM's day files, whose
        train/validation splits are rows, not folders). Node-local staging then gives each node
        the whole dataset, and an instance's nodes do not split it between them."""
        return not self.patterns and bool(self.replicate)

    def is_sample(self, name: str) -> bool:
        return any(fnmatch.fnmatch(name, p) for p in self.patterns)

    def is_replicated(self, rel: str) -> bool:
        return any(fnmatch.fnmatch(rel, p) for p in self.replicate)

    def list_split(self, root: str | Path, split: str) -> list[Path]:
        """Sorted sample files of ``root/split`` (hidden files skipped); a missing folder or one
        without sample files is a :class:`DataError` that names the folder and the patterns."""
        folder = Path(root) / split
        if not folder.is_dir():
            raise DataError(f"{folder}: no such folder (it does not exist); a {self.name} dataset has split folders "
                            f"{', '.join(self.splits or (split,))} (write one with `hpcbench datagen {self.name} --out DIR`)")
        files = sorted(p for p in folder.iterdir()
                       if p.is_file() and self.is_sample(p.name) and not p.name.startswith("."))
        files = self.narrow(split, files)
        if not files:
            raise DataError(f"{folder}: no {self.describe or self.name + ' sample files'} ({', '.join(self.patterns)})")
        return files


GENERIC = FileLayout("generic", ("*",), None)


def scan(root: Path, layout: FileLayout) -> dict[str, list[str]]:
    """Relative paths (sorted, POSIX) per split, plus ``REPLICATED`` for files every node needs."""
    if not root.is_dir():
        raise DataError(f"dataset folder {root} does not exist or is not a folder")
    def hidden(p: Path) -> bool:  # a hidden file or one under a hidden folder (e.g. an index cache): not data
        return any(part.startswith(".") for part in p.relative_to(root).parts)

    out: dict[str, list[str]] = {}
    reps = sorted(p.relative_to(root).as_posix() for p in root.rglob("*")
                  if p.is_file() and not hidden(p) and layout.is_replicated(p.relative_to(root).as_posix()))
    if reps:
        out[REPLICATED] = reps
    split_dirs = ([root / s for s in layout.splits] if layout.splits
                  else sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")))
    for d in split_dirs:
        if not d.is_dir():
            continue
        files = sorted(p.relative_to(root).as_posix() for p in d.rglob("*")
                       if p.is_file() and layout.is_sample(p.name) and not hidden(p))
        files = layout.narrow(d.name, [f for f in files if f not in reps])
        if files:
            out[d.name] = files
    if layout.whole_on_every_node and out:
        return out
    if not any(k != REPLICATED for k in out):
        want = ", ".join(layout.splits or ("<any folder>",))
        raise DataError(f"no {layout.name} sample files ({', '.join(layout.patterns)}) found under {root} "
                        f"in split folders {want}")
    return out
