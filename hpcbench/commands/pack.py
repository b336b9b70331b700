"""`hpcbench pack`: merge a dataset's many small files into few zstd-compressed shards (offline, once)."""
from __future__ import annotations

import argparse
import time
from pathlib import Path

from hpcbench import registry
from hpcbench.commands._common import MAX_THREADS, check_range, mib_bytes

MIN_LEVEL = -(1 << 17)  # zstd's fastest level (ZSTD_minCLevel)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", required=True, choices=sorted(registry.dataset_names()),
                        help="dataset layout: which files are samples, split folders, replicated files")
    parser.add_argument("--source", required=True, type=Path, help="the raw dataset folder (e.g. on Lustre)")
    parser.add_argument("--dest", required=True, type=Path, help="folder for shards + manifest.json")
    parser.add_argument("--shard-mb", type=float, default=256, help="raw MiB per shard (default 256)")
    parser.add_argument("--chunk-mb", type=float, default=None,
                        help="cut files bigger than this into separately compressed frames (default: the layout's, 64)")
    parser.add_argument("--level", type=int, default=3, help="zstd level (default 3)")
    parser.add_argument("--threads", type=int, default=None, help="compression threads (default: all CPUs)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    import zstandard

    from hpcbench.staging.pack import Packer

    shard_bytes = mib_bytes("--shard-mb", args.shard_mb)
    chunk_bytes = None if args.chunk_mb is None else mib_bytes("--chunk-mb", args.chunk_mb)
    check_range("--level", args.level, MIN_LEVEL, zstandard.MAX_COMPRESSION_LEVEL,
                "zstd: negative levels are faster, 22 compresses most")
    if args.threads is not None:
        check_range("--threads", args.threads, 1, MAX_THREADS, "leave it out for all CPUs")
    layout = registry.layout(args.dataset)
    t0 = time.perf_counter()
    packer = Packer(args.source, args.dest, layout, shard_bytes, args.level, args.threads, chunk_bytes,
                    progress=not args.no_progress)
    man = packer.run()
    dt = time.perf_counter() - t0
    for name, sp in man.splits.items():
        print(f"{name}: {sp.files} files, {len(sp.shards)} shards, {sp.raw_bytes / 1e6:,.1f} MB -> "
              f"{sp.bytes / 1e6:,.1f} MB ({sp.bytes / max(1, sp.raw_bytes):.1%})")
    raw = sum(s.raw_bytes for s in man.splits.values())
    print(f"packed {args.source} -> {args.dest} in {dt:.1f} s ({raw / 1e6 / max(dt, 1e-9):,.0f} MB/s raw); "
          f"{packer.written} shards written, {packer.reused} reused from an earlier run"
          + (f" ({len(packer.damaged)} damaged shards of an earlier run packed again: "
             f"{', '.join(packer.damaged[:3])}{', ...' if len(packer.damaged) > 3 else ''})" if packer.damaged else ""))
    return 0
