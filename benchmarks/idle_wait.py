"""What a long MPI wait costs: MPICH's blocking ``MPI_Barrier`` (the baseline) vs
:func:`hpcbench.common.dist.idle_barrier` (``Ibarrier`` + ``Test``, sleeping between polls), in one job.

    mpiexec -n 4 python -m benchmarks.idle_wait --hold 3 --rounds 3 --calls 2000

Two measurements per method, interleaved (baseline, idle, baseline, idle, ...) so that load from
elsewhere hits both:

* **held wait**: rank 0 works (sleeps) ``--hold`` seconds while the other ranks wait in the barrier, as a
  finished instance's ranks wait for the last instance, or the ranks wait while rank 0 writes a
  checkpoint. Printed: the waiting ranks' CPU seconds (the cost to the node's other processes) and how
  late they leave after rank 0 enters (the release delay the sleeping adds).
* **no wait**: ``--calls`` barriers that every rank enters at once: the time per call.

Prints the CPU, its flags and the load first, and the ratios idle / baseline.
"""
from __future__ import annotations

import argparse
import resource
import statistics
import time
from collections.abc import Callable
from typing import Any

from benchmarks.machine import describe, header
from hpcbench.common.dist import idle_barrier


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def held(comm: Any, wait: Callable[[Any], None], hold_s: float) -> tuple[float, float]:
    """(CPU seconds of this rank in the wait, seconds from rank 0 entering the barrier to this rank leaving)."""
    comm.Barrier()
    cpu0 = _cpu_s()
    if comm.rank == 0:
        time.sleep(hold_s)
    t_enter = time.time()  # one clock for every rank of this node
    wait(comm)
    t_leave = time.time()
    cpu = _cpu_s() - cpu0
    t0 = comm.bcast(t_enter if comm.rank == 0 else None, root=0)  # rank 0's entry, sent after the timing
    return cpu, t_leave - t0


def no_wait(comm: Any, wait: Callable[[Any], None], calls: int) -> float:
    """Microseconds per barrier when every rank enters at once."""
    comm.Barrier()
    t = time.perf_counter()
    for _ in range(calls):
        wait(comm)
    return 1e6 * (time.perf_counter() - t) / calls


def main() -> int:
    from mpi4py import MPI

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hold", type=float, default=3.0, help="seconds rank 0 keeps the others waiting")
    ap.add_argument("--rounds", type=int, default=3, help="held waits per method")
    ap.add_argument("--calls", type=int, default=2000, help="barriers per method in the no-wait part")
    a = ap.parse_args()
    comm = MPI.COMM_WORLD
    if comm.size < 2:
        raise SystemExit("run under mpiexec with at least 2 ranks: mpiexec -n 4 python -m benchmarks.idle_wait")
    methods: dict[str, Callable[[Any], None]] = {"MPI_Barrier (baseline)": lambda c: c.Barrier(),
                                                 "idle_barrier": idle_barrier}
    if comm.rank == 0:
        print(header(describe()), flush=True)
        print(f"# {comm.size} ranks; rank 0 holds the others {a.hold:g} s, {a.rounds} rounds per method, interleaved",
              flush=True)
    cpu: dict[str, list[float]] = {m: [] for m in methods}
    late: dict[str, list[float]] = {m: [] for m in methods}
    for _ in range(a.rounds):
        for name, fn in methods.items():
            c, d = held(comm, fn, a.hold)
            rows = comm.gather((c, d), root=0)
            if comm.rank == 0:
                waiting = rows[1:]
                cpu[name].append(sum(r[0] for r in waiting))
                late[name].append(max(r[1] for r in waiting))
    per_call = {name: no_wait(comm, fn, a.calls) for name, fn in methods.items()}
    per_call = {name: max(comm.allgather(us)) for name, us in per_call.items()}
    if comm.rank == 0:
        base, idle = list(methods)
        for name in methods:
            print(f"{name:<24}: held wait: waiting ranks' CPU {statistics.median(cpu[name]):6.2f} s per "
                  f"{a.hold:g} s wait (rounds {', '.join(f'{x:.2f}' for x in cpu[name])}); released "
                  f"{1e3 * statistics.median(late[name]):6.2f} ms after rank 0 arrived; no wait: "
                  f"{per_call[name]:7.1f} us per barrier")
        ratio = statistics.median(cpu[idle]) / max(statistics.median(cpu[base]), 1e-9)
        print(f"idle / baseline: CPU of the waiting ranks {ratio:.3f}x; release delay "
              f"{1e3 * (statistics.median(late[idle]) - statistics.median(late[base])):+.2f} ms; "
              f"per barrier without a wait {per_call[idle] / per_call[base]:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
