"""DimeNet radial (Bessel) and spherical (Bessel x Legendre) bases, evaluated with recurrences.

The spherical Bessel roots and normalisers are computed once with scipy; evaluation is a few
vectorised torch ops per order (no symbolic per-function lambdas). Angles enter only through
cos(angle), so the Legendre polynomials need no atan2/cos round trip.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor, nn


def envelope(x: Tensor, exponent: int) -> Tensor:
    """Smooth cutoff polynomial u(x) of DimeNet, zero for x >= 1 (x = distance / cutoff)."""
    p = exponent + 1
    a, b, c = -(p + 1) * (p + 2) / 2, p * (p + 2), -p * (p + 1) / 2
    xp = x.pow(p - 1)
    return (1.0 / x + a * xp + b * xp * x + c * xp * x * x) * (x < 1.0).to(x.dtype)


def spherical_jn(order: int, x: Tensor) -> Tensor:
    """Spherical Bessel function of the first kind j_order(x) by upward recurrence."""
    s, c = torch.sin(x), torch.cos(x)
    j0 = s / x
    if order == 0:
        return j0
    j1 = s / (x * x) - c / x
    for n in range(1, order):
        j0, j1 = j1, (2 * n + 1) / x * j1 - j0
    return j1


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
        # the upward recurrence cancels digits at small arguments: evaluate it in float64 (E rows only)
        x64 = x.double()[:, None]
        parts = [spherical_jn(l, self.zeros[l].double() * x64) for l in range(self.num_spherical)]
        return env[:, None, None] * torch.stack(parts, dim=1).to(x.dtype) * self.norm

    def angular(self, cos: Tensor) -> Tensor:
        polys = [torch.ones_like(cos), cos]
        for l in range(1, self.num_spherical - 1):
            polys.append(((2 * l + 1) * cos * polys[l] - l * polys[l - 1]) / (l + 1))
        pref = [math.sqrt((2 * l + 1) / (4 * math.pi)) for l in range(self.num_spherical)]
        return torch.stack([p * f for p, f in zip(polys[: self.num_spherical], pref)], dim=1)
