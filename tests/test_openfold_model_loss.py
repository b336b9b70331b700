"""OpenFold losses and lDDT-Ca against hand-computed values, the pinned loss weights, and a perfect
prediction scoring zero FAPE/chi error."""
from __future__ import annotations

import math

import pytest
import torch

from hpcbench.workloads.openfold_mlperf import residue_constants as rc
from hpcbench.workloads.openfold_mlperf.model.config import LossConfig
from hpcbench.workloads.openfold_mlperf.model.losses import (compute_fape, distogram_loss, lddt, lddt_ca,
                                                             masked_msa_loss, renamed_ground_truth,
                                                             sidechain_fape, supervised_chi_loss)
from hpcbench.workloads.openfold_mlperf.model.rigid import Rigid, quat_to_rot

from openfold_model_feats import feature_dict, last_iteration


def test_pinned_loss_weights() -> None:
    c = LossConfig()
    assert (c.fape_weight, c.fape_backbone_weight, c.fape_sidechain_weight) == (1.0, 0.5, 0.5)
    assert (c.chi_weight, c.distogram_weight, c.masked_msa_weight, c.plddt_weight) == (1.0, 0.3, 2.0, 0.01)
    assert (c.experimentally_resolved_weight, c.violation_weight) == (0.0, 0.0)
    # docs/closed.md, the OpenFold model table's constants (the reference's LossConfig, initial training)
    assert (c.fape_backbone_clamp, c.fape_backbone_unit, c.fape_sidechain_clamp, c.fape_sidechain_unit,
            c.fape_eps) == (10.0, 10.0, 10.0, 10.0, 1e-4)
    assert (c.chi_chi_weight, c.chi_angle_norm_weight) == (0.5, 0.01)
    assert (c.distogram_bins, c.distogram_min_bin, c.distogram_max_bin) == (64, 2.3125, 21.6875)
    assert (c.plddt_bins, c.plddt_min_resolution, c.plddt_max_resolution, c.plddt_cutoff) == (50, 0.1, 3.0, 15.0)


TRUE = torch.tensor([[0.0, 0.0, 0.0], [3.0, 0.0, 0.0], [0.0, 4.0, 0.0], [20.0, 0.0, 0.0]])
PRED = torch.tensor([[0.0, 0.0, 0.0], [3.7, 0.0, 0.0], [0.0, 4.0, 0.0], [50.0, 9.0, 1.0]])


def test_lddt_hand_computed() -> None:
    """Pairs 1-2 (true 3 A, error 0.7: 3 of 4 thresholds), 1-3 (4 A, error 0: 4/4), 2-3 (5 A, error
    |5.4489 - 5| = 0.449: 4/4). Atom 4 is more than 15 A from every atom in the TRUE structure, so none of
    its pairs is scored however far off it is predicted."""
    mask = torch.ones(4, 1)
    per_res = lddt(PRED, TRUE, mask, cutoff=15.0)
    assert per_res[:3].tolist() == pytest.approx([(0.75 + 1) / 2, (0.75 + 1) / 2, 1.0], abs=1e-6)
    assert float(per_res[3]) == pytest.approx(1.0)  # no scored pair: eps / eps, as the reference
    total = lddt(PRED, TRUE, mask, cutoff=15.0, per_residue=False)
    assert float(total) == pytest.approx((0.75 + 1 + 1) * 2 / 6, abs=1e-6)
    # the thresholds are strict: an error of exactly 1.0 A passes 2 and 4 but not 0.5 and 1
    pred = TRUE.clone()
    pred[1, 0] = 4.0
    assert float(lddt(pred[:2], TRUE[:2], torch.ones(2, 1), per_residue=False)) == pytest.approx(0.5)
    # a masked atom takes no part: only pair 1-3 remains
    m = torch.tensor([[1.0], [0.0], [1.0], [1.0]])
    assert float(lddt(PRED, TRUE, m, per_residue=False)) == pytest.approx(1.0)


def test_lddt_ca_reads_the_ca_atom() -> None:
    true37 = torch.zeros(4, 37, 3)
    pred37 = torch.zeros(4, 37, 3)
    ca = rc.ATOM_ORDER["CA"]
    true37[:, ca], pred37[:, ca] = TRUE, PRED
    pred37[:, rc.ATOM_ORDER["CB"]] = 99.0  # other atoms do not count
    mask37 = torch.zeros(4, 37)
    mask37[:, ca] = 1
    got = lddt_ca(pred37[None], true37[None], mask37[None], eps=1e-8, per_residue=False)
    assert got.shape == (1,) and float(got[0]) == pytest.approx(0.916667, abs=1e-5)


def _rot(axis: int, angle: float) -> torch.Tensor:
    c, s = math.cos(angle), math.sin(angle)
    i, j = [k for k in range(3) if k != axis]
    m = torch.eye(3)
    m[i, i], m[i, j], m[j, i], m[j, j] = c, -s, s, c
    return m


def test_fape_hand_computed_and_clamped() -> None:
    ident = Rigid(torch.eye(3)[None], torch.zeros(1, 3))
    one = torch.ones(1)
    true_pt = torch.tensor([[1.0, 2.0, 3.0]])
    for offset, expected in ((3.0, 0.3), (20.0, 1.0)):  # 3 A / 10 A; 20 A clamped at 10 A -> 1.0
        pred_pt = true_pt + torch.tensor([[0.0, offset, 0.0]])
        f = compute_fape(ident, ident, one, pred_pt, true_pt, one, length_scale=10.0, clamp=10.0, eps=1e-12)
        assert float(f) == pytest.approx(expected, abs=1e-5)
    unclamped = compute_fape(ident, ident, one, true_pt + torch.tensor([[0.0, 20.0, 0.0]]), true_pt, one,
                             length_scale=10.0, clamp=None, eps=1e-12)
    assert float(unclamped) == pytest.approx(2.0, abs=1e-5)
    # two frames, the prediction's second frame rotated by 90 degrees about z: point (1,0,0) of that frame
    # sits at (0,1,0) in the truth frame -> error sqrt(2) for that frame, 0 for the first; mean / 10
    frames_true = Rigid(torch.stack([torch.eye(3), torch.eye(3)]), torch.zeros(2, 3))
    frames_pred = Rigid(torch.stack([torch.eye(3), _rot(2, math.pi / 2)]), torch.zeros(2, 3))
    pt = torch.tensor([[1.0, 0.0, 0.0]])
    f = compute_fape(frames_pred, frames_true, torch.ones(2), pt, pt, torch.ones(1), 10.0, 10.0, eps=1e-12)
    assert float(f) == pytest.approx(math.sqrt(2) / 2 / 10, abs=1e-5)


def test_fape_is_invariant_to_a_global_rigid_motion() -> None:
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(5, 4, generator=gen)
    pred = Rigid(quat_to_rot(q / q.norm(dim=-1, keepdim=True)), torch.randn(5, 3, generator=gen) * 5)
    true = Rigid(torch.eye(3).expand(5, 3, 3), torch.randn(5, 3, generator=gen) * 5)
    pts_p, pts_t = torch.randn(7, 3, generator=gen) * 5, torch.randn(7, 3, generator=gen) * 5
    m5, m7 = torch.ones(5), torch.ones(7)
    base = compute_fape(pred, true, m5, pts_p, pts_t, m7, 10.0, 10.0, 1e-4)
    g = Rigid(_rot(0, 0.7) @ _rot(2, -1.1), torch.tensor([3.0, -2.0, 8.0]))
    moved = compute_fape(g.compose(pred), true, m5, g.apply(pts_p), pts_t, m7, 10.0, 10.0, 1e-4)
    assert float(moved) == pytest.approx(float(base), abs=1e-5)


def test_perfect_prediction_scores_zero_structure_loss() -> None:
    """The ground truth itself, fed back as the prediction (with its symmetric atoms renamed), has zero
    side-chain FAPE (up to the eps floor) and zero chi error."""
    cfg = LossConfig()
    b = last_iteration(feature_dict(n_res=10, n_cycle=1))
    pos = b["atom14_alt_gt_positions"]  # the alternative naming: renaming must pick it up
    renamed = renamed_ground_truth(b, pos)
    amb = b["atom14_atom_is_ambiguous"].sum(-1) > 0
    assert bool((renamed["alt_naming_is_better"][amb] == 1).all())
    frames = b["rigidgroups_alt_gt_frames"][:, None]  # [B, layers=1, R, 8, 4, 4]
    fape = sidechain_fape(frames, pos[:, None], b, renamed, cfg)
    assert float(fape) < 2e-3  # sqrt(eps = 1e-4) / 10 per term
    angles = b["chi_angles_sin_cos"]
    backbone = torch.zeros_like(angles[..., :3, :])
    backbone[..., 1] = 1.0  # unit (sin, cos) so the angle-norm penalty is zero too
    full = torch.cat([backbone, angles], dim=-2)[:, None]
    chi = supervised_chi_loss(full, full, b["aatype"], b["seq_mask"], b["chi_mask"], angles, cfg)
    assert float(chi) < 1e-3
    # a pi-periodic chi predicted rotated by pi is no error
    periodic = torch.tensor(rc.CHI_PI_PERIODIC)[b["aatype"]]
    flipped = angles * (1 - 2 * periodic).unsqueeze(-1)
    full_f = torch.cat([backbone, flipped], dim=-2)[:, None]
    chi_f = supervised_chi_loss(full_f, full_f, b["aatype"], b["seq_mask"], b["chi_mask"], angles, cfg)
    assert float(chi_f) == pytest.approx(float(chi), abs=1e-5)


def _renaming_all_slots(b: dict[str, torch.Tensor], pred: torch.Tensor, eps: float = 1e-10
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Algorithm 26 as the reference writes it: every atom14 slot paired with every slot, 14 x 14."""
    def dists(x: torch.Tensor) -> torch.Tensor:
        return torch.sqrt(eps + torch.sum((x[..., :, :, None, None, :] - x[..., None, None, :, :, :]) ** 2, dim=-1))
    gt, alt = b["atom14_gt_positions"], b["atom14_alt_gt_positions"]
    err = torch.sqrt(eps + (dists(pred) - dists(gt)) ** 2)
    alt_err = torch.sqrt(eps + (dists(pred) - dists(alt)) ** 2)
    exists, amb = b["atom14_gt_exists"], b["atom14_atom_is_ambiguous"]
    mask = (exists * amb)[..., :, :, None, None] * (exists * (1.0 - amb))[..., None, None, :, :]
    gt_sum, alt_sum = torch.sum(mask * err, dim=(-1, -2, -3)), torch.sum(mask * alt_err, dim=(-1, -2, -3))
    return (alt_sum < gt_sum).float(), gt_sum, alt_sum


def test_renaming_over_the_ambiguous_slots_matches_the_14_by_14_sum() -> None:
    """The renaming pairs only the slots that can hold an ambiguous atom with every slot; the reference's
    14 x 14 sum picks the same naming, for predictions near either naming and for random ones, and the
    choice carries no gradient."""
    b = last_iteration(feature_dict(n_res=40, batch=3, seed=4))
    amb = b["atom14_atom_is_ambiguous"].sum(-1) > 0
    assert int(amb.sum()) >= 5  # enough ASP/GLU/PHE/TYR residues to mean something
    gen = torch.Generator().manual_seed(1)
    gt, alt = b["atom14_gt_positions"], b["atom14_alt_gt_positions"]
    for pred in (gt + 0.3 * torch.randn(gt.shape, generator=gen), alt + 0.3 * torch.randn(gt.shape, generator=gen),
                 gt + 3.0 * torch.randn(gt.shape, generator=gen), 0.5 * (gt + alt)):
        pred = pred.requires_grad_(True)
        want, gt_sum, alt_sum = _renaming_all_slots(b, pred.detach())
        got = renamed_ground_truth(b, pred)
        decided = (gt_sum - alt_sum).abs() > 1e-4 * gt_sum.abs().clamp_min(1.0)  # not a tie to rounding
        assert torch.equal(got["alt_naming_is_better"][decided], want[decided])
        assert not any(v.requires_grad for v in got.values())
        ab = want[..., None, None]
        assert torch.equal(got["renamed_atom14_gt_positions"][decided], ((1 - ab) * gt + ab * alt)[decided])


def test_distogram_and_masked_msa_hand_computed() -> None:
    cfg = LossConfig()
    # CB-CB 5 A apart: bin = number of squared edges (linspace(2.3125, 21.6875, 63))^2 below 25
    pb = torch.tensor([[[0.0, 0.0, 0.0], [5.0, 0.0, 0.0]]])
    edges = torch.linspace(2.3125, 21.6875, 63)
    bin_5 = int((edges ** 2 < 25.0).sum())
    assert bin_5 == 9  # edges 2.3125 + k * 0.3125: 9 of them lie below 5 A
    logits = torch.zeros(1, 2, 2, 64)
    logits[0, 0, 1, bin_5] = logits[0, 1, 0, bin_5] = 10.0
    logits[0, 0, 0, 0] = logits[0, 1, 1, 0] = 10.0  # self-distance 0 -> bin 0
    p_right = math.exp(10) / (math.exp(10) + 63)
    got = distogram_loss(logits, pb, torch.ones(1, 2), cfg)
    assert float(got) == pytest.approx(-math.log(p_right), rel=1e-4)
    # masked MSA: uniform logits over 23 classes at 3 masked positions -> log(23)
    true_msa = torch.tensor([[[1, 2], [3, 4]]])
    bert = torch.tensor([[[1.0, 0.0], [1.0, 1.0]]])
    got = masked_msa_loss(torch.zeros(1, 2, 2, 23), true_msa, bert, cfg)
    assert float(got) == pytest.approx(math.log(23), rel=1e-6)
