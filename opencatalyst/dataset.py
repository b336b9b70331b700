"""The OC20 S2EF dataset spec: file layout (for pack/stage), validated reader, collate, costs."""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from hpcbench.common.data.spec import DatasetSpec

if TYPE_CHECKING:  # pragma: no cover
    from .batch import GraphBatch
    from .static import Buckets
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
        # static shapes (opencatalyst/static.py): the batch totals of each planned loader, the buckets
        # chosen over all of them, and the length of the padding edges (twice the model's cutoff)
        self._totals: dict[str, np.ndarray] = {}
        self.buckets: "Buckets | None" = None
        self.pad_distance = 0.0

    def plan_static(self, which: str, totals: np.ndarray, per_dim: int, pad_distance: float) -> int:
        """Pad batches from now on to buckets chosen over the batch ``totals`` (graphs, atoms, edges,
        triplets per batch) of every loader planned so far (``which``: its name; a new plan replaces
        that loader's); returns how many distinct shapes to expect: those the batches take, plus a
        quarter (at least 2) for shapes that epochs beyond the simulated ones may add."""
        from .static import choose_buckets, padding_overhead

        self._totals[which] = totals
        every = np.concatenate(list(self._totals.values()))
        self.buckets, self.pad_distance = choose_buckets(every, per_dim), pad_distance
        seen = int(padding_overhead(every, self.buckets)["shapes"])
        return seen + max(2, seen // 4)

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
        """The disjoint-union batch, padded to its bucket once static shapes are planned."""
        from .batch import collate

        batch = collate(samples)
        if self.buckets is None:
            return batch
        from .static import pad_batch

        shape = self.buckets.shape_for(batch.num_graphs, batch.pos.shape[0], batch.edge_index.shape[1],
                                       batch.idx_kj.numel())
        return pad_batch(batch, shape, self.pad_distance)
