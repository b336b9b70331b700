"""The DeepCAM on-disk format: a validating sample reader and the per-channel normalization.

Layout (MLPerf HPC DeepCAM): ``<root>/{train,validation}/data-*.h5``, one sample per file with
``climate/data`` float32 (H, W, C) and ``climate/labels_0`` (H, W) with classes {0 background,
1 tropical cyclone, 2 atmospheric river}; ``<root>/stats.h5`` holds per-channel
``climate/{count,mean,sqmean,minval,maxval}``. Inputs are normalized as (x - min) / (max - min).
Every error is a :class:`DataError` that names the file (and dataset) and what was expected: the
statistics and the read data must be finite and the data stored as float32 (what the statistics were
computed on), else a NaN would train silently (the loss turns NaN) and other types would be
normalized with statistics that were not theirs.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

from hpcbench.common.data.values import all_finite
from hpcbench.common.errors import HDF5_ERRORS, DataError

from .layout import LAYOUT

NUM_CLASSES = 3
DATA_DTYPE = "float32 (H, W, C)"
LABEL_DTYPE = "uint8 class indices 0, 1, 2 (any integer or integral float type is converted)"
STATS_KEYS = ("count", "mean", "sqmean", "minval", "maxval")


def list_samples(root: str | Path, split: str) -> list[Path]:
    """Sorted ``data-*.h5`` files of ``root/split``; a missing or empty folder is a DataError."""
    return LAYOUT.list_split(root, split)


@dataclass(frozen=True)
class Normalizer:
    """Per-channel (x - shift) * scale with shift = min and scale = 1 / (max - min)."""

    shift: np.ndarray  # (C,) float32
    scale: np.ndarray  # (C,) float32

    @classmethod
    def from_stats(cls, path: str | Path, channels: Sequence[int]) -> Normalizer:
        path = Path(path)
        if not path.is_file():
            raise DataError(f"DeepCAM statistics file '{path}' does not exist")
        try:
            with h5py.File(path, "r") as f:
                missing = [k for k in STATS_KEYS if f"climate/{k}" not in f]
                if missing:
                    raise DataError(f"'{path}': missing datasets {', '.join('climate/' + k for k in missing)}")
                lo, hi = (np.asarray(f[f"climate/{k}"][...], dtype=np.float64) for k in ("minval", "maxval"))
        except HDF5_ERRORS as exc:
            raise DataError(f"cannot read DeepCAM statistics file '{path}': {exc}") from None
        if lo.ndim != 1 or hi.shape != lo.shape or max(channels) >= lo.shape[0]:
            raise DataError(f"'{path}': climate/minval and climate/maxval must be 1-D per-channel arrays "
                            f"covering channels {list(channels)}, got shapes {lo.shape} and {hi.shape}")
        lo, hi = lo[list(channels)], hi[list(channels)]
        for name, values in (("minval", lo), ("maxval", hi)):
            bad = ~np.isfinite(values)
            if bad.any():  # NaN passes the comparison below and would make every input NaN
                raise DataError(f"'{path}': climate/{name} is {values[bad][0]:g} for channel "
                                f"{channels[int(np.argmax(bad))]}; the statistics must be finite")
        if np.any(hi <= lo):
            raise DataError(f"'{path}': maxval must exceed minval for every channel")
        return cls(lo.astype(np.float32), (1.0 / (hi - lo)).astype(np.float32))

    def apply(self, hwc: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        out = np.subtract(hwc, self.shift, out=out)
        return np.multiply(out, self.scale, out=out)


def _check_dtype(path: Path, name: str, dset: h5py.Dataset, expected: str) -> None:
    """A numeric dataset (HDF5 converts other numeric types on reading); strings, compounds and
    the like are a :class:`DataError` naming the file, the dataset, the dtype found and expected."""
    if dset.dtype.kind not in "fiub":
        found = "strings" if h5py.check_string_dtype(dset.dtype) or dset.dtype.kind == "S" else "non-numeric"
        raise DataError(f"'{path}': {name} has dtype {dset.dtype} ({found}); expected {expected}")


def _check_data_dtype(path: Path, dset: h5py.Dataset) -> None:
    """climate/data must be float32 (either byte order): ``stats.h5`` describes float32 values, and an
    integer or float64 copy normalized with them would train on something else than the reference."""
    _check_dtype(path, "climate/data", dset, DATA_DTYPE)
    if dset.dtype.kind != "f" or dset.dtype.itemsize != 4:
        raise DataError(f"'{path}': climate/data has dtype {dset.dtype}; expected {DATA_DTYPE} "
                        "(convert the file, e.g. with h5py, to float32)")


def _check_finite(path: Path, channels: Sequence[int], data: np.ndarray) -> None:
    """A NaN or infinity in the read data (H, W, len(channels)) is a DataError naming the channel.
    The fast path is :func:`~hpcbench.common.data.values.all_finite`, one BLAS pass over the buffer just
    read (about 1.2 ms for 768x1152x16 on one core, against 2.2 ms for ``np.isfinite(data).all()``); only
    a non-finite value runs the search for the channel."""
    if all_finite(data):
        return
    bad = ~np.isfinite(data)
    per_channel = bad.sum(axis=(0, 1))
    k = int(np.flatnonzero(per_channel)[0])
    value = data[..., k][bad[..., k]][0]
    raise DataError(f"'{path}': climate/data channel {channels[k]} holds {value} at {int(per_channel[k])} "
                    f"pixel(s); the data must be finite")


def sample_shape(path: Path, multiple: int = 1) -> tuple[int, int]:
    """(H, W) of one sample file: the grid every sample of its split must have. Both must be
    multiples of ``multiple`` (the model's output stride)."""
    try:
        with h5py.File(path, "r") as f:
            if "climate/data" not in f:
                raise DataError(f"'{path}': expected dataset climate/data of shape (H, W, C); the file has "
                                f"{sorted(f.get('climate', {}).keys()) if isinstance(f.get('climate'), h5py.Group) else 'no climate group'}")
            if f["climate/data"].ndim != 3:
                raise DataError(f"'{path}': climate/data has shape {f['climate/data'].shape}; expected (H, W, C)")
            _check_data_dtype(path, f["climate/data"])
            h, w = f["climate/data"].shape[:2]
    except HDF5_ERRORS as exc:
        raise DataError(f"cannot read DeepCAM sample '{path}': {exc}") from None
    if h % multiple or w % multiple:
        down = f"{max(multiple, h // multiple * multiple)}x{max(multiple, w // multiple * multiple)}"
        up = f"{-(-h // multiple) * multiple}x{-(-w // multiple) * multiple}"
        raise DataError(f"'{path}': climate/data is a {h}x{w} grid; the DeepCAM model needs height and width that "
                        f"are multiples of its output stride {multiple} (the MLPerf reference takes 768x1152 and "
                        f"neither crops nor pads). Crop the data to {down} or pad it to {up}")
    return int(h), int(w)


def read_sample(path: Path, channels: Sequence[int], shape: tuple[int, int] | None = None,
                check_labels: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """(data (H, W, len(channels)) float32, labels (H, W) uint8) of one file, validated."""
    return _read(path, channels, shape, None, check_labels)


def read_into(path: Path, channels: Sequence[int], data: np.ndarray, labels: np.ndarray,
              check_labels: bool = True) -> None:
    """:func:`read_sample` straight into ``data`` (H, W, len(channels)) float32 and ``labels``
    (H, W) uint8, e.g. a sample's slots of a batch: HDF5 reads the stored bytes into them (and
    converts stored labels other than uint8 on the way) with no copy of its own."""
    _read(path, channels, data.shape[:2], (data, labels), check_labels)


def _read(path: Path, channels: Sequence[int], shape: tuple[int, ...] | None,
          out: tuple[np.ndarray, np.ndarray] | None, check_labels: bool) -> tuple[np.ndarray, np.ndarray]:
    try:
        with h5py.File(path, "r") as f:
            if "climate/data" not in f or "climate/labels_0" not in f:
                raise DataError(f"'{path}': expected datasets climate/data and climate/labels_0")
            dset, lset = f["climate/data"], f["climate/labels_0"]
            if dset.ndim != 3 or dset.shape[2] <= max(channels):
                raise DataError(f"'{path}': climate/data has shape {dset.shape}; expected (H, W, C) "
                                f"with C > {max(channels)}")
            if shape is not None and tuple(dset.shape[:2]) != tuple(shape):
                raise DataError(f"'{path}': climate/data is {dset.shape[0]}x{dset.shape[1]}, expected "
                                f"{shape[0]}x{shape[1]} like the rest of the dataset")
            if tuple(lset.shape) != tuple(dset.shape[:2]):
                raise DataError(f"'{path}': climate/labels_0 has shape {lset.shape}; expected {dset.shape[:2]}")
            _check_data_dtype(path, dset)
            _check_dtype(path, "climate/labels_0", lset, LABEL_DTYPE)
            h, w = dset.shape[:2]
            data, labels = out if out is not None else (np.empty((h, w, len(channels)), np.float32),
                                                         np.empty((h, w), np.uint8))
            if list(channels) == list(range(dset.shape[2])):
                dset.read_direct(data)
            else:
                data[...] = dset[...][..., list(channels)]
            stored = labels
            if lset.dtype == labels.dtype:
                lset.read_direct(labels)
            else:
                stored = lset[...]
    except HDF5_ERRORS as exc:
        raise DataError(f"cannot read DeepCAM sample '{path}': {exc}") from None
    _check_finite(path, channels, data)
    if check_labels:
        if stored.dtype == np.uint8:  # one pass: only values above 2 can be wrong
            bad = stored >= NUM_CLASSES
        else:
            bad = (stored < 0) | (stored >= NUM_CLASSES) | (stored != np.round(stored))
        if bad.any():
            raise DataError(f"'{path}': climate/labels_0 holds value {stored[bad].flat[0].item():g} at "
                            f"{int(bad.sum())} pixel(s); classes must be 0, 1 or 2")
    if stored is not labels:
        labels[...] = stored
    return data, labels
