"""The one training harness every workload runs on.

Public API (stable; the CLI and the multi-instance runner build on it)::

    from hpcbench.common.trainer import run_training, RunResult
    result = run_training(workload, env, mllogger, system)   # -> RunResult

``workload`` is a :class:`hpcbench.common.workload.Workload` built from its config, ``env`` the
:class:`hpcbench.common.dist.DistEnv` of this rank (one torch process group per instance), ``mllogger`` the
instance's :class:`hpcbench.common.mllog.MLPerfLogger` (enabled on instance rank 0 only), ``system`` the
:class:`hpcbench.common.system.SystemDescription`. Every rank of the instance calls it; all return the same
:class:`RunResult`.

What the harness owns, in order: MLPerf ``cache_clear``/``init_start``, submission keys (with
``number_of_nodes`` = nodes of the instance), the run's parts built once (:mod:`hpcbench.common.build`:
the layout object with every process group, the seeded model with fp32 master weights in one flat buffer,
bf16/fp16 autocast and channels-last, optimizer + schedule from ``cfg.optim``, the data shards, the
evaluator), the generic hyperparameters (seed, global_batch_size, train/eval_samples, gradient
accumulation) then the workload's own keys, ``init_stop``/``run_start``, the epoch loop
(``epoch_start/stop``, ``tracked_stats`` throughput per epoch), evaluation at the cadence of
:mod:`hpcbench.common.cadence` (BatchNorm statistics averaged over the instance first; ``eval_start/stop``
and the metric key with ``epoch_num`` in the benchmark's epoch reporting; on dedicated evaluation ranks
with ``train.eval_ranks``, :mod:`hpcbench.common.async_eval`), stop at the first evaluation that meets the
target, inside an epoch too (``run_stop status=success``) or ``aborted`` after ``train.max_epochs``,
checkpoints of the parts every ``train.checkpoint_every`` epochs and resume (``train.resume``;
:mod:`hpcbench.common.checkpoint`), phase timers (data wait, step, eval) and a progress bar on world rank 0.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import time

import torch

from .async_eval import EvalSide, TrainSide, send_stop
from .benchmark import PARAMETERS_KEY
from .build import RunParts, build_parallel, build_parts, parameter_count, resolved_settings
from .cadence import TrainPoint, cadence_of
from .checkpoint import CheckpointManager, instance_dir
from .dist import DistEnv, bounded, idle_barrier
from .errors import ConfigError
from .finite import LossWatch
from .mllog import MLPerfLogger
from .parallel import Parallel
from .parts import DataPosition
from .progress import Progress, resolve_mode
from .result import RunResult, _RunState
from .step import prepare_batch
from .suites import suite
from .system import CACHE_ENV, SystemDescription, cache_cleared, node_accelerators
from .timing import PhaseTimer, now_ms
from .workload import Workload


class Trainer:
    def __init__(self, workload: Workload, env: DistEnv, mllogger: MLPerfLogger, system: SystemDescription,
                 progress: str | bool | None = None) -> None:
        self.workload, self.env, self.log, self.system = workload, env, mllogger, system
        self.cfg = workload.cfg
        self.timer = PhaseTimer()
        layout = env.layout
        self.progress = Progress(resolve_mode(progress, layout.num_instances), f"{workload.name} #{layout.instance}",
                                 layout.is_world_leader, layout.instance_rank == 0)
        self.parallel: Parallel | None = None
        self.parts: RunParts | None = None
        self.evals: TrainSide | None = None  # on the training ranks with train.eval_ranks
        self.checkpoints: CheckpointManager | None = None

    # setup ------------------------------------------------------------------------------------
    def _log_submission(self) -> None:
        layout = self.env.layout
        device = self.env.device if self.env.device is not None else torch.device("cpu")
        gpus = torch.cuda.device_count() if device.type == "cuda" else 0
        accel = node_accelerators(self.system.accelerators_per_node, device.type, gpus, layout.local_size)
        system = dataclasses.replace(self.system, number_of_nodes=layout.nodes_per_instance, accelerators_per_node=accel)
        self.log.submission(system, self.workload.benchmark, self.cfg.train.division)

    def setup(self) -> RunParts:
        """Build the run's parts (collective over the instance); on a training rank also the cadence, the
        checkpoint manager and - with ``train.resume`` - the restored state."""
        tc = self.cfg.train
        self.parallel = build_parallel(self.workload, self.env)
        self.parts = parts = build_parts(self.workload, self.parallel, self.progress)
        if parts.parallel.is_eval:
            return parts
        assert parts.sizes is not None
        self.steps_per_epoch = parts.sizes.steps_per_epoch
        self.cadence = cadence_of(self.workload.record, tc, self.steps_per_epoch)
        self.counted = self.workload.counts_samples_per_step()  # samples summed per step (packed BERT)
        if tc.checkpoint_dir:
            replicated, per_rank, sharded = parts.checkpointed()
            self.checkpoints = CheckpointManager(instance_dir(tc.checkpoint_dir, self.env.layout.instance),
                                                 parts.parallel.comm, replicated, per_rank, sharded,
                                                 resolved_settings(tc))
            if tc.checkpoint_every:
                self.checkpoints.check_writable()
            if not tc.resume:
                self.checkpoints.refuse_used()
            elif self.checkpoints.load_latest() is None and self.env.layout.instance_rank == 0:
                # said on every run (a misspelled folder would otherwise restart training without a word)
                print(f"hpcbench [{self.workload.name} #{self.env.layout.instance}]: train.resume: no checkpoint in "
                      f"{self.checkpoints.root}: starting from the beginning", file=sys.stderr, flush=True)
        self.start_epoch = parts.position.epoch + 1
        if parts.parallel.roles is not None:
            self.evals = TrainSide(parts, parts.parallel.roles, self.log)
        return parts

    def _log_hyperparameters(self, parts: RunParts) -> None:
        tc, sizes = self.cfg.train, parts.sizes
        assert sizes is not None
        self.log.event("seed", parts.seed)
        self.log.event("global_batch_size", tc.global_batch_size)
        self.log.event("train_samples", sizes.train_samples)
        self.log.event("eval_samples", sizes.eval_samples)
        self.log.event(self.workload.record.grad_accum_key or suite(self.workload.suite).grad_accum_key, tc.grad_accum)
        # not an MLPerf key (the checker ignores it): what the schedule and the step count are built on
        self.log.event("steps_per_epoch", sizes.steps_per_epoch)
        hyper = self.workload.hyperparameters()
        self._refuse_closed_differences({**hyper, "global_batch_size": tc.global_batch_size})
        self.log.hyperparameters(hyper)
        # not an MLPerf key (the checker ignores it): the model's size, which the report compares with the
        # benchmark's closed definition (a collective: every training rank counts its shards)
        self.log.event(PARAMETERS_KEY, {"value": parameter_count(self.workload, parts)})
        for c in parts.choices:  # not MLPerf keys (the checker ignores them): what "auto" chose and why
            self.log.event("hpcbench_" + c.key.split(".")[-1], c.log_value())
        # the preset's own target (train.target), which an open-division log's official rules do not set
        self.log.event("hpcbench_target", {"value": self.workload.target().describe()})
        # the suite and ruleset the log is written for (no official key says it; hpcbench report reads it)
        record = self.workload.record
        self.log.event("hpcbench_ruleset", {"value": f"{record.suite} {record.ruleset}"})
        e = tc.eval_ranks
        why = (f"the instance's last {e} rank(s) evaluate while {parts.parallel.size} train" if e
               else "the training ranks evaluate")
        self.log.event("hpcbench_eval_ranks", {"value": e, "requested": e, "reason": why})

    def _refuse_closed_differences(self, values: dict[str, object]) -> None:
        """A closed run whose keys differ from the values the closed rules fix (the record's
        :class:`~hpcbench.common.benchmark.ClosedDefinition`) stops here, before ``run_start``, naming each key: the
        official checker would fail its log (or, for keys it does not test, the report would call it not closed)."""
        closed = self.workload.record.closed
        if self.cfg.train.division != "closed" or closed is None:
            return
        differ = closed.differing(values)
        if differ:
            raise ConfigError(f"the closed division of {self.workload.benchmark} fixes "
                              + "; ".join(f"{k} = {want!r} (this config gives {got!r})" for k, got, want in differ)
                              + f" ({closed.source}); change the config or set train.division = 'open'")

    # loop -------------------------------------------------------------------------------------
    def _log_cache_clear(self) -> None:
        cleared = cache_cleared()
        self.log.event("cache_clear", cleared)
        if not cleared and self.env.layout.is_world_leader:  # once per job, not per instance
            why = (f"{CACHE_ENV}=0 (a rendered job's cache drop failed)" if os.environ.get(CACHE_ENV, "").strip() else
                   f"{CACHE_ENV} is not set (outside a rendered job: set {CACHE_ENV}=1 after dropping the page cache)")
            print(f"[hpcbench] cache_clear logged as false: {why}; a closed-division result needs the cache "
                  "cleared before each run", file=sys.stderr, flush=True)

    def run(self) -> RunResult:
        self._log_cache_clear()
        self.log.start("init_start")
        self._log_submission()
        try:
            parts = self.setup()
        except BaseException:
            par = self.parallel
            if par is not None and par.roles is not None and not par.is_eval and par.rank == 0 and self.evals is None:
                # the evaluation ranks end instead of waiting for jobs; best effort: they may have stopped on the
                # same error already (a config error every rank raises), and then the send fails, which must not
                # replace the error this rank reports
                with contextlib.suppress(Exception):
                    send_stop(par.roles, 0, "aborted")
            raise
        if parts.parallel.is_eval:
            return EvalSide(parts, parts.parallel.roles, self.workload).serve(self.env.layout.instance)
        try:
            self._log_hyperparameters(parts)  # a closed config off the record's fixed values stops here
        except BaseException:
            if self.evals is not None:  # the evaluation ranks end instead of waiting for jobs (best effort, as above)
                with contextlib.suppress(Exception):
                    self.evals.stop("aborted", self.cfg.train.eval_timeout_s)
            raise
        self.log.end("init_stop")
        with bounded("the barrier before run_start"):
            idle_barrier(parts.parallel.comm)  # the training ranks (evaluation ranks serve from here)
        run_start = now_ms()
        self.log.start("run_start", time_ms=run_start)
        with self.timer("data_start"):
            self.workload.start_data()  # e.g. a split decoded into host memory: inside the timed run
        target = self.workload.target()
        result = RunResult(status="aborted", instance=self.env.layout.instance, epochs=0, steps=0,
                           time_to_solution_s=0.0, final_metric=None, metric_key=target.metric_key)
        self._run = _RunState(result, target, run_start)
        try:
            train_seconds, samples_total = self._epochs(parts, result)
            if self.evals is not None and not self._run.diverged:  # a diverged run records no later result
                with self.timer("eval_wait"):
                    self.evals.finish(self.record_metric, result.status, self.cfg.train.eval_timeout_s)
        finally:
            if self.evals is not None:
                self.evals.stop(result.status, self.cfg.train.eval_timeout_s)  # also when training failed
        # right after the evaluation that met the target (and its epoch_stop), or when its result arrived
        run_stop = self._run.stop_ms or now_ms()
        self.log.end("run_stop", metadata={"status": result.status}, time_ms=run_stop)
        result.run_start_ms, result.run_stop_ms = run_start, run_stop
        result.time_to_solution_s = (run_stop - run_start) / 1000.0
        result.samples_per_s = samples_total / train_seconds if train_seconds > 0 else 0.0
        result.timers = self.timer.summary()
        self.progress.say(f"run_stop: {result.status} after {result.epochs} epoch(s) in {result.time_to_solution_s:.1f} s, "
                          f"{result.samples_per_s:.1f} samples/s")
        return result

    def _epochs(self, parts: RunParts, result: RunResult) -> tuple[float, int]:
        """The epoch loop from the data position; (training seconds, training samples)."""
        train_seconds, samples_total = 0.0, 0
        tc, pos = self.cfg.train, parts.position
        assert parts.optimizer is not None
        t = self.timer
        for epoch in range(self.start_epoch, tc.max_epochs + 1):
            wait0, step0, steps0 = t.totals.get("data_wait", 0.0), t.totals.get("step", 0.0), t.counts.get("step", 0)
            seconds, samples, loss = self.train_epoch(parts, epoch)
            result.epoch_phases.append({"epoch": epoch, "seconds": seconds, "steps": t.counts.get("step", 0) - steps0,
                                        "data_wait_s": t.totals.get("data_wait", 0.0) - wait0,
                                        "step_s": t.totals.get("step", 0.0) - step0})
            train_seconds += seconds
            samples_total += samples
            result.epochs = epoch
            result.steps = int(parts.optimizer.step_count.item() - parts.optimizer.step_origin)
            result.epoch_losses.append(loss)
            if result.status == "success" or self._run.diverged:  # met (or diverged) inside the epoch: ends there
                break
            if self.max_steps_reached(pos.global_step):  # the run ends here, evaluated unless it just was
                if self.cadence.final and self._run.evaluated_at != pos.global_step:
                    self._evaluate_at(parts, self._last_point)
                break
            pos.epoch = epoch
            if self.checkpoints is not None and tc.checkpoint_every and epoch % tc.checkpoint_every == 0:
                self.checkpoints.save(epoch)
            if self.cadence.at_epoch_end(epoch) and self._run.evaluated_at != pos.global_step:
                end = dataclasses.replace(self._last_point, step=self.steps_per_epoch)
                if self._evaluate_at(parts, end):
                    break
        return train_seconds, samples_total

    def max_steps_reached(self, global_step: int) -> bool:
        """``train.max_steps`` optimizer steps done (the reference BERT's ``max_steps``; 0: no limit)."""
        limit = self.cfg.train.max_steps
        return bool(limit) and global_step >= limit

    def _counted(self, pos: DataPosition) -> int | None:
        return pos.samples if self.counted else None

    def _evaluate_at(self, parts: RunParts, p: TrainPoint) -> bool:
        """Evaluate at ``p``, record and report it; True when the target is met (the run stops there).
        With dedicated evaluation ranks the weights are sent and the result comes later (False)."""
        epoch_num = self.cadence.epoch_num(p)
        self._run.evaluated_at = p.global_step
        if self.evals is not None:
            with self.timer("eval_send"):
                self.evals.submit(p.epoch, epoch_num)
            return False
        value = self.evaluate(p.epoch, epoch_num)
        where = f"epoch {p.epoch}/{self.cfg.train.max_epochs}"
        if p.step < self.steps_per_epoch:
            where += f" step {p.step}/{self.steps_per_epoch}"
        if self.cadence.within_epoch:
            where += f" ({self.cadence.samples(p)} samples)"
        return self.record_metric(epoch_num, value, where)

    def record_metric(self, epoch_num: int | float, value: float, where: str, arrived_ms: float | None = None) -> bool:
        """Keep and report one evaluation's metric; True (status success) when it meets the target.
        ``arrived_ms``: when a dedicated evaluation rank's result arrived (the run stops at that time)."""
        run = self._run
        run.result.metrics.append((epoch_num, value))
        run.result.final_metric = value
        reached = run.target.reached(value)
        at = arrived_ms if arrived_ms is not None else now_ms()
        self.progress.say(f"{where}: {run.target.metric_key} {value:.4g} "
                          f"({'reached' if reached else 'target'} {run.target.describe()}) "
                          f"at {(at - run.start_ms) / 1000:.1f} s")
        if reached:
            run.result.status = "success"
            run.stop_ms = arrived_ms
        elif self.workload.diverged(value):  # the reference's own stop (3D U-Net: mean Dice < 1e-6), aborted
            run.diverged = True
            self.progress.say(f"{where}: {run.target.metric_key} {value:.4g}: the model diverged (the reference's "
                              f"rule for {self.workload.benchmark}); the run stops, aborted")
            return True
        return reached

    def train_epoch(self, parts: RunParts, epoch: int) -> tuple[float, int, float]:
        """One epoch, with the cadence's evaluations inside it; (training seconds without those
        evaluations, samples over the instance, mean loss on this rank). An evaluation that meets the
        target ends the epoch there (``epoch_stop`` then marks the cut)."""
        cad, pos, tc = self.cadence, parts.position, self.cfg.train
        assert parts.train_loader is not None and parts.step is not None
        steps_per_epoch = self.steps_per_epoch
        self.log.start("epoch_start", metadata={"epoch_num": cad.epoch_marker(epoch, pos.global_step,
                                                                              self._counted(pos))})
        t0 = time.perf_counter()
        eval_seconds = 0.0
        parts.model.train()
        parts.train_loader.set_epoch(epoch)
        device = parts.parallel.device
        loss_sum = torch.zeros((), device=device)
        watch = LossWatch(device)  # read back only where the loop reads the loss anyway (common.finite)
        first_step = pos.global_step

        def check_finite() -> None:
            watch.check(parts.parallel.comm, parts.parallel.rank, self.workload.name, epoch, steps_per_epoch,
                        first_step)

        local_samples = steps = 0
        par = parts.parallel
        self._last_point = TrainPoint(epoch, 0, pos.global_step, self._counted(pos))
        bar = self.progress.epoch(epoch, steps_per_epoch, tc.max_epochs)
        it = iter(parts.train_loader)
        while steps < steps_per_epoch:
            t_data = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                break
            batch = prepare_batch(batch, device, tc.channels_last)
            t_step = time.perf_counter()
            self.timer.add("data_wait", t_step - t_data)
            loss = parts.step(batch)
            loss_sum += loss
            self.timer.add("step", time.perf_counter() - t_step)
            in_batch = self.workload.batch_size(batch)
            local_samples += in_batch
            steps += 1
            pos.global_step += 1
            step_samples = 0
            if self.counted:  # this step's samples over the instance (ranks sharing samples count them once)
                with bounded("the step's sample count (MPI allreduce)"):
                    step_samples = int(par.comm.allreduce(in_batch)) * par.dp_size // par.size
                pos.samples += step_samples
            watch.observe(loss, steps)
            log_loss = tc.log_every and steps % tc.log_every == 0
            if log_loss:
                check_finite()
            bar.step(steps, local_samples, float(loss_sum) / steps if log_loss else None)
            point = self._last_point = TrainPoint(epoch, steps, pos.global_step, self._counted(pos), step_samples)
            if cad.within_epoch and cad.after_step(point):
                check_finite()  # never evaluate (or stop at the target) with NaN weights
                t_eval = time.perf_counter()
                reached = self._evaluate_at(parts, point)
                eval_seconds += time.perf_counter() - t_eval
                if reached:
                    break
            if self.evals is not None and self.evals.poll(self.record_metric):
                break  # a dedicated evaluation rank's result met the target
            if self.max_steps_reached(pos.global_step):
                break
        mean_loss = float(loss_sum) / max(1, steps)  # read back once per epoch
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0 - eval_seconds
        with bounded("the epoch's sample count (MPI allreduce)"):
            samples = int(par.comm.allreduce(local_samples)) * par.dp_size // par.size  # shared ones once
        self.log.end("epoch_stop", metadata={"epoch_num": cad.epoch_marker(epoch, pos.global_step,
                                                                           self._counted(pos))})
        check_finite()  # before a NaN reaches tracked_stats, the checkpoint or the evaluation
        self.log.event("tracked_stats", {"throughput": samples / seconds, "train_loss": mean_loss},
                       metadata={"step": epoch})
        bar.done(samples, seconds, mean_loss)
        return seconds, samples, mean_loss

    def evaluate(self, epoch: int, epoch_num: int | float | None = None) -> float:
        """Metric over the whole eval set (BatchNorm statistics averaged over the instance first), logged.
        ``epoch_num``: what the log reports (default: ``epoch``; see :mod:`hpcbench.common.cadence`)."""
        assert self.parts is not None
        if epoch_num is None:
            epoch_num = epoch
        with self.timer("eval"):
            self.parts.parallel.average_buffers(self.parts.model)
            self.log.start("eval_start", metadata={"epoch_num": epoch_num})
            average = self.parts.average
            with average.applied() if average is not None else contextlib.nullcontext():
                value = self.parts.evaluator.metric(epoch)
            self.log.end("eval_stop", metadata={"epoch_num": epoch_num})
            meta: dict[str, int | float] = {"epoch_num": epoch_num}
            if self.workload.record.epoch_reporting == "samples":  # the training 6.0 LLMs' checks want it by name
                meta["samples_count"] = epoch_num
            self.log.event(self.workload.metric_key, value, metadata=meta)
        return value


def run_training(workload: Workload, env: DistEnv, mllogger: MLPerfLogger, system: SystemDescription,
                 progress: str | bool | None = None) -> RunResult:
    """Train ``workload`` on this instance to its target (or max epochs); see the module docstring.
    Where the data is (shared, or node-local with ``data.node_local``) is the data layer's concern."""
    return Trainer(workload, env, mllogger, system, progress).run()


__all__ = ["RunResult", "Trainer", "run_training"]
