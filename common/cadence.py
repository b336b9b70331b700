"""When the harness evaluates, and how a log reports how far training has got (``epoch_num``).

Three cadences (``train.eval_every``, ``train.eval_every_samples``):

* whole epochs (``eval_every`` = 1, 2, ...): after every ``eval_every``-th epoch, as MLPerf HPC does;
* a fraction of an epoch (``eval_every`` < 1): after every ``max(1, floor(eval_every * steps))``-th
  step of each epoch, the step counter restarting with the epoch as the reference DLRM counts its
  iterations (0.05 with 64,013 steps: steps 3,200, 6,400, ..., 64,000);
* samples (``eval_every_samples`` = N > 0): after the step at which the instance's training samples
  since the run's start (steps x global batch, or the samples counted per step where a workload's batches
  hold a varying number of them: packed BERT counts sequences, :attr:`TrainPoint.samples`) cross a
  multiple of N, as the reference BERT evaluates (N rounded up to the step that passes it); or, where the
  record says ``samples_cadence = "steps"``, every ``CEILING(N / global_batch)`` steps of the run, as the
  reference Llama 3.1 8B evaluates (``eval_every_n_batches = ceil(eval_every / gbs)``): the two differ where
  the global batch does not divide N (12,288 at batch 1,152: steps 11, 22, 32 against 11, 22, 33).

With whole epochs, ``train.eval_offset = k`` (``0 <= k < eval_every``) moves the evaluations to the epochs
``k, k + N, k + 2N, ...`` (``k = 0``: ``N, 2N, ...``), MLPerf ResNet's "every 4 epochs with offset 0, 1,
2 or 3". ``train.eval_start = S`` (> 0) evaluates the epochs ``S, S + N, S + 2N, ...`` only, as the
reference 3D U-Net's ``start_eval_at``/``evaluate_every``.

A record may fix the whole-epoch cadence of a closed run from the samples per epoch
(``Benchmark.closed_eval``, :class:`ClosedEvalEpochs`; 3D U-Net: from epoch
``CEILING(1000 x 168 / samples_per_epoch)``, then every ``CEILING(20 x 168 / samples_per_epoch)``): a closed
config must name those epochs (``train.eval_start``, ``train.eval_every``), else :func:`cadence_of` refuses it;
with a non-convergence limit (3D U-Net: ``CEILING(10000 x 168 / samples_per_epoch)`` epochs) its
``train.max_epochs`` may not pass that limit.

The end of the run's last epoch is evaluated too, off the cadence if need be (a run ends with a metric),
except in a closed run of a benchmark whose record says ``closed_cadence_only`` (ResNet: the rules'
cadence, nothing else; :attr:`EvalCadence.final`). Every decision is made from step counters only, so all
ranks of an instance evaluate together without talking.

``epoch_num`` (the MLPerf rules' "epoch reporting", per benchmark; ``Benchmark.epoch_reporting`` of the record, :mod:`hpcbench.common.benchmark`):
``epoch`` = whole epochs (a fraction only for an evaluation inside an epoch), ``fraction`` = epochs
as a float (DLRM: 0.05, 0.1, ...), ``samples`` = training samples seen (BERT, an integer).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .errors import ConfigError

if TYPE_CHECKING:
    from .benchmark import Benchmark
    from .runconfig import TrainConfig

REPORTING: tuple[str, ...] = ("epoch", "fraction", "samples")
SAMPLES_CADENCE: tuple[str, ...] = ("crossing", "steps")  # Benchmark.samples_cadence


@dataclass(frozen=True)
class TrainPoint:
    """Where training is: epoch (1-based), steps done in it, steps done in the run."""

    epoch: int
    step: int  # steps done in this epoch
    global_step: int  # steps done since the run's first step (resumed runs count the skipped epochs)
    # the rules' training samples seen since the run's start, where a workload counts them per step
    # (packed BERT: sequences, a varying number per step; Workload.counts_samples_per_step); None: steps x
    # global batch
    samples: int | None = None
    step_samples: int = 0  # with ``samples``: how many of them the last step brought


@dataclass(frozen=True)
class ClosedEvalEpochs:
    """A rules' whole-epoch cadence computed from the samples per epoch: the first evaluation after epoch
    ``CEILING(start x dataset / samples_per_epoch)``, then every ``CEILING(every x dataset / samples_per_epoch)``
    epochs, where ``samples_per_epoch = CEILING(dataset / global_batch) x global_batch`` (an uneven last batch
    counted as padded; ``training_rules.adoc``, the evaluation-frequency table, U-Net3D)."""

    start: int  # in epochs of ``dataset`` samples
    every: int
    dataset: int  # training samples per epoch the rule is written for (3D U-Net: 168)
    # > 0: a run that has not met the target after CEILING(limit x dataset / samples_per_epoch) epochs is
    # non-converged (3D U-Net: 10000; training_rules.adoc, benchmark-specific rules): a closed run's
    # train.max_epochs may not pass it (a run that met the target later would be logged as converged);
    # the full preset stops exactly there (run_stop aborted)
    limit: int = 0

    def samples_per_epoch(self, global_batch: int) -> int:
        return -(-self.dataset // global_batch) * global_batch

    def at(self, global_batch: int) -> tuple[int, int]:
        """``(first evaluated epoch, epochs between evaluations)`` at ``global_batch``."""
        spe = self.samples_per_epoch(global_batch)
        return -(-self.start * self.dataset // spe), -(-self.every * self.dataset // spe)

    def max_epochs(self, global_batch: int) -> int:
        """The non-convergence limit in epochs at ``global_batch`` (0: the rule sets none)."""
        return -(-self.limit * self.dataset // self.samples_per_epoch(global_batch)) if self.limit else 0


@dataclass(frozen=True)
class EvalCadence:
    every_epochs: int  # > 0: whole-epoch cadence
    every_steps: int  # > 0: every this many steps of an epoch (fraction cadence)
    every_samples: int  # > 0: samples cadence
    steps_per_epoch: int
    global_batch: int
    max_epochs: int
    reporting: str
    offset: int = 0  # whole-epoch cadence: evaluate the epochs e with e % every_epochs == offset
    final: bool = True  # also evaluate the end of the run's last epoch when the cadence does not
    start: int = 0  # whole-epoch cadence, > 0: evaluate the epochs start, start + every_epochs, ... only
    # samples cadence: True = every CEILING(every_samples / global_batch) steps of the run (Llama 3.1 8B);
    # False = after the step whose samples cross a multiple of every_samples (BERT)
    samples_in_steps: bool = False

    @classmethod
    def from_config(cls, eval_every: float, eval_every_samples: int, steps_per_epoch: int, global_batch: int,
                    max_epochs: int, reporting: str, offset: int = 0, final: bool = True,
                    start: int = 0, samples_cadence: str = "crossing") -> EvalCadence:
        if reporting not in REPORTING:
            raise ConfigError(f"epoch reporting {reporting!r}: expected one of {', '.join(REPORTING)}")
        if samples_cadence not in SAMPLES_CADENCE:
            raise ConfigError(f"samples cadence {samples_cadence!r}: expected one of {', '.join(SAMPLES_CADENCE)}")
        every_epochs = every_steps = 0
        if eval_every_samples <= 0:
            if eval_every >= 1:
                every_epochs = int(eval_every)
            else:
                every_steps = max(1, int(eval_every * steps_per_epoch))
        if offset and not (every_epochs and 0 <= offset < every_epochs):
            raise ConfigError(f"config key 'train.eval_offset': must be in [0, train.eval_every) with a whole-epoch "
                              f"cadence, got {offset} (eval_every {eval_every:g}, eval_every_samples "
                              f"{eval_every_samples})")
        if start and not (every_epochs and not offset and start > 0):
            raise ConfigError(f"config key 'train.eval_start': applies to a whole-epoch cadence without "
                              f"train.eval_offset, got {start} (eval_every {eval_every:g}, eval_every_samples "
                              f"{eval_every_samples}, eval_offset {offset})")
        return cls(every_epochs, every_steps, max(0, eval_every_samples), steps_per_epoch, global_batch,
                   max_epochs, reporting, offset, final, start, samples_cadence == "steps")

    @property
    def samples_step(self) -> int:
        """Steps between evaluations of a step-rounded samples cadence: CEILING(every_samples / global_batch)."""
        return max(1, -(-self.every_samples // max(1, self.global_batch)))

    @property
    def within_epoch(self) -> bool:
        """True when evaluations may fall inside an epoch."""
        return self.every_epochs == 0

    def after_step(self, p: TrainPoint) -> bool:
        """Evaluate after the step that brought training to ``p``?"""
        if self.every_steps:
            return p.step % self.every_steps == 0
        if self.every_samples and self.samples_in_steps:
            return p.global_step % self.samples_step == 0
        if self.every_samples:
            n, now = self.every_samples, self.samples(p)
            before = now - (p.step_samples if p.samples is not None else self.global_batch)
            return now // n > before // n
        return False

    def at_epoch_end(self, epoch: int) -> bool:
        """Evaluate at the end of ``epoch`` (when the last step did not already)?"""
        last = self.final and epoch == self.max_epochs
        if self.every_epochs and self.start:
            return (epoch >= self.start and (epoch - self.start) % self.every_epochs == 0) or last
        if self.every_epochs:
            return epoch % self.every_epochs == self.offset or last
        return last

    def epochs(self) -> list[int]:
        """The epochs whose end is evaluated over a whole run (``[]`` for a cadence inside epochs)."""
        if self.within_epoch:
            return [self.max_epochs] if self.final else []
        return [e for e in range(1, self.max_epochs + 1) if self.at_epoch_end(e)]

    def samples(self, p: TrainPoint) -> int:
        """Training samples seen at ``p``: counted ones where the workload counts them, else steps x batch."""
        return p.samples if p.samples is not None else p.global_step * self.global_batch

    def epoch_num(self, p: TrainPoint) -> int | float:
        """``epoch_num`` of an evaluation (or run_stop) at ``p``, in the benchmark's reporting."""
        if self.reporting == "samples":
            return self.samples(p)
        if p.step >= self.steps_per_epoch and self.reporting == "epoch":
            return p.epoch
        return round(p.epoch - 1 + p.step / max(1, self.steps_per_epoch), 6)

    def epoch_marker(self, epoch: int, global_step: int, samples: int | None = None) -> int:
        """``epoch_num`` of ``epoch_start``/``epoch_stop``: the epoch's number, or for samples reporting
        the samples seen when the epoch starts or stops (``samples`` where they are counted)."""
        if self.reporting == "samples":
            return samples if samples is not None else global_step * self.global_batch
        return epoch


def cadence_of(record: Benchmark, train: TrainConfig, steps_per_epoch: int) -> EvalCadence:
    """The cadence of a run of ``record``'s benchmark with the ``train`` section: a closed run of a benchmark
    whose record sets ``closed_cadence_only`` evaluates on the cadence only (no extra evaluation at the end);
    a closed run of a benchmark whose record sets ``closed_eval`` must name that rule's epochs."""
    closed = train.division == "closed"
    final = not (closed and record.closed_cadence_only)
    rule = record.closed_eval if closed else None
    if rule is not None:
        start, every = rule.at(train.global_batch_size)
        ours = (train.eval_start, train.eval_every, train.eval_offset, train.eval_every_samples)
        if ours != (start, every, 0, 0):
            raise ConfigError(
                f"config keys 'train.eval_start' and 'train.eval_every': the closed division of {record.benchmark} "
                f"evaluates from epoch CEILING({rule.start} x {rule.dataset} / samples_per_epoch) = {start}, then "
                f"every CEILING({rule.every} x {rule.dataset} / samples_per_epoch) = {every} epochs (samples_per_epoch "
                f"{rule.samples_per_epoch(train.global_batch_size)} at global batch {train.global_batch_size}); got "
                f"eval_start {train.eval_start}, eval_every {train.eval_every:g}, eval_offset {train.eval_offset}, "
                f"eval_every_samples {train.eval_every_samples}. Set train.eval_start={start} "
                f"train.eval_every={every}, or use the open division")
        limit = rule.max_epochs(train.global_batch_size)
        if limit and train.max_epochs > limit:
            raise ConfigError(
                f"config key 'train.max_epochs': the closed division of {record.benchmark} classifies a run as "
                f"non-converged when the target is not reached within CEILING({rule.limit} x {rule.dataset} / "
                f"samples_per_epoch) = {limit} epochs (samples_per_epoch "
                f"{rule.samples_per_epoch(train.global_batch_size)} at global batch {train.global_batch_size}); "
                f"got {train.max_epochs}, past the limit. Set train.max_epochs={limit} (the full preset's), or use "
                "the open division")
    return EvalCadence.from_config(train.eval_every, train.eval_every_samples, steps_per_epoch,
                                   train.global_batch_size, train.max_epochs, record.epoch_reporting,
                                   train.eval_offset, final, train.eval_start, record.samples_cadence)
