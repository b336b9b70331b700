"""Training patches as the reference's ``RandBalancedCrop`` and ``RandFlip`` make them.

With probability ``oversampling`` (0.4) the crop is placed around foreground: a class is drawn among
the foreground classes present (kidney, tumour), then one of its voxels, and the patch's corner is
drawn among the positions whose patch holds that voxel, so the patch always contains foreground.
(The reference centres on the bounding box of one of the two largest connected components of the
class; drawing a voxel needs no component labelling and keeps the same guarantee.) Otherwise the
corner is uniform over the volume. Each axis is then flipped with probability 1/3. The reference's
brightness (p 0.1) and noise (p 0.1) augmentations are not applied.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def crop_corner(shape: Sequence[int], patch: Sequence[int], rng: np.random.Generator,
                label: np.ndarray | None = None) -> tuple[int, ...]:
    """A patch corner inside ``shape``; with ``label`` (the case's (D, H, W) labels) one that holds foreground."""
    if label is not None:
        present = [c for c in (1, 2) if (label == c).any()]
        if present:
            where = np.flatnonzero(label == present[int(rng.integers(len(present)))])
            voxel = np.unravel_index(int(where[rng.integers(len(where))]), label.shape)
            return tuple(int(rng.integers(max(0, v - p + 1), min(v, s - p) + 1))
                         for v, s, p in zip(voxel, shape, patch))
    return tuple(int(rng.integers(0, s - p + 1)) for s, p in zip(shape, patch))


def flip_axes(rng: np.random.Generator, prob: float = 1 / 3) -> tuple[int, ...]:
    """Spatial axes (1, 2, 3 of a (1, D, H, W) array) to flip, each with probability ``prob``."""
    return tuple(a for a in (1, 2, 3) if rng.random() < prob)
