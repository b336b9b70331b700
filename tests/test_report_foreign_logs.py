"""Logs written by other submitters' code, in the shapes found in published MLPerf HPC v3.0 and training
v4.0 results (the logs here are small synthetic ones of the same shape, not the published files):

- NVIDIA's and HPE's CosmoFlow keep training and evaluating after run_stop (the evaluation that met the
  target comes just before run_stop); the official checker passes them and the summarizer scores them by
  run_start/run_stop, so the records after run_stop are not used (a note), not a rejection;
- NVIDIA's resnet nests epoch_start/epoch_stop inside block_start/block_stop: each epoch counts once;
- NVIDIA's openfold logs its seed as a string of digits, which the official seed checker reads with int().
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcbench.report.build import build
from hpcbench.report.logs import parse_log
from hpcbench.report.scoring import shared_seeds
from mllog_synth import T0_MS, SynthRun, write_benchmark, write_log

TIMES = [300, 320, 310, 350, 330]


def _rec(key: str, t: float, value: object = None, event: str = "POINT_IN_TIME", **meta: object) -> str:
    return ":::MLLOG " + json.dumps({"namespace": "", "time_ms": t, "event_type": event, "key": key,
                                     "value": value, "metadata": meta}) + "\n"


def _stop_ms(path: Path) -> float:
    return next(json.loads(ln.split(":::MLLOG ", 1)[1])["time_ms"] for ln in path.read_text().splitlines()
                if '"key": "run_stop"' in ln)


def _train_on(path: Path, errors: list[float], first_epoch: int = 4) -> None:
    """Append epochs (training, evaluation, tracked_stats) logged after run_stop, as NVIDIA's CosmoFlow does."""
    t = _stop_ms(path)
    out = []
    for i, err in enumerate(errors):
        e, t0 = first_epoch + i, t + i * 5000.0 + 1.0
        out += [_rec("epoch_start", t0, event="INTERVAL_START", epoch_num=e),
                _rec("epoch_stop", t0 + 4000, event="INTERVAL_END", epoch_num=e),
                _rec("tracked_stats", t0 + 4000, {"throughput": 9999.0}, step=e),
                _rec("eval_start", t0 + 4000, event="INTERVAL_START", epoch_num=e),
                _rec("eval_error", t0 + 4900, err, epoch_num=e),
                _rec("eval_stop", t0 + 4900, event="INTERVAL_END", epoch_num=e)]
    with path.open("a") as f:
        f.writelines(out)


def test_training_after_run_stop_is_not_used_and_the_log_is_scored(tmp_path: Path) -> None:
    log = write_log(tmp_path / "result_0.txt", SynthRun(0.0, 300.0, epochs=3, final_error=0.12))
    _train_on(log, [0.19, 0.19, 0.11, 0.19])  # a later evaluation even meets the target again: not used
    run = parse_log(log)
    assert not run.rejections, run.rejections  # was: "eval_start is after run_stop"
    assert run.converged and run.outcome == "success"
    assert run.time_to_solution_s == pytest.approx(300.0)
    assert run.epochs == 3  # was 7: the epochs after run_stop counted
    assert [e.value for e in run.metrics][-1] == pytest.approx(0.12)  # the last evaluation of the timed run
    assert all(tp != 9999.0 for tp, _ in run.tracked_throughput)
    assert run.after_stop == 24
    assert any("24 record(s) after run_stop not used" in p for p in run.problems), run.problems


def test_strong_folder_trained_on_after_run_stop_agrees_with_the_summarizer(tmp_path: Path) -> None:
    """NVIDIA eos_n64 strong cosmoflow: 10/10 rejected and no score; the official summarizer's 2.098442."""
    folder = write_benchmark(tmp_path, "strong", [SynthRun(i * 1000.0, TIMES[i] + i, seed=i) for i in range(5)])
    for k in range(5):
        _train_on(folder / f"result_{k}.txt", [0.2, 0.2])
    (g,) = build(tmp_path, None).groups
    assert not g.score.rejected, g.score.rejected
    ok = sorted(TIMES[i] + i for i in range(5))
    assert g.score.score_min == pytest.approx(sum(ok[1:-1]) / 3 / 60.0)
    assert g.official is not None and g.official.produced
    assert g.score.score_min == pytest.approx(g.official.score_min, abs=1e-6)
    assert not g.disagreements, g.disagreements
    assert any("5 log(s) keep training or evaluating after run_stop" in n for n in g.score.notes), g.score.notes
    assert all(r.epochs == 3 for r in g.score.runs)


def test_weak_instances_trained_on_after_run_stop_are_models(tmp_path: Path) -> None:
    """NVIDIA eos_n256 weak cosmoflow: M'=4, TTTa 12.33335 where the summarizer says M'=59, TTTa 12.7505."""
    runs = [SynthRun(2.0 * i, 600.0 + 7 * i, seed=i) for i in range(4)]
    folder = write_benchmark(tmp_path, "weak", runs)
    for k in range(4):
        _train_on(folder / f"result_{k}.txt", [0.2] * (4 - k))  # each trains on until the job ends
    (g,) = build(tmp_path, None, official=False).groups
    assert g.score.M_prime == 4 and not g.score.rejected
    start, stop = min(r.start_s for r in runs), max(r.start_s + r.duration_s for r in runs)
    assert g.score.ttta_min == pytest.approx((stop - start) / 60.0)


def test_tracked_stats_of_the_last_epoch_logged_just_after_run_stop_is_used(tmp_path: Path) -> None:
    """NVIDIA dlrm_dcnv2 (training 5.1): epoch_stop at run_stop's millisecond, its tracked_stats 1 ms later."""
    t = T0_MS
    lines = [_rec("submission_benchmark", t - 10, "dlrm_dcnv2"), _rec("train_samples", t - 10, 1000),
             _rec("run_start", t, event="INTERVAL_START"), _rec("epoch_start", t, event="INTERVAL_START", epoch_num=1),
             _rec("eval_accuracy", t + 900, 0.81, epoch_num=0.5), _rec("run_stop", t + 1000, event="INTERVAL_END",
                                                                       status="success"),
             _rec("epoch_stop", t + 1000, event="INTERVAL_END", epoch_num=1),
             _rec("tracked_stats", t + 1001, {"throughput": 500.0}, step=1)]
    (tmp_path / "result_0.txt").write_text("".join(lines))
    run = parse_log(tmp_path / "result_0.txt")
    assert run.epochs == 1 and run.after_stop == 0 and run.samples_per_s == pytest.approx(500.0)


@pytest.mark.parametrize(("status", "inside", "after", "rejected"), [
    ("success", 0.2, [0.11], "eval_error 0.11, the first evaluation that meets the target, is after run_stop"),
    ("aborted", 0.2, [0.11], "eval_error 0.11, the first evaluation that meets the target, is after run_stop"),
    ("success", 0.2, [0.2], "eval_start is after run_stop (and 8 more evaluation record(s)), which says success"),
    ("aborted", 0.2, [0.2], None),  # an aborted run that evaluated once more: not converged, not rejected
])
def test_the_evaluation_that_met_the_target_must_be_inside_the_run(
        tmp_path: Path, status: str, inside: float, after: list[float], rejected: str | None) -> None:
    log = write_log(tmp_path / "result_0.txt", SynthRun(0.0, 300.0, status=status, final_error=inside))
    _train_on(log, [0.3, 0.3, *after])
    run = parse_log(log)
    assert not run.converged
    if rejected is None:
        assert not run.rejections and run.outcome == "aborted", run.rejections
    else:
        assert any(rejected in w for w in run.rejections), run.rejections
        assert run.outcome == "rejected"


def _resnet_log(path: Path, nested: bool) -> Path:
    """Two blocks of two 1 s epochs each, an evaluation closing each block: NVIDIA resnet nests the epochs
    in the blocks (block_stop without epoch_count); unet3d/dlrm_dcnv2 log blocks only, with epoch_count."""
    t = T0_MS
    lines = [_rec("submission_benchmark", t - 10, "resnet"), _rec("submission_division", t - 10, "closed"),
             _rec("train_samples", t - 10, 1000), _rec("run_start", t, event="INTERVAL_START")]
    for b in range(2):
        first = 1 + 2 * b
        t0 = t + b * 2100.0
        meta = {"first_epoch_num": first, "epoch_count": 2}
        lines.append(_rec("block_start", t0, event="INTERVAL_START", **meta))
        for e in range(2):
            if nested:
                lines += [_rec("epoch_start", t0 + e * 1000, event="INTERVAL_START", epoch_num=first + e),
                          _rec("epoch_stop", t0 + (e + 1) * 1000, event="INTERVAL_END", epoch_num=first + e)]
        lines += [_rec("eval_accuracy", t0 + 2050, 0.7 + 0.1 * b, epoch_num=first + 1),
                  _rec("block_stop", t0 + 2050, event="INTERVAL_END",
                       **({"first_epoch_num": first} if nested else meta))]
    lines.append(_rec("run_stop", t + 4200, event="INTERVAL_END", status="success"))
    path.write_text("".join(lines))
    return path


def test_epochs_nested_in_blocks_count_once(tmp_path: Path) -> None:
    """NVIDIA h200 resnet (training 4.0): 44 epochs shown, 35 logged (the summarizer's samples_to_converge)."""
    run = parse_log(_resnet_log(tmp_path / "result_0.txt", nested=True))
    assert run.epochs == 4  # was 6: two block_stops counted as one epoch each on top of the four epochs
    assert run.train_ms == pytest.approx(4000.0) and len(run.epoch_ms) == 4
    assert run.samples_per_s == pytest.approx(1000.0)  # was 1500: 6 epochs' samples over 4 epochs' time
    blocks = parse_log(_resnet_log(tmp_path / "result_1.txt", nested=False))
    assert blocks.epochs == 4 and blocks.train_ms == pytest.approx(2 * 2050.0)  # blocks alone: epoch_count


@pytest.mark.parametrize(("logged", "read"), [("1696481967", 1696481967), ("1695865674369361546", 1695865674369361546),
                                              (" 42 ", 42), ("abc", None), ("4.5", None)])
def test_a_seed_logged_as_a_string_of_digits_is_read_as_the_official_checker_reads_it(
        tmp_path: Path, logged: str, read: int | None) -> None:
    log = write_log(tmp_path / "result_0.txt", SynthRun(0.0, 100.0))
    text = log.read_text().replace('"key": "seed", "value": 1,', f'"key": "seed", "value": {json.dumps(logged)},')
    assert text != log.read_text()
    log.write_text(text)
    run = parse_log(log)
    assert run.seed == read  # was None for every string
    assert any("expected an integer" in p for p in run.problems) == (read is None)


def test_two_runs_sharing_a_string_seed_are_flagged(tmp_path: Path) -> None:
    folder = write_benchmark(tmp_path, "strong", [SynthRun(i * 1000.0, TIMES[i], seed=i) for i in range(5)])
    for k in (1, 3):
        log = folder / f"result_{k}.txt"
        log.write_text(log.read_text().replace(f'"key": "seed", "value": {k},', '"key": "seed", "value": "1696481967",'))
    runs = [parse_log(folder / f"result_{k}.txt") for k in range(5)]
    assert shared_seeds(runs) == [(1696481967, ["result_1.txt", "result_3.txt"], True)]  # was: not seen
    (g,) = build(tmp_path, None, official=False).groups
    assert any("seed 1696481967: result_1.txt, result_3.txt" in f for f in g.score.flags), g.score.flags


@pytest.mark.parametrize("same_line", [True, False])
def test_the_shared_seed_flag_says_whether_the_official_seed_check_sees_it(tmp_path: Path, same_line: bool) -> None:
    """The official seed checker (package_checker/seed_checker.py) flags two runs only when they log the same seed from
    the same file and line; the rules ask for a different seed in every run. Closed runs sharing a seed logged from
    different lines: flagged, saying the official check does not see it (was: 'the official seed check fails')."""
    folder = write_benchmark(tmp_path, "strong", [SynthRun(i * 1000.0, TIMES[i], seed=1 if i < 2 else 10 + i)
                                                 for i in range(5)], division="closed")
    if not same_line:
        log = folder / "result_1.txt"
        lines = log.read_text().splitlines(keepends=True)
        lines = [ln.replace('"lineno": ', '"lineno": 9', 1) if '"key": "seed"' in ln else ln for ln in lines]
        log.write_text("".join(lines))
    (g,) = build(tmp_path, None, official=False).groups
    (flag,) = [f for f in g.score.flags if f.startswith("runs share a seed")]
    assert "seed 1: result_0.txt, result_1.txt" in flag
    assert ("the official seed check fails" in flag) == same_line
    assert ("compares seeds logged from the same file and line only" in flag) == (not same_line)
