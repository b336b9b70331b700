"""Building blocks shared by every OpenFold module: initialised linear layers, fp32 layer norm, gated
multi-head attention (optionally chunked), shared-mask dropout.

Initialisations follow the AlphaFold2 supplement 1.11.4 as the reference applies them: LeCun/He truncated
normal, Glorot uniform, zero "final" layers and gating layers with bias 1. bf16 safety: layer norms and
attention softmaxes compute in float32 and return the input's dtype (the reference runs them under
autocast, which does the same).
"""
from __future__ import annotations

import math
from typing import Literal, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

Init = Literal["default", "relu", "glorot", "gating", "normal", "final"]
#: std of a standard normal truncated to [-2, 2]
_TRUNC_STD = 0.87962566103423978


def _trunc_normal_(w: torch.Tensor, scale: float) -> None:
    fan_in = w.shape[1]
    std = math.sqrt(scale / max(1, fan_in)) / _TRUNC_STD
    nn.init.trunc_normal_(w, mean=0.0, std=std, a=-2.0 * std, b=2.0 * std)


class Linear(nn.Linear):
    """``nn.Linear`` with the AlphaFold initialisations (biases start at 0, gating biases at 1)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, init: Init = "default",
                 device: torch.device | str | None = None) -> None:
        super().__init__(in_features, out_features, bias=bias, device=device)
        self.init = init
        if self.weight.device.type != "meta":
            self.reset_parameters_af()

    def reset_parameters(self) -> None:  # called by nn.Linear.__init__; ours runs after
        pass

    @torch.no_grad()
    def reset_parameters_af(self) -> None:
        if self.bias is not None:
            self.bias.fill_(1.0 if self.init == "gating" else 0.0)
        if self.init == "default":
            _trunc_normal_(self.weight, 1.0)
        elif self.init == "relu":
            _trunc_normal_(self.weight, 2.0)
        elif self.init == "glorot":
            nn.init.xavier_uniform_(self.weight, gain=1.0)
        elif self.init in ("gating", "final"):
            self.weight.zero_()
        elif self.init == "normal":
            nn.init.kaiming_normal_(self.weight, nonlinearity="linear")
        else:
            raise ValueError(f"Linear init {self.init!r}: expected one of default, relu, glorot, gating, "
                             "normal, final")


class LayerNorm(nn.Module):
    """Layer norm over the last dimension, computed in float32, returned in the input's dtype."""

    def __init__(self, channels: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(channels))
        self.bias = nn.Parameter(torch.zeros(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device_type=x.device.type, enabled=False):
            y = F.layer_norm(x.float(), (x.shape[-1],), self.weight.float(), self.bias.float(), self.eps)
        return y.to(x.dtype)


def softmax32(a: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Softmax in float32, returned in ``a``'s dtype."""
    return torch.softmax(a.float(), dim=dim).to(a.dtype)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask_bias: torch.Tensor,
              bias: Optional[torch.Tensor]) -> torch.Tensor:
    """softmax(q k^T + mask_bias + bias) v over [*, H, Q, C] x [*, H, K, C] (q already scaled)."""
    a = torch.matmul(q, k.transpose(-1, -2)) + mask_bias
    if bias is not None:
        a = a + bias
    return torch.matmul(softmax32(a), v)


def attention_chunked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask_bias: torch.Tensor,
                      bias: Optional[torch.Tensor], chunk_size: Optional[int]) -> torch.Tensor:
    """:func:`attention`, evaluated in slices of ``chunk_size`` along dim 1 (the sub-batch: MSA rows,
    pair rows) so that the [*, H, Q, K] logits of only one slice live at a time."""
    n = q.shape[1]
    if chunk_size is None or chunk_size >= n:
        return attention(q, k, v, mask_bias, bias)
    out = []
    for i in range(0, n, chunk_size):
        sl = slice(i, i + chunk_size)
        mb = mask_bias[:, sl] if mask_bias.shape[1] == n else mask_bias
        b = bias[:, sl] if bias is not None and bias.shape[1] == n else bias
        out.append(attention(q[:, sl], k[:, sl], v[:, sl], mb, b))
    return torch.cat(out, dim=1)


class GatedSelfAttention(nn.Module):
    """Multi-head self-attention with a sigmoid gate (supplement Algorithms 7, 8, 13, 14).

    Parameter names are the reference's ``SelfAttentionWithGate``: linear_q/k/v (no bias), linear_g, linear_o.
    """

    def __init__(self, c_qkv: int, c_hidden: int, num_heads: int, inf: float,
                 chunk_size: Optional[int]) -> None:
        super().__init__()
        self.c_hidden, self.num_heads, self.inf, self.chunk_size = c_hidden, num_heads, inf, chunk_size
        hc = c_hidden * num_heads
        self.linear_q = Linear(c_qkv, hc, bias=False, init="glorot")
        self.linear_k = Linear(c_qkv, hc, bias=False, init="glorot")
        self.linear_v = Linear(c_qkv, hc, bias=False, init="glorot")
        self.linear_o = Linear(hc, c_qkv, bias=True, init="final")
        self.linear_g = Linear(c_qkv, hc, bias=True, init="gating")

    def _heads(self, x: torch.Tensor) -> torch.Tensor:  # [*, S, H*C] -> [*, H, S, C]
        return x.view(x.shape[:-1] + (self.num_heads, self.c_hidden)).transpose(-2, -3)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        """x [*, S, c]; mask broadcastable to [*, H, S, S] (1 keep, 0 drop); bias likewise."""
        q = self._heads(self.linear_q(x)) / math.sqrt(self.c_hidden)
        k, v = self._heads(self.linear_k(x)), self._heads(self.linear_v(x))
        mask_bias = (mask.to(q.dtype) - 1.0) * self.inf
        o = attention_chunked(q, k, v, mask_bias, bias, self.chunk_size).transpose(-2, -3)
        g = torch.sigmoid(self.linear_g(x)).view(o.shape)
        return self.linear_o((o * g).reshape(o.shape[:-2] + (-1,)))


class SharedDropout(nn.Module):
    """Dropout whose mask is shared along one dimension (rows: dim -3, columns: dim -2; supplement 1.11.6)."""

    def __init__(self, p: float, share_dim: int) -> None:
        super().__init__()
        self.p, self.share_dim = p, share_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        shape = list(x.shape)
        shape[self.share_dim] = 1
        return x * F.dropout(x.new_ones(shape), p=self.p, training=True)


def DropoutRowwise(p: float) -> SharedDropout:  # noqa: N802 - the reference's names
    return SharedDropout(p, -3)


def DropoutColumnwise(p: float) -> SharedDropout:  # noqa: N802
    return SharedDropout(p, -2)
