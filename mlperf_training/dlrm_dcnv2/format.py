"""The MLPerf Criteo multi-hot on-disk format: a memory-mapped validating reader and its writer.

One day ``d`` is three files in one folder (the layout of the reference's materialized dataset):

* ``day_{d}_dense.npy``: float32 (N, 13), the dense features already transformed as log(x + 3);
* ``day_{d}_labels.npy``: int32 (N, 1), clicks 0/1;
* ``day_{d}_sparse_multi_hot.npz``: ``np.savez`` (stored, not compressed) with members ``"0"`` ...
  ``"25"``, each int32 (N, h_k) with the bag size h_k of feature k.

Nothing is read into memory on open: the ``.npy`` files are mapped with ``np.load(mmap_mode="r")``
and every ``.npz`` member is mapped at its offset in the zip (a stored member is the plain ``.npy``
bytes), so a 4 TB dataset opens in milliseconds and a batch reads only its rows. Opening checks
every file's presence, dtype, shape and the agreement of row counts; reading rows checks their
values (ids within the table, labels 0/1, finite dense values), cheaply, on just those rows. Every
error is a :class:`DataError` that names the file (and member) and what was expected.
"""
from __future__ import annotations

import math
import os
import struct
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hpcbench.common.data.values import all_finite, first_non_finite
from hpcbench.common.errors import DataError

from .criteo import NUM_DENSE, NUM_SPARSE, dense_name, labels_name, sparse_name

_LOCAL_HEADER = b"PK\x03\x04"


@dataclass(frozen=True)
class Rows:
    """Host arrays of some rows: dense float32 (B, 13), labels int32 (B,), sparse int32 (B, h_k) each."""

    dense: np.ndarray
    labels: np.ndarray
    sparse: list[np.ndarray]

    def __len__(self) -> int:
        return int(self.dense.shape[0])


def _dtypes(want: np.dtype | type, found: np.dtype) -> tuple[str, str]:
    """How to name the expected and the found dtype in an error: by name, and by byte order as well
    when only that differs (a big-endian float32 is not the format's little-endian float32)."""
    want, found = np.dtype(want), np.dtype(found)
    if want.name != found.name or want == found:
        return want.name, found.name
    order = {">": " (big-endian)", "<": " (little-endian)"}.get(found.str[0], "")
    return f"{want.name} '{want.str}'", f"{found.name} '{found.str}'{order}"


def _load_npy(path: Path, dtype: np.dtype, cols: int) -> np.ndarray:
    if not path.is_file():
        raise DataError(f"{path}: file not found (one day of the Criteo multi-hot dataset is "
                        f"day_<d>_dense.npy, day_<d>_labels.npy and day_<d>_sparse_multi_hot.npz)")
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise DataError(f"{path}: not a readable .npy file ({exc})") from None
    if arr.dtype != dtype or arr.ndim != 2 or arr.shape[1] != cols:
        want, found = _dtypes(dtype, arr.dtype)
        raise DataError(f"{path}: expected {want} (N, {cols}), found {found} {arr.shape}")
    return arr


def _member_map(zf: zipfile.ZipFile, path: Path, key: str) -> np.ndarray:
    """Memory-map one stored ``.npy`` member of an ``.npz`` at its offset (nothing is decompressed)."""
    info = zf.getinfo(f"{key}.npy")
    if info.compress_type != zipfile.ZIP_STORED:
        raise DataError(f"{path}: member '{key}' is compressed; the format is np.savez (stored), "
                        f"not np.savez_compressed, so that members can be memory-mapped")
    with open(path, "rb") as f:
        f.seek(info.header_offset)
        head = f.read(30)
        if len(head) != 30 or head[:4] != _LOCAL_HEADER:
            raise DataError(f"{path}: member '{key}': bad zip local header at byte {info.header_offset}")
        name_len, extra_len = struct.unpack("<HH", head[26:30])
        start = info.header_offset + 30 + name_len + extra_len  # the local extra may differ from the central one
        f.seek(start)
        try:
            version = np.lib.format.read_magic(f)
            read_header = {(1, 0): np.lib.format.read_array_header_1_0,
                           (2, 0): np.lib.format.read_array_header_2_0}.get(version)
            if read_header is None:
                raise ValueError(f"unsupported .npy version {version}")
            shape, fortran, dtype = read_header(f)
        except ValueError as exc:
            raise DataError(f"{path}: member '{key}' is not a .npy array ({exc})") from None
        offset = f.tell()
    payload = math.prod(shape) * dtype.itemsize
    if offset - start + payload != info.file_size or offset + payload > path.stat().st_size:
        raise DataError(f"{path}: member '{key}' is truncated or corrupt: its .npy header says {dtype.name} "
                        f"{shape} ({payload} bytes) but the zip entry holds {info.file_size - (offset - start)}")
    if payload == 0:
        return np.zeros(shape, dtype)
    return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape, order="F" if fortran else "C")


def open_sparse(path: Path, bag_sizes: Sequence[int]) -> list[np.ndarray]:
    """The 26 multi-hot members of ``path``, memory-mapped, checked against ``bag_sizes``."""
    if not path.is_file():
        raise DataError(f"{path}: file not found (expected the np.savez multi-hot sparse features)")
    try:
        with zipfile.ZipFile(path) as zf:
            names = set(zf.namelist())
            want = [f"{k}.npy" for k in range(len(bag_sizes))]
            missing = [n[:-4] for n in want if n not in names]
            if missing:
                raise DataError(f"{path}: missing member(s) {', '.join(repr(m) for m in missing)} "
                                f"(expected keys '0' .. '{len(bag_sizes) - 1}')")
            extra = sorted(names - set(want))
            if extra:
                raise DataError(f"{path}: unexpected member(s) {', '.join(extra)} "
                                f"(expected exactly keys '0' .. '{len(bag_sizes) - 1}')")
            arrays = [_member_map(zf, path, str(k)) for k in range(len(bag_sizes))]
    except zipfile.BadZipFile as exc:
        raise DataError(f"{path}: not a readable .npz (zip) file ({exc})") from None
    for k, (arr, h) in enumerate(zip(arrays, bag_sizes)):
        if arr.dtype != np.int32 or arr.ndim != 2 or arr.shape[1] != h:
            want, found = _dtypes(np.int32, arr.dtype)
            raise DataError(f"{path}: member '{k}': expected {want} (N, {h}), found {found} {arr.shape}")
    return arrays


@dataclass
class Day:
    """One day's files, memory-mapped and checked for dtypes, shapes and equal row counts."""

    folder: Path
    day: int
    dense: np.ndarray
    labels: np.ndarray
    sparse: list[np.ndarray]
    cardinalities: tuple[int, ...] | None = None

    @classmethod
    def open(cls, folder: str | Path, day: int, bag_sizes: Sequence[int],
             cardinalities: Sequence[int] | None = None) -> Day:
        folder = Path(folder)
        return cls.open_files(folder / dense_name(day), folder / labels_name(day), folder / sparse_name(day),
                              bag_sizes, cardinalities, day=day)

    @classmethod
    def open_files(cls, dense_path: Path, labels_path: Path, sparse_path: Path, bag_sizes: Sequence[int],
                   cardinalities: Sequence[int] | None = None, day: int = -1) -> Day:
        if len(bag_sizes) != NUM_SPARSE:
            raise DataError(f"expected {NUM_SPARSE} multi-hot bag sizes, got {len(bag_sizes)}")
        dense = _load_npy(dense_path, np.dtype(np.float32), NUM_DENSE)
        labels = _load_npy(labels_path, np.dtype(np.int32), 1)
        sparse = open_sparse(sparse_path, bag_sizes)
        n = dense.shape[0]
        if labels.shape[0] != n:
            raise DataError(f"{labels_path}: {labels.shape[0]} rows but {dense_path.name} has {n}")
        for k, arr in enumerate(sparse):
            if arr.shape[0] != n:
                raise DataError(f"{sparse_path}: member '{k}' has {arr.shape[0]} rows but {dense_path.name} has {n}")
        cards = tuple(int(c) for c in cardinalities) if cardinalities is not None else None
        return cls(dense_path.parent, day, dense, labels, sparse, cards)

    def __len__(self) -> int:
        return int(self.dense.shape[0])

    def rows(self, index: slice | np.ndarray) -> Rows:
        """Copies of the given rows (a slice or an index array), with their values checked."""
        dense = np.ascontiguousarray(self.dense[index])
        labels = np.ascontiguousarray(self.labels[index]).reshape(-1)
        sparse = [np.ascontiguousarray(s[index]) for s in self.sparse]
        where = f"rows {index.start}..{index.stop}" if isinstance(index, slice) else f"{len(dense)} rows"
        if not all_finite(dense):
            (r, c), v = first_non_finite(dense)
            raise DataError(f"{self.folder / dense_name(self.day)}: {where}: dense feature {c} of row {r} of "
                            f"these is {v}; every dense value must be finite")
        if labels.size and (labels.min() < 0 or labels.max() > 1):
            raise DataError(f"{self.folder / labels_name(self.day)}: {where}: labels must be 0 or 1, "
                            f"found {labels.min()}..{labels.max()}")
        if self.cardinalities is not None:
            for k, (ids, card) in enumerate(zip(sparse, self.cardinalities)):
                if ids.size and (ids.min() < 0 or ids.max() >= card):
                    raise DataError(f"{self.folder / sparse_name(self.day)}: member '{k}': {where}: ids must be in "
                                    f"[0, {card}), found {ids.min()}..{ids.max()} (table sizes come from the config's "
                                    "model.cardinalities; data from `hpcbench datagen dlrm_dcnv2` must be generated "
                                    "with the same --cardinalities)")
        return Rows(dense, labels, sparse)


def eval_halves(n: int) -> tuple[slice, slice]:
    """The reference's split of the last day: validation = the first ceil(n/2) rows, test = the rest."""
    mid = n // 2 + n % 2
    return slice(0, mid), slice(mid, n)


class CriteoSplit:
    """The rows of one split: ``train`` = days 0 .. days-2 in order, ``validation``/``test`` = the first/second
    half of day ``days-1`` (as the reference). Item ``i`` is one validated sample; :meth:`read` reads many."""

    SPLITS = ("train", "validation", "test")

    def __init__(self, folder: str | Path, split: str, days: int, bag_sizes: Sequence[int],
                 cardinalities: Sequence[int] | None = None) -> None:
        if split not in self.SPLITS:
            raise DataError(f"unknown split '{split}': expected one of {', '.join(self.SPLITS)}")
        if days < 2:
            raise DataError(f"a Criteo multi-hot dataset needs at least 2 days (train days and one eval day), "
                            f"got {days}")
        folder = Path(folder)
        if split == "train":
            train = [Day.open(folder, d, bag_sizes, cardinalities) for d in range(days - 1)]
            self.parts = [(day, slice(0, len(day))) for day in train]
        else:
            last = Day.open(folder, days - 1, bag_sizes, cardinalities)
            self.parts = [(last, eval_halves(len(last))[0 if split == "validation" else 1])]
        self.split = split
        self.starts = np.cumsum([0] + [p.stop - p.start for _, p in self.parts])

    def __len__(self) -> int:
        return int(self.starts[-1])

    def costs(self) -> np.ndarray:
        return np.ones(len(self))

    def __getitem__(self, i: int) -> Rows:
        return self.read(np.array([i]))

    def read(self, indices: np.ndarray) -> Rows:
        """Rows ``indices`` of the split (any order; each day's rows are read in sorted order)."""
        indices = np.asarray(indices, dtype=np.int64)
        if indices.size and (indices.min() < 0 or indices.max() >= len(self)):
            raise IndexError(f"{self.split}: row index out of range 0..{len(self) - 1}")
        part = np.searchsorted(self.starts, indices, side="right") - 1
        pieces: list[tuple[np.ndarray, Rows]] = []
        for p in np.unique(part):
            where = np.nonzero(part == p)[0]
            day, rows = self.parts[p]
            local = indices[where] - self.starts[p] + rows.start
            order = np.argsort(local, kind="stable")
            got = day.rows(local[order])
            pieces.append((where[order], got))
        if len(pieces) == 1 and np.array_equal(pieces[0][0], np.arange(len(indices))):
            return pieces[0][1]
        out = Rows(np.empty((len(indices), NUM_DENSE), np.float32), np.empty(len(indices), np.int32),
                   [np.empty((len(indices), s.shape[1]), np.int32) for s in self.parts[0][0].sparse])
        for where, got in pieces:
            out.dense[where], out.labels[where] = got.dense, got.labels
            for dst, src in zip(out.sparse, got.sparse):
                dst[where] = src
        return out


def _check_arrays(n: int, dense: np.ndarray, labels: np.ndarray, sparse: Sequence[np.ndarray],
                  bag_sizes: Sequence[int]) -> None:
    if dense.dtype != np.float32 or dense.shape != (n, NUM_DENSE):
        want, found = _dtypes(np.float32, dense.dtype)
        raise DataError(f"dense: expected {want} ({n}, {NUM_DENSE}), got {found} {dense.shape}")
    if labels.dtype != np.int32 or labels.shape != (n, 1):
        want, found = _dtypes(np.int32, labels.dtype)
        raise DataError(f"labels: expected {want} ({n}, 1), got {found} {labels.shape}")
    if len(sparse) != len(bag_sizes):
        raise DataError(f"sparse: expected {len(bag_sizes)} features, got {len(sparse)}")
    for k, (s, h) in enumerate(zip(sparse, bag_sizes)):
        if s.dtype != np.int32 or s.shape != (n, h):
            want, found = _dtypes(np.int32, s.dtype)
            raise DataError(f"sparse feature {k}: expected {want} ({n}, {h}), got {found} {s.shape}")


def write_day(folder: str | Path, day: int, dense: np.ndarray, labels: np.ndarray, sparse: Sequence[np.ndarray],
              bag_sizes: Sequence[int], cardinalities: Sequence[int] | None = None) -> None:
    """Write one day in the published layout: temporary files first, read back and compared with the
    validating reader, then renamed, so a day whose three files exist under their names is complete."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    n = int(dense.shape[0]) if dense.ndim else 0
    _check_arrays(n, dense, labels, sparse, bag_sizes)
    final = [folder / dense_name(day), folder / labels_name(day), folder / sparse_name(day)]
    tmp = [p.with_name(f".{p.name}.tmp") for p in final]
    try:
        with open(tmp[0], "wb") as f:
            np.save(f, dense)
        with open(tmp[1], "wb") as f:
            np.save(f, labels)
        with open(tmp[2], "wb") as f:  # a file object: np.savez would append ".npz" to a name
            np.savez(f, **{str(k): s for k, s in enumerate(sparse)})
        back = Day.open_files(*tmp, bag_sizes, cardinalities, day=day)
        if not (np.array_equal(back.dense, dense) and np.array_equal(back.labels, labels)
                and all(np.array_equal(a, b) for a, b in zip(back.sparse, sparse))):
            raise DataError(f"{folder}: day {day} read back differs from what was written")
        if len(back):
            back.rows(slice(0, len(back)))  # value checks (ids within the tables, labels 0/1)
        del back
        for t, p in zip(tmp, final):
            os.replace(t, p)
    finally:
        for t in tmp:
            t.unlink(missing_ok=True)
