"""Synthetic CosmoFlow universes with a learnable physical signal, written in the real format.

Each sample draws 4 normalized parameters ``y`` uniformly in [-1, 1] and maps them to a toy
cosmology: the amplitude (``sigma``) and spectral slope (``n``) of a Gaussian random field, the mean
particle density ``nbar`` and the growth factor between consecutive redshift bins. The Gaussian field
is made by filtering white noise with ``sqrt(P(k))``, ``P(k) = k^n exp(-(k/k_c)^2)``; each redshift
bin ``c`` scales it by its growth ``D_c``, exponentiates it into a log-normal density with mean
``nbar`` and Poisson-samples integer particle counts per voxel (about one particle per voxel, so the
int16 cubes compress like the real N-body data). Everything is deterministic per (seed, split, index).

Files are written by the shared driver (:func:`hpcbench.common.data.datagen.generate`: process pool,
progress bar, fsync, verify with the validating reader, rename), one ``univ_XXXXXXX.tfrecord[.gz]``
per sample.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

from hpcbench.common.data.datagen import Datagen, FileJob
from hpcbench.common.data.datagen import generate as generate_files
from hpcbench.common.errors import ConfigError

from hpcbench.common.data import tfrecord
from .data import N_CHANNELS, N_TARGETS, encode_sample, read_sample

_SPLIT_ID = {"train": 0, "validation": 1}


@dataclass(frozen=True)
class Cosmology:
    sigma: float  # std of the log-density at the lowest redshift bin
    slope: float  # spectral index n of P(k) ~ k^n
    nbar: float  # mean particles per voxel
    growth: float  # D(c+1) / D(c) between consecutive redshift bins

    @classmethod
    def from_params(cls, y: np.ndarray) -> "Cosmology":
        return cls(sigma=0.7 + 0.4 * float(y[0]), slope=-2.0 + 2.0 * float(y[1]),
                   nbar=float(np.exp(0.5 * y[2])), growth=1.35 + 0.35 * float(y[3]))


def gaussian_field(rng: np.random.Generator, size: int, slope: float) -> np.ndarray:
    """Unit-variance Gaussian random field on a periodic ``size^3`` grid with P(k) ~ k^slope."""
    noise = rng.standard_normal((size, size, size), dtype=np.float32)
    k1 = np.fft.fftfreq(size).astype(np.float32)
    kz = np.fft.rfftfreq(size).astype(np.float32)
    k = np.sqrt(k1[:, None, None] ** 2 + k1[None, :, None] ** 2 + kz[None, None, :] ** 2)
    k[0, 0, 0] = 1.0
    amp = k ** (slope / 2.0) * np.exp(-0.5 * (k / 0.35) ** 2)
    amp[0, 0, 0] = 0.0  # zero mean
    field = np.fft.irfftn(np.fft.rfftn(noise) * amp, s=noise.shape, axes=(0, 1, 2)).astype(np.float32)
    return field / max(float(field.std()), 1e-12)


def make_sample(seed: int, split: str, index: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    """(x int16 [S,S,S,4], y float32 [4]) of one universe."""
    rng = np.random.default_rng([seed, _SPLIT_ID[split], index])
    y = rng.uniform(-1.0, 1.0, N_TARGETS).astype(np.float32)
    cosmo = Cosmology.from_params(y)
    delta = gaussian_field(rng, size, cosmo.slope)
    x = np.empty((size, size, size, N_CHANNELS), dtype=np.int16)
    for c in range(N_CHANNELS):  # c = 0 is the highest redshift (least structure)
        s = cosmo.sigma * cosmo.growth ** (c - (N_CHANNELS - 1))
        density = cosmo.nbar * np.exp(s * delta - 0.5 * s * s)
        x[..., c] = np.minimum(rng.poisson(density), np.iinfo(np.int16).max)
    return x, y


def file_name(index: int, compress: bool) -> str:
    return f"univ_{index:07d}.tfrecord" + (".gz" if compress else "")


def write_file(job: FileJob, tmp: Path, seed: int, size: int, compress: bool, level: int) -> int:
    """Write the job's one sample to ``tmp``; returns its uncompressed int16 bytes."""
    (index,) = job.indices
    x, y = make_sample(seed, job.split, index, size)
    with open(tmp, "wb") as fh:
        tfrecord.write_stream(fh, [encode_sample(x, y)], compress=compress, level=level)
    return int(x.nbytes)


def verify_file(tmp: Path, job: FileJob, size: int) -> None:
    """Read the written file back with the validating reader (one record, CRCs, x and y)."""
    read_sample(tmp, size)


def generate(out: str | Path, n_train: int, n_val: int, size: int, seed: int = 0,
             workers: int = 1, compress: bool = True, level: int = 6, progress: bool = True) -> int:
    """Write ``out/train`` and ``out/validation``; returns the uncompressed bytes written.
    A rerun with the same seed writes the same bytes, whatever the number of workers."""
    jobs = [FileJob(split, file_name(i, compress), (i,))
            for split, n in (("train", n_train), ("validation", n_val)) for i in range(n)]
    for split in ("train", "validation"):  # both folders exist, also an empty validation/
        (Path(out) / split).mkdir(parents=True, exist_ok=True)
    sizes = generate_files(out, jobs, partial(write_file, seed=seed, size=size, compress=compress, level=level),
                           partial(verify_file, size=size), workers=workers, progress=progress,
                           desc="cosmoflow datagen")
    return sum(sizes)


class CosmoFlowDatagen(Datagen):
    """CosmoFlow universes as gzip/plain TFRecords (``hpcbench datagen cosmoflow``)."""

    @classmethod
    def add_datagen_args(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--samples", type=int, default=256, help="training samples (files in train/)")
        parser.add_argument("--val-samples", type=int, default=None,
                            help="validation samples (default: samples/8, at least 1)")
        parser.add_argument("--size", type=int, default=128, help="cube edge S of int16 [S,S,S,4] (MLPerf: 128)")
        parser.add_argument("--plain", action="store_true",
                            help="write uncompressed TFRecords (default: gzip, like the v1.0+ dataset)")
        parser.add_argument("--gzip-level", type=int, default=6, choices=range(1, 10), metavar="1-9",
                            help="gzip level (6 = zlib/TensorFlow default; 1 is ~8x faster, ~25%% larger)")
        parser.add_argument("--quiet", action="store_true", help="no progress bar")

    @classmethod
    def embedded_datagen_args(cls) -> list[str]:
        """The dataset the ``mini`` preset is tuned on (see configs/mini.toml). Uncompressed records,
        so that ``pack`` shows what zstd gains on raw counts (gzip-in-zstd gains nothing)."""
        return ["--samples", "4096", "--val-samples", "512", "--size", "16", "--plain"]

    @classmethod
    def datagen(cls, args: argparse.Namespace) -> None:
        n_val = args.val_samples if args.val_samples is not None else max(1, args.samples // 8)
        if args.samples < 1 or n_val < 0:
            raise ConfigError("--samples must be >= 1 and --val-samples >= 0")
        if args.size < 2:
            raise ConfigError(f"--size must be >= 2, got {args.size}")
        nbytes = generate(args.out, args.samples, n_val, args.size, seed=args.seed,
                          workers=max(1, args.workers), compress=not args.plain, level=args.gzip_level, progress=not args.quiet)
        print(f"wrote {args.samples} train + {n_val} validation CosmoFlow samples "
              f"({args.size}^3 x 4 int16, {nbytes / 2**20:.1f} MiB uncompressed) to {args.out}")
