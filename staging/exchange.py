"""Bounded MPI waits, group-wide agreement on errors, and a heartbeat that supervises long work.

Every wait in staging polls a non-blocking request against a deadline: if a peer died, hangs or was
stopped, the waiting rank prints which step starved and calls ``MPI_Abort`` so the launcher ends the
whole job, instead of hanging until the allocation runs out. Polling also keeps idle ranks off the CPU.

An error is *agreed*: all ranks of the communicator learn it and raise the same :class:`AgreedError`,
which world rank 0 prints once (``hpcbench.cli``) while the others stay quiet.
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import numpy as np

from hpcbench.common.dist import mpi
from hpcbench.common.errors import DataError, HpcbenchError

T = TypeVar("T")
FOREVER = 7 * 24 * 3600.0
BEAT_S = 0.5  # seconds between heartbeats while a long step runs
ABORT_DRAIN_S = 1.0  # seconds between writing the message and MPI_Abort (which kills the launcher's forwarding)
ABORT_STAGGER_RANKS = 4
ABORT_STAGGER_S = 2.5  # > ABORT_DRAIN_S plus the spread of the moments the ranks' waits started
_ABORTING = threading.Lock()
#: called (best effort) just before MPI_Abort, e.g. to remove this node's temporary files
ON_ABORT: list[Callable[[], object]] = []


class AgreedError(DataError):
    """An error every rank of the job raises with the same message; world rank 0 reports it."""

    agreed = True

    def __init__(self, message: str, comm: Any = None) -> None:
        super().__init__(message)
        self.comm = comm

    def settle(self, timeout_s: float = 10.0) -> None:
        """Wait (bounded) until every rank got here, so no rank's exit kills rank 0 before it printed."""
        if self.comm is not None:
            req = self.comm.Ibarrier()
            t0 = time.monotonic()
            while not req.Test() and time.monotonic() - t0 < timeout_s:
                time.sleep(1e-3)


def abort(timeout_s: float, what: str) -> None:
    """Print why, give the launcher time to forward it, then end the whole job (MPI_Abort kills the
    stopped or hung peer too). Without the pause the message is often lost in the abort's race."""
    MPI = mpi()
    rank = MPI.COMM_WORLD.Get_rank()
    if not _ABORTING.acquire(blocking=False):  # another thread of this rank is already aborting
        while True:
            time.sleep(60)
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    # every live rank times out at about the same moment: the lowest speaks first and its abort ends
    # the others before they print (ranks 0-3 stagger; from rank 4 on they share the last slot)
    time.sleep(min(rank, ABORT_STAGGER_RANKS) * ABORT_STAGGER_S)
    sys.stderr.write(f"hpcbench stage: error: rank {rank}: no progress for {timeout_s:g}s while {what}; "
                     "a peer rank died, hangs or was stopped; aborting the job (MPI_Abort)\n")
    sys.stderr.flush()
    for fn in list(ON_ABORT):
        with contextlib.suppress(Exception):
            fn()
    time.sleep(ABORT_DRAIN_S)
    MPI.COMM_WORLD.Abort(3)


@contextlib.contextmanager
def deadline(timeout_s: float, what: str) -> Iterator[None]:
    """Bound a blocking MPI call (bcast, gather, Split, the collectives of ``init_distributed``): if it
    has not returned after ``timeout_s`` seconds, a watchdog thread aborts the job. mpi4py releases the
    GIL inside blocking calls, so the watchdog runs. If MPI is not initialized yet (a peer stopped
    during ``MPI_Init`` itself) nothing can end the other ranks from here: this rank exits with 3."""
    fired = threading.Event()

    def fire() -> None:
        fired.set()
        mod = sys.modules.get("mpi4py.MPI")
        if mod is not None and mod.Is_initialized() and not mod.Is_finalized():
            abort(timeout_s, what)  # does not return (MPI_Abort ends this process too)
        else:
            sys.stderr.write(f"hpcbench stage: error: no progress for {timeout_s:g}s while {what}\n")
            sys.stderr.flush()
        os._exit(3)

    timer = threading.Timer(timeout_s, fire)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def end_job(rc: int, timeout_s: float) -> None:
    """Before this rank exits: a bounded barrier (a peer that never gets here, e.g. stopped after the
    report, makes this rank abort the job), then a watchdog over ``MPI_Finalize``, which waits for
    every peer without a bound: if a peer stops in the short gap after the barrier, faulthandler's C
    thread (it needs no GIL, which Finalize holds) ends this rank after ``timeout_s`` and the launcher
    then ends the others. A rank must not skip Finalize: the launcher kills a job whose rank does."""
    import faulthandler

    MPI = mpi()
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    sys.stderr.flush()
    wait(MPI.COMM_WORLD.Ibarrier(), timeout_s, "exiting (waiting for every rank to finish)")
    faulthandler.dump_traceback_later(timeout_s, exit=True)  # prints "Timeout" and the stack, then exits 1
    MPI.Finalize()  # here, not at interpreter exit: faulthandler's watchdog is cancelled during shutdown
    faulthandler.cancel_dump_traceback_later()


def wait(req: Any, timeout_s: float, what: str, max_pause: float = 1e-3) -> None:
    """Wait for an MPI request; abort the job with a clear message after ``timeout_s`` seconds.

    MPI moves data only while some call polls it, so data transfers use a short ``max_pause``;
    idle waits (barriers) back off to 1 ms to leave the CPU to the threads doing real work."""
    t0 = time.monotonic()
    pause = 0.0
    while not req.Test():
        if time.monotonic() - t0 > timeout_s:
            abort(timeout_s, what)
        time.sleep(pause)
        pause = min(max_pause, pause * 2 or 1e-5)


def barrier(comm: Any, timeout_s: float, what: str) -> None:
    wait(comm.Ibarrier(), timeout_s, what)


def agree(comm: Any, error: str | None, timeout_s: float, what: str) -> None:
    """All ranks of ``comm`` learn whether any had an error; then all raise the first one."""
    flags = np.zeros(comm.Get_size(), dtype=np.int32)
    mine = np.array([1 if error else 0], dtype=np.int32)
    wait(comm.Iallgather(mine, flags), timeout_s, what)
    if flags.any():
        with deadline(timeout_s, what):
            msgs = [m for m in comm.allgather(error) if m]
        raise AgreedError(msgs[0] if len(set(msgs)) == 1 else "; ".join(dict.fromkeys(msgs)), comm)


def describe(exc: BaseException, where: str) -> str:
    """A one-line message for an error on this rank; a non-user error also prints its traceback."""
    if isinstance(exc, HpcbenchError):
        return str(exc)
    if isinstance(exc, OSError):
        return f"{where}: {exc}"
    import traceback

    traceback.print_exception(exc)
    return f"{where}: internal error {exc!r} (traceback above)"


def supervised(comm: Any, work: Callable[[], T] | None, timeout_s: float, what: str, where: str) -> T | None:
    """Run ``work`` (None: nothing, just keep the others company) in a thread while every rank of
    ``comm`` exchanges a heartbeat each ``BEAT_S`` seconds. Returns when all ranks are done; a rank
    that stops answering (dead, hung in MPI, SIGSTOP) makes the others abort after ``timeout_s``; an
    error on any rank is agreed and raised on all."""
    box: dict[str, Any] = {}
    done = threading.Event()
    if mpi().Query_thread() < mpi().THREAD_MULTIPLE:  # no MPI from two threads: run inline, no heartbeat
        try:
            box["value"] = work() if work is not None else None
        except Exception as exc:  # noqa: BLE001 - agreed below
            box["error"] = describe(exc, where)
        agree(comm, box.get("error"), FOREVER, what)
        return box.get("value")

    def run() -> None:
        try:
            box["value"] = work() if work is not None else None
        except BaseException as exc:  # noqa: BLE001 - reported through the heartbeat below
            box["error"] = describe(exc, where)
        finally:
            done.set()

    thread = threading.Thread(target=run, name="hpcbench-stage", daemon=True)
    thread.start()
    flags = np.zeros(comm.Get_size(), dtype=np.int32)
    while True:
        done.wait(BEAT_S)
        mine = np.array([1 if done.is_set() else 0], dtype=np.int32)
        wait(comm.Iallgather(mine, flags), timeout_s, what)
        if flags.all():
            break
    thread.join()
    agree(comm, box.get("error"), timeout_s, what)
    return box.get("value")
