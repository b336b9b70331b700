"""opencatalyst.basis: the spherical basis's radial part with hand-written derivatives equals scipy's
spherical Bessel functions, and its first and second derivatives equal autograd's through the plain
upward recurrence (what training on forces differentiates)."""
from __future__ import annotations

import numpy as np
import torch

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
