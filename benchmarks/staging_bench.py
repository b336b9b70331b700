"""Staging benchmark: packed (sharded reads + Allgatherv) vs ``--method copy``, in the same MPI job.

Run:  mpiexec -n 8 python benchmarks/staging_bench.py --gib 1.0
(4 instances x 2 emulated nodes, one rank per node, node-local folders /…/stage/node{node}).

Rank 0 writes >= --gib of synthetic CosmoFlow data (uncompressed TFRecord, one Example per file,
int16 Poisson counts of a log-normal field, mean ~1 per voxel) and packs it. Then the job runs the
two methods interleaved (copy, packed, copy, packed, ...) so machine contention hits both alike.
Before every run the source files are evicted from the page cache (posix_fadvise DONTNEED on those
files only), so the first read of each file comes from disk as it would from shared storage.
Prints: shared-storage bytes read by the job, compression ratio, wall time of each method and
the ratio, and GB/s landed per node.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.synth_data import cosmo_counts, example, tfrecord_frame  # noqa: E402
from common.dist import init_distributed  # noqa: E402
from hpcbench import registry  # noqa: E402
from staging.exchange import barrier  # noqa: E402
from staging.pack import Packer  # noqa: E402
from staging.stage import StageOptions, stage  # noqa: E402

MiB = 1 << 20
FOREVER = 7 * 24 * 3600.0


def make_data(raw: Path, gib: float, size: int) -> tuple[int, float]:
    import numpy as np

    per = size**3 * 4 * 2
    n_val = max(1, int(gib * (1 << 30) / per * 0.1))
    n_train = max(1, int(np.ceil(gib * (1 << 30) / per)) - n_val + 1)
    rng = np.random.default_rng(42)
    t0 = time.perf_counter()
    for split, count in (("train", n_train), ("validation", n_val)):
        (raw / split).mkdir(parents=True, exist_ok=True)
        for i in range(count):
            p = raw / split / f"univ_{i:05d}.tfrecord"
            if not p.exists():
                p.write_bytes(tfrecord_frame(example(cosmo_counts(rng, size).tobytes(), rng.uniform(-1, 1, 4))))
    return n_train + n_val, time.perf_counter() - t0


def evict(root: Path) -> None:
    for p in root.rglob("*"):
        if p.is_file():
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=1.0, help="raw dataset size (GiB)")
    ap.add_argument("--size", type=int, default=128, help="grid size per side (128 = real CosmoFlow)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/hpcbench-staging-bench"))
    ap.add_argument("--instances", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--chunk-mb", type=int, default=16)
    ap.add_argument("--shard-mb", type=float, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None, help="also write the figures here (.txt and .json)")
    ap.add_argument("--keep", action="store_true", help="keep the generated data")
    a = ap.parse_args()
    env = init_distributed(a.instances, ranks_per_node=1, torch_backend=None)
    lay = env.layout
    raw, packed, dest = a.work / "raw", a.work / "packed", a.work / "stage"
    info: dict = {}
    if lay.world_rank == 0:
        files, gen_s = make_data(raw, a.gib, a.size)
        t0 = time.perf_counter()
        man = Packer(raw, packed, registry.layout("cosmoflow"), int(a.shard_mb * MiB), threads=a.threads,
                     progress=False).run()
        info = {"files": files, "gen_s": gen_s, "pack_s": time.perf_counter() - t0,
                "raw_bytes": sum(s.raw_bytes for s in man.splits.values()),
                "packed_bytes": sum(s.bytes for s in man.splits.values())}
    barrier(env.comm, FOREVER, "waiting for rank 0 to generate and pack the data")
    info = env.comm.bcast(info, root=0)
    runs: list[dict] = []
    for rep in range(a.repeats):
        for method in ("copy", "packed"):
            if lay.local_rank == 0:
                shutil.rmtree(Path(str(dest / "node{node}").format(node=lay.node_index)), ignore_errors=True)
            if lay.world_rank == 0:
                evict(raw)
                evict(packed)
            barrier(env.comm, FOREVER, "cleaning before a run")
            opts = StageOptions(raw if method == "copy" else packed, str(dest / "node{node}"),
                                registry.layout("cosmoflow"), method=method, chunk_mb=a.chunk_mb,
                                threads=a.threads, timeout_s=600, shard_bytes=int(a.shard_mb * MiB))
            t0 = time.perf_counter()
            rep_ = stage(env, opts)
            wall = time.perf_counter() - t0
            if rep_ is not None:
                runs.append({"rep": rep, "method": method, "wall_s": wall, "report": rep_})
                print(f"run {rep} {method:>6}: {wall:6.2f} s, read {rep_['totals']['read_bytes'] / 1e9:.3f} GB, "
                      f"{rep_['landed_GBps_per_node']:.3f} GB/s landed per node", flush=True)
    if lay.local_rank == 0:
        shutil.rmtree(Path(str(dest / "node{node}").format(node=lay.node_index)), ignore_errors=True)
    barrier(env.comm, FOREVER, "final cleanup")
    if lay.world_rank == 0:
        summarize(a, lay, info, runs)
        if not a.keep:
            shutil.rmtree(a.work, ignore_errors=True)


def summarize(a: argparse.Namespace, lay, info: dict, runs: list[dict]) -> None:
    def best(m: str) -> dict:
        return min((r for r in runs if r["method"] == m), key=lambda r: r["wall_s"])

    def mean(m: str) -> float:
        w = [r["wall_s"] for r in runs if r["method"] == m]
        return sum(w) / len(w)

    c, p = best("copy"), best("packed")
    cr, pr = c["report"]["totals"]["read_bytes"], p["report"]["totals"]["read_bytes"]
    lines = [
        f"staging benchmark: {info['files']} synthetic CosmoFlow files ({a.size}^3 x 4 int16), "
        f"{info['raw_bytes'] / 1e9:.3f} GB raw; mpiexec -n {lay.world_size} = {lay.num_instances} instances x "
        f"{lay.nodes_per_instance} nodes; {a.repeats} interleaved repeats; source evicted from page cache per run",
        f"pack: {info['pack_s']:.1f} s ({info['raw_bytes'] / 1e6 / info['pack_s']:.0f} MB/s raw, {a.threads} threads); "
        f"compression: {info['packed_bytes'] / 1e9:.3f} GB packed = {info['packed_bytes'] / info['raw_bytes']:.1%} "
        f"of raw ({1 - info['packed_bytes'] / info['raw_bytes']:.1%} fewer bytes)",
        f"shared-storage bytes read by the job: packed {pr / 1e9:.3f} GB (packed size x 1) vs copy "
        f"{cr / 1e9:.3f} GB (raw x {lay.num_instances} instances): {cr / max(pr, 1):.1f}x fewer",
        f"files opened on shared storage: packed {p['report']['totals']['read_files']} vs copy "
        f"{c['report']['totals']['read_files']}",
        f"Allgatherv moved {p['report']['totals']['recv_bytes'] / 1e9:.3f} GB (compressed) between nodes",
        f"wall time (best of {a.repeats}): packed {p['wall_s']:.2f} s vs copy {c['wall_s']:.2f} s -> "
        f"packed/copy = {p['wall_s'] / c['wall_s']:.2f} (mean {mean('packed'):.2f} vs {mean('copy'):.2f} s)",
        f"landed per node (best): packed {p['report']['landed_GBps_per_node']:.3f} GB/s vs copy "
        f"{c['report']['landed_GBps_per_node']:.3f} GB/s",
        "per-run: " + "; ".join(f"{r['method']} {r['wall_s']:.2f}s" for r in runs),
    ]
    text = "\n".join(lines)
    print(text, flush=True)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.with_suffix(".txt").write_text(text + "\n")
        a.out.with_suffix(".json").write_text(json.dumps({"info": info, "runs": runs}, indent=1) + "\n")


if __name__ == "__main__":
    main()
