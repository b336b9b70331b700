"""Collation of OC20 samples into one disjoint-union graph batch."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import torch

from . import graph


@dataclass
class GraphBatch:
    z: torch.Tensor  # [N] atomic numbers
    pos: torch.Tensor  # [N, 3]
    batch: torch.Tensor  # [N] graph of each atom
    edge_index: torch.Tensor  # [2, E] (j, i), global atom indices
    shift: torch.Tensor  # [E, 3] cell_offsets @ cell, Angstrom
    idx_kj: torch.Tensor  # [T] triplets as edge pairs
    idx_ji: torch.Tensor
    force: torch.Tensor  # [N, 3] reference forces
    free: torch.Tensor  # [N] bool, atoms not fixed
    energy: torch.Tensor  # [G]
    num_graphs: int  # G: graphs the model sums energies into (padded batches: capacity + 1 padding slot)
    # padded batches (opencatalyst/static.py): True for the real graphs of the [G] energies, None when unpadded
    graph_mask: torch.Tensor | None = None
    samples: int = -1  # real graphs (samples) in the batch; -1: num_graphs (an unpadded batch)

    def to(self, device: torch.device | str) -> "GraphBatch":
        moved = {f.name: getattr(self, f.name) for f in fields(self)}
        for k, v in moved.items():
            if isinstance(v, torch.Tensor):
                moved[k] = v.to(device, non_blocking=True)
        return GraphBatch(**moved)

    def pin_memory(self) -> "GraphBatch":
        """Page-locked copy (so :meth:`to` a GPU is a non-blocking copy)."""
        return GraphBatch(**{f.name: (v.pin_memory() if isinstance(v, torch.Tensor) else v)
                             for f in fields(self) for v in (getattr(self, f.name),)})

    @property
    def size(self) -> int:
        """Samples (real graphs) in the batch, padded or not."""
        return self.num_graphs if self.samples < 0 else self.samples

    def __len__(self) -> int:
        return self.size


def collate(samples: Sequence[dict[str, Any]]) -> GraphBatch:
    natoms = np.array([int(s["natoms"]) for s in samples])
    starts = np.concatenate([[0], np.cumsum(natoms)[:-1]])
    ei = np.concatenate([np.asarray(s["edge_index"]) + a for s, a in zip(samples, starts)], axis=1)
    shift = np.concatenate([np.asarray(s["cell_offsets"], np.float32) @ np.asarray(s["cell"], np.float32).reshape(3, 3)
                            for s in samples])
    offsets = np.concatenate([np.asarray(s["cell_offsets"], np.float32) for s in samples])
    n = int(natoms.sum())
    ei_t = torch.from_numpy(ei.astype(np.int64))
    kj, ji = graph.triplets(ei_t, torch.from_numpy(offsets), n)
    return GraphBatch(
        z=torch.from_numpy(np.concatenate([np.asarray(s["atomic_numbers"], np.int64) for s in samples])),
        pos=torch.from_numpy(np.concatenate([np.asarray(s["pos"], np.float32) for s in samples])),
        batch=torch.from_numpy(np.repeat(np.arange(len(samples)), natoms)),
        edge_index=ei_t, shift=torch.from_numpy(shift), idx_kj=kj, idx_ji=ji,
        force=torch.from_numpy(np.concatenate([np.asarray(s["force"], np.float32) for s in samples])),
        free=torch.from_numpy(np.concatenate([np.asarray(s["fixed"]) == 0 for s in samples])),
        energy=torch.tensor([float(s["y"]) for s in samples], dtype=torch.float32),
        num_graphs=len(samples),
    )

