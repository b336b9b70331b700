"""``hpcbench stage``: the orchestration on every rank. One stager per node (the node's local rank
0) reads, exchanges and writes in a worker thread; every rank's main thread exchanges a heartbeat
(:func:`hpcbench.staging.exchange.supervised`), so a rank that dies, hangs or is stopped ends the job within
``--timeout``. Errors are agreed on by all ranks: the job ends with one clear message.

Per node, in this order: refuse a dest that overlaps the source; take the dest's lock; remove the
completion marker; claim the dest for this dataset (``--clean`` removes another dataset's files);
drop files of shards this node no longer needs; stage; verify; write the marker last.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import time
from array import array
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcbench.common.data.layout import GENERIC, REPLICATED, FileLayout
from hpcbench.common.dist import DistEnv, mpi
from hpcbench.common.errors import ConfigError, DataError
from hpcbench.common.nodepath import has_node, node_path

from .copy import copy_files, raw_shards
from .distribute import Ctx, SplitExchange, Stats
from .exchange import FOREVER, agree, barrier, check_timeout, deadline, describe, supervised, wait
from .manifest import MANIFEST, Manifest, member_index, refuse_overlap
from .marker import (DestLock, NodeLayout, claim, refuse_links, remove_files, remove_marker, unlisted,
                     write_marker)
from .nodelocal import Journal, sweep_temporaries, verify_journal
from .plan import alone, node_slots, plan_split

MiB = 1 << 20
# packed: sharded reads + Allgatherv; independent: compression without sharded reads, every node reads
# its whole packed shard-set itself (K x the shared reads, no fabric); copy: every node copies its raw
# files (the v1.0 way)
METHODS = ("packed", "independent", "copy")


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
    clean: bool = False  # the dest holds another dataset: remove its staged files instead of refusing

    def validate(self) -> None:
        if self.method not in METHODS:
            raise ConfigError(f"--method must be one of {', '.join(METHODS)}, got {self.method!r}")
        for key, v in (("--chunk-mb", self.chunk_mb), ("--threads", self.threads), ("--timeout", self.timeout_s),
                       ("--shard-mb", self.shard_bytes)):
            if not v > 0:
                raise ConfigError(f"{key} must be > 0, got {v}")
        check_timeout(self.timeout_s)
        if self.reserve_bytes < 0:
            raise ConfigError(f"--reserve-mb must be >= 0, got {self.reserve_bytes / MiB:g}")


def node_dest(template: str, node: int, env: DistEnv) -> Path:
    if not has_node(template) and env.layout.num_nodes > 1 and env.layout.host_local_size > env.layout.local_size:
        raise ConfigError(f"--dest {template!r}: several emulated nodes share this host; put a {{node}} "
                          "placeholder in --dest (e.g. /tmp/stage/node{node}) so each gets its own folder")
    return Path(node_path(template, node, "--dest"))


def _plan_input(opts: StageOptions) -> dict[str, Any]:
    """The manifest (packed) or the raw listing (copy), and the hash that names the dataset."""
    if opts.method != "copy":
        man = Manifest.load(opts.source / MANIFEST)
        if opts.layout is not None and man.dataset != opts.layout.name:
            raise DataError(f"{opts.source / MANIFEST}: packed dataset is {man.dataset!r}, "
                            f"not --dataset {opts.layout.name!r}")
        members = member_index(opts.source, [sh for s in man.splits.values() for sh in s.shards], 8)
        return {"dataset": man.dataset, "sha256": man.sha256, "members": members,
                "splits": {n: (s.replicate, s.shards, None) for n, s in man.splits.items()}}
    layout = opts.layout or GENERIC
    raw = raw_shards(opts.source, layout, opts.shard_bytes)
    # a raw dataset is named by its folder and layout, not its content: a changed, added or removed
    # source file is restaged in place (the shards' fingerprints tell which), never "another dataset"
    sha = "raw-" + hashlib.sha256(json.dumps(["raw-v2", str(opts.source.resolve()), layout.name]).encode()).hexdigest()
    members = {info.name: [f[0] for f in g] for infos, groups in raw.values() for info, g in zip(infos, groups)}
    return {"dataset": layout.name, "sha256": sha, "members": members,
            "splits": {n: (n == REPLICATED, infos, groups) for n, (infos, groups) in raw.items()}}


def _select(splits: dict[str, Any], opts: StageOptions) -> list[str]:
    names = opts.splits or list(splits)
    for n in names + opts.replicate:
        if n not in splits:
            raise ConfigError(f"--splits/--replicate: no split {n!r} in the dataset; it has {', '.join(splits)}")
    return names + ([REPLICATED] if REPLICATED in splits and REPLICATED not in names else [])


def _layout(env: DistEnv, timeout_s: float) -> NodeLayout:
    """This node's place in the plan; a layout that cannot be staged is refused on every rank."""
    lay = env.layout
    mine = array("q", [lay.node_index, lay.instance, lay.instance_node_index, lay.nodes_per_instance])
    every = array("q", bytes(lay.world_size * len(mine) * mine.itemsize))
    wait(env.comm.Iallgather(mine, every), timeout_s, "exchanging the layout")
    slots, n = node_slots([tuple(every[4 * r:4 * r + 4]) for r in range(lay.world_size)])
    return NodeLayout(lay.node_index, slots[lay.node_index], n, len(slots) // n, len(slots))


def stage(env: DistEnv, opts: StageOptions, mllog: Any = None) -> dict[str, Any] | None:
    """Stage the dataset; returns the job report on world rank 0 (None elsewhere)."""
    opts.validate()
    lay = env.layout
    node = _layout(env, opts.timeout_s)
    if mllog is not None:
        mllog.start("staging_start", metadata={"method": opts.method})
    t_start = time.perf_counter()
    info = supervised(env.comm, (lambda: _plan_input(opts)) if lay.world_rank == 0 else None, opts.timeout_s,
                      "waiting for rank 0 to read the manifest", "rank 0")
    with deadline(opts.timeout_s, "receiving the manifest from rank 0"):
        info = env.comm.bcast(info, root=0)
    leader = lay.local_rank == 0
    with deadline(opts.timeout_s, "making the stagers' communicator"):
        leaders = env.comm.Split(0 if leader else mpi().UNDEFINED, lay.world_rank)
    stats, where = Stats(), f"node {lay.node_index}"
    dest = supervised(env.comm, (lambda: _stage_node(env, opts, info, leaders, node, stats)) if leader else None,
                      opts.timeout_s, "waiting for all nodes to finish staging", where)
    stats.times["total_s"] = time.perf_counter() - t_start
    from .report import build_report

    with deadline(opts.timeout_s, "gathering the nodes' reports"):
        rows = leaders.gather(_node_row(lay, dest, stats), root=0) if leader else None
    if leader:
        leaders.Free()
    barrier(env.comm, opts.timeout_s, "finishing the job")  # nobody leaves while a peer is stuck
    if mllog is not None:
        mllog.end("staging_stop", metadata={"method": opts.method})
    if lay.world_rank != 0:
        return None
    report = build_report(info["dataset"], opts.method, lay, rows or [], stats.times["total_s"])
    if opts.report:
        from hpcbench.common.atomic import atomic_write_text

        atomic_write_text(opts.report, json.dumps(report, indent=1) + "\n")
    return report


def _node_row(lay: Any, dest: Path | None, st: Stats) -> dict[str, Any]:
    return {"node": lay.node_index, "instance": lay.instance, "dest": str(dest), "read_bytes": st.read_bytes,
            "read_files": st.read_shards, "sent_bytes": st.sent_bytes, "recv_bytes": st.recv_bytes,
            "write_bytes": st.write_bytes, "write_files": st.write_files, "skipped_shards": st.skipped_shards,
            "repaired_files": st.repaired_files, "removed_files": st.removed_files,
            "rounds": st.rounds, "times": {k: round(v, 4) for k, v in st.times.items()}}


def _prepare(opts: StageOptions, info: dict[str, Any], node: NodeLayout, dest: Path, st: Stats,
             ) -> tuple[DestLock, Journal, list[tuple[Any, list[int], Any]], list[str]]:
    """Everything before the first byte moves (see the module docstring); returns the held lock, the
    journal, per split (plan, shards still to stage, raw groups) and the verify problems found."""
    refuse_overlap(opts.source, dest)
    names = _select(info["splits"], opts)
    dest.mkdir(parents=True, exist_ok=True)
    refuse_links(dest, state_only=True)  # the lock and the marker live there
    lock = DestLock(dest)
    try:
        remove_marker(dest)
        refuse_links(dest)  # before anything is removed: never through a linked folder
        journal = Journal(dest)
        st.removed_files = claim(dest, info["dataset"], info["sha256"], journal, opts.clean)
        sweep_temporaries(dest)
        plans = []
        for sp in names:
            replicate, shards, groups = info["splits"][sp]
            p = plan_split(sp, replicate or sp in opts.replicate, shards, node.instances, node.nodes_per_instance)
            empty = [j for j, st_ in enumerate(p.sets) if not st_]
            if empty:  # that node of every instance would train without this split
                least = f"at least {node.nodes_per_instance} shards per split"
                smaller = (f"stage it with a smaller `hpcbench stage --shard-mb` ({least}; --method copy groups the "
                           "raw files into shards like pack does)" if opts.method == "copy" else
                           f"repack it with a smaller `hpcbench pack --shard-mb` ({least})")
                raise DataError(f"split {sp} has {len(shards)} shards, too few for instances of "
                                f"{node.nodes_per_instance} nodes (node {empty[0]} of each instance would get none of "
                                f"it): {smaller}, or pass --replicate {sp}")
            plans.append((p, p.sets[p.set_of(node.slot)], groups))
        needed = {p.shards[i].name for p, mine, _ in plans for i in mine}
        listed = _listed(info, plans)
        keep = set(listed)
        # staged before for another layout or other splits, or (--method copy) a source file since
        # deleted: training must not read them. Files of a shard no longer needed that this node still
        # needs elsewhere (copy's regrouping) stay; they are copied again.
        old = [f[0] for rec in journal.done.values() for f in rec["files"] if f[0] not in keep]
        if old or set(journal.done) - needed:
            st.removed_files += remove_files(dest, old)
            journal.rewrite(needed, keep)
        extra = unlisted(dest, listed, [sp for sp in info["splits"]])
        if extra and not opts.clean:  # a journal lost or cut short, or files placed by hand
            raise DataError(f"node {node.node}: {dest} holds {len(extra)} files in its split folders that this "
                            f"dataset does not list ({', '.join(extra[:3])}{', ...' if len(extra) > 3 else ''}); "
                            "training would read them: pass --clean to remove them, or stage to another folder")
        st.removed_files += remove_files(dest, extra)
        problems: list[str] = []
        if opts.verify:
            # copy: against the source files as they are now, not only the journal's checksums
            _, _, problems = verify_journal(journal, opts.threads, opts.source if opts.method == "copy" else None)
        work = []
        for p, mine, groups in plans:
            todo = [i for i in mine if not journal.complete(p.shards[i])]
            st.skipped_shards += len(mine) - len(todo)
            work.append((p, todo, groups))
        need = sum(p.shards[i].raw_bytes for p, todo, _ in work for i in todo)
        free = shutil.disk_usage(dest).free
        if need + opts.reserve_bytes > free:
            raise DataError(f"node {node.node}: not enough free space in {dest}: staging needs {need / MiB:.1f} MiB "
                            f"(+{opts.reserve_bytes / MiB:.1f} MiB reserve) but only {free / MiB:.1f} MiB are free")
        return lock, journal, work, problems
    except BaseException:
        lock.release()
        raise


def _listed(info: dict[str, Any], plans: list[tuple[Any, list[int], Any]]) -> list[str]:
    """Every file this node will hold (the members of the shards it needs)."""
    return [n for p, mine, _ in plans for i in mine for n in info["members"][p.shards[i].name]]


def _stage_node(env: DistEnv, opts: StageOptions, info: dict[str, Any], leaders: Any, node: NodeLayout,
                st: Stats) -> Path:
    """On the node's stager (in the supervised thread): prepare, move every split, verify, mark."""
    where = f"node {node.node}"
    t0 = time.perf_counter()
    err, lock, dest = None, None, None
    try:
        dest = node_dest(opts.dest, node.node, env)
        lock, journal, work, problems = _prepare(opts, info, node, dest, st)
        from . import exchange

        exchange.ON_ABORT.append(lambda: sweep_temporaries(dest))  # an abort leaves no temporaries
    except Exception as exc:  # noqa: BLE001 - every failure must reach agree(), or peers would wait
        err = describe(exc, where)
    try:
        # preparing may take long (--verify re-reads everything): the heartbeat covers dead peers
        agree(leaders, err, FOREVER, "preparing the node-local folders")
        assert dest is not None and lock is not None
        st.times["plan_s"] = time.perf_counter() - t0
        _move(env, opts, leaders, node, dest, journal, work, st)
        st.repaired_files = len(problems)
        _finish(opts, info, node, dest, journal, work, st)
    finally:
        if lock is not None:
            lock.release()
    return dest


def _move(env: DistEnv, opts: StageOptions, leaders: Any, node: NodeLayout, dest: Path, journal: Journal,
          work: list[tuple[Any, list[int], Any]], st: Stats) -> None:
    where = f"node {node.node}"
    with ThreadPoolExecutor(opts.threads) as pool:
        ctx = Ctx(opts.source, dest, node.node, journal, pool, st, opts.chunk_mb * MiB, opts.timeout_s,
                  mem_limit=max(256 * MiB, 4 * opts.chunk_mb * MiB * node.instances))
        # every group communicator is made up front: Split is collective over all stagers. A blocking
        # collective spins the CPU while it waits for the last stager (MPICH does); the sleeping
        # barrier first makes all arrive together, so stagers still planning keep their cores.
        if opts.method == "packed":
            barrier(leaders, opts.timeout_s, "making the group communicators")
        comms = [None if opts.method == "copy" else mpi().COMM_SELF if opts.method == "independent"
                 else leaders.Split(p.set_of(node.slot), node.node) for p, _, _ in work]
        for (p, todo, groups), comm in zip(work, comms):
            t1 = time.perf_counter()
            err = None
            try:
                if comm is None:
                    copy_files(opts.source, dest, [(p.shards[i], groups[i]) for i in todo], journal, node.node,
                               opts.threads, st)
                else:
                    if opts.method == "independent":
                        p = alone(p, node.slot)
                    if comm.Get_size() != p.group_size():
                        raise DataError(f"{where}: internal plan mismatch: {comm.Get_size()} nodes share shard-set "
                                        f"{p.set_of(node.slot)} of split {p.split}, the plan expects {p.group_size()}")
                    barrier(comm, opts.timeout_s, f"planning split {p.split}")
                    union = sorted(set().union(*comm.allgather(todo)))
                    SplitExchange(ctx, p, comm, comm.Get_rank(), todo, union).run()
            except Exception as exc:  # noqa: BLE001 - every failure must reach agree(), or peers would wait
                err = describe(exc, where)
            # all stagers learn about a failure before anyone starts the next split
            agree(leaders, err, opts.timeout_s, f"finishing split {p.split}")
            st.add_time(f"split_{p.split}_s", time.perf_counter() - t1)
        for comm in comms:
            if comm is not None and comm != mpi().COMM_SELF:
                comm.Free()


def _finish(opts: StageOptions, info: dict[str, Any], node: NodeLayout, dest: Path, journal: Journal,
            work: list[tuple[Any, list[int], Any]], st: Stats) -> None:
    """Check that every shard this node needs is journaled with all its files (crc32c too with
    --verify), then write the completion marker: the last write of the run."""
    where = f"node {node.node}"
    needed = [p.shards[i] for p, _, _ in work for i in p.sets[p.set_of(node.slot)]]
    missing = [s.name for s in needed if not journal.complete(s)]
    if missing:
        raise DataError(f"{where}: {len(missing)} shards are not completely staged in {dest} "
                        f"(first: {missing[0]}); run the stage again")
    if opts.verify:
        t2 = time.perf_counter()
        _, _, bad = verify_journal(journal, opts.threads)
        st.add_time("verify_s", time.perf_counter() - t2)
        if bad:
            raise DataError(f"{where}: {len(bad)} staged files fail verification: " + "; ".join(bad[:5]))
    files = [f for s in sorted(needed, key=lambda s: s.name) for f in journal.done[s.name]["files"]]
    extra = unlisted(dest, [f[0] for f in files], list(info["splits"]))
    if extra:  # placed while staging ran: never mark a folder whose loader would read more
        raise DataError(f"{where}: {len(extra)} files appeared in {dest} during staging that the dataset does not "
                        f"list ({', '.join(extra[:3])}); remove them and run the stage again")
    write_marker(dest, info["dataset"], info["sha256"], node, sorted({p.split for p, _, _ in work}), files)
