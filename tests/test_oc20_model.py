"""Fused DimeNet++ vs torch_geometric's DimeNetPlusPlus with mapped weights; PBC invariances.

PyG's forward calls ``radius_graph`` (pyg-lib) and ``triplets`` (torch-sparse), which do not install
here; ``tests/oc20_pyg.py`` patches those two names in ``torch_geometric.nn.models.dimenet`` to
return our graph and triplets, so both models see identical inputs.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from hpcbench.workloads.opencatalyst import graph, pyg_map
from hpcbench.workloads.opencatalyst.model import DimeNetPP, DimeNetPPConfig, energy_and_forces
from tests.oc20_pyg import patched_pyg_graph


def molecule_batch(n_graphs: int = 2, seed: int = 0) -> dict:
    """Non-periodic rattled metal clusters with an O adatom (realistic >= ~2 A spacings)."""
    from ase.build import bulk

    rng = np.random.default_rng(seed)
    pos, z, eis, batch, start = [], [], [], [], 0
    for g in range(n_graphs):
        atoms = bulk(["Cu", "Pt", "Au"][g % 3], cubic=True).repeat((2, 2, 1))
        p = np.concatenate([atoms.positions, [[1.8, 1.8, atoms.positions[:, 2].max() + 1.9]]])
        p = p + rng.normal(0, 0.1, p.shape)
        n = len(p)
        ei, _ = graph.radius_graph_pbc(p, np.eye(3) * 100, 6.0, 50, (False, False, False))
        pos.append(p), z.append(np.r_[atoms.numbers, 8]), eis.append(ei + start), batch.append(np.full(n, g))
        start += n
    ei = torch.from_numpy(np.concatenate(eis, 1))
    kj, ji = graph.triplets(ei, torch.zeros(ei.shape[1], 3), start)
    return {"z": torch.from_numpy(np.concatenate(z)), "pos": torch.tensor(np.concatenate(pos), dtype=torch.float64),
            "edge_index": ei, "kj": kj, "ji": ji, "batch": torch.from_numpy(np.concatenate(batch)), "g": n_graphs}


def pyg_model():  # noqa: ANN201
    from torch_geometric.nn import DimeNetPlusPlus

    torch.manual_seed(0)
    return DimeNetPlusPlus(192, 1, 3, 64, 8, 192, 7, 6, cutoff=6.0, max_num_neighbors=50,
                           output_initializer="glorot_orthogonal")  # non-zero output weights


def run_pyg(pyg: torch.nn.Module, b: dict, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    with patched_pyg_graph(b["edge_index"], b["kj"], b["ji"]):
        p = b["pos"].to(dtype).requires_grad_(True)
        e = pyg.to(dtype)(b["z"], p, b["batch"]).view(-1)
        return e.detach(), -torch.autograd.grad(e.sum(), p)[0]


def run_ours(model: torch.nn.Module, b: dict, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    e, f = energy_and_forces(model.to(dtype), b["z"], b["pos"].to(dtype), b["edge_index"], None, b["kj"], b["ji"],
                             b["batch"], b["g"], False)
    return e.detach(), f.detach()


def rel(a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor]) -> tuple[float, float]:
    e = float(((a[0].double() - b[0].double()).abs() / b[0].double().abs()).max())
    return e, float((a[1].double() - b[1].double()).norm() / b[1].double().norm())


def test_equivalent_to_pyg() -> None:
    """fp32: ours vs PyG within 1e-4 relative (energies per graph, force vector norm); both also vs
    PyG in fp64. fp64: the maths agree to ~1e-7."""
    pyg = pyg_model()
    ours = pyg_map.from_pyg(pyg)
    b = molecule_batch()
    ref64 = run_pyg(pyg, b, torch.float64)
    assert max(rel(run_ours(ours, b, torch.float64), ref64)) < 1e-6
    pyg32, ours32 = run_pyg(pyg, b, torch.float32), run_ours(ours, b, torch.float32)
    assert max(rel(ours32, pyg32)) < 1e-4
    assert max(rel(ours32, ref64)) < 1e-4
    assert ref64[1].abs().max() > 1e-2  # a meaningful comparison


def test_reference_size_and_zero_net_force() -> None:
    model = DimeNetPP(DimeNetPPConfig())
    n_params = sum(p.numel() for p in model.parameters())
    assert n_params == sum(p.numel() for p in pyg_model().parameters()) == 1_809_414
    with torch.no_grad():
        model.out.final.normal_(0, 0.1)
    b = molecule_batch(1)
    _, f = energy_and_forces(model, b["z"], b["pos"].float(), b["edge_index"], None, b["kj"], b["ji"], b["batch"], 1, False)
    torch.testing.assert_close(f.sum(0), torch.zeros(3), atol=1e-4, rtol=0)  # translation invariance


def test_periodic_image_invariance() -> None:
    """Moving an atom by a lattice vector (and fixing its edges' offsets) changes nothing."""
    from hpcbench.workloads.opencatalyst import datagen

    s = datagen.make_sample(datagen.GenSpec(size=(2, 2, 3), cutoff=5.0, max_neighbors=30), 0, "train", 1)
    cell = s["cell"][0].astype(np.float64)
    torch.manual_seed(1)
    model = DimeNetPP(DimeNetPPConfig(hidden=32, out_emb=32, int_emb=16, blocks=2, cutoff=5.0))
    with torch.no_grad():
        model.out.final.normal_(0, 0.1)

    def run(pos: np.ndarray, off: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        ei = torch.from_numpy(s["edge_index"])
        offt = torch.from_numpy(off.astype(np.float32))
        kj, ji = graph.triplets(ei, offt, s["natoms"])
        shift = offt @ torch.from_numpy(cell.astype(np.float32))
        return energy_and_forces(model, torch.from_numpy(s["atomic_numbers"]), torch.tensor(pos, dtype=torch.float32),
                                 ei, shift, kj, ji, torch.zeros(s["natoms"], dtype=torch.long), 1, False)

    e0, f0 = run(s["pos"].astype(np.float64), s["cell_offsets"])
    moved = s["pos"].astype(np.float64).copy()
    moved[0] += cell[0] + cell[1]
    off = s["cell_offsets"].copy()
    src, dst = s["edge_index"]
    off[src == 0] -= [1, 1, 0]  # neighbour image pos[j] + off@cell stays where it was
    off[dst == 0] += [1, 1, 0]  # centre moved: its neighbours are one cell further
    e1, f1 = run(moved, off)
    torch.testing.assert_close(e1, e0, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(f1, f0, rtol=1e-4, atol=1e-5)
    assert f0.abs().max() > 1e-4
