"""Bounded MPI waits and group-wide agreement on errors.

Every wait in staging polls a non-blocking request against a deadline: if a peer died or hangs, the
waiting rank prints which step starved and calls ``MPI_Abort`` so the launcher ends the whole job,
instead of hanging until the allocation runs out. Polling also keeps idle ranks off the CPU.
"""
from __future__ import annotations

import sys
import time
from typing import Any

import numpy as np

from common.dist import mpi
from common.errors import DataError


def wait(req: Any, timeout_s: float, what: str, max_pause: float = 1e-3) -> None:
    """Wait for an MPI request; abort the job with a clear message after ``timeout_s`` seconds.

    MPI moves data only while some call polls it, so data transfers use a short ``max_pause``;
    idle waits (barriers) back off to 1 ms to leave the CPU to the threads doing real work."""
    t0 = time.monotonic()
    pause = 0.0
    while not req.Test():
        if time.monotonic() - t0 > timeout_s:
            MPI = mpi()
            rank = MPI.COMM_WORLD.Get_rank()
            sys.stderr.write(f"hpcbench stage: error: rank {rank}: no progress for {timeout_s:g}s while {what}; "
                             "a peer rank died or hangs; aborting the job (MPI_Abort)\n")
            sys.stderr.flush()
            MPI.COMM_WORLD.Abort(3)
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
        msgs = [m for m in comm.allgather(error) if m]
        raise DataError(msgs[0] if len(set(msgs)) == 1 else "; ".join(dict.fromkeys(msgs)))

