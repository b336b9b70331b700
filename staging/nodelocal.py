"""Node-local output: atomic file writes from zstd frames, the staging journal (resume). A file
appears under its final name only after every frame was decompressed and checked against its crc32c,
the whole member against its crc32c, the whole shard it came from against the manifest's crc32c, and
its bytes are on disk (``sync_all`` then ``commit``, called by the exchange only then); a temporary
``.name.*.tmp`` is removed on any error.

Durability is batched per shard: a finished temporary file only starts its writeback
(``sync_file_range``, where the OS has it) and is closed; once the whole shard is checked, its files
are fsynced together, then renamed, then journaled. A decompression thread thus never waits for the
disk file by file, and nothing is renamed or journaled before it is durable.
Ownership, the lock and the completion marker live in :mod:`hpcbench.staging.marker`.
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import threading
from pathlib import Path
from typing import Any

import crc32c
import zstandard

from hpcbench.common.atomic import atomic_write, make_temp
from hpcbench.common.errors import DataError
from hpcbench.common.pagecache import evict

from .manifest import STATE_DIR, FileEntry, Frame, ShardInfo, file_crc, safe_relpath

JOURNAL = "staged.jsonl"

_local = threading.local()


def _dctx() -> zstandard.ZstdDecompressor:
    d = getattr(_local, "dctx", None)
    if d is None:
        d = _local.dctx = zstandard.ZstdDecompressor()
    return d


def target(dest: Path, name: str, where: str) -> Path:
    """``dest/name`` after refusing absolute paths and ``..`` (and anything resolving outside dest)."""
    rel = safe_relpath(name, where)
    out = dest / rel
    p = dest
    for part in rel.parts[:-1]:  # never write through a linked folder inside dest
        p = p / part
        if p.is_symlink():
            raise DataError(f"{where}: refusing member {name!r}: {p} is a symbolic link inside {dest}")
    if not out.resolve().is_relative_to(dest.resolve()):
        raise DataError(f"{where}: refusing member {name!r}: it resolves outside {dest}")
    return out


def decompress_frame(buf: memoryview, fr: Frame, shard: str, member: str) -> bytes:
    try:
        raw = _dctx().decompress(buf[fr.offset: fr.offset + fr.length], max_output_size=max(fr.raw_length, 1))
    except zstandard.ZstdError as exc:
        raise DataError(f"corrupt shard {shard}: member {member} (frame at byte {fr.offset}): {exc}") from None
    if len(raw) != fr.raw_length or crc32c.crc32c(raw) != fr.crc32c:
        raise DataError(f"corrupt shard {shard}: member {member} (frame at byte {fr.offset}) fails its "
                        f"crc32c/size check ({len(raw)} bytes, expected {fr.raw_length})")
    return raw


def _disk_error(exc: OSError, path: Path, node: int) -> DataError:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return DataError(f"node {node}: disk full while writing {path}; nothing half-written was kept ({exc})")
    return DataError(f"node {node}: cannot write {path}: {exc}")


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        if n <= 0:  # a short write that makes no progress: the filesystem is full
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        view, offset = view[n:], offset + n


def _libc_sync_file_range() -> Any:
    """libc's ``sync_file_range`` (Linux; Python's os module lacks it), or None where missing."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_SYNC_FILE_RANGE = _libc_sync_file_range()
_SYNC_FILE_RANGE_WRITE = 2  # start writeback of dirty pages, do not wait (linux/fs.h)


def _start_writeback(fd: int) -> None:
    """Ask the kernel to start writing this file's dirty pages now (no wait), so the batched fsync
    at the end of the shard finds little left to do; a no-op where ``sync_file_range`` is missing
    (the fsync then does all the work; a failure here is found by that fsync too)."""
    if _SYNC_FILE_RANGE is not None:
        _SYNC_FILE_RANGE(fd, 0, 0, _SYNC_FILE_RANGE_WRITE)


def sync_all(files: list[FileAssembly]) -> None:
    """Make every finished temporary of a shard durable (before any of them is renamed)."""
    for a in files:
        a.sync()


class FileAssembly:
    """One output file being written, possibly from several frames decompressed in parallel."""

    def __init__(self, path: Path, entry: FileEntry, node: int) -> None:
        self.path, self.entry, self.node = path, entry, node
        self.lock = threading.Lock()
        self.left = len(entry.frames)
        self.failed = False
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self.fd, self.tmp = make_temp(path)
        except OSError as exc:
            raise _disk_error(exc, path, node) from None

    def write_frame(self, buf: memoryview, fr: Frame, shard: str) -> bool:
        """Decompress, check and write one frame; True when this finished the temporary file (written,
        writeback started, size and whole-member crc32c checked); :func:`sync_all` makes it durable and
        :meth:`commit` then renames it into place."""
        if self.failed:
            return False
        with self._abort_on_error():
            raw = decompress_frame(buf, fr, shard, self.entry.name)
            _pwrite_all(self.fd, raw, fr.raw_offset)
        with self.lock:
            self.left -= 1
            if self.left or self.failed:
                return False
        with self._abort_on_error():
            _start_writeback(self.fd)
            os.close(self.fd)
            self.fd = -1
            if self.tmp.stat().st_size != self.entry.size:
                raise DataError(f"corrupt shard {shard}: member {self.entry.name} assembled to the wrong size")
            frames = self.entry.frames
            crc = frames[0].crc32c if len(frames) == 1 else file_crc(self.tmp)
            if crc != self.entry.crc32c:
                raise DataError(f"corrupt shard {shard}: member {self.entry.name} fails its whole-file crc32c check")
        return True

    def sync(self) -> None:
        """fsync the finished temporary file (reopened: the writer closed it), then drop its now clean
        pages from the page cache: training's first read of a staged file reads the disk, as after a
        cache clear, not the memory the staging left behind."""
        with self._abort_on_error():
            fd = os.open(self.tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
                evict(fd)
            finally:
                os.close(fd)

    def commit(self) -> None:
        """Rename the checked temporary file into place (after its shard's checksum was verified)."""
        with self._abort_on_error():
            os.replace(self.tmp, self.path)

    @contextlib.contextmanager
    def _abort_on_error(self):  # noqa: ANN202 - a context manager
        """Any failure removes the temporary file; OS errors become a disk error naming the file."""
        try:
            yield
        except OSError as exc:
            self.abort()
            raise _disk_error(exc, self.path, self.node) from None
        except BaseException:
            self.abort()
            raise

    def abort(self) -> None:
        with self.lock:
            self.failed = True
            if self.fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(self.fd)
                self.fd = -1
            with contextlib.suppress(FileNotFoundError):
                self.tmp.unlink()


class Journal:
    """Append-only record of shards fully staged on this node, for resume and ``--verify``."""

    def __init__(self, dest: Path) -> None:
        self.dest = dest
        self.path = dest / STATE_DIR / JOURNAL
        self.done: dict[str, dict] = {}
        self.lock = threading.Lock()
        if self.path.exists():
            for line in self.path.read_text().splitlines():
                with contextlib.suppress(ValueError, KeyError, TypeError, DataError):
                    rec = json.loads(line)
                    for f in rec["files"]:  # a damaged record never names a path outside dest
                        safe_relpath(f[0], str(self.path))
                    self.done[rec["shard"]] = rec

    def complete(self, shard: ShardInfo) -> bool:
        """True if the shard was staged before (same crc32c) and all its files are still there."""
        rec = self.done.get(shard.name)
        if rec is None or rec.get("crc32c") != shard.crc32c:
            return False
        for name, size, _ in rec["files"]:
            p = self.dest / name
            if not p.is_file() or p.stat().st_size != size:
                return False
        return True

    def record(self, shard: ShardInfo, files: list[FileEntry], source: dict[str, list[int]] | None = None) -> None:
        """Journal a staged shard. ``source`` (``--method copy``): per file the source's [size, mtime_ns,
        ctime_ns] it was copied from, so a restage can tell a changed source from an unchanged one."""
        rec: dict[str, Any] = {"shard": shard.name, "crc32c": shard.crc32c,
                               "files": [[f.name, f.size, f.crc32c] for f in files]}
        if source is not None:
            rec["source"] = source
        with self.lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a") as fh:
                fh.write(json.dumps(rec, separators=(",", ":")) + "\n")
                fh.flush()
                os.fsync(fh.fileno())
            self.done[shard.name] = rec

    def sources(self) -> dict[str, tuple[list[int], int]]:
        """``--method copy``: per journaled file, (the source stat it was copied from, its crc32c)."""
        out = {}
        for rec in self.done.values():
            src = rec.get("source")
            if isinstance(src, dict):
                for name, _, crc in rec["files"]:
                    if isinstance(src.get(name), list):
                        out[name] = (src[name], crc)
        return out

    def rewrite(self, keep: set[str], files: set[str] | None = None) -> None:
        """Keep only the records of the shards in ``keep`` (atomically); with ``files``, only those files
        of them (a shard left with fewer files no longer counts as complete: see :meth:`complete`)."""
        with self.lock:
            done = {}
            for k, v in self.done.items():
                if k not in keep:
                    continue
                if files is not None and any(f[0] not in files for f in v["files"]):
                    v = dict(v, crc32c=None, files=[f for f in v["files"] if f[0] in files])
                done[k] = v
            self.done = done
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with atomic_write(self.path, "w") as fh:
                for rec in self.done.values():
                    fh.write(json.dumps(rec, separators=(",", ":")) + "\n")

    def files(self) -> list[list]:
        """[name, size, crc32c] of every journaled file."""
        return [f for rec in self.done.values() for f in rec["files"]]


def sweep_temporaries(dest: Path) -> int:
    """Remove ``.name.XXXX.tmp`` leftovers of a staging run that was killed (they never look complete)."""
    n = 0
    for p in dest.rglob(".*.tmp"):
        if p.is_file() and STATE_DIR not in p.relative_to(dest).parts:
            p.unlink(missing_ok=True)
            n += 1
    return n


def verify_journal(j: Journal, threads: int = 2, source: Path | None = None) -> tuple[int, int, list[str]]:
    """Re-check every journaled file's size and crc32c: (files, bytes, problems). With ``source``
    (``--method copy``), every file is also compared with the source it was copied from, re-read now:
    a source edited since it was copied is a problem too. Shards with a bad file are dropped from the
    journal's in-memory record, so a following stage re-transfers them."""
    from concurrent.futures import ThreadPoolExecutor

    def check(f: list) -> str | None:
        p = j.dest / f[0]
        if not p.is_file():
            return f"{p}: missing"
        if p.stat().st_size != f[1]:
            return f"{p}: size {p.stat().st_size}, expected {f[1]}"
        if source is None:
            return f"{p}: crc32c mismatch" if f[2] >= 0 and file_crc(p) != f[2] else None
        crc = file_crc(p)
        if f[2] >= 0 and crc != f[2]:
            return f"{p}: crc32c mismatch"
        src = source / f[0]
        try:
            same = src.stat().st_size == f[1] and file_crc(src) == crc
        except OSError as exc:
            return f"{p}: its source {src} cannot be read ({exc.strerror})"
        return None if same else f"{p}: differs from its source {src}"

    items = [(rec["shard"], f) for rec in j.done.values() for f in rec["files"]]
    with ThreadPoolExecutor(threads) as pool:
        results = list(pool.map(lambda it: check(it[1]), items))
    problems = [m for m in results if m]
    for (shard, _), m in zip(items, results):
        if m:
            j.done.pop(shard, None)
    return len(items), sum(f[1] for _, f in items), problems
