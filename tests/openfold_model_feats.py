"""A synthetic feature dict in the reference's training layout (batch first, recycling last) for the
openfold model tests: a random chain whose ground truth is built from the ideal residue geometry, so that
every structural feature (frames, atom14/atom37, chis, pseudo-beta) is mutually consistent."""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from hpcbench.workloads.openfold_mlperf import residue_constants as rc
from hpcbench.workloads.openfold_mlperf.model.embedders import pseudo_beta
from hpcbench.workloads.openfold_mlperf.model.rigid import Rigid, quat_to_rot
from hpcbench.workloads.openfold_mlperf.model.structure import (atom14_to_atom37, frames_to_atom14,
                                                                torsion_angles_to_frames)


def _table(a: np.ndarray, idx: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.tensor(np.asarray(a)).to(dtype)[idx]


def ground_truth(aatype: torch.Tensor, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Structure features of one chain [R] built from random backbone frames and torsions."""
    r = aatype.shape[0]
    q = torch.randn(r, 4, generator=gen)
    rot = quat_to_rot(q / q.norm(dim=-1, keepdim=True))
    steps = torch.randn(r, 3, generator=gen)
    trans = torch.cumsum(3.8 * steps / steps.norm(dim=-1, keepdim=True), dim=0)
    bb = Rigid(rot, trans)
    ang = torch.rand(r, 7, generator=gen) * 2 * np.pi
    sc = torch.stack([torch.sin(ang), torch.cos(ang)], dim=-1)
    default = torch.tensor(rc.RESTYPE_RIGID_GROUP_DEFAULT_FRAME)
    frames = torsion_angles_to_frames(bb, sc, aatype, default)
    group_idx = torch.tensor(rc.RESTYPE_ATOM14_TO_RIGID_GROUP)
    mask14 = torch.tensor(rc.RESTYPE_ATOM14_MASK)
    lit = torch.tensor(rc.RESTYPE_ATOM14_RIGID_GROUP_POSITIONS)
    pos14 = frames_to_atom14(Rigid(frames.rot[None], frames.trans[None]), aatype[None], group_idx, mask14, lit)[0]
    periodic = _table(np.asarray(rc.CHI_PI_PERIODIC), aatype)  # [R, 4]
    flip = torch.cat([torch.ones(r, 3), 1 - 2 * periodic], dim=-1).unsqueeze(-1)
    frames_alt = torsion_angles_to_frames(bb, sc * flip, aatype, default)
    swap = torch.tensor(rc.RESTYPE_ATOM14_AMBIGUOUS_ATOMS_SWAP_IDX)[aatype]
    pos14_alt = torch.gather(pos14, 0 - 2, swap.unsqueeze(-1).expand(r, 14, 3))
    exists14 = mask14[aatype]
    r37to14 = torch.tensor(rc.RESTYPE_ATOM37_TO_ATOM14)[aatype]
    exists37 = _table(rc.RESTYPE_ATOM37_MASK, aatype)
    pos37 = atom14_to_atom37(pos14[None], r37to14[None], exists37[None])[0]
    chi_mask = torch.cat([torch.tensor(np.asarray(rc.CHI_ANGLES_MASK, np.float32)),
                          torch.zeros(1, 4)])[aatype]
    return {
        "backbone_rigid_tensor": frames.to_4x4()[:, 0], "backbone_rigid_mask": torch.ones(r),
        "rigidgroups_gt_frames": frames.to_4x4(), "rigidgroups_alt_gt_frames": frames_alt.to_4x4(),
        "rigidgroups_gt_exists": _table(rc.RESTYPE_RIGID_GROUP_EXISTS, aatype),
        "rigidgroups_group_exists": _table(rc.RESTYPE_RIGID_GROUP_EXISTS, aatype),
        "atom14_gt_positions": pos14, "atom14_alt_gt_positions": pos14_alt,
        "atom14_gt_exists": exists14, "atom14_alt_gt_exists": exists14, "atom14_atom_exists": exists14,
        "atom14_atom_is_ambiguous": _table(rc.RESTYPE_ATOM14_AMBIGUOUS_ATOMS, aatype),
        "residx_atom14_to_atom37": torch.tensor(rc.RESTYPE_ATOM14_TO_ATOM37)[aatype],
        "residx_atom37_to_atom14": r37to14, "atom37_atom_exists": exists37,
        "all_atom_positions": pos37, "all_atom_mask": exists37,
        "chi_angles_sin_cos": sc[:, 3:], "chi_mask": chi_mask,
        "pseudo_beta": pseudo_beta(aatype, pos37), "pseudo_beta_mask": torch.ones(r),
    }


def feature_dict(n_res: int = 24, n_clust: int = 6, n_extra: int = 8, n_templ: int = 2, n_cycle: int = 2,
                 batch: int = 1, seed: int = 0) -> dict[str, torch.Tensor]:
    """The reference's training feature dict for ``batch`` random chains, recycling dimension last."""
    gen = torch.Generator().manual_seed(seed)
    samples = []
    for _ in range(batch):
        aatype = torch.randint(0, 20, (n_res,), generator=gen)
        f = ground_truth(aatype, gen)
        msa = torch.where(torch.rand(n_clust, n_res, generator=gen) < 0.8, aatype,
                          torch.randint(0, 22, (n_clust, n_res), generator=gen))
        msa[0] = aatype
        bert = (torch.rand(n_clust, n_res, generator=gen) < 0.15).float()
        msa_in = torch.where(bert.bool(), torch.full_like(msa, rc.MSA_MASK_INDEX), msa)
        msa_feat = torch.cat([F.one_hot(msa_in, 23).float(), torch.zeros(n_clust, n_res, 3),
                              F.one_hot(msa, 23).float()], dim=-1)  # 23 + 3 + 23 = 49
        tmpl = ground_truth(aatype, gen)
        f.update({
            "aatype": aatype, "residue_index": torch.arange(n_res), "seq_length": torch.tensor(n_res),
            "seq_mask": torch.ones(n_res), "target_feat": F.one_hot(aatype + 1, 22).float(),
            "msa_feat": msa_feat, "msa_mask": torch.ones(n_clust, n_res), "msa_row_mask": torch.ones(n_clust),
            "true_msa": msa, "bert_mask": bert,
            "extra_msa": torch.randint(0, 22, (n_extra, n_res), generator=gen),
            "extra_msa_mask": torch.ones(n_extra, n_res), "extra_msa_row_mask": torch.ones(n_extra),
            "extra_has_deletion": torch.zeros(n_extra, n_res), "extra_deletion_value": torch.zeros(n_extra, n_res),
            "template_aatype": aatype.expand(n_templ, n_res).clone(),
            "template_all_atom_positions": tmpl["all_atom_positions"].expand(n_templ, -1, -1, -1).clone(),
            "template_all_atom_mask": tmpl["all_atom_mask"].expand(n_templ, -1, -1).clone(),
            "template_mask": torch.ones(n_templ), "template_sum_probs": torch.ones(n_templ, 1),
            "template_pseudo_beta": tmpl["pseudo_beta"].expand(n_templ, -1, -1).clone(),
            "template_pseudo_beta_mask": torch.ones(n_templ, n_res),
            "template_torsion_angles_sin_cos": torch.zeros(n_templ, n_res, 7, 2),
            "template_alt_torsion_angles_sin_cos": torch.zeros(n_templ, n_res, 7, 2),
            "template_torsion_angles_mask": torch.ones(n_templ, n_res, 7),
            "resolution": torch.tensor(2.0), "use_clamped_fape": torch.tensor(1.0),
            "is_distillation": torch.tensor(0.0),
        })
        samples.append(f)
    out = {}
    for k in samples[0]:
        t = torch.stack([s[k] for s in samples])
        out[k] = t.unsqueeze(-1).expand(t.shape + (n_cycle,)).contiguous()
    return out


def last_iteration(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v[..., -1] for k, v in batch.items()}
