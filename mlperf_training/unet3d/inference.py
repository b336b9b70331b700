"""Sliding-window evaluation of a whole case, as the reference's ``sliding_window_inference``.

Windows of ``roi`` voxels move with stride ``roi * (1 - overlap)``. As the reference: a border
remainder smaller than half a stride is trimmed off the volume (and its label) evenly on both sides;
the volume is then padded with ``padding_value`` (evenly) to a size the windows tile; each window's
logits are weighted by a Gaussian importance map and summed, and the sum is divided by the summed
weights. The map is the reference's: a 1-D Gaussian of ``sigma = 0.125 * roi`` over ``roi`` points,
its outer cube, the cube root, scaled to a maximum of 1.

The reference never meets a case smaller than the window (its preprocessing pads every case to at
least 128 per axis); an axis under half a stride would be trimmed to nothing and score a perfect Dice,
so :func:`sliding_window` refuses it (:class:`~.dataset.EvalCases` refuses, naming the file, any
validation case smaller than the window).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from hpcbench.common.errors import DataError


def gaussian_map(n: int, sigma_scale: float = 0.125, device: torch.device | None = None) -> torch.Tensor:
    """(n, n, n) importance weights, 1 at the centre (the reference's ``gaussian_kernel``)."""
    k = torch.arange(n, dtype=torch.float64, device=device) - (n - 1) / 2.0
    g = torch.exp(-0.5 * (k / (sigma_scale * n)) ** 2)
    cube = g[:, None, None] * g[None, :, None] * g[None, None, :]
    cube = torch.pow(cube, 1.0 / 3.0)
    return (cube / cube.max()).to(torch.float32)


def strides_of(roi: Sequence[int], overlap: float) -> list[int]:
    return [max(1, int(r * (1 - overlap))) for r in roi]


def trim_bounds(shape: Sequence[int], strides: Sequence[int]) -> list[tuple[int, int]]:
    """(start, stop) per axis after trimming a remainder smaller than half a stride."""
    out = []
    for s, st in zip(shape, strides):
        b = s % st
        b = b if b < st // 2 else 0
        out.append((b // 2, s - (b - b // 2)))
    return out


def pad_amounts(shape: Sequence[int], roi: Sequence[int], strides: Sequence[int]) -> list[tuple[int, int]]:
    """(before, after) padding per axis so that windows of ``roi`` at ``strides`` tile the volume."""
    out = []
    for s, r, st in zip(shape, roi, strides):
        b = (st - s % st) % st
        while s + b < r:
            b += st
        out.append((b // 2, b - b // 2))
    return out


def sliding_window(model: Callable[[torch.Tensor], torch.Tensor], image: torch.Tensor, label: torch.Tensor,
                   roi: Sequence[int], overlap: float = 0.5, padding_value: float = -2.2, classes: int = 3,
                   batch: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits (1, classes, D', H', W'), label (1, 1, D', H', W')) of one case (1, 1, D, H, W); D' <= D
    where a small border remainder was trimmed. ``batch`` windows go through the model at once."""
    strides = strides_of(roi, overlap)
    bounds = trim_bounds(image.shape[2:], strides)
    if any(b <= a for a, b in bounds):  # never score an emptied volume (empty vs empty is a perfect Dice)
        raise DataError(f"unet3d evaluation: a case of {tuple(image.shape[2:])} voxels is thinner than half the "
                        f"window stride {tuple(strides)} on an axis, which the reference's border trim would cut to "
                        f"nothing; every validation case must be at least the window {tuple(roi)} (data.roi) per axis")
    (a0, b0), (a1, b1), (a2, b2) = bounds
    image, label = image[..., a0:b0, a1:b1, a2:b2], label[..., a0:b0, a1:b1, a2:b2]
    kept = image.shape[2:]
    pads = pad_amounts(kept, roi, strides)
    flat = [p for axis in reversed(pads) for p in axis]  # F.pad wants the last axis first
    padded = F.pad(image, flat, mode="constant", value=padding_value)
    shape = padded.shape[2:]
    weight = gaussian_map(roi[0], device=image.device)
    result = torch.zeros((1, classes, *shape), dtype=torch.float32, device=image.device)
    norm = torch.zeros(shape, dtype=torch.float32, device=image.device)
    corners = [(i, j, k)
               for i in range(0, shape[0] - roi[0] + 1, strides[0])
               for j in range(0, shape[1] - roi[1] + 1, strides[1])
               for k in range(0, shape[2] - roi[2] + 1, strides[2])]
    for start in range(0, len(corners), batch):
        group = corners[start:start + batch]
        x = torch.cat([padded[..., i:i + roi[0], j:j + roi[1], k:k + roi[2]] for i, j, k in group])
        out = model(x).float()
        for (i, j, k), y in zip(group, out):
            result[0, :, i:i + roi[0], j:j + roi[1], k:k + roi[2]] += y * weight
            norm[i:i + roi[0], j:j + roi[1], k:k + roi[2]] += weight
    result /= norm
    (p0, _), (p1, _), (p2, _) = pads
    return result[..., p0:p0 + kept[0], p1:p1 + kept[1], p2:p2 + kept[2]], label
