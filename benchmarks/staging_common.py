"""The pieces ``staging_bench`` (one MPI job) and ``staging_scale`` (the scaling study it drives) share:
the synthetic CosmoFlow data, evicting it from the page cache, and a run's per-phase seconds."""
from __future__ import annotations

import time
from pathlib import Path

from hpcbench.common.pagecache import evict_path

from benchmarks.synth_data import cosmo_counts, example, tfrecord_frame


def make_data(raw: Path, gib: float, size: int) -> tuple[int, float]:
    import numpy as np

    per = size**3 * 4 * 2
    n_val = max(2, int(gib * (1 << 30) / per * 0.1))  # >= 2: each of 2 nodes per instance needs a shard
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
    """Every file below ``root`` out of the page cache (a cold read next)."""
    for p in root.rglob("*"):
        if p.is_file():
            evict_path(p)


def phases(rep: dict) -> dict[str, float]:
    """Per-phase seconds of a run: the slowest node's (plan, read, Allgatherv, drain) and the write
    threads' busy time summed over the threads of the slowest node."""
    rows = rep["nodes_detail"]

    def worst(k: str) -> float:
        return max((r["times"].get(k, 0.0) for r in rows), default=0.0)

    moving = max((sum(v for k, v in r["times"].items() if k.startswith("split_")) for r in rows), default=0.0)
    return {"plan": worst("plan_s"), "read": worst("read_s"), "allgather": worst("transfer_s"),
            "drain": worst("drain_s"), "write_threads": worst("write_thread_s"), "moving": moving,
            "fixed": max(0.0, rep["wall_s"] - moving)}
