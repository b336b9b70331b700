"""Who needs what and who reads what: a deterministic plan from the manifest and the layout.

With K instances of n nodes each, node j of every instance needs shard-set j (its instance's
data-parallel share of a split). The K nodes that need set j form a *group*: each reads a disjoint
1/K of the set from shared storage and an Allgatherv gives everyone the rest, so every shard is
read exactly once per job. A replicated split (files every node needs) has one set and one group of
all K*n nodes. Shards are balanced by size (largest first onto the least loaded), ties by index.

Several instances on one node (instances smaller than a node) all need the whole split: every node
is then slot 0 of n=1 and a group is every node (K = the node count). Layouts where an instance
spanning several nodes shares a node with another instance, or instances of unequal node counts,
cannot be staged (a node would need two shard-sets while training expects one) and are refused by
:func:`node_slots` before any work starts.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass

from hpcbench.common.errors import ConfigError

from .manifest import ShardInfo


def node_slots(ranks: list[tuple[int, int, int, int]]) -> tuple[dict[int, int], int]:
    """From every rank's (node, instance, node index in the instance, nodes of the instance): each
    node's shard-set slot and the nodes per instance n; a :class:`ConfigError` for a layout that
    cannot be staged (the same on every rank, so each rank may call this)."""
    npis = sorted({r[3] for r in ranks})
    if len(npis) != 1:
        raise ConfigError(f"instances span different numbers of nodes ({', '.join(map(str, npis))}); "
                          "staging needs every instance on the same number of whole nodes: change --instances "
                          "or --ranks-per-node")
    n = npis[0]
    on_node: dict[int, set[tuple[int, int]]] = {}
    for node, inst, inode, _ in ranks:
        on_node.setdefault(node, set()).add((inst, inode))
    for node, held in sorted(on_node.items()):
        insts = sorted({i for i, _ in held})
        if n > 1 and len(insts) > 1:
            raise ConfigError(f"node {node} holds ranks of instances {insts}, and each instance spans {n} nodes: "
                              "an instance must hold whole nodes, or fit inside one node; change --instances "
                              "or --ranks-per-node")
    return {node: min(j for _, j in held) for node, held in on_node.items()}, n


def balance(sizes: list[int], bins: int) -> list[list[int]]:
    """Indices of ``sizes`` dealt into ``bins`` lists, largest first onto the lightest bin (sorted)."""
    heap = [(0, b) for b in range(bins)]
    out: list[list[int]] = [[] for _ in range(bins)]
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        load, b = heapq.heappop(heap)
        out[b].append(i)
        heapq.heappush(heap, (load + sizes[i], b))
    return [sorted(x) for x in out]


@dataclass
class SplitPlan:
    split: str
    replicate: bool
    shards: list[ShardInfo]
    sets: list[list[int]]  # shard indices needed by each node slot (instance node index)
    instances: int  # nodes that need each shard-set (K: instances, or nodes when instances share a node)
    nodes_per_instance: int

    def set_of(self, instance_node: int) -> int:
        return 0 if self.replicate else instance_node

    def group_size(self) -> int:
        return self.instances * self.nodes_per_instance if self.replicate else self.instances

    def member_of(self, instance: int, instance_node: int) -> int:
        """This node's index in its group."""
        return instance * self.nodes_per_instance + instance_node if self.replicate else instance

    def readers(self, needed: list[int]) -> list[list[int]]:
        """Shard indices (from ``needed``) that each group member reads, balanced by packed size."""
        dealt = balance([self.shards[i].bytes for i in needed], self.group_size())
        return [[needed[k] for k in d] for d in dealt]


def plan_split(split: str, replicate: bool, shards: list[ShardInfo], instances: int,
               nodes_per_instance: int) -> SplitPlan:
    sets = [list(range(len(shards)))] if replicate else balance([s.raw_bytes for s in shards], nodes_per_instance)
    return SplitPlan(split, replicate, shards, sets, instances, nodes_per_instance)


def alone(p: SplitPlan, slot: int) -> SplitPlan:
    """Compression without sharded reads (``--method independent``): this node reads its whole shard-set from shared
    storage itself, a group of one, so a shard needed by K instances is read K times."""
    return SplitPlan(p.split, False, p.shards, [p.sets[p.set_of(slot)]], 1, 1)


@dataclass
class NodeVolume:
    """What one node reads, receives and writes for one split (bytes and counts)."""

    read_bytes: int
    read_shards: int
    recv_bytes: int
    write_bytes: int
    write_files: int


def node_volume(p: SplitPlan, instance: int, instance_node: int) -> NodeVolume:
    needed = p.sets[p.set_of(instance_node)]
    mine = p.readers(needed)[p.member_of(instance, instance_node)]
    read = sum(p.shards[i].bytes for i in mine)
    total = sum(p.shards[i].bytes for i in needed)
    return NodeVolume(read, len(mine), total - read, sum(p.shards[i].raw_bytes for i in needed),
                      sum(p.shards[i].files for i in needed))
