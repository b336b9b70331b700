"""The AlphaFold2 model of the MLPerf HPC openfold reference (supplement Algorithm 2), in plain torch.

Input: the reference's training feature dict, every tensor with a leading batch dimension and the
recycling dimension LAST (num_recycling_iters + 1). Iterations 0..N-1 run without gradients and only
feed the recycling embedder; the last runs with autograd (under activation checkpointing when
training, unless ``activation_checkpointing`` is off) and the auxiliary heads read its outputs. The top-level module names are the reference's
``AlphaFold`` attributes, so its state dict maps one to one (see :mod:`.checkpoint`).
"""
from __future__ import annotations

from typing import Mapping

import torch
import torch.nn as nn

from hpcbench.common.precision import autocast_dtype

from .. import residue_constants as rc
from .config import ModelConfig
from .embedders import (ExtraMSAEmbedder, InputEmbedder, RecyclingEmbedder, TemplateAngleEmbedder,
                        TemplatePairEmbedder, TemplatePointwiseAttention, build_extra_msa_feat,
                        build_template_angle_feat, build_template_pair_feat, pseudo_beta)
from .evoformer import EvoformerStack, ExtraMSAStack, TemplatePairStack
from .heads import AuxiliaryHeads
from .structure import StructureModule, atom14_to_atom37

#: the features the model reads (the losses read more); each is [batch, ..., recycling]
MODEL_FEATURES: tuple[str, ...] = (
    "aatype", "target_feat", "residue_index", "msa_feat", "seq_mask", "msa_mask",
    "extra_msa", "extra_msa_mask", "extra_has_deletion", "extra_deletion_value",
    "residx_atom37_to_atom14", "atom37_atom_exists",
)
TEMPLATE_FEATURES: tuple[str, ...] = (
    "template_aatype", "template_all_atom_positions", "template_all_atom_mask", "template_mask",
    "template_pseudo_beta", "template_pseudo_beta_mask", "template_torsion_angles_sin_cos",
    "template_alt_torsion_angles_sin_cos", "template_torsion_angles_mask",
)


class FeatureError(ValueError):
    """A feature dict the model cannot read: the message names the feature and what was expected."""


def check_features(batch: Mapping[str, torch.Tensor], cfg: ModelConfig) -> int:
    """Validate the model's inputs; returns the number of recycling iterations + 1."""
    needed = MODEL_FEATURES + (TEMPLATE_FEATURES if cfg.template.enabled else ())
    missing = [k for k in needed if k not in batch]
    if missing:
        raise FeatureError(f"feature dict: missing {', '.join(missing)} (the reference's training features, "
                           "batch first and recycling last)")
    aatype = batch["aatype"]
    if aatype.dim() != 3:
        raise FeatureError(f"feature 'aatype': shape {tuple(aatype.shape)}, expected [batch, N_res, recycling]")
    b, n_res, n_cycle = aatype.shape
    expect_last = {"target_feat": (b, n_res, cfg.tf_dim, n_cycle), "residue_index": (b, n_res, n_cycle),
                   "seq_mask": (b, n_res, n_cycle)}
    for key, shape in expect_last.items():
        if tuple(batch[key].shape) != shape:
            raise FeatureError(f"feature {key!r}: shape {tuple(batch[key].shape)}, expected {shape} "
                               "[batch, N_res, ..., recycling]")
    msa = batch["msa_feat"]
    if msa.dim() != 5 or msa.shape[0] != b or msa.shape[2] != n_res or msa.shape[3] != cfg.msa_dim \
            or msa.shape[4] != n_cycle:
        raise FeatureError(f"feature 'msa_feat': shape {tuple(msa.shape)}, expected "
                           f"[{b}, N_clust, {n_res}, {cfg.msa_dim}, {n_cycle}]")
    for key in needed:
        t = batch[key]
        if t.shape[0] != b or t.shape[-1] != n_cycle:
            raise FeatureError(f"feature {key!r}: shape {tuple(t.shape)}, expected batch {b} first and "
                               f"recycling {n_cycle} last")
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise FeatureError(f"feature {key!r}: holds non-finite values")
    if int(aatype.min()) < 0 or int(aatype.max()) > rc.UNK_RESTYPE_INDEX:
        raise FeatureError(f"feature 'aatype': values {int(aatype.min())}..{int(aatype.max())}, expected "
                           f"0..{rc.UNK_RESTYPE_INDEX}")
    return n_cycle


class AlphaFold(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.input_embedder = InputEmbedder(cfg.tf_dim, cfg.msa_dim, cfg.c_z, cfg.c_m, cfg.relpos_k)
        self.recycling_embedder = RecyclingEmbedder(cfg.c_m, cfg.c_z, cfg.recycle_min_bin,
                                                    cfg.recycle_max_bin, cfg.recycle_num_bins, cfg.recycle_inf)
        t = cfg.template
        if t.enabled:
            self.template_angle_embedder = TemplateAngleEmbedder(t.ta_dim, cfg.c_m)
            self.template_pair_embedder = TemplatePairEmbedder(t.tp_dim, t.c_t)
            self.template_pair_stack = TemplatePairStack(t)
            self.template_pointwise_attention = TemplatePointwiseAttention(
                t.c_t, cfg.c_z, t.c_hidden_pointwise, t.num_heads_pointwise, t.inf_pointwise,
                t.chunk_size_pointwise)
        self.extra_msa_embedder = ExtraMSAEmbedder(cfg.emsa_dim, cfg.c_e)
        self.extra_msa_stack = ExtraMSAStack(cfg.extra_msa)
        self.evoformer_stack = EvoformerStack(cfg.evoformer)
        self.structure_module = StructureModule(cfg.structure)
        self.auxiliary_heads = AuxiliaryHeads(cfg.heads, cfg.c_s, cfg.c_z, cfg.c_m)

    def forward(self, batch: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        n_cycle = check_features(batch, self.cfg)
        last = {k: v[..., -1] for k, v in batch.items() if isinstance(v, torch.Tensor)}
        gc = self.training and self.cfg.activation_checkpointing
        # the template pair stack reads only the template features and the residue mask: where they are the
        # same in every iteration and no dropout draws masks, its output is too, so it runs once (with
        # autograd, for the last iteration) and the recycling iterations read it detached
        shared = self._template_pairs(last, gc) if self._template_pairs_constant(batch, n_cycle) else None
        prev: dict[str, torch.Tensor] = {}
        for j in range(n_cycle - 1):
            feats = {k: v[..., j] for k, v in batch.items() if isinstance(v, torch.Tensor)}
            with torch.no_grad():
                _, prev = self._iteration(feats, prev, False, None if shared is None else shared.detach())
        outputs, _ = self._iteration(last, prev, gc, shared)
        outputs.update(self.auxiliary_heads(outputs))
        return outputs

    def _template_pairs_constant(self, batch: Mapping[str, torch.Tensor], n_cycle: int) -> bool:
        t = self.cfg.template
        if not t.enabled or n_cycle < 2 or (self.training and t.dropout_rate > 0):
            return False
        keys = [k for k in batch if k.startswith("template_")] + ["seq_mask"]
        same = [torch.equal(batch[k][..., :1].expand_as(batch[k]), batch[k]) for k in keys]
        return all(same)

    def _iteration(self, feats: Mapping[str, torch.Tensor], prev: Mapping[str, torch.Tensor],
                   gradient_checkpointing: bool, template_pairs: torch.Tensor | None
                   ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        cfg = self.cfg
        seq_mask = feats["seq_mask"]
        pair_mask = seq_mask.unsqueeze(-1) * seq_mask.unsqueeze(-2)
        n_clust = feats["msa_feat"].shape[1]
        m, z = self.input_embedder(feats["target_feat"], feats["residue_index"], feats["msa_feat"])
        dt = z.dtype
        if prev:
            m0_prev, z_prev = prev["m0_prev"].to(dt), prev["z_prev"].to(dt)
            x_prev = pseudo_beta(feats["aatype"], prev["x_prev"]).to(dt)
        else:
            m0_prev, z_prev = torch.zeros_like(m[:, 0]), torch.zeros_like(z)
            x_prev = z.new_zeros(z.shape[:-2] + (3,))
        m0_emb, z_emb = self.recycling_embedder(m0_prev, z_prev, x_prev)
        m = torch.cat([(m[:, 0] + m0_emb).unsqueeze(1), m[:, 1:]], dim=1)
        z = z + z_emb
        msa_mask = feats["msa_mask"]
        if cfg.template.enabled:
            t_pair, t_angle = self._embed_templates(feats, z, template_pairs, gradient_checkpointing)
            z = z + t_pair
            if cfg.template.embed_torsion_angles:
                m = torch.cat([m, t_angle], dim=1)
                msa_mask = torch.cat([msa_mask, feats["template_torsion_angles_mask"][..., 2]], dim=-2)
        a = self.extra_msa_embedder(build_extra_msa_feat(feats).to(dt))
        z = self.extra_msa_stack(a, z, feats["extra_msa_mask"].to(dt), pair_mask.to(dt), gradient_checkpointing)
        m, z, s = self.evoformer_stack(m, z, msa_mask.to(dt), pair_mask.to(dt), gradient_checkpointing)
        out: dict[str, torch.Tensor] = {"msa": m[:, :n_clust], "pair": z, "single": s}
        out.update(self.structure_module(s, z, seq_mask.to(s.dtype), feats["aatype"].long()))
        out["final_atom_positions"] = atom14_to_atom37(out["sm_positions"][:, -1],
                                                       feats["residx_atom37_to_atom14"],
                                                       feats["atom37_atom_exists"])
        out["final_atom_mask"] = feats["atom37_atom_exists"]
        out["final_affine_tensor"] = out["sm_frames"][:, -1]
        prev_out = {"m0_prev": m[:, 0].detach(), "z_prev": z.detach(),
                    "x_prev": out["final_atom_positions"].detach()}
        return out, prev_out

    def _template_pairs(self, feats: Mapping[str, torch.Tensor], gradient_checkpointing: bool) -> torch.Tensor:
        """The template pair stack's output [B, T, R, R, c_t] for one iteration's features."""
        tf = {k: v for k, v in feats.items() if k.startswith("template_")}
        seq_mask = feats["seq_mask"]
        # the dtype of the pair activations (as z's in an iteration)
        dt = autocast_dtype(seq_mask.device.type) or self.template_pair_embedder.linear.weight.dtype
        pair_mask = (seq_mask.unsqueeze(-1) * seq_mask.unsqueeze(-2)).to(dt)
        n_templ = tf["template_aatype"].shape[1]
        pair = [self.template_pair_embedder(
            build_template_pair_feat({k: v[:, i] for k, v in tf.items()}, self.cfg.template).to(dt))
            for i in range(n_templ)]
        return self.template_pair_stack(torch.stack(pair, dim=1), pair_mask, gradient_checkpointing)

    def _embed_templates(self, feats: Mapping[str, torch.Tensor], z: torch.Tensor, pairs: torch.Tensor | None,
                         gradient_checkpointing: bool) -> tuple[torch.Tensor, torch.Tensor]:
        tf = {k: v for k, v in feats.items() if k.startswith("template_")}
        t = self._template_pairs(feats, gradient_checkpointing) if pairs is None else pairs
        template_mask = tf["template_mask"].to(z.dtype)
        t = self.template_pointwise_attention(t.to(z.dtype), z, template_mask)
        any_template = (torch.sum(template_mask, dim=1) > 0).to(t.dtype)
        t = t * any_template[:, None, None, None]
        angle = self.template_angle_embedder(build_template_angle_feat(tf).to(z.dtype))
        return t, angle
