"""Synthetic KiTS19-like cases: an abdomen with two kidneys, a tumour on one of them, a liver, a spine,
texture and noise, written in the preprocessed format (Hounsfield units clipped and normalised as
the reference's preprocessing does).

The signal a model can learn: kidneys are bright (contrast-enhanced parenchyma, ~170 HU), tumours are
darker heterogeneous blobs growing out of a kidney's surface (~90 HU), the liver is a large
mid-grey organ (~60 HU) and the spine is bone; the shapes, sizes, positions and intensities vary per
case, and smooth texture plus voxel noise blur the boundaries. Every case is a pure function of
``(seed, case id, shape range)``.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from hpcbench.common.data.datagen import Datagen, FileJob, generate
from hpcbench.common.errors import ConfigError

from .facts import EVAL_CASES, HU_CLIP, HU_MEAN, HU_STD, NUM_CASES
from .format import image_name, label_name, read_header, verify_array, write_array


@dataclass(frozen=True)
class ShapeRange:
    """Per-axis bounds (inclusive) of a case's (D, H, W); the reference pads every case to >= 128."""

    low: tuple[int, int, int] = (128, 128, 128)
    high: tuple[int, int, int] = (256, 224, 224)


def case_ids(cases: int, eval_cases: int) -> list[int]:
    """Which case ids a dataset of ``cases`` holds: the first ``eval_cases`` ids of the reference's
    evaluation list and the first other ids for training. 210 and 42 give ids 0 .. 209 exactly."""
    if not 0 < eval_cases <= len(EVAL_CASES) or cases - eval_cases < 1 or cases > NUM_CASES:
        raise ValueError(f"cases {cases} / eval cases {eval_cases}: need 1 <= eval cases <= {len(EVAL_CASES)} and "
                         f"eval cases < cases <= {NUM_CASES}")
    listed = set(EVAL_CASES)
    train = [c for c in range(NUM_CASES) if c not in listed][: cases - eval_cases]
    return sorted([*EVAL_CASES[:eval_cases], *train])


def _ellipsoid(grid: tuple[np.ndarray, ...], centre: np.ndarray, axes: np.ndarray) -> np.ndarray:
    """Normalised squared radius (< 1 inside) of an axis-aligned ellipsoid on broadcastable grids."""
    return sum(((g - c) / a) ** 2 for g, c, a in zip(grid, centre, axes))  # type: ignore[return-value]


def _texture(rng: np.random.Generator, grid: tuple[np.ndarray, ...], amplitude: float, waves: int = 4) -> np.ndarray:
    """Smooth texture: a sum of random plane waves of 4-12 voxel wavelength."""
    out = np.zeros(np.broadcast_shapes(*(g.shape for g in grid)), dtype=np.float32)
    for _ in range(waves):
        k = rng.normal(size=3)
        k *= 2 * np.pi / (np.linalg.norm(k) * rng.uniform(4.0, 12.0))
        phase = rng.uniform(0, 2 * np.pi)
        out += np.cos(k[0] * grid[0] + k[1] * grid[1] + k[2] * grid[2] + phase).astype(np.float32)
    return out * (amplitude / np.sqrt(waves))


def make_case(seed: int, case: int, shapes: ShapeRange = ShapeRange()) -> tuple[np.ndarray, np.ndarray]:
    """(image float32 (1, D, H, W) normalised, label uint8 (1, D, H, W) in {0, 1, 2}) of one case."""
    rng = np.random.default_rng([seed, case, 0x4B495453])  # "KITS"
    shape = np.array([rng.integers(lo, hi + 1) for lo, hi in zip(shapes.low, shapes.high)])
    d, h, w = (int(s) for s in shape)
    grid = (np.arange(d, dtype=np.float32)[:, None, None], np.arange(h, dtype=np.float32)[None, :, None],
            np.arange(w, dtype=np.float32)[None, None, :])
    hu = np.full((d, h, w), -1000.0, dtype=np.float32)  # air
    label = np.zeros((d, h, w), dtype=np.uint8)

    body = _ellipsoid(grid[1:], shape[1:] * rng.uniform(0.47, 0.53, 2), shape[1:] * rng.uniform(0.42, 0.48, 2)) < 1
    body = np.broadcast_to(body, (d, h, w))
    hu[body] = rng.uniform(10, 40)  # fat and muscle
    liver_side = rng.choice([-1.0, 1.0])
    liver = _ellipsoid(grid, shape * np.array([rng.uniform(0.2, 0.4), rng.uniform(0.4, 0.5), 0.5 + liver_side * 0.22]),
                       shape * rng.uniform([0.18, 0.15, 0.12], [0.3, 0.2, 0.16])) < 1
    hu[liver & body] = rng.uniform(50, 65)
    spine = _ellipsoid(grid[1:], shape[1:] * np.array([rng.uniform(0.72, 0.78), 0.5]),
                       np.array([0.05, 0.05]) * shape[1:].mean()) < 1
    hu[np.broadcast_to(spine, (d, h, w))] = 400.0

    kidney_hu = rng.uniform(150, 190)
    centres, axes_all = [], []
    for side in (-1.0, 1.0):
        centre = shape * np.array([rng.uniform(0.4, 0.6), rng.uniform(0.6, 0.68), 0.5 + side * rng.uniform(0.2, 0.26)])
        axes = shape.mean() * rng.uniform([0.14, 0.09, 0.08], [0.2, 0.12, 0.1])
        kidney = _ellipsoid(grid, centre, axes) < 1
        hu[kidney] = kidney_hu + rng.normal(0, 8)
        label[kidney] = 1
        centres.append(centre)
        axes_all.append(axes)
    k = int(rng.integers(2))
    direction = rng.normal(size=3)
    direction /= np.linalg.norm(direction)
    t_centre = centres[k] + direction * axes_all[k] * rng.uniform(0.6, 0.9)
    t_axes = shape.mean() * rng.uniform(0.06, 0.12, 3)
    tumour = (_ellipsoid(grid, t_centre, t_axes) < 1) & body
    hu[tumour] = rng.uniform(100, 120) + _texture(rng, grid, 12.0)[tumour]
    label[tumour] = 2

    hu += _texture(rng, grid, 12.0) * body
    hu += rng.normal(0.0, rng.uniform(12, 20), size=hu.shape).astype(np.float32)
    image = (np.clip(hu, *HU_CLIP) - HU_MEAN) / HU_STD
    return image[None].astype(np.float32), label[None]


class UNet3DDatagen(Datagen):
    """KiTS19-layout case pairs (``hpcbench datagen unet3d``)."""

    @classmethod
    def add_datagen_args(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--cases", type=int, default=210, help="cases in all (KiTS19: 210)")
        parser.add_argument("--eval-cases", type=int, default=0,
                            help="of which validation cases, the first ids of the reference's evaluation list "
                                 "(0: 42 with 210 cases, else a fifth)")
        parser.add_argument("--min-shape", default="128,128,128", help="smallest D,H,W of a case (reference: >= 128)")
        parser.add_argument("--max-shape", default="256,224,224", help="largest D,H,W of a case")
        parser.add_argument("--quiet", action="store_true", help="no progress bar")

    @classmethod
    def embedded_datagen_args(cls) -> list[str]:
        """The dataset the ``mini`` preset is tuned on (see configs/mini.toml)."""
        return ["--cases", "40", "--eval-cases", "8", "--min-shape", "32,32,32", "--max-shape", "48,48,48"]

    @classmethod
    def datagen(cls, args: argparse.Namespace) -> None:
        low, high = parse_shape(args.min_shape, "--min-shape"), parse_shape(args.max_shape, "--max-shape")
        if any(lo > hi for lo, hi in zip(low, high)):
            raise ConfigError(f"--min-shape {args.min_shape} must not exceed --max-shape {args.max_shape}")
        eval_cases = args.eval_cases or (42 if args.cases == 210 else max(1, round(args.cases / 5)))
        try:
            ids = case_ids(args.cases, eval_cases)
        except ValueError as exc:
            raise ConfigError(f"--cases/--eval-cases: {exc}") from None
        jobs = [FileJob("", image_name(c), (c,)) for c in ids]
        shapes = ShapeRange(low, high)
        generate(args.out, jobs, partial(write_case_job, args.seed, shapes), verify_case_job,
                 workers=max(1, args.workers), progress=not args.quiet, desc="unet3d datagen")
        print(f"wrote {len(ids)} synthetic KiTS19 cases ({eval_cases} validation, {len(ids) - eval_cases} training) "
              f"of D,H,W in {low}..{high} to {args.out}")


def parse_shape(text: str, option: str) -> tuple[int, int, int]:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        values = ()
    if len(values) != 3 or min(values) < 1:
        raise ConfigError(f"{option}: expected three sizes D,H,W >= 1, got {text!r}")
    return values  # type: ignore[return-value]


def write_case_job(seed: int, shapes: Any, job: Any, tmp: Any) -> None:
    """Make one case; its label file is written (verified, renamed) first, its image to the driver's ``tmp``."""
    case = job.indices[0]
    image, label = make_case(seed, case, shapes)
    write_array(tmp.parent / label_name(case), label)
    with open(tmp, "wb") as fh:
        np.lib.format.write_array(fh, np.ascontiguousarray(image, dtype=np.float32), allow_pickle=False)


def verify_case_job(tmp: Any, job: Any) -> None:
    shape = read_header(tmp.parent / label_name(job.indices[0]), np.dtype("u1"))
    verify_array(tmp, shape, np.dtype("<f4"))
