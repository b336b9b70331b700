"""The scaling study of ``benchmarks/staging_bench.py --scale``: staging time vs instances per method
under a shared-filesystem bandwidth cap (capfs), with the model's prediction for every configuration.

Not run on its own: ``python -m benchmarks.staging_bench --scale 1,2,4 --cap-mbps 100 ...``.
One ``mpiexec -n K*n`` job per (repeat, K) runs copy, independent and packed once each (the order
rotates per repeat); the data is generated and packed once, before the cap is set up.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.capfs import CappedMount, unavailable
from benchmarks.machine import describe, header
from benchmarks.staging_common import evict, make_data, phases
from hpcbench import registry
from hpcbench.staging.model import GB, Layout, System, predict
from hpcbench.staging.pack import Packer
from hpcbench.staging.probe import node_rates, probe

METHODS = ("copy", "independent", "packed")
MiB = 1 << 20


def emulation_system(cap_mbps: float | None, pr: dict[str, Any], nodes: int, threads: int,
                     overhead_s: float, chunk_bytes: float = 0.0) -> System:
    """The model's parameters for ``nodes`` emulated nodes sharing this host: the cap is the shared
    filesystem; each node gets cores_effective / nodes of the host's cores (``node_rate``), its local
    work runs at the probe's real-path rates (packed: decompress + checks + write + fsync; the part
    above copy's write path counts as decompression), and its phases add up (``shared_cpu``)."""
    if "stage_path_GBps_thread" not in pr:
        raise SystemExit("the probe in this JSON predates the stage-path probe (probe version 2): rerun the study")
    local = node_rates(pr, threads, pr["cores_effective"] / nodes)
    return System(
        fs_GBps=cap_mbps / 1e3 if cap_mbps else pr["fs_GBps"],
        **local,
        overhead_s=overhead_s, shared_cpu=True, chunk_bytes=chunk_bytes)


def _say_probe(what: str, pr: dict[str, Any]) -> None:
    print(f"{what}: " + ", ".join(f"{k} {v:.3g}" for k, v in pr.items() if isinstance(v, float)), flush=True)


def _mean_probe(probes: list[dict[str, Any]]) -> dict[str, Any]:
    """The model's rates: the mean of the probes taken before and after the runs (the load of other jobs
    drifts during a study); each probe is kept in ``runs`` of the JSON for the spread."""
    out = dict(probes[0])
    for k, v in probes[0].items():
        if isinstance(v, float):
            out[k] = statistics.fmean(p[k] for p in probes)
    out["probes"] = [{k: v for k, v in p.items() if k != "probes"} for p in probes]
    return out


def _med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def drive(a: argparse.Namespace) -> None:
    ks = [int(k) for k in a.scale.split(",") if k]
    n = a.nodes_per_instance
    mach = describe()
    print(header(mach), flush=True)
    if a.cap_mbps is not None:
        why = unavailable()
        if why:
            sys.exit(f"staging_bench --cap-mbps: capfs cannot run here: {why}; run without --cap-mbps for an "
                     "uncapped (local disk + page cache) study")
    t_start = time.perf_counter()
    src, shared, job = a.work / "src", a.work / "shared", a.work / "job"
    files, gen_s = make_data(src / "raw", a.gib, a.size)
    t0 = time.perf_counter()
    man = Packer(src / "raw", src / "packed", registry.layout("cosmoflow"), int(a.shard_mb * MiB), threads=a.threads,
                 progress=False).run()
    pack_s = time.perf_counter() - t0
    raw_b = sum(s.raw_bytes for s in man.splits.values())
    packed_b = sum(s.bytes for s in man.splits.values())
    print(f"data: {files} files, {raw_b / GB:.3f} GB raw -> {packed_b / GB:.3f} GB packed "
          f"({packed_b / raw_b:.1%}); datagen {gen_s:.1f} s, pack {pack_s:.1f} s", flush=True)
    a.work.mkdir(parents=True, exist_ok=True)
    probes = [probe(refresh=True, folder=a.work)]  # measured now, under this session's load; again at the end
    _say_probe("probe before the runs", probes[0])
    cap = CappedMount(src, shared, a.cap_mbps) if a.cap_mbps else None
    where = shared if cap else src
    cap_label = (f"capfs (FUSE server process, direct I/O) capped at {a.cap_mbps:g} MB/s shared by all readers"
                 if cap else "NO CAP: local disk + page cache (source evicted per job)")
    print(f"shared source: {cap_label}", flush=True)
    runs: list[dict[str, Any]] = []
    served: list[dict[str, Any]] = []
    try:
        if cap:
            cap.start()
        for rep in range(a.repeats):
            if rep and time.perf_counter() - t_start > a.budget_s:
                print(f"time budget {a.budget_s:.0f} s spent: stopping after {rep} repeats", flush=True)
                break
            for k in ks:
                order = list(METHODS[rep % 3:] + METHODS[: rep % 3])
                out = job / f"runs_k{k}_r{rep}.json"
                out.parent.mkdir(parents=True, exist_ok=True)
                if not cap:
                    evict(src)
                before = cap.stats().get("read_bytes", 0) if cap else 0
                cmd = [a.mpiexec, "-n", str(k * n), sys.executable, "-m", "benchmarks.staging_bench",
                       "--source-root", str(where), "--work", str(job), "--instances", str(k),
                       "--methods", ",".join(order), "--repeats", "1", "--json-out", str(out),
                       "--chunk-mb", str(a.chunk_mb), "--threads", str(a.threads), "--shard-mb", str(a.shard_mb)]
                res = subprocess.run(cmd, cwd=Path(__file__).resolve().parents[1], env=os.environ | {"PYTHONPATH": str(Path(__file__).resolve().parents[1])})
                if res.returncode:
                    sys.exit(f"staging job K={k} repeat {rep} failed with status {res.returncode}: {' '.join(cmd)}")
                time.sleep(0.6 if cap else 0)  # the server writes its counters at most every 0.5 s
                got = json.loads(out.read_text())["runs"]
                after = cap.stats().get("read_bytes", 0) if cap else 0
                served.append({"k": k, "rep": rep, "served_bytes": after - before,
                               "job_read_bytes": sum(r["report"]["totals"]["read_bytes"] for r in got)})
                for r in got:
                    runs.append({"k": k, "rep": rep, "method": r["method"], "wall_s": r["wall_s"],
                                 "read_bytes": r["report"]["totals"]["read_bytes"],
                                 "recv_bytes": r["report"]["totals"]["recv_bytes"],
                                 "write_bytes": r["report"]["totals"]["write_bytes"],
                                 "phases": phases(r["report"])})
    finally:
        if cap:
            final = cap.stop()
            print(f"capfs stopped: served {final.get('read_bytes', 0) / GB:.3f} GB in "
                  f"{final.get('read_requests', 0)} reads, throttled {final.get('throttled_s', 0):.1f} s", flush=True)
    probes.append(probe(refresh=True, folder=a.work))
    _say_probe("probe after the runs", probes[1])
    pr = _mean_probe(probes)
    report(a, ks, n, mach, pr, cap_label, runs, served, raw_b, packed_b, files, time.perf_counter() - t_start)
    if not a.keep:
        shutil.rmtree(a.work, ignore_errors=True)


def rereport(a: argparse.Namespace, path: Path) -> None:
    """Print and write the summary, the model validation and the plot again from a saved PREFIX.json
    (``staging_bench.py --scale ... --from-json PREFIX.json``): the model can change, the runs do not."""
    d = json.loads(path.read_text())
    ks = [int(k) for k in a.scale.split(",") if k]
    files = d.get("files", 0)
    report(a, ks, a.nodes_per_instance, d["machine"], d["probe"], d["cap_label"], d["runs"], d["served"],
           d["raw_bytes"], d["packed_bytes"], files, d.get("elapsed_s", float("nan")))


def report(a: argparse.Namespace, ks: list[int], n: int, mach: dict[str, Any], pr: dict[str, Any], cap_label: str,
           runs: list[dict[str, Any]], served: list[dict[str, Any]], raw_b: int, packed_b: int, files: int,
           elapsed: float) -> None:
    def sel(k: int, m: str) -> list[dict[str, Any]]:
        return [r for r in runs if r["k"] == k and r["method"] == m]

    reps = max((r["rep"] for r in runs), default=-1) + 1
    L = [header(mach),
         f"staging scale study: {files} synthetic CosmoFlow files, {raw_b / GB:.3f} GB raw, {packed_b / GB:.3f} GB packed "
         f"({packed_b / raw_b:.1%}); K instances x {n} emulated nodes (mpiexec -n 2K, one rank per node) on "
         f"{mach['cores']} cores; {reps} repeats (method order rotated); {a.threads} threads, chunk {a.chunk_mb} MiB, "
         f"shard {a.shard_mb:g} MiB",
         f"shared source: {cap_label}",
         f"{'K':>2} {'method':>11} {'wall s median':>13} {'min-max':>13} {'shared read GB':>14} {'fabric GB':>9} "
         f"{'fixed s':>7} {'read s':>6} {'allgath s':>9} {'drain s':>7}"]
    med: dict[tuple[int, str], float] = {}
    for k in ks:
        for m in METHODS:
            rs = sel(k, m)
            if not rs:
                continue
            w = [r["wall_s"] for r in rs]
            med[k, m] = _med(w)
            ph = {p: _med([r["phases"][p] for r in rs]) for p in ("fixed", "read", "allgather", "drain")}
            L.append(f"{k:>2} {m:>11} {med[k, m]:>13.2f} {min(w):>6.2f}-{max(w):<6.2f} {rs[0]['read_bytes'] / GB:>14.3f} "
                     f"{rs[0]['recv_bytes'] / GB:>9.3f} {ph['fixed']:>7.2f} {ph['read']:>6.2f} {ph['allgather']:>9.2f} "
                     f"{ph['drain']:>7.2f}")
    L.append("ratios (median wall): " + "; ".join(
        f"K={k}: copy/packed {med[k, 'copy'] / med[k, 'packed']:.2f}x, independent/packed "
        f"{med[k, 'independent'] / med[k, 'packed']:.2f}x" for k in ks if (k, "packed") in med))
    if len(ks) > 1 and (ks[0], "packed") in med:
        k0, k1 = ks[0], ks[-1]
        L.append(f"growth from K={k0} to K={k1} ({k1 // k0}x instances): " + ", ".join(
            f"{m} {med[k1, m] / med[k0, m]:.2f}x" for m in METHODS if (k1, m) in med))
        r = med[k1, "copy"] / med[k1, "packed"]
        L.append(f"goal packed >= 3x faster than copy at K={k1}: {'met' if r >= 3 else 'MISSED'} ({r:.2f}x)")
    if served and any(s["served_bytes"] for s in served):
        tot_s, tot_j = sum(s["served_bytes"] for s in served), sum(s["job_read_bytes"] for s in served)
        L.append(f"cross-check: capfs served {tot_s / GB:.3f} GB, the jobs counted {tot_j / GB:.3f} GB read "
                 f"(manifest/header reads make up the difference)")
    L.append(f"elapsed {elapsed:.0f} s (budget {a.budget_s:.0f} s)")
    text = "\n".join(L)
    print(text, flush=True)
    mtext = validate(ks, n, pr, a, runs, med, raw_b, packed_b, files)
    print(mtext, flush=True)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        Path(f"{a.out}.txt").write_text(text + "\n")
        Path(f"{a.out}_model.txt").write_text(header(mach) + "\n" + mtext + "\n")
        Path(f"{a.out}.json").write_text(json.dumps({"machine": mach, "probe": pr, "runs": runs, "served": served,
                                                     "raw_bytes": raw_b, "packed_bytes": packed_b, "files": files,
                                                     "cap_label": cap_label, "elapsed_s": elapsed}, indent=1) + "\n")
        plot(Path(f"{a.out}.png"), ks, n, runs, med, pr, a, raw_b, packed_b, cap_label, files)


def _overhead(runs: list[dict[str, Any]], k: int, m: str) -> float:
    return _med([r["phases"]["fixed"] for r in runs if r["k"] == k and r["method"] == m])


def validate(ks: list[int], n: int, pr: dict[str, Any], a: argparse.Namespace, runs: list[dict[str, Any]],
             med: dict[tuple[int, str], float], raw_b: int, packed_b: int, files: int) -> str:
    """Model vs measured, per (K, method): the model gets the cap, this machine's probe divided among the
    emulated nodes, and the measured fixed time (outside moving splits) of that configuration as its overhead."""
    L = ["model validation (a): staging.model vs the emulated runs above (median wall)",
         f"parameters (all from the probe, none fitted): fs = "
         f"{'cap ' + format(a.cap_mbps, 'g') + ' MB/s' if a.cap_mbps else 'probe disk read'}; cores per emulated node = "
         f"cores_effective {pr['cores_effective']:.2f} / nodes; per thread: packed path "
         f"{pr['stage_path_GBps_thread']:.3f} GB/s, copy path {pr['copy_path_GBps_thread']:.3f} GB/s, fabric "
         f"{pr['fabric_GBps']:.3f} GB/s; node rate = thread rate x min({a.threads} threads, cores per node); "
         f"shared_cpu (local phases add up); pipelined in Allgatherv rounds of {a.chunk_mb} MiB per reader (copy: "
         "files); overhead = the measured fixed part (wall - the slowest node's time moving splits: manifest, "
         "headers, plan, marker)",
         "probe spread (before / after the runs): " + "; ".join(
             f"{k} {' / '.join(format(p[k], '.3g') for p in pr.get('probes', [pr]))}" for k in
             ("stage_path_GBps_thread", "copy_path_GBps_thread", "cores_effective", "fabric_GBps")),
         f"{'K':>2} {'method':>11} {'measured s':>10} {'model s':>8} {'error':>7} {'probe band s':>13} "
         "model phases (read/fabric/decomp/write s)"]
    errs, inside = [], 0
    for k in ks:
        for m in METHODS:
            if (k, m) not in med:
                continue
            def model(q: dict[str, Any]) -> Any:
                s = emulation_system(a.cap_mbps, q, k * n, a.threads, _overhead(runs, k, m), a.chunk_mb * MiB)
                return predict(raw_b, packed_b, Layout(k * n, k), s, m, files)

            p = model(pr)
            band = sorted(model(q).total_s for q in pr.get("probes", [pr]))
            e = p.total_s / med[k, m] - 1
            errs.append(abs(e))
            inside += band[0] <= med[k, m] <= band[-1]
            ph = p.phases
            L.append(f"{k:>2} {m:>11} {med[k, m]:>10.2f} {p.total_s:>8.2f} {e:>+7.0%} {band[0]:>6.2f}-{band[-1]:<6.2f} "
                     f"{ph['read']:.2f}/{ph['fabric']:.2f}/{ph['decompress']:.2f}/{ph['write']:.2f}")
    if errs:
        L.append(f"worst |error| {max(errs):.0%}, median {statistics.median(errs):.0%}; within 20%: "
                 f"{sum(e <= 0.2 for e in errs)}/{len(errs)}; measured median inside the band of the two probes' "
                 f"predictions: {inside}/{len(errs)}")
    L.append("")
    L.append(published())
    return "\n".join(L)


# Published CosmoFlow staging (NVIDIA, MLPerf HPC v1.0 and v2.0; source document 003 of the project):
# v1.0: 32 instances x 16 nodes (128 GPUs each) = 512 nodes, every instance read its ~9 TB itself:
#       10.76 min; v2.0: 128 instances x 4 nodes = 512 nodes, sharded reads of data packed to ~15%
#       ("~85% less data from disk") + MPI_Allgather: 6.7 min.
PUBLISHED = (("v1.0 (independent reads)", "copy", 512, 32, 10.76 * 60),
             ("v2.0 (packed + Allgather)", "packed", 512, 128, 6.7 * 60))
CLUSTER = System(fs_GBps=500.0, fabric_GBps=200.0, write_GBps=6.0, decompress_GBps=24.0)


def published() -> str:
    """Model validation (b) against the published v1.0/v2.0 figures, with the parameters of docs/staging.md
    and the CosmoFlow dataset's known size (the same numbers ``hpcbench stage --dry-run`` uses)."""
    from hpcbench.staging.report import known_shards

    lay = registry.layout("cosmoflow")
    shards = [s for sp in lay.known for s in known_shards(lay, sp, 256 * MiB)]
    DATASET_RAW, DATASET_PACKED = sum(s.raw_bytes for s in shards), sum(s.bytes for s in shards)
    s = CLUSTER
    L = ["model validation (b): published CosmoFlow staging (NVIDIA Selene, 512 DGX A100 nodes)",
         f"parameters: shared FS {s.fs_GBps:g} GB/s aggregate, fabric {s.fabric_GBps:g} GB/s per node (8x HDR 200 Gb/s), "
         f"node-local write {s.write_GBps:g} GB/s per node (NVMe RAID0), decompress {s.decompress_GBps:g} GB/s per node; "
         f"dataset {DATASET_RAW / 1e12:g} TB raw per instance, packed to {DATASET_PACKED / DATASET_RAW:.0%}",
         f"{'submission':>26} {'method':>11} {'nodes':>5} {'inst':>4} {'published s':>11} {'model s':>8} {'error':>7}  bottleneck"]
    for name, m, nodes, k, t in PUBLISHED:
        p = predict(DATASET_RAW, DATASET_PACKED, Layout(nodes, k), s, m)
        L.append(f"{name:>26} {m:>11} {nodes:>5} {k:>4} {t:>11.0f} {p.total_s:>8.0f} {p.total_s / t - 1:>+7.0%}  "
                 f"{p.bottleneck()} ({', '.join(f'{x} {v:.0f}s' for x, v in p.phases.items())})")
    return "\n".join(L)


def plot(path: Path, ks: list[int], n: int, runs: list[dict[str, Any]], med: dict[tuple[int, str], float],
         pr: dict[str, Any], a: argparse.Namespace, raw_b: int, packed_b: int, cap_label: str, files: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for m, c in zip(METHODS, ("tab:red", "tab:orange", "tab:blue")):
        xs = [k for k in ks if (k, m) in med]
        ys = [med[k, m] for k in xs]
        lo = [med[k, m] - min(r["wall_s"] for r in runs if r["k"] == k and r["method"] == m) for k in xs]
        hi = [max(r["wall_s"] for r in runs if r["k"] == k and r["method"] == m) - med[k, m] for k in xs]
        ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", color=c, capsize=3, label=f"{m} (measured, median, min-max)")
        model = [predict(raw_b, packed_b, Layout(k * n, k), emulation_system(
            a.cap_mbps, pr, k * n, a.threads, _overhead(runs, k, m), a.chunk_mb * MiB), m, files).total_s for k in xs]
        ax.plot(xs, model, "--", color=c, alpha=0.7, label=f"{m} (model)")
    ax.set_xlabel(f"instances K ({n} emulated nodes each)")
    ax.set_ylabel("staging time (s)")
    ax.set_xticks(ks)
    ax.set_title(f"staging vs instances, {raw_b / GB:.2f} GB raw per instance\n{cap_label}", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
