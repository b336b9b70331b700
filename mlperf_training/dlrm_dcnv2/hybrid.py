"""Hybrid-parallel embeddings: large tables table-wise sharded over the instance, small ones replicated.

A table with at least ``min_rows`` rows lives on one rank only (its owner; tables are dealt to the
least-loaded rank, largest first, so the bytes per rank are balanced); every other table is
replicated and trained data-parallel like the MLPs. A forward pass on each rank's own samples:

1. the ids of the sharded tables go to their owners (one ``all_to_all_single`` of int ids);
2. each owner pools its tables over the samples of all ranks;
3. the pooled (B, D) rows go back to the ranks whose samples they are (one ``all_to_all_single``
   of the pooled embeddings, with autograd: its backward is the reverse all-to-all, so the
   owner's table receives the gradient of every rank's loss);
4. replicated tables pool locally.

Local batch sizes may differ between ranks (they are exchanged first). gloo implements
``all_to_all_single`` on CPU tensors (uneven splits included; checked with torch 2.13), NCCL on
GPUs. The harness must all-reduce the gradients of :func:`data_parallel_parameters` only (the
tables of :func:`model_parallel_parameters` already hold the full gradient on their owner) and
must not wrap the sharded tables in DDP.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from .model import DLRMDCNv2, EmbeddingBags


@dataclass(frozen=True)
class ShardingPlan:
    """Per table: the owning rank, or None for a replicated table."""

    owners: tuple[int | None, ...]
    world: int

    @classmethod
    def build(cls, cardinalities: Sequence[int], world: int, min_rows: int) -> ShardingPlan:
        load = [0] * world
        owners: list[int | None] = [None] * len(cardinalities)
        for k in sorted(range(len(cardinalities)), key=lambda t: (-cardinalities[t], t)):
            if cardinalities[k] >= min_rows:
                r = min(range(world), key=lambda i: (load[i], i))
                owners[k] = r
                load[r] += cardinalities[k]
        return cls(tuple(owners), world)

    def owned(self, rank: int) -> list[int]:
        return [k for k, o in enumerate(self.owners) if o == rank]

    @property
    def replicated(self) -> list[int]:
        return [k for k, o in enumerate(self.owners) if o is None]


class _AllToAll(torch.autograd.Function):
    """``all_to_all_single`` with uneven splits whose backward sends the gradients back."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, out_splits: list[int], in_splits: list[int],  # type: ignore[override]
                group: dist.ProcessGroup | None) -> torch.Tensor:
        ctx.splits, ctx.group = (in_splits, out_splits), group
        out = x.new_empty(sum(out_splits))
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        in_splits, out_splits = ctx.splits
        back = grad.new_empty(sum(in_splits))
        dist.all_to_all_single(back, grad.contiguous(), in_splits, out_splits, group=ctx.group)
        return back, None, None, None


class HybridEmbeddings(nn.Module):
    """The sparse arch of one rank: its own sharded tables and all replicated tables."""

    def __init__(self, full: EmbeddingBags, bag_sizes: Sequence[int], plan: ShardingPlan, rank: int,
                 group: dist.ProcessGroup | None = None) -> None:
        super().__init__()
        if plan.world != dist.get_world_size(group):
            raise ValueError(f"sharding plan for {plan.world} ranks on a group of {dist.get_world_size(group)}")
        self.plan, self.rank, self.group = plan, rank, group
        self.bag_sizes = tuple(bag_sizes)
        self.dim = full.dim
        self.num_tables = len(full.bags)
        # the tables this rank holds, keyed by feature index (the others are dropped: their memory is the point)
        self.sharded = nn.ModuleDict({str(k): full.bags[k] for k in plan.owned(rank)})
        self.replicated = nn.ModuleDict({str(k): full.bags[k] for k in plan.replicated})
        # ids per sample that each rank owns: the width of its block in the id all-to-all
        self.width = [sum(self.bag_sizes[k] for k in plan.owned(r)) for r in range(plan.world)]

    def forward(self, sparse: Sequence[torch.Tensor]) -> torch.Tensor:
        if len(sparse) != self.num_tables:
            raise ValueError(f"expected {self.num_tables} sparse features, got {len(sparse)}")
        world, me, d = self.plan.world, self.rank, self.dim
        b_local = sparse[0].shape[0]
        device = sparse[0].device
        sizes_t = torch.tensor([b_local], dtype=torch.int64, device=device)
        gathered = [torch.zeros_like(sizes_t) for _ in range(world)]
        dist.all_gather(gathered, sizes_t, group=self.group)
        sizes = [int(s) for s in gathered]

        # 1. ids of each owner's tables, this rank's samples, table by table
        send = torch.cat([sparse[k].reshape(-1).to(torch.int64) for r in range(world) for k in self.plan.owned(r)]
                         or [torch.zeros(0, dtype=torch.int64, device=device)])
        ids = send.new_empty(sum(sizes) * self.width[me])
        dist.all_to_all_single(ids, send, [sizes[r] * self.width[me] for r in range(world)],
                               [b_local * self.width[r] for r in range(world)], group=self.group)

        # 2. pool my tables over the samples of all ranks (source by source, table by table)
        mine = self.plan.owned(me)
        pooled_by_table: dict[int, list[torch.Tensor]] = {k: [] for k in mine}
        at = 0
        for r in range(world):
            for k in mine:
                n = sizes[r] * self.bag_sizes[k]
                pooled_by_table[k].append(ids[at:at + n].reshape(sizes[r], self.bag_sizes[k]))
                at += n
        pooled = {k: self.sharded[str(k)](torch.cat(pooled_by_table[k])) for k in mine}  # (B_global, D)

        # 3. pooled rows back to the ranks whose samples they are: for rank r, (b_r, my tables, D)
        starts = [sum(sizes[:r]) for r in range(world)]
        if mine:
            stacked = torch.stack([pooled[k] for k in mine], dim=1)  # (B_global, T_me, D)
            out = torch.cat([stacked[starts[r]:starts[r] + sizes[r]].reshape(-1) for r in range(world)])
        else:
            # a rank that owns no table still joins the backward all-to-all: its (empty) send
            # buffer must require grad, or autograd would skip the collective there and the others hang
            out = torch.zeros(0, device=device, dtype=self._dtype(), requires_grad=torch.is_grad_enabled())
        owned = [len(self.plan.owned(r)) for r in range(world)]
        back = _AllToAll.apply(out, [b_local * owned[r] * d for r in range(world)],
                               [sizes[r] * len(mine) * d for r in range(world)], self.group)

        # 4. assemble (B_local, F, D) in feature order
        columns: dict[int, torch.Tensor] = {}
        at = 0
        for r in range(world):
            block = back[at:at + b_local * owned[r] * d].reshape(b_local, owned[r], d)
            for j, k in enumerate(self.plan.owned(r)):
                columns[k] = block[:, j]
            at += b_local * owned[r] * d
        for k in self.plan.replicated:
            columns[k] = self.replicated[str(k)](sparse[k])
        return torch.stack([columns[k] for k in range(self.num_tables)], dim=1)

    def _dtype(self) -> torch.dtype:
        for p in self.parameters():
            return p.dtype
        return torch.get_default_dtype()


def parallelize(model: DLRMDCNv2, plan: ShardingPlan, rank: int,
                group: dist.ProcessGroup | None = None) -> DLRMDCNv2:
    """Replace the model's embedding bags by this rank's hybrid sparse arch (in place; returns it)."""
    if not isinstance(model.sparse_arch, EmbeddingBags):
        raise ValueError("parallelize: the model's sparse arch is already parallel")
    model.sparse_arch = HybridEmbeddings(model.sparse_arch, model.cfg.bag_sizes, plan, rank, group)
    return model


def model_parallel_parameters(model: nn.Module) -> list[nn.Parameter]:
    """Parameters that live on one rank only (sharded tables): never all-reduced."""
    arch = getattr(model, "sparse_arch", None)
    return list(arch.sharded.parameters()) if isinstance(arch, HybridEmbeddings) else []


def data_parallel_parameters(model: nn.Module) -> list[nn.Parameter]:
    """Parameters every rank holds (MLPs, cross network, replicated tables): all-reduce their gradients."""
    sharded = {id(p) for p in model_parallel_parameters(model)}
    return [p for p in model.parameters() if id(p) not in sharded]


def use_sparse_grads(model: DLRMDCNv2, plan: ShardingPlan, rank: int) -> list[nn.Parameter]:
    """Give the tables ``rank`` owns in ``plan`` sparse gradients (in place); returns their weights.

    Works on the parallel model (its sharded tables) and on the plain one (one rank: the plan's owned
    tables, the large ones). Replicated tables keep dense gradients: they are all-reduced in the flat
    buffer with the MLPs."""
    arch = model.sparse_arch
    if isinstance(arch, HybridEmbeddings):
        bags = [arch.sharded[str(k)] for k in plan.owned(rank)]
    elif isinstance(arch, EmbeddingBags):
        bags = [arch.bags[k] for k in plan.owned(rank)]
    else:
        raise ValueError(f"use_sparse_grads: unknown sparse arch {type(arch).__name__}")
    for bag in bags:
        bag.sparse = True
    return [bag.weight for bag in bags]


def sparse_parameters(model: nn.Module) -> list[nn.Parameter]:
    """Weights of the model's embedding bags that produce sparse gradients."""
    return [m.weight for m in model.modules() if isinstance(m, nn.EmbeddingBag) and m.sparse]
