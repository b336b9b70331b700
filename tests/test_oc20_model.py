"""Fused DimeNet++ vs torch_geometric's DimeNetPlusPlus with mapped weights; PBC invariances.

PyG's forward calls ``radius_graph`` (pyg-lib) and ``triplets`` (torch-sparse), which do not install
here; ``tests/oc20_pyg.py`` patches those two names in ``torch_geometric.nn.models.dimenet`` to
return our graph and triplets, so both models see identical inputs.

The model is the MLPerf reference's DimeNet++ (mlcommons/hpc ``open_catalyst/ocpmodels/models/
dimenet_plus_plus.py``), not PyG's: its triplet angles come from detached positions (forces flow
through the distances only) and its output blocks' ``lin_up`` has a bias. The PyG model is turned
into that variant for the comparisons (``detached_angles``, ``add_lin_up_bias`` in
``tests/oc20_pyg.py``): PyG's plain autograd forces with the angle detached are the reference's maths.
"""
from __future__ import annotations

import contextlib
import copy
import functools

import numpy as np
import pytest
import torch

from hpcbench.workloads.opencatalyst import graph, pyg_map
from hpcbench.workloads.opencatalyst.model import DimeNetPP, DimeNetPPConfig, energy_and_forces
from tests.oc20_pyg import add_lin_up_bias, detached_angles, patched_pyg_graph


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


@functools.lru_cache(maxsize=1)
def _pyg_base():  # noqa: ANN202
    """Built once per process (~10 s: PyG derives its spherical basis with sympy); callers get deep copies."""
    from torch_geometric.nn import DimeNetPlusPlus

    torch.manual_seed(0)
    pyg = DimeNetPlusPlus(192, 1, 3, 64, 8, 192, 7, 6, cutoff=6.0, max_num_neighbors=50,
                          output_initializer="glorot_orthogonal")  # non-zero output weights
    return pyg


def pyg_model(lin_up_bias: bool = True):  # noqa: ANN201
    """PyG's DimeNet++ at the closed widths (a fresh copy); with ``lin_up_bias`` its output blocks get the
    reference's biased ``lin_up`` (torch's default init, non-zero)."""
    pyg = copy.deepcopy(_pyg_base())
    if lin_up_bias:
        torch.manual_seed(1)
        add_lin_up_bias(pyg)
    return pyg


def run_pyg(pyg: torch.nn.Module, b: dict, dtype: torch.dtype,
            detach_angles: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Energies and forces by plain autograd; ``detach_angles``: the reference's angles (no gradient)."""
    with patched_pyg_graph(b["edge_index"], b["kj"], b["ji"]), (
            detached_angles(pyg) if detach_angles else contextlib.nullcontext()):
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


@pytest.mark.parametrize("lin_up_bias", [True, False])
def test_equivalent_to_reference_maths(lin_up_bias: bool) -> None:
    """fp32: ours vs PyG made the reference's variant (angles detached; ``lin_up`` biased, or PyG's
    bias-free one mapped as zero biases) within 1e-4 relative (energies per graph, force vector norm);
    both also vs that PyG in fp64. fp64: the maths agree to ~1e-7."""
    pyg = pyg_model(lin_up_bias)
    ours = pyg_map.from_pyg(pyg)
    assert bool((ours.out.up_b != 0).all()) == lin_up_bias
    b = molecule_batch()
    ref64 = run_pyg(pyg, b, torch.float64)
    assert max(rel(run_ours(ours, b, torch.float64), ref64)) < 1e-6
    pyg32, ours32 = run_pyg(pyg, b, torch.float32), run_ours(ours, b, torch.float32)
    assert max(rel(ours32, pyg32)) < 1e-4
    assert max(rel(ours32, ref64)) < 1e-4
    assert ref64[1].abs().max() > 1e-2  # a meaningful comparison


def test_angles_carry_no_force() -> None:
    """Detaching the angles leaves the energies as they are and changes the forces (the comparison above
    tells the two apart): ours equals PyG with detached angles, not PyG differentiating through them."""
    pyg = pyg_model()
    ours = pyg_map.from_pyg(pyg)
    b = molecule_batch()
    detached, through = run_pyg(pyg, b, torch.float64), run_pyg(pyg, b, torch.float64, detach_angles=False)
    e, f = run_ours(ours, b, torch.float64)
    torch.testing.assert_close(detached[0], through[0], rtol=1e-12, atol=0)
    torch.testing.assert_close(e, through[0], rtol=1e-6, atol=0)
    assert float((detached[1] - through[1]).norm() / through[1].norm()) > 1e-2
    assert float((f - detached[1]).norm() / detached[1].norm()) < 1e-6
    assert float((f - through[1]).norm() / through[1].norm()) > 1e-2


def test_reference_size_and_zero_net_force() -> None:
    """1,810,182 parameters: the reference's (PyG's 1,809,414 plus 4 x 192 ``lin_up`` biases; counted once by
    building the reference's ``DimeNetPlusPlusWrap`` at the closed widths)."""
    model = DimeNetPP(DimeNetPPConfig())
    n_params = sum(p.numel() for p in model.parameters())
    assert sum(p.numel() for p in pyg_model(lin_up_bias=False).parameters()) == 1_809_414
    assert n_params == sum(p.numel() for p in pyg_model().parameters()) == 1_809_414 + 4 * 192 == 1_810_182
    bound = 192 ** -0.5  # torch's default Linear bias init, U(-1/sqrt(in), 1/sqrt(in))
    assert model.out.up_b.shape == (4, 1, 192) and 0 < float(model.out.up_b.detach().abs().max()) <= bound
    assert float(model.out.up_b.detach().std()) > bound / 3
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


def test_initial_weights_follow_the_references_distributions() -> None:
    """Closed rule "Weight and Bias Initialization": the same distributions as the reference's DimeNet++
    (mlcommons/hpc open_catalyst dimenet_plus_plus.py with torch_geometric 1.7.2's EmbeddingBlock and
    ResidualLayer), parameter by parameter: glorot-orthogonal (scale 2: variance 2 / (fan_in + fan_out))
    with zero biases in the interaction and output blocks; the output blocks' last layer zero and their
    lin_up bias torch's default U(+-1/sqrt(H)); the embedding U(+-sqrt 3); the embedding block's two Linear
    layers torch's default init, weight and bias U(+-1/sqrt(fan_in)) (not glorot, not a zero bias);
    the radial frequencies n * pi."""
    torch.manual_seed(0)
    c = DimeNetPPConfig()
    m = DimeNetPP(c)
    h, o, r = c.hidden, c.out_emb, c.num_radial
    seen: set[str] = set()

    def uniform(name: str, t: torch.Tensor, bound: float) -> None:
        seen.add(name)
        assert t.abs().max() <= bound and t.abs().max() > 0.9 * bound, name
        if t.numel() >= 100:  # U(-b, b): std b / sqrt 3
            assert t.std().item() == pytest.approx(bound / 3 ** 0.5, rel=0.1), name

    def glorot(name: str, w: torch.Tensor) -> None:  # w as [out, in] or its transpose: the sum is the same
        seen.add(name)
        assert w.var().item() == pytest.approx(2.0 / (w.size(-2) + w.size(-1)), rel=1e-3), name

    def zero(name: str, t: torch.Tensor) -> None:
        seen.add(name)
        assert not t.any(), name

    p = dict(m.named_parameters())
    torch.testing.assert_close(p["rbf.freq"], torch.arange(1, r + 1, dtype=torch.float32) * np.pi)
    seen.add("rbf.freq")
    uniform("emb.weight", p["emb.weight"], 3 ** 0.5)
    uniform("emb_rbf.weight", p["emb_rbf.weight"], r ** -0.5)
    uniform("emb_rbf.bias", p["emb_rbf.bias"], r ** -0.5)
    uniform("emb_lin.weight", p["emb_lin.weight"], (3 * h) ** -0.5)
    uniform("emb_lin.bias", p["emb_lin.bias"], (3 * h) ** -0.5)
    for b in range(c.blocks):
        q = f"blocks.{b}."
        for name in ("rbf1", "rbf2", "sbf1", "sbf2.weight", "lin_down.weight", "lin_up.weight", "lin.weight"):
            glorot(q + name, p[q + name])
        kj_ji = p[q + "lin_kj_ji.weight"]
        glorot(q + "lin_kj_ji.weight", kj_ji[:h]), glorot(q + "lin_kj_ji.weight", kj_ji[h:])
        zero(q + "lin_kj_ji.bias", p[q + "lin_kj_ji.bias"])
        zero(q + "lin.bias", p[q + "lin.bias"])
        for part, n in (("before", c.num_before_skip), ("after", c.num_after_skip)):
            for i in range(n):
                for lin in ("lin1", "lin2"):
                    glorot(f"{q}{part}.{i}.{lin}.weight", p[f"{q}{part}.{i}.{lin}.weight"])
                    zero(f"{q}{part}.{i}.{lin}.bias", p[f"{q}{part}.{i}.{lin}.bias"])
    for k in range(c.blocks + 1):
        glorot("out.rbf", p["out.rbf"][k])
        glorot("out.up", p["out.up"][k])
        uniform("out.up_b", p["out.up_b"][k], h ** -0.5)
        for layer in range(c.num_output_layers):
            glorot("out.w", p["out.w"][layer, k])
    zero("out.b", p["out.b"])
    zero("out.final", p["out.final"])
    assert seen == set(p), set(p) ^ seen  # every parameter has its rule
    assert o == p["out.up_b"].size(-1)
