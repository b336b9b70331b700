"""``hpcbench.staging.exchange.deadline`` under real mpiexec (2 ranks): a watchdog that fired on a call
that then returned must not leave two errors behind.

Seen in CI (2026-11-28, a loaded box): ``hpcbench stage --dataset deepcam`` on a cosmoflow pack with
``--timeout 3``; rank 0's ``init_distributed`` returned a hair after 3 s, its watchdog thread aborted the job
("no progress for 3s while setting up MPI") while its main thread went on and printed the real error
(the manifest's dataset): two errors, the wrong one first. Each case below orders the two threads with
events, not sleeps, so it holds on any load.
"""
from __future__ import annotations

import pytest

from tests.conftest import run_mpi

JOB = r"""
import sys, threading, time
from mpi4py import MPI
from hpcbench.staging import exchange

case = sys.argv[1]
world = MPI.COMM_WORLD
asked, committed = threading.Event(), threading.Event()
real_silent, real_commit = exchange.silent_ranks, exchange.Watch.commit

def silent_ranks(*a, **kw):  # the watchdog asks who is alive: hold it there until the call returned
    asked.set()
    if case == "late":
        returned.wait(60)
    return real_silent(*a, **kw)

def commit(self):
    out = real_commit(self)
    committed.set()
    return out

exchange.silent_ranks = silent_ranks
exchange.Watch.commit = commit
returned = threading.Event()
if world.Get_rank() == 0:
    with exchange.deadline(1.0, "a call under test"):
        if case == "fast":
            pass
        elif case == "late":
            asked.wait(60)  # the watchdog fired and asks the peers ...
        elif case == "after-commit":
            committed.wait(60)  # the watchdog committed to aborting ...
        else:  # stuck
            time.sleep(60)
    returned.set()  # ... and the call returns
    time.sleep(0.3)  # a watchdog that stood down has finished its abort() by now
    print("rank 0 went on", flush=True)
exchange.barrier(world, 30.0, "the end of the test job")
print(f"rank {world.Get_rank()} done", flush=True)
"""


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("deadline") / "deadline_job.py"
    path.write_text(JOB)
    return str(path)


@pytest.mark.parametrize("case", ["fast", "late"])
def test_a_call_that_returns_before_the_watchdog_commits_goes_on_quietly(job: str, case: str) -> None:
    proc = run_mpi(2, [job, case], timeout=120)
    assert "rank 0 went on" in proc.stdout and "rank 1 done" in proc.stdout and "rank 0 done" in proc.stdout
    assert "no progress" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("case", ["after-commit", "stuck"])
def test_a_committed_watchdog_ends_the_job_with_one_error_and_nothing_after_it(job: str, case: str) -> None:
    proc = run_mpi(2, [job, case], timeout=120, check=False)
    assert proc.returncode != 0
    assert proc.stderr.count("hpcbench stage: error:") == 1, proc.stderr
    assert "rank 0: no progress for 1s while a call under test" in proc.stderr
    assert "went on" not in proc.stdout and "done" not in proc.stdout, proc.stdout
