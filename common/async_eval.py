"""Dedicated evaluation ranks (``train.eval_ranks = E``): evaluation runs beside training, not inside it.

NVIDIA's 3D U-Net submissions hide evaluation behind training this way: the last E of the instance's N
ranks only evaluate. At each evaluation point of the cadence the N - E training ranks average their
BatchNorm statistics (as an inline evaluation does), training rank 0 copies the weights to the host and
sends them to the first evaluation rank without waiting, and training goes on. The evaluation ranks
receive them, evaluate the whole validation set with the harness's own evaluation code (split over the E
ranks, reduced among them) and send ``(epoch_num, metric)`` back. Training stops when a result meets the
target.

Communicators. The instance's MPI communicator is split in two parts; torch's default group is made
again over the part a rank belongs to (``hpcbench.common.dist.init_group``), so the gradient sync, DistributedLAMB
and BatchNorm sync of the training ranks are unchanged, and the evaluation ranks sum their statistics in
their own group. The instance communicator carries weights, results and the stop message between parts.

Protocol (instance communicator, point to point, so nothing blocks the training ranks):

* training rank 0 -> evaluation rank 0: a job header ``(seq, epoch, epoch_num)`` (``JOB_TAG``) then the
  weights (``DATA_TAG``, ``MPI_Isend`` from a host buffer that is kept until the send completes); the
  evaluation leader passes both on to its part (a torch broadcast, on the device);
* evaluation rank 0 -> training rank 0: ``("result", seq, epoch_num, value)`` or ``("error", rank, text)``
  (``RESULT_TAG``); results come back in the order the jobs were sent;
* training rank 0 polls for results once per step (``MPI_Iprobe``) and shares what arrived with the
  other training ranks in one small broadcast on the host (no device sync); a result that meets the
  target stops the run at the next step, and ``run_stop`` carries the time the result arrived;
* at the end (target met, or max epochs after waiting for the results still owed, at most
  ``train.eval_timeout_s``), training rank 0 sends ``("stop", jobs sent, status)`` (``STOP_TAG``); the
  evaluation leader skips jobs it has not started, receives them (so every send completes) and ends.

Waiting ranks sleep between polls instead of spinning in an MPI call: on a shared node a spinning
rank takes a core from training.
"""
from __future__ import annotations

import dataclasses
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as tdist

from .dist import DistEnv, init_group, mpi
from .errors import ConfigError, HpcbenchError
from .batchnorm import sync_batchnorm_stats
from .result import RunResult
from .timing import now_ms

if TYPE_CHECKING:  # pragma: no cover
    from .trainer import Trainer

JOB_TAG, DATA_TAG, RESULT_TAG, STOP_TAG = 7311, 7312, 7313, 7314
POLL_S = 0.002  # sleep between polls of a waiting rank


class EvalRanksError(HpcbenchError):
    """An evaluation rank failed, or owed a result past ``train.eval_timeout_s``."""


@dataclass(frozen=True)
class Roles:
    """This rank's part of the instance and how to reach the other part."""

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


def check_eval_ranks(eval_ranks: int, instance_size: int, node_local: bool, nodes: int) -> None:
    """ConfigError for a split that cannot work (checked on every rank from the layout alone)."""
    key = "config key 'train.eval_ranks'"
    if eval_ranks >= instance_size:
        raise ConfigError(f"{key} = {eval_ranks}: the instance has {instance_size} rank(s), and at least one "
                          f"must train; use at most {instance_size - 1} (or start more ranks per instance)")
    if node_local and nodes > 1:
        raise ConfigError(f"{key} = {eval_ranks} with node-local data (data.node_local) over {nodes} nodes: each "
                          "node holds only its part of the data, and the evaluation ranks need the whole "
                          "validation split; train from shared storage (--data) or on one node per instance")


def split_ranks(env: DistEnv, eval_ranks: int) -> tuple[DistEnv, Roles]:
    """Split the instance: its last ``eval_ranks`` ranks evaluate. Returns this rank's part as a
    :class:`DistEnv` (instance rank/size and ``instance_comm`` = the part's; torch's default group made
    again over the part) and its :class:`Roles`. Collective over the instance."""
    lay = env.layout
    train_size = lay.instance_size - eval_ranks
    is_eval = lay.instance_rank >= train_size
    part_comm = env.instance_comm.Split(int(is_eval), lay.instance_rank)
    layout = dataclasses.replace(lay, instance_rank=part_comm.Get_rank(), instance_size=part_comm.Get_size())
    part = dataclasses.replace(env, layout=layout, instance_comm=part_comm)
    backend = env.torch_backend
    if backend is not None:
        if tdist.is_initialized():
            tdist.destroy_process_group()
        init_group(part, part_comm, backend)
    roles = Roles(is_eval, train_size, eval_ranks, env.instance_comm, lay.world_rank - lay.instance_rank)
    return part, roles


def _weights(tr: "Trainer") -> list[torch.Tensor]:
    """The model's floating-point buffers (BatchNorm running statistics) that travel with the weights."""
    return [b for b in tr.model.buffers() if b.is_floating_point()]


def snapshot_size(tr: "Trainer") -> int:
    return tr.flat.numel + sum(b.numel() for b in _weights(tr))


class TrainSide:
    """What the training ranks do: send weights at evaluation points, poll results, stop the evaluators."""

    def __init__(self, tr: "Trainer", roles: Roles) -> None:
        self.roles = roles
        self.comm = roles.instance_comm
        self.leader = tr.rank == 0
        self.pending: deque[tuple[int, int | float]] = deque()  # (seq, epoch_num) sent, no result yet
        self.sent = 0
        self.sends: list[tuple[Any, torch.Tensor]] = []  # (MPI request, its host buffer) in flight
        self.free: list[torch.Tensor] = []  # host buffers whose sends completed
        self.size = snapshot_size(tr)
        self.stopped = False
        self.last_sent_ms = 0.0  # when training rank 0 sent the latest weights (its eval_start)
        self._flag = np.zeros(1, dtype=np.int64)

    # sending ------------------------------------------------------------------------------------
    def _host_buffer(self, device: torch.device) -> torch.Tensor:
        self._reap()
        if self.free:
            return self.free.pop()
        return torch.empty(self.size, dtype=torch.float32, pin_memory=device.type == "cuda")

    def _reap(self) -> None:
        """Free the host buffers whose sends completed (also moves MPI's progress along)."""
        still = []
        for req, buf in self.sends:
            if req.Test():
                self.free.append(buf)
            else:
                still.append((req, buf))
        self.sends = still

    @torch.no_grad()
    def submit(self, tr: "Trainer", epoch: int, epoch_num: int | float) -> None:
        """Send the weights of this evaluation point (every training rank calls it)."""

        sync_batchnorm_stats(tr.model, tr.world)  # as an inline evaluation does: the trajectories agree
        seq = self.sent
        self.sent += 1
        self.pending.append((seq, epoch_num))
        if not self.leader:
            return
        buf = self._host_buffer(tr.device)
        packed = torch.cat([tr.flat.pack(tr.flat.params)] + [b.reshape(-1).float() for b in _weights(tr)])
        buf.copy_(packed, non_blocking=True)
        if tr.device.type == "cuda":
            torch.cuda.current_stream(tr.device).synchronize()  # MPI reads the host buffer next
        self.last_sent_ms = now_ms()
        tr.log.start("eval_start", metadata={"epoch_num": epoch_num}, time_ms=self.last_sent_ms)
        self.comm.send((seq, epoch, epoch_num), dest=self.roles.eval_leader, tag=JOB_TAG)
        self.sends.append((self.comm.Isend(buf.numpy(), dest=self.roles.eval_leader, tag=DATA_TAG), buf))

    # results ------------------------------------------------------------------------------------
    def _arrived(self) -> list[tuple[tuple[Any, ...], float]]:
        """Results waiting at training rank 0, with their arrival times."""
        out = []
        self._reap()
        while self.comm.Iprobe(source=self.roles.eval_leader, tag=RESULT_TAG):
            out.append((self.comm.recv(source=self.roles.eval_leader, tag=RESULT_TAG), now_ms()))
        return out

    def _share(self, tr: "Trainer", arrived: list[tuple[tuple[Any, ...], float]]) -> list[tuple[tuple[Any, ...], float]]:
        """Training rank 0's arrivals on every training rank: one 8-byte broadcast when there are none."""
        if tr.world == 1:
            return arrived
        comm = tr.env.instance_comm  # the training part
        self._flag[0] = len(arrived)
        comm.Bcast(self._flag, root=0)
        return comm.bcast(arrived, root=0) if self._flag[0] else []

    def poll(self, tr: "Trainer") -> bool:
        """Once per step on every training rank: record results that arrived; True when one met the
        target (the run stops)."""
        return self._record(tr, self._share(tr, self._arrived() if self.leader else []))

    def _record(self, tr: "Trainer", arrived: list[tuple[tuple[Any, ...], float]]) -> bool:
        for msg, t in arrived:
            if msg[0] == "error":
                raise EvalRanksError(f"evaluation rank {msg[1]} (instance {tr.env.layout.instance}) failed: {msg[2]}")
            _, seq, epoch_num, value = msg
            want, epoch_num_sent = self.pending.popleft()
            if seq != want:  # the protocol keeps order: anything else is a bug
                raise EvalRanksError(f"evaluation result {seq} arrived where {want} was expected")
            tr.log.end("eval_stop", metadata={"epoch_num": epoch_num_sent}, time_ms=t)
            tr.log.event(tr.workload.metric_key, value, metadata={"epoch_num": epoch_num_sent}, time_ms=t)
            if tr.record_metric(epoch_num_sent, value, f"evaluation at epoch_num {epoch_num_sent} "
                                f"(evaluation ranks {self.roles.eval_world_ranks()})", arrived_ms=t):
                return True
        return False

    def finish(self, tr: "Trainer", status: str) -> None:
        """After the loop on every training rank: unless the target was met, wait (at most
        ``train.eval_timeout_s``) for the results still owed and record them (the caller then stops
        the evaluation ranks with :meth:`stop`)."""
        if status != "success" and self.pending:
            self._wait_all(tr)

    def _wait_all(self, tr: "Trainer") -> None:
        timeout = tr.cfg.train.eval_timeout_s
        got: list[tuple[tuple[Any, ...], float]] | str = []
        if self.leader:
            deadline = time.monotonic() + timeout
            owed = len(self.pending)
            while isinstance(got, list) and len(got) < owed and not any(m[0] == "error" for m, _ in got):
                got.extend(self._arrived())
                if len(got) < owed and time.monotonic() > deadline:
                    seq, epoch_num = self.pending[len(got)]
                    got = (f"evaluation rank {self.roles.world_rank(self.roles.eval_leader)} (world rank; leader of "
                           f"evaluation ranks {self.roles.eval_world_ranks()}, instance {tr.env.layout.instance}) "
                           f"sent no result for the evaluation at epoch_num {epoch_num} within "
                           f"config key 'train.eval_timeout_s' = {timeout:g} s; is it alive and fast enough?")
                time.sleep(POLL_S)
        if tr.world > 1:
            comm = tr.env.instance_comm
            req = comm.Ibarrier()  # the other training ranks sleep while rank 0 waits, then hear the outcome
            while not req.Test():
                time.sleep(POLL_S)
            got = comm.bcast(got, root=0)
        if isinstance(got, str):
            raise EvalRanksError(got)
        self._record(tr, got)

    def stop(self, tr: "Trainer", status: str) -> None:
        """Tell the evaluation ranks to end (training rank 0; once). Sends still in flight are given
        ``train.eval_timeout_s`` to complete: the evaluation leader receives every job before it ends."""
        if self.stopped or not self.leader:
            return
        self.stopped = True
        send_stop(self.roles, self.sent, status)
        deadline = time.monotonic() + tr.cfg.train.eval_timeout_s
        while self.sends and time.monotonic() < deadline:
            self._reap()
            time.sleep(POLL_S)


def send_stop(roles: Roles, sent: int, status: str) -> None:
    """From training rank 0: the evaluation ranks end after receiving ``sent`` jobs (also when the
    training ranks fail before their first evaluation, so the evaluation ranks never wait in vain)."""
    roles.instance_comm.send(("stop", sent, status), dest=roles.eval_leader, tag=STOP_TAG)


class EvalSide:
    """What the evaluation ranks do: receive weights, evaluate, answer, until told to stop."""

    def __init__(self, tr: "Trainer", roles: Roles) -> None:
        self.roles = roles
        self.comm = roles.instance_comm
        self.leader = tr.rank == 0  # evaluation rank 0
        self.received = 0
        self.host = torch.empty(snapshot_size(tr), dtype=torch.float32)

    def serve(self, tr: "Trainer") -> "RunResult":
        """Every evaluation rank; returns when training rank 0 says stop (its status in the result)."""

        result = RunResult(status="aborted", instance=tr.env.layout.instance, epochs=0, steps=0,
                           time_to_solution_s=0.0, final_metric=None, metric_key=tr.workload.metric_key)
        try:
            self._load_data(tr)
            while True:
                job = self._next_job()
                if job[0] == "stop":
                    result.status = job[2]
                    return result
                _, seq, epoch, epoch_num = job
                self._load_weights(tr)
                value = tr.metric_value(epoch)
                result.metrics.append((epoch_num, value))
                result.final_metric = value
                if self.leader:
                    self.comm.send(("result", seq, epoch_num, value), dest=0, tag=RESULT_TAG)
        except Exception as exc:
            if self.leader:  # training rank 0 raises it at its next step instead of waiting in vain
                rank = self.roles.world_rank(self.roles.eval_leader)
                self.comm.send(("error", rank, f"{type(exc).__name__}: {exc}"), dest=0, tag=RESULT_TAG)
            raise

    def _load_data(self, tr: "Trainer") -> None:
        """The validation split over the evaluation ranks; an error on any of them on all."""
        try:
            tr.setup_eval_data()
            err = None
        except Exception as exc:  # noqa: BLE001 - re-raised on every evaluation rank below
            err = f"evaluation rank {tr.env.layout.world_rank}: cannot load its data: {type(exc).__name__}: {exc}"
        errors = [e for e in tr.env.instance_comm.allgather(err) if e]
        if errors:
            raise EvalRanksError(errors[0])

    def _next_job(self) -> tuple[Any, ...]:
        """The next job (or stop) on every evaluation rank; the leader receives it, then its part hears it."""
        job: tuple[Any, ...] | None = None
        if self.leader:
            job = self._receive()
        if self.roles.eval_size > 1:
            box = [job]
            tdist.broadcast_object_list(box, src=0)
            job = box[0]
        assert job is not None
        return job

    def _receive(self) -> tuple[Any, ...]:
        """Wait (sleeping between polls) for a job or the stop message; after stop, take the jobs not
        started yet without evaluating them, so that every send of training rank 0 completes."""
        comm = self.comm
        while True:
            if comm.Iprobe(source=0, tag=STOP_TAG):
                stop = comm.recv(source=0, tag=STOP_TAG)
                while self.received < stop[1]:
                    comm.recv(source=0, tag=JOB_TAG)
                    comm.Recv(self.host.numpy(), source=0, tag=DATA_TAG)
                    self.received += 1
                return stop
            if comm.Iprobe(source=0, tag=JOB_TAG):
                seq, epoch, epoch_num = comm.recv(source=0, tag=JOB_TAG)
                comm.Recv(self.host.numpy(), source=0, tag=DATA_TAG)
                self.received += 1
                return ("eval", seq, epoch, epoch_num)
            time.sleep(POLL_S)

    @torch.no_grad()
    def _load_weights(self, tr: "Trainer") -> None:
        """The leader's received weights on every evaluation rank's device, into the model."""
        packed = self.host.to(tr.device, non_blocking=False) if self.leader else \
            torch.empty(self.host.numel(), dtype=torch.float32, device=tr.device)
        if self.roles.eval_size > 1:
            tdist.broadcast(packed, src=0)
        tr.flat.unpack(packed, tr.flat.params)
        offset = tr.flat.numel
        for b in _weights(tr):
            b.copy_(packed[offset : offset + b.numel()].view_as(b))
            offset += b.numel()
