"""The CosmoFlow sample format: one ``tf.train.Example`` per TFRecord file (gzip or plain).

Feature ``x`` holds the raw bytes of an int16 array ``[S, S, S, 4]`` (particle counts per voxel in
four redshift bins; S = 128 in the MLPerf dataset), feature ``y`` the 4 normalized cosmological
parameters as float32. The dataset root has ``train/`` and ``validation/`` folders.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from common.errors import DataError

from . import tfrecord

SPLITS = ("train", "validation")
N_CHANNELS = 4
N_TARGETS = 4
SUFFIXES = (".tfrecord", ".tfrecord.gz", ".tfrecords", ".tfrecords.gz")


@dataclass(frozen=True)
class Sample:
    x: np.ndarray  # int16 [S, S, S, 4]
    y: np.ndarray  # float32 [4]


def encode_sample(x: np.ndarray, y: np.ndarray) -> bytes:
    """The serialized Example of one sample."""
    if x.dtype != np.int16 or x.ndim != 4 or x.shape[-1] != N_CHANNELS:
        raise ValueError(f"x must be int16 [S,S,S,{N_CHANNELS}], got {x.dtype} {x.shape}")
    return tfrecord.encode_example({"x": np.ascontiguousarray(x).astype("<i2").tobytes(),
                                    "y": np.asarray(y, dtype=np.float32).reshape(N_TARGETS)})


def decode_sample(payload: bytes | memoryview, size: int, name: str) -> Sample:
    """Parse one Example; the cube must be ``[size]*3 + [4]`` int16 and y 4 floats."""
    feats = tfrecord.decode_example(payload, name)
    if "x" not in feats or "y" not in feats:
        raise DataError(f"{name}: Example lacks feature 'x' or 'y' (has: {', '.join(sorted(feats)) or 'none'})")
    xs, y = feats["x"], feats["y"]
    if not isinstance(xs, list) or len(xs) != 1:
        raise DataError(f"{name}: feature 'x' must be one bytes value")
    expected = size ** 3 * N_CHANNELS * 2
    if len(xs[0]) != expected:
        raise DataError(f"{name}: feature 'x' has {len(xs[0])} bytes; expected int16 "
                        f"[{size},{size},{size},{N_CHANNELS}] = {expected} bytes (data.size={size})")
    if not isinstance(y, np.ndarray) or y.dtype != np.float32 or y.shape != (N_TARGETS,):
        raise DataError(f"{name}: feature 'y' must be {N_TARGETS} float32 values, got {y!r}")
    x = np.frombuffer(xs[0], dtype="<i2").reshape(size, size, size, N_CHANNELS)
    return Sample(x, y)


def read_sample(path: str | Path, size: int) -> Sample:
    """One sample file (the first record; the format has exactly one)."""
    records = tfrecord.read_records(path)
    if len(records) != 1:
        raise DataError(f"{path}: expected exactly one record per CosmoFlow file, found {len(records)}")
    return decode_sample(records[0], size, str(path))


def write_sample(path: str | Path, x: np.ndarray, y: np.ndarray, compress: bool = True, level: int = 6) -> None:
    tfrecord.write_records(path, [encode_sample(x, y)], compress=compress, level=level)


def list_files(root: str | Path, split: str) -> list[Path]:
    """Sorted sample files of ``root/split``; a missing or empty folder is a DataError."""
    folder = Path(root) / split
    if not folder.is_dir():
        raise DataError(f"{folder}: no such folder; a CosmoFlow dataset has {' and '.join(SPLITS)} folders "
                        "(create one with `hpcbench datagen cosmoflow --out DIR`)")
    files = sorted(p for p in folder.iterdir() if p.name.endswith(SUFFIXES) and not p.name.startswith("."))
    if not files:
        raise DataError(f"{folder}: no TFRecord files (*{', *'.join(SUFFIXES)})")
    return files


def log1p_input(x: np.ndarray) -> np.ndarray:
    """The reference input transform: log(1 + counts), channels first as float32 [4, S, S, S]."""
    return np.log1p(np.moveaxis(x, -1, 0).astype(np.float32))
