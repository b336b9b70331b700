"""Synthetic ImageNet: classes with visual structure that survives random-resized crops and flips.

Class ``k`` is a stripe texture that fills the whole image (one of 5 hues, horizontal or vertical
stripes: both are unchanged by a horizontal flip, and any 8% crop still shows them, at a frequency
that steps every 10 classes) with a shape on top (disc, square, triangle or ring, in the opposite
hue) at a random place and scale. Every image also gets a random size (0.75x to 1.5x ``size`` per
side), stripe phase and frequency jitter, brightness, and pixel noise; 2% of the images are grayscale
and 1% CMYK (ImageNet holds both). JPEG-encoded, deterministic per (seed, split, class, index).
"""
from __future__ import annotations

import argparse
import colorsys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hpcbench.common.data.datagen import Datagen, FileJob, generate
from hpcbench.common.errors import ConfigError

HUES = 5


def wnid(k: int) -> str:
    """A WordNet-style id per class (sorted order = class order): n01440764, n01440765, ..."""
    return f"n{1440764 + k:08d}"


def _rgb(h: float, s: float, v: float) -> np.ndarray:
    return np.array(colorsys.hsv_to_rgb(h % 1.0, s, v), dtype=np.float32) * 255.0


def make_image(k: int, rng: np.random.Generator, size: int) -> np.ndarray:
    """uint8 H x W x 3 image of class ``k``."""
    w, h = (int(v) for v in rng.integers(int(0.75 * size), int(1.5 * size) + 1, size=2))
    hue = (k % HUES) / HUES
    vertical = (k // HUES) % 2 == 1
    cycles = (3.0 + 1.5 * ((k // (2 * HUES)) % 4)) * rng.uniform(0.85, 1.15)  # stripes per `size` px
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    coord = xx if vertical else yy
    wave = 0.5 + 0.5 * np.sin(2 * np.pi * cycles * coord / size + rng.uniform(0, 2 * np.pi))
    light, dark = _rgb(hue, 0.75, 0.95), _rgb(hue + 0.05, 0.6, 0.3)
    img = dark + wave[..., None] * (light - dark)
    # the shape, in the opposite hue
    kind = k % 4
    r = rng.uniform(0.15, 0.3) * min(w, h)
    cx, cy = rng.uniform(r, w - r), rng.uniform(r, h - r)
    dx, dy = xx - cx, yy - cy
    if kind == 0:
        mask = dx * dx + dy * dy <= r * r
    elif kind == 1:
        mask = (np.abs(dx) <= r * 0.85) & (np.abs(dy) <= r * 0.85)
    elif kind == 2:
        mask = (dy <= r * 0.7) & (dy >= -r + 2 * np.abs(dx))
    else:
        d2 = dx * dx + dy * dy
        mask = (d2 <= r * r) & (d2 >= (0.55 * r) ** 2)
    img[mask] = _rgb(hue + 0.5, 0.8, 0.9)
    img = img * rng.uniform(0.75, 1.15) + rng.normal(0.0, 12.0, img.shape).astype(np.float32)
    return np.clip(img, 0, 255).astype(np.uint8)


def image_mode(index: int) -> str:
    """Per class: image 11, 61, 111, ... grayscale, image 41, 138, ... CMYK (2% and 1%)."""
    return "L" if index % 50 == 11 else ("CMYK" if index % 97 == 41 else "RGB")


@dataclass(frozen=True)
class Writer:
    """Picklable ``write(job, tmp)`` for the datagen driver: one JPEG per job."""

    size: int
    seed: int
    quality: int = 90

    def __call__(self, job: FileJob, tmp: Path) -> int:
        from PIL import Image

        k, index = job.indices
        split_id = 0 if job.split == "train" else 1
        pixels = make_image(k, np.random.default_rng([self.seed, split_id, k, index]), self.size)
        Image.fromarray(pixels).convert(image_mode(index)).save(tmp, format="JPEG", quality=self.quality)
        return tmp.stat().st_size


def verify(tmp: Path, job: FileJob) -> None:
    """Decode the written file with the validating reader."""
    from .imagenet import decode

    decode(tmp)


def jobs(classes: int, per_class: dict[str, int]) -> list[FileJob]:
    """One job per image: ``<split>/<wnid>/<wnid>_<index>.JPEG`` (indices = (class, index))."""
    return [FileJob(split, f"{wnid(k)}/{wnid(k)}_{i}.JPEG", (k, i))
            for split, n in per_class.items() for k in range(classes) for i in range(n)]


def write_dataset(out: str | Path, classes: int, train_per_class: int, val_per_class: int, size: int,
                  seed: int = 1, workers: int = 1, progress: bool = True) -> int:
    """Write ``train/`` and ``val/`` (class folders first, then write-verify-rename per image); bytes written."""
    out = Path(out)
    per_class = {"train": train_per_class, "val": val_per_class}
    for split in per_class:
        for k in range(classes):
            (out / split / wnid(k)).mkdir(parents=True, exist_ok=True)
    sizes: Sequence[int] = generate(out, jobs(classes, per_class), Writer(size, seed), verify, workers=workers,
                                    progress=progress, desc="resnet datagen")
    return int(sum(sizes))


class ResNetDatagen(Datagen):
    """ImageNet-layout JPEG class folders (``hpcbench datagen resnet``)."""

    @classmethod
    def add_datagen_args(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--classes", type=int, default=10, help="class folders (ImageNet: 1000); "
                            "the model's model.num_classes must match")
        parser.add_argument("--train-per-class", type=int, default=300, help="training images per class")
        parser.add_argument("--val-per-class", type=int, default=50, help="validation images per class (ImageNet: 50)")
        parser.add_argument("--size", type=int, default=48,
                            help="nominal image side in pixels; each image's sides are drawn from 0.75x to 1.5x it")
        parser.add_argument("--quiet", action="store_true", help="no progress bar")

    @classmethod
    def embedded_datagen_args(cls) -> list[str]:
        """The dataset the ``mini`` preset is tuned on (see configs/mini.toml)."""
        return ["--classes", "10", "--train-per-class", "300", "--val-per-class", "50", "--size", "48"]

    @classmethod
    def datagen(cls, args: argparse.Namespace) -> None:
        if args.classes < 2 or args.train_per_class < 1 or args.val_per_class < 1 or args.size < 8:
            raise ConfigError(f"--classes >= 2, --train-per-class >= 1, --val-per-class >= 1 and --size >= 8, got "
                              f"{args.classes}, {args.train_per_class}, {args.val_per_class}, {args.size}")
        nbytes = write_dataset(args.out, args.classes, args.train_per_class, args.val_per_class, args.size,
                               seed=args.seed, workers=max(1, args.workers), progress=not args.quiet)
        print(f"wrote {args.classes} classes x ({args.train_per_class} train + {args.val_per_class} val) JPEG images "
              f"of about {args.size} px ({nbytes / 2**20:.1f} MiB) to {args.out}")
