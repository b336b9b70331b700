"""The CosmoFlow sample format: one ``tf.train.Example`` per TFRecord file (gzip or plain).

Feature ``x`` holds the raw bytes of an int16 array ``[S, S, S, 4]`` (particle counts per voxel in
four redshift bins; S = 128 in the MLPerf dataset), feature ``y`` the 4 normalized cosmological
parameters as float32. The dataset root has ``train/`` and ``validation/`` folders.

:func:`read_sample` validates everything a file can get wrong (the framing and both CRCs of exactly
one record, the presence, kind and size of ``x`` and ``y``, every ``y`` finite: ``x`` is int16, always
finite) and raises a :class:`DataError` naming the file and what was expected. :func:`read_into` does
the same straight into a slot of a batch buffer: an uncompressed file is read once, placed so that its
``x`` bytes land in the slot, its payload CRC taken piece by piece as it arrives; the batch needs no
collate copy. A gzip file is
inflated in one call into a buffer of the final size, validated, and its ``x`` copied to the slot.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

import numpy as np

from hpcbench.common.errors import DataError

from hpcbench.common.data import tfrecord
from .layout import LAYOUT

N_CHANNELS = 4
N_TARGETS = 4
_EXAMPLE_OVERHEAD = 128  # protobuf tags, lengths and y around x (55 bytes): sizes the inflate buffer
HEAD_BYTES = 4096  # read first, to find where x starts in the file
PAD = 4096  # free bytes before the first slot and after the last of a batch buffer (a placed file's head, tail)


class Sample(NamedTuple):
    x: np.ndarray  # int16 [S, S, S, 4]
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
    if not np.isfinite(y).all():  # 4 values: free; a NaN label would only show up as a NaN loss later
        raise DataError(f"{name}: label 'y' is not finite ({', '.join(f'{v:g}' for v in y)}); every target "
                        "must be a finite number")
    x = np.frombuffer(xs[0], dtype="<i2").reshape(size, size, size, N_CHANNELS)
    return Sample(x, y)


def buffer_bytes(size: int, n: int) -> int:
    """Bytes of a buffer for :func:`read_into` with ``n`` slots: PAD, n times ``x``, PAD."""
    return PAD + n * x_bytes(size) + PAD


def slot(buf: np.ndarray, size: int, j: int) -> np.ndarray:
    """Slot ``j``'s x of a :func:`buffer_bytes` buffer, as int16 [S, S, S, 4]."""
    start = PAD + j * x_bytes(size)
    return buf[start:start + x_bytes(size)].view("<i2").reshape(size, size, size, N_CHANNELS)


def read_sample(path: str | Path, size: int) -> Sample:
    """One validated sample file: exactly one record, both CRCs, ``x`` and ``y`` as expected."""
    buf = np.empty(buffer_bytes(size, 1), np.uint8)
    y = read_into(path, size, buf, 0)
    return Sample(slot(buf, size, 0), y)


def read_into(path: str | Path, size: int, buf: np.ndarray, j: int) -> np.ndarray:
    """Read and validate one sample file (as :func:`read_sample`) with its ``x`` going to slot ``j``
    of ``buf`` (uint8, :func:`buffer_bytes` long); returns ``y``. The file's bytes after ``x`` (a few
    dozen) may land in slot ``j + 1``: fill a buffer's slots in order. The bytes before ``x`` go to
    the end of slot ``j - 1`` and are put back."""
    name, xb = str(path), x_bytes(size)
    at = PAD + j * xb
    try:
        with open(path, "rb", buffering=0) as fh:
            nbytes = os.fstat(fh.fileno()).st_size
            head = fh.read(HEAD_BYTES)
            off = None if head[:2] == tfrecord.GZIP_MAGIC else tfrecord.value_offset(head, "x")
            if off is not None and off <= at and at - off + nbytes <= len(buf):
                start = at - off
                saved = buf[start:at].copy()  # the previous slot's last bytes
                fh.seek(0)
                view = memoryview(buf)[start:start + nbytes]
                try:
                    n, crc = tfrecord.read_into(fh, view)
                    sample = decode_sample(tfrecord.single_record(view[:n], name, crc), size, name)
                finally:
                    buf[start:at] = saved
                if sample.x.ctypes.data == buf.ctypes.data + at:
                    return sample.y
    except OSError as exc:
        raise DataError(f"{path}: cannot read TFRecord file: {exc.strerror or exc}") from None
    sample = _read_whole(path, size)  # gzip, or x not where the headers said: copy it into the slot
    buf[at:at + xb] = sample.x.reshape(-1).view(np.uint8)
    return sample.y


def _read_whole(path: str | Path, size: int) -> Sample:
    """Read (and inflate) the whole file into one buffer and validate it; ``x`` is a view of it."""
    name = str(path)
    stream = tfrecord.read_file_bytes(path, size_hint=tfrecord.HEADER_BYTES + x_bytes(size) + _EXAMPLE_OVERHEAD
                                      + tfrecord.FOOTER_BYTES)
    return decode_sample(tfrecord.single_record(stream, name), size, name)


def write_sample(path: str | Path, x: np.ndarray, y: np.ndarray, compress: bool = True, level: int = 6) -> None:
    """Write one sample file atomically (see :mod:`hpcbench.workloads.cosmoflow.synth` for datagen's writer)."""
    tfrecord.write_records(path, [encode_sample(x, y)], compress=compress, level=level)


def list_files(root: str | Path, split: str) -> list[Path]:
    """The layout's sorted sample files of ``root/split``; a missing or empty folder is a DataError."""
    return LAYOUT.list_split(root, split)

