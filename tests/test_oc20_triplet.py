"""opencatalyst.triplet: the triplet message and the triplet basis equal their plain gather/scatter
formulas to second order (training on forces differentiates them twice), on both paths: the C loops
(built from triplet_kernels.c, one thread and several) and the torch ops (in one chunk and in many),
with unsorted indices; the whole model's training gradients are those of the plain formulas."""
from __future__ import annotations

import pytest
import torch

from hpcbench.workloads.opencatalyst import model as model_mod
from hpcbench.workloads.opencatalyst import triplet
from hpcbench.workloads.opencatalyst.model import DimeNetPP, DimeNetPPConfig, _NarrowLinear, energy_and_forces
from hpcbench.workloads.opencatalyst.triplet import triplet_basis, triplet_message

PATHS = ["c-1-thread", "c-3-threads", "torch-1-chunk", "torch-chunks"]


@pytest.fixture(params=PATHS)
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test runs on the C loops (one thread; three threads each with a span of triplets) and on the
    torch ops (one chunk; chunks of 7 triplets)."""
    name = request.param
    if name.startswith("c-"):
        if triplet._kernels(torch.zeros(1, dtype=torch.float64)) is None:
            pytest.fail(f"the C kernels did not build here: {triplet.ckernel.reason(triplet.KERNEL_SOURCE)}")
        threads = int(name.split("-")[1])
        monkeypatch.setattr(triplet, "MIN_TRIPLETS_PER_THREAD", 1)
        old = torch.get_num_threads()
        torch.set_num_threads(threads)
        request.addfinalizer(lambda: torch.set_num_threads(old))
    else:
        monkeypatch.setattr(triplet, "_kernels", lambda *tensors: None)
        monkeypatch.setattr(triplet, "CPU_CHUNK", 10_000 if name == "torch-1-chunk" else 7)
    return name


def plain(a: torch.Tensor, b: torch.Tensor, w: torch.Tensor, kj: torch.Tensor, ji: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(a).index_add_(0, ji, a.index_select(0, kj) * (b @ w))


def test_message_matches_plain_formula_to_second_order(path: str) -> None:
    g = torch.Generator().manual_seed(0)
    e, t, k, c = 13, 50, 3, 4
    a = torch.randn(e, c, dtype=torch.float64, generator=g, requires_grad=True)
    b2 = torch.randn(t, 2 * k, dtype=torch.float64, generator=g, requires_grad=True)  # b: a strided column view
    w = torch.randn(k, c, dtype=torch.float64, generator=g, requires_grad=True)
    kj, ji = torch.randint(0, e, (t,), generator=g), torch.randint(0, e, (t,), generator=g)  # ji unsorted

    def ours(a, b2, w):  # noqa: ANN001, ANN202
        return triplet_message(a, b2[:, k:], w, kj, ji)

    torch.testing.assert_close(ours(a, b2, w), plain(a, b2[:, k:], w, kj, ji), rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(ours, (a, b2, w))
    assert torch.autograd.gradgradcheck(ours, (a, b2, w))


def test_narrow_linear_to_second_order() -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(9, 3, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(6, 3, dtype=torch.float64, generator=g, requires_grad=True)
    for parts in (1, 3):
        got = _NarrowLinear.apply(x, w, parts)
        assert len(got) == parts and all(p.is_contiguous() for p in got)
        torch.testing.assert_close(torch.cat(got, dim=1), x @ w.t())
        assert torch.autograd.gradcheck(lambda a, b: _NarrowLinear.apply(a, b, parts), (x, w))
        assert torch.autograd.gradgradcheck(lambda a, b: _NarrowLinear.apply(a, b, parts), (x, w))
    # parts no loss reaches: their weight rows get zero gradient, the others the plain one
    a, b, c = _NarrowLinear.apply(x, w, 3)
    (gx, gw) = torch.autograd.grad((b * b).sum(), (x, w), create_graph=True)
    (wx, ww) = torch.autograd.grad(((x @ w[2:4].t()) ** 2).sum(), (x, w), create_graph=True)
    torch.testing.assert_close(gx, wx)
    torch.testing.assert_close(gw, ww)
    torch.testing.assert_close(torch.autograd.grad(gx.pow(2).sum(), w)[0], torch.autograd.grad(wx.pow(2).sum(), w)[0])


def test_training_step_gradients_equal_plain_autograd(monkeypatch: pytest.MonkeyPatch, path: str) -> None:
    """Whole model, float64, the benchmark's step (forces with a graph, loss on forces + energy,
    backward): every parameter gradient equals the one with the plain formulas in place of the ops
    (the triplet message; the spherical basis formed per triplet and projected, not per edge; the radial
    basis by torch ops instead of its C pass; the output blocks' edge sums by index_add_)."""
    from tests.test_oc20_model import molecule_batch

    torch.manual_seed(0)
    model = DimeNetPP(DimeNetPPConfig(hidden=16, out_emb=16, int_emb=8, blocks=2)).double()
    with torch.no_grad():
        model.out.final.normal_(0, 0.1)
    b = molecule_batch(1)

    def grads() -> list[torch.Tensor]:
        model.zero_grad()
        e, f = energy_and_forces(model, b["z"], b["pos"], b["edge_index"], None, b["kj"], b["ji"], b["batch"],
                                 b["g"], True)
        (f.pow(2).mean() + e.sum()).backward()
        return [p.grad.clone() for p in model.parameters()]

    ours = grads()
    monkeypatch.setattr(model_mod, "triplet_message", plain)
    monkeypatch.setattr(model_mod, "basis_on_edges", lambda rad: False)
    monkeypatch.setattr(model_mod, "edge_product_sum",
                        lambda x, r, dst, n: x.new_zeros(n, x.size(1)).index_add_(0, dst, x * r))
    from hpcbench.workloads.opencatalyst import basis
    monkeypatch.setattr(basis, "_radial_lib", lambda x: None)
    ref = grads()
    assert any(r.abs().max() > 0 for r in ref)
    for o, r in zip(ours, ref):
        torch.testing.assert_close(o, r, rtol=1e-9, atol=1e-12)


def plain_basis(r: torch.Tensor, c: torch.Tensor, kj: torch.Tensor) -> torch.Tensor:
    return (c.unsqueeze(-1) * r[kj]).sum(1)


@pytest.mark.parametrize("p", [16, 24, 5])  # the mini and full presets' 8 x blocks, and a shape not specialised
def test_basis_matches_plain_formula_to_second_order(path: str, p: int) -> None:
    g = torch.Generator().manual_seed(2)
    e, t, l = 11, 60, 7
    r = torch.randn(e, l, p, dtype=torch.float64, generator=g, requires_grad=True)
    c = torch.randn(t, l, dtype=torch.float64, generator=g)
    kj = torch.randint(0, e, (t,), generator=g)

    def ours(r):  # noqa: ANN001, ANN202
        return triplet_basis(r, c, kj)

    torch.testing.assert_close(ours(r), plain_basis(r, c, kj), rtol=1e-12, atol=1e-12)
    # fast mode: random projections of the Jacobians (r has e * l * p entries; a full Jacobian is slow)
    assert torch.autograd.gradcheck(ours, (r,), fast_mode=True)
    assert torch.autograd.gradgradcheck(ours, (r,), fast_mode=True)


def test_c_loops_agree_with_torch_ops_in_float32(monkeypatch: pytest.MonkeyPatch) -> None:
    """The training dtype, at the full preset's widths (C = 64, K = 8, P = 24) on a random problem of
    a few thousand triplets: forward and both gradients agree with the torch path to float32 rounding."""
    if triplet._kernels(torch.zeros(1)) is None:
        pytest.fail(f"the C kernels did not build here: {triplet.ckernel.reason(triplet.KERNEL_SOURCE)}")
    g = torch.Generator().manual_seed(3)
    e, t = 300, 5000
    a = torch.randn(e, 64, generator=g, requires_grad=True)
    b = torch.randn(t, 24, generator=g, requires_grad=True)
    w = torch.randn(8, 64, generator=g, requires_grad=True)
    r = torch.randn(e, 7, 24, generator=g, requires_grad=True)
    c = torch.randn(t, 7, generator=g)
    kj, ji = torch.randint(0, e, (t,), generator=g), torch.sort(torch.randint(0, e, (t,), generator=g)).values

    def run() -> list[torch.Tensor]:
        y = triplet_message(a, b[:, 8:16], w, kj, ji)  # b: a column slice, as the model's split basis
        z = triplet_basis(r, c, kj)
        ga, gb, gw, gr = torch.autograd.grad(y.pow(2).sum() + z.pow(2).sum(), (a, b, w, r), create_graph=True)
        second = torch.autograd.grad(ga.sum() + gb.pow(2).sum() + gw.sum() + gr.pow(2).sum(), (a, b, w, r))
        return [y, z, ga, gb, gw, gr, *second]

    ours = run()
    monkeypatch.setattr(triplet, "_kernels", lambda *tensors: None)
    ref = run()
    for o, want in zip(ours, ref, strict=True):
        torch.testing.assert_close(o, want, rtol=2e-4, atol=2e-3 * float(want.detach().abs().max()))


def test_out_of_range_index_is_an_error_not_a_wild_write() -> None:
    if triplet._kernels(torch.zeros(1)) is None:
        pytest.fail(f"the C kernels did not build here: {triplet.ckernel.reason(triplet.KERNEL_SOURCE)}")
    a, b, w = torch.randn(5, 4), torch.randn(3, 2), torch.randn(2, 4)
    with pytest.raises(IndexError, match=r"idx_kj .*outside \[0, 5\)"):
        triplet_message(a, b, w, torch.tensor([0, 1, 5]), torch.tensor([0, 1, 2]))
    with pytest.raises(IndexError, match=r"idx_ji .*outside"):
        triplet_message(a, b, w, torch.tensor([0, 1, 2]), torch.tensor([0, -1, 2]))
    with pytest.raises(IndexError, match=r"idx_kj"):
        triplet_basis(torch.randn(5, 7, 4), torch.randn(3, 7), torch.tensor([0, 9, 1]))


def test_basis_weights_with_a_gradient_are_refused() -> None:
    with pytest.raises(ValueError, match="must not require a gradient"):
        triplet_basis(torch.randn(5, 7, 4), torch.randn(3, 7, requires_grad=True), torch.tensor([0, 1, 2]))


@pytest.mark.parametrize("case", ["idx_short", "idx_2d", "w_narrow", "w_short", "float_idx"])
def test_shapes_that_disagree_are_refused_before_any_loop(case: str) -> None:
    """Mismatched shapes would make the unchecked C loops read or write outside the tensors (a reviewer
    found segfaults and heap corruption): each is a named error on every path."""
    g = torch.Generator().manual_seed(4)
    a, b, w = torch.randn(6, 32, generator=g), torch.randn(20, 8, generator=g), torch.randn(8, 32, generator=g)
    kj, ji = torch.randint(0, 6, (20,), generator=g), torch.randint(0, 6, (20,), generator=g)
    bad = {"idx_short": lambda: triplet_message(a, b, w, kj[:10], ji[:10]),
           "idx_2d": lambda: triplet_message(a, b, w, kj[None], ji[None]),
           "w_narrow": lambda: triplet_message(a, b, w[:, :16], kj, ji),
           "w_short": lambda: triplet_message(a, b, w[:4], kj, ji),
           "float_idx": lambda: triplet_message(a, b, w, kj.float(), ji)}[case]
    with pytest.raises((ValueError, TypeError), match="triplet_message: .*(idx_kj|w \\[K, C\\]|integers)"):
        bad()


def test_basis_shapes_that_disagree_are_refused() -> None:
    r, c, kj = torch.randn(5, 7, 16), torch.randn(9, 7), torch.randint(0, 5, (9,))
    with pytest.raises(ValueError, match="idx_kj must be a 1-D vector of 9"):
        triplet_basis(r, c, kj[:4])
    with pytest.raises(ValueError, match=r"r \[E, L, P\] and c \[T, L\]"):
        triplet_basis(r, torch.randn(9, 8), kj)


def test_wide_channels_take_the_torch_path() -> None:
    """Above the C loops' channel limit (their scratch rows are on the stack) the torch ops run."""
    a, b, w = torch.randn(4, 1100), torch.randn(6, 8), torch.randn(8, 1100)
    kj, ji = torch.tensor([0, 1, 2, 3, 0, 1]), torch.tensor([1, 2, 3, 0, 0, 0])
    assert triplet._kernels(a, b, w) is None
    torch.testing.assert_close(triplet_message(a, b, w, kj, ji), plain(a, b, w, kj, ji))


def test_the_workload_prepares_the_kernels_before_the_run_on_a_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    from hpcbench.workloads.opencatalyst.workload import OC20Workload

    asked: list[str] = []
    monkeypatch.setattr(triplet, "prepare", lambda: asked.append("triplet") or "")
    from hpcbench.workloads.opencatalyst import act
    monkeypatch.setattr(act, "prepare", lambda: asked.append("silu") or "")
    from hpcbench.workloads.opencatalyst import basis
    monkeypatch.setattr(basis, "prepare", lambda: asked.append("radial") or "")
    from hpcbench.workloads.opencatalyst import edge_sum
    monkeypatch.setattr(edge_sum, "prepare", lambda: asked.append("edge_sum") or "")
    OC20Workload.on_device(object.__new__(OC20Workload), torch.device("cpu"))
    assert asked == ["triplet", "silu", "radial", "edge_sum"]
    asked.clear()
    OC20Workload.on_device(object.__new__(OC20Workload), torch.device("meta"))
    assert asked == []
