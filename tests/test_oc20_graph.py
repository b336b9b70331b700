"""PBC radius graph against ASE's neighbour list; triplets against a brute-force loop."""
from __future__ import annotations

import numpy as np
import torch

from hpcbench.workloads.opencatalyst import graph


def slab(rattle: float = 0.05):  # noqa: ANN201
    from ase.build import add_adsorbate, fcc111

    atoms = fcc111("Pt", size=(2, 2, 3), vacuum=5.0)
    add_adsorbate(atoms, "O", 1.5, "fcc")
    atoms.rattle(rattle, seed=3)
    return atoms


def test_radius_graph_matches_ase_neighbor_list() -> None:
    from ase.neighborlist import neighbor_list

    atoms = slab()
    cutoff = 6.0
    ei, off = graph.radius_graph_pbc(atoms.positions, np.asarray(atoms.cell), cutoff, 10_000, tuple(atoms.pbc))
    i, j, shifts = neighbor_list("ijS", atoms, cutoff)
    # ASE: vector j + S@cell - i, ours: centre i, neighbour image at pos[j] + off@cell
    ours = {(int(a), int(b), *map(int, o)) for a, b, o in zip(ei[1], ei[0], off)}
    theirs = {(int(a), int(b), *map(int, s)) for a, b, s in zip(i, j, shifts)}
    assert ours == theirs and len(ours) > 500


def test_max_neighbors_keeps_nearest() -> None:
    atoms = slab()
    full, foff = graph.radius_graph_pbc(atoms.positions, np.asarray(atoms.cell), 6.0, 10_000, tuple(atoms.pbc))
    capped, coff = graph.radius_graph_pbc(atoms.positions, np.asarray(atoms.cell), 6.0, 12, tuple(atoms.pbc))
    cell = np.asarray(atoms.cell)

    def dist(ei, off):  # noqa: ANN001, ANN202
        return np.linalg.norm(atoms.positions[ei[1]] - atoms.positions[ei[0]] - off @ cell, axis=1)

    assert np.bincount(capped[1]).max() == 12
    d_full, d_cap = dist(full, foff), dist(capped, coff)
    for centre in range(len(atoms)):
        np.testing.assert_allclose(np.sort(d_cap[capped[1] == centre]), np.sort(d_full[full[1] == centre])[:12])


def test_triplets_match_brute_force() -> None:
    atoms = slab()
    ei, off = graph.radius_graph_pbc(atoms.positions, np.asarray(atoms.cell), 4.0, 8, tuple(atoms.pbc))
    kj, ji = graph.triplets(torch.from_numpy(ei), torch.from_numpy(off), len(atoms))
    expect = set()
    for e1 in range(ei.shape[1]):  # edge ji: j -> i
        for e2 in range(ei.shape[1]):  # edge kj: k -> j
            if ei[1, e2] == ei[0, e1] and not (ei[0, e2] == ei[1, e1] and np.all(off[e2] + off[e1] == 0)):
                expect.add((e2, e1))
    assert set(zip(kj.tolist(), ji.tolist())) == expect and len(expect) > 100
    assert torch.all(ji[1:] >= ji[:-1])  # grouped by the target edge
