"""Test/benchmark helper: run torch_geometric's DimeNetPlusPlus on OUR graph and triplets.

PyG's forward calls ``radius_graph`` (needs pyg-lib) and ``triplets`` (needs torch-sparse); neither
installs here. We patch those two module-level names of ``torch_geometric.nn.models.dimenet`` with
functions that return the precomputed graph (edge_index [j; i]) and our triplets, converted to the
(i, j, idx_i, idx_j, idx_k, idx_kj, idx_ji) tuple PyG expects. Only for systems without periodic
shifts (PyG computes distances from raw positions).

The MLPerf reference (mlcommons/hpc ``open_catalyst/ocpmodels/models/dimenet_plus_plus.py``,
``DimeNetPlusPlusWrap``) differs from PyG's DimeNet++ in two places, which :func:`detached_angles` and
:func:`add_lin_up_bias` give a PyG model: it computes the triplet angles from detached positions (so the
forces -dE/dpos flow through the distances only), and its output blocks' ``lin_up`` has a bias
(``nn.Linear``'s default init; PyG's has none).
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


@contextlib.contextmanager
def detached_angles(pyg_model: torch.nn.Module) -> Iterator[None]:
    """PyG's forward with the angle passed to its spherical basis detached: the reference's
    ``pos[idx_*].detach()`` before atan2 (the same angle values, no gradient through them)."""
    sbf = pyg_model.sbf
    inner = type(sbf).forward

    def forward(dist, angle, idx_kj):  # noqa: ANN001, ANN202
        return inner(sbf, dist, angle.detach(), idx_kj)

    sbf.forward = forward
    try:
        yield
    finally:
        del sbf.forward


def add_lin_up_bias(pyg_model: torch.nn.Module) -> torch.nn.Module:
    """Give every output block's ``lin_up`` a bias, as the reference's ``nn.Linear(hidden, out_emb, bias=True)``
    (torch's default bias init, which the reference's ``reset_parameters`` leaves as it is); weights kept."""
    for block in pyg_model.output_blocks:
        old = block.lin_up
        new = torch.nn.Linear(old.in_features, old.out_features, bias=True)
        with torch.no_grad():
            new.weight.copy_(old.weight)
        block.lin_up = new
    return pyg_model
