"""Synthetic datasets in the real on-disk formats, for the staging tests and benchmark only.

CosmoFlow-like samples: one ``tf.train.Example`` per TFRecord file with ``x`` = int16 particle
counts [n,n,n,4] (Poisson draws of a log-normal density field, mean about 1 per voxel, so the count
statistics and hence the compressibility resemble the real data) and ``y`` = 4 float32.
"""
from __future__ import annotations

import gzip
import struct
from pathlib import Path

import crc32c
import numpy as np


def _masked_crc(data: bytes) -> int:
    c = crc32c.crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def tfrecord_frame(payload: bytes) -> bytes:
    n = struct.pack("<Q", len(payload))
    return n + struct.pack("<I", _masked_crc(n)) + payload + struct.pack("<I", _masked_crc(payload))


def _varint(v: int) -> bytes:
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        out.append(b | (0x80 if v else 0))
        if not v:
            return bytes(out)


def _ld(field: int, data: bytes) -> bytes:  # length-delimited protobuf field
    return _varint(field << 3 | 2) + _varint(len(data)) + data


def example(x: bytes, y: np.ndarray) -> bytes:
    """A tf.train.Example with feature x (bytes_list) and y (float_list), hand-encoded protobuf."""
    fx = _ld(1, _ld(1, x))  # Feature.bytes_list{value}
    fy = _ld(2, _ld(1, y.astype("<f4").tobytes()))  # Feature.float_list{packed value}
    feats = _ld(1, _ld(1, b"x") + _ld(2, fx)) + _ld(1, _ld(1, b"y") + _ld(2, fy))
    return _ld(1, feats)  # Example.features


def cosmo_counts(rng: np.random.Generator, n: int) -> np.ndarray:
    """int16 [n,n,n,4]: Poisson counts of a smoothed log-normal field, mean ~1 per voxel."""
    g = rng.standard_normal((n, n, n)).astype(np.float32)
    k = np.fft.fftfreq(n).astype(np.float32)
    k2 = k[:, None, None] ** 2 + k[None, :, None] ** 2 + k[None, None, :] ** 2
    g = np.fft.ifftn(np.fft.fftn(g) * np.exp(-k2 * 400.0)).real
    g = (g - g.mean()) / (g.std() + 1e-6)
    out = np.empty((n, n, n, 4), dtype=np.int16)
    for z in range(4):  # four redshift bins: structure grows with time
        sigma = 0.6 + 0.2 * z
        lam = np.exp(sigma * g - sigma**2 / 2)
        out[..., z] = rng.poisson(lam).astype(np.int16)
    return out


def write_cosmoflow(root: Path, n_train: int, n_val: int, size: int = 16, gz: bool = False, seed: int = 0) -> list[Path]:
    rng = np.random.default_rng(seed)
    paths = []
    for split, count in (("train", n_train), ("validation", n_val)):
        (root / split).mkdir(parents=True, exist_ok=True)
        for i in range(count):
            rec = tfrecord_frame(example(cosmo_counts(rng, size).tobytes(), rng.uniform(-1, 1, 4)))
            p = root / split / f"univ_{i:05d}.tfrecord{'.gz' if gz else ''}"
            p.write_bytes(gzip.compress(rec, 1) if gz else rec)
            paths.append(p)
    return paths


def write_deepcam(root: Path, n_train: int, n_val: int, h: int = 24, w: int = 36, seed: int = 0) -> None:
    import h5py

    rng = np.random.default_rng(seed)
    for split, count in (("train", n_train), ("validation", n_val)):
        (root / split).mkdir(parents=True, exist_ok=True)
        for i in range(count):
            with h5py.File(root / split / f"data-{i:04d}.h5", "w") as f:
                f["climate/data"] = rng.standard_normal((h, w, 16)).astype(np.float32)
                f["climate/labels_0"] = rng.integers(0, 3, (h, w)).astype(np.int32)
    with h5py.File(root / "stats.h5", "w") as f:
        for k in ("count", "mean", "sqmean", "minval", "maxval"):
            f[f"climate/{k}"] = rng.random(16).astype(np.float32)


def write_lmdb(path: Path, entries: int, value_bytes: int, seed: int = 0) -> None:
    import lmdb

    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    env = lmdb.open(str(path), subdir=False, map_size=1 << 30, lock=False)
    with env.begin(write=True) as txn:
        for i in range(entries):
            txn.put(str(i).encode(), rng.integers(0, 8, value_bytes, dtype=np.uint8).tobytes())
        txn.put(b"length", str(entries).encode())
    env.close()
