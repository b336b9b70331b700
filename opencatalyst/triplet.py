"""DimeNet++'s triplet message, y[ji] += a[kj] * (b @ w), with hand-written first and second derivatives.

The training step differentiates the energy twice (forces = -dE/dpos with a graph, then the loss on
the forces), so plain autograd materialises a dozen [triplets x channels] tensors per interaction
block (gathers, the ``b @ w`` expansion, products, their gradients) and streams each through main
memory. Here the forward, its gradient and that gradient's gradient are each ONE pass over the
triplets in chunks of a few thousand rows: the gathered rows, the expanded basis and the products
of a chunk stay in cache, and only the per-edge [E, C] results, the small [T, K] basis gradients
and the [K, C] weight gradients are written. Every gathered or expanded tensor is recomputed from
the saved inputs (``a`` [E, C], ``b`` [T, K], ``w`` [K, C] and the two index vectors) rather than kept.

Shapes: ``a`` [E, C] per-edge states, ``b`` [T, K] per-triplet basis, ``w`` [K, C], ``idx_kj`` and
``idx_ji`` [T] edge indices; the result is [E, C]. The maths are exactly
``zeros(E, C).index_add_(0, idx_ji, a[idx_kj] * (b @ w))``; third derivatives are not supported.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.autograd import Function
from torch.autograd.function import once_differentiable

#: triplets per chunk on the CPU: [chunk, C] float32 temporaries of 0.25-0.5 MiB (C = 32-64) stay in
#: cache; 2048 was the fastest full-width step of 1024/2048/4096/8192 (2.07 vs 2.09-2.13 s CPU)
CPU_CHUNK = 2048


def _spans(n: int, device: torch.device) -> list[tuple[int, int]]:
    """Row ranges of the chunks (one chunk on accelerators: there the temporaries are not the cost)."""
    if device.type != "cpu" or n <= CPU_CHUNK:
        return [(0, n)]
    return [(s, min(s + CPU_CHUNK, n)) for s in range(0, n, CPU_CHUNK)]


class _Message(Function):
    """y = scatter_ji(a[kj] * (b @ w))."""

    @staticmethod
    def forward(ctx: Any, a: Tensor, b: Tensor, w: Tensor, idx_kj: Tensor, idx_ji: Tensor) -> Tensor:
        y = a.new_zeros(a.shape)
        for s, e in _spans(idx_kj.numel(), a.device):
            m = a.index_select(0, idx_kj[s:e]).mul_(b[s:e] @ w)
            y.index_add_(0, idx_ji[s:e], m)
        ctx.save_for_backward(a, b, w, idx_kj, idx_ji)
        return y

    @staticmethod
    def backward(ctx: Any, gy: Tensor) -> tuple[Tensor | None, ...]:
        a, b, w, idx_kj, idx_ji = ctx.saved_tensors
        ga, gb, gw = _MessageGrad.apply(gy.contiguous(), a, b, w, idx_kj, idx_ji)
        need = ctx.needs_input_grad
        return (ga if need[0] else None, gb if need[1] else None, gw if need[2] else None, None, None)


class _MessageGrad(Function):
    """Gradients of :class:`_Message` for the output gradient ``gy``:
    ga = scatter_kj(gy[ji] * (b @ w)), gb = (gy[ji] * a[kj]) @ w^T, gw = b^T (gy[ji] * a[kj])."""

    @staticmethod
    def forward(ctx: Any, gy: Tensor, a: Tensor, b: Tensor, w: Tensor, idx_kj: Tensor,
                idx_ji: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        ga = a.new_zeros(a.shape)
        gb_t = b.new_empty(b.shape[::-1])  # [K, T]: w @ u^T is the fast layout for K << C on CPU
        gw = w.new_zeros(w.shape)
        for s, e in _spans(idx_kj.numel(), a.device):
            kj, ji, bc = idx_kj[s:e], idx_ji[s:e], b[s:e]
            g = gy.index_select(0, ji)
            ga.index_add_(0, kj, (bc @ w).mul_(g))
            u = g.mul_(a.index_select(0, kj))
            gb_t[:, s:e] = w @ u.t()
            gw.addmm_(bc.t(), u)
        ctx.save_for_backward(gy, a, b, w, idx_kj, idx_ji)
        return ga, gb_t.t(), gw

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, gga: Tensor | None, ggb: Tensor | None,
                 ggw: Tensor | None) -> tuple[Tensor | None, ...]:
        gy, a, b, w, idx_kj, idx_ji = ctx.saved_tensors
        need_gy, need_a, need_b, need_w = ctx.needs_input_grad[:4]
        dgy = gy.new_zeros(gy.shape) if need_gy else None
        da = a.new_zeros(a.shape) if need_a else None
        db_t = b.new_zeros(b.shape[::-1]) if need_b else None  # [K, T], as gb in forward
        dw = w.new_zeros(w.shape) if need_w else None
        db = db_t.t() if db_t is not None else None
        if gga is None and ggb is None and ggw is None:
            return dgy, da, db, dw, None, None
        for s, e in _spans(idx_kj.numel(), a.device):
            kj, ji, bc = idx_kj[s:e], idx_ji[s:e], b[s:e]
            g = gy.index_select(0, ji)
            x = a.index_select(0, kj)
            # r = d(loss)/d(u) with u = g * x: from gb = u w^T and gw = b^T u
            r = None
            if ggb is not None:
                r = ggb[s:e] @ w
            if ggw is not None:
                r = bc @ ggw if r is None else r.addmm_(bc, ggw)
            v = gga.index_select(0, kj) if gga is not None else None  # d(loss)/d(ga) at kj
            if dgy is not None:
                acc = None
                if v is not None:
                    acc = (bc @ w).mul_(v)
                if r is not None:
                    acc = r * x if acc is None else acc.addcmul_(r, x)
                if acc is not None:
                    dgy.index_add_(0, ji, acc)
            if da is not None and r is not None:
                da.index_add_(0, kj, r * g)
            if db_t is None and dw is None:
                continue
            p = g * v if v is not None else None
            u = g.mul_(x) if ggw is not None or ggb is not None else None
            if db_t is not None:
                if p is not None:
                    db_t[:, s:e] += w @ p.t()
                if ggw is not None:
                    db_t[:, s:e] += ggw @ u.t()
            if dw is not None:
                if p is not None:
                    dw.addmm_(bc.t(), p)
                if ggb is not None:
                    dw.addmm_(ggb[s:e].t(), u)
        return dgy, da, db, dw, None, None


def triplet_message(a: Tensor, b: Tensor, w: Tensor, idx_kj: Tensor, idx_ji: Tensor) -> Tensor:
    """[E, C]: for every triplet t, row idx_ji[t] += a[idx_kj[t]] * (b[t] @ w)."""
    return _Message.apply(a, b, w, idx_kj, idx_ji)

