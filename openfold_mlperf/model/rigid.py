"""Rigid transforms (rotation + translation) as plain tensors, for the structure module and the losses.

A rigid is a pair ``(rot [*, 3, 3], trans [*, 3])`` acting as ``x -> rot @ x + trans``. Quaternions are
(w, x, y, z), scalar first, as in the reference's ``to_tensor_7`` (quaternion then translation).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Rigid:
    rot: torch.Tensor  # [*, 3, 3]
    trans: torch.Tensor  # [*, 3]

    @staticmethod
    def identity(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> "Rigid":
        rot = torch.eye(3, dtype=dtype, device=device).expand(*shape, 3, 3)
        return Rigid(rot, torch.zeros(*shape, 3, dtype=dtype, device=device))

    @staticmethod
    def from_4x4(m: torch.Tensor) -> "Rigid":
        return Rigid(m[..., :3, :3], m[..., :3, 3])

    def to_4x4(self) -> torch.Tensor:
        top = torch.cat([self.rot, self.trans.unsqueeze(-1)], dim=-1)
        bottom = torch.zeros_like(top[..., :1, :])
        bottom[..., 0, 3] = 1.0
        return torch.cat([top, bottom], dim=-2)

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        return torch.einsum("...ij,...j->...i", self.rot, x) + self.trans

    def invert_apply(self, x: torch.Tensor) -> torch.Tensor:
        return torch.einsum("...ji,...j->...i", self.rot, x - self.trans)

    def invert(self) -> "Rigid":
        rot_t = self.rot.transpose(-1, -2)
        return Rigid(rot_t, -torch.einsum("...ij,...j->...i", rot_t, self.trans))

    def compose(self, other: "Rigid") -> "Rigid":
        return Rigid(self.rot @ other.rot, self.apply(other.trans))

    def unsqueeze(self, dim: int) -> "Rigid":
        """Insert a batch dimension at ``dim`` (negative, counted among the batch dimensions)."""
        if dim >= 0:
            raise ValueError(f"Rigid.unsqueeze: dim {dim}: expected a negative batch dimension")
        return Rigid(self.rot.unsqueeze(dim - 2), self.trans.unsqueeze(dim - 1))

    def __getitem__(self, idx: int) -> "Rigid":
        """Select along the last batch dimension."""
        return Rigid(self.rot[..., idx, :, :], self.trans[..., idx, :])

    def scale_translation(self, factor: float) -> "Rigid":
        return Rigid(self.rot, self.trans * factor)

    @staticmethod
    def from_3_points(n: torch.Tensor, ca: torch.Tensor, c: torch.Tensor, eps: float = 1e-8) -> "Rigid":
        """Backbone frame (supplement Algorithm 21): origin CA, x along CA->C, N in the xy plane."""
        e1 = c - ca
        e1 = e1 / torch.sqrt(torch.sum(e1 ** 2, dim=-1, keepdim=True) + eps)
        u2 = n - ca
        u2 = u2 - e1 * torch.sum(e1 * u2, dim=-1, keepdim=True)
        e2 = u2 / torch.sqrt(torch.sum(u2 ** 2, dim=-1, keepdim=True) + eps)
        e3 = torch.cross(e1, e2, dim=-1)
        return Rigid(torch.stack([e1, e2, e3], dim=-1), ca)


def quat_to_rot(q: torch.Tensor) -> torch.Tensor:
    """[*, 4] unit quaternions (w, x, y, z) -> [*, 3, 3] rotation matrices."""
    w, x, y, z = q.unbind(-1)
    rows = [
        w * w + x * x - y * y - z * z, 2 * (x * y - w * z), 2 * (x * z + w * y),
        2 * (x * y + w * z), w * w - x * x + y * y - z * z, 2 * (y * z - w * x),
        2 * (x * z - w * y), 2 * (y * z + w * x), w * w - x * x - y * y + z * z,
    ]
    return torch.stack(rows, dim=-1).view(q.shape[:-1] + (3, 3))


def quat_multiply_by_vec(q: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Hamilton product q * (0, v)."""
    w, x, y, z = q.unbind(-1)
    b, c, d = v.unbind(-1)
    return torch.stack([
        -x * b - y * c - z * d,
        w * b + y * d - z * c,
        w * c - x * d + z * b,
        w * d + x * c - y * b,
    ], dim=-1)


def identity_quat(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    q = torch.zeros(*shape, 4, dtype=dtype, device=device)
    q[..., 0] = 1.0
    return q


def compose_q_update(quat: torch.Tensor, trans: torch.Tensor, update: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Backbone update (supplement Algorithm 23): ``update`` [*, 6] = (b, c, d, t) composes the frame with
    the rotation of the unnormalised quaternion (1, b, c, d) and the translation t (in the old frame)."""
    new_quat = quat + quat_multiply_by_vec(quat, update[..., :3])
    new_quat = new_quat / torch.linalg.vector_norm(new_quat, dim=-1, keepdim=True)
    new_trans = trans + torch.einsum("...ij,...j->...i", quat_to_rot(quat), update[..., 3:])
    return new_quat, new_trans
