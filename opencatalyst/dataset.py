"""The OC20 S2EF dataset spec: file layout (for pack/stage), validated reader, collate, costs."""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcbench.common.data.spec import DatasetSpec

if TYPE_CHECKING:  # pragma: no cover
    from .batch import GraphBatch
    from .lmdbio import SplitDataset
    from .workload import OC20DataConfig

from .layout import LAYOUT  # noqa: F401 - the dataset's layout, also the spec's

class OC20Data(DatasetSpec):
    """``data.NNNN.lmdb`` files of pickle-free records (original pickled ones with
    ``data.trust_pickle``), each carrying its samples' sizes; batches are disjoint-union graphs.

    Training batches are split over the ranks by cost, greedy LPT on each sample's edges or
    triplets (``data.balance``), or strided with ``data.balance = "none"``."""

    layout = LAYOUT
    partition = "balanced"

    def __init__(self, cfg: "OC20DataConfig") -> None:
        self.cfg = cfg
        if cfg.balance == "none":
            self.partition = "strided"

    def open(self, root: Path, split: str) -> "SplitDataset":
        from .lmdbio import SplitDataset

        cost = "triplets" if self.cfg.balance == "triplets" else "edges"
        return SplitDataset(self.layout.list_split(root, split), self.cfg.trust_pickle, cost)

    def start(self, source: "SplitDataset") -> None:  # type: ignore[override]
        """With ``data.preload``: decode the split into host memory (``data.threads`` at a time), after
        ``run_start`` as the rules want (the harness calls this once the clock runs)."""
        if self.cfg.preload:
            from hpcbench.common.data.loader import reader_threads

            source.preload(reader_threads(self.cfg.threads, None))

    def collate(self, samples: Sequence[Any]) -> "GraphBatch":
        from .batch import collate

        return collate(samples)
