"""A small watcher process per rank for the two windows in which no MPI peer can see a stopped rank.

``hpcbench stage`` starts it (``hpcbench.staging.exchange.start_guard``) before MPI starts. Between
``MPI_Init`` and the job's last barrier the ranks watch each other (heartbeats and bounded waits end
the job with ``MPI_Abort``). Two windows are outside that: ``MPI_Init`` itself (every peer waits in
it, and nothing in Python runs there) and the moments after the last barrier (``MPI_Finalize`` and
the exit: peers that already left cannot see a rank stopped there, and the launcher waits for it
forever). In those windows this process watches its rank from outside: a rank stopped (SIGSTOP,
state ``T``) for longer than ``--timeout`` + ``STOP_GRACE_S`` is named and killed with SIGKILL, which
the launcher sees as a failed rank and so ends the whole job; a rank still not gone
``--timeout`` + 2 x ``STOP_GRACE_S`` after the last barrier (its ``MPI_Finalize`` waits for a peer
stopped there) is killed too. The grace lets the peers' own ``MPI_Abort`` (which names the rank)
come first where they can see it.

Run as ``python -I -S guard.py PID RANK TIMEOUT``; it reads phase words from stdin (``up``: MPI is
up, the peers watch the rank now; ``final``: the rank entered the job's last barrier; ``finalizing``:
that barrier passed) and exits as soon as the rank's process is gone. Standard library only (it must
start fast); Linux only (``/proc``, ``pidfd``).
"""
from __future__ import annotations

import os
import select
import signal
import socket
import sys
import time

STOP_GRACE_S = 5.0  # after --timeout: the peers' MPI_Abort (drain and stagger included) comes first
POLL_S = 0.2
FROZEN_S = 2.0  # a longer gap between two polls: this watcher itself was stopped (e.g. the whole job suspended)
WATCHED = ("init", "final", "finalizing")  # phases in which a stopped rank is this watcher's business
DOING = {"init": "in MPI_Init (its peers wait for it there)", "final": "at or just past the job's last barrier",
         "finalizing": "finishing after the job's last barrier (MPI_Finalize or exit)"}


def state(pid: int) -> str:
    """The process state letter from /proc (``T`` stopped, ``Z`` exited), ``X`` if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return "X"
    end = stat.rindex(b")")
    return stat[end + 2:end + 3].decode()


def watch(pid: int, rank: str, timeout_s: float) -> int:
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):  # no pidfd (old kernel or Python): do nothing rather than guess
        return 0
    host = socket.gethostname()
    phase, since, stopped_since = "init", time.monotonic(), None
    last = since
    fds = [pidfd, 0]

    def kill(why: str) -> int:
        sys.stderr.write(f"hpcbench stage: error: rank {rank} (pid {pid} on {host}) {why}; killing it so that "
                         "the launcher ends the job\n")
        sys.stderr.flush()
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        return 0

    while True:
        ready, _, _ = select.select(fds, [], [], POLL_S)
        now = time.monotonic()
        if pidfd in ready:
            return 0  # the rank is gone
        if now - last > FROZEN_S:  # this watcher was frozen itself: do not count that time
            since += now - last
            stopped_since = None
        last = now
        if 0 in ready:
            words = os.read(0, 4096).split()
            if not words:
                fds.remove(0)  # the rank closed its end (it is exiting): keep watching it
            for w in words:
                phase, since, stopped_since = w.decode(), now, None
        st = state(pid)
        if st in ("X", "Z"):
            return 0
        if phase in WATCHED and st == "T":
            stopped_since = stopped_since or now
            if now - stopped_since > timeout_s + STOP_GRACE_S:
                return kill(f"has been stopped (SIGSTOP) for {now - stopped_since:.0f}s while {DOING[phase]}")
        else:
            stopped_since = None
        if phase == "finalizing" and now - since > timeout_s + 2 * STOP_GRACE_S:
            return kill(f"did not finish MPI_Finalize and exit within {timeout_s + 2 * STOP_GRACE_S:g}s after every "
                        "rank passed the job's last barrier (a peer stopped or died after it)")


if __name__ == "__main__":
    sys.exit(watch(int(sys.argv[1]), sys.argv[2], float(sys.argv[3])))
