"""OC20 LMDB shards: ``data.NNNN.lmdb`` files (subdir=False), keys ``"0"``.. and ``"length"``.

Writers produce the pickle-free :mod:`opencatalyst.record` encoding, into a temporary file that is
verified and renamed, so a shard under its final name is always complete. ``metadata.npz`` beside
the shards holds the per-sample sizes (natoms, edges, triplets) in global sample order.
"""
from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import lmdb
import numpy as np

from common.atomic import atomic_write
from common.errors import DataError

from . import record

METADATA = "metadata.npz"
_MAP_SIZE = 1 << 36  # sparse file on Linux; only written pages use disk
_OPEN: dict[tuple[str, int], lmdb.Environment] = {}


def close_all() -> None:
    """Close this process's cached read environments (e.g. before replacing a file)."""
    for key in [k for k in _OPEN if k[1] == os.getpid()]:
        _OPEN.pop(key).close()


def shard_name(index: int) -> str:
    return f"data.{index:04d}.lmdb"


def write_shard(path: str | os.PathLike[str], samples: Iterable[Mapping[str, Any]]) -> int:
    """Write samples to one LMDB shard atomically; returns the number written."""
    dest = Path(path)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    count = 0
    try:
        env = lmdb.open(str(tmp), subdir=False, map_size=_MAP_SIZE, meminit=False, lock=False)
        with env.begin(write=True) as txn:
            for count, sample in enumerate(samples, start=1):
                txn.put(str(count - 1).encode(), record.encode(sample))
            txn.put(b"length", str(count).encode())
        env.sync()
        env.close()
        Shard(tmp)  # verify: opens, length key agrees with the entries
        for stale in (tmp, dest):
            env = _OPEN.pop((str(stale.resolve()), os.getpid()), None)
            if env is not None:
                env.close()
        os.replace(tmp, dest)
    finally:
        for p in (tmp, Path(f"{tmp}-lock")):
            p.unlink(missing_ok=True)
    return count


class Shard:
    """One read-only LMDB shard; values decoded lazily by index."""

    def __init__(self, path: str | os.PathLike[str], trust_pickle: bool = False) -> None:
        self.path = Path(path)
        self.trust_pickle = trust_pickle
        if not self.path.is_file():
            raise DataError(f"{self.path}: no such LMDB file")
        self.length = self._read_length()

    @property
    def env(self) -> lmdb.Environment:
        """The process's read-only environment for this file (LMDB allows one per path and
        process; a forked loader worker opens its own)."""
        key = (str(self.path.resolve()), os.getpid())
        env = _OPEN.get(key)
        if env is None:
            try:
                env = lmdb.open(key[0], subdir=False, readonly=True, lock=False, readahead=False,
                                meminit=False, max_readers=64)
            except lmdb.Error as exc:
                raise DataError(f"{self.path}: not a readable LMDB file ({exc})") from None
            _OPEN[key] = env
        return env

    def _get(self, key: str) -> bytes:
        try:
            with self.env.begin() as txn:
                value = txn.get(key.encode())
        except lmdb.Error as exc:
            raise DataError(f"{self.path}: corrupt LMDB reading key {key!r} ({exc})") from None
        if value is None:
            raise DataError(f"{self.path}: key {key!r} is missing")
        return bytes(value)

    def _read_length(self) -> int:
        raw = self._get("length")
        if record.is_pickled(raw) or (self.trust_pickle and not raw.strip().isdigit()):
            if not self.trust_pickle:
                raise DataError(f"{self.path}: key 'length' is pickled (original OC20 encoding); unpickling runs "
                                "code from the file. Use `hpcbench convert oc20 --trust-pickle` or --trust-pickle")
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
            entries = txn.stat()["entries"]
        if not isinstance(length, int) or length < 0 or entries < length + 1:
            raise DataError(f"{self.path}: 'length' says {length} samples but the file has {entries - 1} keys")
        return length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, idx: int) -> dict[str, Any]:
        if not 0 <= idx < self.length:
            raise IndexError(idx)
        raw = self._get(str(idx))
        where = f"{self.path} key '{idx}'"
        if self.trust_pickle and not raw.startswith(record.MAGIC):
            return record.decode_pickled(raw, where)
        return record.decode(raw, where)


def shard_paths(split_dir: str | os.PathLike[str]) -> list[Path]:
    root = Path(split_dir)
    if not root.is_dir():
        raise DataError(f"{root}: data split directory does not exist")
    paths = sorted(root.glob("data.*.lmdb"))
    if not paths:
        raise DataError(f"{root}: no data.NNNN.lmdb files found")
    return paths


class SplitDataset:
    """All shards of one split as one indexable dataset, optionally preloaded into host memory."""

    def __init__(self, split_dir: str | os.PathLike[str], trust_pickle: bool = False) -> None:
        self.root = Path(split_dir)
        self.shards = [Shard(p, trust_pickle) for p in shard_paths(self.root)]
        self.offsets = np.cumsum([0] + [len(s) for s in self.shards])
        self._cache: list[dict[str, Any]] | None = None

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def __getitem__(self, idx: int) -> dict[str, Any]:
        if self._cache is not None:
            return self._cache[idx]
        s = int(np.searchsorted(self.offsets, idx, side="right")) - 1
        return self.shards[s][idx - int(self.offsets[s])]

    def preload(self, workers: int = 4) -> None:
        """Decode every sample into memory, one thread per shard at a time (LMDB reads and numpy
        decoding release the GIL for the copying part)."""
        def load(shard: Shard) -> list[dict[str, Any]]:
            return [{k: (np.array(v) if isinstance(v, np.ndarray) else v) for k, v in shard[i].items()}
                    for i in range(len(shard))]

        with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
            parts = list(pool.map(load, self.shards))
        self._cache = [s for part in parts for s in part]

    def sizes(self) -> dict[str, np.ndarray]:
        return read_metadata(self.root, len(self))


def write_metadata(split_dir: str | os.PathLike[str], natoms: Sequence[int], edges: Sequence[int],
                   triplets: Sequence[int]) -> None:
    path = Path(split_dir) / METADATA
    arrays = {"natoms": np.asarray(natoms, np.int64), "neighbors": np.asarray(edges, np.int64),
              "triplets": np.asarray(triplets, np.int64)}

    def verify(tmp: Path) -> None:
        read_metadata_file(tmp, len(arrays["natoms"]))

    with atomic_write(path, verify=verify) as fh:
        np.savez(fh, **arrays)


def read_metadata_file(path: Path, expected: int) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as z:
            out = {k: z[k] for k in ("natoms", "neighbors", "triplets")}
    except FileNotFoundError:
        raise DataError(f"{path}: per-sample size metadata is missing (write it with `hpcbench datagen oc20` "
                        "or `hpcbench convert oc20`)") from None
    except (KeyError, ValueError, OSError) as exc:
        raise DataError(f"{path}: corrupt metadata, expected arrays natoms/neighbors/triplets ({exc})") from None
    for k, v in out.items():
        if v.shape != (expected,):
            raise DataError(f"{path}: '{k}' has {v.shape[0] if v.ndim else 0} entries, the split has {expected} samples")
    return out


def read_metadata(split_dir: str | os.PathLike[str], expected: int) -> dict[str, np.ndarray]:
    return read_metadata_file(Path(split_dir) / METADATA, expected)
