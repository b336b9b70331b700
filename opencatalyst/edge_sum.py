"""DimeNet++'s edge-to-atom sum of the output blocks, P[dst[e]] += x[e] * r[e], with hand-written first and
second derivatives.

Each output block weights every edge state ``x`` [E, C] by its radial projection ``r`` [E, C] and sums
the products onto the edges' target atoms ``dst``. Training on forces differentiates this twice, and
through autograd it costs nine [E, C] products, two gathers of the per-atom gradient to the edges and
the gradient sums between them per block. Here each order is one pass over the edges (C loops on the CPU,
``edge_sum_kernels.c``, built by :mod:`hpcbench.common.ckernel`), and the per-atom rows, a few hundred,
stay in cache while the edge rows stream:

* value: P = scatter_dst(x * r)
* first derivative, for the per-atom gradient gP: gx = gP[dst] * r, gr = gP[dst] * x
* second derivative, for the gradients hx, hr of (gx, gr): dgP = scatter_dst(hx * r + hr * x),
  dx = hr * gP[dst], dr = hx * gP[dst]

Where the C loops do not apply (accelerators, other dtypes, no compiler) the plain autograd expression
runs. Third derivatives are not supported.
"""
from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.autograd import Function
from torch.autograd.function import once_differentiable

from hpcbench.common import ckernel
from hpcbench.common.ckernel import address as _ptr
from hpcbench.common.ckernel import private_targets as _private
from hpcbench.common.ckernel import row_strided as _rows
from hpcbench.common.ckernel import sum_targets as _sum_into

KERNEL_SOURCE = Path(__file__).with_name("edge_sum_kernels.c")
_SUFFIX = {torch.float32: "f32", torch.float64: "f64"}
_SYMBOLS = tuple(f"edge_sum_{n}_{s}" for n in ("fwd", "grad", "gradgrad") for s in _SUFFIX.values())
#: edges per thread below which a pass runs on one thread
MIN_EDGES_PER_THREAD = 8192


def prepare() -> str:
    """Build or load the C loops now (the workload's ``on_device``); "" when they will run, else why not."""
    return "" if ckernel.load(KERNEL_SOURCE, _SYMBOLS) is not None else ckernel.reason(KERNEL_SOURCE)


def _kernels(*tensors: Tensor) -> ctypes.CDLL | None:
    first = tensors[0]
    if first.dtype not in _SUFFIX or any(t.device.type != "cpu" or t.dtype != first.dtype for t in tensors):
        return None
    return ckernel.load(KERNEL_SOURCE, _SYMBOLS)


def _run(lib: ctypes.CDLL, name: str, x: Tensor, r: Tensor, args: list[tuple[Tensor | None, bool]],
         accumulated: Tensor | None, strided: tuple[Tensor | None, ...] = ()) -> None:
    """One pass over the edges cut into thread spans: ``x``, ``r`` (and ``strided``, the second order's
    hx, hr) as ``ckernel.row_strided`` gives them, their row strides passed on; then ``args`` (tensor, is
    it per edge); per-edge tensors are offset to each span; ``accumulated`` (a per-atom output) gets a
    private twin per span."""
    fn = getattr(lib, f"edge_sum_{name}_{_SUFFIX[x.dtype]}")
    spans = ckernel.spans(x.size(0), torch.get_num_threads(), MIN_EDGES_PER_THREAD)
    targets = _private(accumulated, len(spans))
    dims = [ctypes.c_int64(n) for n in (x.size(1), x.stride(0), r.stride(0),
                                        *(x.size(1) if h is None else h.stride(0) for h in strided))]

    def work(i: int, s: int, e: int) -> None:
        ptrs = [_ptr(targets[i]) if accumulated is not None and t is accumulated else _ptr(t, s if per_edge else 0)
                for t, per_edge in args]
        if name == "fwd":  # (x, r, dst, P)
            fn(ctypes.c_int64(e - s), *dims, _ptr(x, s), _ptr(r, s), *ptrs)
        else:  # (gP, x, r, dst, ...)
            fn(ctypes.c_int64(e - s), *dims, ptrs[0], _ptr(x, s), _ptr(r, s), *ptrs[1:])

    ckernel.run_spans(spans, work)
    if accumulated is not None:
        _sum_into(targets)


class _EdgeSum(Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, r: Tensor, dst: Tensor, atoms: int, lib: ctypes.CDLL) -> Tensor:
        out = x.new_zeros(atoms, x.size(1))
        _run(lib, "fwd", _rows(x), _rows(r), [(dst, True), (out, False)], out)
        ctx.save_for_backward(x, r, dst)
        ctx.lib = lib
        return out

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor | None, ...]:
        x, r, dst = ctx.saved_tensors
        gx, gr = _EdgeSumGrad.apply(g.contiguous(), x, r, dst, ctx.lib)
        need = ctx.needs_input_grad
        return gx if need[0] else None, gr if need[1] else None, None, None, None


class _EdgeSumGrad(Function):
    """(gx, gr) = (gP[dst] * r, gP[dst] * x)."""

    @staticmethod
    def forward(ctx: Any, g: Tensor, x: Tensor, r: Tensor, dst: Tensor, lib: ctypes.CDLL) -> tuple[Tensor, Tensor]:
        ctx.set_materialize_grads(False)  # a gradient no loss reaches comes back None, not zeros to multiply by
        gx, gr = x.new_empty(x.shape), r.new_empty(r.shape)
        _run(lib, "grad", _rows(x), _rows(r), [(g, False), (dst, True), (gx, True), (gr, True)], None)
        ctx.save_for_backward(g, x, r, dst)
        ctx.lib = lib
        return gx, gr

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, hx: Tensor | None, hr: Tensor | None) -> tuple[Tensor | None, ...]:
        g, x, r, dst = ctx.saved_tensors
        need_g, need_x, need_r = ctx.needs_input_grad[:3]
        if hx is None and hr is None:
            return None, None, None, None, None
        hx_, hr_ = (None if h is None else _rows(h) for h in (hx, hr))
        dg = g.new_zeros(g.shape) if need_g else None
        dx = x.new_empty(x.shape) if need_x and hr is not None else None
        dr = r.new_empty(r.shape) if need_r and hx is not None else None
        _run(ctx.lib, "gradgrad", _rows(x), _rows(r),
             [(g, False), (dst, True), (hx_, True), (hr_, True), (dg, False), (dx, True), (dr, True)], dg,
             strided=(hx_, hr_))
        return dg, dx, dr, None, None


def edge_product_sum(x: Tensor, r: Tensor, dst: Tensor, atoms: int) -> Tensor:
    """[atoms, C]: row dst[e] sums x[e] * r[e] over the edges e (x, r [E, C]; dst [E] atom indices)."""
    if x.dim() != 2 or x.shape != r.shape:
        raise ValueError(f"edge_product_sum: needs x and r of one shape [E, C]; got {tuple(x.shape)} and {tuple(r.shape)}")
    if dst.dim() != 1 or dst.numel() != x.size(0) or dst.dtype.is_floating_point or dst.dtype == torch.bool:
        raise ValueError(f"edge_product_sum: dst must be a 1-D vector of {x.size(0)} atom indices, got "
                         f"{dst.dtype} of shape {tuple(dst.shape)}")
    lib = _kernels(x, r) if dst.device.type == "cpu" else None
    if lib is None:
        return x.new_zeros(atoms, x.size(1)).index_add_(0, dst, x * r)
    dst = dst.to(torch.int64).contiguous()
    if dst.numel() and (int(dst.min()) < 0 or int(dst.max()) >= atoms):
        raise IndexError(f"edge_product_sum: dst holds atom indices outside [0, {atoms}) "
                         f"(min {int(dst.min())}, max {int(dst.max())})")
    return _EdgeSum.apply(x, r, dst, atoms, lib)
