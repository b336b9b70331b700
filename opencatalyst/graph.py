"""Periodic radius graphs and DimeNet triplets, vectorised (no Python loops over atoms or edges).

Convention (as OC20): ``edge_index[0]`` is the neighbour ``j`` (source), ``edge_index[1]`` the
centre ``i`` (target); the neighbour's image sits at ``pos[j] + cell_offsets @ cell``. The edge
vector used by the model is ``pos[i] - (pos[j] + cell_offsets @ cell)``.
"""
from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

import numpy as np
import torch

#: the graph of the published OC20 S2EF preprocessing (``AtomsToGraphs(radius=6, max_neigh=50)``)
OC20_CUTOFF = 6.0
OC20_MAX_NEIGHBORS = 50


def _image_range(cell: np.ndarray, cutoff: float, pbc: np.ndarray) -> np.ndarray:
    """How many periodic images along each cell vector can hold a neighbour within ``cutoff``."""
    vol = abs(float(np.linalg.det(cell)))
    reps = np.zeros(3, np.int64)
    for k in range(3):
        if pbc[k] and vol > 0:
            cross = np.cross(cell[(k + 1) % 3], cell[(k + 2) % 3])
            height = vol / float(np.linalg.norm(cross))
            reps[k] = int(np.ceil(cutoff / height))
    return reps


def radius_graph_pbc(pos: np.ndarray, cell: np.ndarray, cutoff: float, max_neighbors: int,
                     pbc: tuple[bool, bool, bool] = (True, True, True)) -> tuple[np.ndarray, np.ndarray]:
    """Edges j->i with |pos_i - pos_j - shift| < cutoff, at most ``max_neighbors`` nearest per i.

    Returns ``edge_index`` [2, E] int64 sorted by (i, distance, j) and integer-valued
    ``cell_offsets`` [E, 3] float32.
    """
    pos = np.asarray(pos, np.float64)
    cell = np.asarray(cell, np.float64).reshape(3, 3)
    n = pos.shape[0]
    reps = _image_range(cell, cutoff, np.asarray(pbc, bool))
    grids = np.meshgrid(*[np.arange(-r, r + 1) for r in reps], indexing="ij")
    offsets = np.stack([g.ravel() for g in grids], axis=1)  # [K, 3]
    shifts = offsets @ cell  # [K, 3]
    # d[i, j, k] = pos_i - pos_j - shift_k
    d = pos[:, None, None, :] - pos[None, :, None, :] - shifts[None, None, :, :]
    dist = np.sqrt((d * d).sum(-1))  # [N, N, K]
    self_img = np.all(offsets == 0, axis=1)
    dist[np.arange(n), np.arange(n), :] = np.where(self_img, np.inf, dist[np.arange(n), np.arange(n), :])
    i, j, k = np.nonzero(dist < cutoff)
    dd = dist[i, j, k]
    order = np.lexsort((k, j, dd, i))  # by centre, then distance; ties broken deterministically
    i, j, k, dd = i[order], j[order], k[order], dd[order]
    if max_neighbors > 0 and i.size:
        starts = np.searchsorted(i, np.arange(n))
        rank = np.arange(i.size) - starts[i]
        keep = rank < max_neighbors
        i, j, k = i[keep], j[keep], k[keep]
    edge_index = np.stack([j, i]).astype(np.int64)
    return edge_index, offsets[k].astype(np.float32)


def add_missing_graph(sample: MutableMapping[str, Any], where: str, cutoff: float = OC20_CUTOFF,
                      max_neighbors: int = OC20_MAX_NEIGHBORS) -> bool:
    """Give ``sample`` the periodic radius graph (``edge_index``, ``cell_offsets``) when it has
    neither, as the published OC20 files do when preprocessed without edges (``r_edges=False``,
    the usual case): the reference's 6 A / 50 nearest neighbours, periodic in all three cell
    directions. Returns whether it built one; half a graph is a :class:`DataError`."""
    from hpcbench.common.errors import DataError

    present = [k for k in ("edge_index", "cell_offsets") if k in sample]
    if len(present) == 2:
        return False
    if present:
        raise DataError(f"{where}: has '{present[0]}' but not "
                        f"'{'cell_offsets' if present[0] == 'edge_index' else 'edge_index'}'; a sample carries "
                        "both (a periodic graph) or neither (the graph is then built: 6 A, 50 neighbours)")
    if "pos" not in sample or "cell" not in sample:
        return False  # validation names the missing fields
    pos, cell = np.asarray(sample["pos"]), np.asarray(sample["cell"])
    if pos.ndim != 2 or pos.shape[1] != 3 or cell.size != 9:
        return False  # validation names the bad shapes
    sample["edge_index"], sample["cell_offsets"] = radius_graph_pbc(pos, cell, cutoff, max_neighbors)
    return True


def triplets(edge_index: torch.Tensor, cell_offsets: torch.Tensor, num_nodes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Triplets k->j->i as pairs of edge indices (idx_kj, idx_ji), sorted by idx_ji.

    For every edge ji (j->i), all edges kj arriving at j, except the edge that goes back to the
    same image of i (k == i and the two offsets cancel). Built with gathers and cumulative sums.
    """
    src, dst = edge_index[0], edge_index[1]
    e = src.numel()
    dev = src.device
    order = torch.argsort(dst, stable=True)  # edges grouped by their target
    deg = torch.bincount(dst, minlength=num_nodes)
    ptr = torch.zeros(num_nodes + 1, dtype=torch.long, device=dev)
    ptr[1:] = torch.cumsum(deg, 0)
    counts = deg[src]  # candidates kj for each edge ji: the edges arriving at j = src[ji]
    idx_ji = torch.repeat_interleave(torch.arange(e, device=dev), counts)
    first = torch.cumsum(counts, 0) - counts
    pos_in_group = torch.arange(idx_ji.numel(), device=dev) - first[idx_ji]
    idx_kj = order[ptr[src[idx_ji]] + pos_in_group]
    back = (src[idx_kj] == dst[idx_ji]) & torch.all(cell_offsets[idx_kj] + cell_offsets[idx_ji] == 0, dim=1)
    keep = ~back
    return idx_kj[keep], idx_ji[keep]


def count_triplets(edge_index: np.ndarray, cell_offsets: np.ndarray, num_nodes: int) -> int:
    # read-only arrays (views of an LMDB record) are copied: torch warns on a tensor over non-writable memory
    ei, co = (torch.from_numpy(np.require(a, requirements="W")) for a in (edge_index, cell_offsets))
    kj, _ = triplets(ei, co, num_nodes)
    return int(kj.numel())
