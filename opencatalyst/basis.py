"""DimeNet radial (Bessel) and spherical (Bessel x Legendre) bases, evaluated with recurrences.

The spherical Bessel roots and normalisers are computed once with scipy; evaluation is a few
vectorised torch ops (no symbolic per-function lambdas). Angles enter only through
cos(angle), so the Legendre polynomials need no atan2/cos round trip.

The spherical basis's radial part N_ln j_l(z_ln x) and its first two derivatives in x are written out
(:class:`_BesselRadial`): j_l' = j_{l-1} - (l+1)/u j_l and, from Bessel's equation,
j_l'' = -2/u j_l' + (l(l+1)/u^2 - 1) j_l, with u = z_ln x. Training on forces differentiates the basis
twice; through autograd the upward recurrence became about a thousand small ops per step, here it is
one recurrence over all orders at once per pass. On the CPU the radial part times the envelope and its
first two derivatives are one C pass per step (``radial_kernels.c``, built by
:mod:`hpcbench.common.ckernel`), whose results both derivative passes then read (:class:`_RadialC`); the
torch ops run where it cannot be built and on accelerators.
"""
from __future__ import annotations

import ctypes
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from hpcbench.common import ckernel

KERNEL_SOURCE = Path(__file__).with_name("radial_kernels.c")
_SYMBOLS = ("sbf_radial_f64",)
#: edges per thread below which the C pass runs on one thread
MIN_EDGES_PER_THREAD = 4096


def prepare() -> str:
    """Build or load the C pass now (the workload's ``on_device``); "" when it will run, else why not."""
    return "" if ckernel.load(KERNEL_SOURCE, _SYMBOLS) is not None else ckernel.reason(KERNEL_SOURCE)


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


def _radial_lib(x: Tensor) -> ctypes.CDLL | None:
    """The C pass's library where it applies to ``x`` (a CPU float32/float64 vector), else None."""
    if x.device.type != "cpu" or x.dtype not in (torch.float32, torch.float64) or x.dim() != 1:
        return None
    return ckernel.load(KERNEL_SOURCE, _SYMBOLS)


def _c_radial(x: Tensor, zeros: Tensor, norm: Tensor, exponent: int) -> tuple[Tensor, Tensor, Tensor] | None:
    """(f, f', f'') [E, L, R] in float64 by the C pass (radial_kernels.c), or None where it does not apply."""
    lib = _radial_lib(x)
    if lib is None:
        return None
    x64 = x.detach().double().contiguous()
    z64, n64 = zeros.double().contiguous(), norm.double().contiguous()
    out = [torch.empty(x.numel(), *zeros.shape, dtype=torch.float64) for _ in range(3)]

    def work(_: int, s: int, e: int) -> None:
        lib.sbf_radial_f64(ctypes.c_int64(e - s), ctypes.c_int64(zeros.size(0)), ctypes.c_int64(zeros.size(1)),
                           ctypes.c_int64(exponent + 1), ckernel.address(x64, s), ckernel.address(z64),
                           ckernel.address(n64), *(ckernel.address(t, s) for t in out))

    ckernel.run_spans(ckernel.spans(x.numel(), torch.get_num_threads(), MIN_EDGES_PER_THREAD), work)
    return out[0], out[1], out[2]


class _RadialC(torch.autograd.Function):
    """u(x) N j_l(z x) [E, L, R] from the C pass, which also gives the first and second derivatives: both
    derivative passes (:class:`_RadialCGrad`) read them instead of evaluating the basis again."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, zeros: Tensor, norm: Tensor, exponent: int) -> Tensor:
        done = _c_radial(x, zeros, norm, exponent)
        if done is None:
            raise RuntimeError("the radial basis's C pass was chosen but does not apply (a changed input?)")
        f, ctx.f1, ctx.f2 = done  # float64, made here: not on the graph, and the output is never an input
        ctx.save_for_backward(x)
        return f.to(x.dtype)

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor | None, None, None, None]:
        (x,) = ctx.saved_tensors
        return _RadialCGrad.apply(g, x, ctx.f1, ctx.f2), None, None, None


class _RadialCGrad(torch.autograd.Function):
    """sum over (l, n) of g * f'(x): [E]."""

    @staticmethod
    def forward(ctx: Any, g: Tensor, x: Tensor, f1: Tensor, f2: Tensor) -> Tensor:
        ctx.save_for_backward(g, x)
        ctx.f1, ctx.f2 = f1, f2
        return (g.double() * f1).sum((1, 2)).to(x.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, gg: Tensor) -> tuple[Tensor | None, Tensor | None, None, None]:
        g, x = ctx.saved_tensors
        need_g, need_x = ctx.needs_input_grad[:2]
        gg64 = gg.double()[:, None, None]
        dg = (gg64 * ctx.f1).to(g.dtype) if need_g else None
        dx = (gg64 * g.double() * ctx.f2).sum((1, 2)).to(x.dtype) if need_x else None
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

    def __init__(self, num_spherical: int, num_radial: int, envelope_exponent: int = 5) -> None:
        super().__init__()
        self.envelope_exponent = envelope_exponent
        z = bessel_zeros(num_spherical, num_radial).astype(np.float32)  # fp32 roots, as the reference
        from scipy.special import spherical_jn as jn

        norm = 1.0 / np.sqrt(0.5 * jn(np.arange(1, num_spherical + 1)[:, None], z.astype(np.float64)) ** 2)
        self.register_buffer("zeros", torch.from_numpy(z), persistent=False)
        self.register_buffer("norm", torch.from_numpy(norm.astype(np.float32)), persistent=False)
        self.num_spherical = num_spherical

    def radial(self, x: Tensor) -> Tensor:
        """[E, S, R]: the envelope u(x) times the Bessel part, differentiable twice in x (float64 inside):
        one C pass on the CPU, else the Bessel part with hand-written derivatives times torch's envelope."""
        if _radial_lib(x) is not None:
            return _RadialC.apply(x, self.zeros, self.norm, self.envelope_exponent)
        return envelope(x, self.envelope_exponent)[:, None, None] * _BesselRadial.apply(x, self.zeros, self.norm)

    def angular(self, cos: Tensor) -> Tensor:
        polys = [torch.ones_like(cos), cos]
        for l in range(1, self.num_spherical - 1):
            polys.append(((2 * l + 1) * cos * polys[l] - l * polys[l - 1]) / (l + 1))
        pref = [math.sqrt((2 * l + 1) / (4 * math.pi)) for l in range(self.num_spherical)]
        return torch.stack([p * f for p, f in zip(polys[: self.num_spherical], pref)], dim=1)
