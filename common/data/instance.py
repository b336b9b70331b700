"""One instance's data: which ranks read which root, the loaders, and the sizes MLPerf logs.

With a shared dataset every rank of the instance sees the whole root and the instance's ranks
split it. With node-local staging (``data.node_local``) node j of the instance holds shard-set j
only: the instance's ranks on one node split that node's part, the dataset sizes are the sums over
the nodes, and every rank runs the smallest batch count of any rank (like ``drop_last``) so the
collectives stay matched. This is the one place those numbers are made.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hpcbench.common.errors import DataError

if TYPE_CHECKING:  # pragma: no cover
    from hpcbench.common.dist import DistEnv
    from hpcbench.common.workload import EpochLoader


@dataclass(frozen=True)
class ReaderGroup:
    """The ranks of the instance that read the same data root (all of them, or one node's)."""

    rank: int  # this rank's index within the group
    size: int
    leader: bool  # speaks for the group's data when sizes are summed


def reader_group(env: "DistEnv", node_local: bool) -> ReaderGroup:
    lay = env.layout
    if not node_local:
        return ReaderGroup(lay.instance_rank, lay.instance_size, lay.instance_rank == 0)
    nodes = env.instance_comm.allgather(lay.node_index)
    peers = [r for r, n in enumerate(nodes) if n == lay.node_index]
    return ReaderGroup(peers.index(lay.instance_rank), len(peers), peers[0] == lay.instance_rank)


@dataclass
class InstanceData:
    train: "EpochLoader"
    eval: "EpochLoader"
    train_samples: int  # of the whole instance (summed over nodes with node-local data)
    eval_samples: int
    steps_per_epoch: int  # the same on every rank of the instance


def agree(env: "DistEnv", group: ReaderGroup, build: Any) -> InstanceData:
    """Call ``build() -> (train loader, eval loader, (train samples, eval samples))`` on every rank
    and agree on sizes and steps. A rank that cannot load its data (e.g. a node that received no
    files) makes every rank raise the same error, instead of leaving peers in a collective."""
    lay = env.layout
    try:
        train, evaluate, sizes = build()
        mine: tuple[int, int, int] | str = (len(train), *sizes)
    except Exception as exc:  # noqa: BLE001 - re-raised on every rank below
        mine = f"{type(exc).__name__}: {exc}"
    found = env.instance_comm.allgather((mine, group.leader))
    errors = [(r, m) for r, (m, _) in enumerate(found) if isinstance(m, str)]
    if errors:
        rank, message = errors[0]
        where = f" (node {lay.node_index})" if rank == lay.instance_rank else ""
        raise DataError(f"instance {lay.instance}, rank {rank}{where}: cannot load its data: {message}")
    counts = [m[0] for m, _ in found]
    if min(counts) < 1:  # a loader not built on EpochSampler (which refuses this itself)
        rank = counts.index(min(counts))
        raise DataError(f"instance {lay.instance}, rank {rank}: no training batch per epoch (batches per rank: "
                        f"{counts}; training samples: {[m[1] for m, _ in found]}); each rank needs at least one "
                        "whole local batch: lower config key 'train.global_batch_size' or add samples")
    if group.size == lay.instance_size and len(set(counts)) != 1:
        raise DataError(f"ranks of instance {lay.instance} have different batches per epoch ({counts}); "
                        "every rank must run the same number of steps")
    leaders = [m for m, lead in found if lead]
    return InstanceData(train, evaluate, sum(m[1] for m in leaders), sum(m[2] for m in leaders), min(counts))
