"""Training patches as the reference makes them (mlcommons/training ``image_segmentation/pytorch``,
``data_loading/pytorch_loader.py``): ``RandBalancedCrop(patch, oversampling 0.4)``, then the
``get_train_transforms`` chain in its order: ``RandFlip`` (each axis with p 1/3), ``Cast`` (image
float32, label uint8), ``RandomBrightnessAugmentation(factor 0.3, p 0.1)``, ``GaussianNoise(mean 0,
std 0.1, p 0.1)``.

Semantics, each as the reference codes it:

* random crop: each corner coordinate ``randrange(size - patch)`` (0 where equal: the last position
  ``size - patch`` is never drawn);
* foreground crop (with probability ``oversampling``): a class drawn among the foreground values present,
  its connected components (``scipy.ndimage.label``, face connectivity), the two with the largest
  bounding-box volume, one of them drawn; per axis the patch is placed around that box: a box shorter
  than the patch is padded by a random split of the difference (``randrange(diff)`` below, the rest
  above), a longer box is cut by a random split, and a window clipped at the volume's edge is shifted
  back inside;
* brightness: with p 0.1, the image times ``1 + f`` with ``f ~ U(1 - 0.3, 1 + 0.3)`` (so x1.7 to x2.3,
  as the reference multiplies), computed in float64 and cast back to float32;
* noise: with p 0.1, ``scale ~ U(0, 0.1)``, then Gaussian noise ``N(0, scale)`` cast to float32 added.

The reference draws from Python's ``random`` and numpy's global state; here every draw comes from one
``numpy.random.Generator`` per (seed, rank, case, read) through :class:`Draws`, in the reference's
order (oversampling, crop, three flips, brightness, noise), so a patch is reproducible without state.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

FLIP_PROB = 1 / 3  # RandFlip: 1 / len(axes)


@dataclass(frozen=True)
class Augment:
    """The reference's intensity augmentations (``get_train_transforms``)."""

    brightness_factor: float = 0.3
    brightness_prob: float = 0.1
    noise_mean: float = 0.0
    noise_std: float = 0.1
    noise_prob: float = 0.1


REFERENCE_AUGMENT = Augment()


class Draws:
    """The reference's random calls, each mapped onto one numpy Generator (the same order of draws)."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng

    def random(self) -> float:  # random.random()
        return float(self.rng.random())

    def randrange(self, n: int) -> int:  # the reference's RandBalancedCrop.randrange
        return 0 if n == 0 else int(self.rng.integers(n))

    def choice(self, values: np.ndarray) -> int:  # np.random.choice(values)
        return int(values[int(self.rng.integers(len(values)))])

    def uniform(self, low: float, high: float) -> float:  # np.random.uniform(low, high)
        return float(self.rng.uniform(low, high))

    def normal(self, mean: float, scale: float, shape: tuple[int, ...]) -> np.ndarray:  # np.random.normal
        return self.rng.normal(mean, scale, shape)


def random_corner(shape: Sequence[int], patch: Sequence[int], draws: Draws) -> tuple[int, ...]:
    """``RandBalancedCrop._rand_crop``'s corner."""
    return tuple(draws.randrange(s - p) for s, p in zip(shape, patch))


def largest_components(label: np.ndarray, cls: int) -> list[tuple[slice, ...]]:
    """Bounding boxes of the (at most) two connected components of ``label == cls`` with the largest
    box volumes, in the reference's order (``np.argsort`` of the volumes, last two)."""
    import scipy.ndimage

    boxes = [b for b in scipy.ndimage.find_objects(scipy.ndimage.label(label == cls)[0]) if b is not None]
    volumes = [int(np.prod([s.stop - s.start for s in b])) for b in boxes]
    return [boxes[i] for i in np.argsort(volumes)[-2:]]


def _around(box: slice, patch: int, size: int, draws: Draws) -> int:
    """The reference's ``adjust`` for one axis: the patch's start placed around ``box``."""
    diff = patch - (box.stop - box.start)
    sign = -1 if diff < 0 else 1
    diff = abs(diff)
    ladj = draws.randrange(diff)
    hadj = diff - ladj
    low = max(0, box.start - sign * ladj)
    high = min(size, box.stop + sign * hadj)
    short = patch - (high - low)
    if short > 0 and low != 0:
        low -= short
    return low


def foreground_corner(label: np.ndarray, patch: Sequence[int], draws: Draws) -> tuple[int, ...] | None:
    """``RandBalancedCrop.rand_foreg_cropd``'s corner for the case's (D, H, W) labels; None when the case
    has no foreground (the reference would fail on it; the caller crops at random instead)."""
    present = np.unique(label[label > 0])
    if present.size == 0:
        return None
    boxes = largest_components(label, draws.choice(present))
    box = boxes[draws.randrange(len(boxes))]
    return tuple(_around(b, p, s, draws) for b, p, s in zip(box, patch, label.shape))


def crop_corner(shape: Sequence[int], patch: Sequence[int], draws: Draws, oversampling: float,
                label_of: Callable[[], np.ndarray]) -> tuple[int, ...]:
    """``RandBalancedCrop``: with probability ``oversampling`` around foreground (``label_of()`` gives the
    case's labels, read only then), else at random."""
    if draws.random() < oversampling:
        corner = foreground_corner(label_of(), patch, draws)
        if corner is not None:
            return corner
    return random_corner(shape, patch, draws)


def flip_axes(draws: Draws, enabled: bool = True) -> tuple[int, ...]:
    """``RandFlip``: axes 1, 2, 3 of a (1, D, H, W) array, each with probability 1/3 (drawn in order)."""
    if not enabled:
        return ()
    return tuple(a for a in (1, 2, 3) if draws.random() < FLIP_PROB)


def intensity(image: np.ndarray, draws: Draws, aug: Augment = REFERENCE_AUGMENT) -> np.ndarray:
    """``RandomBrightnessAugmentation`` then ``GaussianNoise`` on a float32 image."""
    if draws.random() < aug.brightness_prob:
        f = draws.uniform(1.0 - aug.brightness_factor, 1.0 + aug.brightness_factor)
        image = np.multiply(image, 1.0 + f, dtype=np.float64).astype(np.float32)
    if draws.random() < aug.noise_prob:
        scale = draws.uniform(0.0, aug.noise_std)
        image = image + draws.normal(aug.noise_mean, scale, image.shape).astype(np.float32)
    return image
