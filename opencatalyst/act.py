"""SiLU with a hand-written second derivative, for training on forces (create_graph backward).

The force pass differentiates every SiLU once with a graph, and the training backward then
differentiates that gradient again. Autograd's double backward of silu_backward builds it from a
dozen separate elementwise tensors; here the first derivative is one fused ``silu_backward`` kernel
and the second is written out once (s(1-s)(2 + x(1-2s)) with s = sigmoid(x)), in six passes. Third
derivatives are not supported (``once_differentiable``); the maths is the same as ``F.silu``.
On the CPU the second derivative is one C pass instead (``silu_kernels.c``, built by
:mod:`hpcbench.common.ckernel`; the torch ops run where it cannot be built).
"""
from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.autograd import Function
from torch.autograd.function import once_differentiable
from torch.nn import functional as F

from hpcbench.common import ckernel

KERNEL_SOURCE = Path(__file__).with_name("silu_kernels.c")
_SUFFIX = {torch.float32: "f32", torch.float64: "f64"}
#: elements per thread below which the C pass runs on one thread
MIN_ELEMENTS_PER_THREAD = 1 << 18
_SYMBOLS = tuple(f"silu_gradgrad_{s}" for s in _SUFFIX.values())


def prepare() -> str:
    """Build or load the C pass now; "" when it will run, else why not."""
    return "" if ckernel.load(KERNEL_SOURCE, _SYMBOLS) is not None else ckernel.reason(KERNEL_SOURCE)


def _c_gradgrad(gout: Tensor, g: Tensor, x: Tensor, need_g: bool, need_x: bool) -> tuple[Tensor | None, ...] | None:
    """(dg, dx) by the C pass, or None where it does not apply (not the CPU, other dtypes, no kernel)."""
    if x.device.type != "cpu" or x.dtype not in _SUFFIX or any(
            t.device.type != "cpu" or t.dtype != x.dtype or t.shape != x.shape for t in (gout, g)):
        return None
    lib = ckernel.load(KERNEL_SOURCE, _SYMBOLS)
    if lib is None:
        return None
    gout, g, x = gout.contiguous(), g.contiguous(), x.contiguous()
    dg = torch.empty_like(x) if need_g else None
    dx = torch.empty_like(x) if need_x else None
    fn = getattr(lib, f"silu_gradgrad_{_SUFFIX[x.dtype]}")
    flat = [None if t is None else t.view(-1) for t in (gout, g, x, dg, dx)]  # element i = row i

    def work(_: int, s: int, e: int) -> None:
        fn(ctypes.c_int64(e - s), *(ckernel.address(t, s) for t in flat))

    ckernel.run_spans(ckernel.spans(x.numel(), torch.get_num_threads(), MIN_ELEMENTS_PER_THREAD), work)
    return dg, dx


class _SiluGrad(Function):
    """g * silu'(x), differentiable once more in both g and x."""

    @staticmethod
    def forward(ctx: Any, g: Tensor, x: Tensor) -> Tensor:
        ctx.save_for_backward(g, x)
        return torch.ops.aten.silu_backward(g, x)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, gout: Tensor) -> tuple[Tensor | None, Tensor | None]:
        g, x = ctx.saved_tensors
        need_g, need_x = ctx.needs_input_grad[:2]
        if need_g or need_x:
            done = _c_gradgrad(gout, g, x, need_g, need_x)
            if done is not None:
                return done
        dg = torch.ops.aten.silu_backward(gout, x) if need_g else None
        dx = None
        if need_x:
            # silu''(x) = s(1-s)(2 + x(1-2s)), s = sigmoid(x): six passes over [N, C] (s(1-s)q is
            # aten's one-kernel sigmoid_backward)
            s = torch.sigmoid(x)
            q = torch.addcmul(x, x, s, value=-2).add_(2).mul_(gout).mul_(g)
            dx = torch.ops.aten.sigmoid_backward(q, s)
        return dg, dx


class _Silu(Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        ctx.save_for_backward(x)
        return F.silu(x)

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> Tensor:
        (x,) = ctx.saved_tensors
        return _SiluGrad.apply(g, x)


def silu(x: Tensor) -> Tensor:
    """x * sigmoid(x); first and second derivatives hand-written (see module doc)."""
    return _Silu.apply(x)
