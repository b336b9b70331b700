"""The reference's image transforms in Pillow and numpy (torchvision does not load with CPU torch 2.13).

Training: random-resized crop (area fraction in (0.05, 1): the reference's ``area_range`` and NVIDIA's
closed ``--min-random-area 0.05``, not torchvision's 0.08; aspect ratio in (3/4, 4/3), 10 tries as
DALI's default, then a centred crop of the clamped ratio, as torchvision's RandomResizedCrop), resized to ``size``
(bilinear with antialiasing, Pillow's ``resize(box=...)`` crops and resizes in one pass), and a
horizontal flip with probability 1/2. Evaluation: the shorter side resized to ``resize`` (256 for
224 crops), then the centred ``size`` crop. Both give uint8 HWC; normalization with the ImageNet
mean/std happens on the batch (:func:`normalize`), on the device when there is one.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from PIL import Image as PILImage

MEAN = (0.485, 0.456, 0.406)  # ImageNet RGB mean and std, on the 0..1 scale
STD = (0.229, 0.224, 0.225)
#: the crop's area fraction: the reference TF2 imagenet_preprocessing.py ``area_range=[0.05, 1.0]``; NVIDIA's
#: closed ResNet (training_results_v4.0, run_and_time.sh) ``--min-random-area 0.05 --max-random-area 1.0``
SCALE = (0.05, 1.0)
RATIO = (3.0 / 4.0, 4.0 / 3.0)


def crop_box(width: int, height: int, rng: np.random.Generator,
             scale: tuple[float, float] = SCALE, ratio: tuple[float, float] = RATIO) -> tuple[int, int, int, int]:
    """A random-resized-crop box (left, top, right, bottom) inside a ``width`` x ``height`` image."""
    area = width * height
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    for _ in range(10):
        target = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(log_lo, log_hi))
        w = int(round(math.sqrt(target * aspect)))
        h = int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            left = int(rng.integers(0, width - w + 1))
            top = int(rng.integers(0, height - h + 1))
            return left, top, left + w, top + h
    in_ratio = width / height  # fallback: the whole image cut to the nearest allowed aspect ratio
    if in_ratio < ratio[0]:
        w, h = width, int(round(width / ratio[0]))
    elif in_ratio > ratio[1]:
        w, h = int(round(height * ratio[1])), height
    else:
        w, h = width, height
    left, top = (width - w) // 2, (height - h) // 2
    return left, top, left + w, top + h


def train_crop(pixels: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    """Random-resized crop to ``size`` x ``size`` and a random horizontal flip of uint8 HWC pixels."""
    from PIL import Image

    img = Image.fromarray(pixels)
    box = crop_box(img.width, img.height, rng)
    out = np.asarray(img.resize((size, size), Image.Resampling.BILINEAR, box=box))
    if rng.random() < 0.5:
        out = out[:, ::-1]
    return out


def shorter_side_size(width: int, height: int, shorter: int) -> tuple[int, int]:
    """(width, height) with the shorter side ``shorter`` and the aspect ratio kept (longer side rounded)."""
    if width <= height:
        return shorter, max(1, int(round(height * shorter / width)))
    return max(1, int(round(width * shorter / height))), shorter


def eval_crop(img: "PILImage.Image", size: int, resize: int) -> np.ndarray:
    """Shorter side to ``resize``, then the centred ``size`` x ``size`` crop, as uint8 HWC."""
    from PIL import Image

    w, h = shorter_side_size(img.width, img.height, resize)
    img = img.resize((w, h), Image.Resampling.BILINEAR)
    left, top = (w - size + 1) // 2, (h - size + 1) // 2  # halves rounded up, as DALI's crop does
    return np.asarray(img.crop((left, top, left + size, top + size)))


def draft(img: "PILImage.Image", limit: int) -> None:
    """Before decoding a JPEG whose shorter side will be bounded to ``limit``: let libjpeg decode at
    1/2, 1/4 or 1/8 scale (never below ``limit``), most of the saving of a bounded decode."""
    if limit > 0 and min(img.size) > limit and img.format == "JPEG":
        img.draft("RGB", shorter_side_size(img.width, img.height, limit))


def bound_shorter_side(img: "PILImage.Image", limit: int) -> "PILImage.Image":
    """The decoded image with its shorter side reduced to ``limit`` (unchanged when already at most
    ``limit``, or ``limit`` is 0)."""
    from PIL import Image

    if limit <= 0 or min(img.size) <= limit:
        return img
    return img.resize(shorter_side_size(img.width, img.height, limit), Image.Resampling.BILINEAR)


def normalize(batch: "torch.Tensor", channels_last: bool, out: "torch.Tensor | None" = None) -> "torch.Tensor":
    """uint8 NHWC -> float32 NCHW normalized with the ImageNet mean/std. The NCHW view of an NHWC
    tensor is the channels-last memory format already; otherwise it is contiguous. ``out``: a float32
    buffer of the batch's size to write into (NHWC with ``channels_last``, else NCHW), e.g. a reused
    host output; None: a new one. The cast, the layout change and the shift are one pass."""
    import torch

    n, h, w, c = batch.shape
    if out is None:
        out = torch.empty((n, h, w, c) if channels_last else (n, c, h, w), dtype=torch.float32, device=batch.device)
    dst = out.view(n, h, w, c).permute(0, 3, 1, 2) if channels_last else out.view(n, c, h, w)
    mean, inv_std = _constants(batch.device)
    return torch.sub(batch.permute(0, 3, 1, 2), mean, out=dst).mul_(inv_std)


_CONSTANTS: dict[str, tuple["torch.Tensor", "torch.Tensor"]] = {}


def _constants(device: "torch.device") -> tuple["torch.Tensor", "torch.Tensor"]:
    """(255 x mean, 1 / (255 x std)) as (1, 3, 1, 1) tensors on ``device``, made once per device (no
    host-to-device copy per batch on a GPU)."""
    import torch

    key = str(device)
    if key not in _CONSTANTS:
        mean = torch.tensor(MEAN, dtype=torch.float32).view(1, 3, 1, 1) * 255.0
        inv_std = 1.0 / (torch.tensor(STD, dtype=torch.float32).view(1, 3, 1, 1) * 255.0)
        _CONSTANTS[key] = (mean.to(device), inv_std.to(device))
    return _CONSTANTS[key]
