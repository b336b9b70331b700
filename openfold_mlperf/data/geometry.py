"""Ground-truth geometry features from atom37 coordinates, as the reference's transforms build them
(mlcommons/hpc ``openfold/data/transforms.py``): atom14 layouts and positions with the renamed
alternative for symmetric side chains, rigid-group frames (Gram-Schmidt from three atoms), torsion angles
(pre-omega, phi, psi, chi1-4) with their pi-periodic alternatives, backbone frames, chi angles, pseudo-beta.
"""
from __future__ import annotations

import numpy as np
import torch

from .. import residue_constants as rc

Feats = dict[str, torch.Tensor]


def _tables() -> dict[str, torch.Tensor]:
    a14_to_37 = np.zeros((21, 14), np.int64)
    a37_to_14 = np.zeros((21, 37), np.int64)
    a14_mask = np.zeros((21, 14), np.float32)
    a37_mask = np.zeros((21, 37), np.float32)
    for i, r in enumerate(rc.RESTYPES):
        names = rc.ATOM14_NAMES[rc.RESTYPE_1TO3[r]]
        for j, n in enumerate(names):
            a14_to_37[i, j] = rc.ATOM_ORDER[n]
            a14_mask[i, j] = 1.0
            a37_to_14[i, rc.ATOM_ORDER[n]] = j
            a37_mask[i, rc.ATOM_ORDER[n]] = 1.0
    ren = np.tile(np.eye(14, dtype=np.float32), (21, 1, 1))
    ambiguous = np.zeros((21, 14), np.float32)
    for res3, swaps in rc.RESIDUE_ATOM_RENAMING_SWAPS.items():
        i = rc.RESTYPE_ORDER[rc.RESTYPE_3TO1[res3]]
        names = rc.ATOM14_NAMES[res3]
        perm = list(range(14))
        for a, b in swaps.items():
            ia, ib = names.index(a), names.index(b)
            perm[ia], perm[ib] = ib, ia
            ambiguous[i, ia] = ambiguous[i, ib] = 1.0
        ren[i] = np.eye(14, dtype=np.float32)[perm]
    chi_idx = np.zeros((21, 4, 4), np.int64)
    for i, r in enumerate(rc.RESTYPES):
        for c, atoms in enumerate(rc.CHI_ANGLES_ATOMS[rc.RESTYPE_1TO3[r]]):
            chi_idx[i, c] = [rc.ATOM_ORDER[a] for a in atoms]
    chi_mask = np.array([*rc.CHI_ANGLES_MASK, (0.0,) * 4], np.float32)
    # rigid groups: 0 backbone (C, CA, N), 3 psi (CA, C, O), 4..7 chi k (last three atoms of chi k)
    base = np.zeros((21, 8, 3), np.int64)
    group_mask = np.zeros((21, 8), np.float32)
    base[:, 0] = [rc.ATOM_ORDER["C"], rc.ATOM_ORDER["CA"], rc.ATOM_ORDER["N"]]
    base[:, 3] = [rc.ATOM_ORDER["CA"], rc.ATOM_ORDER["C"], rc.ATOM_ORDER["O"]]
    group_mask[:, 0] = group_mask[:, 3] = 1.0
    group_amb = np.zeros((21, 8), np.float32)
    for i, r in enumerate(rc.RESTYPES):
        chis = rc.CHI_ANGLES_ATOMS[rc.RESTYPE_1TO3[r]]
        for c, atoms in enumerate(chis):
            base[i, 4 + c] = [rc.ATOM_ORDER[a] for a in atoms[1:]]
            group_mask[i, 4 + c] = 1.0
        if rc.RESTYPE_1TO3[r] in rc.RESIDUE_ATOM_RENAMING_SWAPS:
            group_amb[i, 4 + len(chis) - 1] = 1.0
    t = torch.from_numpy
    return {"a14_to_37": t(a14_to_37), "a37_to_14": t(a37_to_14), "a14_mask": t(a14_mask),
            "a37_mask": t(a37_mask), "renaming": t(ren), "ambiguous": t(ambiguous), "chi_idx": t(chi_idx),
            "chi_mask": t(chi_mask), "chi_pi": torch.tensor(rc.CHI_PI_PERIODIC, dtype=torch.float32),
            "base": t(base), "group_mask": t(group_mask), "group_amb": t(group_amb)}


TABLES = _tables()


def _gather_atoms(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """x (..., R, 37[, 3]) gathered at idx (..., R, K) along the atom dim."""
    if x.dim() == idx.dim():
        return torch.gather(x, -1, idx)
    return torch.gather(x, -2, idx[..., None].expand(*idx.shape, x.shape[-1]))


def frames_from_3_points(p_neg_x: torch.Tensor, origin: torch.Tensor, p_xy: torch.Tensor,
                         eps: float = 1e-8) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotation (..., 3, 3) with columns e0, e1, e2 and translation ``origin`` (AlphaFold algorithm 21)."""
    e0 = origin - p_neg_x
    e1 = p_xy - origin
    e0 = e0 / torch.sqrt((e0 * e0).sum(-1, keepdim=True) + eps)
    e1 = e1 - e0 * (e0 * e1).sum(-1, keepdim=True)
    e1 = e1 / torch.sqrt((e1 * e1).sum(-1, keepdim=True) + eps)
    e2 = torch.cross(e0, e1, dim=-1)
    return torch.stack([e0, e1, e2], dim=-1), origin


def _to_4x4(rot: torch.Tensor, trans: torch.Tensor) -> torch.Tensor:
    out = rot.new_zeros((*rot.shape[:-2], 4, 4))
    out[..., :3, :3] = rot
    out[..., :3, 3] = trans
    out[..., 3, 3] = 1.0
    return out


def make_atom14_masks(p: Feats) -> Feats:
    aa = p["aatype"].long()
    p["atom14_atom_exists"] = TABLES["a14_mask"][aa]
    p["residx_atom14_to_atom37"] = TABLES["a14_to_37"][aa]
    p["residx_atom37_to_atom14"] = TABLES["a37_to_14"][aa]
    p["atom37_atom_exists"] = TABLES["a37_mask"][aa]
    return p


def make_atom14_positions(p: Feats) -> Feats:
    aa = p["aatype"].long()
    idx = p["residx_atom14_to_atom37"]
    gt_exists = p["atom14_atom_exists"] * _gather_atoms(p["all_atom_mask"], idx)
    gt_pos = gt_exists[..., None] * _gather_atoms(p["all_atom_positions"], idx)
    ren = TABLES["renaming"][aa]
    p["atom14_gt_exists"] = gt_exists
    p["atom14_gt_positions"] = gt_pos
    p["atom14_alt_gt_positions"] = torch.einsum("...rac,...rab->...rbc", gt_pos, ren)
    p["atom14_alt_gt_exists"] = torch.einsum("...ra,...rab->...rb", gt_exists, ren)
    p["atom14_atom_is_ambiguous"] = TABLES["ambiguous"][aa]
    return p


def atom37_to_frames(p: Feats, eps: float = 1e-8) -> Feats:
    aa = p["aatype"].long()
    pos, mask = p["all_atom_positions"], p["all_atom_mask"]
    base = TABLES["base"][aa]  # (R, 8, 3)
    pts = _gather_atoms(pos, base.reshape(*aa.shape, 24)).reshape(*aa.shape, 8, 3, 3)
    rot, trans = frames_from_3_points(pts[..., 0, :], pts[..., 1, :], pts[..., 2, :], eps)
    group_exists = TABLES["group_mask"][aa]
    atoms_exist = _gather_atoms(mask, base.reshape(*aa.shape, 24)).reshape(*aa.shape, 8, 3)
    gt_exists = atoms_exist.min(dim=-1).values * group_exists
    flip = torch.diag(torch.tensor([-1.0, 1.0, -1.0]))  # backbone group: x -> -x, z -> -z
    rot = rot.clone()
    rot[..., 0, :, :] = rot[..., 0, :, :] @ flip
    amb = TABLES["group_amb"][aa]
    alt = torch.where(amb[..., None, None] > 0, rot @ torch.diag(torch.tensor([1.0, -1.0, -1.0])), rot)
    p["rigidgroups_gt_frames"] = _to_4x4(rot, trans)
    p["rigidgroups_gt_exists"] = gt_exists
    p["rigidgroups_group_exists"] = group_exists
    p["rigidgroups_group_is_ambiguous"] = amb
    p["rigidgroups_alt_gt_frames"] = _to_4x4(alt, trans)
    return p


def atom37_to_torsion_angles(p: Feats, prefix: str = "") -> Feats:
    aa = torch.clamp(p[prefix + "aatype"].long(), max=20)
    pos, mask = p[prefix + "all_atom_positions"], p[prefix + "all_atom_mask"]
    prev_pos = torch.cat([pos.new_zeros((*pos.shape[:-3], 1, 37, 3)), pos[..., :-1, :, :]], dim=-3)
    prev_mask = torch.cat([mask.new_zeros((*mask.shape[:-2], 1, 37)), mask[..., :-1, :]], dim=-2)
    pre_omega = torch.cat([prev_pos[..., 1:3, :], pos[..., :2, :]], dim=-2)  # CA', C', N, CA
    phi = torch.cat([prev_pos[..., 2:3, :], pos[..., :3, :]], dim=-2)  # C', N, CA, C
    psi = torch.cat([pos[..., :3, :], pos[..., 4:5, :]], dim=-2)  # N, CA, C, O
    pre_omega_mask = prev_mask[..., 1:3].prod(-1) * mask[..., :2].prod(-1)
    phi_mask = prev_mask[..., 2] * mask[..., :3].prod(-1)
    psi_mask = mask[..., :3].prod(-1) * mask[..., 4]
    chi_idx = TABLES["chi_idx"][aa]  # (R, 4, 4)
    flat = chi_idx.reshape(*aa.shape, 16)
    chis = _gather_atoms(pos, flat).reshape(*aa.shape, 4, 4, 3)
    chis_mask = TABLES["chi_mask"][aa] * _gather_atoms(mask, flat).reshape(*aa.shape, 4, 4).prod(-1)
    atoms = torch.cat([pre_omega[..., None, :, :], phi[..., None, :, :], psi[..., None, :, :], chis], dim=-3)
    tmask = torch.cat([pre_omega_mask[..., None], phi_mask[..., None], psi_mask[..., None], chis_mask], dim=-1)
    rot, trans = frames_from_3_points(atoms[..., 1, :], atoms[..., 2, :], atoms[..., 0, :])
    local = torch.einsum("...ji,...j->...i", rot, atoms[..., 3, :] - trans)  # R^T (x - t)
    sc = torch.stack([local[..., 2], local[..., 1]], dim=-1)
    sc = sc / torch.sqrt((sc * sc).sum(-1, keepdim=True) + 1e-8)
    sc = sc * sc.new_tensor([1.0, 1.0, -1.0, 1.0, 1.0, 1.0, 1.0])[:, None]
    mirror = torch.cat([sc.new_ones((*aa.shape, 3)), 1.0 - 2.0 * TABLES["chi_pi"][aa]], dim=-1)
    p[prefix + "torsion_angles_sin_cos"] = sc
    p[prefix + "alt_torsion_angles_sin_cos"] = sc * mirror[..., None]
    p[prefix + "torsion_angles_mask"] = tmask
    return p


def make_pseudo_beta(p: Feats, prefix: str = "") -> Feats:
    aa = p[prefix + "aatype"].long()
    pos, mask = p[prefix + "all_atom_positions"], p[prefix + "all_atom_mask"]
    gly = aa == rc.RESTYPE_ORDER["G"]
    ca, cb = rc.ATOM_ORDER["CA"], rc.ATOM_ORDER["CB"]
    p[prefix + "pseudo_beta"] = torch.where(gly[..., None], pos[..., ca, :], pos[..., cb, :])
    p[prefix + "pseudo_beta_mask"] = torch.where(gly, mask[..., ca], mask[..., cb])
    return p


def backbone_and_chi(p: Feats) -> Feats:
    p["backbone_rigid_tensor"] = p["rigidgroups_gt_frames"][..., 0, :, :]
    p["backbone_rigid_mask"] = p["rigidgroups_gt_exists"][..., 0]
    p["chi_angles_sin_cos"] = p["torsion_angles_sin_cos"][..., 3:, :].to(p["all_atom_mask"].dtype)
    p["chi_mask"] = p["torsion_angles_mask"][..., 3:].to(p["all_atom_mask"].dtype)
    return p
