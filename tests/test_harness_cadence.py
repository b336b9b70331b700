"""Evaluation inside an epoch (common/cadence.py + the trainer): where the evaluations fall, the stop at
the one that meets the target, ``epoch_num`` per the benchmark's epoch reporting, official checker
on the logs (hpc and training usages), progress lines, bad values named by key."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from hpcbench.common.cadence import EvalCadence, TrainPoint
from hpcbench.common.dist import init_distributed
from hpcbench.common.errors import ConfigError
from hpcbench.common.mllog import MLPerfLogger, check_log
from hpcbench.registry import epoch_reporting
from hpcbench.common.system import SystemDescription
from hpcbench.common.trainer import Trainer
from tests.harness_toy import ToyBert, ToyDlrm, ToyWorkload

STEPS = 512 // 16  # the toy's steps per epoch (512 samples, global batch 16)


@pytest.fixture(scope="module")
def env():  # noqa: ANN201
    e = init_distributed(device="cpu")
    yield e
    e.close()


def _run(env, cls: type[ToyWorkload], overrides: list[str], log: Path, progress: str | bool = False):  # noqa: ANN001, ANN202
    cfg = cls.load_config("mini", overrides)
    tr = Trainer(cls(cfg), env, MLPerfLogger(log), SystemDescription(), progress=progress)
    result = tr.run()
    tr.log.close()
    return tr, result


def _lines(log: Path) -> list[dict]:
    return [json.loads(line.split(":::MLLOG ", 1)[1]) for line in log.read_text().splitlines() if ":::MLLOG" in line]


def _points(cad: EvalCadence, epochs: int) -> list[tuple[int, int]]:
    """(epoch, step) of every evaluation over ``epochs`` epochs of ``cad.steps_per_epoch`` steps."""
    out, g = [], 0
    for e in range(1, epochs + 1):
        for s in range(1, cad.steps_per_epoch + 1):
            g += 1
            if cad.within_epoch and cad.after_step(TrainPoint(e, s, g)):
                out.append((e, s))
        if cad.at_epoch_end(e) and (not out or out[-1] != (e, cad.steps_per_epoch)):
            out.append((e, cad.steps_per_epoch))
    return out


def test_cadence_points_fraction_samples_and_whole_epochs() -> None:
    frac = EvalCadence.from_config(0.05, 0, 64013, 65536, 1, "fraction")  # the reference DLRM's numbers
    pts = _points(frac, 1)
    assert [s for _, s in pts[:3]] == [3200, 6400, 9600] and pts[19] == (1, 64000) and pts[-1] == (1, 64013)
    assert frac.epoch_num(TrainPoint(1, 3200, 3200)) == pytest.approx(0.05, abs=1e-4)
    assert frac.epoch_num(TrainPoint(1, 64013, 64013)) == 1.0
    # BERT at global batch 256: every FLOOR(0.05 * (230.23 * 256 + 3e6), 25000) = 150,000 samples,
    # i.e. after the first step past each multiple (586 x 256 = 150,016), epoch_num = samples
    bert = EvalCadence.from_config(1, 150000, 10000, 256, 2, "samples")
    pts = _points(bert, 1)
    assert pts[:2] == [(1, 586), (1, 1172)] and bert.epoch_num(TrainPoint(1, 586, 586)) == 150016
    assert pts[-1] == (1, 9961) and len(pts) == 17  # 17 crossings in 2.56M samples; epoch 1 is not the last
    whole = EvalCadence.from_config(2, 0, 10, 8, 5, "epoch")
    assert _points(whole, 5) == [(2, 10), (4, 10), (5, 10)]  # every 2nd epoch, and the last
    assert whole.epoch_num(TrainPoint(4, 10, 40)) == 4 and isinstance(whole.epoch_num(TrainPoint(4, 10, 40)), int)
    assert epoch_reporting("bert") == "samples" and epoch_reporting("dlrm_dcnv2") == "fraction"
    assert epoch_reporting("cosmoflow") == "epoch" and epoch_reporting("resnet") == "epoch"  # docs/closed.md


def test_fraction_cadence_on_an_hpc_workload_passes_the_hpc_checker(env, tmp_path: Path, capsys, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setenv("HPCBENCH_PROGRESS", "1")
    log = tmp_path / "result_0.txt"
    _, result = _run(env, ToyWorkload, ["train.eval_every=0.25"], log, progress="lines")  # to eval_error <= 0.1
    assert result.status == "success" and result.final_metric <= 0.1
    n = len(result.metrics)
    assert n > 4 and [e for e, _ in result.metrics] == [k / 4 for k in range(1, n + 1)]
    lines = _lines(log)
    evals = [x["metadata"]["epoch_num"] for x in lines if x["key"] == "eval_error"]
    assert evals == [k // 4 if k % 4 == 0 else k / 4 for k in range(1, n + 1)]  # whole epochs as integers
    assert all(isinstance(e, int) for e in evals[3::4])
    starts = [x["metadata"]["epoch_num"] for x in lines if x["key"] == "epoch_start"]
    assert starts == list(range(1, result.epochs + 1))  # epochs stay whole around the evaluations
    ok, output = check_log(log)  # hpc 3.0.0
    assert ok, output
    out = capsys.readouterr().out
    assert "epoch 1/12 step 8/32 (128 samples): eval_error" in out
    assert "epoch 1/12 (512 samples): eval_error" in out and "run_stop: success" in out


def test_stop_at_the_mid_epoch_evaluation_that_meets_the_target(env, tmp_path: Path) -> None:  # noqa: ANN001
    _, full = _run(env, ToyWorkload, ["train.target=0.0", "train.max_epochs=4", "train.eval_every=0.25"],
                   tmp_path / "full.txt")
    # the first evaluation inside an epoch that beats every earlier one and the checker's open-division
    # bound (eval_error <= 0.124) becomes the target of a second, identical run
    i = next(i for i, (e, v) in enumerate(full.metrics)
             if i > 0 and not float(e).is_integer() and v <= 0.12 and v < min(m for _, m in full.metrics[:i]))
    epoch_num, value = full.metrics[i]
    log = tmp_path / "result_0.txt"
    tr, result = _run(env, ToyWorkload, [f"train.target={value!r}", "train.max_epochs=4", "train.eval_every=0.25"], log)
    assert result.status == "success" and result.metrics == full.metrics[: i + 1]
    assert tr.parts.position.global_step == round(epoch_num * STEPS) and result.steps == tr.parts.position.global_step
    keys = [x["key"] for x in _lines(log)]
    assert keys[-3:] == ["epoch_stop", "tracked_stats", "run_stop"]  # nothing trained after that evaluation
    assert keys.count("eval_error") == i + 1
    ok, output = check_log(log)
    assert ok, output


@pytest.mark.parametrize("cls,overrides,expect", [
    # bert reports samples: evaluations after the steps that pass 100, 200, ... samples (16 per step)
    (ToyBert, ["train.eval_every_samples=100"], [112, 208, 304, 400, 512, 608, 704, 800, 912, 1008, 1024]),
    (ToyDlrm, ["train.eval_every=0.5"], [0.5, 1.0, 1.5, 2.0]),  # dlrm reports fractional epochs
])
def test_training_logs_report_epoch_num_as_the_ruleset_wants(env, tmp_path: Path, cls, overrides, expect) -> None:  # noqa: ANN001
    log = tmp_path / "result_0.txt"
    _, result = _run(env, cls, ["train.target=0.99", "train.max_epochs=2", *overrides], log)
    assert [e for e, _ in result.metrics] == expect
    lines = _lines(log)
    assert [x["metadata"]["epoch_num"] for x in lines if x["key"] == "eval_accuracy"] == expect
    markers = [x["metadata"]["epoch_num"] for x in lines if x["key"] in ("epoch_start", "epoch_stop")]
    assert markers == ([0, 512, 512, 1024] if cls is ToyBert else [1, 1, 2, 2])
    ok, output = check_log(log, cls.ruleset, "training")
    assert ok, output


def test_step_rounded_samples_cadence_as_the_llama_reference() -> None:
    """Llama 3.1 8B's reference evaluates every ceil(12288 / gbs) steps; BERT's after the step that crosses a
    multiple of N. Equal where the batch divides 12,288 (the RCP's 16: every 768 steps), apart at 1,152."""
    llama = EvalCadence.from_config(1, 12288, 100, 1152, 1, "samples", samples_cadence="steps")
    crossing = EvalCadence.from_config(1, 12288, 100, 1152, 1, "samples")
    assert llama.samples_step == 11
    assert [s for e, s in _points(llama, 1)] == [11, 22, 33, 44, 55, 66, 77, 88, 99, 100]  # 100: the run's end
    assert [s for e, s in _points(crossing, 1)][:3] == [11, 22, 32]
    rcp = EvalCadence.from_config(1, 12288, 2000, 16, 1, "samples", samples_cadence="steps")
    assert [s for e, s in _points(rcp, 1)] == [768, 1536, 2000]
    assert [s for e, s in _points(EvalCadence.from_config(1, 12288, 2000, 16, 1, "samples"), 1)] == [768, 1536, 2000]
    with pytest.raises(ConfigError, match="samples cadence"):
        EvalCadence.from_config(1, 12288, 100, 16, 1, "samples", samples_cadence="sometimes")


def test_llama_record_evaluates_on_the_reference_step_cadence() -> None:
    from hpcbench import registry
    from hpcbench.common.cadence import cadence_of

    cls = registry.get("llama31_8b")
    cfg = cls.load_config("full")
    assert cls.record.samples_cadence == "steps" and cfg.train.eval_every_samples == 12288
    cad = cadence_of(cls.record, cfg.train, 10_000)
    assert cad.samples_in_steps and cad.samples_step == 12288 // cfg.train.global_batch_size
    # docs/closed.md, first evaluation: every 768 steps from step 768 (none at step 48), nothing off the cadence
    steps = [s for _, s in _points(cad, 1)]
    assert steps[:3] == [768, 1536, 2304] and 48 not in steps and steps[-1] == 768 * (10_000 // 768)
    cfg.train.global_batch_size = 1152
    assert cadence_of(cls.record, cfg.train, 10_000).samples_step == 11


def test_whole_epoch_offset_and_the_final_evaluation() -> None:
    """``eval_offset = k``: the epochs k, k + N, ...; ``final = False`` (a closed run of a benchmark with
    ``closed_cadence_only``): nothing off the cadence, so the last epoch only when the cadence has it."""
    def ends(cad: EvalCadence) -> list[int]:
        return [e for e, _ in _points(cad, cad.max_epochs)]

    assert ends(EvalCadence.from_config(4, 0, 10, 8, 10, "epoch")) == [4, 8, 10]  # offset 0: N, 2N, and the last
    assert ends(EvalCadence.from_config(4, 0, 10, 8, 10, "epoch", offset=2)) == [2, 6, 10]
    assert ends(EvalCadence.from_config(4, 0, 10, 8, 11, "epoch", offset=3)) == [3, 7, 11]
    assert ends(EvalCadence.from_config(4, 0, 10, 8, 10, "epoch", final=False)) == [4, 8]
    assert ends(EvalCadence.from_config(4, 0, 10, 8, 10, "epoch", offset=1, final=False)) == [1, 5, 9]
    assert EvalCadence.from_config(4, 0, 10, 8, 10, "epoch", offset=1).epochs() == [1, 5, 9, 10]
    assert _points(EvalCadence.from_config(0.5, 0, 10, 8, 2, "fraction", final=False), 2) == \
        [(1, 5), (1, 10), (2, 5), (2, 10)]  # inside epochs: the cadence's own points only
    for offset, every in ((4, 4), (-1, 4), (1, 0.5)):
        with pytest.raises(ConfigError, match="'train.eval_offset'"):
            EvalCadence.from_config(every, 0, 10, 8, 10, "epoch", offset=offset)


def test_closed_cadence_only_is_a_closed_rule_of_the_record() -> None:
    from hpcbench.common.cadence import cadence_of
    from hpcbench.workloads.cosmoflow import BENCHMARK as COSMOFLOW

    strict = dataclasses.replace(COSMOFLOW, closed_cadence_only=True)
    closed = ToyWorkload.load_config("mini", ["train.eval_every=2", "train.max_epochs=5", "train.division=closed",
                                              "train.target=none"]).train
    opened = dataclasses.replace(closed, division="open")
    assert cadence_of(strict, closed, 10).epochs() == [2, 4]
    assert cadence_of(strict, opened, 10).epochs() == [2, 4, 5]  # the open division: a run ends with a metric
    assert cadence_of(COSMOFLOW, closed, 10).epochs() == [2, 4, 5]  # other benchmarks: as before


@pytest.mark.parametrize("override,key", [
    ("train.eval_every=1.5", "'train.eval_every'"),
    ("train.eval_every=0", "'train.eval_every'"),
    ("train.eval_every_samples=-5", "'train.eval_every_samples'"),
    ("train.eval_offset=1", "'train.eval_offset'"),  # the toy evaluates every epoch: offset must be < 1
    ("train.eval_offset=-1", "'train.eval_offset'"),
])
def test_bad_cadence_names_the_key(override: str, key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        ToyWorkload.load_config("mini", [override])


def test_both_cadences_at_once_are_refused_by_name() -> None:
    with pytest.raises(ConfigError, match="'train.eval_every' .* and 'train.eval_every_samples'"):
        ToyWorkload.load_config("mini", ["train.eval_every=0.5", "train.eval_every_samples=100"])


def test_resumed_run_keeps_the_sample_count_of_its_checkpoint(env, tmp_path: Path) -> None:  # noqa: ANN001
    ck = [f"train.checkpoint_dir={tmp_path / 'ck'}", "train.checkpoint_every=1", "train.target=0.99"]
    _run(env, ToyBert, [*ck, "train.max_epochs=1", "train.eval_every_samples=256"], tmp_path / "a.txt")
    tr, result = _run(env, ToyBert, [*ck, "train.max_epochs=2", "train.eval_every_samples=256", "train.resume=true"],
                      tmp_path / "b.txt")
    assert tr.start_epoch == 2 and tr.parts.position.global_step == 2 * STEPS
    assert [e for e, _ in result.metrics] == [768, 1024]  # samples since the run's start, not the resume's
    starts = [x["metadata"]["epoch_num"] for x in _lines(tmp_path / "b.txt") if x["key"] == "epoch_start"]
    assert starts == [512]
