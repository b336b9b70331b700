"""`hpcbench pack`: merge a dataset's many small files into few zstd-compressed shards.

Files are grouped per split in sorted order into shards of about ``shard_bytes`` raw bytes (a file
never spans shards; a big file gets a shard of its own and is cut into ``chunk_bytes`` frames).
Frames are compressed by a thread pool (zstd and file reads release the GIL). Each shard is written
atomically and followed by a small ``.done`` record of its source files' sizes and mtimes and the shard's
size and crc32c, so a rerun skips shards that are already complete and intact (resume: a reused shard is
read once and checked against its crc32c; a damaged one is packed again); ``manifest.json`` is written last.
"""
from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

import crc32c
import zstandard

from hpcbench.common.atomic import atomic_write, atomic_write_text
from hpcbench.common.data.layout import REPLICATED, FileLayout, scan
from hpcbench.common.errors import DataError
from hpcbench.common.system import usable_cores

from .manifest import (MANIFEST, FileEntry, Frame, Manifest, ShardInfo, SplitInfo, encode_header, file_crc,
                       refuse_overlap, safe_relpath)

_local = threading.local()


def _compressor(level: int) -> zstandard.ZstdCompressor:
    c = getattr(_local, "zc", None)
    if c is None or _local.level != level:
        c = _local.zc = zstandard.ZstdCompressor(level=level, write_checksum=True, write_content_size=True)
        _local.level = level
    return c


def group_files(files: list[tuple[str, int]], shard_bytes: int) -> list[list[tuple[str, int]]]:
    """Contiguous groups of (name, size) of about ``shard_bytes`` raw bytes each (at least one file)."""
    groups: list[list[tuple[str, int]]] = []
    cur: list[tuple[str, int]] = []
    size = 0
    for name, n in files:
        if cur and size + n > shard_bytes:
            groups.append(cur)
            cur, size = [], 0
        cur.append((name, n))
        size += n
    if cur:
        groups.append(cur)
    return groups


def _compress_frame(path: Path, offset: int, length: int, level: int) -> tuple[bytes, int]:
    with open(path, "rb") as fh:
        fh.seek(offset)
        raw = fh.read(length)
    if len(raw) != length:
        raise DataError(f"{path}: file changed while packing (expected {length} bytes at offset {offset})")
    return _compressor(level).compress(raw), crc32c.crc32c(raw)


def _signature(root: Path, group: list[tuple[str, int]]) -> list[list]:
    return [[n, s, (root / n).stat().st_mtime_ns] for n, s in group]


class Packer:
    def __init__(self, source: Path, dest: Path, layout: FileLayout, shard_bytes: int, level: int = 3,
                 threads: int | None = None, chunk_bytes: int | None = None, progress: bool = True) -> None:
        refuse_overlap(source, dest)
        self.source, self.dest, self.layout = source, dest, layout
        self.shard_bytes, self.level = shard_bytes, level
        self.chunk_bytes = chunk_bytes or layout.chunk_bytes
        self.threads = threads or usable_cores()
        self.progress = progress
        self.reused = 0
        self.written = 0
        self.damaged: list[str] = []  # shards of an earlier run that failed their crc32c and were packed again

    def _frames(self, name: str, size: int) -> list[tuple[int, int]]:
        if size == 0:
            return [(0, 0)]
        return [(o, min(self.chunk_bytes, size - o)) for o in range(0, size, self.chunk_bytes)]

    def _submit(self, pool: ThreadPoolExecutor, group: list[tuple[str, int]]) -> list[list[Future]]:
        return [[pool.submit(_compress_frame, self.source / n, o, ln, self.level) for o, ln in self._frames(n, s)]
                for n, s in group]

    def _write_shard(self, rel: str, group: list[tuple[str, int]], futs: list[list[Future]], bar) -> ShardInfo:
        entries: list[FileEntry] = []
        blobs: list[bytes] = []
        for (name, size), ffs in zip(group, futs):
            frames, crc = [], 0
            for (raw_off, raw_len), fut in zip(self._frames(name, size), ffs):
                blob, fcrc = fut.result()
                blobs.append(blob)
                frames.append(Frame(0, len(blob), raw_off, raw_len, fcrc))
                bar.update(raw_len)
            entries.append(FileEntry(name, size, 0, frames))
        for e in entries:  # whole-file crc32c: the frame's for one frame, else stream the file once more
            e.crc32c = e.frames[0].crc32c if len(e.frames) == 1 else file_crc(self.source / e.name)
        hdr = encode_header(rel, entries)  # offsets are patched below; the header length does not change
        off = len(hdr)
        i = 0
        for e in entries:
            for fr in e.frames:
                fr.offset = off
                off += len(blobs[i])
                i += 1
        hdr2 = encode_header(rel, entries)
        hdr = hdr2 if len(hdr2) == len(hdr) else _fix_header(rel, entries, len(hdr), blobs)
        crc = hcrc = crc32c.crc32c(hdr)
        with atomic_write(self.dest / rel) as fh:
            fh.write(hdr)
            for b in blobs:
                fh.write(b)
                crc = crc32c.crc32c(b, crc)
        total = len(hdr) + sum(len(b) for b in blobs)
        return ShardInfo(rel, total, sum(s for _, s in group), len(group), len(hdr), crc, hcrc)

    def run(self) -> Manifest:
        listing = scan(self.source, self.layout)
        seen: dict[str, str] = {}
        for sp, names in listing.items():
            for n in names:
                safe_relpath(n, f"source {self.source}")
                if n in seen:  # one name must be one file: staging would write it twice
                    raise DataError(f"source {self.source}: {n!r} is listed in split {seen[n]!r} and in {sp!r}")
                seen[n] = sp
        sized = {sp: [(n, (self.source / n).stat().st_size) for n in names] for sp, names in listing.items()}
        plan: list[tuple[str, str, list[tuple[str, int]]]] = []
        for sp, files in sized.items():
            for i, g in enumerate(group_files(files, self.shard_bytes)):
                plan.append((sp, f"{sp}/shard-{i:05d}.zst", g))
        total = sum(n for _, _, g in plan for _, n in g)
        splits = {sp: SplitInfo(replicate=(sp == REPLICATED)) for sp in sized}
        from tqdm import tqdm

        with ThreadPoolExecutor(self.threads) as pool, tqdm(total=total, unit="B", unit_scale=True,
                                                             desc="pack", disable=not self.progress) as bar:
            todo = list(self._resume(plan, splits, bar))
            pending = [(rel, g, self._submit(pool, g)) for _, rel, g in todo[:2]]
            nxt = 2
            while pending:
                rel, g, futs = pending.pop(0)
                if nxt < len(todo):  # keep one shard's frames queued ahead of the one being written
                    _, r2, g2 = todo[nxt]
                    pending.append((r2, g2, self._submit(pool, g2)))
                    nxt += 1
                info = self._write_shard(rel, g, futs, bar)
                atomic_write_text(self._done(rel), json.dumps({"info": asdict(info),
                                                               "sources": _signature(self.source, g)}))
                splits[rel.split("/")[0]].shards.append(info)
                self.written += 1
        for sp in splits.values():
            sp.shards.sort(key=lambda s: s.name)
        man = Manifest(self.layout.name, splits, self.chunk_bytes, self.level, str(self.source.resolve()))
        self._write_listing(man)
        atomic_write_text(self.dest / MANIFEST, man.to_json())
        return man

    def _done(self, rel: str) -> Path:
        return self.dest / (rel + ".done")

    def _resume(self, plan, splits, bar) -> Iterator[tuple[str, str, list[tuple[str, int]]]]:
        for sp, rel, g in plan:
            info = _load_done(self._done(rel), self.dest / rel, _signature(self.source, g))
            if info is not None and file_crc(self.dest / rel) != info.crc32c:
                # right size, wrong bytes (a flipped bit, a same-size overwrite): never reuse it
                self.damaged.append(rel)
                info = None
            if info is None:
                yield sp, rel, g
            else:
                splits[sp].shards.append(info)
                self.reused += 1
                bar.update(info.raw_bytes)

    def _write_listing(self, man: Manifest) -> None:
        from .manifest import decode_header

        with atomic_write(self.dest / "listing.tsv", "w") as fh:
            fh.write("split\tshard\tname\tsize\tcrc32c\n")
            for sp, info in man.splits.items():
                for sh in info.shards:
                    with open(self.dest / sh.name, "rb") as f:
                        hdr = f.read(sh.header_bytes)
                    for e in decode_header(hdr, str(self.dest / sh.name)):
                        fh.write(f"{sp}\t{sh.name}\t{e.name}\t{e.size}\t{e.crc32c:08x}\n")


def _fix_header(rel: str, entries: list[FileEntry], guess: int, blobs: list[bytes]) -> bytes:
    """Offsets grew the header's digits: iterate until the header length is stable."""
    while True:
        off, i = guess, 0
        for e in entries:
            for fr in e.frames:
                fr.offset = off
                off += len(blobs[i])
                i += 1
        hdr = encode_header(rel, entries)
        if len(hdr) == guess:
            return hdr
        guess = len(hdr)


def _load_done(done: Path, shard: Path, sig: list[list]) -> ShardInfo | None:
    try:
        d = json.loads(done.read_text())
        info = ShardInfo(**d["info"])
        if "header_crc32c" not in d["info"]:  # written by format v1: no header checksum, pack again
            return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if d.get("sources") != sig or not shard.is_file() or shard.stat().st_size != info.bytes:
        return None
    return info
