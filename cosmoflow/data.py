"""The CosmoFlow sample format: one ``tf.train.Example`` per TFRecord file (gzip or plain).

Feature ``x`` holds the raw bytes of an int16 array ``[S, S, S, 4]`` (particle counts per voxel in
four redshift bins; S = 128 in the MLPerf dataset), feature ``y`` the 4 normalized cosmological
parameters as float32. The dataset root has ``train/`` and ``validation/`` folders.

:func:`read_sample` validates everything a file can get wrong (the framing and both CRCs of exactly
one record, the presence, kind and size of ``x`` and ``y``) and raises a :class:`DataError` naming
the file and what was expected. It reads the file once and decodes without copying: the sample's
``x`` is a read-only view of the file's (inflated) bytes.
"""
from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import numpy as np

from common.errors import DataError

from . import tfrecord
from .dataset import LAYOUT

N_CHANNELS = 4
N_TARGETS = 4
_EXAMPLE_OVERHEAD = 128  # protobuf tags, lengths and y around x (55 bytes): sizes the inflate buffer


class Sample(NamedTuple):
    x: np.ndarray  # int16 [S, S, S, 4] (read-only when read from a file)
    y: np.ndarray  # float32 [4]


def x_bytes(size: int) -> int:
    """Bytes of feature ``x`` for cube edge ``size``."""
    return size ** 3 * N_CHANNELS * 2


def encode_sample(x: np.ndarray, y: np.ndarray) -> bytes:
    """The serialized Example of one sample."""
    if x.dtype != np.int16 or x.ndim != 4 or x.shape[-1] != N_CHANNELS:
        raise ValueError(f"x must be int16 [S,S,S,{N_CHANNELS}], got {x.dtype} {x.shape}")
    return tfrecord.encode_example({"x": np.ascontiguousarray(x).astype("<i2").tobytes(),
                                    "y": np.asarray(y, dtype=np.float32).reshape(N_TARGETS)})


def _describe(value: tfrecord.Feature) -> str:
    """E.g. 'int64_list of 4 values'."""
    if isinstance(value, np.ndarray):
        kind, n = ("float_list" if value.dtype == np.float32 else "int64_list"), value.size
    else:
        kind, n = "bytes_list", len(value)
    return f"{kind} of {n} value{'' if n == 1 else 's'}"


def decode_sample(payload: bytes | memoryview, size: int, name: str) -> Sample:
    """Parse one Example: ``x`` exactly one bytes value of int16 ``[size]*3 + [4]``, ``y`` exactly
    4 float32 values. ``x`` is a view of ``payload``."""
    feats = tfrecord.decode_example(payload, name)
    missing = [k for k in ("x", "y") if k not in feats]
    if missing:
        raise DataError(f"{name}: Example lacks feature {' and '.join(repr(k) for k in missing)} "
                        f"(has: {', '.join(sorted(feats)) or 'none'}); expected 'x' (int16 bytes) and "
                        f"'y' ({N_TARGETS} float32)")
    xs, y = feats["x"], feats["y"]
    if not isinstance(xs, list) or len(xs) != 1:
        raise DataError(f"{name}: feature 'x' must be one bytes value (bytes_list), got {_describe(xs)}")
    expected = x_bytes(size)
    if len(xs[0]) != expected:
        raise DataError(f"{name}: feature 'x' has {len(xs[0])} bytes; expected int16 "
                        f"[{size},{size},{size},{N_CHANNELS}] = {expected} bytes (data.size={size})")
    if not isinstance(y, np.ndarray) or y.dtype != np.float32 or y.shape != (N_TARGETS,):
        raise DataError(f"{name}: feature 'y' must be {N_TARGETS} float32 values (float_list), got {_describe(y)}")
    x = np.frombuffer(xs[0], dtype="<i2").reshape(size, size, size, N_CHANNELS)
    return Sample(x, y)


def read_sample(path: str | Path, size: int) -> Sample:
    """One validated sample file: exactly one record, both CRCs, ``x`` and ``y`` as expected."""
    name = str(path)
    stream = tfrecord.read_file_bytes(path, size_hint=tfrecord.HEADER_BYTES + x_bytes(size) + _EXAMPLE_OVERHEAD
                                      + tfrecord.FOOTER_BYTES)
    return decode_sample(tfrecord.single_record(stream, name), size, name)


def write_sample(path: str | Path, x: np.ndarray, y: np.ndarray, compress: bool = True, level: int = 6) -> None:
    """Write one sample file atomically (see :mod:`cosmoflow.synth` for datagen's writer)."""
    tfrecord.write_records(path, [encode_sample(x, y)], compress=compress, level=level)


def list_files(root: str | Path, split: str) -> list[Path]:
    """The layout's sorted sample files of ``root/split``; a missing or empty folder is a DataError."""
    return LAYOUT.list_split(root, split)

