"""Test/benchmark helper: run torch_geometric's DimeNetPlusPlus on OUR graph and triplets.

PyG's forward calls ``radius_graph`` (needs pyg-lib) and ``triplets`` (needs torch-sparse); neither
installs here. We patch those two module-level names of ``torch_geometric.nn.models.dimenet`` with
functions that return the precomputed graph (edge_index [j; i]) and our triplets, converted to the
(i, j, idx_i, idx_j, idx_k, idx_kj, idx_ji) tuple PyG expects. Only for systems without periodic
shifts (PyG computes distances from raw positions).
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def patched_pyg_graph(edge_index: torch.Tensor, idx_kj: torch.Tensor, idx_ji: torch.Tensor) -> Iterator[None]:
    from torch_geometric.nn.models import dimenet as pyg_dimenet

    def fake_radius_graph(pos, r, batch=None, max_num_neighbors=32, **kw):  # noqa: ANN001
        return edge_index

    def fake_triplets(ei, num_nodes):  # noqa: ANN001
        row, col = ei  # j -> i
        return col, row, col[idx_ji], row[idx_ji], row[idx_kj], idx_kj, idx_ji

    old = pyg_dimenet.radius_graph, pyg_dimenet.triplets
    pyg_dimenet.radius_graph, pyg_dimenet.triplets = fake_radius_graph, fake_triplets
    try:
        yield
    finally:
        pyg_dimenet.radius_graph, pyg_dimenet.triplets = old
