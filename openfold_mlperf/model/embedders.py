"""Input, recycling, extra-MSA and template embedders (supplement 1.5, 1.7, 1.10), with the template
features built from the reference's feature dict as its ``alphafold.py`` builds them.
"""
from __future__ import annotations

import math
from typing import Mapping, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from .. import residue_constants as rc
from .config import TemplateConfig
from .primitives import LayerNorm, Linear, attention_chunked
from .rigid import Rigid


class InputEmbedder(nn.Module):
    """Algorithm 3 with relative positions (Algorithm 4) clipped at ``relpos_k``."""

    def __init__(self, tf_dim: int, msa_dim: int, c_z: int, c_m: int, relpos_k: int) -> None:
        super().__init__()
        self.relpos_k = relpos_k
        self.linear_tf_z_i = Linear(tf_dim, c_z)
        self.linear_tf_z_j = Linear(tf_dim, c_z)
        self.linear_tf_m = Linear(tf_dim, c_m)
        self.linear_msa_m = Linear(msa_dim, c_m)
        self.linear_relpos = Linear(2 * relpos_k + 1, c_z)

    def forward(self, target_feat: torch.Tensor, residue_index: torch.Tensor, msa_feat: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        d = residue_index.unsqueeze(-1) - residue_index.unsqueeze(-2)  # [B, R, R], integer offsets
        idx = torch.clamp(d, -self.relpos_k, self.relpos_k) + self.relpos_k  # nearest bin of -k..k
        relpos = F.one_hot(idx.long(), 2 * self.relpos_k + 1).to(target_feat.dtype)
        z = self.linear_relpos(relpos)
        z = z + self.linear_tf_z_i(target_feat).unsqueeze(-2) + self.linear_tf_z_j(target_feat).unsqueeze(-3)
        m = self.linear_msa_m(msa_feat) + self.linear_tf_m(target_feat).unsqueeze(-3)
        return m, z


class RecyclingEmbedder(nn.Module):
    """Algorithm 32: layer-normed previous m0 and z, plus a one-hot distogram of previous pseudo-beta."""

    def __init__(self, c_m: int, c_z: int, min_bin: float, max_bin: float, num_bins: int, inf: float) -> None:
        super().__init__()
        self.min_bin, self.max_bin, self.num_bins, self.inf = min_bin, max_bin, num_bins, inf
        self.linear = Linear(num_bins, c_z)
        self.layer_norm_m = LayerNorm(c_m)
        self.layer_norm_z = LayerNorm(c_z)

    def forward(self, m0_prev: torch.Tensor, z_prev: torch.Tensor, x_prev: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        bins = torch.linspace(self.min_bin, self.max_bin, self.num_bins, dtype=x_prev.dtype,
                              device=x_prev.device)
        lower = bins ** 2
        upper = torch.cat([lower[1:], lower.new_tensor([self.inf])])
        d = torch.sum((x_prev.unsqueeze(-2) - x_prev.unsqueeze(-3)) ** 2, dim=-1, keepdim=True)
        onehot = ((d > lower) & (d < upper)).to(x_prev.dtype)
        return self.layer_norm_m(m0_prev), self.linear(onehot) + self.layer_norm_z(z_prev)


class ExtraMSAEmbedder(nn.Module):
    def __init__(self, emsa_dim: int, c_e: int) -> None:
        super().__init__()
        self.linear = Linear(emsa_dim, c_e)

    def forward(self, extra_msa_feat: torch.Tensor) -> torch.Tensor:
        return self.linear(extra_msa_feat)


class TemplateAngleEmbedder(nn.Module):
    def __init__(self, ta_dim: int, c_m: int) -> None:
        super().__init__()
        self.linear_1 = Linear(ta_dim, c_m, init="relu")
        self.linear_2 = Linear(c_m, c_m, init="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(torch.relu(self.linear_1(x)))


class TemplatePairEmbedder(nn.Module):
    def __init__(self, tp_dim: int, c_t: int) -> None:
        super().__init__()
        self.linear = Linear(tp_dim, c_t, init="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


class CrossAttentionNoGate(nn.Module):
    def __init__(self, c_q: int, c_kv: int, c_hidden: int, num_heads: int, inf: float,
                 chunk_size: Optional[int]) -> None:
        super().__init__()
        self.c_hidden, self.num_heads, self.inf, self.chunk_size = c_hidden, num_heads, inf, chunk_size
        hc = c_hidden * num_heads
        self.linear_q = Linear(c_q, hc, bias=False, init="glorot")
        self.linear_k = Linear(c_kv, hc, bias=False, init="glorot")
        self.linear_v = Linear(c_kv, hc, bias=False, init="glorot")
        self.linear_o = Linear(hc, c_q, bias=True, init="final")

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(x.shape[:-1] + (self.num_heads, self.c_hidden)).transpose(-2, -3)

    def forward(self, q_in: torch.Tensor, kv_in: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        q = self._heads(self.linear_q(q_in)) / math.sqrt(self.c_hidden)
        k, v = self._heads(self.linear_k(kv_in)), self._heads(self.linear_v(kv_in))
        o = attention_chunked(q, k, v, (mask.to(q.dtype) - 1.0) * self.inf, None, self.chunk_size)
        o = o.transpose(-2, -3)
        return self.linear_o(o.reshape(o.shape[:-2] + (-1,)))


class TemplatePointwiseAttention(nn.Module):
    """Algorithm 17: each pair position attends over the templates' embeddings."""

    def __init__(self, c_t: int, c_z: int, c_hidden: int, num_heads: int, inf: float,
                 chunk_size: Optional[int]) -> None:
        super().__init__()
        self.mha = CrossAttentionNoGate(c_z, c_t, c_hidden, num_heads, inf, chunk_size)

    def forward(self, t: torch.Tensor, z: torch.Tensor, template_mask: torch.Tensor) -> torch.Tensor:
        t = t.movedim(-4, -2)  # [B, R, R, T, c_t]
        mask = template_mask[:, None, None, None, None, :]  # [B, 1, 1, 1, 1, T] over [B, R, R, H, 1, T]
        return self.mha(z.unsqueeze(-2), t, mask).squeeze(-2)


def pseudo_beta(aatype: torch.Tensor, atom37: torch.Tensor) -> torch.Tensor:
    """CB position (CA for glycine), [*, R, 37, 3] -> [*, R, 3]."""
    is_gly = (aatype == rc.RESTYPE_ORDER["G"]).unsqueeze(-1)
    return torch.where(is_gly, atom37[..., rc.ATOM_ORDER["CA"], :], atom37[..., rc.ATOM_ORDER["CB"], :])


def build_extra_msa_feat(feats: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """[B, S, R, 25]: 23-class one-hot of extra_msa, has_deletion, deletion_value."""
    onehot = F.one_hot(feats["extra_msa"].long(), rc.MSA_NUM_CLASSES)
    return torch.cat([onehot.to(feats["extra_deletion_value"].dtype),
                      feats["extra_has_deletion"].unsqueeze(-1),
                      feats["extra_deletion_value"].unsqueeze(-1)], dim=-1)


def build_template_angle_feat(feats: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """[B, T, R, 57]: aatype one-hot (22), torsion sin/cos (14), alt sin/cos (14), torsion mask (7)."""
    sc = feats["template_torsion_angles_sin_cos"]
    alt = feats["template_alt_torsion_angles_sin_cos"]
    return torch.cat([F.one_hot(feats["template_aatype"].long(), 22).to(sc.dtype),
                      sc.reshape(sc.shape[:-2] + (14,)), alt.reshape(alt.shape[:-2] + (14,)),
                      feats["template_torsion_angles_mask"]], dim=-1)


def build_template_pair_feat(feats: Mapping[str, torch.Tensor], cfg: TemplateConfig) -> torch.Tensor:
    """[B, R, R, 88] for one template: pseudo-beta distogram (39), its mask, both residues' aatype one-hots,
    the unit vector between backbone frames (zeroed unless ``use_unit_vector``), the backbone mask."""
    pb_mask = feats["template_pseudo_beta_mask"]
    pb_mask_2d = pb_mask.unsqueeze(-1) * pb_mask.unsqueeze(-2)
    tpb = feats["template_pseudo_beta"]
    d2 = torch.sum((tpb.unsqueeze(-2) - tpb.unsqueeze(-3)) ** 2, dim=-1, keepdim=True)
    lower = torch.linspace(cfg.distogram_min_bin, cfg.distogram_max_bin, cfg.distogram_num_bins,
                           device=tpb.device, dtype=tpb.dtype) ** 2
    upper = torch.cat([lower[1:], lower.new_tensor([cfg.pair_feat_inf])])
    dgram = ((d2 > lower) & (d2 < upper)).to(tpb.dtype)
    aa = F.one_hot(feats["template_aatype"].long(), rc.RESTYPE_NUM + 2).to(tpb.dtype)
    n_res = aa.shape[-2]
    pos = feats["template_all_atom_positions"]
    n, ca, c = (rc.ATOM_ORDER[a] for a in ("N", "CA", "C"))
    frames = Rigid.from_3_points(pos[..., n, :], pos[..., ca, :], pos[..., c, :], eps=cfg.pair_feat_eps)
    vec = frames.unsqueeze(-1).invert_apply(frames.trans.unsqueeze(-3))  # [B, R, R, 3]
    am = feats["template_all_atom_mask"]
    bb_mask = am[..., n] * am[..., ca] * am[..., c]
    bb_mask_2d = bb_mask.unsqueeze(-1) * bb_mask.unsqueeze(-2)
    inv = torch.rsqrt(cfg.pair_feat_eps + torch.sum(vec ** 2, dim=-1)) * bb_mask_2d
    unit = vec * inv.unsqueeze(-1)
    if not cfg.use_unit_vector:
        unit = unit * 0.0
    t = torch.cat([dgram, pb_mask_2d.unsqueeze(-1),
                   aa.unsqueeze(-3).expand(aa.shape[:-2] + (n_res, n_res, aa.shape[-1])),
                   aa.unsqueeze(-2).expand(aa.shape[:-2] + (n_res, n_res, aa.shape[-1])),
                   unit, bb_mask_2d.unsqueeze(-1)], dim=-1)
    return t * bb_mask_2d.unsqueeze(-1)
