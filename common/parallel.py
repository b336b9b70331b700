"""One layout object per instance: which rank does what, and every process group the run needs.

The harness builds one :class:`Parallel` per instance, once, from the instance's ranks and the degrees
the run asks for (:class:`Degrees`: dedicated evaluation ranks, ranks that share each sample for spatial
parallelism, BatchNorm groups, embedding shards, tensor parallelism; the data-parallel degree is what is
left). It makes every process group here and nowhere else, refuses impossible combinations by name,
and offers the collective services the harness and the workloads need (sums, gathers of per-sample
results of unequal length, BatchNorm averaging, the start-up broadcast), so that a workload never calls
``torch.distributed`` itself for them (the all-to-all of the DLRM tables and the halo exchange of the
spatial U-Net are model parallelism and stay beside their models, on the groups made here).

Layout of an instance of N ranks with E evaluation ranks, T tensor-parallel and S spatial ranks:
the first N - E ranks train, the last E evaluate (:mod:`hpcbench.common.async_eval`); the training
ranks form consecutive groups of T (tensor parallel), or of S (one sample's slabs); the data-parallel
rank is the group's index, and BatchNorm groups are consecutive groups of B training ranks.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.distributed as tdist
from torch import nn

from .dist import DistEnv, init_group
from .errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover
    from .flat import FlatParams


class Collectives(Protocol):
    """The collective services a workload's metric may use (over the ranks that evaluate together)."""

    size: int

    def sum(self, t: torch.Tensor) -> torch.Tensor: ...

    def gather(self, t: torch.Tensor) -> torch.Tensor: ...


@dataclass(frozen=True)
class Degrees:
    """What one run asks of its instance's ranks (each with the config key that sets it)."""

    eval_ranks: int = 0  # train.eval_ranks: the last E ranks only evaluate
    spatial: int = 1  # ranks that share each sample, one slab each (unet3d model.spatial_group)
    bn_group: int = 1  # train.bn_group_size: ranks whose BatchNorm statistics are synchronized (CUDA)
    model_parallel: bool = False  # parameters held per rank (sharded embedding tables, sparse gradients)
    tensor_parallel: int = 1  # ranks that split each layer's weights (an LLM's model.tp)
    spatial_key: str = "model.spatial_group"  # the config keys named in errors
    model_parallel_what: str = "parameters held per rank"
    tensor_parallel_key: str = "model.tensor_parallel"


@dataclass(frozen=True)
class Roles:
    """This rank's part of an instance split into training and evaluation ranks, and how to reach the other."""

    is_eval: bool
    train_size: int
    eval_size: int
    instance_comm: Any  # MPI.Comm of the whole instance (weights, results, stop)
    first_world_rank: int  # world rank of instance rank 0

    @property
    def eval_leader(self) -> int:
        """Instance rank of evaluation rank 0: the evaluation ranks follow the training ranks."""
        return self.train_size

    def world_rank(self, instance_rank: int) -> int:
        return self.first_world_rank + instance_rank

    def eval_world_ranks(self) -> str:
        lo = self.world_rank(self.eval_leader)
        return f"{lo}" if self.eval_size == 1 else f"{lo}-{lo + self.eval_size - 1}"


@dataclass(frozen=True)
class Place:
    """This rank's place in a group of consecutive ranks: the torch group (None for a group of one)."""

    group: Any
    size: int
    index: int


def check_degrees(d: Degrees, instance_size: int, node_local: bool, nodes: int, device_type: str) -> None:
    """ConfigError for a combination that cannot work, naming the keys (every rank, from the layout alone)."""
    ev = "config key 'train.eval_ranks'"
    if d.eval_ranks < 0 or d.spatial < 1 or d.bn_group < 1 or d.tensor_parallel < 1:
        raise ConfigError(f"parallel degrees must be positive: {d}")
    if d.eval_ranks >= instance_size:
        raise ConfigError(f"{ev} = {d.eval_ranks}: the instance has {instance_size} rank(s), and at least one "
                          f"must train; use at most {instance_size - 1} (or start more ranks per instance)")
    if d.eval_ranks and node_local and nodes > 1:
        raise ConfigError(f"{ev} = {d.eval_ranks} with node-local data (data.node_local) over {nodes} nodes: each "
                          "node holds only its part of the data, and the evaluation ranks need the whole "
                          "validation split; train from shared storage (--data) or on one node per instance")
    if d.eval_ranks and d.spatial > 1:
        raise ConfigError(f"{ev}: the model shares each sample over {d.spatial} ranks ('{d.spatial_key}'), which "
                          f"the evaluation ranks do not do; set train.eval_ranks = 0 or '{d.spatial_key}' = 1")
    if d.eval_ranks and d.model_parallel:
        raise ConfigError(f"{ev}: the model keeps {d.model_parallel_what} (model parallel), which the evaluation "
                          "ranks cannot receive; set it to 0")
    if d.eval_ranks and d.tensor_parallel > 1:
        raise ConfigError(f"{ev}: tensor-parallel weights ('{d.tensor_parallel_key}' = {d.tensor_parallel}) cannot "
                          "be sent to the evaluation ranks; set it to 0")
    if d.spatial > 1 and d.tensor_parallel > 1:
        raise ConfigError(f"'{d.spatial_key}' = {d.spatial} and '{d.tensor_parallel_key}' = {d.tensor_parallel}: "
                          "spatial and tensor parallelism are not combined; set one of them to 1")
    train = instance_size - d.eval_ranks
    for key, size in ((d.spatial_key, d.spatial), (d.tensor_parallel_key, d.tensor_parallel)):
        if train % size:
            raise ConfigError(f"config key '{key}': {size} must divide the instance's {train} training rank(s)")
    if d.bn_group > 1:
        if device_type != "cuda":
            raise ConfigError(f"config key 'train.bn_group_size' = {d.bn_group} needs CUDA (torch SyncBatchNorm); "
                              "use 1 on CPU")
        if train % d.bn_group:
            raise ConfigError(f"config key 'train.bn_group_size' = {d.bn_group} must divide the instance's "
                              f"{train} training rank(s)")


def reader_shard(rank: int, size: int, degrees: Degrees) -> tuple[int, int]:
    """(data-parallel rank, data-parallel ranks) of reader ``rank`` of ``size``: a spatial or tensor-parallel
    group of G ranks shares its samples, so the readers' data-parallel place is ``(rank // G, size // G)``."""
    group = max(degrees.spatial, degrees.tensor_parallel)
    if size % group:
        key = degrees.spatial_key if degrees.spatial > 1 else degrees.tensor_parallel_key
        raise ConfigError(f"config key '{key}': {group} must divide the {size} ranks that read the data")
    return rank // group, size // group


def consecutive_groups(size: int) -> Place:
    """Split torch's default group into consecutive groups of ``size`` ranks (collective: every rank of
    the default group calls it); this rank's group and its index in it."""
    world, rank = (tdist.get_world_size(), tdist.get_rank()) if tdist.is_initialized() else (1, 0)
    if size < 1 or world % size:
        raise ConfigError(f"a group of {size} ranks must divide the {world} ranks")
    if size == 1:
        return Place(None, 1, 0)
    group, _ = tdist.new_subgroups(size)
    return Place(group, size, rank % size)


class Parallel:
    """The instance's layout (built once, collective over the instance: see the module docstring).

    ``env``: this rank's part as a :class:`DistEnv` (the training ranks, or the evaluation ranks, when
    ``train.eval_ranks`` splits the instance; torch's default group is then made over the part);
    ``rank``/``size``: this rank in its part; ``dp_rank``/``dp_size``: its data-parallel place (ranks
    that share samples count once); ``spatial``, ``tensor``, ``bn``: its groups."""

    def __init__(self, env: DistEnv, degrees: Degrees, node_local: bool = False) -> None:
        lay = env.layout
        device = env.device if env.device is not None else torch.device("cpu")
        check_degrees(degrees, lay.instance_size, node_local, lay.nodes_per_instance, device.type)
        self.degrees = degrees
        self.instance_env = env  # the whole instance
        self.roles: Roles | None = None
        if degrees.eval_ranks:
            env, self.roles = _split(env, degrees.eval_ranks)
        self.env = env
        self.comm = env.instance_comm  # MPI: this rank's part
        self.rank, self.size = env.layout.instance_rank, env.layout.instance_size
        self.device = device
        self._groups()

    @classmethod
    def of_default_group(cls, degrees: Degrees = Degrees(), device: torch.device | None = None) -> "Parallel":
        """The layout over torch's default group alone (one process when there is none), without MPI: for
        tools and tests that run a workload's parts without the harness. ``comm`` is None."""
        self = cls.__new__(cls)
        self.degrees, self.roles, self.env, self.instance_env, self.comm = degrees, None, None, None, None
        self.rank, self.size = (tdist.get_rank(), tdist.get_world_size()) if tdist.is_initialized() else (0, 1)
        self.device = device if device is not None else torch.device("cpu")
        self._groups()
        return self

    def _groups(self) -> None:
        """The data-parallel place and the groups of this rank (collective over the part's torch group)."""
        degrees = self.degrees
        self.spatial = self.tensor = self.bn = Place(None, 1, 0)
        if self.is_eval:
            self.dp_rank, self.dp_size = self.rank, self.size
            return
        group = max(degrees.spatial, degrees.tensor_parallel)
        self.dp_rank, self.dp_size = self.rank // group, self.size // group
        if degrees.spatial > 1:
            self.spatial = consecutive_groups(degrees.spatial)
        if degrees.tensor_parallel > 1:
            self.tensor = consecutive_groups(degrees.tensor_parallel)
        if degrees.bn_group > 1:
            self.bn = consecutive_groups(degrees.bn_group)

    def device_mesh(self) -> Any:  # noqa: ANN401 - torch.distributed.device_mesh.DeviceMesh
        """The part's ranks as a 2-D ``DeviceMesh`` named ``("dp", "tp")`` (data-parallel groups x consecutive
        tensor-parallel groups of ``degrees.tensor_parallel``), for FSDP2 and tensor parallelism; made once
        (collective over the part's torch group). None without a torch group (one process)."""
        if getattr(self, "_mesh", None) is None and tdist.is_initialized():
            from torch.distributed.device_mesh import init_device_mesh

            tp = 1 if self.is_eval else self.degrees.tensor_parallel
            self._mesh = init_device_mesh(self.device.type, (self.size // tp, tp), mesh_dim_names=("dp", "tp"))
        return getattr(self, "_mesh", None)

    @property
    def train_dp_size(self) -> int:
        """Data-parallel ranks among the instance's training ranks (the global batch splits over them)."""
        train = self.roles.train_size if self.roles is not None else self.size
        return train // max(self.degrees.spatial, self.degrees.tensor_parallel)

    @property
    def is_eval(self) -> bool:
        return self.roles is not None and self.roles.is_eval

    def reader_shard(self, rank: int, size: int) -> tuple[int, int]:
        """(data-parallel rank, data-parallel ranks) of reader ``rank`` of ``size`` (the part's ranks, or one
        node's with node-local data): ranks that share samples read the same ones."""
        return reader_shard(rank, size, Degrees() if self.is_eval else self.degrees)

    # collective services over this rank's part ---------------------------------------------------
    def sum(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` summed over the part's ranks (in place)."""
        if self.size > 1:
            tdist.all_reduce(t)
        return t

    def gather(self, t: torch.Tensor) -> torch.Tensor:
        """Every rank's 1-D ``t`` (lengths may differ), concatenated in rank order, on every rank."""
        if self.size == 1:
            return t.reshape(-1)
        x = t.reshape(-1)
        n = torch.tensor([x.numel()], dtype=torch.int64, device=x.device)
        sizes = [torch.zeros_like(n) for _ in range(self.size)]
        tdist.all_gather(sizes, n)
        longest = int(max(int(s) for s in sizes))
        padded = torch.zeros(longest, dtype=x.dtype, device=x.device)
        padded[: x.numel()] = x
        parts = [torch.empty_like(padded) for _ in range(self.size)]
        tdist.all_gather(parts, padded)
        return torch.cat([p[: int(s)] for p, s in zip(parts, sizes)])

    def average_buffers(self, model: nn.Module) -> None:
        """BatchNorm running statistics averaged over the part: one all-reduce (before an evaluation)."""
        if self.size <= 1:
            return
        bufs = [b for m in model.modules() if isinstance(m, nn.modules.batchnorm._NormBase)
                for b in (m.running_mean, m.running_var) if b is not None]
        if not bufs:
            return
        packed = torch.cat([b.reshape(-1).float() for b in bufs])
        tdist.all_reduce(packed)
        packed.div_(self.size)
        offset = 0
        for b in bufs:
            b.copy_(packed[offset : offset + b.numel()].view_as(b))
            offset += b.numel()

    def broadcast_model(self, model: nn.Module, flat: "FlatParams") -> None:
        """Rank 0's parameters and buffers to the part (the model-parallel part stays each rank's own)."""
        if self.size <= 1:
            return
        tdist.broadcast(flat.params[: flat.shared_size] if flat.has_local else flat.params, 0)
        for b in model.buffers():
            tdist.broadcast(b, 0)

    def sync_batchnorm(self, model: nn.Module) -> nn.Module:
        """BatchNorm layers synchronized over this rank's BatchNorm group (``train.bn_group_size``)."""
        if self.bn.size == 1:
            return model
        return nn.SyncBatchNorm.convert_sync_batchnorm(model, process_group=self.bn.group)


def _split(env: DistEnv, eval_ranks: int) -> tuple[DistEnv, Roles]:
    """Split the instance: its last ``eval_ranks`` ranks evaluate. This rank's part as a :class:`DistEnv`
    (instance rank/size and ``instance_comm`` the part's; torch's default group made again over the part)
    and its :class:`Roles`. Collective over the instance."""
    lay = env.layout
    train_size = lay.instance_size - eval_ranks
    is_eval = lay.instance_rank >= train_size
    part_comm = env.instance_comm.Split(int(is_eval), lay.instance_rank)
    layout = dataclasses.replace(lay, instance_rank=part_comm.Get_rank(), instance_size=part_comm.Get_size())
    part = dataclasses.replace(env, layout=layout, instance_comm=part_comm)
    if env.torch_backend is not None:
        if tdist.is_initialized():
            tdist.destroy_process_group()
        init_group(part, part_comm, env.torch_backend)
    return part, Roles(is_eval, train_size, eval_ranks, env.instance_comm, lay.world_rank - lay.instance_rank)
