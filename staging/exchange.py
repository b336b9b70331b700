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
import subprocess
import sys
import threading
import time
from array import array
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from hpcbench.common.dist import Watch, mpi, watchdog
from hpcbench.common.errors import ConfigError, DataError, HpcbenchError

T = TypeVar("T")
FOREVER = 7 * 24 * 3600.0
BEAT_S = 0.5  # seconds between heartbeats while a long step runs
ABORT_DRAIN_S = 1.0  # seconds between writing the message and MPI_Abort (which kills the launcher's forwarding)
ABORT_STAGGER_RANKS = 4
ABORT_STAGGER_S = 2.5  # > ABORT_DRAIN_S plus the spread of the moments the ranks' waits started
# --timeout's range: below the heartbeat it means nothing; above a week it is "never" (and past
# threading.TIMEOUT_MAX a timer cannot take it at all)
TIMEOUT_MIN_S = 1.0
TIMEOUT_MAX_S = FOREVER
ROLL_TAG = 7461  # point-to-point tag of the roll call
PING_TAG, PONG_TAG = 7462, 7463  # "who is alive?" of an aborting rank, and its answers (world communicator)
PING_WAIT_S = 3.0  # how long an aborting rank waits for the others' answers before it names the silent ones
ANSWER_EVERY_S = 0.01  # how often a polling loop answers such questions
_ABORTING = threading.Lock()
_ANSWERS: list[Any] = []  # pong sends in flight (kept referenced until the job ends)
_PING_BUF = bytearray(1)  # (plain buffers, no numpy: `hpcbench stage` starts on every node and imports little)
_LAST_ANSWER = [0.0]
_ANSWERING = threading.Lock()  # one thread answers at a time (probe and receive must pair up)
_GUARD: list[subprocess.Popen[bytes]] = []
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


def check_timeout(timeout_s: float) -> None:
    """``--timeout``'s range, checked before any MPI work (and by ``StageOptions.validate``)."""
    if not TIMEOUT_MIN_S <= timeout_s <= TIMEOUT_MAX_S:  # nan fails too
        raise ConfigError(f"--timeout must be between {TIMEOUT_MIN_S:g} and {TIMEOUT_MAX_S:g} seconds (7 days), "
                          f"got {timeout_s:g}")


def start_guard(timeout_s: float) -> None:
    """Start this rank's watcher process (``hpcbench.staging.guard``) before MPI starts: it ends a rank
    stopped inside ``MPI_Init`` or after the job's last barrier, where no peer can. Only under a
    launcher, on Linux."""
    from hpcbench.common.dist import launched_by_mpi

    if _GUARD or not launched_by_mpi() or not Path("/proc/self/stat").exists():
        return
    rank = next((os.environ[v] for v in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID")
                 if v in os.environ), "?")
    with contextlib.suppress(OSError):
        _GUARD.append(subprocess.Popen(
            [sys.executable, "-I", "-S", str(Path(__file__).with_name("guard.py")), str(os.getpid()), rank,
             repr(float(timeout_s))], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, close_fds=True))


def tell_guard(phase: str) -> None:
    """Tell the watcher which phase this rank is in (see ``hpcbench.staging.guard``)."""
    for proc in _GUARD:
        with contextlib.suppress(OSError, ValueError):
            assert proc.stdin is not None
            proc.stdin.write(phase.encode() + b"\n")
            proc.stdin.flush()


def answer_pings(force: bool = False) -> None:
    """Answer every rank that asks whether this one is alive (an aborting rank naming the silent ones).
    Called from every polling loop at most each ``ANSWER_EVERY_S`` (``force``: now) and while aborting."""
    now = time.monotonic()
    if not force and now - _LAST_ANSWER[0] < ANSWER_EVERY_S:
        return
    _LAST_ANSWER[0] = now
    MPI = sys.modules.get("mpi4py.MPI")
    if MPI is None or not MPI.Is_initialized() or MPI.Is_finalized() or MPI.Query_thread() < MPI.THREAD_MULTIPLE:
        return
    if not _ANSWERING.acquire(blocking=False):
        return
    try:
        world, st = MPI.COMM_WORLD, MPI.Status()
        while world.Iprobe(source=MPI.ANY_SOURCE, tag=PING_TAG, status=st):
            src = st.Get_source()
            world.Recv([bytearray(1), MPI.BYTE], source=src, tag=PING_TAG)
            _ANSWERS.append(world.Isend([_PING_BUF, MPI.BYTE], dest=src, tag=PONG_TAG))
    finally:
        _ANSWERING.release()


def silent_ranks(wait_s: float = PING_WAIT_S) -> list[int] | None:
    """World ranks that do not answer within ``wait_s`` (dead, hung or stopped: the live ones answer from
    their polling loops or their own abort); None when MPI cannot ask (no thread support)."""
    MPI = sys.modules.get("mpi4py.MPI")
    if MPI is None or not MPI.Is_initialized() or MPI.Is_finalized() or MPI.Query_thread() < MPI.THREAD_MULTIPLE:
        return None
    world = MPI.COMM_WORLD
    me, n = world.Get_rank(), world.Get_size()
    box = memoryview(bytearray(n))  # slices of a memoryview are views: each answer lands in its own byte
    try:
        pings = [world.Isend([_PING_BUF, MPI.BYTE], dest=r, tag=PING_TAG) for r in range(n) if r != me]
        pongs = {r: world.Irecv([box[r:r + 1], MPI.BYTE], source=r, tag=PONG_TAG) for r in range(n) if r != me}
    except Exception:  # noqa: BLE001 - best effort: the abort goes on without names
        return None
    _poll(pongs, time.monotonic(), wait_s)  # answers the other aborting ranks' questions meanwhile
    _ANSWERS.extend(pings)
    return sorted(pongs)


def abort(timeout_s: float, what: str, who: str | None = None, commit: Callable[[], bool] | None = None) -> None:
    """Print why (``who``: the ranks found missing; if not given, the ranks that do not answer a "who is
    alive?" within ``PING_WAIT_S``), give the launcher time to forward it, then end the whole job
    (MPI_Abort kills the stopped or hung peer too). Without the pause the message is often lost in the
    abort's race.

    ``commit`` (a watchdog's abort, :func:`deadline`): asked once the peers were asked, before anything
    is printed; False means the watched call returned meanwhile (it was late, not stuck), and this
    returns without aborting."""
    MPI = mpi()
    rank = MPI.COMM_WORLD.Get_rank()
    if not _ABORTING.acquire(blocking=False):  # another thread of this rank is already aborting
        if commit is not None:
            return  # the other thread ends the job
        while True:
            time.sleep(60)
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    silent: list[int] | None = None
    if who is None:
        silent = silent_ranks()
        if silent:
            who = (f"rank{'s' if len(silent) > 1 else ''} {', '.join(map(str, silent))} did not answer within "
                   f"{PING_WAIT_S:g}s (died, hung or stopped)")
        elif silent is not None:
            who = ("every rank answered: one is alive but its work is stuck (a hang in a thread, or I/O that "
                   "never returns), not a dead or stopped process")
    if commit is not None and not commit():
        _ABORTING.release()
        return
    # every live rank times out at about the same moment: the lowest live one speaks first and its abort
    # ends the others before they print (places 0-3 stagger; from 4 on they share the last slot); they keep
    # answering "who is alive?" meanwhile. The place counts the live ranks below this one: with rank 0
    # stopped, rank 1 speaks at once instead of waiting out rank 0's slot
    place = rank - sum(r < rank for r in silent or ())
    t_end = time.monotonic() + min(place, ABORT_STAGGER_RANKS) * ABORT_STAGGER_S
    while time.monotonic() < t_end:
        with contextlib.suppress(Exception):
            answer_pings(force=True)
        time.sleep(5e-3)
    sys.stderr.write(f"hpcbench stage: error: rank {rank}: no progress for {timeout_s:g}s while {what}; "
                     f"{who or 'a peer rank died, hangs or was stopped'}; aborting the job (MPI_Abort)\n")
    sys.stderr.flush()
    for fn in list(ON_ABORT):
        with contextlib.suppress(Exception):
            fn()
    time.sleep(ABORT_DRAIN_S)
    MPI.COMM_WORLD.Abort(3)


def deadline(timeout_s: float, what: str) -> contextlib.AbstractContextManager[None]:
    """Bound a blocking MPI call (bcast, gather, Split, the collectives of ``init_distributed``): if it
    has not returned after ``timeout_s`` seconds, a watchdog thread aborts the job. mpi4py releases the
    GIL inside blocking calls, so the watchdog runs. If MPI is not initialized yet (a peer stopped
    during ``MPI_Init`` itself) nothing can end the other ranks from here: this rank exits with 3.

    A call that returns while the watchdog still asks the peers who is alive (late, not stuck: a loaded
    node) makes it stand down; once it has committed, the returning thread waits for the abort instead of
    going on, so the job prints one error, not the abort's and whatever the work would have said next
    (seen: a 3 s bound passed by a hair on a loaded box, then rank 0's own error about the manifest)."""
    def fire(watch: Watch) -> None:
        mod = sys.modules.get("mpi4py.MPI")
        if mod is not None and mod.Is_initialized() and not mod.Is_finalized():
            try:
                abort(timeout_s, what, commit=watch.commit)  # returns only when it stood down
            except BaseException:  # noqa: BLE001 - an abort that failed still ends this rank
                watch.commit()
            else:
                if not watch.committed:
                    return
            os._exit(3)
        if not watch.commit():
            return
        sys.stderr.write(f"hpcbench stage: error: no progress for {timeout_s:g}s while {what}\n")
        sys.stderr.flush()
        os._exit(3)

    return watchdog(timeout_s, fire)  # common.dist's: the same stand-down / commit protocol


def end_job(rc: int, timeout_s: float) -> None:
    """Before this rank exits: a roll call (every rank confirms every other's arrival under the
    watchdog; a rank that does not come, e.g. stopped after the report, makes the others abort the job
    naming it), then ``MPI_Finalize`` and an immediate exit. The watcher process
    (``hpcbench.staging.guard``) covers what no peer can see: a rank stopped after the roll call (in
    ``MPI_Finalize``, or after it while the others already left and the launcher waits for it) is
    killed after ``timeout_s`` + a grace, and the launcher ends the job. Without a watcher (not Linux), faulthandler's C thread (it
    needs no GIL, which Finalize holds) bounds ``MPI_Finalize``. A rank must not skip Finalize: the
    launcher kills a job whose rank does."""
    import faulthandler

    MPI = mpi()
    _flush()
    tell_guard("final")
    roll_call(MPI.COMM_WORLD, timeout_s, "exiting (waiting for every rank to finish)")
    tell_guard("finalizing")
    if not _GUARD:  # prints "Timeout" and the stack, then exits 1
        faulthandler.dump_traceback_later(timeout_s, exit=True)
    _finalize(MPI)  # here, not at interpreter exit: faulthandler's watchdog is cancelled during shutdown
    faulthandler.cancel_dump_traceback_later()
    # no os._exit here to shorten the last window: MPICH's launcher takes an exit right after
    # MPI_Finalize for a rank that died before finalizing, and kills the others (measured: 3 of 5 runs)


def _flush() -> None:
    for f in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            f.flush()


def _finalize(MPI: Any) -> None:
    MPI.Finalize()


def roll_call(comm: Any, timeout_s: float, what: str) -> None:
    """A barrier that knows who is missing: every rank sends rank 0 an empty message, rank 0 answers
    every rank once all came. After ``timeout_s`` rank 0 aborts naming the ranks that did not come
    (world ranks); the others wait 5 s longer (rank 0 may come last: it prints the report) and then
    name rank 0."""
    MPI = mpi()
    n, me = comm.Get_size(), comm.Get_rank()
    if n == 1:
        return
    box = memoryview(bytearray(n))  # slices of a memoryview are views
    t0 = time.monotonic()
    if me == 0:
        pending = {r: comm.Irecv([box[r:r + 1], MPI.BYTE], source=r, tag=ROLL_TAG) for r in range(1, n)}
        _poll(pending, t0, timeout_s)
        if pending:
            world = MPI.Group.Translate_ranks(comm.Get_group(), sorted(pending), MPI.COMM_WORLD.Get_group())
            names = ", ".join(str(r) for r in world)
            abort(timeout_s, what, f"rank{'s' if len(world) > 1 else ''} {names} did not arrive "
                                   "(died, hangs or was stopped)")
        sends = {r: comm.Isend([box[r:r + 1], MPI.BYTE], dest=r, tag=ROLL_TAG) for r in range(1, n)}
        _poll(sends, t0, timeout_s)
        if sends:
            abort(timeout_s, what, f"ranks {', '.join(map(str, sorted(sends)))} did not take rank 0's answer")
        return
    reqs = {0: comm.Isend([box[0:1], MPI.BYTE], dest=0, tag=ROLL_TAG),
            1: comm.Irecv([box[1:2], MPI.BYTE], source=0, tag=ROLL_TAG)}
    # later than rank 0, which may come last (it prints the report) and, alive, names who is missing
    _poll(reqs, t0, timeout_s + 2 * ABORT_STAGGER_S)
    if reqs:
        root = MPI.Group.Translate_ranks(comm.Get_group(), [0], MPI.COMM_WORLD.Get_group())[0]
        abort(timeout_s + 2 * ABORT_STAGGER_S, what, f"rank {root} did not confirm that every rank arrived (rank {root}, or a rank it "
                               "waits for, died, hangs or was stopped)")


def _poll(reqs: dict[int, Any], t0: float, timeout_s: float) -> None:
    """Test the requests until all completed (removed from ``reqs``) or ``timeout_s`` passed since ``t0``."""
    pause = 0.0
    while reqs and time.monotonic() - t0 <= timeout_s:
        for r in [r for r, q in reqs.items() if q.Test()]:
            del reqs[r]
        answer_pings()
        if reqs:
            time.sleep(pause)
            pause = min(1e-2 if len(reqs) > 64 else 1e-3, pause * 2 or 1e-5)


def wait(req: Any, timeout_s: float, what: str, max_pause: float = 1e-3) -> None:
    """Wait for an MPI request; abort the job with a clear message after ``timeout_s`` seconds.

    MPI moves data only while some call polls it, so data transfers use a short ``max_pause``;
    idle waits (barriers) back off to 1 ms to leave the CPU to the threads doing real work."""
    t0 = time.monotonic()
    pause = 0.0
    while not req.Test():
        answer_pings()
        if time.monotonic() - t0 > timeout_s:
            abort(timeout_s, what)
        time.sleep(pause)
        pause = min(max_pause, pause * 2 or 1e-5)


def barrier(comm: Any, timeout_s: float, what: str) -> None:
    wait(comm.Ibarrier(), timeout_s, what)


def agree(comm: Any, error: str | None, timeout_s: float, what: str) -> None:
    """All ranks of ``comm`` learn whether any had an error; then all raise the first one."""
    flags = array("i", bytes(comm.Get_size() * array("i").itemsize))
    mine = array("i", [1 if error else 0])
    wait(comm.Iallgather(mine, flags), timeout_s, what)
    if any(flags):
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
    flags = array("i", bytes(comm.Get_size() * array("i").itemsize))
    while True:
        done.wait(BEAT_S)
        mine = array("i", [1 if done.is_set() else 0])
        wait(comm.Iallgather(mine, flags), timeout_s, what)
        if all(flags):
            break
    thread.join()
    agree(comm, box.get("error"), timeout_s, what)
    return box.get("value")
