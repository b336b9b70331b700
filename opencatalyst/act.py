"""SiLU with a hand-written second derivative, for training on forces (create_graph backward).

The force pass differentiates every SiLU once with a graph, and the training backward then
differentiates that gradient again. Autograd's double backward of silu_backward builds it from a
dozen separate elementwise tensors; here the first derivative is one fused ``silu_backward`` kernel
and the second is written out once (s(1-s)(2 + x(1-2s)) with s = sigmoid(x)), in six passes. Third
derivatives are not supported (``once_differentiable``); the maths is the same as ``F.silu``.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.autograd import Function
from torch.autograd.function import once_differentiable
from torch.nn import functional as F


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
        dg = torch.ops.aten.silu_backward(gout, x) if ctx.needs_input_grad[0] else None
        dx = None
        if ctx.needs_input_grad[1]:
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
