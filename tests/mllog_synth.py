"""Hand-made MLPerf HPC logs in the real format (written by common.mllog.MLPerfLogger with explicit
timestamps), so the report can be tested without training anything."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hpcbench import registry
from hpcbench.common.benchmark import PARAMETERS_KEY
from hpcbench.common.mllog import MLPerfLogger, result_filename
from hpcbench.common.system import SystemDescription

COSMOFLOW_HPARAMS = {
    "opt_name": "sgd", "opt_base_learning_rate": 0.001, "opt_learning_rate_warmup_epochs": 0,
    "opt_learning_rate_warmup_factor": 1.0, "opt_learning_rate_decay_boundary_epochs": [8],
    "opt_learning_rate_decay_factor": 0.1, "dropout": 0.0, "opt_weight_decay": 0.0,
}


@dataclass
class SynthRun:
    start_s: float  # run_start, seconds after t0
    duration_s: float  # run_stop - run_start
    epochs: int = 3
    status: str = "success"
    seed: int = 1
    nodes: int = 1
    staging_s: float = 0.0
    train_samples: int = 64
    final_error: float = 0.1  # eval_error of the last epoch (cosmoflow: target <= 0.124)


T0_MS = 1_700_000_000_000.0


def closed_ready(benchmark: str) -> dict[str, object]:
    """What a log needs beyond the synthetic defaults to be closed-ready by the benchmark's closed definition
    (its record): the real dataset's sample counts, the model's parameter count and the fixed hyperparameters."""
    c = registry.entry(benchmark).closed
    assert c is not None
    keys: dict[str, object] = {PARAMETERS_KEY: {"value": c.parameters[0]}, **c.fixed}
    if c.train_samples is not None:
        keys["train_samples"] = c.train_samples
    if c.eval_samples is not None:
        keys["eval_samples"] = c.eval_samples
    return keys


def _samples_and_rest(batch: int, run_samples: int, eval_samples: int,
                      extra: dict[str, object]) -> tuple[list[tuple[str, object]], dict[str, object]]:
    """(global_batch_size, train_samples and eval_samples, taken from ``extra`` where it has them; the rest
    of ``extra``)."""
    rest = dict(extra)
    counts = [("global_batch_size", rest.pop("global_batch_size", batch)),
              ("train_samples", rest.pop("train_samples", run_samples)),
              ("eval_samples", rest.pop("eval_samples", eval_samples))]
    return counts, rest


def write_log(path: Path, run: SynthRun, benchmark: str = "cosmoflow", system: str = "testbox",
              division: str = "open", extra: dict[str, object] | None = None) -> Path:
    """One instance's MLLOG file. Epochs share the run evenly; eval after each epoch. ``extra``: keys logged
    after (or instead of) the defaults, e.g. :func:`closed_ready`."""
    sysd = SystemDescription(system_name=system, number_of_nodes=run.nodes, accelerators_per_node=0)
    log = MLPerfLogger(path)
    t = T0_MS + run.start_s * 1000.0
    setup_ms = 1000.0 + run.staging_s * 1000.0
    t_init = t - setup_ms
    log.event("cache_clear", True, time_ms=t_init - 1)
    log.start("init_start", time_ms=t_init)
    log.submission(sysd, benchmark, division)
    if run.staging_s:
        log.start("staging_start", time_ms=t_init + 100)
        log.end("staging_stop", metadata={"staging_duration": run.staging_s}, time_ms=t_init + 100 + run.staging_s * 1000)
    log.event("seed", run.seed, time_ms=t - 2)
    counts, rest = _samples_and_rest(8, run.train_samples, 16, extra or {})
    for key, value in counts:
        log.event(key, value, time_ms=t - 2)
    log.hyperparameters({**COSMOFLOW_HPARAMS, **rest})
    log.end("init_stop", time_ms=t - 1)
    _timed_run(log, t, run, "eval_error", lambda e: run.final_error * (1 + 0.5 * (run.epochs - e)))
    log.end("run_stop", metadata={"status": run.status}, time_ms=t + run.duration_s * 1000.0)
    log.close()
    return path


def write_benchmark(root: Path, mode: str, runs: list[SynthRun], benchmark: str = "cosmoflow",
                    system: str = "testbox", division: str = "open", extra: dict[str, object] | None = None) -> Path:
    """root/results/<system>/<mode>/<benchmark>/result_<k>.txt and root/systems/<system>.json."""
    folder = root / "results" / system / mode / benchmark
    for k, run in enumerate(runs):
        write_log(folder / result_filename(k), run, benchmark, system, division, extra)
    nodes = sum(r.nodes for r in runs) if mode == "weak" else max(r.nodes for r in runs)
    SystemDescription(system_name=system, number_of_nodes=nodes, division=division,
                      framework="PyTorch").write(root / "systems" / f"{system}.json")
    return folder


DLRM_HPARAMS = {
    "opt_name": "adagrad", "opt_base_learning_rate": 0.005, "opt_adagrad_learning_rate_decay": 0.0,
    "opt_weight_decay": 0.0, "opt_adagrad_initial_accumulator_value": 0.0, "opt_adagrad_epsilon": 1e-8,
    "opt_learning_rate_warmup_steps": 0, "opt_learning_rate_decay_start_step": 0, "opt_learning_rate_decay_steps": 0,
}
DLRM_EVAL_SAMPLES = 89_137_319  # closed training 5.1.0 pins it


UNET3D_HPARAMS = {
    "opt_name": "sgd", "opt_base_learning_rate": 2.0, "opt_learning_rate_warmup_epochs": 200,
    "opt_learning_rate_decay_boundary_epochs": [], "opt_learning_rate_decay_factor": 1.0, "opt_weight_decay": 0.0,
    "opt_momentum": 0.9, "oversampling": 0.4, "training_input_shape": [128, 128, 128],
    "validation_input_shape": [128, 128, 128], "validation_overlap": 0.5,
}


@dataclass(frozen=True)
class TrainingBench:
    """What a synthetic log of one training-suite benchmark carries: its key, the sample counts its
    closed rules pin, and its hyperparameter keys."""

    benchmark: str
    eval_samples: int
    hparams: dict[str, object]
    global_batch_size: int


DLRM = TrainingBench("dlrm_dcnv2", DLRM_EVAL_SAMPLES, DLRM_HPARAMS, 65536)
UNET3D = TrainingBench("unet3d", 42, UNET3D_HPARAMS, 7)  # closed training 4.0.0 pins 168 train / 42 eval


def write_training_log(path: Path, run: SynthRun, final_metric: float, division: str = "open",
                       system: str = "testbox", bench: TrainingBench = DLRM,
                       extra: dict[str, object] | None = None) -> Path:
    """One run's log of a training-suite benchmark with the keys its ruleset requires
    (gradient_accumulation_steps, the opt_* keys, eval_accuracy with epoch_num); ``run.status``
    "incomplete" leaves out run_stop."""
    sysd = SystemDescription(system_name=system, number_of_nodes=run.nodes, accelerators_per_node=0)
    log = MLPerfLogger(path)
    t = T0_MS + run.start_s * 1000.0
    log.event("cache_clear", True, time_ms=t - 1001)
    log.start("init_start", time_ms=t - 1000)
    log.submission(sysd, bench.benchmark, division)
    counts, rest = _samples_and_rest(bench.global_batch_size, run.train_samples, bench.eval_samples, extra or {})
    for key, value in (("seed", run.seed), *counts,
                       ("gradient_accumulation_steps", 1)):
        log.event(key, value, time_ms=t - 2)
    log.hyperparameters({**bench.hparams, **rest})
    log.end("init_stop", time_ms=t - 1)
    _timed_run(log, t, run, "eval_accuracy", lambda e: final_metric - 0.01 * (run.epochs - e))
    if run.status != "incomplete":
        log.end("run_stop", metadata={"status": run.status}, time_ms=t + run.duration_s * 1000.0)
    log.close()
    return path


def write_training_benchmark(root: Path, runs: list[SynthRun], metrics: list[float], division: str = "open",
                             system: str = "testbox", bench: TrainingBench = DLRM,
                             extra: dict[str, object] | None = None) -> Path:
    """root/results/<system>/<benchmark>/result_<k>.txt (the training layout) and root/systems/<system>.json."""
    folder = root / "results" / system / bench.benchmark
    for k, (run, value) in enumerate(zip(runs, metrics)):
        write_training_log(folder / result_filename(k), run, value, division, system, bench, extra)
    SystemDescription(system_name=system, number_of_nodes=max(r.nodes for r in runs), division=division,
                      framework="PyTorch").write(root / "systems" / f"{system}.json")
    return folder


def _timed_run(log: MLPerfLogger, t: float, run: SynthRun, metric: str, value_at: Callable[[int], float]) -> None:
    """run_start at ``t``, then the epochs sharing ``run.duration_s`` evenly, each with an eval of
    ``metric`` = ``value_at(epoch)``."""
    log.start("run_start", time_ms=t)
    per_epoch = run.duration_s * 1000.0 / run.epochs
    for e in range(1, run.epochs + 1):
        e0 = t + (e - 1) * per_epoch
        log.start("epoch_start", metadata={"epoch_num": e}, time_ms=e0)
        log.end("epoch_stop", metadata={"epoch_num": e}, time_ms=e0 + 0.8 * per_epoch)
        log.start("eval_start", metadata={"epoch_num": e}, time_ms=e0 + 0.8 * per_epoch)
        log.event(metric, value_at(e), metadata={"epoch_num": e}, time_ms=e0 + 0.99 * per_epoch)
        log.end("eval_stop", metadata={"epoch_num": e}, time_ms=e0 + 0.99 * per_epoch)
