"""`hpcbench datagen deepcam`: write a synthetic dataset in the real DeepCAM layout.

Every file is written under a temporary name, re-opened and checked, then renamed; ``stats.h5`` is
written last, so a dataset without it is visibly incomplete (the reader requires it).
"""
from __future__ import annotations

import argparse
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import h5py
import numpy as np

from common.errors import DataError

from .synth import CHANNELS, make_sample

SPLITS = (("train", 0), ("validation", 1))


def write_h5_atomic(path: Path, datasets: dict[str, np.ndarray]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with h5py.File(tmp, "w") as f:
            for key, value in datasets.items():
                f.create_dataset(key, data=value)
        with h5py.File(tmp, "r") as f:  # verify before publishing
            for key, value in datasets.items():
                if f[key].shape != value.shape:
                    raise DataError(f"'{tmp}': {key} reads back with shape {f[key].shape}, wrote {value.shape}")
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _write_one(job: tuple[Path, tuple[int, ...], int, int]) -> np.ndarray:
    """Write one sample; return its per-channel [count, sum, sum of squares, min, max] (5, C)."""
    path, seed, h, w = job
    data, labels = make_sample(seed, h, w)
    write_h5_atomic(path, {"climate/data": data, "climate/labels_0": labels})
    x = data.reshape(-1, data.shape[-1]).astype(np.float64)
    return np.stack([np.full(x.shape[1], x.shape[0], np.float64), x.sum(0), (x**2).sum(0), x.min(0), x.max(0)])


def write_dataset(out: Path, samples: int, eval_samples: int, height: int, width: int, seed: int, workers: int) -> dict[str, float]:
    """Write train/ and validation/ and stats.h5 (statistics of the training split)."""
    if height % 16 or width % 16:
        raise DataError(f"--height and --width must be multiples of 16 (output stride), got {height}x{width}")
    if samples < 1 or eval_samples < 1:
        raise DataError("--samples and --eval-samples must be >= 1")
    jobs: dict[str, list] = {}
    for split, split_id in SPLITS:
        folder = out / split
        folder.mkdir(parents=True, exist_ok=True)
        if any(folder.glob("data-*.h5")):
            raise DataError(f"'{folder}' already holds data-*.h5 files; write to an empty directory")
        n = samples if split == "train" else eval_samples
        jobs[split] = [(folder / f"data-{i:06d}.h5", (seed, split_id, i), height, width) for i in range(n)]
    with ProcessPoolExecutor(max(1, workers)) as pool:
        partial = list(pool.map(_write_one, jobs["train"], chunksize=4))
        list(pool.map(_write_one, jobs["validation"], chunksize=4))
    p = np.stack(partial)
    count = p[:, 0].sum(0)
    stats = {
        "climate/count": count,
        "climate/mean": p[:, 1].sum(0) / count,
        "climate/sqmean": p[:, 2].sum(0) / count,
        "climate/minval": p[:, 3].min(0),
        "climate/maxval": p[:, 4].max(0),
        "climate/channels": np.array([c.encode() for c in CHANNELS]),
    }
    write_h5_atomic(out / "stats.h5", stats)
    return {"train": samples, "validation": eval_samples}


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--samples", type=int, default=256, help="training samples (files)")
    parser.add_argument("--eval-samples", type=int, default=None, help="validation samples (default: samples/4)")
    parser.add_argument("--height", type=int, default=96, help="grid rows (real data: 768)")
    parser.add_argument("--width", type=int, default=144, help="grid columns (real data: 1152)")


def run(args: argparse.Namespace) -> None:
    eval_n = args.eval_samples if args.eval_samples is not None else max(1, args.samples // 4)
    out = Path(args.out)
    write_dataset(out, args.samples, eval_n, args.height, args.width, args.seed, args.workers)
    print(f"wrote {args.samples} train + {eval_n} validation samples of {args.height}x{args.width}x{len(CHANNELS)} "
          f"and stats.h5 to {out}")
