"""Evoformer (supplement 1.6) and extra-MSA stack (1.7.2): MSA row attention with pair bias, MSA column
(or global column) attention, transitions, outer product mean, triangle multiplications and triangle
attentions. Module and parameter names are the reference's (``evoformer_stack.blocks.N.msa_att_row.mha.
linear_q.weight``, ``...core.tri_mul_out.linear_a_p.weight``), so that its state dict loads as it is.

Tensors carry a leading batch dimension: m [B, S, R, c_m], z [B, R, R, c_z], masks [B, S, R] / [B, R, R].
Blocks run under activation checkpointing when the caller asks (training, the last recycling iteration).
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from .config import EvoformerConfig, TemplateConfig
from .primitives import (DropoutColumnwise, DropoutRowwise, GatedSelfAttention, LayerNorm, Linear,
                         softmax32)


class MSARowAttentionWithPairBias(nn.Module):
    def __init__(self, c_m: int, c_z: int, c_hidden: int, num_heads: int, inf: float,
                 chunk_size: Optional[int]) -> None:
        super().__init__()
        self.layer_norm_m = LayerNorm(c_m)
        self.layer_norm_z = LayerNorm(c_z)
        self.linear_z = Linear(c_z, num_heads, bias=False, init="normal")
        self.mha = GatedSelfAttention(c_m, c_hidden, num_heads, inf, chunk_size)

    def forward(self, m: torch.Tensor, z: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        bias = self.linear_z(self.layer_norm_z(z)).movedim(-1, -3).unsqueeze(-4)  # [B, 1, H, R, R]
        return self.mha(self.layer_norm_m(m), mask.unsqueeze(-2).unsqueeze(-3), bias)


class MSAColumnAttention(nn.Module):
    def __init__(self, c_m: int, c_hidden: int, num_heads: int, inf: float,
                 chunk_size: Optional[int]) -> None:
        super().__init__()
        self.layer_norm_m = LayerNorm(c_m)
        self.mha = GatedSelfAttention(c_m, c_hidden, num_heads, inf, chunk_size)

    def forward(self, m: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        m = self.layer_norm_m(m.transpose(-2, -3))
        mask = mask.transpose(-1, -2).unsqueeze(-2).unsqueeze(-3)
        return self.mha(m, mask, None).transpose(-2, -3)


class GlobalAttention(nn.Module):
    """Global column attention of the extra-MSA stack (supplement Algorithm 19): one averaged query."""

    def __init__(self, c_e: int, c_hidden: int, num_heads: int, inf: float, eps: float,
                 chunk_size: Optional[int]) -> None:
        super().__init__()
        self.c_hidden, self.num_heads, self.inf, self.eps = c_hidden, num_heads, inf, eps
        self.chunk_size = chunk_size
        self.linear_q = Linear(c_e, c_hidden * num_heads, bias=False, init="glorot")
        self.linear_k = Linear(c_e, c_hidden, bias=False, init="glorot")
        self.linear_v = Linear(c_e, c_hidden, bias=False, init="glorot")
        self.linear_g = Linear(c_e, c_hidden * num_heads, bias=True, init="gating")
        self.linear_o = Linear(c_hidden * num_heads, c_e, bias=True, init="final")

    def _forward(self, m: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        # m [B, R, S, c]; mask [B, R, S]
        q = torch.sum(m * mask.unsqueeze(-1), dim=-2) / (torch.sum(mask, dim=-1, keepdim=True) + self.eps)
        q = self.linear_q(q) / math.sqrt(self.c_hidden)
        q = q.view(q.shape[:-1] + (self.num_heads, self.c_hidden))  # [B, R, H, C]
        k, v = self.linear_k(m), self.linear_v(m)  # [B, R, S, C]
        a = torch.matmul(q, k.transpose(-1, -2)) + ((mask - 1.0) * self.inf).unsqueeze(-2)
        o = torch.matmul(softmax32(a), v)  # [B, R, H, C]
        g = torch.sigmoid(self.linear_g(m)).view(m.shape[:-1] + (self.num_heads, self.c_hidden))
        o = o.unsqueeze(-3) * g  # [B, R, S, H, C]
        return self.linear_o(o.reshape(o.shape[:-2] + (-1,)))

    def forward(self, m: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        n = m.shape[1]
        if self.chunk_size is None or self.chunk_size >= n:
            return self._forward(m, mask)
        return torch.cat([self._forward(m[:, i:i + self.chunk_size], mask[:, i:i + self.chunk_size])
                          for i in range(0, n, self.chunk_size)], dim=1)


class MSAColumnGlobalAttention(nn.Module):
    def __init__(self, c_e: int, c_hidden: int, num_heads: int, inf: float, eps: float,
                 chunk_size: Optional[int]) -> None:
        super().__init__()
        self.layer_norm_m = LayerNorm(c_e)
        self.global_attention = GlobalAttention(c_e, c_hidden, num_heads, inf, eps, chunk_size)

    def forward(self, m: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        m = self.layer_norm_m(m.transpose(-2, -3))
        return self.global_attention(m, mask.transpose(-1, -2).to(m.dtype)).transpose(-2, -3)


class Transition(nn.Module):
    """MSA / pair transition: LayerNorm, Linear(n*c) + ReLU, Linear(c) (Algorithms 9, 15)."""

    def __init__(self, c: int, n: int) -> None:
        super().__init__()
        self.layer_norm = LayerNorm(c)
        self.linear_1 = Linear(c, n * c, bias=True, init="relu")
        self.linear_2 = Linear(n * c, c, bias=True, init="final")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(torch.relu(self.linear_1(self.layer_norm(x))))


class OuterProductMean(nn.Module):
    """Algorithm 10: mean over MSA rows of outer products of two projections, projected to c_z."""

    def __init__(self, c_m: int, c_z: int, c_hidden: int, eps: float, chunk_size: Optional[int]) -> None:
        super().__init__()
        self.c_hidden, self.eps, self.chunk_size = c_hidden, eps, chunk_size
        self.layer_norm = LayerNorm(c_m)
        self.linear_1 = Linear(c_m, c_hidden, bias=True, init="default")
        self.linear_2 = Linear(c_m, c_hidden, bias=True, init="default")
        self.linear_out = Linear(c_hidden * c_hidden, c_z, bias=True, init="final")

    def _outer(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        # a [B, Ri, S, C], b [B, Rj, S, C] -> [B, Ri, Rj, c_z]
        o = torch.einsum("...isc,...jsd->...ijcd", a, b)
        return self.linear_out(o.reshape(o.shape[:-2] + (-1,)))

    def forward(self, m: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        m = self.layer_norm(m)
        mk = mask.unsqueeze(-1).to(m.dtype)
        a = (self.linear_1(m) * mk).transpose(-2, -3)
        b = (self.linear_2(m) * mk).transpose(-2, -3)
        n = a.shape[1]
        if self.chunk_size is None or self.chunk_size >= n:
            outer = self._outer(a, b)
        else:
            outer = torch.cat([self._outer(a[:, i:i + self.chunk_size], b)
                               for i in range(0, n, self.chunk_size)], dim=1)
        norm = torch.einsum("...sic,...sjc->...ijc", mk, mk)
        return outer / (norm + self.eps)


class TriangleMultiplication(nn.Module):
    """Triangle multiplicative update, outgoing (Algorithm 11) or incoming (Algorithm 12) edges."""

    def __init__(self, c_z: int, c_hidden: int, outgoing: bool) -> None:
        super().__init__()
        self.outgoing = outgoing
        self.linear_a_p = Linear(c_z, c_hidden, bias=True, init="default")
        self.linear_a_g = Linear(c_z, c_hidden, bias=True, init="gating")
        self.linear_b_p = Linear(c_z, c_hidden, bias=True, init="default")
        self.linear_b_g = Linear(c_z, c_hidden, bias=True, init="gating")
        self.linear_g = Linear(c_z, c_z, bias=True, init="gating")
        self.linear_z = Linear(c_hidden, c_z, bias=True, init="final")
        self.layer_norm_in = LayerNorm(c_z)
        self.layer_norm_out = LayerNorm(c_hidden)

    def forward(self, z: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        z = self.layer_norm_in(z)
        mk = mask.unsqueeze(-1).to(z.dtype)
        a = torch.sigmoid(self.linear_a_g(z)) * mk * self.linear_a_p(z)
        b = torch.sigmoid(self.linear_b_g(z)) * mk * self.linear_b_p(z)
        a, b = a.movedim(-1, -3), b.movedim(-1, -3)  # [B, C, R, R]
        if self.outgoing:  # x_ij = sum_k a_ik b_jk
            x = torch.matmul(a, b.transpose(-1, -2))
        else:  # x_ij = sum_k a_ki b_kj
            x = torch.matmul(a.transpose(-1, -2), b)
        x = self.linear_z(self.layer_norm_out(x.movedim(-3, -1)))
        return x * torch.sigmoid(self.linear_g(z))


class TriangleAttention(nn.Module):
    """Triangle self-attention around the starting (Algorithm 13) or ending (Algorithm 14) node."""

    def __init__(self, c_z: int, c_hidden: int, num_heads: int, inf: float, chunk_size: Optional[int],
                 starting: bool) -> None:
        super().__init__()
        self.starting = starting
        self.layer_norm = LayerNorm(c_z)
        self.linear = Linear(c_z, num_heads, bias=False, init="normal")
        self.mha = GatedSelfAttention(c_z, c_hidden, num_heads, inf, chunk_size)

    def forward(self, z: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if not self.starting:
            z, mask = z.transpose(-2, -3), mask.transpose(-1, -2)
        z = self.layer_norm(z)
        bias = self.linear(z).movedim(-1, -3).unsqueeze(-4)  # [B, 1, H, R, R]
        out = self.mha(z, mask.unsqueeze(-2).unsqueeze(-3), bias)
        return out if self.starting else out.transpose(-2, -3)


class PairStackCore(nn.Module):
    """The pair half shared by Evoformer and extra-MSA blocks (the reference's ``EvoformerBlockCore``)."""

    def __init__(self, c_m: int, cfg: EvoformerConfig) -> None:
        super().__init__()
        c_z = cfg.c_z
        self.msa_transition = Transition(c_m, cfg.transition_n)
        self.outer_product_mean = OuterProductMean(c_m, c_z, cfg.c_hidden_opm, cfg.eps_opm,
                                                   cfg.chunk_size_opm)
        self.tri_mul_out = TriangleMultiplication(c_z, cfg.c_hidden_tri_mul, outgoing=True)
        self.tmo_dropout_rowwise = DropoutRowwise(cfg.pair_dropout)
        self.tri_mul_in = TriangleMultiplication(c_z, cfg.c_hidden_tri_mul, outgoing=False)
        self.tmi_dropout_rowwise = DropoutRowwise(cfg.pair_dropout)
        self.tri_att_start = TriangleAttention(c_z, cfg.c_hidden_tri_att, cfg.num_heads_tri, cfg.inf,
                                               cfg.chunk_size_tri_att, starting=True)
        self.tasn_dropout_rowwise = DropoutRowwise(cfg.pair_dropout)
        self.tri_att_end = TriangleAttention(c_z, cfg.c_hidden_tri_att, cfg.num_heads_tri, cfg.inf,
                                             cfg.chunk_size_tri_att, starting=False)
        self.taen_dropout_columnwise = DropoutColumnwise(cfg.pair_dropout)
        self.pair_transition = Transition(c_z, cfg.transition_n)

    def forward(self, m: torch.Tensor, z: torch.Tensor, msa_mask: torch.Tensor, pair_mask: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        m = m + self.msa_transition(m)
        z = z + self.outer_product_mean(m, msa_mask)
        z = z + self.tmo_dropout_rowwise(self.tri_mul_out(z, pair_mask))
        z = z + self.tmi_dropout_rowwise(self.tri_mul_in(z, pair_mask))
        z = z + self.tasn_dropout_rowwise(self.tri_att_start(z, pair_mask))
        z = z + self.taen_dropout_columnwise(self.tri_att_end(z, pair_mask))
        z = z + self.pair_transition(z)
        return m, z


class EvoformerBlock(nn.Module):
    def __init__(self, cfg: EvoformerConfig, global_column: bool) -> None:
        super().__init__()
        self.msa_att_row = MSARowAttentionWithPairBias(cfg.c_m, cfg.c_z, cfg.c_hidden_msa_att,
                                                       cfg.num_heads_msa, cfg.inf, cfg.chunk_size_msa_att)
        if global_column:
            self.msa_att_col: nn.Module = MSAColumnGlobalAttention(
                cfg.c_m, cfg.c_hidden_msa_att, cfg.num_heads_msa, cfg.inf, cfg.eps, cfg.chunk_size_msa_att)
        else:
            self.msa_att_col = MSAColumnAttention(cfg.c_m, cfg.c_hidden_msa_att, cfg.num_heads_msa,
                                                  cfg.inf, cfg.chunk_size_msa_att)
        self.msa_dropout_rowwise = DropoutRowwise(cfg.msa_dropout)
        self.core = PairStackCore(cfg.c_m, cfg)

    def forward(self, m: torch.Tensor, z: torch.Tensor, msa_mask: torch.Tensor, pair_mask: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        m = m + self.msa_dropout_rowwise(self.msa_att_row(m, z, msa_mask))
        m = m + self.msa_att_col(m, msa_mask)
        return self.core(m, z, msa_mask, pair_mask)


def _run_blocks(blocks: nn.ModuleList, m: torch.Tensor, z: torch.Tensor, msa_mask: torch.Tensor,
                pair_mask: torch.Tensor, gradient_checkpointing: bool) -> tuple[torch.Tensor, torch.Tensor]:
    for block in blocks:
        if gradient_checkpointing and torch.is_grad_enabled():
            m, z = checkpoint(block, m, z, msa_mask, pair_mask, use_reentrant=False)
        else:
            m, z = block(m, z, msa_mask, pair_mask)
    return m, z


class EvoformerStack(nn.Module):
    def __init__(self, cfg: EvoformerConfig) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([EvoformerBlock(cfg, global_column=False) for _ in range(cfg.num_blocks)])
        self.linear = Linear(cfg.c_m, cfg.c_s, bias=True, init="default")

    def forward(self, m: torch.Tensor, z: torch.Tensor, msa_mask: torch.Tensor, pair_mask: torch.Tensor,
                gradient_checkpointing: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        m, z = _run_blocks(self.blocks, m, z, msa_mask, pair_mask, gradient_checkpointing)
        return m, z, self.linear(m[:, 0])


class ExtraMSAStack(nn.Module):
    def __init__(self, cfg: EvoformerConfig) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([EvoformerBlock(cfg, global_column=True) for _ in range(cfg.num_blocks)])

    def forward(self, m: torch.Tensor, z: torch.Tensor, msa_mask: torch.Tensor, pair_mask: torch.Tensor,
                gradient_checkpointing: bool = False) -> torch.Tensor:
        return _run_blocks(self.blocks, m, z, msa_mask, pair_mask, gradient_checkpointing)[1]


class TemplatePairBlock(nn.Module):
    """Template pair stack block (Algorithm 16): the pair updates, each template on its own."""

    def __init__(self, cfg: TemplateConfig) -> None:
        super().__init__()
        c_t = cfg.c_t
        self.tri_att_start = TriangleAttention(c_t, cfg.c_hidden_tri_att, cfg.num_heads_tri, cfg.inf,
                                               cfg.chunk_size_tri_att, starting=True)
        self.tasn_dropout_rowwise = DropoutRowwise(cfg.dropout_rate)
        self.tri_att_end = TriangleAttention(c_t, cfg.c_hidden_tri_att, cfg.num_heads_tri, cfg.inf,
                                             cfg.chunk_size_tri_att, starting=False)
        self.taen_dropout_columnwise = DropoutColumnwise(cfg.dropout_rate)
        self.tri_mul_out = TriangleMultiplication(c_t, cfg.c_hidden_tri_mul, outgoing=True)
        self.tmo_dropout_rowwise = DropoutRowwise(cfg.dropout_rate)
        self.tri_mul_in = TriangleMultiplication(c_t, cfg.c_hidden_tri_mul, outgoing=False)
        self.tmi_dropout_rowwise = DropoutRowwise(cfg.dropout_rate)
        self.pair_transition = Transition(c_t, cfg.pair_transition_n)

    def forward(self, t: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        out = []
        for ti in torch.unbind(t, dim=-4):  # [B, R, R, c_t] per template
            ti = ti + self.tasn_dropout_rowwise(self.tri_att_start(ti, mask))
            ti = ti + self.taen_dropout_columnwise(self.tri_att_end(ti, mask))
            ti = ti + self.tmo_dropout_rowwise(self.tri_mul_out(ti, mask))
            ti = ti + self.tmi_dropout_rowwise(self.tri_mul_in(ti, mask))
            ti = ti + self.pair_transition(ti)
            out.append(ti)
        return torch.stack(out, dim=-4)


class TemplatePairStack(nn.Module):
    def __init__(self, cfg: TemplateConfig) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([TemplatePairBlock(cfg) for _ in range(cfg.num_blocks)])
        self.layer_norm = LayerNorm(cfg.c_t)

    def forward(self, t: torch.Tensor, mask: torch.Tensor, gradient_checkpointing: bool = False
                ) -> torch.Tensor:
        for block in self.blocks:
            if gradient_checkpointing and torch.is_grad_enabled():
                t = checkpoint(block, t, mask, use_reentrant=False)
            else:
                t = block(t, mask)
        return self.layer_norm(t)
