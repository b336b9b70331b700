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

import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as tdist

from .build import RunParts, build_eval_data
from .errors import HpcbenchError
from .mllog import MLPerfLogger
from .parallel import Roles
from .result import RunResult
from .timing import now_ms

if TYPE_CHECKING:  # pragma: no cover
    from .workload import Workload

JOB_TAG, DATA_TAG, RESULT_TAG, STOP_TAG = 7311, 7312, 7313, 7314
POLL_S = 0.002  # sleep between polls of a waiting rank

#: records one arrived result: (epoch_num, value, where, arrived_ms) -> True when it met the target
Record = Callable[[int | float, float, str, float], bool]


class EvalRanksError(HpcbenchError):
    """An evaluation rank failed, or owed a result past ``train.eval_timeout_s``."""


def _weights(parts: RunParts) -> list[torch.Tensor]:
    """The model's floating-point buffers (BatchNorm running statistics) that travel with the weights."""
    return [b for b in parts.model.buffers() if b.is_floating_point()]


def snapshot_size(parts: RunParts) -> int:
    return parts.flat.numel + sum(b.numel() for b in _weights(parts))


class TrainSide:
    """What the training ranks do: send weights at evaluation points, poll results, stop the evaluators."""

    def __init__(self, parts: RunParts, roles: Roles, log: MLPerfLogger) -> None:
        self.parts, self.roles, self.log = parts, roles, log
        self.comm = roles.instance_comm
        self.part_comm = parts.parallel.comm  # the training ranks
        self.world = parts.parallel.size
        self.device = parts.parallel.device
        self.instance = parts.parallel.env.layout.instance
        self.leader = parts.parallel.rank == 0
        self.pending: deque[tuple[int, int | float]] = deque()  # (seq, epoch_num) sent, no result yet
        self.sent = 0
        self.sends: list[tuple[Any, torch.Tensor]] = []  # (MPI request, its host buffer) in flight
        self.free: list[torch.Tensor] = []  # host buffers whose sends completed
        self.size = snapshot_size(parts)
        self.stopped = False
        self.last_sent_ms = 0.0  # when training rank 0 sent the latest weights (its eval_start)
        self._flag = np.zeros(1, dtype=np.int64)

    # sending ------------------------------------------------------------------------------------
    def _host_buffer(self) -> torch.Tensor:
        self._reap()
        if self.free:
            return self.free.pop()
        return torch.empty(self.size, dtype=torch.float32, pin_memory=self.device.type == "cuda")

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
    def submit(self, epoch: int, epoch_num: int | float) -> None:
        """Send the weights of this evaluation point (every training rank calls it)."""
        parts = self.parts
        parts.parallel.average_buffers(parts.model)  # as an inline evaluation does: the trajectories agree
        seq = self.sent
        self.sent += 1
        self.pending.append((seq, epoch_num))
        if not self.leader:
            return
        buf = self._host_buffer()
        packed = torch.cat([parts.flat.pack(parts.flat.params)] + [b.reshape(-1).float() for b in _weights(parts)])
        buf.copy_(packed, non_blocking=True)
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()  # MPI reads the host buffer next
        self.last_sent_ms = now_ms()
        self.log.start("eval_start", metadata={"epoch_num": epoch_num}, time_ms=self.last_sent_ms)
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

    def _share(self, arrived: list[tuple[tuple[Any, ...], float]]) -> list[tuple[tuple[Any, ...], float]]:
        """Training rank 0's arrivals on every training rank: one 8-byte broadcast when there are none."""
        if self.world == 1:
            return arrived
        self._flag[0] = len(arrived)
        self.part_comm.Bcast(self._flag, root=0)
        return self.part_comm.bcast(arrived, root=0) if self._flag[0] else []

    def poll(self, record: Record) -> bool:
        """Once per step on every training rank: record results that arrived; True when one met the
        target (the run stops)."""
        return self._record(record, self._share(self._arrived() if self.leader else []))

    def _record(self, record: Record, arrived: list[tuple[tuple[Any, ...], float]]) -> bool:
        for msg, t in arrived:
            if msg[0] == "error":
                raise EvalRanksError(f"evaluation rank {msg[1]} (instance {self.instance}) failed: {msg[2]}")
            _, seq, epoch_num, value = msg
            want, epoch_num_sent = self.pending.popleft()
            if seq != want:  # the protocol keeps order: anything else is a bug
                raise EvalRanksError(f"evaluation result {seq} arrived where {want} was expected")
            self.log.end("eval_stop", metadata={"epoch_num": epoch_num_sent}, time_ms=t)
            self.log.event(self.parts.evaluator.workload.metric_key, value, metadata={"epoch_num": epoch_num_sent},
                           time_ms=t)
            if record(epoch_num_sent, value, f"evaluation at epoch_num {epoch_num_sent} "
                      f"(evaluation ranks {self.roles.eval_world_ranks()})", t):
                return True
        return False

    def finish(self, record: Record, status: str, timeout: float) -> None:
        """After the loop on every training rank: unless the target was met, wait (at most ``timeout``,
        ``train.eval_timeout_s``) for the results still owed and record them (the caller then stops the
        evaluation ranks with :meth:`stop`)."""
        if status != "success" and self.pending:
            self._wait_all(record, timeout)

    def _wait_all(self, record: Record, timeout: float) -> None:
        got: list[tuple[tuple[Any, ...], float]] | str = []
        if self.leader:
            deadline = time.monotonic() + timeout
            owed = len(self.pending)
            while isinstance(got, list) and len(got) < owed and not any(m[0] == "error" for m, _ in got):
                got.extend(self._arrived())
                if len(got) < owed and time.monotonic() > deadline:
                    seq, epoch_num = self.pending[len(got)]
                    got = (f"evaluation rank {self.roles.world_rank(self.roles.eval_leader)} (world rank; leader of "
                           f"evaluation ranks {self.roles.eval_world_ranks()}, instance {self.instance}) "
                           f"sent no result for the evaluation at epoch_num {epoch_num} within "
                           f"config key 'train.eval_timeout_s' = {timeout:g} s; is it alive and fast enough?")
                time.sleep(POLL_S)
        if self.world > 1:
            req = self.part_comm.Ibarrier()  # the other training ranks sleep while rank 0 waits, then hear it
            while not req.Test():
                time.sleep(POLL_S)
            got = self.part_comm.bcast(got, root=0)
        if isinstance(got, str):
            raise EvalRanksError(got)
        self._record(record, got)

    def stop(self, status: str, timeout: float) -> None:
        """Tell the evaluation ranks to end (training rank 0; once). Sends still in flight are given
        ``timeout`` (``train.eval_timeout_s``) to complete: the evaluation leader receives every job."""
        if self.stopped or not self.leader:
            return
        self.stopped = True
        send_stop(self.roles, self.sent, status)
        deadline = time.monotonic() + timeout
        while self.sends and time.monotonic() < deadline:
            self._reap()
            time.sleep(POLL_S)


def send_stop(roles: Roles, sent: int, status: str) -> None:
    """From training rank 0: the evaluation ranks end after receiving ``sent`` jobs (also when the
    training ranks fail before their first evaluation, so the evaluation ranks never wait in vain)."""
    roles.instance_comm.send(("stop", sent, status), dest=roles.eval_leader, tag=STOP_TAG)


class EvalSide:
    """What the evaluation ranks do: receive weights, evaluate, answer, until told to stop."""

    def __init__(self, parts: RunParts, roles: Roles | None, workload: "Workload") -> None:
        assert roles is not None
        self.parts, self.roles, self.workload = parts, roles, workload
        self.comm = roles.instance_comm
        self.leader = parts.parallel.rank == 0  # evaluation rank 0
        self.received = 0
        self.host = torch.empty(snapshot_size(parts), dtype=torch.float32)

    def serve(self, instance: int) -> RunResult:
        """Every evaluation rank; returns when training rank 0 says stop (its status in the result)."""
        result = RunResult(status="aborted", instance=instance, epochs=0, steps=0, time_to_solution_s=0.0,
                           final_metric=None, metric_key=self.workload.metric_key)
        try:
            self._load_data()
            while True:
                job = self._next_job()
                if job[0] == "stop":
                    result.status = job[2]
                    return result
                _, seq, epoch, epoch_num = job
                self._load_weights()
                value = self.parts.evaluator.metric(epoch)
                result.metrics.append((epoch_num, value))
                result.final_metric = value
                if self.leader:
                    self.comm.send(("result", seq, epoch_num, value), dest=0, tag=RESULT_TAG)
        except Exception as exc:
            if self.leader:  # training rank 0 raises it at its next step instead of waiting in vain
                rank = self.roles.world_rank(self.roles.eval_leader)
                self.comm.send(("error", rank, f"{type(exc).__name__}: {exc}"), dest=0, tag=RESULT_TAG)
            raise

    def _load_data(self) -> None:
        """The validation split over the evaluation ranks; an error on any of them on all."""
        par = self.parts.parallel
        try:
            build_eval_data(self.parts, self.workload)
            self.workload.start_data()  # evaluation ranks log no run_start: their split is started here
            err = None
        except Exception as exc:  # noqa: BLE001 - re-raised on every evaluation rank below
            err = f"evaluation rank {par.env.layout.world_rank}: cannot load its data: {type(exc).__name__}: {exc}"
        errors = [e for e in par.comm.allgather(err) if e]
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
    def _load_weights(self) -> None:
        """The leader's received weights on every evaluation rank's device, into the model."""
        device, flat = self.parts.parallel.device, self.parts.flat
        packed = self.host.to(device, non_blocking=False) if self.leader else \
            torch.empty(self.host.numel(), dtype=torch.float32, device=device)
        if self.roles.eval_size > 1:
            tdist.broadcast(packed, src=0)
        flat.unpack(packed, flat.params)
        offset = flat.numel
        for b in _weights(self.parts):
            b.copy_(packed[offset : offset + b.numel()].view_as(b))
            offset += b.numel()
