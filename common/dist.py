"""Distributed bootstrap: MPI identity, nodes, instances, and one torch process group per instance.

Works single-process (MPI singleton init) and under ``mpiexec``/``mpirun``/``srun``:

* rank/size from ``MPI.COMM_WORLD``; node = shared-memory split (``COMM_TYPE_SHARED``), or, for
  tests and emulation on one box, contiguous groups of ``ranks_per_node`` ranks;
* the world is split into K instances of equal size (contiguous rank blocks, so an instance holds
  whole nodes when ranks are placed by node); each instance gets an MPI sub-communicator and its own
  torch.distributed default process group (gloo on CPU, NCCL on CUDA);
* the device (``--device auto|cpu|cuda``; auto = CUDA when torch sees a GPU) is agreed by every rank
  before any work: on CUDA each rank gets its own GPU by node-local rank (the MPI shared-memory split,
  ordered by world rank: ``OMPI_COMM_WORLD_LOCAL_RANK``/``SLURM_LOCALID`` under block placement),
  among the ranks that see the same GPUs (compared by UUID, so ``CUDA_VISIBLE_DEVICES`` or a cgroup per
  task that shows each rank its own GPU is respected), and a layout that puts more ranks of one
  instance on a node than there are GPUs is refused with both numbers and the way out (NCCL would die
  later with "Duplicate GPU detected"); ranks of different instances may share a GPU (a note says so);
* the rendezvous address is exchanged over MPI: instance rank 0 opens a TCPStore on a free port and
  broadcasts it, so nobody sets MASTER_ADDR by hand (``HPCBENCH_MASTER_ADDR`` overrides the address);
* torch intra-op threads are set to the node's CPUs divided by the ranks on the node.
"""
from __future__ import annotations

import datetime
import os
import socket
import sys
import threading
import time
import contextlib
from contextlib import contextmanager
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .errors import DistributedError

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from mpi4py import MPI

#: environment variables that mean "a launcher started us"
LAUNCHER_VARS = ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "SLURM_PROCID", "MPI_LOCALRANKID")
#: what ``--device`` accepts: auto = CUDA when torch sees a GPU, else the CPU
DEVICES = ("auto", "cpu", "cuda")


def mpi() -> Any:
    """The ``mpi4py.MPI`` module, imported on first use (importing it initialises MPI)."""
    from mpi4py import MPI

    return MPI


def idle_barrier(comm: Any, max_pause_s: float = 0.01) -> None:
    """``comm``'s barrier, sleeping between polls (backing off to ``max_pause_s``). MPICH's blocking
    ``MPI_Barrier`` busy-polls: a rank that waits long there (a finished instance's ranks until the last
    instance ends, the training ranks until the slowest is set up) keeps a core fully busy, taken
    from the ranks and loader threads still working on that node (measured: a 4-rank barrier held 3 s by
    one rank cost the 3 waiting ranks 5.98 s of CPU, 0.09 s with this; ``benchmarks/idle_wait.py``). For long, rare
    waits only: the ranks advance the barrier only when they poll, so it is released tens of ms late, and a
    barrier that nobody waits at costs milliseconds (37 ms vs 38 us on 4 ranks of 2 cores)."""
    req = comm.Ibarrier()
    pause = 0.0
    while not req.Test():
        time.sleep(pause)
        pause = min(max_pause_s, pause * 2 or 1e-5)


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
    host_local_rank: int = 0  # this rank's place among them (picks its GPU), even when nodes are emulated

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
    torch_timeout_s: float = 600.0  # of the torch group's collectives (a later init_group over a part uses it)
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


def _host_comm(comm: Any) -> Any:
    """The ranks on this physical host (shared memory), ordered by world rank."""
    return comm.Split_type(mpi().COMM_TYPE_SHARED, key=comm.Get_rank())


def _host_local(comm: Any) -> tuple[int, int]:
    """(rank, size) among the ranks on this physical host."""
    shared = _host_comm(comm)
    rank, size = shared.Get_rank(), shared.Get_size()
    shared.Free()
    return rank, size


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
    host_rank, host_size = _host_local(comm)
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
        host_local_size=host_size,
        host_local_rank=host_rank,
    )
    return layout, node_comm, instance_comm


def default_threads(local_size: int) -> int:
    """CPUs this process may use divided by the ranks sharing the node (at least 1)."""
    from .system import usable_cores

    return max(1, usable_cores() // max(1, local_size))


def _rendezvous_host(env: DistEnv, comm: Any) -> str:
    override = os.environ.get("HPCBENCH_MASTER_ADDR")
    if override:
        return override
    hosts = set(comm.allgather(env.layout.hostname))
    if len(hosts) == 1:
        return "127.0.0.1"
    try:
        return socket.gethostbyname(env.layout.hostname)
    except OSError:
        return env.layout.hostname


def resolve_device(choice: str, cuda_available: bool, why_not: str = "") -> str:
    """``--device`` as ``"cpu"`` or ``"cuda"``: auto takes CUDA when torch sees a GPU; cuda without one
    is an error that says what torch sees (``why_not``) and the way out."""
    if choice not in DEVICES:
        raise DistributedError(f"--device must be one of {', '.join(DEVICES)}, got {choice!r}")
    if choice == "auto":
        return "cuda" if cuda_available else "cpu"
    if choice == "cuda" and not cuda_available:
        raise DistributedError("--device cuda: torch sees no CUDA device here"
                               + (f" ({why_not})" if why_not else "")
                               + "; train on the CPU with --device cpu (or --device auto)")
    return choice


def _why_no_cuda() -> str:
    """What torch says about CUDA on this rank, for the --device cuda error."""
    import torch

    built = f"built with CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return f"torch {torch.__version__}, {built}" + (f", CUDA_VISIBLE_DEVICES={visible!r}" if visible is not None else "")


def gpu_layout_error(ranks: int, gpus: int, host: str = "this node", instance: int | None = None) -> str:
    """The refusal for more ranks of one instance on a node than GPUs visible to them."""
    who = f"instance {instance} has {ranks} ranks" if instance is not None else f"{ranks} ranks run"
    return (f"{host}: {who} on this node but only {gpus} GPU{'s' if gpus != 1 else ''} "
            f"(torch.cuda.device_count() = {gpus}) {'are' if gpus != 1 else 'is'} visible to them; NCCL needs "
            f"one GPU per rank of an instance. Start at most {gpus} rank{'s' if gpus != 1 else ''} per node "
            f"for each instance (fewer ranks: mpiexec -n / srun --ntasks-per-node, `hpcbench run "
            f"--ranks-per-instance`, or more --instances), or train on the CPU with --device cpu")


def assign_gpus(instances: Sequence[int], gpus: int, host: str = "this node") -> list[int]:
    """GPU index of each rank on one node that sees the same ``gpus`` devices, in node-local rank
    order (``instances[i]`` = instance of the node's i-th rank). Ranks of one instance always get
    distinct GPUs (else refused: :func:`gpu_layout_error`); each rank takes the least loaded GPU its
    instance does not use yet, so one instance maps rank i to GPU i, and several instances spread over
    the GPUs (ranks of *different* instances may share one: separate NCCL groups, slower, still right)."""
    if not instances:
        return []
    if gpus < 1:
        raise DistributedError(gpu_layout_error(len(instances), 0, host))
    instance, most = max(Counter(instances).items(), key=lambda kv: (kv[1], -kv[0]))
    if most > gpus:
        raise DistributedError(gpu_layout_error(most, gpus, host, instance if len(set(instances)) > 1 else None))
    load = [0] * gpus
    taken: dict[int, set[int]] = {}
    out = []
    for k in instances:
        used = taken.setdefault(k, set())
        gpu = min((g for g in range(gpus) if g not in used), key=lambda g: (load[g], g))
        used.add(gpu)
        load[gpu] += 1
        out.append(gpu)
    return out


def shared_gpus_note(instances: Sequence[int], gpus: Sequence[int | str], host: str = "this node") -> str | None:
    """A one-line note when ranks of different instances share a GPU (``gpus[i]``: the GPU of rank i,
    an index or a physical id); their throughput is then shared."""
    by_gpu: dict[int | str, list[int]] = {}
    for k, g in zip(instances, gpus):
        by_gpu.setdefault(g, []).append(k)
    shared = {g: ks for g, ks in by_gpu.items() if len(ks) > 1}
    if not shared:
        return None
    parts = "; ".join(f"{g if isinstance(g, str) else f'GPU {g}'}: instances {', '.join(map(str, ks))}"
                      for g, ks in shared.items())
    return (f"{host}: {len(instances)} ranks on {len(by_gpu)} GPU(s), instances share GPUs ({parts}); "
            "each instance's throughput is measured on a shared GPU")


def plan_host_gpus(ranks: Sequence[tuple[int, tuple[str, ...]]], host: str = "this node") -> list[int]:
    """The device index of each CUDA rank on one host: ``ranks[i]`` = (instance, ids of the GPUs the
    host's i-th rank sees, in its own device order). Ranks that see the same GPUs share them out with
    :func:`assign_gpus`; ranks that see others (``CUDA_VISIBLE_DEVICES`` per task, or a cgroup per task
    that shows each its own GPU as device 0) do not compete. Two ranks of one instance that would still
    end on one physical GPU are refused. Pure: every rank of the host computes the same plan."""
    index = [0] * len(ranks)
    groups: dict[tuple[str, ...], list[int]] = {}
    for i, (_, ids) in enumerate(ranks):
        groups.setdefault(ids, []).append(i)
    for ids, members in groups.items():
        for i, gpu in zip(members, assign_gpus([ranks[i][0] for i in members], len(ids), host)):
            index[i] = gpu
    owner: dict[tuple[int, str], int] = {}
    for i, (instance, ids) in enumerate(ranks):
        other = owner.setdefault((instance, ids[index[i]]), i)
        if other != i:
            raise DistributedError(f"{host}: ranks {other} and {i} on this node (instance {instance}) would both use "
                                   f"GPU {ids[index[i]]}, as their CUDA_VISIBLE_DEVICES overlap; NCCL needs one GPU "
                                   "per rank of an instance: give each rank its own GPUs, or train on the CPU with "
                                   "--device cpu")
    return index


def _visible_gpu_ids(count: int) -> tuple[str, ...]:
    """Ids of the GPUs this rank sees, in its device order: the UUIDs, else CUDA_VISIBLE_DEVICES' entries."""
    import torch

    try:
        return tuple(str(torch.cuda.get_device_properties(i).uuid) for i in range(count))
    except Exception:  # noqa: BLE001 - an older torch without uuid: the visible list names them
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        return tuple(f"{visible or 'all'}#{i}" for i in range(count))


def choose_device(env: DistEnv, choice: str = "auto") -> "torch.device":
    """This rank's torch device for ``--device`` (see the module docstring), agreed by every rank of the
    job before any work: an error on any rank (no CUDA for ``cuda``, too many ranks for the GPUs, an
    instance whose ranks disagree on CPU/CUDA) is raised on every rank with the same message, so nobody
    goes on to NCCL init, staging or data generation. Does not call ``torch.cuda.set_device``."""
    import torch

    layout = env.layout
    err: str | None = None
    try:
        kind = resolve_device(choice, torch.cuda.is_available(), "" if choice != "cuda" else _why_no_cuda())
    except DistributedError as exc:
        err, kind = str(exc), "cpu"
    ids = _visible_gpu_ids(torch.cuda.device_count()) if kind == "cuda" else ()
    host = _host_comm(env.comm)
    rows = host.allgather((kind, layout.instance, ids))
    me = host.Get_rank()
    host.Free()
    index: int | None = None
    if kind == "cuda" and err is None:
        cuda = [i for i, r in enumerate(rows) if r[0] == "cuda"]
        ranks = [(rows[i][1], rows[i][2]) for i in cuda]
        try:
            plan = plan_host_gpus(ranks, layout.hostname)
            index = plan[cuda.index(me)]
            note = shared_gpus_note([k for k, _ in ranks], [g[j] for (_, g), j in zip(ranks, plan)], layout.hostname)
            if note and cuda[0] == me:
                print(f"hpcbench: note: {note}", file=sys.stderr, flush=True)
        except DistributedError as exc:
            err = str(exc)
    everyone = env.comm.allgather((err, kind, layout.instance))
    errors = [e for e, _, _ in everyone if e]
    if errors:
        raise DistributedError(errors[0])
    kinds: dict[int, set[str]] = {}
    for _, k, inst in everyone:
        kinds.setdefault(inst, set()).add(k)
    mixed = sorted(inst for inst, ks in kinds.items() if len(ks) > 1)
    if mixed:
        raise DistributedError(f"--device {choice}: some ranks of instance {mixed[0]} see a GPU and some do not; "
                               "one instance needs one device type (give --device cpu, or put the instance on "
                               "GPU nodes only)")
    return torch.device("cuda", index) if index is not None else torch.device("cpu")


def check_local_job(choice: str, instances: int, ranks_per_instance: int) -> str:
    """The device of a job whose ``instances`` x ``ranks_per_instance`` ranks all run on this host
    (``hpcbench run``), checked in the launching process before it generates data or starts ranks:
    the same rules and messages as :func:`choose_device` inside the job. Returns ``"cpu"`` or ``"cuda"``."""
    import torch

    kind = resolve_device(choice, torch.cuda.is_available(), _why_no_cuda() if choice == "cuda" else "")
    if kind == "cuda":
        assign_gpus([k for k in range(instances) for _ in range(ranks_per_instance)], torch.cuda.device_count(),
                    socket.gethostname())
    return kind


def device_description(device: "torch.device") -> dict[str, Any]:
    """Index, name and PCI bus id of a rank's device (what ``hpcbench info`` shows per rank)."""
    if device.type != "cuda":
        return {"device": "cpu", "gpu_name": None, "pci_bus_id": None, "cuda_visible_devices": None}
    import torch

    name, bus = None, None
    try:  # a report: a device that cannot be queried is described, not fatal (the other ranks wait for it)
        props = torch.cuda.get_device_properties(device)
        name = props.name
        if all(hasattr(props, a) for a in ("pci_domain_id", "pci_bus_id", "pci_device_id")):
            bus = f"{props.pci_domain_id:04x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
    except Exception as exc:  # noqa: BLE001
        name = f"unknown ({type(exc).__name__}: {exc})"
    return {"device": str(device), "gpu_name": name, "pci_bus_id": bus,
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}


def init_torch(env: DistEnv, backend: str = "auto", timeout_s: float = 600.0, device: str = "auto") -> None:
    """Choose this rank's device (:func:`choose_device`), then create this instance's torch.distributed
    default group: NCCL on CUDA (bound to this rank's GPU, set before the group exists), gloo on the CPU."""
    import torch

    layout = env.layout
    dev = choose_device(env, device)
    if backend == "auto":
        backend = "nccl" if dev.type == "cuda" else "gloo"
    if backend == "nccl" and dev.type != "cuda":
        raise DistributedError(f"backend 'nccl' needs a CUDA device, and this rank runs on {dev} "
                               "(--device cpu, or torch sees no GPU); use gloo")
    if dev.type == "cuda":
        torch.cuda.set_device(dev)  # before NCCL: each rank's communicator on its own GPU
    env.device = dev
    threads = int(os.environ.get("HPCBENCH_TORCH_THREADS", default_threads(layout.host_local_size)))
    torch.set_num_threads(threads)
    env.torch_threads = threads

    env.torch_timeout_s = timeout_s
    _COLLECTIVE_TIMEOUT_S[0] = timeout_s
    init_group(env, env.instance_comm, backend)


def init_group(env: DistEnv, comm: Any, backend: str) -> None:
    """torch.distributed's default group over the ranks of ``comm`` (the instance, or a part of it:
    :mod:`hpcbench.common.async_eval`), this rank's device already chosen: comm's rank 0 opens a TCPStore on a
    free port and sends the address over MPI. No default group may exist yet (destroy it first)."""
    import torch.distributed as tdist

    rank, size = comm.Get_rank(), comm.Get_size()
    host = _rendezvous_host(env, comm)
    timeout = datetime.timedelta(seconds=env.torch_timeout_s)
    if rank == 0:
        store = tdist.TCPStore(host, 0, size, is_master=True, timeout=timeout, wait_for_workers=False)
        port = store.port
    else:
        store, port = None, None
    port = comm.bcast(port, root=0)
    if store is None:
        store = tdist.TCPStore(host, port, size, is_master=False, timeout=timeout)
    extra: dict[str, Any] = {"device_id": env.device} if backend == "nccl" else {}
    tdist.init_process_group(backend, store=store, rank=rank, world_size=size, timeout=timeout, **extra)
    env.torch_backend = backend


def init_distributed(
    instances: int = 1,
    ranks_per_node: int | None = None,
    torch_backend: str | None = "auto",
    timeout_s: float = 600.0,
    device: str = "auto",
) -> DistEnv:
    """MPI layout + instance split, and (unless ``torch_backend`` is None) the device and the torch
    group. ``device``: auto | cpu | cuda (``--device``)."""
    MPI = mpi()
    comm = MPI.COMM_WORLD
    layout, node_comm, instance_comm = build_layout(comm, instances, ranks_per_node)
    env = DistEnv(layout=layout, comm=comm, node_comm=node_comm, instance_comm=instance_comm)
    if torch_backend is not None:
        init_torch(env, torch_backend, timeout_s, device)
    return env


def launched_by_mpi() -> bool:
    """True when a launcher (mpiexec, mpirun, srun) started this process."""
    return any(v in os.environ for v in LAUNCHER_VARS)


#: the bound of the training loop's MPI collectives: the torch group's timeout (``hpcbench train --timeout``)
_COLLECTIVE_TIMEOUT_S = [600.0]


class Watch:
    """The state a :func:`watchdog` shares with its thread: whichever of "the call returned" and "the watchdog
    commits to ending the job" comes first wins, under one lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.returned = False
        self.committed = False

    def commit(self) -> bool:
        """The watchdog's claim; False when the call returned first (it was late, not stuck: stand down)."""
        with self.lock:
            self.committed = not self.returned
            return self.committed

    def leave(self) -> bool:
        """The call returned; False when the watchdog had already committed to ending the job."""
        with self.lock:
            self.returned = True
            return not self.committed


@contextmanager
def watchdog(timeout_s: float, fire: "Callable[[Watch], None]") -> Iterator[None]:
    """Run the block with ``fire(watch)`` called in a thread after ``timeout_s`` seconds unless the block returned
    first. ``fire`` calls ``watch.commit()`` before it prints or ends anything and stands down when that is False;
    once it has committed, the returning block waits for it to end the job instead of going on, so a job prints one
    error. mpi4py releases the GIL inside blocking calls, so the thread runs while one waits."""
    watch = Watch()
    timer = threading.Timer(timeout_s, fire, (watch,))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        if not watch.leave():
            while True:  # the watchdog ends the job
                time.sleep(60)


def bounded(what: str, timeout_s: float | None = None) -> "contextlib.AbstractContextManager[None]":
    """Bound a blocking MPI call of the training loop (the per-epoch sample count, the evaluation's keys, the
    non-finite check, the barrier before run_start): MPI has no timeout of its own, so a stopped or hung peer held
    the job until the allocation ended. After ``timeout_s`` (default: the torch group's, ``--timeout``) a watchdog
    thread says which call starved and ends the job with ``MPI_Abort`` (which ends the stopped rank too); the
    run's log then has no run_stop, so it never looks complete."""
    limit = _COLLECTIVE_TIMEOUT_S[0] if timeout_s is None else timeout_s

    def fire(watch: Watch) -> None:
        if not watch.commit():
            return
        MPI = mpi()
        sys.stderr.write(f"hpcbench: rank {MPI.COMM_WORLD.Get_rank()}: {what} waited longer than the collective "
                         f"timeout ({limit:g} s, hpcbench train --timeout) for a peer rank: one is stopped, hung or "
                         "dead; ending the job (MPI_Abort)\n")
        sys.stderr.flush()
        time.sleep(1.0)  # the launcher forwards the message before the abort's teardown
        MPI.COMM_WORLD.Abort(5)

    return watchdog(limit, fire)
