"""Distributed bootstrap: MPI identity, nodes, instances, and one torch process group per instance.

Works single-process (MPI singleton init) and under ``mpiexec``/``mpirun``/``srun``:

* rank/size from ``MPI.COMM_WORLD``; node = shared-memory split (``COMM_TYPE_SHARED``), or, for
  tests and emulation on one box, contiguous groups of ``ranks_per_node`` ranks;
* the world is split into K instances of equal size (contiguous rank blocks, so an instance holds
  whole nodes when ranks are placed by node); each instance gets an MPI sub-communicator and its own
  torch.distributed default process group (gloo on CPU, NCCL on CUDA);
* the rendezvous address is exchanged over MPI: instance rank 0 opens a TCPStore on a free port and
  broadcasts it, so nobody sets MASTER_ADDR by hand (``HPCBENCH_MASTER_ADDR`` overrides the address);
* torch intra-op threads are set to the node's CPUs divided by the ranks on the node.
"""
from __future__ import annotations

import datetime
import os
import socket
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .errors import DistributedError

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from mpi4py import MPI

#: environment variables that mean "a launcher started us"
LAUNCHER_VARS = ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "SLURM_PROCID", "MPI_LOCALRANKID")


def mpi() -> Any:
    """The ``mpi4py.MPI`` module, imported on first use (importing it initialises MPI)."""
    from mpi4py import MPI

    return MPI


@dataclass
class Layout:
    """Who this process is, in the world, on its node and in its instance. Plain data, no comms."""

    world_rank: int
    world_size: int
    node_index: int
    num_nodes: int
    local_rank: int
    local_size: int
    instance: int
    num_instances: int
    instance_rank: int
    instance_size: int
    instance_node_index: int
    nodes_per_instance: int
    hostname: str
    host_local_size: int = 1  # ranks on this physical host (for threads), even when nodes are emulated

    @property
    def is_world_leader(self) -> bool:
        return self.world_rank == 0

    @property
    def is_instance_leader(self) -> bool:
        return self.instance_rank == 0

    @property
    def is_node_leader(self) -> bool:
        return self.local_rank == 0


def split_instances(world_size: int, instances: int) -> int:
    """Ranks per instance; an error unless ``world_size`` divides evenly into ``instances``."""
    if instances < 1:
        raise DistributedError(f"--instances must be >= 1, got {instances}")
    if world_size % instances:
        raise DistributedError(
            f"cannot split {world_size} ranks into {instances} instances of equal size; "
            f"use a number of instances that divides {world_size} "
            f"(e.g. {', '.join(str(d) for d in _divisors(world_size))})"
        )
    return world_size // instances


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass
class DistEnv:
    """The distributed context handed to the harness, staging and workloads."""

    layout: Layout
    comm: Any  # MPI.Comm: the world
    node_comm: Any  # MPI.Comm: ranks on this node
    instance_comm: Any  # MPI.Comm: ranks of this instance
    device: Any = None  # torch.device once torch is set up
    torch_backend: str | None = None
    torch_threads: int | None = None
    _closed: bool = field(default=False, repr=False)

    # convenience passthroughs -------------------------------------------------------------
    def __getattr__(self, name: str) -> Any:  # layout fields as attributes: env.world_rank
        layout = self.__dict__.get("layout")
        if layout is not None and hasattr(layout, name):
            return getattr(layout, name)
        raise AttributeError(name)

    def barrier(self) -> None:
        self.comm.Barrier()

    def close(self) -> None:
        """Tear down the torch process group (MPI finalises at exit)."""
        if self._closed:
            return
        self._closed = True
        if self.torch_backend is not None:
            import torch.distributed as tdist

            if tdist.is_initialized():
                tdist.destroy_process_group()


def _node_split(comm: Any, ranks_per_node: int | None) -> tuple[Any, int, int]:
    """(node_comm, node_index, num_nodes)."""
    MPI = mpi()
    rank, size = comm.Get_rank(), comm.Get_size()
    if ranks_per_node:
        if size % ranks_per_node:
            raise DistributedError(
                f"ranks_per_node={ranks_per_node} does not divide the {size} ranks of the job"
            )
        node_index = rank // ranks_per_node
        node_comm = comm.Split(node_index, rank)
        return node_comm, node_index, size // ranks_per_node
    node_comm = comm.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
    is_leader = node_comm.Get_rank() == 0
    leaders = comm.Split(0 if is_leader else MPI.UNDEFINED, rank)
    if is_leader:
        node_index, num_nodes = leaders.Get_rank(), leaders.Get_size()
        leaders.Free()
    else:
        node_index, num_nodes = -1, -1
    node_index, num_nodes = node_comm.bcast((node_index, num_nodes), root=0)
    return node_comm, node_index, num_nodes


def _host_local_size(comm: Any) -> int:
    MPI = mpi()
    shared = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    size = shared.Get_size()
    shared.Free()
    return size


def build_layout(comm: Any, instances: int = 1, ranks_per_node: int | None = None) -> tuple[Layout, Any, Any]:
    """Compute the :class:`Layout` and create the node and instance communicators."""
    rank, size = comm.Get_rank(), comm.Get_size()
    instance_size = split_instances(size, instances)
    if ranks_per_node is None and os.environ.get("HPCBENCH_RANKS_PER_NODE"):
        ranks_per_node = int(os.environ["HPCBENCH_RANKS_PER_NODE"])
    node_comm, node_index, num_nodes = _node_split(comm, ranks_per_node)
    instance = rank // instance_size
    instance_comm = comm.Split(instance, rank)
    nodes_in_instance = sorted(set(instance_comm.allgather(node_index)))
    layout = Layout(
        world_rank=rank,
        world_size=size,
        node_index=node_index,
        num_nodes=num_nodes,
        local_rank=node_comm.Get_rank(),
        local_size=node_comm.Get_size(),
        instance=instance,
        num_instances=instances,
        instance_rank=instance_comm.Get_rank(),
        instance_size=instance_size,
        instance_node_index=nodes_in_instance.index(node_index),
        nodes_per_instance=len(nodes_in_instance),
        hostname=socket.gethostname(),
        host_local_size=_host_local_size(comm),
    )
    return layout, node_comm, instance_comm


def default_threads(local_size: int) -> int:
    """CPUs this process may use divided by the ranks sharing the node (at least 1)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        cpus = os.cpu_count() or 1
    return max(1, cpus // max(1, local_size))


def _rendezvous_host(env: DistEnv) -> str:
    override = os.environ.get("HPCBENCH_MASTER_ADDR")
    if override:
        return override
    hosts = set(env.instance_comm.allgather(env.layout.hostname))
    if len(hosts) == 1:
        return "127.0.0.1"
    try:
        return socket.gethostbyname(env.layout.hostname)
    except OSError:
        return env.layout.hostname


def init_torch(env: DistEnv, backend: str = "auto", timeout_s: float = 600.0) -> None:
    """Create this instance's torch.distributed default group and choose the device."""
    import torch
    import torch.distributed as tdist

    layout = env.layout
    threads = int(os.environ.get("HPCBENCH_TORCH_THREADS", default_threads(layout.host_local_size)))
    torch.set_num_threads(threads)
    env.torch_threads = threads

    cuda = torch.cuda.is_available()
    if backend == "auto":
        backend = "nccl" if cuda else "gloo"
    if backend == "nccl":
        if not cuda:
            raise DistributedError("backend 'nccl' needs CUDA, and torch sees no GPU here; use gloo")
        torch.cuda.set_device(layout.local_rank % torch.cuda.device_count())
        env.device = torch.device("cuda", torch.cuda.current_device())
    else:
        env.device = torch.device("cpu")

    host = _rendezvous_host(env)
    timeout = datetime.timedelta(seconds=timeout_s)
    if layout.instance_rank == 0:
        store = tdist.TCPStore(host, 0, layout.instance_size, is_master=True, timeout=timeout, wait_for_workers=False)
        port = store.port
    else:
        store, port = None, None
    port = env.instance_comm.bcast(port, root=0)
    if store is None:
        store = tdist.TCPStore(host, port, layout.instance_size, is_master=False, timeout=timeout)
    tdist.init_process_group(
        backend, store=store, rank=layout.instance_rank, world_size=layout.instance_size, timeout=timeout
    )
    env.torch_backend = backend


def init_distributed(
    instances: int = 1,
    ranks_per_node: int | None = None,
    torch_backend: str | None = "auto",
    timeout_s: float = 600.0,
) -> DistEnv:
    """MPI layout + instance split, and (unless ``torch_backend`` is None) the torch group."""
    MPI = mpi()
    comm = MPI.COMM_WORLD
    layout, node_comm, instance_comm = build_layout(comm, instances, ranks_per_node)
    env = DistEnv(layout=layout, comm=comm, node_comm=node_comm, instance_comm=instance_comm)
    if torch_backend is not None:
        init_torch(env, torch_backend, timeout_s)
    return env


def launched_by_mpi() -> bool:
    """True when a launcher (mpiexec, mpirun, srun) started this process."""
    return any(v in os.environ for v in LAUNCHER_VARS)
