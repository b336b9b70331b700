"""From raw per-chain features to the model's feature dict, as the reference's ``process_features``
(mlcommons/hpc ``openfold/data/features.py``): transforms that run once (restype mapping, masks, MSA profile,
template and ground-truth geometry), then per recycling iteration ``i`` (seed ``seed + i``) MSA sampling,
BERT masking, clustering, extra-MSA crop and ``msa_feat``; then one crop of ``crop_size`` residues and one
template subsample (seeded with ``seed`` alone, so every iteration is cropped alike), padding to the
schema, and the iterations stacked on a LAST dimension. Names, dtypes and shapes are
:mod:`openfold_mlperf.features`.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from .. import features as schema
from .. import residue_constants as rc
from . import geometry, msa

Feats = dict[str, torch.Tensor]


@dataclass(frozen=True)
class PipelineConfig:
    """The reference's ``AlphaFoldConfig`` data fields (initial-training stage values as defaults)."""

    crop_size: int = 256
    max_msa_clusters: int = 124
    max_extra_msa: int = 1024
    max_templates: int = 4
    num_recycling_iters: int = 3
    masked_msa_profile_prob: float = 0.1
    masked_msa_same_prob: float = 0.1
    masked_msa_uniform_prob: float = 0.1
    masked_msa_replace_fraction: float = 0.15
    use_clamped_fape_probability: float = 0.9

    def sizes(self, n_res: int) -> schema.Sizes:
        return schema.Sizes(n_res, self.max_msa_clusters, self.max_extra_msa, self.max_templates,
                            self.num_recycling_iters + 1)


def raw_features(sequence: str, all_atom_positions: np.ndarray | None, all_atom_mask: np.ndarray | None,
                 resolution: float, msa_feats: dict[str, np.ndarray], template_feats: dict[str, np.ndarray]) -> Feats:
    """The raw dict the reference builds (``create_sequence_features`` + mmCIF + MSA + template features),
    as tensors: aatype as indices (unknown -> X), MSA in HHblits indices, templates in HHblits indices."""
    n = len(sequence)
    p: Feats = {
        "aatype": torch.tensor([rc.RESTYPE_ORDER_WITH_X.get(c, rc.UNK_RESTYPE_INDEX) for c in sequence], dtype=torch.int64),
        "residue_index": torch.arange(n, dtype=torch.int64),
        "seq_length": torch.tensor(n, dtype=torch.int64),
        "between_segment_residues": torch.zeros(n, dtype=torch.int64),
        "msa": torch.from_numpy(msa_feats["msa"]).long(),
        "deletion_matrix": torch.from_numpy(msa_feats["deletion_matrix_int"]).float(),
        "template_aatype": torch.from_numpy(template_feats["template_aatype"]).long(),
        "template_all_atom_positions": torch.from_numpy(template_feats["template_all_atom_positions"]).float(),
        "template_all_atom_mask": torch.from_numpy(template_feats["template_all_atom_mask"]).float(),
        "template_sum_probs": torch.from_numpy(template_feats["template_sum_probs"]).float().reshape(-1, 1),
        "is_distillation": torch.tensor(0.0),
    }
    if all_atom_positions is not None and all_atom_mask is not None:
        p["all_atom_positions"] = torch.from_numpy(np.asarray(all_atom_positions, np.float32))
        p["all_atom_mask"] = torch.from_numpy(np.asarray(all_atom_mask, np.float32))
        p["resolution"] = torch.tensor(float(resolution), dtype=torch.float32)
    return p


def _once(p: Feats, supervised: bool) -> Feats:
    p = msa.correct_msa_restypes(p)
    p["seq_mask"] = torch.ones(p["aatype"].shape, dtype=torch.float32)
    p = msa.make_msa_mask(p)
    p = msa.make_hhblits_profile(p)
    # templates: HHblits indices -> our order; mask; pseudo-beta; torsions
    p["template_aatype"] = torch.tensor(rc.MAP_HHBLITS_AATYPE_TO_OUR_AATYPE, dtype=torch.int64)[p["template_aatype"]]
    p["template_mask"] = torch.ones(p["template_aatype"].shape[0], dtype=torch.float32)
    p = geometry.make_pseudo_beta(p, "template_")
    p = geometry.atom37_to_torsion_angles(p, "template_")
    p = geometry.make_atom14_masks(p)
    if supervised:
        p = geometry.make_atom14_positions(p)
        p = geometry.atom37_to_frames(p)
        p = geometry.atom37_to_torsion_angles(p, "")
        p = geometry.make_pseudo_beta(p, "")
        p = geometry.backbone_and_chi(p)
    return p


def _iteration(p: Feats, cfg: PipelineConfig, seed: int) -> Feats:
    p = msa.sample_msa(p, cfg.max_msa_clusters, seed)
    p = msa.make_masked_msa(p, cfg.masked_msa_profile_prob, cfg.masked_msa_same_prob, cfg.masked_msa_uniform_prob,
                            cfg.masked_msa_replace_fraction, seed)
    p = msa.nearest_neighbor_clusters(p)
    p = msa.summarize_clusters(p)
    p = msa.crop_extra_msa(p, cfg.max_extra_msa, seed)
    p = msa.make_msa_feat(p)
    return {k: v for k, v in p.items() if k in schema.FEATURES}


def crop_and_subsample_templates(p: Feats, crop_size: int, max_templates: int, subsample: bool, seed: int) -> Feats:
    """One random window of ``min(L, crop_size)`` residues; in training, the templates are permuted and a
    random number of leading ones dropped (``randint(0, T)`` inclusive, as the reference draws it)."""
    g = msa.generator(seed)
    length = int(p["seq_length"])
    n_crop = min(length, crop_size)
    n_templ = p["template_mask"].shape[-1] if "template_mask" in p else 0
    subsample = subsample and n_templ > 0

    def randint(lo: int, hi: int) -> int:
        return int(torch.randint(lo, hi + 1, (1,), generator=g)[0])

    if subsample:
        t_start = randint(0, n_templ)
        t_perm = torch.randperm(n_templ, generator=g)
    else:
        t_start = 0
    t_size = min(n_templ - t_start, max_templates)
    r_start = randint(0, length - n_crop)
    out = {}
    for key, x in p.items():
        shape = schema.FEATURES[key].shape
        if not key.startswith("template") and schema.N_RES not in shape:
            out[key] = x
            continue
        if key.startswith("template") and subsample:
            x = x[t_perm]
        sl = []
        for dim, size in zip(shape, x.shape):
            if dim == schema.N_TEMPL and key.startswith("template"):
                sl.append(slice(t_start, t_start + t_size))
            elif dim == schema.N_RES:
                sl.append(slice(r_start, r_start + n_crop))
            else:
                sl.append(slice(0, size))
        out[key] = x[tuple(sl)]
    out["seq_length"] = torch.tensor(n_crop, dtype=torch.int64)
    return out


def pad_to_schema(p: Feats, sizes: schema.Sizes) -> Feats:
    for key, x in p.items():
        target = sizes.resolve(tuple(d for d in schema.FEATURES[key].shape))
        pad: list[int] = []
        for want, have in reversed(list(zip(target, x.shape))):
            if want < have:
                raise ValueError(f"feature '{key}' has {have} along a dim padded to {want}")
            pad += [0, want - have]
        if any(pad):
            p[key] = F.pad(x, pad)
    return p


def process_features(raw: Feats, cfg: PipelineConfig, mode: str, seed: int) -> Feats:
    """``mode``: "train" (crop to ``crop_size``, template subsampling, ``use_clamped_fape``), "eval" (whole
    chain, ground truth), "predict" (whole chain, no ground truth)."""
    if mode not in ("train", "eval", "predict"):
        raise ValueError(f"mode {mode!r}: expected train, eval or predict")
    supervised = mode != "predict"
    length = int(raw["seq_length"])
    crop = cfg.crop_size if mode == "train" else length
    base = _once({k: v.clone() for k, v in raw.items()}, supervised)
    iters = []
    sizes = cfg.sizes(crop)
    for i in range(cfg.num_recycling_iters + 1):
        p = _iteration({k: v.clone() for k, v in base.items()}, cfg, seed + i)
        p = crop_and_subsample_templates(p, crop, cfg.max_templates, mode == "train", seed)
        iters.append(pad_to_schema(p, sizes))
    out = {k: torch.stack([d[k] for d in iters], dim=-1) for k in iters[0]}
    if mode == "train":
        clamped = float(random.Random(seed).uniform(0, 1) < cfg.use_clamped_fape_probability)
        out[schema.USE_CLAMPED_FAPE] = torch.full((cfg.num_recycling_iters + 1,), clamped, dtype=torch.float32)
    return out
