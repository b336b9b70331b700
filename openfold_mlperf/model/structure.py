"""Structure module (supplement 1.8): invariant point attention, backbone update, angle resnet, and the
conversion of backbone frames + torsion angles into rigid-group frames and atom14 positions.

All eight layers share one set of weights (as in AlphaFold). Geometry runs in the activations' dtype as
in the reference; the attention logits and softmax run in float32.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from .. import residue_constants as rc
from .config import StructureConfig
from .primitives import LayerNorm, Linear, softmax32
from .rigid import Rigid, compose_q_update, identity_quat, quat_to_rot

_SOFTPLUS_INV_1 = 0.541324854612918  # softplus^-1(1): point weights start at 1


class InvariantPointAttention(nn.Module):
    """Algorithm 22."""

    def __init__(self, c_s: int, c_z: int, c_hidden: int, num_heads: int, num_qk_points: int,
                 num_v_points: int, inf: float, eps: float) -> None:
        super().__init__()
        self.c_z, self.c_hidden, self.num_heads = c_z, c_hidden, num_heads
        self.num_qk_points, self.num_v_points, self.inf, self.eps = num_qk_points, num_v_points, inf, eps
        hc = c_hidden * num_heads
        self.linear_q = Linear(c_s, hc)
        self.linear_kv = Linear(c_s, 2 * hc)
        self.linear_q_points = Linear(c_s, num_heads * num_qk_points * 3)
        self.linear_kv_points = Linear(c_s, num_heads * (num_qk_points + num_v_points) * 3)
        self.linear_b = Linear(c_z, num_heads)
        self.head_weights = nn.Parameter(torch.full((num_heads,), _SOFTPLUS_INV_1))
        self.linear_out = Linear(num_heads * (c_z + c_hidden + num_v_points * 4), c_s, init="final")

    def _points(self, x: torch.Tensor, r: Rigid, n_points: int) -> torch.Tensor:
        # [B, R, H*P*3] laid out as 3 blocks (x, y, z) of H*P -> global points [B, R, H, P, 3]
        x = torch.stack(torch.split(x, x.shape[-1] // 3, dim=-1), dim=-1)
        x = r.unsqueeze(-1).apply(x)
        return x.view(x.shape[:-2] + (self.num_heads, n_points, 3))

    def forward(self, s: torch.Tensor, z: torch.Tensor, r: Rigid, mask: torch.Tensor) -> torch.Tensor:
        h, c = self.num_heads, self.c_hidden
        q = self.linear_q(s).view(s.shape[:-1] + (h, c))
        k, v = torch.split(self.linear_kv(s).view(s.shape[:-1] + (h, 2 * c)), c, dim=-1)
        q_pts = self._points(self.linear_q_points(s), r, self.num_qk_points)
        kv_pts = self._points(self.linear_kv_points(s), r, self.num_qk_points + self.num_v_points)
        k_pts, v_pts = torch.split(kv_pts, (self.num_qk_points, self.num_v_points), dim=-2)
        b = self.linear_b(z)  # [B, R, R, H]

        a = torch.matmul(q.float().movedim(-3, -2), k.float().movedim(-3, -1))  # [B, H, R, R]
        a = a * math.sqrt(1.0 / (3 * c)) + math.sqrt(1.0 / 3) * b.float().movedim(-1, -3)
        d2 = torch.sum((q_pts.unsqueeze(-4) - k_pts.unsqueeze(-5)).float() ** 2, dim=-1)  # [B,R,R,H,P]
        w = F.softplus(self.head_weights.float()) * math.sqrt(1.0 / (3 * (self.num_qk_points * 9.0 / 2)))
        pt = -0.5 * torch.sum(d2 * w.view(h, 1), dim=-1)  # [B, R, R, H]
        sq_mask = (mask.unsqueeze(-1) * mask.unsqueeze(-2)).float()
        a = a + pt.movedim(-1, -3) + ((sq_mask - 1.0) * self.inf).unsqueeze(-3)
        a = softmax32(a).to(s.dtype)  # [B, H, R, R]

        o = torch.matmul(a, v.transpose(-2, -3)).transpose(-2, -3)  # [B, R, H, C]
        o = o.reshape(o.shape[:-2] + (h * c,))
        # weighted sum of value points in the global frame, back into the local frame
        o_pt = torch.einsum("bhij,bjhpx->bihpx", a, v_pts)  # [B, R, H, Pv, 3]
        o_pt = r.unsqueeze(-1).unsqueeze(-1).invert_apply(o_pt)
        o_pt_norm = torch.sqrt(torch.sum(o_pt ** 2, dim=-1) + self.eps).reshape(o.shape[:-1] + (-1,))
        o_pt = o_pt.reshape(o_pt.shape[:-3] + (-1, 3))
        o_pair = torch.matmul(a.transpose(-2, -3), z.to(a.dtype))  # [B, R, H, c_z]
        o_pair = o_pair.reshape(o_pair.shape[:-2] + (h * self.c_z,))
        return self.linear_out(torch.cat([o, *torch.unbind(o_pt, dim=-1), o_pt_norm, o_pair], dim=-1))


class BackboneUpdate(nn.Module):
    def __init__(self, c_s: int) -> None:
        super().__init__()
        self.linear = Linear(c_s, 6, init="final")

    def forward(self, s: torch.Tensor) -> torch.Tensor:
        return self.linear(s)


class SingleTransition(nn.Module):
    def __init__(self, c_s: int, dropout_rate: float) -> None:
        super().__init__()
        self.linear_1 = Linear(c_s, c_s, init="relu")
        self.linear_2 = Linear(c_s, c_s, init="relu")
        self.linear_3 = Linear(c_s, c_s, init="final")
        self.dropout = nn.Dropout(dropout_rate)
        self.layer_norm = LayerNorm(c_s)

    def forward(self, s: torch.Tensor) -> torch.Tensor:
        s = s + self.linear_3(torch.relu(self.linear_2(torch.relu(self.linear_1(s)))))
        return self.layer_norm(self.dropout(s))


class AngleResnetBlock(nn.Module):
    def __init__(self, c_hidden: int) -> None:
        super().__init__()
        self.linear_1 = Linear(c_hidden, c_hidden, init="relu")
        self.linear_2 = Linear(c_hidden, c_hidden, init="final")

    def forward(self, a: torch.Tensor) -> torch.Tensor:
        return a + self.linear_2(torch.relu(self.linear_1(torch.relu(a))))


class AngleResnet(nn.Module):
    """Torsion angles (omega, phi, psi, chi1..4) as unnormalised and unit (sin, cos) pairs."""

    def __init__(self, c_s: int, c_hidden: int, num_blocks: int, num_angles: int, eps: float) -> None:
        super().__init__()
        self.num_angles, self.eps = num_angles, eps
        self.linear_in = Linear(c_s, c_hidden)
        self.linear_initial = Linear(c_s, c_hidden)
        self.layers = nn.ModuleList([AngleResnetBlock(c_hidden) for _ in range(num_blocks)])
        self.linear_out = Linear(c_hidden, num_angles * 2)

    def forward(self, s: torch.Tensor, s_initial: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a = self.linear_in(torch.relu(s)) + self.linear_initial(torch.relu(s_initial))
        for layer in self.layers:
            a = layer(a)
        a = self.linear_out(torch.relu(a)).view(s.shape[:-1] + (self.num_angles, 2))
        norm = torch.sqrt(torch.clamp(torch.sum(a ** 2, dim=-1, keepdim=True), min=self.eps))
        return a, a / norm


def torsion_angles_to_frames(bb: Rigid, angles: torch.Tensor, aatype: torch.Tensor,
                             default_frames: torch.Tensor) -> Rigid:
    """Algorithm 24: the 8 rigid-group frames [B, R, 8] in the global frame from the backbone frames and
    the 7 torsion angles (sin, cos) [B, R, 7, 2]."""
    default = Rigid.from_4x4(default_frames[aatype])  # [B, R, 8]
    sc = torch.cat([torch.stack([torch.zeros_like(angles[..., 0, 0]), torch.ones_like(angles[..., 0, 0])],
                                dim=-1).unsqueeze(-2), angles], dim=-2)  # [B, R, 8, 2] (backbone: 0)
    sin, cos = sc[..., 0], sc[..., 1]
    zero, one = torch.zeros_like(sin), torch.ones_like(sin)
    rot_x = torch.stack([one, zero, zero, zero, cos, -sin, zero, sin, cos], dim=-1).view(sin.shape + (3, 3))
    local = default.compose(Rigid(rot_x, torch.zeros_like(default.trans)))  # group -> parent
    # chi2..chi4 hang off the previous chi group; the others off the backbone
    chi1 = local[4]
    chi2 = chi1.compose(local[5])
    chi3 = chi2.compose(local[6])
    chi4 = chi3.compose(local[7])
    rot = torch.cat([local.rot[..., :5, :, :], chi2.rot.unsqueeze(-3), chi3.rot.unsqueeze(-3),
                     chi4.rot.unsqueeze(-3)], dim=-3)
    trans = torch.cat([local.trans[..., :5, :], chi2.trans.unsqueeze(-2), chi3.trans.unsqueeze(-2),
                       chi4.trans.unsqueeze(-2)], dim=-2)
    return bb.unsqueeze(-1).compose(Rigid(rot, trans))


def frames_to_atom14(frames: Rigid, aatype: torch.Tensor, group_idx: torch.Tensor,
                     atom_mask: torch.Tensor, lit_positions: torch.Tensor) -> torch.Tensor:
    """Algorithm 24 lines 10-11: each atom14 atom's ideal position in its group's global frame."""
    onehot = F.one_hot(group_idx[aatype], num_classes=8).to(frames.rot.dtype)  # [B, R, 14, 8]
    rot = torch.einsum("brag,brgij->braij", onehot, frames.rot)
    trans = torch.einsum("brag,brgi->brai", onehot, frames.trans)
    pos = Rigid(rot, trans).apply(lit_positions[aatype])
    return pos * atom_mask[aatype].unsqueeze(-1)


class StructureModule(nn.Module):
    def __init__(self, cfg: StructureConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.layer_norm_s = LayerNorm(cfg.c_s)
        self.layer_norm_z = LayerNorm(cfg.c_z)
        self.linear_in = Linear(cfg.c_s, cfg.c_s)
        self.ipa = InvariantPointAttention(cfg.c_s, cfg.c_z, cfg.c_hidden_ipa, cfg.num_heads_ipa,
                                           cfg.num_qk_points, cfg.num_v_points, cfg.inf, cfg.eps)
        self.ipa_dropout = nn.Dropout(cfg.dropout_rate)
        self.layer_norm_ipa = LayerNorm(cfg.c_s)
        self.transition = SingleTransition(cfg.c_s, cfg.dropout_rate)
        self.bb_update = BackboneUpdate(cfg.c_s)
        self.angle_resnet = AngleResnet(cfg.c_s, cfg.c_hidden_ang_res, cfg.num_ang_res_blocks,
                                        cfg.num_angles, cfg.eps)
        tables = {
            "default_frames": (rc.RESTYPE_RIGID_GROUP_DEFAULT_FRAME, torch.float32),
            "group_idx": (rc.RESTYPE_ATOM14_TO_RIGID_GROUP, torch.int64),
            "atom_mask": (rc.RESTYPE_ATOM14_MASK, torch.float32),
            "lit_positions": (rc.RESTYPE_ATOM14_RIGID_GROUP_POSITIONS, torch.float32),
        }
        for name, (arr, dtype) in tables.items():  # not in the state dict (the reference's are not either)
            self.register_buffer(name, torch.tensor(np.asarray(arr), dtype=dtype), persistent=False)

    def forward(self, s: torch.Tensor, z: torch.Tensor, mask: torch.Tensor, aatype: torch.Tensor
                ) -> dict[str, torch.Tensor]:
        cfg = self.cfg
        s = self.layer_norm_s(s)
        z = self.layer_norm_z(z)
        s_initial = s
        s = self.linear_in(s)
        quat = identity_quat(s.shape[:-1], s.dtype, s.device)
        trans = torch.zeros(s.shape[:-1] + (3,), dtype=s.dtype, device=s.device)
        dt = s.dtype
        default_frames, lit = self.default_frames.to(dt), self.lit_positions.to(dt)
        outs: dict[str, list[torch.Tensor]] = {k: [] for k in (
            "sm_frames", "sm_sidechain_frames", "sm_unnormalized_angles", "sm_angles", "sm_positions",
            "sm_states")}
        for _ in range(cfg.num_blocks):
            r = Rigid(quat_to_rot(quat), trans)
            s = s + self.ipa(s, z, r, mask)
            s = self.layer_norm_ipa(self.ipa_dropout(s))
            s = self.transition(s)
            quat, trans = compose_q_update(quat, trans, self.bb_update(s))
            bb = Rigid(quat_to_rot(quat), trans * cfg.scale_factor)
            unnorm, angles = self.angle_resnet(s, s_initial)
            frames = torsion_angles_to_frames(bb, angles, aatype, default_frames)
            pos = frames_to_atom14(frames, aatype, self.group_idx, self.atom_mask.to(dt), lit)
            outs["sm_frames"].append(torch.cat([quat, trans * cfg.scale_factor], dim=-1))
            outs["sm_sidechain_frames"].append(frames.to_4x4())
            outs["sm_unnormalized_angles"].append(unnorm)
            outs["sm_angles"].append(angles)
            outs["sm_positions"].append(pos)
            outs["sm_states"].append(s)
            quat = quat.detach()  # no gradient through the rotations into the next layer (supplement 1.8.2)
        out = {k: torch.stack(v, dim=1) for k, v in outs.items()}
        out["sm_single"] = s
        return out


def atom14_to_atom37(atom14: torch.Tensor, residx_atom37_to_atom14: torch.Tensor,
                     atom37_atom_exists: torch.Tensor) -> torch.Tensor:
    """[B, R, 14, 3] -> [B, R, 37, 3] through the per-residue index map, zero where no atom exists."""
    idx = residx_atom37_to_atom14.long().unsqueeze(-1).expand(residx_atom37_to_atom14.shape + (3,))
    return torch.gather(atom14, -2, idx) * atom37_atom_exists.unsqueeze(-1).to(atom14.dtype)
