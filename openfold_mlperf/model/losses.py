"""Training losses of the reference's ``AlphaFoldLoss`` (initial training stage) and the lDDT-Ca metric.

Weights (closed_openfold.yaml): FAPE 1.0 (backbone 0.5 + side chain 0.5, clamped at 10 A, 10 A unit),
supervised chi 1.0, distogram 0.3, masked MSA 2.0, pLDDT 0.01. Experimentally-resolved and violation
terms have weight 0 in this stage and TM is disabled, so they are not computed. The total is scaled by
sqrt(min(seq_length, crop size)) and averaged over the batch, as the reference does.

Inputs are the model outputs and the feature dict of the LAST recycling iteration (batch first, the
recycling dimension already taken off: ``{k: v[..., -1]}``).
"""
from __future__ import annotations

from typing import Mapping, Optional

import numpy as np
import torch
import torch.nn.functional as F

from .. import residue_constants as rc
from .config import LossConfig
from .rigid import Rigid, quat_to_rot

#: the batch features the losses read (last recycling iteration)
LOSS_FEATURES: tuple[str, ...] = (
    "aatype", "seq_mask", "seq_length", "backbone_rigid_tensor", "backbone_rigid_mask",
    "rigidgroups_gt_frames", "rigidgroups_alt_gt_frames", "rigidgroups_gt_exists",
    "atom14_gt_positions", "atom14_alt_gt_positions", "atom14_gt_exists", "atom14_alt_gt_exists",
    "atom14_atom_is_ambiguous", "chi_angles_sin_cos", "chi_mask", "pseudo_beta", "pseudo_beta_mask",
    "true_msa", "bert_mask", "all_atom_positions", "all_atom_mask", "resolution",
)


def _softmax_ce(logits: torch.Tensor, labels: torch.Tensor, n: int) -> torch.Tensor:
    return -torch.sum(F.one_hot(labels.long(), n) * torch.log_softmax(logits.float(), dim=-1), dim=-1)


def compute_fape(pred_frames: Rigid, target_frames: Rigid, frames_mask: torch.Tensor,
                 pred_positions: torch.Tensor, target_positions: torch.Tensor, positions_mask: torch.Tensor,
                 length_scale: float, clamp: Optional[float], eps: float) -> torch.Tensor:
    """Frame aligned point error (Algorithm 28): frames [*, F], positions [*, P, 3] -> [*]."""
    local_pred = pred_frames.invert().unsqueeze(-1).apply(pred_positions.unsqueeze(-3))
    local_true = target_frames.invert().unsqueeze(-1).apply(target_positions.unsqueeze(-3))
    err = torch.sqrt(torch.sum((local_pred - local_true) ** 2, dim=-1) + eps)  # [*, F, P]
    if clamp is not None:
        err = torch.clamp(err, min=0.0, max=clamp)
    err = err / length_scale * frames_mask.unsqueeze(-1) * positions_mask.unsqueeze(-2)
    err = torch.sum(err, dim=-1) / (eps + torch.sum(frames_mask, dim=-1)).unsqueeze(-1)
    return torch.sum(err, dim=-1) / (eps + torch.sum(positions_mask, dim=-1))


def backbone_fape(sm_frames: torch.Tensor, backbone_rigid_tensor: torch.Tensor,
                  backbone_rigid_mask: torch.Tensor, use_clamped_fape: Optional[torch.Tensor],
                  cfg: LossConfig) -> torch.Tensor:
    """Backbone FAPE averaged over the structure-module layers: sm_frames [B, L, R, 7] -> [B].
    ``use_clamped_fape`` [B] mixes clamped and unclamped as the reference does (0.9 of samples clamped)."""
    pred = Rigid(quat_to_rot(sm_frames[..., :4]), sm_frames[..., 4:])  # [B, L, R]
    gt = Rigid.from_4x4(backbone_rigid_tensor.unsqueeze(1))  # [B, 1, R], broadcast over the layers
    mask = backbone_rigid_mask.unsqueeze(1)
    clamped = compute_fape(pred, gt, mask, pred.trans, gt.trans, mask, cfg.fape_backbone_unit,
                           cfg.fape_backbone_clamp, cfg.fape_eps)
    if use_clamped_fape is not None:
        unclamped = compute_fape(pred, gt, mask, pred.trans, gt.trans, mask, cfg.fape_backbone_unit,
                                 None, cfg.fape_eps)
        u = use_clamped_fape.to(clamped.dtype).unsqueeze(-1)
        clamped = clamped * u + unclamped * (1 - u)
    return torch.mean(clamped, dim=1)


def _ambiguous_slots() -> slice:
    slots = np.flatnonzero(rc.RESTYPE_ATOM14_AMBIGUOUS_ATOMS.any(axis=0))
    return slice(int(slots[0]), int(slots[-1]) + 1)


#: the atom14 slots that any residue type marks ambiguous (ASP, GLU, PHE, TYR: slots 6..9). Only these can be
#: the first atom of a term of Algorithm 26's sum; every other slot's terms are masked zeros.
_AMBIGUOUS_SLOTS = _ambiguous_slots()


@torch.no_grad()
def renamed_ground_truth(batch: Mapping[str, torch.Tensor], atom14_pred: torch.Tensor, eps: float = 1e-10
                         ) -> dict[str, torch.Tensor]:
    """Algorithm 26: per residue, the naming of symmetric atoms (ASP, GLU, PHE, TYR) that better matches
    the prediction's distances to the non-ambiguous atoms. The choice is a comparison, so nothing here
    carries a gradient (the reference's result is the same constant): it runs without autograd, and the
    sum takes its ambiguous atom from the slots that can hold one (:data:`_AMBIGUOUS_SLOTS`): the terms left
    out are those the mask zeroes, so the sums hold the same terms (a 14 x 14 pairing costs 3.5x more)."""
    amb_slots = _AMBIGUOUS_SLOTS

    def dists(x: torch.Tensor) -> torch.Tensor:  # [B, R, 14, 3] -> [B, R, A, R, 14] (A: the ambiguous slots)
        left = x[..., :, amb_slots, None, None, :]
        return torch.sqrt(eps + torch.sum((left - x[..., None, None, :, :, :]) ** 2, dim=-1))
    pred_d = dists(atom14_pred.detach())
    gt, alt = batch["atom14_gt_positions"], batch["atom14_alt_gt_positions"]
    err = torch.sqrt(eps + (pred_d - dists(gt)) ** 2)
    alt_err = torch.sqrt(eps + (pred_d - dists(alt)) ** 2)
    exists, amb = batch["atom14_gt_exists"], batch["atom14_atom_is_ambiguous"]
    mask = (exists * amb)[..., :, amb_slots, None, None] * (exists * (1.0 - amb))[..., None, None, :, :]
    alt_better = (torch.sum(mask * alt_err, dim=(-1, -2, -3)) < torch.sum(mask * err, dim=(-1, -2, -3)))
    alt_better = alt_better.to(atom14_pred.dtype)
    ab = alt_better[..., None, None]
    return {
        "alt_naming_is_better": alt_better,
        "renamed_atom14_gt_positions": (1.0 - ab) * gt + ab * alt,
        "renamed_atom14_gt_exists": (1.0 - alt_better[..., None]) * exists
        + alt_better[..., None] * batch["atom14_alt_gt_exists"],
    }


def sidechain_fape(sm_sidechain_frames: torch.Tensor, sm_positions: torch.Tensor,
                   batch: Mapping[str, torch.Tensor], renamed: Mapping[str, torch.Tensor],
                   cfg: LossConfig) -> torch.Tensor:
    """All-atom FAPE of the last layer over all rigid-group frames and atom14 atoms -> [B]."""
    b = sm_positions.shape[0]
    alt_better = renamed["alt_naming_is_better"][..., None, None, None]
    gt_frames = (1.0 - alt_better) * batch["rigidgroups_gt_frames"] + alt_better * batch["rigidgroups_alt_gt_frames"]
    pred = Rigid.from_4x4(sm_sidechain_frames[:, -1].reshape(b, -1, 4, 4))
    gt = Rigid.from_4x4(gt_frames.reshape(b, -1, 4, 4))
    return compute_fape(pred, gt, batch["rigidgroups_gt_exists"].reshape(b, -1),
                        sm_positions[:, -1].reshape(b, -1, 3),
                        renamed["renamed_atom14_gt_positions"].reshape(b, -1, 3),
                        renamed["renamed_atom14_gt_exists"].reshape(b, -1),
                        cfg.fape_sidechain_unit, cfg.fape_sidechain_clamp, cfg.fape_eps)


def _masked_mean(mask: torch.Tensor, value: torch.Tensor, dim: tuple[int, ...], eps: float = 1e-4
                 ) -> torch.Tensor:
    mask = mask.expand(value.shape)
    return torch.sum(mask * value, dim=dim) / (eps + torch.sum(mask, dim=dim))


def supervised_chi_loss(angles: torch.Tensor, unnormalized: torch.Tensor, aatype: torch.Tensor,
                        seq_mask: torch.Tensor, chi_mask: torch.Tensor, chi_sin_cos: torch.Tensor,
                        cfg: LossConfig) -> torch.Tensor:
    """Algorithm 27 over all layers: angles [B, L, R, 7, 2] -> [B]. pi-periodic chis score the nearer
    of the two equivalent targets; plus the angle-norm penalty on the unnormalised outputs."""
    pred = angles[..., 3:, :]  # chi1..chi4
    periodic = angles.new_tensor(rc.CHI_PI_PERIODIC)[aatype.long()]  # [B, R, 4]
    true = chi_sin_cos.unsqueeze(1)  # [B, 1, R, 4, 2]
    shifted = (1 - 2 * periodic).unsqueeze(-1).unsqueeze(1) * true
    err = torch.minimum(torch.sum((true - pred) ** 2, dim=-1), torch.sum((shifted - pred) ** 2, dim=-1))
    loss = cfg.chi_chi_weight * _masked_mean(chi_mask.unsqueeze(1), err, dim=(-1, -2, -3))
    norm = torch.sqrt(torch.sum(unnormalized ** 2, dim=-1) + cfg.chi_eps)
    norm_loss = _masked_mean(seq_mask[:, None, :, None], torch.abs(norm - 1.0), dim=(-1, -2, -3))
    return loss + cfg.chi_angle_norm_weight * norm_loss


def distogram_loss(logits: torch.Tensor, pseudo_beta: torch.Tensor, pseudo_beta_mask: torch.Tensor,
                   cfg: LossConfig) -> torch.Tensor:
    """Cross entropy of the 64-bin CB-CB distogram (edges 2.3125..21.6875 A) -> [B]."""
    edges = torch.linspace(cfg.distogram_min_bin, cfg.distogram_max_bin, cfg.distogram_bins - 1,
                           device=logits.device) ** 2
    d2 = torch.sum((pseudo_beta.unsqueeze(-2) - pseudo_beta.unsqueeze(-3)) ** 2, dim=-1, keepdim=True)
    labels = torch.sum(d2 > edges, dim=-1)
    err = _softmax_ce(logits, labels, cfg.distogram_bins)
    sq = pseudo_beta_mask.unsqueeze(-1) * pseudo_beta_mask.unsqueeze(-2)
    return torch.sum(err * sq, dim=(-1, -2)) / (cfg.distogram_eps + torch.sum(sq, dim=(-1, -2)))


def masked_msa_loss(logits: torch.Tensor, true_msa: torch.Tensor, bert_mask: torch.Tensor,
                    cfg: LossConfig) -> torch.Tensor:
    """Cross entropy at the BERT-masked MSA positions (23 classes) -> [B]."""
    err = _softmax_ce(logits, true_msa, rc.MSA_NUM_CLASSES)
    scale = 0.5  # the reference's normalisation: (sum / (eps + 0.5 * count)) * 0.5
    return torch.sum(err * bert_mask, dim=(-1, -2)) / (
        cfg.masked_msa_eps + torch.sum(scale * bert_mask, dim=(-1, -2))) * scale


def lddt(pred: torch.Tensor, true: torch.Tensor, mask: torch.Tensor, cutoff: float = 15.0,
         eps: float = 1e-10, per_residue: bool = True) -> torch.Tensor:
    """lDDT as the reference computes it: pairs (i != j, both present) whose TRUE distance is below
    ``cutoff`` score the fraction of thresholds 0.5/1/2/4 A that |d_true - d_pred| stays under.
    pred/true [*, N, 3], mask [*, N, 1] -> [*, N] (per residue) or [*]."""
    n = mask.shape[-2]
    d_true = torch.sqrt(eps + torch.sum((true.unsqueeze(-2) - true.unsqueeze(-3)) ** 2, dim=-1))
    d_pred = torch.sqrt(eps + torch.sum((pred.unsqueeze(-2) - pred.unsqueeze(-3)) ** 2, dim=-1))
    scored = (d_true < cutoff) * mask * mask.transpose(-1, -2) * (1.0 - torch.eye(n, device=mask.device))
    l1 = torch.abs(d_true - d_pred)
    score = 0.25 * ((l1 < 0.5).to(l1.dtype) + (l1 < 1.0).to(l1.dtype) + (l1 < 2.0).to(l1.dtype)
                    + (l1 < 4.0).to(l1.dtype))
    dims = (-1,) if per_residue else (-2, -1)
    return (eps + torch.sum(scored * score, dim=dims)) / (eps + torch.sum(scored, dim=dims))


def lddt_ca(pred_atom37: torch.Tensor, true_atom37: torch.Tensor, atom37_mask: torch.Tensor,
            cutoff: float = 15.0, eps: float = 1e-10, per_residue: bool = True) -> torch.Tensor:
    """lDDT over CA atoms of atom37 coordinates; the validation metric is
    ``lddt_ca(..., eps=1e-8, per_residue=False)`` per sample (the reference's compute_validation_metrics)."""
    ca = rc.ATOM_ORDER["CA"]
    return lddt(pred_atom37[..., ca, :], true_atom37[..., ca, :], atom37_mask[..., ca:ca + 1],
                cutoff=cutoff, eps=eps, per_residue=per_residue)


def plddt_loss(logits: torch.Tensor, pred_atom37: torch.Tensor, batch: Mapping[str, torch.Tensor],
               cfg: LossConfig) -> torch.Tensor:
    """Cross entropy of the pLDDT head against the binned per-residue lDDT-Ca of the final structure,
    for samples with resolution in [0.1, 3.0] A -> [B]."""
    ca = rc.ATOM_ORDER["CA"]
    score = lddt(pred_atom37[..., ca, :].detach(), batch["all_atom_positions"][..., ca, :],
                 batch["all_atom_mask"][..., ca:ca + 1], cutoff=cfg.plddt_cutoff, eps=cfg.plddt_eps)
    bins = torch.clamp(torch.floor(score * cfg.plddt_bins).long(), max=cfg.plddt_bins - 1)
    err = _softmax_ce(logits, bins, cfg.plddt_bins)
    m = batch["all_atom_mask"][..., ca]
    loss = torch.sum(err * m, dim=-1) / (cfg.plddt_eps + torch.sum(m, dim=-1))
    res = batch["resolution"]
    return loss * ((res >= cfg.plddt_min_resolution) & (res <= cfg.plddt_max_resolution)).to(loss.dtype)


def alphafold_loss(outputs: Mapping[str, torch.Tensor], batch: Mapping[str, torch.Tensor], cfg: LossConfig
                   ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The scaled weighted total (a scalar to backpropagate) and the detached per-term batch means."""
    missing = [k for k in LOSS_FEATURES if k not in batch]
    if missing:
        raise KeyError(f"loss features: missing {', '.join(missing)} (last recycling iteration, batch first)")
    renamed = renamed_ground_truth(batch, outputs["sm_positions"][:, -1])
    bb = backbone_fape(outputs["sm_frames"], batch["backbone_rigid_tensor"], batch["backbone_rigid_mask"],
                       batch.get("use_clamped_fape"), cfg)
    sc = sidechain_fape(outputs["sm_sidechain_frames"], outputs["sm_positions"], batch, renamed, cfg)
    terms = {
        "fape": bb * cfg.fape_backbone_weight + sc * cfg.fape_sidechain_weight,
        "supervised_chi": supervised_chi_loss(outputs["sm_angles"], outputs["sm_unnormalized_angles"],
                                              batch["aatype"], batch["seq_mask"], batch["chi_mask"],
                                              batch["chi_angles_sin_cos"], cfg),
        "distogram": distogram_loss(outputs["distogram_logits"], batch["pseudo_beta"],
                                    batch["pseudo_beta_mask"], cfg),
        "masked_msa": masked_msa_loss(outputs["masked_msa_logits"], batch["true_msa"], batch["bert_mask"], cfg),
        "plddt_loss": plddt_loss(outputs["lddt_logits"], outputs["final_atom_positions"], batch, cfg),
    }
    dropped: list[str] = []
    weights = {"fape": cfg.fape_weight, "supervised_chi": cfg.chi_weight, "distogram": cfg.distogram_weight,
               "masked_msa": cfg.masked_msa_weight, "plddt_loss": cfg.plddt_weight}
    weighted = []
    for name, value in terms.items():
        w = value * weights[name]
        if not bool(torch.isfinite(w).all()):
            # as the reference: a non-finite term is replaced by zero (no gradient) and reported
            dropped.append(name)
            w = torch.zeros_like(w.detach())
        weighted.append(w)
    total = torch.stack(weighted).sum(dim=0)
    seq_length = batch["seq_length"].to(total.dtype)
    crop = torch.full_like(seq_length, float(batch["aatype"].shape[1]))
    scaled = torch.sqrt(torch.minimum(seq_length, crop)) * total
    report = {k: v.detach().mean() for k, v in terms.items()}
    report["weighted_total_loss"] = total.detach().mean()
    report["scaled_weighted_total_loss"] = scaled.detach().mean()
    report["nonfinite_terms"] = torch.tensor(float(len(dropped)))
    return scaled.mean(), report
