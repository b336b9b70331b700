"""The DLRM-DCNv2 dataset spec: one folder of Criteo multi-hot day files, splits by rows.

``open`` gives a :class:`~.format.CriteoSplit` (memory-mapped days; train = days 0 .. D-2, validation =
the first half of day D-1). ``read_batch`` reads a whole batch with one ``CriteoSplit.read(indices)``
(rows validated as they are read), not sample by sample. A batch is ``(dense float32 (B, 13),
labels float32 (B,), [26 x int32 (B, h_k)])``. Every node needs every day (the splits are rows of
the same files), so the layout replicates all files: node-local staging gives each node the whole
folder. Light to import (``hpcbench pack``/``stage`` load :data:`LAYOUT`).
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from hpcbench.common.data.layout import FileLayout
from hpcbench.common.data.spec import DatasetSpec
from hpcbench.common.errors import DataError

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from .format import CriteoSplit, Rows

DAY_FILES = ("day_*_dense.npy", "day_*_labels.npy", "day_*_sparse_multi_hot.npz")
LAYOUT = FileLayout("dlrm_dcnv2", (), None, replicate=DAY_FILES, describe="Criteo multi-hot day files")

Batch = tuple["torch.Tensor", "torch.Tensor", list["torch.Tensor"]]


_DAY_FILE = re.compile(r"day_(\d+)_(dense\.npy|labels\.npy|sparse_multi_hot\.npz)")
_PARTS = ("dense.npy", "labels.npy", "sparse_multi_hot.npz")


def count_days(root: Path) -> int:
    """D of a folder holding days 0 .. D-1, each with all three files (dense, labels, sparse). A day
    with only some of them (a day is never dropped: that would shrink the training set or move the
    evaluation day) or a gap in the day numbers is refused naming the missing files."""
    if not Path(root).is_dir():
        raise DataError(f"{root}: no such folder (write a dataset with `hpcbench datagen dlrm_dcnv2 --out DIR`)")
    have: dict[int, set[str]] = {}
    for p in Path(root).iterdir():
        if m := _DAY_FILE.fullmatch(p.name):
            have.setdefault(int(m.group(1)), set()).add(m.group(2))
    if not have:
        raise DataError(f"{root}: no day_<d>_* files; expected the Criteo multi-hot layout ({', '.join(DAY_FILES)})")
    partial = {d: [f"day_{d}_{part}" for part in _PARTS if part not in parts] for d, parts in sorted(have.items())}
    partial = {d: miss for d, miss in partial.items() if miss}
    if partial:
        listed = "; ".join(f"day {d}: {', '.join(miss)} missing" for d, miss in partial.items())
        raise DataError(f"{root}: incomplete day(s): {listed} (each day is {', '.join(DAY_FILES)}; a day is "
                        f"not skipped: skipping it would shrink the training set or move the evaluation day)")
    found = sorted(have)
    missing = sorted(set(range(found[-1] + 1)) - set(found))
    if missing:
        raise DataError(f"{root}: days {missing} are missing (found days {found[0]}..{found[-1]}); days must be 0 .. D-1")
    return found[-1] + 1


class CriteoData(DatasetSpec):
    layout = LAYOUT
    partition = "contiguous"
    # the rules: the preprocessing's order, "any other extra dataset shuffling is prohibited"; global batch g
    # is rows [g B, (g + 1) B) of the split, split over the ranks in contiguous parts (the reference's loader)
    order = "stored"

    def __init__(self, bag_sizes: Sequence[int], cardinalities: Sequence[int], days: int = 0) -> None:
        self.bag_sizes, self.cardinalities, self.days = tuple(bag_sizes), tuple(cardinalities), days

    def open(self, root: Path, split: str) -> "CriteoSplit":
        from .format import CriteoSplit

        days = self.days or count_days(root)
        return CriteoSplit(root, split, days, self.bag_sizes, self.cardinalities)

    def _batch(self, rows: "Rows") -> Batch:
        import torch

        return (torch.from_numpy(np.ascontiguousarray(rows.dense)),
                torch.from_numpy(rows.labels.astype(np.float32)),
                [torch.from_numpy(np.ascontiguousarray(s)) for s in rows.sparse])

    def collate(self, samples: Sequence["Rows"]) -> Batch:
        from .format import Rows

        return self._batch(Rows(np.concatenate([s.dense for s in samples]), np.concatenate([s.labels for s in samples]),
                                [np.concatenate([s.sparse[k] for s in samples]) for k in range(len(self.bag_sizes))]))

    def read_batch(self, source: Any, indices: Sequence[int], pin: bool = False) -> Batch:
        """The whole batch in one ``CriteoSplit.read`` (each day's rows in sorted order, validated)."""
        read = getattr(source, "read", None)
        if read is None:
            return super().read_batch(source, indices, pin)
        return self._batch(read(np.asarray(indices, dtype=np.int64)))
