"""opencatalyst.edge_sum: the output blocks' edge-to-atom sum P[dst] += x * r with hand-written first and
second derivatives (C loops on the CPU) equals the plain autograd expression in value, in the force-like
first derivative with a graph and in the second derivative taken through it, on one thread and on three
(private per-atom targets summed in a fixed order); gradients that reach only one input; bad input."""
from __future__ import annotations

import pytest
import torch

from hpcbench.common import ckernel
from hpcbench.workloads.opencatalyst import edge_sum
from hpcbench.workloads.opencatalyst.edge_sum import edge_product_sum


@pytest.fixture
def c_loops() -> None:
    if edge_sum.prepare():  # as the triplet tests: the suite runs where cc is (CI); a build failure must not pass quietly
        pytest.fail(f"the C file did not build here: {edge_sum.prepare()}")


def plain(x: torch.Tensor, r: torch.Tensor, dst: torch.Tensor, atoms: int) -> torch.Tensor:
    return x.new_zeros(atoms, x.size(1)).index_add_(0, dst, x * r)


def case(dtype: torch.dtype, edges: int = 500, atoms: int = 23, channels: int = 48, seed: int = 0):  # noqa: ANN201
    """x contiguous; r a column slice of a wider matrix (as the model's radial projections: row stride 3C)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(edges, channels, generator=g, dtype=dtype)
    r = torch.randn(edges, 3 * channels, generator=g, dtype=dtype)[:, channels:2 * channels]
    dst = torch.randint(0, atoms, (edges,), generator=g)
    w = torch.randn(atoms, channels, generator=g, dtype=dtype)
    return x, r, dst, atoms, w


def force_like(f, x0: torch.Tensor, r0: torch.Tensor, dst: torch.Tensor, atoms: int, w: torch.Tensor):  # noqa: ANN001, ANN201
    """value; d/d(x, r) of sum(P * w) with a graph; d/d(x, r, w) of a loss on those gradients, plus the value's
    own path (as training on energy and forces). A column-sliced ``r0`` stays a slice of its (leaf) matrix, so
    the loops read r, and the second order's gradient for gr (r itself, from the loss), in place."""
    x, w = (t.clone().requires_grad_(True) for t in (x0, w))
    if r0.is_contiguous():
        wide = r0.clone().requires_grad_(True)
        r = wide
    else:
        c = r0.size(1)
        start = (r0.storage_offset() % r0.stride(0))
        wide = torch.as_strided(r0, (r0.size(0), r0.stride(0)), (r0.stride(0), 1), r0.storage_offset() - start)
        wide = wide.clone().requires_grad_(True)
        r = wide[:, start:start + c]
        assert not r.is_contiguous() and torch.equal(r, r0)
    p = f(x, r, dst, atoms)
    gx, gr = torch.autograd.grad((p * w).sum(), (x, r), create_graph=True)
    loss = gx.pow(2).sum() + (gr * r).sum() + 0.5 * (p * p).sum()
    return (p.detach(), gx.detach(), gr.detach(), *torch.autograd.grad(loss, (x, wide, w)))


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-12), (torch.float32, 2e-5)])
def test_equals_the_plain_expression(c_loops: None, monkeypatch: pytest.MonkeyPatch, threads: int,
                                     dtype: torch.dtype, tol: float) -> None:
    monkeypatch.setattr(edge_sum, "MIN_EDGES_PER_THREAD", 64)
    x, r, dst, atoms, w = case(dtype)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        assert len(ckernel.spans(x.size(0), torch.get_num_threads(), edge_sum.MIN_EDGES_PER_THREAD)) == threads
        assert edge_sum._kernels(x, r) is not None and not r.is_contiguous()
        ours = force_like(edge_product_sum, x, r, dst, atoms, w)
        strided = force_like(lambda a, b, *rest: edge_product_sum(a.t().contiguous().t(), b, *rest), x, r, dst, atoms, w)
    finally:
        torch.set_num_threads(before)
    want = force_like(plain, x, r, dst, atoms, w)
    for a, b, c in zip(ours, want, strided, strict=True):  # also x with non-unit column stride (copied)
        torch.testing.assert_close(a, b, rtol=tol, atol=tol)
        torch.testing.assert_close(c, b, rtol=tol, atol=tol)


def test_twice_differentiable_by_gradcheck(c_loops: None) -> None:
    x, r, dst, atoms, _ = case(torch.float64, edges=30, atoms=5, channels=4)
    x.requires_grad_(True)
    r.requires_grad_(True)

    def f(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return edge_product_sum(a, b, dst, atoms)

    assert torch.autograd.gradcheck(f, (x, r))
    assert torch.autograd.gradgradcheck(f, (x, r))


def test_a_gradient_for_one_input_only(c_loops: None) -> None:
    """r without a gradient (a constant weighting): gx only, and its second derivative reaches x's loss."""
    x, r, dst, atoms, w = case(torch.float64)
    out = []
    for f in (edge_product_sum, plain):
        xx = x.clone().requires_grad_(True)
        (gx,) = torch.autograd.grad((f(xx, r, dst, atoms) * w).sum(), xx, create_graph=True)
        out.append((gx.detach(), *torch.autograd.grad((gx * gx).sum() + f(xx, r, dst, atoms).sum(), xx)))
    for a, b in zip(*out, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_bad_input_is_named() -> None:
    x, r, dst, atoms, _ = case(torch.float32, edges=10, atoms=3, channels=4)
    with pytest.raises(ValueError, match="one shape"):
        edge_product_sum(x, r[:, :2], dst, atoms)
    with pytest.raises(ValueError, match="dst must be"):
        edge_product_sum(x, r, dst.float(), atoms)
    with pytest.raises(ValueError, match="dst must be"):
        edge_product_sum(x, r, dst[:5], atoms)
    if edge_sum._kernels(x, r) is not None:
        with pytest.raises(IndexError, match="outside"):
            edge_product_sum(x, r, torch.full((10,), 3), atoms)


def test_the_plain_expression_where_the_loops_do_not_apply(monkeypatch: pytest.MonkeyPatch) -> None:
    x, r, dst, atoms, _ = case(torch.float32, edges=40, atoms=6, channels=8)
    assert edge_sum._kernels(x.half(), r.half()) is None
    torch.testing.assert_close(edge_product_sum(x.half(), r.half(), dst, atoms), plain(x.half(), r.half(), dst, atoms))
    monkeypatch.setattr(ckernel, "_loaded", {})
    monkeypatch.setenv("HPCBENCH_C_KERNELS", "0")
    assert edge_sum._kernels(x, r) is None
    torch.testing.assert_close(edge_product_sum(x, r, dst, atoms), plain(x, r, dst, atoms))


def test_second_order_reads_sliced_incoming_gradients_in_place(c_loops: None) -> None:
    """The gradients for (gx, gr) arrive as column slices of a wider matrix in the model (the fused radial
    projection's split): the loops read them with their row stride; the result equals the formulas."""
    x, r, dst, atoms, _ = case(torch.float64, edges=200, atoms=11, channels=16)
    g = torch.Generator().manual_seed(5)
    gp = torch.randn(atoms, 16, generator=g, dtype=torch.float64, requires_grad=True)
    xx, rr = x.clone().requires_grad_(True), r.clone().requires_grad_(True)
    lib = edge_sum._kernels(xx, rr)
    gx, gr = edge_sum._EdgeSumGrad.apply(gp, xx, rr, dst, lib)
    hx = torch.randn(200, 56, generator=g, dtype=torch.float64)[:, 16:32]
    hr = torch.randn(200, 40, generator=g, dtype=torch.float64)[:, 3:19]
    assert not hx.is_contiguous() and not hr.is_contiguous()
    seen: list[int] = []
    rows = edge_sum._rows
    edge_sum._rows = lambda t: (seen.append(t.stride(0)), rows(t))[1]
    try:
        dgp, dx, dr = torch.autograd.grad((gx, gr), (gp, xx, rr), (hx, hr))
    finally:
        edge_sum._rows = rows
    assert 56 in seen and 40 in seen  # hx and hr reached the loops as slices (r's rows are 48 apart)
    ge = gp.detach()[dst]
    want_dgp = torch.zeros(atoms, 16, dtype=torch.float64).index_add_(0, dst, hx * r + hr * x)
    for got, want in ((dgp, want_dgp), (dx, hr * ge), (dr, hx * ge)):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_no_edges_and_int32_indices(c_loops: None) -> None:
    x, r, dst, atoms, w = case(torch.float64, edges=60, atoms=7, channels=8)
    for a, b in zip(force_like(edge_product_sum, x, r, dst.to(torch.int32), atoms, w),
                    force_like(plain, x, r, dst, atoms, w), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    empty = force_like(edge_product_sum, x[:0], r[:0], dst[:0], atoms, w)
    assert not empty[0].any() and empty[1].shape == (0, 8) and not empty[-1].any()
