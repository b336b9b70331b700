"""`hpcbench report` scores OpenFold like the other HPC benchmarks: strong scaling (olympic mean of 10 runs, the
closed ones checked against the record's closed definition) and weak scaling (models per minute), on logs in the
real MLLOG format carrying what the workload logs (its full preset's keys; avg lDDT-Ca as eval_accuracy with
epoch_num in samples), and agreeing with the official compliance checker and result summarizer."""
from __future__ import annotations

from pathlib import Path

import pytest

from hpcbench import registry
from hpcbench.common.benchmark import PARAMETERS_KEY
from hpcbench.common.mllog import MLPerfLogger, result_filename
from hpcbench.common.system import SystemDescription
from hpcbench.common.workload import DataSizes
from hpcbench.report.build import build
from mllog_synth import T0_MS

BATCH = 256
EVERY = 40 * BATCH  # samples between evaluations (val_every_iters 40)


def _keys() -> dict[str, object]:
    cls = registry.get("openfold")
    w = cls(cls.load_config("full"))
    w.sizes = DataSizes(train_samples=594_595, eval_samples=180, steps_per_epoch=2322, local_batch_size=1)
    return {**w.hyperparameters(), PARAMETERS_KEY: {"value": 93_229_082}}


def _log(path: Path, start_s: float, duration_s: float, evals: int, final: float, status: str, division: str,
         keys: dict[str, object], seed: int, nodes: int = 1) -> None:
    sysd = SystemDescription(system_name="box", number_of_nodes=nodes, accelerators_per_node=4)
    log = MLPerfLogger(path)
    t = T0_MS + start_s * 1000.0
    log.event("cache_clear", True, time_ms=t - 1001)
    log.start("init_start", time_ms=t - 1000)
    log.submission(sysd, "openfold", division)
    for key, value in (("seed", seed), ("global_batch_size", BATCH), ("train_samples", 594_595),
                       ("eval_samples", 180)):
        log.event(key, value, time_ms=t - 2)
    log.hyperparameters(keys)
    log.end("init_stop", time_ms=t - 1)
    log.start("run_start", time_ms=t)
    log.start("epoch_start", metadata={"epoch_num": 0}, time_ms=t)
    per = duration_s * 1000.0 / evals
    for k in range(1, evals + 1):
        at, samples = t + k * per, k * EVERY
        log.start("eval_start", metadata={"epoch_num": samples}, time_ms=at - 0.1 * per)
        log.end("eval_stop", metadata={"epoch_num": samples}, time_ms=at - 0.01 * per)
        log.event("eval_accuracy", final - 0.01 * (evals - k), metadata={"epoch_num": samples, "samples_count": samples},
                  time_ms=at - 0.01 * per)
    log.end("epoch_stop", metadata={"epoch_num": evals * EVERY}, time_ms=t + duration_s * 1000.0)
    log.end("run_stop", metadata={"status": status}, time_ms=t + duration_s * 1000.0)
    log.close()


def _folder(root: Path, mode: str, division: str, runs: list[tuple[float, float, float, str]],
            keys: dict[str, object], nodes: int = 1) -> Path:
    folder = root / "results" / "box" / mode / "openfold"
    for k, (start, duration, final, status) in enumerate(runs):
        _log(folder / result_filename(k), start, duration, 15, final, status, division, keys, seed=k + 1, nodes=nodes)
    total = nodes * len(runs) if mode == "weak" else nodes
    SystemDescription(system_name="box", number_of_nodes=total, division=division,
                      framework="PyTorch").write(root / "systems" / "box.json")
    return folder


def test_strong_scaling_closed_openfold_is_scored_and_closed_ready(tmp_path: Path) -> None:
    """Ten closed runs with the full preset's keys: every official tool passes them, the olympic mean of the
    ten (fastest and slowest dropped) is the summarizer's, and each log is closed-ready (parameters, the
    dataset's counts, every fixed value of closed_openfold.yaml); one non-converged run is the dropped one."""
    times = [450.0, 470.0, 455.0, 500.0, 480.0, 465.0, 490.0, 475.0, 460.0, 485.0]
    runs = [(i * 1000.0, t, 0.805, "success") for i, t in enumerate(times)]
    _folder(tmp_path, "strong", "closed", runs, _keys())
    (g,) = build(tmp_path, None).groups
    assert g.official is not None and all(ok for ok, _ in g.official.compliance.values()), g.official.compliance
    assert g.score.score_min == pytest.approx(sum(sorted(times)[1:-1]) / 8 / 60.0)  # fastest and slowest dropped
    assert g.official.score_min == pytest.approx(g.score.score_min)
    assert not g.disagreements, g.disagreements
    assert g.score.closed and not g.score.not_closed_ready
    assert g.verdict.valid, g.verdict.failures
    runs[4] = (4000.0, 520.0, 0.78, "aborted")  # never reached 0.8
    _folder(tmp_path / "one_failed", "strong", "closed", runs, _keys())
    (g,) = build(tmp_path / "one_failed", None).groups
    ok = sorted(t for i, t in enumerate(times) if i != 4)
    assert g.score.score_min == pytest.approx(sum(ok[1:]) / 8 / 60.0)  # the failure is the dropped slowest
    assert g.official.score_min == pytest.approx(g.score.score_min) and not g.disagreements


def test_weak_scaling_openfold_instances_are_models_per_minute(tmp_path: Path) -> None:
    """Two concurrent instances of 2 nodes each (the open division, hpcbench run's shape): M' = 2 converged
    models, TTTa from the first start to the last stop, models per minute; the official summarizer wants 10
    converged openfold models and produces no score, which the report states rather than disagrees with."""
    runs = [(0.0, 300.0, 0.81, "success"), (5.0, 355.0, 0.82, "success")]
    _folder(tmp_path, "weak", "open", runs, {}, nodes=2)
    (g,) = build(tmp_path, None).groups
    s = g.score
    assert (s.M, s.M_prime) == (2, 2)
    assert s.ttta_min == pytest.approx(360.0 / 60.0) and s.models_per_min == pytest.approx(2 / 6.0)
    assert g.official is not None and all(ok for ok, _ in g.official.compliance.values())
    assert not g.official.produced and "Not enough converging weak scaling runs" in g.official.why_none
    assert not g.disagreements
    _folder(tmp_path / "one_failed", "weak", "open", [runs[0], (5.0, 355.0, 0.7, "aborted")], {}, nodes=2)
    (g,) = build(tmp_path / "one_failed", None).groups
    assert (g.score.M, g.score.M_prime) == (2, 1)
    assert g.official.compliance["result_1.txt"][0] is False  # open_openfold.yaml: eval_accuracy >= 0.8 once
