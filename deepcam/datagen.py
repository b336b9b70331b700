"""`hpcbench datagen deepcam`: write a synthetic dataset in the real DeepCAM layout.

One :class:`~common.data.datagen.FileJob` per ``<split>/data-NNNNNN.h5`` (one sample each); the
shared driver writes, verifies with :func:`hpcbench.workloads.deepcam.data.read_sample` and renames each file.
``stats.h5`` (per-channel statistics of the training split, summed from what each training file's
writer returns) is written last, verified and renamed, so a dataset without it is visibly
incomplete (the reader requires it). The same seed writes the same files.
"""
from __future__ import annotations

import argparse
import os
from functools import partial
from pathlib import Path

import h5py
import numpy as np

from hpcbench.common.data.datagen import Datagen, FileJob, generate
from hpcbench.common.errors import DataError

from .data import Normalizer, read_sample
from .layout import LAYOUT
from .synth import CHANNELS, make_sample

SPLITS = {"train": 0, "validation": 1}  # split name -> the split's part of every sample seed
ALL_CHANNELS = tuple(range(len(CHANNELS)))


def write_file(job: FileJob, tmp: Path, seed: int, height: int, width: int) -> np.ndarray:
    """Write the job's sample to ``tmp``; return its per-channel [count, sum, sum of squares, min,
    max] (5, C) in float64."""
    (index,) = job.indices
    data, labels = make_sample((seed, SPLITS[job.split], index), height, width)
    with h5py.File(tmp, "w") as f:
        f.create_dataset("climate/data", data=data)
        f.create_dataset("climate/labels_0", data=labels)
    x = data.reshape(-1, data.shape[-1]).astype(np.float64)
    return np.stack([np.full(x.shape[1], x.shape[0], np.float64), x.sum(0), (x**2).sum(0), x.min(0), x.max(0)])


def verify_file(tmp: Path, job: FileJob, height: int, width: int) -> None:
    read_sample(tmp, ALL_CHANNELS, (height, width))


def write_stats(path: Path, partial_stats: list[np.ndarray]) -> None:
    """``stats.h5`` from the training files' partial statistics, written under a temporary name,
    fsynced, read back (the reader's checks, every dataset's shape) and only then renamed."""
    p = np.stack(partial_stats)
    count = p[:, 0].sum(0)
    stats = {
        "climate/count": count,
        "climate/mean": p[:, 1].sum(0) / count,
        "climate/sqmean": p[:, 2].sum(0) / count,
        "climate/minval": p[:, 3].min(0),
        "climate/maxval": p[:, 4].max(0),
        "climate/channels": np.array([c.encode() for c in CHANNELS]),
    }
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with h5py.File(tmp, "w") as f:
            for key, value in stats.items():
                f.create_dataset(key, data=value)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        Normalizer.from_stats(tmp, ALL_CHANNELS)
        with h5py.File(tmp, "r") as f:
            for key, value in stats.items():
                if f[key].shape != value.shape:
                    raise DataError(f"'{tmp}': {key} reads back with shape {f[key].shape}, wrote {value.shape}")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_dataset(out: Path, samples: int, eval_samples: int, height: int, width: int, seed: int, workers: int,
                  progress: bool = False) -> dict[str, int]:
    """Write train/ and validation/ and stats.h5 (statistics of the training split)."""
    from .model import OUTPUT_STRIDE  # here: the writer processes need no torch

    if height % OUTPUT_STRIDE or width % OUTPUT_STRIDE:
        raise DataError(f"--height and --width must be multiples of {OUTPUT_STRIDE} (the model's output stride), "
                        f"got {height}x{width}")
    if samples < 1 or eval_samples < 1:
        raise DataError("--samples and --eval-samples must be >= 1")
    out = Path(out)
    for split in SPLITS:
        folder = out / split
        if folder.is_dir() and any(LAYOUT.is_sample(p.name) for p in folder.iterdir()):
            raise DataError(f"'{folder}' already holds data-*.h5 files; write to an empty directory")
    sizes = {"train": samples, "validation": eval_samples}
    jobs = [FileJob(split, f"data-{i:06d}.h5", (i,)) for split, n in sizes.items() for i in range(n)]
    infos = generate(out, jobs, partial(write_file, seed=seed, height=height, width=width),
                     partial(verify_file, height=height, width=width), workers, progress=progress,
                     desc="deepcam datagen")
    write_stats(out / "stats.h5", [info for job, info in zip(jobs, infos) if job.split == "train"])
    return sizes


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--samples", type=int, default=256, help="training samples (files)")
    parser.add_argument("--eval-samples", type=int, default=None, help="validation samples (default: samples/4)")
    parser.add_argument("--height", type=int, default=96, help="grid rows (real data: 768)")
    parser.add_argument("--width", type=int, default=144, help="grid columns (real data: 1152)")


def run(args: argparse.Namespace) -> None:
    eval_n = args.eval_samples if args.eval_samples is not None else max(1, args.samples // 4)
    out = Path(args.out)
    write_dataset(out, args.samples, eval_n, args.height, args.width, args.seed, args.workers, progress=True)
    print(f"wrote {args.samples} train + {eval_n} validation samples of {args.height}x{args.width}x{len(CHANNELS)} "
          f"and stats.h5 to {out}")


class DeepCAMDatagen(Datagen):
    """DeepCAM HDF5 samples and stats (``hpcbench datagen deepcam``)."""

    @classmethod
    def add_datagen_args(cls, parser: argparse.ArgumentParser) -> None:
        add_args(parser)

    @classmethod
    def embedded_datagen_args(cls) -> list[str]:
        """The dataset the ``mini`` preset is tuned on (see configs/mini.toml)."""
        return ["--samples", "384", "--eval-samples", "64", "--height", "96", "--width", "144"]

    @classmethod
    def datagen(cls, args: argparse.Namespace) -> None:
        run(args)
