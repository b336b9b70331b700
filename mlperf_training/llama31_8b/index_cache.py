"""An on-disk cache of a GPT sample set's index arrays, as Megatron-core caches its GPTDataset indices.

Building the index of a C4-sized split takes each rank tens of seconds and its arrays are large (the full
preset's training index: ~365 M document-index entries for 19.2 M samples, ~1.8 GB; the reference's validation
index is built over 405 M entries to keep 1024 samples). With ``data.index_cache`` the first rank that needs an
index builds it and stores it; every other rank and every later run of the same data, seed and sizes loads it,
memory-mapped (the ranks of a node then share one copy in the page cache).

An entry is ``KEY.json`` (what it was built from, and each array's dtype, shape and CRC32C) plus one
``KEY.NAME.npy`` per array. ``KEY`` hashes what the arrays depend on: the sequence lengths of every dataset (not
their paths or times: a copy of the data staged elsewhere finds the same entry), the sequence length, seed,
requested and kept samples, shuffling and layout, and this format's version. Each file is written under a
temporary name, fsynced, read back and compared, then renamed; the ``.json`` comes last, so an entry is complete
or absent. A load checks every array against the ``.json`` (dtype, shape, CRC32C); an entry that fails is named
on stderr and rebuilt, never used. Ranks building the same entry at once take turns on ``KEY.lock``
(``flock``; where the file system has none, each builds its own), waiting at most ``WAIT_S`` for another rank's
build before building their own, so a stopped rank cannot hold the others. A store that fails (a full disk, a
quota) leaves no part of the entry and a ``KEY.failed`` mark for ``FAILED_S``: ranks that find it build at once,
without taking turns or trying to store again. An entry that loads is never replaced (a rank of another node may
have it mapped). Entries not used for ``KEEP_S`` (the ``.json``'s time, renewed by every load) are removed when
another is stored, with any temporary file left by a killed writer: each seed has its own training entry (1.9 GB at
the full preset's size), so a folder of many runs' seeds would otherwise only grow.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import crc32c
import numpy as np

from hpcbench.common.atomic import atomic_write
from hpcbench.common.errors import ConfigError

FORMAT = 1  # bump when the arrays' construction changes (gpt.py): older entries are then never found
WAIT_S = 900.0  # the longest a rank waits for another rank's build of the same entry
FAILED_S = 3600.0  # how long a failed store's mark makes other ranks build without storing
KEEP_S = 7 * 86400.0  # entries unused this long are removed when another entry is stored
STALE_TMP_S = 6 * 3600.0  # temporary files this old are a killed writer's
KEY_NAME = "data.index_cache"
AUTO_DIR = ".index_cache"  # "auto": under the data root (hidden: the staged-data check skips it)


def _say(msg: str) -> None:
    print(f"llama31_8b index cache: {msg}", file=sys.stderr, flush=True)


def _crc(a: np.ndarray) -> int:
    return crc32c.crc32c(memoryview(np.ascontiguousarray(a)).cast("B"))


def resolve(setting: str, root: Path) -> "IndexCache | None":
    """The cache a ``data.index_cache`` setting names: "none" (or empty) for none, "auto" for ``ROOT/.index_cache``
    when it can be written there (else none, said once), or a folder, which must be writable (else a
    :class:`ConfigError` naming the key)."""
    if setting in ("", "none"):
        return None
    folder = Path(root) / AUTO_DIR if setting == "auto" else Path(setting)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".probe-", dir=folder)  # unique: ranks of other nodes probe at once
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        if setting == "auto":
            _say(f"not used: {folder} cannot be written ({exc.strerror or exc}); set {KEY_NAME} to a writable folder "
                 "to keep indices between runs")
            return None
        raise ConfigError(f"config key '{KEY_NAME}': {folder} cannot be written ({exc.strerror or exc}); expected a "
                          "writable folder, 'auto' or 'none'") from exc
    return IndexCache(folder)


class IndexCache:
    """Entries under ``folder`` (see the module docstring)."""

    def __init__(self, folder: Path, wait_s: float = WAIT_S) -> None:
        self.folder, self.wait_s = Path(folder), wait_s

    @staticmethod
    def key(description: Mapping[str, Any]) -> str:
        text = json.dumps({"format": FORMAT, **description}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    def get_or_build(self, description: Mapping[str, Any], build: Callable[[], dict[str, np.ndarray]],
                     names: frozenset[str] | None = None) -> dict[str, np.ndarray]:
        """The arrays of the entry ``description`` names: loaded when stored and sound (exactly the arrays ``names``
        when given), else ``build()`` stored."""
        key = self.key(description)
        arrays = self._load(key, description, names)
        if arrays is not None:
            return arrays
        if self._failed_recently(key):  # a store failed here lately: build at once, do not queue or store
            return build()
        with self._turn(key) as locked:
            if locked:  # another rank may have stored it while this one waited
                arrays = self._load(key, description, names)
                if arrays is not None:
                    return arrays
            if not self._failed_recently(key):  # (no lock here, or waited too long: build and store on its own)
                t = time.perf_counter()
                arrays = build()
                self._store(key, description, arrays, time.perf_counter() - t)
                return arrays
        return build()  # the rank before failed to store: built outside the turn, not stored

    # ---------------------------------------------------------------------------------------------
    def _meta_path(self, key: str) -> Path:
        return self.folder / f"{key}.json"

    def _array_path(self, key: str, name: str) -> Path:
        return self.folder / f"{key}.{name}.npy"

    def _load(self, key: str, description: Mapping[str, Any] | None = None,
              names: frozenset[str] | None = None) -> dict[str, np.ndarray] | None:
        meta_path = self._meta_path(key)
        try:
            meta = json.loads(meta_path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            _say(f"{meta_path}: unreadable ({exc}); rebuilding the index")
            return None
        out: dict[str, np.ndarray] = {}
        try:
            if description is not None and meta["description"] != json.loads(json.dumps(dict(description))):
                raise KeyError("a description other than the one asked for")  # a key collision, or an edited entry
            if names is not None and set(meta["arrays"]) != names:
                raise KeyError(f"arrays {sorted(meta['arrays'])}, expected {sorted(names)}")
            for name, want in meta["arrays"].items():
                path = self._array_path(key, name)
                try:
                    a = np.load(path, mmap_mode="r", allow_pickle=False)
                except (OSError, ValueError) as exc:
                    _say(f"{path}: unreadable ({exc}); rebuilding the index")
                    return None
                if str(a.dtype) != want["dtype"] or list(a.shape) != want["shape"] or _crc(a) != int(want["crc32c"]):
                    _say(f"{path}: expected {want['dtype']} {want['shape']} with CRC32C {int(want['crc32c']):#010x}, "
                         f"found {a.dtype} {list(a.shape)} that does not match; rebuilding the index")
                    return None
                out[name] = a
        except (KeyError, TypeError, ValueError) as exc:
            _say(f"{meta_path}: not an index cache entry ({exc!r} missing or malformed); rebuilding the index")
            return None
        try:
            os.utime(meta_path)  # used now: kept another KEEP_S
        except OSError:
            pass
        return out

    def _store(self, key: str, description: Mapping[str, Any], arrays: Mapping[str, np.ndarray], took: float) -> None:
        """Writes the entry (arrays first, the .json last); a failure to write (a full disk, a removed folder) is said
        and leaves no entry: the run goes on with the arrays it built."""
        if self._meta_path(key).exists() and self._load(key, description) is not None:
            return  # stored meanwhile (another node): never replace files another rank may have mapped
        meta: dict[str, Any] = {"format": FORMAT, "description": dict(description), "build_s": round(took, 3),
                                "arrays": {}}
        written: list[Path] = []
        try:
            for name, a in arrays.items():
                a = np.ascontiguousarray(a)
                crc = _crc(a)

                def verify(tmp: Path, a: np.ndarray = a, crc: int = crc) -> None:
                    back = np.load(tmp, mmap_mode="r", allow_pickle=False)
                    if back.dtype != a.dtype or back.shape != a.shape or _crc(back) != crc:
                        raise OSError(f"{tmp}: read back differs from the array written")

                with atomic_write(self._array_path(key, name), verify=verify) as fh:
                    written.append(self._array_path(key, name))
                    np.save(fh, a, allow_pickle=False)
                meta["arrays"][name] = {"dtype": str(a.dtype), "shape": list(a.shape), "crc32c": crc}
            with atomic_write(self._meta_path(key), "w") as fh:
                json.dump(meta, fh, indent=1, sort_keys=True)
        except (OSError, ValueError) as exc:
            for path in written:  # no part of an entry stays behind (1.5 GB of a full training index)
                path.unlink(missing_ok=True)
            try:
                (self.folder / f"{key}.failed").write_text(f"{exc}\n")
            except OSError:
                pass
            _say(f"could not store the index in {self.folder} ({exc}); this run goes on without it")
            return
        (self.folder / f"{key}.failed").unlink(missing_ok=True)
        size = sum(a.nbytes for a in arrays.values())
        _say(f"built in {took:.1f} s and stored as {self._meta_path(key)} ({size / 2**20:.1f} MiB)")
        self._prune(keep=key)

    def _failed_recently(self, key: str) -> bool:
        try:
            return time.time() - (self.folder / f"{key}.failed").stat().st_mtime < FAILED_S
        except OSError:
            return False

    def _prune(self, keep: str) -> None:
        """Removes entries unused for KEEP_S and temporary files older than STALE_TMP_S (best effort)."""
        now = time.time()
        try:
            found = list(self.folder.iterdir())
        except OSError:
            return
        for path in found:
            try:
                age = now - path.stat().st_mtime
                if path.name.startswith(".") and path.name.endswith(".tmp") and age > STALE_TMP_S:
                    path.unlink(missing_ok=True)
                elif path.suffix == ".json" and path.stem != keep and age > KEEP_S:
                    path.unlink(missing_ok=True)  # the entry is gone first, then its arrays and marks
                    for part in self.folder.glob(f"{path.stem}.*"):
                        part.unlink(missing_ok=True)
            except OSError:
                continue

    @contextmanager
    def _turn(self, key: str) -> Iterator[bool]:
        """Holds ``KEY.lock`` while building (True), or yields False: no lock on this file system, or another rank
        held it past ``wait_s`` (said)."""
        path = self.folder / f"{key}.lock"
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError:
            yield False
            return
        try:
            deadline = time.monotonic() + self.wait_s
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        _say(f"{path}: held by another process for over {self.wait_s:.0f} s; building without it")
                        yield False
                        return
                    time.sleep(0.2)
                except OSError:  # no flock here (some network file systems)
                    yield False
                    return
            try:
                yield True
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
