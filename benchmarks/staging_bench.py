"""Staging benchmark: packed (sharded reads + Allgatherv) vs the v1.0 way (``independent``) vs ``copy``.

Two modes:

* one MPI job (the methods interleaved in the same job):
  ``mpiexec -n 8 python -m benchmarks.staging_bench --gib 1.0`` (4 instances x 2 emulated nodes, one
  rank per node, node-local folders /…/stage/node{node}); ``--methods copy,independent,packed``.
* the scaling study under a shared-filesystem cap (run WITHOUT mpiexec; it launches one
  ``mpiexec -n 2K`` job per instance count K and repeat):
  ``python -m benchmarks.staging_bench --scale 1,2,4 --cap-mbps 100 --gib 0.25 --repeats 3 --out PREFIX``.
  The data is served by ``benchmarks/capfs.py`` (a separate FUSE server process, direct I/O, one token
  bucket for every reader), so copy, independent and packed pay alike per byte read. Prints bytes read
  from the shared source, per-phase times, the ratios, the model's prediction for each run (staging.model
  with this machine's probe) and writes PREFIX.txt, PREFIX.json, PREFIX.png and PREFIX_model.txt.

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
import resource
import shutil
import sys
import time
from pathlib import Path


from benchmarks.staging_common import evict, make_data, phases
from hpcbench.common.dist import init_distributed
from hpcbench import registry
from hpcbench.staging.exchange import barrier
from hpcbench.staging.pack import Packer
from hpcbench.staging.stage import StageOptions, stage

MiB = 1 << 20
FOREVER = 7 * 24 * 3600.0


def _args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=1.0, help="raw dataset size (GiB)")
    ap.add_argument("--size", type=int, default=128, help="grid size per side (128 = real CosmoFlow)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/hpcbench-staging-bench"))
    ap.add_argument("--instances", type=int, default=4)
    ap.add_argument("--methods", default="copy,packed", help="comma-separated: copy, independent, packed")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--chunk-mb", type=int, default=16)
    ap.add_argument("--shard-mb", type=float, default=16,
                    help="pack shard size (MiB); 16 gives the validation split of --gib 0.5 two shards per instance of 2 nodes")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None, help="also write the figures here (.txt and .json)")
    ap.add_argument("--keep", action="store_true", help="keep the generated data")
    ap.add_argument("--source-root", type=Path, default=None,
                    help="(MPI job) stage from DIR/raw and DIR/packed made before (no datagen, no eviction)")
    ap.add_argument("--json-out", type=Path, default=None, help="(MPI job) write the runs as JSON here")
    ap.add_argument("--scale", default=None, help="driver: comma-separated instance counts, one mpiexec job each")
    ap.add_argument("--nodes-per-instance", type=int, default=2, help="driver: emulated nodes per instance")
    ap.add_argument("--cap-mbps", type=float, default=None,
                    help="driver: serve the data through capfs capped at this many MB/s (shared by all readers)")
    ap.add_argument("--budget-s", type=float, default=300.0, help="driver: start no new repeat after this")
    ap.add_argument("--from-json", type=Path, default=None,
                    help="driver: no runs; summarize, validate the model and plot again from a saved PREFIX.json")
    ap.add_argument("--mpiexec", default=str(Path(sys.executable).with_name("mpiexec")))
    return ap.parse_args(argv)


def main() -> None:
    a = _args()
    if a.scale:
        from benchmarks.staging_scale import drive, rereport

        if a.from_json:
            rereport(a, a.from_json)
        else:
            drive(a)
        return
    env = init_distributed(a.instances, ranks_per_node=1, torch_backend=None)
    lay = env.layout
    # resolved on every rank before any timed run: it imports the workload's package (torch), which
    # would otherwise land inside the first run of every rank but 0 (~5 s of 7 parallel imports on 2 cores)
    layout = registry.layout("cosmoflow")
    methods = [m for m in a.methods.split(",") if m]
    given = a.source_root is not None
    root = a.source_root if given else a.work
    raw, packed, dest = root / "raw", root / "packed", a.work / "stage"
    info: dict = {}
    if lay.world_rank == 0 and not given:
        files, gen_s = make_data(raw, a.gib, a.size)
        t0 = time.perf_counter()
        man = Packer(raw, packed, layout, int(a.shard_mb * MiB), threads=a.threads,
                     progress=False).run()
        info = {"files": files, "gen_s": gen_s, "pack_s": time.perf_counter() - t0,
                "raw_bytes": sum(s.raw_bytes for s in man.splits.values()),
                "packed_bytes": sum(s.bytes for s in man.splits.values())}
    barrier(env.comm, FOREVER, "waiting for rank 0 to generate and pack the data")
    info = env.comm.bcast(info, root=0)
    runs: list[dict] = []
    for rep in range(a.repeats):
        for method in methods:
            if lay.local_rank == 0:
                shutil.rmtree(dest / f"node{lay.node_index}", ignore_errors=True)
            if lay.world_rank == 0 and not given:
                evict(raw)
                evict(packed)
            barrier(env.comm, FOREVER, "cleaning before a run")
            opts = StageOptions(raw if method == "copy" else packed, str(dest / "node{node}"),
                                layout, method=method, chunk_mb=a.chunk_mb,
                                threads=a.threads, timeout_s=600, shard_bytes=int(a.shard_mb * MiB))
            t0, c0 = time.perf_counter(), _cpu_s()
            rep_ = stage(env, opts)
            wall, cpu = time.perf_counter() - t0, _cpu_s() - c0
            cpu_all = sum(env.comm.allgather(cpu))  # every rank's process CPU (all its threads), user + system
            if rep_ is not None:
                runs.append({"rep": rep, "method": method, "wall_s": wall, "cpu_s": cpu_all, "report": rep_})
                print(f"  K={lay.num_instances} run {rep} {method:>11}: {wall:6.2f} s (cpu {cpu_all:.2f} s, all ranks), read "
                      f"{rep_['totals']['read_bytes'] / 1e9:.3f} GB, {rep_['landed_GBps_per_node']:.3f} GB/s landed "
                      f"per node; {phase_line(rep_)}", flush=True)
    if lay.local_rank == 0:
        shutil.rmtree(dest / f"node{lay.node_index}", ignore_errors=True)
    barrier(env.comm, FOREVER, "final cleanup")
    if lay.world_rank == 0:
        if a.json_out:
            a.json_out.write_text(json.dumps({"info": info, "runs": runs}) + "\n")
        if not given:
            summarize(a, lay, info, runs)
            if not a.keep:
                shutil.rmtree(a.work, ignore_errors=True)


def _cpu_s() -> float:
    """This process's CPU seconds so far (all threads, user + system): less sensitive to other jobs'
    load than wall time, since a rank waiting for a core is not charged."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def phase_line(rep: dict) -> str:
    return "phases (slowest node) " + ", ".join(f"{k} {v:.2f}s" for k, v in phases(rep).items())


def summarize(a: argparse.Namespace, lay, info: dict, runs: list[dict]) -> None:
    def best(m: str) -> dict:
        return min((r for r in runs if r["method"] == m), key=lambda r: r["wall_s"])

    def mean(m: str) -> float:
        w = [r["wall_s"] for r in runs if r["method"] == m]
        return sum(w) / len(w)

    methods = sorted({r["method"] for r in runs}, key=["copy", "independent", "packed"].index)
    lines = [
        f"staging benchmark: {info['files']} synthetic CosmoFlow files ({a.size}^3 x 4 int16), "
        f"{info['raw_bytes'] / 1e9:.3f} GB raw; mpiexec -n {lay.world_size} = {lay.num_instances} instances x "
        f"{lay.nodes_per_instance} nodes; {a.repeats} interleaved repeats; source evicted from page cache per run; "
        f"no bandwidth cap (local disk + page cache)",
        f"pack: {info['pack_s']:.1f} s ({info['raw_bytes'] / 1e6 / info['pack_s']:.0f} MB/s raw, {a.threads} threads); "
        f"compression: {info['packed_bytes'] / 1e9:.3f} GB packed = {info['packed_bytes'] / info['raw_bytes']:.1%} "
        f"of raw ({1 - info['packed_bytes'] / info['raw_bytes']:.1%} fewer bytes)",
    ]
    for m in methods:
        b = best(m)
        t = b["report"]["totals"]
        lines.append(f"{m:>11}: best {b['wall_s']:.2f} s (mean {mean(m):.2f} s), read {t['read_bytes'] / 1e9:.3f} GB "
                     f"in {t['read_files']} files, Allgatherv {t['recv_bytes'] / 1e9:.3f} GB, "
                     f"landed {b['report']['landed_GBps_per_node']:.3f} GB/s per node; {phase_line(b['report'])}")
    if "copy" in methods and "packed" in methods:
        c, p = best("copy"), best("packed")
        lines.append(f"packed/copy wall (best of {a.repeats}) = {p['wall_s'] / c['wall_s']:.2f}; shared-storage bytes "
                     f"copy/packed = {c['report']['totals']['read_bytes'] / max(1, p['report']['totals']['read_bytes']):.1f}x")
    lines.append("per-run: " + "; ".join(f"{r['method']} {r['wall_s']:.2f}s" for r in runs))
    text = "\n".join(lines)
    print(text, flush=True)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.with_suffix(".txt").write_text(text + "\n")
        a.out.with_suffix(".json").write_text(json.dumps({"info": info, "runs": runs}, indent=1) + "\n")


if __name__ == "__main__":
    main()
