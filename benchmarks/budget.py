"""A benchmark's time budget (``--budget-s``) and its running output.

A benchmark prints each measurement when it is made and bounds its whole run by a budget: repeats
adapt to how slow a step is here, and what the budget does not reach is skipped *and said* (on the
screen and in the JSON), never dropped silently. One indivisible piece (a single warm-up step, a
single subprocess) can overrun; its subprocesses get the time that is left as their timeout.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from collections.abc import Callable
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def mpiexec() -> str:
    """The launcher of the environment the benchmark runs in (the mpich wheel's, next to the interpreter),
    else the one on PATH."""
    beside = Path(sys.executable).parent / "mpiexec"
    return str(beside) if beside.exists() else "mpiexec"


def one_thread_rank_env(**extra: str) -> dict[str, str]:
    """Environment of ranks launched by a benchmark: the project importable and one torch/OpenMP thread
    per rank (a rank stands for one device; N ranks use N cores)."""
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HPCBENCH_TORCH_THREADS": "1", **extra}


def say(text: str) -> None:
    """Print now: a benchmark's output must not wait in a pipe buffer until the end."""
    print(text, flush=True)


def best_seconds(fn: Callable[[], object], rounds: int) -> float:
    """The least wall time of ``rounds`` calls of ``fn``."""
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def add_budget_argument(parser: argparse.ArgumentParser, default: float) -> None:
    parser.add_argument("--budget-s", type=float, default=default,
                        help=f"seconds for the whole run (default {default:g}): repeats adapt to it and what it "
                             "does not reach is reported as skipped")


class Budget:
    def __init__(self, seconds: float) -> None:
        if seconds <= 0:
            raise SystemExit(f"--budget-s must be > 0 seconds, got {seconds:g}")
        self.seconds, self.start = seconds, time.monotonic()
        self.skipped: list[str] = []

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def left(self) -> float:
        return self.seconds - self.elapsed()

    def spent(self) -> bool:
        return self.left() <= 0

    def fit(self, each_s: float, wanted: int, share: float = 1.0) -> int:
        """How many of ``wanted`` repeats of ``each_s`` seconds fit in ``share`` of the time left
        (at least 1: a measurement that was started gets one sample)."""
        room = max(0.0, self.left() * share)
        return max(1, min(wanted, int(room / max(each_s, 1e-9))))

    def skip(self, what: str) -> None:
        """Record and say that ``what`` was not measured because the budget was spent."""
        self.skipped.append(what)
        say(f"SKIPPED {what}: --budget-s {self.seconds:g} spent ({self.elapsed():.0f} s elapsed)")

    def timeout(self, cap: float) -> float:
        """A subprocess's timeout: the time left (at least a few seconds), at most ``cap``."""
        return max(5.0, min(cap, self.left()))

    def summary(self) -> dict[str, Any]:
        return {"budget_s": self.seconds, "elapsed_s": round(self.elapsed(), 1), "skipped": list(self.skipped)}

    def stop_together(self, step: int, steps: int, pair_s: float, rank: int) -> bool:
        """In a multi-rank benchmark (torch.distributed up): stop before step ``step`` of ``steps`` when
        one more round (``pair_s`` seconds) no longer fits. Rank 0's clock decides and is broadcast, so
        every rank stops at the same step; at least two steps always run."""
        import torch
        import torch.distributed as dist

        stop = torch.tensor(int(step > 1 and self.left() < pair_s))
        dist.broadcast(stop, 0)
        if stop.item() and rank == 0:
            self.skip(f"steps {step}-{steps} of {steps} (one round needs ~{pair_s:.1f} s)")
        return bool(stop.item())

    def done(self) -> None:
        say(f"# done in {self.elapsed():.1f} s of --budget-s {self.seconds:g}; skipped: "
            + ("; ".join(self.skipped) if self.skipped else "nothing"))
