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
``number_of_nodes`` = nodes of the instance), seeding (``train.seed + instance``), model build and
precision/layout (fp32 master weights in one flat buffer, bf16/fp16 autocast, channels-last),
optimizer + schedule from ``cfg.optim``, data shards (global batch split over the instance's ranks),
the generic hyperparameters (seed, global_batch_size, train/eval_samples,
gradient_accumulation_frequency) then the workload's own keys, ``init_stop``/``run_start``, the epoch
loop (``epoch_start/stop``, ``tracked_stats`` throughput per epoch), evaluation at the cadence of
:mod:`hpcbench.common.cadence` (every ``train.eval_every`` epochs, a fraction of an epoch, or every
``train.eval_every_samples``; BatchNorm statistics averaged over the instance first; additive eval
sums reduced over the instance; ``eval_start/stop`` and the metric key with ``epoch_num`` in the
benchmark's epoch reporting), stop at the first evaluation that meets the target, inside an epoch
too (``run_stop status=success``) or ``aborted`` after
``train.max_epochs``, checkpoints every ``train.checkpoint_every`` epochs and resume
(``train.resume``), phase timers (data wait, step, eval) and a progress bar on world rank 0.
"""
from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from . import checkpoint as ckpt
from .dist import DistEnv
from .errors import ConfigError, HpcbenchError
from .flat import FlatParams
from .mllog import MLPerfLogger
from .progress import Progress, resolve_mode
from .optim import build_optimizer
from .auto import Choice, autocast_loss, choose_channels_last, choose_precision, has_conv_weights, probe_channels_last
from .precision import Precision, module_to_channels_last
from .schedule import Schedule
from .step import TrainStep, prepare_batch
from .system import SystemDescription
from .timing import PhaseTimer, now_ms
from .data.instance import InstanceData, agree, reader_group
from .suites import suite
from .cadence import EvalCadence, TrainPoint
from .async_eval import EvalSide, Roles, TrainSide, check_eval_ranks, send_stop, split_ranks
from .workload import DataShard, DataSizes, Workload
from .result import RunResult, _RunState
from .batchnorm import group_batchnorm, sync_batchnorm_stats  # noqa: F401 - re-exported


def _broadcast_model(model: nn.Module, flat: FlatParams, world: int) -> None:
    """Rank 0's parameters and buffers to the instance (the model-parallel part stays each rank's own)."""
    if world <= 1:
        return
    dist.broadcast(flat.params[: flat.shared_size] if flat.has_local else flat.params, 0)
    for b in model.buffers():
        dist.broadcast(b, 0)


class Trainer:
    def __init__(self, workload: Workload, env: DistEnv, mllogger: MLPerfLogger, system: SystemDescription,
                 progress: str | bool | None = None) -> None:
        self.workload, self.env, self.log, self.system = workload, env, mllogger, system
        self.cfg = workload.cfg
        self.world = env.layout.instance_size  # ranks that train together (the training part with eval_ranks)
        self.rank = env.layout.instance_rank
        # the whole instance, also when train.eval_ranks splits it (self.env then holds this rank's part)
        self.instance_comm, self.instance_rank = env.instance_comm, env.layout.instance_rank
        self.roles: Roles | None = None  # with train.eval_ranks: this rank's part
        self.evals: TrainSide | None = None  # on the training ranks with train.eval_ranks
        self.device = env.device if env.device is not None else torch.device("cpu")
        self.timer = PhaseTimer()
        layout = env.layout
        mode = resolve_mode(progress, layout.num_instances)
        self.progress = Progress(mode, f"{workload.name} #{layout.instance}", layout.is_world_leader,
                                 layout.instance_rank == 0)

    # setup ------------------------------------------------------------------------------------
    def _log_submission(self) -> None:
        layout = self.env.layout
        accel = self.system.accelerators_per_node
        if accel == 0 and self.device.type == "cuda":
            accel = min(torch.cuda.device_count(), layout.local_size)
        system = dataclasses.replace(self.system, number_of_nodes=layout.nodes_per_instance, accelerators_per_node=accel)
        self.log.submission(system, self.workload.benchmark, self.cfg.train.division)

    def setup(self) -> None:
        cfg, tc = self.cfg, self.cfg.train
        if tc.eval_ranks:
            self._split_eval_ranks()
        train_world = self.roles.train_size if self.roles else self.world
        # ranks that share samples (spatial parallelism) count once here: the batch splits over the others
        self.dp_world = self.workload.data_parallel_shard(0, train_world)[1]
        if self.roles is not None and self.dp_world != train_world:
            raise ConfigError(f"config key 'train.eval_ranks': {self.workload.name} shares each sample over "
                              f"{train_world // self.dp_world} ranks (spatial parallelism), which the evaluation "
                              "ranks do not do; set train.eval_ranks = 0 or the spatial group to 1")
        if tc.global_batch_size % self.dp_world:
            what = "data-parallel training ranks" if self.roles else "data-parallel ranks"
            raise ConfigError(f"config key 'train.global_batch_size': {tc.global_batch_size} does not split over "
                              f"the instance's {self.dp_world} {what}; use a multiple of {self.dp_world}")
        self.local_batch = tc.global_batch_size // self.dp_world
        self.seed = tc.seed + self.env.layout.instance
        torch.manual_seed(self.seed)
        model = self.workload.build_model()
        if tc.bn_group_size > 1:
            model = group_batchnorm(model, tc.bn_group_size, self.world, self.device)
        model = model.to(self.device)
        self._choose_for_hardware(model)
        if tc.channels_last:
            model = module_to_channels_last(model)
        model = self.workload.distribute(model, self.rank, self.world)
        self.model = model
        self.sharded = cfg.optim.name == "lamb" and cfg.optim.distributed
        self.flat = FlatParams(model, self.workload.local_parameters(model), self.workload.sparse_parameters(model))
        if (self.flat.has_local or self.flat.outside) and tc.checkpoint_dir:
            raise ConfigError("config key 'train.checkpoint_dir': checkpoints hold rank 0's flat buffer, and this "
                              f"model keeps parameters on each rank or outside it ({self.workload.name}'s "
                              "model-parallel or sparse-gradient part); leave it empty")
        if self.roles is not None:
            parallel = bool(self.flat.has_local or self.flat.outside)
            if any(self.instance_comm.allgather(parallel)):
                raise ConfigError(f"config key 'train.eval_ranks': {self.workload.name}'s model keeps parameters on "
                                  "each rank or outside the flat buffer (model-parallel or sparse-gradient part), "
                                  "which the evaluation ranks cannot receive; set it to 0")
        _broadcast_model(model, self.flat, self.world)
        self.precision = Precision(tc.precision, self.device, self.world)
        if self.roles is not None and self.roles.is_eval:
            return  # the evaluation ranks load their data in async_eval.EvalSide.serve
        torch.manual_seed(self.seed * 1000 + self.rank)  # per-rank randomness (dropout) from here on
        self.optimizer = build_optimizer(self.flat, cfg.optim, self.world, self.rank,
                                         allow_apex=tc.precision != "fp16",
                                         decay_exempt=[self.workload.no_weight_decay(n) for n in self.flat.names])
        self.data = self._data()
        self.train_loader, self.eval_loader = self.data.train, self.data.eval
        self.steps_per_epoch = self.data.steps_per_epoch
        self.train_samples, self.eval_samples = self.data.train_samples, self.data.eval_samples
        self.workload.sizes = DataSizes(self.train_samples, self.eval_samples, self.steps_per_epoch, self.local_batch)
        self.schedule = Schedule.from_config(cfg.optim, self.steps_per_epoch, tc.max_epochs)
        self.step_fn = TrainStep(self.workload, model, self.flat, self.optimizer, self.schedule,
                                 self.precision, tc.graph, world=self.world)
        self.cadence = EvalCadence.from_config(tc.eval_every, tc.eval_every_samples, self.steps_per_epoch,
                                               tc.global_batch_size, tc.max_epochs,
                                               self.workload.record.epoch_reporting)
        self.start_epoch = 1
        self.ckpt_dir = ckpt.instance_dir(tc.checkpoint_dir, self.env.layout.instance) if tc.checkpoint_dir else None
        if tc.resume and self.ckpt_dir is not None:
            done = ckpt.load_latest(self.ckpt_dir, self)
            if done is not None:
                self.start_epoch = done + 1
        self.global_step = (self.start_epoch - 1) * self.steps_per_epoch  # checkpoints are at epoch ends
        if self.roles is not None:
            self.evals = TrainSide(self, self.roles)

    def _split_eval_ranks(self) -> None:
        """``train.eval_ranks``: this rank's part of the instance becomes ``self.env`` (:mod:`hpcbench.common.async_eval`)."""
        lay, tc = self.env.layout, self.cfg.train
        check_eval_ranks(tc.eval_ranks, lay.instance_size, self._node_local(), lay.nodes_per_instance)
        self.env, self.roles = split_ranks(self.env, tc.eval_ranks)
        self.world, self.rank = self.env.layout.instance_size, self.env.layout.instance_rank

    def setup_eval_data(self) -> None:
        """On an evaluation rank: its part of the validation split, in the training ranks' local batch."""
        shard = DataShard(rank=self.rank, size=self.world, seed=self.seed, local_batch_size=self.local_batch,
                          device=self.device, host_ranks=self.env.layout.host_local_size)
        self.eval_loader = self.workload.eval_loader(shard)
        train, evaluate = self.workload.dataset_sizes()
        self.train_samples, self.eval_samples = train, evaluate
        self.workload.sizes = DataSizes(train, evaluate, 0, self.local_batch)

    def _choose_for_hardware(self, model: nn.Module) -> None:
        """Resolve ``train.precision``/``train.channels_last`` = "auto" (:mod:`hpcbench.common.auto`): rank 0 of
        the instance decides, the others take its choice, so the instance's ranks agree. The config
        then holds the resolved values and the dataset spec lays batches out accordingly."""
        tc = self.cfg.train
        choices = None
        if self.instance_rank == 0:  # the whole instance's rank 0 (a training rank), also with eval_ranks
            prec = choose_precision(tc.precision, self.device)
            probe = None
            if tc.channels_last == "auto" and self.device.type == "cpu" and has_conv_weights(model):
                probe = lambda: self._probe_layouts(model, prec.value)  # noqa: E731
            choices = [prec, choose_channels_last(tc.channels_last, self.device, model, prec.value, probe)]
        self.choices: list[Choice] = self.instance_comm.bcast(choices, root=0)
        tc.precision, tc.channels_last = self.choices[0].value, self.choices[1].value
        spec = self._spec()
        if spec is not None and hasattr(spec, "channels_last"):
            spec.channels_last = tc.channels_last
        if self.instance_rank == 0:
            for c in self.choices:
                if self.progress.lines:
                    self.progress.say(c.describe())
                elif "WARNING" in c.reason and self.env.layout.instance == 0:
                    print(f"hpcbench: {c.describe()}", file=sys.stderr, flush=True)

    def _spec(self) -> Any:
        try:
            return self.workload.dataset()
        except HpcbenchError:
            return None  # a workload with its own loaders (no dataset spec)

    def _probe_layouts(self, model: nn.Module, precision: str) -> tuple[float, float]:
        """Time the model's forward + backward on one real training batch in both layouts."""
        spec = self._spec()
        if spec is None:
            return (0.0, 0.0)  # nothing to measure on: the default layout is kept (gain 0)
        source = self.workload.source(spec.train_split)
        n = max(1, min(len(source), self.local_batch))
        batch = prepare_batch(spec.transform(spec.read_batch(source, range(n))), self.device, False)
        wl = self.workload
        loss = autocast_loss(lambda m, b: wl.loss(wl.forward(m, b), b), precision, self.device)
        return probe_channels_last(model, batch, loss)

    def _node_local(self) -> bool:
        """Whether each node holds only its part of the data (``data.node_local``, set by node-local staging)."""
        if not getattr(getattr(self.cfg, "data", None), "node_local", False):
            return False
        spec = self._spec()
        # every node was given the whole dataset: the instance's ranks split it once
        return not (spec is not None and spec.layout.whole_on_every_node)

    def _data(self) -> InstanceData:
        """Loaders and sizes of the instance's data (:mod:`hpcbench.common.data.instance`)."""
        group = reader_group(self.env, self._node_local())
        dp_rank, dp_size = self.workload.data_parallel_shard(group.rank, group.size)
        shard = DataShard(rank=dp_rank, size=dp_size, seed=self.seed,
                          local_batch_size=self.local_batch, device=self.device,
                          host_ranks=self.env.layout.host_local_size)

        def build() -> tuple[Any, Any, tuple[int, int]]:
            return (self.workload.train_loader(shard), self.workload.eval_loader(shard),
                    self.workload.dataset_sizes())

        return agree(self.env, group, build)

    def _log_hyperparameters(self) -> None:
        tc = self.cfg.train
        self.log.event("seed", self.seed)
        self.log.event("global_batch_size", tc.global_batch_size)
        self.log.event("train_samples", self.train_samples)
        self.log.event("eval_samples", self.eval_samples)
        self.log.event(suite(self.workload.suite).grad_accum_key, 1)
        # not an MLPerf key (the checker ignores it): what the schedule and the step count are built on
        self.log.event("steps_per_epoch", self.steps_per_epoch)
        self.log.hyperparameters(self.workload.hyperparameters())

    # loop -------------------------------------------------------------------------------------
    def run(self) -> RunResult:
        self.log.event("cache_clear", True)
        self.log.start("init_start")
        self._log_submission()
        try:
            self.setup()
        except BaseException:
            if self.roles is not None and not self.roles.is_eval and self.rank == 0 and self.evals is None:
                send_stop(self.roles, 0, "aborted")  # the evaluation ranks end instead of waiting for jobs
            raise
        if self.roles is not None and self.roles.is_eval:
            return EvalSide(self, self.roles).serve(self)
        self._log_hyperparameters()
        for c in self.choices:  # not MLPerf keys (the checker ignores them): what "auto" chose and why
            self.log.event("hpcbench_" + c.key.split(".")[-1], c.log_value())
        # the preset's own target (train.target), which an open-division log's official rules do not set
        self.log.event("hpcbench_target", {"value": self.workload.target().describe()})
        self.log.event("hpcbench_eval_ranks", self._eval_ranks_setting())
        self.log.end("init_stop")
        self.env.instance_comm.Barrier()
        run_start = now_ms()
        self.log.start("run_start", time_ms=run_start)
        target = self.workload.target()
        result = RunResult(status="aborted", instance=self.env.layout.instance, epochs=0, steps=0,
                           time_to_solution_s=0.0, final_metric=None, metric_key=target.metric_key)
        self._run = _RunState(result, target, run_start)
        try:
            train_seconds, samples_total = self._epochs(result)
            if self.evals is not None:
                with self.timer("eval_wait"):
                    self.evals.finish(self, result.status)
        finally:
            if self.evals is not None:
                self.evals.stop(self, result.status)  # also when training failed: the evaluators end
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

    def _epochs(self, result: RunResult) -> tuple[float, int]:
        """The epoch loop; (training seconds, training samples)."""
        train_seconds, samples_total = 0.0, 0
        tc = self.cfg.train
        for epoch in range(self.start_epoch, tc.max_epochs + 1):
            seconds, samples, loss = self._train_epoch(epoch)
            train_seconds += seconds
            samples_total += samples
            result.epochs, result.steps = epoch, int(self.optimizer.step_count.item())
            result.epoch_losses.append(loss)
            if result.status == "success":  # met inside the epoch: time to train ends at that evaluation
                break
            if self.ckpt_dir is not None and tc.checkpoint_every and epoch % tc.checkpoint_every == 0:
                ckpt.save(self.ckpt_dir, epoch, self)
            if self.cadence.at_epoch_end(epoch) and self._run.evaluated_at != self.global_step:
                if self._evaluate_at(TrainPoint(epoch, self.steps_per_epoch, self.global_step)):
                    break
        return train_seconds, samples_total

    def _eval_ranks_setting(self) -> dict[str, Any]:
        """``hpcbench_eval_ranks`` (the hpcbench_* settings pattern: value, requested, reason)."""
        e = self.cfg.train.eval_ranks
        why = (f"the instance's last {e} rank(s) evaluate while {self.world} train" if e
               else "the training ranks evaluate")
        return {"value": e, "requested": e, "reason": why}

    def _evaluate_at(self, p: TrainPoint) -> bool:
        """Evaluate at ``p``, record and report it; True when the target is met (the run stops there).
        With dedicated evaluation ranks the weights are sent and the result comes later (False)."""
        epoch_num = self.cadence.epoch_num(p)
        self._run.evaluated_at = p.global_step
        if self.evals is not None:
            with self.timer("eval_send"):
                self.evals.submit(self, p.epoch, epoch_num)
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
        return reached

    def _train_epoch(self, epoch: int) -> tuple[float, int, float]:
        """One epoch, with the cadence's evaluations inside it; (training seconds without those
        evaluations, samples over the instance, mean loss on this rank). An evaluation that meets the
        target ends the epoch there (``epoch_stop`` then marks the cut)."""
        cad = self.cadence
        self.log.start("epoch_start", metadata={"epoch_num": cad.epoch_marker(epoch, self.global_step)})
        t0 = time.perf_counter()
        eval_seconds = 0.0
        self.model.train()
        self.train_loader.set_epoch(epoch)
        loss_sum = torch.zeros((), device=self.device)
        local_samples = steps = 0
        bar = self.progress.epoch(epoch, self.steps_per_epoch, self.cfg.train.max_epochs)
        it = iter(self.train_loader)
        while steps < self.steps_per_epoch:
            t_data = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                break
            batch = prepare_batch(batch, self.device, self.cfg.train.channels_last)
            t_step = time.perf_counter()
            self.timer.add("data_wait", t_step - t_data)
            loss_sum += self.step_fn(batch)
            self.timer.add("step", time.perf_counter() - t_step)
            local_samples += self.workload.batch_size(batch)
            steps += 1
            self.global_step += 1
            log_loss = self.cfg.train.log_every and steps % self.cfg.train.log_every == 0
            bar.step(steps, local_samples, float(loss_sum) / steps if log_loss else None)
            point = TrainPoint(epoch, steps, self.global_step)
            if cad.within_epoch and cad.after_step(point):
                t_eval = time.perf_counter()
                reached = self._evaluate_at(point)
                eval_seconds += time.perf_counter() - t_eval
                if reached:
                    break
            if self.evals is not None and self.evals.poll(self):
                break  # a dedicated evaluation rank's result met the target
        mean_loss = float(loss_sum) / max(1, steps)  # read back once per epoch
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0 - eval_seconds
        samples = int(self.env.instance_comm.allreduce(local_samples)) * self.dp_world // self.world  # shared ones once
        self.log.end("epoch_stop", metadata={"epoch_num": cad.epoch_marker(epoch, self.global_step)})
        self.log.event("tracked_stats", {"throughput": samples / seconds, "train_loss": mean_loss},
                       metadata={"step": epoch})
        bar.done(samples, seconds, mean_loss)
        return seconds, samples, mean_loss

    @torch.no_grad()
    def _no_grad_eval(self, batch: Any) -> Any:
        return self._eval_batch(batch)

    def _eval_batch(self, batch: Any) -> Any:
        return self.workload.eval_sums(self._eval_forward(batch), batch)

    def _eval_forward(self, batch: Any) -> Any:
        with self.precision.autocast():
            return self.workload.forward(self.model, batch)

    def _eval_batches(self) -> Iterator[Any]:
        """The instance's eval batches, on the device in the run's layout."""
        for batch in self.eval_loader:
            yield prepare_batch(batch, self.device, self.cfg.train.channels_last)

    def _eval_sums(self) -> float:
        """Additive statistics per rank, summed over the instance, then ``metric``."""
        sums: dict[str, torch.Tensor] = {}
        run = self._eval_batch if self.workload.eval_needs_grad else self._no_grad_eval
        for batch in self._eval_batches():
            for k, v in run(batch).items():
                v = torch.as_tensor(v).detach().to(self.device, torch.float64).sum()
                sums[k] = sums[k] + v if k in sums else v
        keys = sorted(set().union(*self.env.instance_comm.allgather(sorted(sums))))
        packed = torch.stack([sums.get(k, torch.zeros((), dtype=torch.float64, device=self.device)) for k in keys])
        if self.world > 1:
            dist.all_reduce(packed)
        return float(self.workload.metric(dict(zip(keys, packed.tolist()))))

    def _eval_samples(self) -> float:
        """Every eval sample's outputs kept on its rank; the workload's metric combines the instance's."""
        kept: dict[str, list[torch.Tensor]] = {}
        grad = torch.enable_grad() if self.workload.eval_needs_grad else torch.no_grad()
        with grad:
            for batch in self._eval_batches():
                for k, v in self.workload.eval_samples(self._eval_forward(batch), batch).items():
                    kept.setdefault(k, []).append(v.detach())
        return float(self.workload.metric_of_samples({k: torch.cat(v) for k, v in kept.items()}, self.world))

    def evaluate(self, epoch: int, epoch_num: int | float | None = None) -> float:
        """Metric over the whole eval set: sums per rank, summed over the instance, then ``metric``.
        ``epoch_num``: what the log reports (default: ``epoch``; see :mod:`hpcbench.common.cadence`)."""
        if epoch_num is None:
            epoch_num = epoch
        with self.timer("eval"):
            sync_batchnorm_stats(self.model, self.world)
            self.log.start("eval_start", metadata={"epoch_num": epoch_num})
            value = self.metric_value(epoch)
            self.log.end("eval_stop", metadata={"epoch_num": epoch_num})
            self.log.event(self.workload.metric_key, value, metadata={"epoch_num": epoch_num})
        return value

    def metric_value(self, epoch: int) -> float:
        """The metric of the model as it is, over the whole eval set split over ``self.world`` ranks (the
        instance, or the dedicated evaluation ranks); no logging, BatchNorm statistics as they are."""
        self.model.eval()
        self.eval_loader.set_epoch(epoch)
        value = self._eval_samples() if self.workload.eval_kind == "samples" else self._eval_sums()
        self.model.train()
        return value


def run_training(workload: Workload, env: DistEnv, mllogger: MLPerfLogger, system: SystemDescription,
                 progress: str | bool | None = None) -> RunResult:
    """Train ``workload`` on this instance to its target (or max epochs); see the module docstring.
    Where the data is (shared, or node-local with ``data.node_local``) is the data layer's concern."""
    return Trainer(workload, env, mllogger, system, progress).run()
