"""Under mpiexec: ``hpcbench stage`` with one rank made to die or hang, injected from the test side.

    mpiexec -n 4 python tests/stage_fault_job.py KIND:RANK:ROUND stage --source ... --dest ...

KIND is ``exit`` (the rank ends at once with status 17, like a crashed node), ``hang`` (it never
returns from its read) or ``stop`` (the whole process gets SIGSTOP, like a frozen node). The fault hits
world rank RANK when its shared-storage reader (``hpcbench.staging.distribute._Reader.read``, called once per
Allgatherv round) reads round ROUND of a split. ``exit-wait`` and ``stop-wait`` hit any rank (a
non-stager too) at its ROUND-th supervised step (``hpcbench.staging.exchange.supervised``: 1 = reading the
manifest, 2 = staging). ``stop-exit`` stops rank RANK after the report was printed, as it enters
``hpcbench.staging.exchange.end_job`` (ROUND is ignored); ``stop-final`` stops it once the job's last barrier
(``roll_call``) passed, before ``MPI_Finalize``; ``stop-gone`` after ``MPI_Finalize`` returned (its peers
are gone: only the rank's watcher, ``hpcbench.staging.guard``, can end it); ``stop-init`` before MPI
starts (its peers wait in ``MPI_Init``). ``stop-deadline`` stops rank RANK as it enters its
ROUND-th blocking call bounded by ``hpcbench.staging.stage``'s ``deadline`` (1 = the manifest's bcast, 2 = the
stagers' Split, 3 = the reports' gather). Every other rank runs the real code. The remaining arguments go to
``hpcbench.cli.main``.
"""
from __future__ import annotations

import os
import signal
import sys
import time

from hpcbench.common.dist import mpi
from hpcbench.cli import main
from hpcbench.staging import distribute
from hpcbench.staging import stage as stage_mod

KINDS = ("exit", "hang", "stop", "exit-wait", "stop-wait", "stop-exit", "stop-final", "stop-gone", "stop-init",
         "stop-deadline")


def _hit(kind: str, rank: int, stage_round: int) -> None:
    sys.stderr.write(f"rank {rank}: injected fault '{kind}' at round {stage_round}\n")
    sys.stderr.flush()
    if kind.startswith("exit"):
        os._exit(17)
    if kind.startswith("stop"):
        os.kill(os.getpid(), signal.SIGSTOP)
    time.sleep(3600)


def parse_fault(spec: str) -> tuple[str, int, int]:
    try:
        kind, rank, stage_round = spec.split(":")
        if kind not in KINDS:
            raise ValueError(kind)
        return kind, int(rank), int(stage_round)
    except ValueError:
        raise SystemExit(f"stage_fault_job.py: fault {spec!r} is not KIND:RANK:ROUND with KIND one of "
                         f"{', '.join(KINDS)}") from None


def _launcher_rank() -> int:
    return int(os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "-1")))


def inject(kind: str, rank: int, stage_round: int) -> None:
    """Wrap the per-round reader (or the supervised steps) so that ``rank`` dies, hangs or stops."""
    if kind == "stop-init":  # before MPI starts (mpi4py is imported, and MPI_Init runs, in init_distributed)
        from hpcbench.common import dist

        real_init = dist.init_distributed

        def init_distributed(*a, **kw):  # noqa: ANN002, ANN003, ANN202
            if _launcher_rank() == rank:
                _hit(kind, rank, stage_round)
            return real_init(*a, **kw)

        dist.init_distributed = init_distributed  # type: ignore[assignment]
        return
    if kind in ("stop-final", "stop-gone"):
        from hpcbench.staging import exchange

        name = "roll_call" if kind == "stop-final" else "_finalize"
        real = getattr(exchange, name)

        def after(*a, **kw):  # noqa: ANN002, ANN003, ANN202
            real(*a, **kw)
            if _launcher_rank() == rank:
                _hit(kind, rank, stage_round)

        setattr(exchange, name, after)
        return
    if kind == "stop-exit":
        from hpcbench.staging import exchange

        real_exit = exchange.end_job

        def end_job(rc: int, timeout_s: float) -> None:
            if mpi().COMM_WORLD.Get_rank() == rank:
                sys.stdout.flush()
                _hit(kind, rank, stage_round)
            real_exit(rc, timeout_s)

        exchange.end_job = end_job  # type: ignore[assignment]
        return
    if kind == "stop-deadline":
        import contextlib

        real_deadline = stage_mod.deadline
        entered = [0]

        @contextlib.contextmanager
        def deadline(*a, **kw):  # noqa: ANN002, ANN003, ANN202
            entered[0] += 1
            if entered[0] == stage_round and mpi().COMM_WORLD.Get_rank() == rank:
                _hit(kind, rank, stage_round)
            with real_deadline(*a, **kw):
                yield

        stage_mod.deadline = deadline  # type: ignore[assignment]
        return
    if kind.endswith("-wait"):
        real_supervised = stage_mod.supervised
        calls = [0]

        def supervised(*a, **kw):  # noqa: ANN002, ANN003, ANN202
            calls[0] += 1
            if calls[0] == stage_round and mpi().COMM_WORLD.Get_rank() == rank:
                _hit(kind, rank, stage_round)
            return real_supervised(*a, **kw)

        stage_mod.supervised = supervised  # type: ignore[assignment]
        return
    real_read = distribute._Reader.read

    def read(self: distribute._Reader, start: int, count: int) -> bytes:
        r = getattr(self, "fault_reads", 0)  # one reader per split, one read per round: the round being read
        self.fault_reads = r + 1  # type: ignore[attr-defined]
        if r == stage_round and mpi().COMM_WORLD.Get_rank() == rank:
            _hit(kind, rank, stage_round)
        return real_read(self, start, count)

    distribute._Reader.read = read  # type: ignore[method-assign]


if __name__ == "__main__":
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    inject(*parse_fault(sys.argv[1]))
    sys.exit(main(sys.argv[2:]))
