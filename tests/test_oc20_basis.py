"""opencatalyst.basis: the spherical basis's radial part with hand-written derivatives equals scipy's
spherical Bessel functions, and its first and second derivatives equal autograd's through the plain
upward recurrence (what training on forces differentiates); the C pass (radial_kernels.c: the envelope
times the Bessel part, with both derivatives) equals the torch path in value, first and second derivative."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from hpcbench.common import ckernel
from hpcbench.workloads.opencatalyst import basis
from hpcbench.workloads.opencatalyst.basis import SphericalBasis, _BesselRadial, envelope


def spherical_jn(order: int, x: torch.Tensor) -> torch.Tensor:
    """j_order(x) by the plain upward recurrence (what basis.py evaluated through autograd before)."""
    s, c = torch.sin(x), torch.cos(x)
    j0 = s / x
    if order == 0:
        return j0
    j1 = s / (x * x) - c / x
    for n in range(1, order):
        j0, j1 = j1, (2 * n + 1) / x * j1 - j0
    return j1


def plain_radial(x: torch.Tensor, sb: SphericalBasis) -> torch.Tensor:
    x64 = x.double()[:, None]
    parts = [spherical_jn(l, sb.zeros[l].double() * x64) for l in range(sb.num_spherical)]
    return torch.stack(parts, dim=1).to(x.dtype) * sb.norm.to(x.dtype)


def test_values_equal_scipy() -> None:
    from scipy.special import spherical_jn as jn

    sb = SphericalBasis(7, 6)
    x = torch.linspace(0.05, 1.2, 301)
    got = _BesselRadial.apply(x, sb.zeros, sb.norm).double().numpy()
    z = sb.zeros.double().numpy()
    want = np.stack([jn(l, z[l][None, :] * x.double().numpy()[:, None]) for l in range(7)], axis=1)
    np.testing.assert_allclose(got, want * sb.norm.double().numpy(), rtol=2e-6, atol=1e-7)


def test_first_and_second_derivatives_equal_the_recurrence_through_autograd() -> None:
    sb = SphericalBasis(7, 6).double()
    g = torch.Generator().manual_seed(0)
    x = (torch.rand(40, generator=g, dtype=torch.float64) * 0.95 + 0.1).requires_grad_(True)
    w = torch.randn(7, 6, generator=g, dtype=torch.float64)

    def ours(x: torch.Tensor) -> torch.Tensor:
        return _BesselRadial.apply(x, sb.zeros, sb.norm)

    assert torch.autograd.gradcheck(ours, (x,))
    assert torch.autograd.gradgradcheck(ours, (x,))

    def force_like(f):  # noqa: ANN001, ANN202: energy -> d/dx with a graph -> a loss on it -> d/dx
        e = (f(x) * w * envelope(x, 5)[:, None, None]).sum()
        (gx,) = torch.autograd.grad(e, x, create_graph=True)
        return gx, torch.autograd.grad(gx.pow(2).sum(), x)[0]

    for a, b in zip(force_like(ours), force_like(lambda t: plain_radial(t, sb)), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_float32_output_keeps_the_float64_evaluation() -> None:
    sb = SphericalBasis(7, 6)
    x = torch.linspace(0.1, 1.0, 50)
    torch.testing.assert_close(_BesselRadial.apply(x, sb.zeros, sb.norm),
                               _BesselRadial.apply(x.double(), sb.zeros, sb.norm).float(), rtol=1e-6, atol=1e-7)


@pytest.fixture
def c_pass() -> None:
    if basis.prepare():  # as the triplet tests: the suite runs where cc is (CI); a build failure must not pass quietly
        pytest.fail(f"the C file did not build here: {basis.prepare()}")


def _torch_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(basis, "_radial_lib", lambda x: None)


def _value_and_derivatives(sb: SphericalBasis, x0: torch.Tensor, w: torch.Tensor, h: torch.Tensor):  # noqa: ANN202
    """f(x), d/dx of sum(f w) with a graph, and d/dx of that times h: what training on forces takes."""
    x = x0.clone().requires_grad_(True)
    r = sb.radial(x)
    (gx,) = torch.autograd.grad((r * w).sum(), x, create_graph=True)
    (gxx,) = torch.autograd.grad((gx * h).sum(), x)
    return r.detach(), gx.detach(), gxx


@pytest.mark.parametrize("dtype, rtol", [(torch.float64, 1e-9), (torch.float32, 2e-6)])
def test_the_c_pass_equals_the_torch_path(c_pass: None, monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype,
                                          rtol: float) -> None:
    """Values and both derivatives, over distances inside and beyond the cutoff (x >= 1: all zero), float64
    and float32 (the float32 torch path rounds its envelope to float32 first: agreement to the scale)."""
    sb = SphericalBasis(7, 6, 5).to(dtype)
    g = torch.Generator().manual_seed(0)
    x = torch.cat([torch.rand(300, generator=g, dtype=torch.float64) * 1.2 + 0.05,
                   torch.tensor([1.0, 2.0], dtype=torch.float64)]).to(dtype)
    w = torch.randn(x.numel(), 7, 6, generator=g, dtype=dtype)
    h = torch.randn(x.numel(), generator=g, dtype=dtype)
    assert basis._c_radial(x, sb.zeros, sb.norm, 5) is not None  # the C pass is what runs below
    ours = _value_and_derivatives(sb, x, w, h)
    _torch_path(monkeypatch)
    want = _value_and_derivatives(sb, x, w, h)
    for a, b in zip(ours, want, strict=True):
        torch.testing.assert_close(a, b, rtol=rtol, atol=rtol * float(b.abs().max()))
    assert not ours[0][x >= 1].any() and not ours[1][x >= 1].any() and not ours[2][x >= 1].any()


@pytest.mark.parametrize("exponent", [2, 5, 8])
def test_the_c_pass_is_differentiable_twice(c_pass: None, exponent: int) -> None:
    sb = SphericalBasis(4, 3, exponent).double()
    x = torch.tensor([0.12, 0.37, 0.58, 0.81, 0.97], dtype=torch.float64, requires_grad=True)
    assert basis._c_radial(x, sb.zeros, sb.norm, exponent) is not None
    assert torch.autograd.gradcheck(sb.radial, (x,))
    assert torch.autograd.gradgradcheck(sb.radial, (x,))


def test_the_c_pass_propagates_nan_and_inf(c_pass: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """NaN and inf distances give NaN rows, as the torch path (inf * 0 is NaN there); beyond the cutoff, zeros."""
    sb = SphericalBasis(7, 6)
    x = torch.tensor([0.5, math.nan, 1.5, math.inf])
    r = sb.radial(x)
    assert r[0].isfinite().all() and r[1].isnan().all() and not r[2].any() and r[3].isnan().all()
    _torch_path(monkeypatch)
    want = sb.radial(x)
    assert want[1].isnan().all() and not want[2].any() and want[3].isnan().all()


def test_the_c_pass_output_is_a_tensor_of_its_own(c_pass: None) -> None:
    """In float64 the output is not the pass's float64 buffer handed back as an input (a view autograd would
    refuse to change in place): in-place ops on it work as on the torch path's."""
    sb = SphericalBasis(7, 6).double()
    x = torch.tensor([0.3, 0.6], dtype=torch.float64, requires_grad=True)
    r = sb.radial(x).mul_(2)
    (g,) = torch.autograd.grad(r.sum(), x)
    assert g.isfinite().all()


def test_the_c_pass_on_threads_equals_one_thread(c_pass: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Edges cut into 3 thread spans give the same bits as one pass (each edge's values are its own)."""
    sb = SphericalBasis(7, 6)
    x = torch.rand(1000, generator=torch.Generator().manual_seed(2)) * 1.1 + 0.05
    one = basis._c_radial(x, sb.zeros, sb.norm, 5)
    monkeypatch.setattr(basis, "MIN_EDGES_PER_THREAD", 16)
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        assert len(ckernel.spans(1000, torch.get_num_threads(), basis.MIN_EDGES_PER_THREAD)) == 3
        three = basis._c_radial(x, sb.zeros, sb.norm, 5)
    finally:
        torch.set_num_threads(before)
    for a, b in zip(one, three, strict=True):
        assert torch.equal(a, b)


def test_no_c_pass_where_it_does_not_apply(monkeypatch: pytest.MonkeyPatch) -> None:
    """Other dtypes and switched-off kernels take the torch path, which gives the same basis."""
    sb = SphericalBasis(7, 6)
    x = torch.linspace(0.1, 0.9, 9)
    assert basis._c_radial(x.half(), sb.zeros, sb.norm, 5) is None
    monkeypatch.setattr(ckernel, "_loaded", {})
    monkeypatch.setenv("HPCBENCH_C_KERNELS", "0")
    assert basis._c_radial(x, sb.zeros, sb.norm, 5) is None
    torch.testing.assert_close(sb.radial(x), envelope(x, 5)[:, None, None] * _BesselRadial.apply(x, sb.zeros, sb.norm))
