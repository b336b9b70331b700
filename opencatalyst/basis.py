"""DimeNet radial (Bessel) and spherical (Bessel x Legendre) bases, evaluated with recurrences.

The spherical Bessel roots and normalisers are computed once with scipy; evaluation is a few
vectorised torch ops (no symbolic per-function lambdas). Angles enter only through
cos(angle), so the Legendre polynomials need no atan2/cos round trip.

The spherical basis's radial part N_ln j_l(z_ln x) and its first two derivatives in x are written out
(:class:`_BesselRadial`): j_l' = j_{l-1} - (l+1)/u j_l and, from Bessel's equation,
j_l'' = -2/u j_l' + (l(l+1)/u^2 - 1) j_l, with u = z_ln x. Training on forces differentiates the basis
twice; through autograd the upward recurrence became about a thousand small ops per step, here it is
one recurrence over all orders at once per pass.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.autograd.function import once_differentiable


def envelope(x: Tensor, exponent: int) -> Tensor:
    """Smooth cutoff polynomial u(x) of DimeNet, zero for x >= 1 (x = distance / cutoff)."""
    p = exponent + 1
    a, b, c = -(p + 1) * (p + 2) / 2, p * (p + 2), -p * (p + 1) / 2
    xp = x.pow(p - 1)
    return (1.0 / x + a * xp + b * xp * x + c * xp * x * x) * (x < 1.0).to(x.dtype)


def bessel_zeros(num_orders: int, num_roots: int) -> np.ndarray:
    """First ``num_roots`` positive roots of j_l for l < num_orders (roots interlace: bracket with
    the previous order's roots)."""
    from scipy.optimize import brentq
    from scipy.special import spherical_jn as jn

    zeros = np.zeros((num_orders, num_roots))
    points = np.arange(1, num_roots + num_orders) * np.pi  # roots of j_0
    zeros[0] = points[:num_roots]
    for order in range(1, num_orders):
        roots = np.array([brentq(lambda r: jn(order, r), points[k], points[k + 1])
                          for k in range(len(points) - 1)])
        zeros[order] = roots[:num_roots]
        points = roots
    return zeros


def _bessel_and_derivatives(x: Tensor, zeros: Tensor, order: int) -> tuple[Tensor, Tensor, Tensor]:
    """j_l(u), d/du j_l(u) and d2/du2 j_l(u) at u = zeros[l, n] * x, all [E, L, R] in float64 (the upward
    recurrence cancels digits at small arguments). Order ``order`` selects derivatives: 0, 1 or 2 (None
    for the ones not asked)."""
    u = zeros.double() * x.double()[:, None, None]  # [E, L, R]
    num = zeros.size(0)
    inv = 1.0 / u
    prev, cur = torch.cos(u) * inv, torch.sin(u) * inv  # j_{-1}, j_0
    j, jm1 = torch.empty_like(u), torch.empty_like(u)
    for k in range(num):  # slice l of j gets j_l, of jm1 j_{l-1}
        j[:, k], jm1[:, k] = cur[:, k], prev[:, k]
        if k + 1 < num:
            prev, cur = cur, (2 * k + 1) * inv * cur - prev
    if order == 0:
        return j, None, None  # type: ignore[return-value]
    ell = torch.arange(num, dtype=u.dtype, device=u.device)[:, None]  # [L, 1]
    dj = jm1 - (ell + 1) * inv * j
    if order == 1:
        return j, dj, None  # type: ignore[return-value]
    d2j = (ell * (ell + 1) * inv * inv - 1) * j - 2 * inv * dj
    return j, dj, d2j


class _BesselRadial(torch.autograd.Function):
    """N[l, n] j_l(zeros[l, n] x) [E, L, R] in x's dtype; differentiable twice in x (forces, then the loss
    on forces), hence :class:`_BesselRadialGrad` for the first derivative."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, zeros: Tensor, norm: Tensor) -> Tensor:
        ctx.save_for_backward(x, zeros, norm)
        j = _bessel_and_derivatives(x, zeros, 0)[0]
        return (j * norm.double()).to(x.dtype)

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor | None, None, None]:
        x, zeros, norm = ctx.saved_tensors
        return _BesselRadialGrad.apply(g, x, zeros, norm), None, None


class _BesselRadialGrad(torch.autograd.Function):
    """sum over (l, n) of g * N z j_l'(z x): [E]."""

    @staticmethod
    def forward(ctx: Any, g: Tensor, x: Tensor, zeros: Tensor, norm: Tensor) -> Tensor:
        ctx.save_for_backward(g, x, zeros, norm)
        _, dj, _ = _bessel_and_derivatives(x, zeros, 1)
        return (g.double() * dj * (norm * zeros).double()).sum((1, 2)).to(x.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, gg: Tensor) -> tuple[Tensor | None, Tensor | None, None, None]:
        g, x, zeros, norm = ctx.saved_tensors
        need_g, need_x = ctx.needs_input_grad[:2]
        _, dj, d2j = _bessel_and_derivatives(x, zeros, 2 if need_x else 1)
        gg64 = gg.double()[:, None, None]
        nz = (norm * zeros).double()
        dg = (gg64 * dj * nz).to(g.dtype) if need_g else None
        dx = (gg64 * g.double() * d2j * (nz * zeros.double())).sum((1, 2)).to(x.dtype) if need_x else None
        return dg, dx, None, None


class RadialBasis(nn.Module):
    """rbf[e, n] = u(d/c) sin(freq_n d/c), freq initialised to n*pi and trainable (as DimeNet)."""

    def __init__(self, num_radial: int, cutoff: float, exponent: int) -> None:
        super().__init__()
        self.cutoff, self.exponent = cutoff, exponent
        self.freq = nn.Parameter(torch.arange(1, num_radial + 1, dtype=torch.float32) * math.pi)

    def forward(self, x: Tensor, env: Tensor) -> Tensor:
        return env[:, None] * torch.sin(self.freq * x[:, None])


class SphericalBasis(nn.Module):
    """Per-edge radial part u(x) N_ln j_l(z_ln x) [E, S, R] and per-triplet angular part
    Y_l^0 [T, S]; their product is DimeNet's 2D spherical basis."""

    def __init__(self, num_spherical: int, num_radial: int) -> None:
        super().__init__()
        z = bessel_zeros(num_spherical, num_radial).astype(np.float32)  # fp32 roots, as the reference
        from scipy.special import spherical_jn as jn

        norm = 1.0 / np.sqrt(0.5 * jn(np.arange(1, num_spherical + 1)[:, None], z.astype(np.float64)) ** 2)
        self.register_buffer("zeros", torch.from_numpy(z), persistent=False)
        self.register_buffer("norm", torch.from_numpy(norm.astype(np.float32)), persistent=False)
        self.num_spherical = num_spherical

    def radial(self, x: Tensor, env: Tensor) -> Tensor:
        # [E, S, R]: the Bessel part with hand-written derivatives (float64 inside), times the envelope
        return env[:, None, None] * _BesselRadial.apply(x, self.zeros, self.norm)

    def angular(self, cos: Tensor) -> Tensor:
        polys = [torch.ones_like(cos), cos]
        for l in range(1, self.num_spherical - 1):
            polys.append(((2 * l + 1) * cos * polys[l] - l * polys[l - 1]) / (l + 1))
        pref = [math.sqrt((2 * l + 1) / (4 * math.pi)) for l in range(self.num_spherical)]
        return torch.stack([p * f for p, f in zip(polys[: self.num_spherical], pref)], dim=1)
