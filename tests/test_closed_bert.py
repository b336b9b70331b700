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
