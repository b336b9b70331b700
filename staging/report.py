"""The staging report (JSON + a table on rank 0) and the ``--dry-run`` plan for a cluster layout."""
from __future__ import annotations

import math
from typing import Any

from hpcbench.common.data.layout import REPLICATED, FileLayout

from .manifest import ShardInfo
from .plan import plan_split

GB = 1e9


def build_report(dataset: str, method: str, layout: Any, rows: list[dict[str, Any]], wall_s: float) -> dict[str, Any]:
    tot = {k: sum(r[k] for r in rows) for k in ("read_bytes", "read_files", "sent_bytes", "recv_bytes",
                                                  "write_bytes", "write_files", "skipped_shards")}
    return {
        "dataset": dataset, "method": method, "nodes": layout.num_nodes, "instances": layout.num_instances,
        "nodes_per_instance": layout.nodes_per_instance, "ranks": layout.world_size, "wall_s": round(wall_s, 4),
        "totals": tot,
        "landed_GBps_per_node": round(tot["write_bytes"] / max(1, len(rows)) / max(wall_s, 1e-9) / GB, 4),
        "shared_read_GBps": round(tot["read_bytes"] / max(wall_s, 1e-9) / GB, 4),
        "nodes_detail": sorted(rows, key=lambda r: r["node"]),
    }


def _mb(x: float) -> str:
    return f"{x / 1e6:,.1f}"


def format_report(rep: dict[str, Any]) -> str:
    shape = (f"{rep['nodes']} nodes = {rep['instances']} instances x {rep['nodes_per_instance']}"
             if rep["instances"] <= rep["nodes"] else
             f"{rep['nodes']} nodes x {rep['instances'] // rep['nodes']} instances per node")
    lines = [f"staging report: {rep['dataset']} via {rep['method']}, {shape}, wall {rep['wall_s']:.2f} s",
             f"{'node':>5} {'inst':>4} {'read MB':>10} {'files rd':>8} {'allgather MB':>12} "
             f"{'written MB':>11} {'files wr':>8} {'skipped':>7} {'xfer s':>7} {'total s':>7}"]
    for r in rep["nodes_detail"]:
        lines.append(f"{r['node']:>5} {r['instance']:>4} {_mb(r['read_bytes']):>10} {r['read_files']:>8} "
                     f"{_mb(r['recv_bytes']):>12} {_mb(r['write_bytes']):>11} {r['write_files']:>8} "
                     f"{r['skipped_shards']:>7} {r['times'].get('transfer_s', 0):>7.2f} {r['times'].get('total_s', 0):>7.2f}")
    t = rep["totals"]
    lines.append(f"total: read {_mb(t['read_bytes'])} MB from shared storage, moved {_mb(t['recv_bytes'])} MB by "
                 f"Allgatherv, wrote {_mb(t['write_bytes'])} MB in {t['write_files']} files; "
                 f"{rep['landed_GBps_per_node']:.3f} GB/s landed per node")
    return "\n".join(lines)


def known_shards(layout: FileLayout, split: str, shard_bytes: int) -> list[ShardInfo]:
    """Shards the real dataset would pack into, from its published size (no data needed)."""
    k = layout.known[split]
    per = max(1, shard_bytes // k.raw_bytes_per_file)
    out = []
    for i in range(math.ceil(k.files / per)):
        files = min(per, k.files - i * per)
        raw = files * k.raw_bytes_per_file
        out.append(ShardInfo(f"{split}/shard-{i:05d}.zst", int(raw * k.compression_ratio), raw, files, 0, 0))
    return out


def dry_run(splits: dict[str, tuple[bool, list[ShardInfo]]], nodes: int, instances: int,
            replicate: list[str]) -> str:
    """Per-node volumes for ``nodes`` nodes in ``instances`` instances, summarised per node slot."""
    if nodes < 1 or instances < 1:
        raise ValueError(f"--nodes and --instances must be >= 1, got {nodes} and {instances}")
    if instances > nodes:  # several instances per node: every node needs the whole dataset
        if instances % nodes:
            raise ValueError(f"--instances {instances} is not a multiple of --nodes {nodes}")
        n, groups = 1, nodes
        head = f"plan: {nodes} nodes, {instances // nodes} instances per node"
    else:
        if nodes % instances:
            raise ValueError(f"--nodes {nodes} is not a multiple of --instances {instances}")
        n, groups = nodes // instances, instances
        head = f"plan: {nodes} nodes = {instances} instances x {n} nodes"
    out = [f"{head}; every shard read once from shared storage"]
    job_read = job_raw = 0
    for sp, (rep, shards) in splits.items():
        p = plan_split(sp, rep or sp in replicate or sp == REPLICATED, shards, groups, n)
        packed, raw = sum(s.bytes for s in shards), sum(s.raw_bytes for s in shards)
        job_read += packed
        job_raw += raw * (nodes if p.replicate else groups)
        out.append(f"split {sp}: {len(shards)} shards, {sum(s.files for s in shards):,} files, "
                   f"{raw / GB:,.1f} GB raw, {packed / GB:,.1f} GB packed ({packed / max(raw, 1):.1%}), "
                   f"{'replicated to every node' if p.replicate else f'{n} shard-sets, one per node of an instance'}")
        out.append(f"  {'set':>4} {'shards':>7} {'files':>8} {'read/node GB':>12} {'files read/node':>15} "
                   f"{'allgather in/node GB':>20} {'written/node GB':>15}")
        for s, need in enumerate(p.sets):
            per = [sum(shards[i].bytes for i in r) for r in p.readers(need)]
            cnt = [len(r) for r in p.readers(need)]
            tot = sum(shards[i].bytes for i in need)
            out.append(f"  {s:>4} {len(need):>7} {sum(shards[i].files for i in need):>8,} "
                       f"{min(per) / GB:>5.2f}-{max(per) / GB:<6.2f} {min(cnt):>7}-{max(cnt):<7} "
                       f"{(tot - max(per)) / GB:>9.2f}-{(tot - min(per)) / GB:<10.2f} "
                       f"{sum(shards[i].raw_bytes for i in need) / GB:>15.2f}")
            if s == 7 and len(p.sets) > 10:
                out.append(f"  ... {len(p.sets) - 8} more sets like these")
                break
    out.append(f"job total: {job_read / GB:,.1f} GB read from shared storage (packed, once) vs "
               f"{job_raw / GB:,.1f} GB with --method copy (raw, once per instance): "
               f"{job_raw / max(job_read, 1):.1f}x less")
    return "\n".join(out)
