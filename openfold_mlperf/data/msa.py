"""MSA transforms as the reference applies them per recycling iteration (mlcommons/hpc
``openfold/data/transforms.py``): sample ``N_clust`` rows (the query first, the rest shuffled) and keep the
others as extra MSA, BERT-style corruption of the sampled rows, nearest-neighbour clustering of the extra
rows onto the sampled ones with cluster profiles and deletion means, the extra MSA cropped to ``N_extra``,
and the ``msa_feat``/``target_feat`` features. Random draws use a ``torch.Generator`` seeded per transform
(``seed % 2**64``), as the reference does.

The reference also defines ``block_delete_msa`` but its training pipeline does not call it (it is not in
``_ensembled_transform_fns``), so there is no block deletion here either.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from .. import residue_constants as rc

Feats = dict[str, torch.Tensor]
SEED_MODULUS = 2 ** 64
MSA_FEATURE_NAMES = ("msa", "deletion_matrix", "msa_mask", "msa_row_mask", "bert_mask", "true_msa")


def generator(seed: int) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(seed % SEED_MODULUS)
    return g


def one_hot(x: torch.Tensor, n: int) -> torch.Tensor:
    """float32 one-hot (a scatter: ``F.one_hot`` scans for the maximum first and is several times slower)."""
    return torch.zeros((*x.shape, n), dtype=torch.float32).scatter_(-1, x.long()[..., None], 1.0)


def correct_msa_restypes(p: Feats) -> Feats:
    """HHblits indices -> our restype order (20 = X, 21 = gap)."""
    p["msa"] = torch.tensor(rc.MAP_HHBLITS_AATYPE_TO_OUR_AATYPE, dtype=torch.int64)[p["msa"].long()]
    return p


def make_msa_mask(p: Feats) -> Feats:
    p["msa_mask"] = torch.ones(p["msa"].shape, dtype=torch.float32)
    p["msa_row_mask"] = torch.ones(p["msa"].shape[0], dtype=torch.float32)
    return p


def make_hhblits_profile(p: Feats) -> Feats:
    p["hhblits_profile"] = one_hot(p["msa"], 22).mean(dim=0)
    return p


def sample_msa(p: Feats, max_seq: int, seed: int) -> Feats:
    n = p["msa"].shape[0]
    order = torch.cat([torch.zeros(1, dtype=torch.int64), torch.randperm(n - 1, generator=generator(seed)) + 1])
    k = min(max_seq, n)
    sel, rest = order[:k], order[k:]
    for name in MSA_FEATURE_NAMES:
        if name in p:
            p["extra_" + name] = p[name].index_select(0, rest)
            p[name] = p[name].index_select(0, sel)
    return p


def make_masked_msa(p: Feats, profile_prob: float, same_prob: float, uniform_prob: float,
                    replace_fraction: float, seed: int) -> Feats:
    """BERT corruption: each position is chosen with ``replace_fraction``; a chosen one becomes a uniform
    amino acid, a draw from the column profile, itself, or the mask token (index 22) with the remaining
    probability 1 - profile - same - uniform."""
    g = generator(seed)
    random_aa = torch.tensor([0.05] * 20 + [0.0, 0.0])
    probs = uniform_prob * random_aa + profile_prob * p["hhblits_profile"] + same_prob * one_hot(p["msa"], 22)
    mask_prob = 1.0 - profile_prob - same_prob - uniform_prob
    if mask_prob < 0:
        raise ValueError(f"masked-MSA probabilities sum to {1 - mask_prob} > 1")
    probs = F.pad(probs, (0, 1), value=mask_prob)
    position = torch.rand(p["msa"].shape, generator=g) < replace_fraction
    flat = (probs + 1e-10).reshape(-1, 23)
    draw = torch.multinomial(flat, 1, replacement=True, generator=g).reshape(p["msa"].shape)
    p["bert_mask"] = position.to(torch.float32)
    p["true_msa"] = p["msa"]
    p["msa"] = torch.where(position, draw, p["msa"])
    return p


def nearest_neighbor_clusters(p: Feats, gap_agreement_weight: float = 0.0) -> Feats:
    weights = torch.cat([torch.ones(21), gap_agreement_weight * torch.ones(1), torch.zeros(1)])
    sample = p["msa_mask"][:, :, None] * one_hot(p["msa"], 23)
    extra = p["extra_msa_mask"][:, :, None] * one_hot(p["extra_msa"], 23)
    n_res = sample.shape[1]  # explicit shapes: an MSA with no extra rows has zero of them
    agreement = extra.reshape(extra.shape[0], n_res * 23) @ (sample * weights).reshape(sample.shape[0], n_res * 23).T
    p["extra_cluster_assignment"] = agreement.argmax(dim=1).to(torch.int64)
    return p


def _segment_sum(x: torch.Tensor, ids: torch.Tensor, n: int) -> torch.Tensor:
    out = torch.zeros((n, *x.shape[1:]), dtype=torch.float32)
    return out.index_add_(0, ids, x.float())


def summarize_clusters(p: Feats) -> Feats:
    n = p["msa"].shape[0]
    ids = p["extra_cluster_assignment"]
    mask = p["extra_msa_mask"]
    counts = 1e-6 + p["msa_mask"] + _segment_sum(mask, ids, n)
    msa_sum = _segment_sum(mask[:, :, None] * one_hot(p["extra_msa"], 23), ids, n) + one_hot(p["msa"], 23)
    p["cluster_profile"] = msa_sum / counts[:, :, None]
    del_sum = _segment_sum(mask * p["extra_deletion_matrix"], ids, n) + p["deletion_matrix"]
    p["cluster_deletion_mean"] = del_sum / counts
    return p


def crop_extra_msa(p: Feats, max_extra: int, seed: int) -> Feats:
    n = p["extra_msa"].shape[0]
    keep = torch.randperm(n, generator=generator(seed))[:min(max_extra, n)]
    for name in MSA_FEATURE_NAMES:
        if "extra_" + name in p:
            p["extra_" + name] = p["extra_" + name].index_select(0, keep)
    return p


def make_msa_feat(p: Feats) -> Feats:
    """``target_feat`` (22 = between-segment flag + aatype one-hot over 21) and ``msa_feat`` (49 = MSA
    one-hot over 23, has-deletion, deletion value, cluster profile over 23, cluster deletion mean)."""
    has_break = torch.clip(p["between_segment_residues"].to(torch.float32), 0, 1)
    p["target_feat"] = torch.cat([has_break[..., None], one_hot(p["aatype"], 21)], dim=-1)
    dm = p["deletion_matrix"]
    parts = [one_hot(p["msa"], 23), torch.clip(dm, 0, 1)[..., None], (torch.atan(dm / 3.0) * (2 / np.pi))[..., None]]
    if "cluster_profile" in p:
        parts += [p["cluster_profile"], (torch.atan(p["cluster_deletion_mean"] / 3.0) * (2 / np.pi))[..., None]]
    p["msa_feat"] = torch.cat(parts, dim=-1)
    if "extra_deletion_matrix" in p:
        p["extra_has_deletion"] = torch.clip(p["extra_deletion_matrix"], 0, 1)
        p["extra_deletion_value"] = torch.atan(p["extra_deletion_matrix"] / 3.0) * (2 / np.pi)
    return p
