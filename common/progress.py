"""What the user sees while instances train.

* ``bar``: a tqdm bar per epoch on the world leader (one instance at an interactive terminal);
* ``lines``: plain lines from each instance's leader, prefixed with the workload and instance: the
  hardware choices at start, one line per epoch (samples, seconds, samples/s, loss), one per
  evaluation (metric against the target), a heartbeat inside an epoch that runs longer than
  ``every_s`` (so a slow machine is never minutes of silence), and the run's end. Lines go to
  stdout, flushed, so ``mpiexec`` and Slurm forward them as they come;
* ``none``.

``auto`` is ``bar`` for a single instance at a terminal and ``lines`` otherwise.
"""
from __future__ import annotations

import os
import sys
import time
from typing import Any, Literal, TextIO

Mode = Literal["auto", "bar", "lines", "none"]
MODES: tuple[str, ...] = ("auto", "bar", "lines", "none")


def resolve_mode(mode: str | bool | None, instances: int) -> str:
    """The effective mode; ``HPCBENCH_PROGRESS=0`` silences everything (tests, batch jobs)."""
    if mode is False or os.environ.get("HPCBENCH_PROGRESS", "1") == "0":
        return "none"
    if mode in (None, True, "auto"):
        return "bar" if instances == 1 and sys.stderr.isatty() else "lines"
    if mode not in MODES:
        raise ValueError(f"progress mode {mode!r}: expected one of {', '.join(MODES)}")
    return str(mode)


class Progress:
    def __init__(self, mode: str, prefix: str, world_leader: bool, instance_leader: bool, every_s: float = 10.0,
                 stream: TextIO | None = None) -> None:
        self.mode = mode
        self.prefix = prefix
        self.every_s = every_s
        self.stream = stream if stream is not None else sys.stdout
        self.bar_on = mode == "bar" and world_leader
        self.lines = mode == "lines" and instance_leader

    def say(self, text: str) -> None:
        if self.lines:
            # one write with its newline: ranks of other instances share the terminal, and a print()
            # that writes the text and the newline apart lets their lines run together
            self.stream.write(f"[{self.prefix}] {text}\n")
            self.stream.flush()

    def epoch(self, epoch: int, steps: int, max_epochs: int) -> "EpochProgress":
        return EpochProgress(self, epoch, steps, max_epochs)


class EpochProgress:
    """One epoch's progress: ``step()`` after each step, ``done()`` at its end."""

    def __init__(self, owner: Progress, epoch: int, steps: int, max_epochs: int) -> None:
        self.owner, self.epoch, self.steps, self.max_epochs = owner, epoch, steps, max_epochs
        self.t0 = self.last = time.perf_counter()
        self.bar: Any = None
        if owner.bar_on:
            from tqdm import tqdm

            self.bar = tqdm(total=steps, desc=f"{owner.prefix} epoch {epoch}", unit="step", file=sys.stderr,
                            leave=False, mininterval=1.0)

    def step(self, done: int, local_samples: int, loss: float | None = None) -> None:
        if self.bar is not None:
            self.bar.update(1)
            if loss is not None:
                self.bar.set_postfix(loss=f"{loss:.4g}")
        elif self.owner.lines:
            now = time.perf_counter()
            if now - self.last >= self.owner.every_s:
                self.last = now
                rate = local_samples / (now - self.t0)
                self.owner.say(f"epoch {self.epoch}/{self.max_epochs}: step {done}/{self.steps}, "
                               f"{rate:.1f} samples/s on this rank so far")

    def done(self, samples: int, seconds: float, loss: float) -> None:
        rate = samples / seconds if seconds > 0 else 0.0
        if self.bar is not None:
            self.bar.set_postfix(loss=f"{loss:.4g}", samples_s=f"{rate:.1f}")
            self.bar.close()
        self.owner.say(f"epoch {self.epoch}/{self.max_epochs}: {samples} samples in {seconds:.1f} s "
                       f"= {rate:.1f} samples/s, train loss {loss:.4g}")
