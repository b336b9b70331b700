"""BERT against the closed rules and the reference (docs/closed.md, the BERT table): samples counted in
sequences for packed data (global batch, cadence, train_samples, epoch_num, throughput), the rules'
evaluation interval, the max-steps stop, and the full preset's values."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from conftest import run_cli
from hpcbench.common.cadence import EvalCadence, TrainPoint
from hpcbench.common.dist import init_distributed
from hpcbench.common.errors import ConfigError
from hpcbench.workloads.mlperf_training.bert.config import eval_interval
from hpcbench.workloads.mlperf_training.bert.workload import BertWorkload
from tests.harness_toy import ToyBert, ToyWorkload, toy_trainer

SMALL = ["--train-samples", "600", "--eval-samples", "64", "--train-shards", "2", "--vocab-size", "200",
         "--max-seq-len", "64"]


@pytest.fixture(scope="module")
def env():  # noqa: ANN201 - one singleton-MPI torch group for the in-process runs of this module
    e = init_distributed(device="cpu")
    yield e
    e.close()


def _data(root: Path, layout: str) -> Path:
    proc = run_cli(["datagen", "bert", "--out", str(root), "--workers", "1", "--layout", layout, *SMALL])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return root


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _data(tmp_path_factory.mktemp("bert_packed"), "packed")


@pytest.fixture(scope="module")
def padded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _data(tmp_path_factory.mktemp("bert_padded"), "padded")


def _bert(root: Path, *overrides: str) -> BertWorkload:
    return BertWorkload(BertWorkload.load_config("mini", [f"data.root={root}", *overrides]))


def _records(log: Path) -> list[dict[str, Any]]:
    return [json.loads(ln.split(":::MLLOG ", 1)[1]) for ln in log.read_text().splitlines() if ":::MLLOG " in ln]


# --- the rules' evaluation interval -------------------------------------------------------------
def test_eval_interval_is_the_rules_formula_in_sequences() -> None:
    # FLOOR(0.05 x (230.23 x GBS + 3,000,000), 25,000), checked by hand at a few batches
    assert [eval_interval(b) for b in (256, 1024, 4096, 8192)] == [150000, 150000, 175000, 225000]
    full = BertWorkload.load_config("full")
    assert (full.train.global_batch_size, full.train.eval_every_samples, full.train.max_steps) == (256, 150000, 13700)
    with pytest.raises(ConfigError, match=r"train.eval_every_samples.*= 175000 sequences at global batch 4096"):
        BertWorkload.load_config("full", ["train.global_batch_size=4096"])
    BertWorkload.load_config("full", ["train.global_batch_size=4096", "train.eval_every_samples=175000"])
    # the open division may evaluate at any cadence (mini: about every half epoch)
    assert BertWorkload.load_config("mini").train.eval_every_samples == 4096


# --- samples are sequences ----------------------------------------------------------------------
def test_packed_rows_count_sequences_and_the_global_batch_is_in_sequences(packed: Path) -> None:
    wl = _bert(packed)
    train = wl.source("train")
    assert train.packed and len(train) < 600 == train.sequences()  # rows hold 1-3 sequences
    assert wl.sequences_per_row() == round(600 / len(train)) == 2
    assert wl.loader_batch_size() == 32 and wl.counts_samples_per_step()  # 64 sequences = 32 rows of ~2
    assert wl.dataset_sizes() == (600, 64)  # train_samples and eval_samples in sequences
    last = list(range(len(train) - 8, len(train)))  # best-fit decreasing: the last rows hold the short sequences
    batch = wl.dataset().read_batch(train, last)
    assert wl.batch_size(batch) == sum(len(s) for s in train.read(last).seq_lens) > 8
    with pytest.raises(ConfigError, match=r"'train.global_batch_size': 63 sequences is not a whole number of rows of 2"):
        _bert(packed, "train.global_batch_size=63").loader_batch_size()
    with pytest.raises(ConfigError, match=r"'data.sequences_per_row': 3, but the training split .* holds 600 "
                                          r"sequences in \d+ rows"):
        _bert(packed, "data.sequences_per_row=3").loader_batch_size()


def test_padded_rows_are_sequences_without_per_step_counting(padded: Path) -> None:
    wl = _bert(padded)
    assert not wl.source("train").packed and wl.sequences_per_row() == 1
    assert wl.loader_batch_size() == 64 and not wl.counts_samples_per_step()
    assert wl.dataset_sizes() == (600, 64)


def test_cadence_counts_the_samples_of_each_step() -> None:
    cad = EvalCadence.from_config(1, 100, 10, 16, 1, "samples")
    # steps of 30, 40, 35 counted samples: 30, 70, 105 -> crosses 100 at the third step only
    seen, points = 0, []
    for k, n in enumerate((30, 40, 35), start=1):
        seen += n
        points.append(TrainPoint(1, k, k, seen, n))
    assert [cad.after_step(p) for p in points] == [False, False, True]
    assert cad.epoch_num(points[-1]) == 105 and cad.epoch_marker(1, 3, 105) == 105
    assert cad.epoch_num(TrainPoint(1, 3, 3)) == 48  # uncounted: steps x global batch


class TripleToy(ToyBert):
    """Each row holds 3 of the rules' samples (as a packed row holds sequences)."""

    def counts_samples_per_step(self) -> bool:
        return True

    def batch_size(self, batch: Any) -> int:
        return 3 * super().batch_size(batch)


def test_harness_reports_counted_samples_in_epoch_num_cadence_and_throughput(env, tmp_path: Path) -> None:  # noqa: ANN001
    log = tmp_path / "result_0.txt"
    # toy: 512 rows, batch 16 -> 32 steps of 48 samples; every 480 samples = every 10 steps
    tr = toy_trainer(env, TripleToy, ["train.target=1.0", "train.max_epochs=1", "train.eval_every_samples=480"], log)
    result = tr.run()
    tr.log.close()
    recs = _records(log)
    evals = [r["metadata"]["epoch_num"] for r in recs if r["key"] == "eval_accuracy"]
    assert evals == [480, 960, 1440, 1536]  # steps 10, 20, 30 and the run's end (32 steps x 48)
    assert [r["metadata"]["epoch_num"] for r in recs if r["key"] == "epoch_stop"] == [1536]
    assert result.samples_per_s > 0 and tr.parts.position.samples == 1536
    # tracked_stats throughput in sequences/s: the epoch's 1536 sequences (not its 512 rows) over its training seconds
    (thr,) = [r["value"]["throughput"] for r in recs if r["key"] == "tracked_stats"]
    assert thr * result.epoch_phases[0]["seconds"] == pytest.approx(1536, rel=1e-9)


# --- the max-steps stop -------------------------------------------------------------------------
def test_max_steps_ends_the_run_after_that_many_optimizer_steps(env, tmp_path: Path) -> None:  # noqa: ANN001
    log = tmp_path / "result_0.txt"
    tr = toy_trainer(env, ToyWorkload, ["train.target=0.0", "train.max_epochs=5", "train.max_steps=40"], log)
    result = tr.run()
    tr.log.close()
    # 32 steps per epoch: epoch 1 evaluated at its end, then the run stops at step 40 (evaluated there)
    assert result.status == "aborted" and result.steps == 40 and result.epochs == 2 and len(result.metrics) == 2
    recs = _records(log)
    assert [r["metadata"]["status"] for r in recs if r["key"] == "run_stop"] == ["aborted"]
    assert [r["metadata"]["epoch_num"] for r in recs if r["key"] == "eval_error"] == [1, 1.25]


def test_max_steps_with_the_target_met_there_is_success(env) -> None:  # noqa: ANN001
    tr = toy_trainer(env, ToyWorkload, ["train.target=10.0", "train.max_epochs=5", "train.max_steps=7"])
    result = tr.run()
    assert result.status == "success" and result.steps == 7 and result.epochs == 1


def test_max_steps_must_not_be_negative() -> None:
    with pytest.raises(ConfigError, match="'train.max_steps': must be >= 0"):
        ToyWorkload.load_config("mini", ["train.max_steps=-1"])


# --- the learning-rate schedule: the reference's warmup from start_warmup_step, then poly of the global step ---
def _reference_lr(g: int, lr: float, total: int, warmup: int, start: int, power: float = 1.0) -> float:
    """mlcommons/training BERT optimization.py create_optimizer, at TF global step g (our 0-based step):
    polynomial_decay(lr, g, total, end 0, power); while g - start < warmup (warmup > 0) the warmup
    lr * (g - start) / warmup replaces it."""
    if warmup and g - start < warmup:
        return lr * (g - start) / warmup
    return lr * (1.0 - min(g, total) / total) ** power


@pytest.mark.parametrize("lr,total,warmup,start", [
    (0.002, 1141, 100, 0),  # rcps_bert.json bert_ref_3072: warmup 100 from step 0 (rate 0 at the first step)
    (0.00288293, 600, 287, -76),  # bert_ref_8192: starts part-way up the ramp, ends it at step 211
    (0.0029293, 700, 0, -700),  # bert_ref_6144: no warmup, start_warmup_step logged only
    (0.00301, 740, 200330, -200000),  # NVIDIA v3.1 DGXH100_8x8x36x1: a near-flat ramp to step 330, then the decay
])
def test_schedule_is_the_references_warmup_from_start_warmup_step_then_poly_of_the_global_step(
        lr: float, total: int, warmup: int, start: int) -> None:
    from hpcbench.common.schedule import Schedule
    from hpcbench.common.workload import DataSizes

    cfg = BertWorkload.load_config("full", [f"optim.lr={lr}", f"optim.total={total}", f"train.max_steps={total}",
                                            f"optim.warmup={warmup}", f"optim.warmup_start={start}"])
    s = Schedule.from_config(cfg.optim, 1, cfg.train.max_epochs)
    end = warmup + start  # the first step past the warmup
    steps = sorted(g for g in {0, 1, 2, end - 1, end, end + 1, total // 2, total - 1, total, total + 3} if g >= 0)
    for g in steps:
        assert s.value(g) == pytest.approx(_reference_lr(g, lr, total, warmup, start), rel=1e-12, abs=1e-18), g
    wl = BertWorkload(cfg)
    wl.sizes = DataSizes(train_samples=10**6, eval_samples=10000, steps_per_epoch=10**6 // 256)
    hp = wl.hyperparameters()
    assert (hp["num_warmup_steps"], hp["opt_learning_rate_warmup_steps"], hp["start_warmup_step"],
            hp["opt_learning_rate_training_steps"]) == (warmup, warmup, start, total)


def test_closed_schedule_is_refused_where_it_leaves_the_reference() -> None:
    for override, key in (("optim.warmup_style=harness", "optim.warmup_style"), ("optim.power=2", "optim.power"),
                          ("optim.min_lr=1e-6", "optim.min_lr"), ("optim.schedule=constant", "optim.schedule"),
                          ("optim.poly_from_warmup=true", "optim.poly_from_warmup"),
                          ("optim.max_grad_norm=0", "optim.max_grad_norm")):
        with pytest.raises(ConfigError, match=rf"'{key}' = .*closed"):
            BertWorkload.load_config("full", [override])
        BertWorkload.load_config("full", [override, "train.division=open"])
    with pytest.raises(ConfigError, match=r"optim\.warmup_start': applies to optim\.warmup_style = 'zero_start'"):
        BertWorkload.load_config("full", ["optim.warmup_start=-76", "optim.warmup_style=harness",
                                          "train.division=open"])
    with pytest.raises(ConfigError, match=r"optim\.warmup_start': must be <= 0.*got 5"):
        BertWorkload.load_config("full", ["optim.warmup_start=5"])


def test_warmup_start_is_a_whole_step_in_either_unit() -> None:
    """start_warmup_step is an integer flag of the reference and is logged as one: a fractional start (in steps,
    or in epochs times the steps per epoch) is refused, not trained with one value and logged with another;
    in epochs a whole number of steps is converted."""
    from hpcbench.common.schedule import Schedule

    cfg = BertWorkload.load_config("full", ["optim.warmup=10", "optim.warmup_start=-0.4"])
    with pytest.raises(ConfigError, match=r"optim\.warmup_start': .*whole step, got -0\.4 steps"):
        Schedule.from_config(cfg.optim, 1, cfg.train.max_epochs)
    ep = BertWorkload.load_config("full", ["optim.unit=epochs", "optim.warmup=1", "optim.warmup_start=-0.5",
                                           "optim.total=4", "train.division=open"])
    with pytest.raises(ConfigError, match=r"whole step, got -0\.5 epochs = -2\.5 steps"):
        Schedule.from_config(ep.optim, 5, ep.train.max_epochs)
    s = Schedule.from_config(ep.optim, 4, ep.train.max_epochs)  # -0.5 epochs = -2 steps, warmup 4 steps
    assert s.warmup_start == -2.0
    assert s.value(0) == pytest.approx(ep.optim.lr * 2 / 4) and s.value(1) == pytest.approx(ep.optim.lr * 3 / 4)
