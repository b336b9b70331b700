"""``--method copy``: the baseline the reference code uses. Every node copies its own raw files
straight from shared storage (so a file needed by K instances is read K times). Same plan as the
packed path: the raw files are grouped into the same shards ``pack`` would make."""
from __future__ import annotations

import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from hpcbench.common.atomic import atomic_write
from hpcbench.common.data.layout import REPLICATED, FileLayout, scan
from hpcbench.common.errors import DataError

from .distribute import Stats
from .manifest import ShardInfo
from .nodelocal import _disk_error, target
from .pack import group_files


def raw_shards(source: Path, layout: FileLayout, shard_bytes: int) -> dict[str, tuple[list[ShardInfo], list[list[tuple[str, int]]]]]:
    """Per split: virtual shards (for the planner) and their member files, from the raw dataset."""
    out = {}
    for sp, names in scan(source, layout).items():
        groups = group_files([(n, (source / n).stat().st_size) for n in names], shard_bytes)
        infos = [ShardInfo(f"{sp}/raw-{i:05d}", sum(s for _, s in g), sum(s for _, s in g), len(g), 0, 0)
                 for i, g in enumerate(groups)]
        out[sp] = (infos, groups)
    return out


def copy_files(source: Path, dest: Path, files: list[tuple[str, int]], node: int, threads: int, stats: Stats) -> None:
    def one(item: tuple[str, int]) -> None:
        name, size = item
        out = target(dest, name, f"source file {name}")
        if out.is_file() and out.stat().st_size == size:
            return  # resume: already copied
        t0 = time.perf_counter()
        try:
            with open(source / name, "rb") as src, atomic_write(out, verify=lambda p: _check(p, size, name)) as dst:
                shutil.copyfileobj(src, dst, 8 << 20)
        except OSError as exc:
            raise _disk_error(exc, out, node) from None
        with stats.lock:
            stats.read_bytes += size
            stats.read_shards += 1
            stats.write_bytes += size
            stats.write_files += 1
        stats.add_time("write_thread_s", time.perf_counter() - t0)

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, files))


def _check(p: Path, size: int, name: str) -> None:
    if p.stat().st_size != size:
        raise DataError(f"{name}: copied {p.stat().st_size} bytes, expected {size} (source changed or truncated)")


__all__ = ["REPLICATED", "copy_files", "raw_shards"]
