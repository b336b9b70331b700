"""OC20 LMDB files: ``data.NNNN.lmdb`` (subdir=False), keys ``"0"``.. (one record per sample),
``"length"`` and ``"sizes"``.

Records use the pickle-free :mod:`hpcbench.workloads.opencatalyst.record` encoding. ``"sizes"`` holds the per-sample
(natoms, edges, triplets) of the file as the ``.npy`` bytes of an int64 ``[length, 3]`` array, so
a node that holds only some of a split's files (node-local staging) has exactly the sizes of its
files. Original OC20 files have no ``"sizes"`` key: their sizes are computed from the samples.
:func:`write_shard` writes a new file in place; callers write under a temporary name, verify with
:func:`verify_shard` and rename (:func:`hpcbench.common.data.datagen.generate` does).
"""
from __future__ import annotations

import io
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import lmdb
import numpy as np

from hpcbench.common.data.prefetch import prefetch_map
from hpcbench.common.errors import DataError

from . import record
from .layout import LAYOUT

LENGTH_KEY = b"length"
SIZES_KEY = b"sizes"  # reserved: int64 [length, 3] (natoms, edges, triplets) as .npy bytes
SIZE_COLUMNS = ("natoms", "edges", "triplets")
Cost = Literal["edges", "triplets"]
_MAP_SIZE = 1 << 36  # sparse file on Linux; only written pages use disk
_OPEN: dict[tuple[str, int], lmdb.Environment] = {}


def close_all() -> None:
    """Close this process's cached read environments (e.g. before replacing a file)."""
    for key in [k for k in _OPEN if k[1] == os.getpid()]:
        _OPEN.pop(key).close()


def shard_name(index: int) -> str:
    return f"data.{index:04d}.lmdb"


def sample_sizes(sample: Mapping[str, Any]) -> tuple[int, int, int]:
    """(natoms, edges, triplets) of one sample."""
    from .graph import count_triplets

    n = int(sample["natoms"])
    edge_index = np.asarray(sample["edge_index"])
    return n, int(edge_index.shape[1]), count_triplets(edge_index, np.asarray(sample["cell_offsets"]), n)


def sizes_of(samples: Iterable[Mapping[str, Any]]) -> np.ndarray:
    """int64 [n, 3]: (natoms, edges, triplets) per sample."""
    return np.asarray([sample_sizes(s) for s in samples], np.int64).reshape(-1, 3)


def encode_sizes(sizes: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.ascontiguousarray(sizes, np.int64), allow_pickle=False)
    return buf.getvalue()


def decode_sizes(raw: bytes, path: Path, length: int) -> np.ndarray:
    """The validated ``"sizes"`` value of ``path`` (a file of ``length`` samples)."""
    try:
        sizes = np.lib.format.read_array(io.BytesIO(raw), allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise DataError(f"{path}: key 'sizes' is not the .npy bytes of an int64 [length, 3] array ({exc})") from None
    if sizes.dtype != np.int64 or sizes.shape != (length, 3):
        raise DataError(f"{path}: key 'sizes' holds a {sizes.dtype} array of shape {sizes.shape}, expected int64 "
                        f"({length}, 3): (natoms, edges, triplets) of each of the file's {length} samples")
    if length and (sizes.min() < 0 or sizes[:, 0].min() < 1):
        raise DataError(f"{path}: key 'sizes' has negative sizes or a sample without atoms")
    return sizes


def write_shard(path: str | os.PathLike[str], samples: Iterable[Mapping[str, Any]]) -> np.ndarray:
    """Write ``samples`` into a new LMDB file at ``path`` with their sizes under ``"sizes"``;
    returns the sizes (int64 [n, 3])."""
    dest = Path(path)
    if dest.exists():
        raise FileExistsError(f"{dest}: write_shard makes a new file")
    rows: list[tuple[int, int, int]] = []
    env = lmdb.open(str(dest), subdir=False, map_size=_MAP_SIZE, meminit=False, lock=False)
    try:
        with env.begin(write=True) as txn:
            for sample in samples:
                txn.put(str(len(rows)).encode(), record.encode(sample))
                rows.append(sample_sizes(sample))
            sizes = np.asarray(rows, np.int64).reshape(-1, 3)
            txn.put(LENGTH_KEY, str(len(rows)).encode())
            txn.put(SIZES_KEY, encode_sizes(sizes))
        env.sync()
    finally:
        env.close()
    return sizes


def verify_shard(path: str | os.PathLike[str], expected: int) -> None:
    """Read a written file back: it opens, says ``expected`` samples and has a valid ``"sizes"``."""
    shard = Shard(path)
    try:
        if len(shard) != expected:
            raise DataError(f"{shard.path}: holds {len(shard)} samples, expected {expected}")
        if shard.stored_sizes is None:
            raise DataError(f"{shard.path}: key 'sizes' is missing")
    finally:
        shard.close()


def _check_length(path: Path, env: lmdb.Environment) -> None:
    """A file cut short (an interrupted copy) holds fewer bytes than the pages its header says are in use: LMDB
    maps the file and a read past its end kills the process with SIGBUS, so this is checked before any read."""
    need = (int(env.info()["last_pgno"]) + 1) * int(env.stat()["psize"])
    have = path.stat().st_size
    if have < need:
        raise DataError(f"{path}: truncated LMDB file: {have} bytes, but its header says pages up to "
                        f"{env.info()['last_pgno']} of {env.stat()['psize']} bytes are in use ({need} bytes); "
                        "copy or stage it again")


class Shard:
    """One read-only LMDB file; values decoded lazily by index. ``stored_sizes`` is the validated
    ``"sizes"`` key, or None for a file without one (an original OC20 file)."""

    def __init__(self, path: str | os.PathLike[str], trust_pickle: bool = False) -> None:
        self.path = Path(path)
        self.trust_pickle = trust_pickle
        if not self.path.is_file():
            raise DataError(f"{self.path}: no such LMDB file")
        raw_sizes = self._get_optional(SIZES_KEY)
        self.length = self._read_length(reserved=1 if raw_sizes is None else 2)
        self.stored_sizes = None if raw_sizes is None else decode_sizes(raw_sizes, self.path, self.length)

    @property
    def env(self) -> lmdb.Environment:
        """The process's read-only environment for this file (LMDB allows one per path and
        process; it is shared by every :class:`Shard` of the path)."""
        key = (str(self.path.resolve()), os.getpid())
        env = _OPEN.get(key)
        if env is None:
            try:
                env = lmdb.open(key[0], subdir=False, readonly=True, lock=False, readahead=False,
                                meminit=False, max_readers=64)
            except lmdb.Error as exc:
                raise DataError(f"{self.path}: not a readable LMDB file ({exc})") from None
            try:
                _check_length(self.path, env)
            except DataError:
                env.close()
                raise
            _OPEN[key] = env
        return env

    def close(self) -> None:
        """Close this process's environment of the file (every :class:`Shard` of the path)."""
        env = _OPEN.pop((str(self.path.resolve()), os.getpid()), None)
        if env is not None:
            env.close()

    def _get_optional(self, key: bytes) -> bytes | None:
        try:
            with self.env.begin() as txn:
                value = txn.get(key)
        except lmdb.Error as exc:
            raise DataError(f"{self.path}: corrupt LMDB reading key {key.decode()!r} ({exc})") from None
        return None if value is None else bytes(value)

    def _get(self, key: bytes) -> bytes:
        value = self._get_optional(key)
        if value is None:
            raise DataError(f"{self.path}: key {key.decode()!r} is missing")
        return value

    def _read_length(self, reserved: int) -> int:
        """The ``"length"`` key, checked against the number of sample keys (all keys but the
        ``reserved`` ones)."""
        raw = self._get_optional(LENGTH_KEY)
        if raw is None and self.trust_pickle:  # older published files: every other key is a sample
            with self.env.begin() as txn:
                return int(txn.stat()["entries"]) - (reserved - 1)  # 'length' is one of the reserved
        if raw is None:
            raise DataError(f"{self.path}: key 'length' is missing")
        if record.is_pickled(raw) or (self.trust_pickle and not raw.strip().isdigit()):
            if not self.trust_pickle:
                raise DataError(f"{self.path}: key 'length' is pickled (original OC20 encoding); {record.TRUST_HINT}")
            import pickle

            try:
                length = pickle.loads(raw)  # noqa: S301 - the user opted in
            except Exception as exc:  # any unpickling failure is a problem of this file
                raise DataError(f"{self.path}: cannot unpickle key 'length' ({type(exc).__name__})") from None
        else:
            try:
                length = int(raw.decode("ascii"))
            except (UnicodeDecodeError, ValueError):
                raise DataError(f"{self.path}: key 'length' holds {raw[:20]!r}, expected a decimal count") from None
        with self.env.begin() as txn:
            keys = txn.stat()["entries"] - reserved
        if not isinstance(length, int) or length < 0 or keys < length:
            raise DataError(f"{self.path}: 'length' says {length} samples but the file has {keys} sample keys")
        return length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, idx: int) -> dict[str, Any]:
        if not 0 <= idx < self.length:
            raise IndexError(idx)
        raw = self._get(str(idx).encode())
        where = f"{self.path} key '{idx}'"
        if self.trust_pickle and not raw.startswith(record.MAGIC):
            return record.decode_pickled(raw, where)
        return record.decode(raw, where)


def shard_paths(split_dir: str | os.PathLike[str]) -> list[Path]:
    """The split folder's ``data.NNNN.lmdb`` files, as the dataset layout lists them."""
    root = Path(split_dir)
    return LAYOUT.list_split(root.parent, root.name)


class SplitDataset:
    """The samples of a split's LMDB files (the ones this node holds) as one indexable dataset,
    optionally preloaded into host memory: the :class:`~common.data.spec.SampleSource` of
    :class:`hpcbench.workloads.opencatalyst.dataset.OC20Data`. ``costs()`` is each sample's edge or triplet count."""

    def __init__(self, files: Sequence[Path], trust_pickle: bool = False, cost: Cost = "edges") -> None:
        self.shards = [Shard(p, trust_pickle) for p in files]
        self.offsets = np.cumsum([0] + [len(s) for s in self.shards])
        self.cost = cost
        self._cache: list[dict[str, Any]] | None = None
        self._sizes: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def __getitem__(self, idx: int) -> dict[str, Any]:
        if self._cache is not None:
            return self._cache[idx]
        s = int(np.searchsorted(self.offsets, idx, side="right")) - 1
        return self.shards[s][idx - int(self.offsets[s])]

    def preload(self, threads: int = 2) -> None:
        """Decode every sample into memory, ``threads`` files at a time (LMDB reads and numpy
        copies release the GIL)."""
        def load(shard: Shard) -> list[dict[str, Any]]:
            return [{k: (np.array(v) if isinstance(v, np.ndarray) else v) for k, v in shard[i].items()}
                    for i in range(len(shard))]

        self._cache = [s for part in prefetch_map(load, self.shards, threads, 1) for s in part]

    def sizes(self) -> dict[str, np.ndarray]:
        """natoms, edges and triplets per sample: the files' ``"sizes"`` keys, or (files without
        one) computed from the samples once."""
        if self._sizes is None:
            parts = [shard.stored_sizes if shard.stored_sizes is not None
                     else sizes_of(self[i] for i in range(int(self.offsets[k]), int(self.offsets[k + 1])))
                     for k, shard in enumerate(self.shards)]
            self._sizes = np.concatenate(parts) if parts else np.zeros((0, 3), np.int64)
        return dict(zip(SIZE_COLUMNS, self._sizes.T))

    def costs(self) -> np.ndarray:
        return self.sizes()[self.cost].astype(np.float64)
