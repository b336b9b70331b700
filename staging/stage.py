"""``hpcbench stage``: the orchestration on every rank. One stager per node (the node's local rank
0) reads, exchanges and writes; the other ranks of the node wait (polling, off the CPU). Errors are
agreed on by all ranks, so the whole job ends with the same clear message."""
from __future__ import annotations

import json
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common.data.layout import GENERIC, REPLICATED, FileLayout
from common.dist import DistEnv, mpi
from common.errors import ConfigError, DataError, HpcbenchError

from .copy import copy_files, raw_shards
from .distribute import Ctx, SplitExchange, Stats
from .exchange import agree, barrier
from .manifest import MANIFEST, Manifest
from .nodelocal import Journal, sweep_temporaries, verify_journal
from .plan import plan_split

MiB = 1 << 20
FOREVER = 7 * 24 * 3600.0


@dataclass
class StageOptions:
    source: Path
    dest: str  # may contain {node}
    # the dataset's layout, resolved by the caller (e.g. hpcbench.registry.layout(name)). packed: the
    # manifest must be of this dataset (None: any); copy: which files to copy (None: GENERIC, every file)
    layout: FileLayout | None = None
    splits: list[str] | None = None
    replicate: list[str] = field(default_factory=list)
    method: str = "packed"
    verify: bool = False
    chunk_mb: int = 64
    threads: int = 2
    timeout_s: float = 300.0
    reserve_bytes: int = 0
    shard_bytes: int = 256 * MiB  # only for --method copy (grouping raw files like pack does)
    report: Path | None = None


def node_dest(template: str, node: int, env: DistEnv) -> Path:
    if "{node}" not in template and env.layout.num_nodes > 1 and env.layout.host_local_size > env.layout.local_size:
        raise ConfigError(f"--dest {template!r}: several emulated nodes share this host; put a {{node}} "
                          "placeholder in --dest (e.g. /tmp/stage/node{node}) so each gets its own folder")
    try:
        return Path(template.format(node=node))
    except (KeyError, IndexError, ValueError) as exc:
        raise ConfigError(f"--dest {template!r}: only the {{node}} placeholder is allowed ({exc})") from None


def _load_plan_input(opts: StageOptions, env: DistEnv) -> dict[str, Any]:
    """On world rank 0: the manifest (packed) or the raw listing (copy); broadcast to all."""
    data: dict[str, Any] | None = None
    err = None
    if env.layout.world_rank == 0:
        try:
            if opts.method == "packed":
                man = Manifest.load(opts.source / MANIFEST)
                if opts.layout is not None and man.dataset != opts.layout.name:
                    raise DataError(f"{opts.source / MANIFEST}: packed dataset is {man.dataset!r}, "
                                    f"not --dataset {opts.layout.name!r}")
                data = {"dataset": man.dataset,
                        "splits": {n: (s.replicate, s.shards, None) for n, s in man.splits.items()}}
            else:
                layout = opts.layout or GENERIC
                raw = raw_shards(opts.source, layout, opts.shard_bytes)
                data = {"dataset": layout.name,
                        "splits": {n: (n == REPLICATED, infos, groups) for n, (infos, groups) in raw.items()}}
        except Exception as exc:  # noqa: BLE001 - all ranks wait for this answer
            err = _describe(exc, 0)
    barrier(env.comm, FOREVER, "waiting for rank 0 to read the manifest")
    agree(env.comm, err, FOREVER, "reading the manifest")
    return env.comm.bcast(data, root=0)


def _select(splits: dict[str, Any], opts: StageOptions) -> list[str]:
    names = opts.splits or list(splits)
    for n in names + opts.replicate:
        if n not in splits:
            raise ConfigError(f"--splits/--replicate: no split {n!r} in the dataset; it has {', '.join(splits)}")
    return names + ([REPLICATED] if REPLICATED in splits and REPLICATED not in names else [])


def stage(env: DistEnv, opts: StageOptions, mllog: Any = None) -> dict[str, Any] | None:
    """Stage the dataset; returns the job report on world rank 0 (None elsewhere)."""
    if opts.method not in ("packed", "copy"):
        raise ConfigError(f"--method must be 'packed' or 'copy', got {opts.method!r}")
    lay = env.layout
    if mllog is not None:
        mllog.start("staging_start", metadata={"method": opts.method})
    t_start = time.perf_counter()
    info = _load_plan_input(opts, env)
    leader = lay.local_rank == 0
    leaders = env.comm.Split(0 if leader else mpi().UNDEFINED, lay.world_rank)
    stats, err, dest = Stats(), None, None
    if leader:
        try:
            dest = node_dest(opts.dest, lay.node_index, env)
            _stage_node(env, opts, info, leaders, dest, stats)
        except Exception as exc:  # noqa: BLE001 - agreed on below so no rank waits for a dead peer
            err = _describe(exc, lay.node_index)
    agree(env.comm, err, FOREVER, "waiting for all nodes to finish staging")
    stats.times["total_s"] = time.perf_counter() - t_start
    from .report import build_report

    rows = leaders.gather(_node_row(lay, dest, stats), root=0) if leader else None
    if mllog is not None:
        mllog.end("staging_stop", metadata={"method": opts.method})
    if lay.world_rank != 0:
        return None
    report = build_report(info["dataset"], opts.method, lay, rows or [], stats.times["total_s"])
    if opts.report:
        from common.atomic import atomic_write_text

        atomic_write_text(opts.report, json.dumps(report, indent=1) + "\n")
    return report


def _describe(exc: Exception, node: int) -> str:
    if isinstance(exc, HpcbenchError):
        return str(exc)
    if isinstance(exc, OSError):
        return f"node {node}: {exc}"
    import traceback

    traceback.print_exc()
    return f"node {node}: internal error {exc!r} (traceback above)"


def _node_row(lay: Any, dest: Path | None, st: Stats) -> dict[str, Any]:
    return {"node": lay.node_index, "instance": lay.instance, "dest": str(dest), "read_bytes": st.read_bytes,
            "read_files": st.read_shards, "sent_bytes": st.sent_bytes, "recv_bytes": st.recv_bytes,
            "write_bytes": st.write_bytes, "write_files": st.write_files, "skipped_shards": st.skipped_shards,
            "repaired_files": st.repaired_files,
            "rounds": st.rounds, "times": {k: round(v, 4) for k, v in st.times.items()}}


def _stage_node(env: DistEnv, opts: StageOptions, info: dict[str, Any], leaders: Any, dest: Path, st: Stats) -> None:
    lay = env.layout
    K, n = lay.num_instances, lay.nodes_per_instance
    names = _select(info["splits"], opts)
    dest.mkdir(parents=True, exist_ok=True)
    journal = Journal(dest)
    t0 = time.perf_counter()
    sweep_temporaries(dest)
    problems: list[str] = []
    if opts.verify:
        _, _, problems = verify_journal(journal, opts.threads)
    work = []
    for sp in names:
        replicate, shards, groups = info["splits"][sp]
        p = plan_split(sp, replicate or sp in opts.replicate, shards, K, n)
        mine = p.sets[p.set_of(lay.instance_node_index)]
        todo = [i for i in mine if not journal.complete(shards[i])]
        st.skipped_shards += len(mine) - len(todo)
        work.append((p, todo, groups))
    need = sum(p.shards[i].raw_bytes for p, todo, _ in work for i in todo)
    free = shutil.disk_usage(dest).free
    err = None
    if need + opts.reserve_bytes > free:
        err = (f"node {lay.node_index}: not enough free space in {dest}: staging needs {need / MiB:.1f} MiB "
               f"(+{opts.reserve_bytes / MiB:.1f} MiB reserve) but only {free / MiB:.1f} MiB are free")
    agree(leaders, err, opts.timeout_s, "checking free space")
    st.times["plan_s"] = time.perf_counter() - t0
    with ThreadPoolExecutor(opts.threads) as pool:
        ctx = Ctx(opts.source, dest, lay.node_index, journal, pool, st, opts.chunk_mb * MiB, opts.timeout_s,
                  mem_limit=max(256 * MiB, 4 * opts.chunk_mb * MiB * K))
        # every group communicator is made up front: Split is collective over all stagers
        comms = [None if opts.method == "copy" else
                 leaders.Split(p.set_of(lay.instance_node_index), p.member_of(lay.instance, lay.instance_node_index))
                 for p, _, _ in work]
        for (p, todo, groups), comm in zip(work, comms):
            t1 = time.perf_counter()
            err = None
            try:
                if comm is None:
                    copy_files(opts.source, dest, [f for i in todo for f in groups[i]], lay.node_index, opts.threads, st)
                    for i in todo:
                        journal.record_raw(p.shards[i], groups[i])
                else:
                    barrier(comm, opts.timeout_s, f"planning split {p.split}")
                    union = sorted(set().union(*comm.allgather(todo)))
                    member = p.member_of(lay.instance, lay.instance_node_index)
                    SplitExchange(ctx, p, comm, member, todo, union).run()
            except Exception as exc:  # noqa: BLE001 - every failure must reach agree(), or peers would wait
                err = _describe(exc, lay.node_index)
            # all stagers learn about a failure before anyone starts the next split
            agree(leaders, err, FOREVER, f"finishing split {p.split}")
            st.add_time(f"split_{p.split}_s", time.perf_counter() - t1)
        for comm in comms:
            if comm is not None:
                comm.Free()
    journal.write_manifest(info["dataset"], [s.name for p, _, _ in work for s in (p.shards[i] for i in
                                                                                  p.sets[p.set_of(lay.instance_node_index)])])
    st.repaired_files = len(problems)
    if opts.verify:
        t2 = time.perf_counter()
        files, _, bad = verify_journal(journal, opts.threads)
        st.add_time("verify_s", time.perf_counter() - t2)
        if bad:
            raise DataError(f"node {lay.node_index}: {len(bad)} staged files fail verification: " + "; ".join(bad[:5]))
