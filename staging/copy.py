"""``--method copy``: the baseline the reference code uses. Every node copies its own raw files
straight from shared storage (so a file needed by K instances is read K times). Same plan as the
packed path: the raw files are grouped into the same shards ``pack`` would make.

A raw dataset has no manifest, so a restage must find changed sources itself. Rank 0 stats every
source file when it plans (size, ``mtime_ns``, ``ctime_ns``); each virtual shard's ``crc32c`` is a
fingerprint of its members' names and stats, so the journal's record of a shard no longer matches
once any member changed, was added or was removed. The journal keeps, per copied file, the source
stat the plan saw and the crc32c of the bytes read from the source while copying: a file whose stat
is unchanged (and whose node copy has its size) is skipped, any other is copied again. ``--verify``
re-reads the source files too (:func:`hpcbench.staging.nodelocal.verify_journal` with ``source``), so
an edit that kept size and timestamps (a coarse-timestamp filesystem) is found as well."""
from __future__ import annotations

import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import crc32c

from hpcbench.common.atomic import atomic_write
from hpcbench.common.data.layout import REPLICATED, FileLayout, scan
from hpcbench.common.errors import DataError

from .distribute import Stats
from .manifest import FileEntry, ShardInfo
from .nodelocal import Journal, _disk_error, target
from .pack import group_files

#: a planned raw file: (name, size, mtime_ns, ctime_ns) as rank 0 saw it
RawFile = tuple[str, int, int, int]


def _stat(st: os.stat_result) -> list[int]:
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def fingerprint(group: list[RawFile]) -> int:
    """A shard's stand-in for a packed shard's crc32c: changes when any member's name or stat does
    (never 0, the value older journals recorded for raw shards)."""
    return crc32c.crc32c(json.dumps([list(f) for f in group], separators=(",", ":")).encode()) or 1


def raw_shards(source: Path, layout: FileLayout, shard_bytes: int) -> dict[str, tuple[list[ShardInfo], list[list[RawFile]]]]:
    """Per split: virtual shards (for the planner) and their member files with their stats, from the
    raw dataset."""
    out = {}
    for sp, names in scan(source, layout).items():
        stats = {n: _stat((source / n).stat()) for n in names}
        groups = [[(n, *stats[n]) for n, _ in g]
                  for g in group_files([(n, stats[n][0]) for n in names], shard_bytes)]
        infos = [ShardInfo(f"{sp}/raw-{i:05d}", sum(f[1] for f in g), sum(f[1] for f in g), len(g), 0,
                           fingerprint(g)) for i, g in enumerate(groups)]
        out[sp] = (infos, groups)
    return out


def copy_files(source: Path, dest: Path, shards: list[tuple[ShardInfo, list[RawFile]]], journal: Journal,
               node: int, threads: int, stats: Stats) -> None:
    """Copy the members of ``shards`` whose source changed since the journal recorded them (or that
    were never copied) and journal every shard as soon as all its files are in place."""
    known = journal.sources()

    def one(f: RawFile) -> int:
        name, size = f[0], f[1]
        out = target(dest, name, f"source file {name}")
        old = known.get(name)
        if old is not None and old[0] == list(f[1:]) and old[1] >= 0 and out.is_file() \
                and out.stat().st_size == size:
            return old[1]  # resume: this source was copied before and has not changed since
        t0 = time.perf_counter()
        crc = 0
        try:
            with open(source / name, "rb") as src, atomic_write(out, verify=lambda p: _check(p, size, name), drop_cache=True) as dst:
                before = _stat(os.fstat(src.fileno()))
                while chunk := src.read(8 << 20):
                    crc = crc32c.crc32c(chunk, crc)
                    dst.write(chunk)
                if _stat(os.fstat(src.fileno())) != before:
                    raise DataError(f"source file {source / name} changed while node {node} copied it; run the "
                                    "stage again once the dataset is no longer being written")
        except OSError as exc:
            raise _disk_error(exc, out, node) from None
        with stats.lock:
            stats.read_bytes += size
            stats.read_shards += 1
            stats.write_bytes += size
            stats.write_files += 1
        stats.add_time("write_thread_s", time.perf_counter() - t0)
        return crc

    with ThreadPoolExecutor(threads) as pool:
        futures = [(info, group, [pool.submit(one, f) for f in group]) for info, group in shards]
        try:
            for info, group, futs in futures:  # journaled in order, each shard once its files are in place
                crcs = [fu.result() for fu in futs]
                journal.record(info, [FileEntry(f[0], f[1], c, []) for f, c in zip(group, crcs)],
                               source={f[0]: list(f[1:]) for f in group})
        except BaseException:
            for _, _, futs in futures:
                for fu in futs:
                    fu.cancel()
            raise


def _check(p: Path, size: int, name: str) -> None:
    if p.stat().st_size != size:
        raise DataError(f"{name}: copied {p.stat().st_size} bytes, expected {size} (source changed or truncated)")


__all__ = ["REPLICATED", "RawFile", "copy_files", "fingerprint", "raw_shards"]
