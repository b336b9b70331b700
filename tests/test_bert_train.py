"""BERT on the harness (training suite): the mini preset reaches its masked-LM target under mpiexec with
2 ranks and its log passes the official training 5.0.0 checker (5.1.0's common rules no longer accept
bert); the logged keys cover closed_bert.yaml; the shard set reads batches across shards in the asked
order; the weight-decay mask exempts exactly the biases and LayerNorm weights."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from hpcbench.common.errors import DataError
from hpcbench.common.flat import FlatParams
from hpcbench.common.mllog import check_log
from hpcbench.common.workload import DataSizes
from conftest import first_events, log_records, log_values, run_cli, run_mpi
from hpcbench import registry
from hpcbench import results_layout as rl
from hpcbench.workloads.mlperf_training.bert import synth
from hpcbench.workloads.mlperf_training.bert.batch import Batch
from hpcbench.workloads.mlperf_training.bert.dataset import BertData
from hpcbench.workloads.mlperf_training.bert.format import open_shard
from hpcbench.workloads.mlperf_training.bert.workload import BertWorkload

TRAIN = ["-m", "hpcbench", "train", "bert", "--config", "mini", "--system-name", "box", "--no-progress",
         "--device", "cpu"]


@pytest.fixture(scope="module")
def mini_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bert_mini")
    proc = run_cli(["datagen", "bert", "--out", str(out), "--workers", "2", *BertWorkload.embedded_datagen_args()])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


def test_mini_reaches_target_on_two_ranks_and_passes_the_training_checker(mini_data: Path, tmp_path: Path) -> None:
    proc = run_mpi(2, [*TRAIN, "--data", str(mini_data), "--results", str(tmp_path)], timeout=400)
    log = tmp_path / "results" / "box" / "bert" / "result_0.txt"
    assert "instance 0: success" in proc.stdout, proc.stdout + proc.stderr
    ev = first_events(log)
    assert ev["submission_benchmark"] == "bert" and ev["submission_division"] == "open"
    assert ev["gradient_accumulation_steps"] == 1 and "gradient_accumulation_frequency" not in ev
    assert (ev["opt_lamb_epsilon"], ev["opt_lamb_beta_1"], ev["opt_lamb_beta_2"]) == (1e-6, 0.9, 0.999)
    assert ev["opt_lamb_weight_decay_rate"] == 0.01 and ev["opt_lamb_learning_rate_decay_poly_power"] == 1.0
    assert ev["eval_samples"] == 1024 and ev["max_sequence_length"] == 64
    steps = ev["steps_per_epoch"]
    assert ev["opt_learning_rate_training_steps"] == 12 * steps and ev["num_warmup_steps"] == round(0.2 * steps)
    train_rows = sum(len(open_shard(p, max_seq_len=64, max_pred=10, vocab_size=200))
                     for p in sorted((mini_data / "train").iterdir()))
    # samples are sequences, as the rules count them: 8192 sequences in fewer packed rows; the global batch of
    # 64 sequences is 32 rows of 2 per step; an epoch (137 steps) reads all rows but the few of an uneven last batch
    assert ev["train_samples"] == 8192 > train_rows and ev["global_batch_size"] == 64 and steps == train_rows // 32
    stops = [e["metadata"]["epoch_num"] for e in log_records(log) if e["key"] == "epoch_stop"]
    per_epoch = np.diff([0, *stops[:-1]])  # whole epochs: every sequence of the rows read, counted
    left_out = train_rows - 32 * steps
    assert len(per_epoch) and all(8192 - 3 * left_out <= n <= 8192 for n in per_epoch), (per_epoch, left_out)
    assert stops[-1] - (stops[-2] if len(stops) > 1 else 0) <= 8192
    evals = [e["metadata"]["epoch_num"] for e in log_records(log) if e["key"] == "eval_accuracy"]
    assert evals[0] != 4096 and 4096 <= evals[0] < 4096 + 3 * 32  # the step that passes 4096 sequences
    thr = [e["value"]["throughput"] for e in log_records(log) if e["key"] == "tracked_stats"]
    assert thr and all(t > 0 for t in thr)
    eval_rows = open_shard(mini_data / "eval" / "eval_00000.hdf5", max_seq_len=64, max_pred=10, vocab_size=200).read()
    trivial = synth.most_frequent_accuracy(eval_rows)
    accs = log_values(log, "eval_accuracy")
    assert max(accs) >= 0.65 > trivial + 0.5  # the target, far above always predicting the most frequent word
    ok, out = check_log(log, "5.0.0", "training")
    assert ok, out
    ok, out = check_log(log, "5.1.0", "training")  # 5.1.0 keeps closed_bert.yaml but drops bert from the list
    assert not ok and "CHECK for 'submission_benchmark' failed" in out and out.count("CHECK for") == 1, out


def test_logged_keys_cover_closed_bert_yaml_and_full_preset_is_the_reference_point() -> None:
    import mlperf_logging

    from hpcbench.registry import epoch_reporting

    e = registry.entry("bert")
    assert (e.suite, e.ruleset, e.required_runs) == ("training", "5.0.0", 10)
    assert registry.suite_of("bert") == ("training", "5.0.0")
    full = BertWorkload.load_config("full")
    assert (full.train.global_batch_size, full.optim.lr, full.train.target, full.train.division) == \
        (256, 0.00035, 0.720, "closed")
    # the rules' cadence, FLOOR(0.05 x (230.23 x batch + 3M), 25000) samples, reported in samples
    assert full.train.eval_every_samples == int(0.05 * (230.23 * 256 + 3_000_000)) // 25000 * 25000 == 150000
    assert epoch_reporting(BertWorkload.benchmark) == "samples"
    wl = BertWorkload(full)
    wl.sizes = DataSizes(train_samples=10**6, eval_samples=10000, steps_per_epoch=10**6 // 256)
    logged = {*wl.hyperparameters(), "global_batch_size", "eval_samples", "train_samples", "seed",
              "gradient_accumulation_steps", "eval_accuracy"}  # the last five: the harness's
    ruleset = Path(mlperf_logging.__file__).parent / "compliance_checker" / "training_5.0.0" / "closed_bert.yaml"
    required = {r["KEY"]["NAME"] for r in yaml.safe_load(ruleset.read_text()) if "KEY" in r}
    assert required and required <= logged, required - logged
    hp = wl.hyperparameters()
    assert (hp["opt_learning_rate_training_steps"], hp["num_warmup_steps"], hp["start_warmup_step"]) == (13700, 0, 0)
    assert hp["opt_lamb_weight_decay_rate"] == 0.01 and hp["opt_lamb_epsilon"] == 1e-6


def test_shard_set_reads_batches_across_shards_in_the_asked_order(mini_data: Path) -> None:
    spec = BertData(64, 10, 200)
    train = spec.open(mini_data, "train")
    sizes = [len(s) for s in train.shards]
    assert len(sizes) == 2 and len(train) == sum(sizes)
    idx = np.array([sizes[0] + 3, 5, len(train) - 1, 0, sizes[0] - 1, 5])
    rows = train.read(idx)
    for k, i in enumerate(idx):
        one = train[int(i)]
        assert np.array_equal(rows.input_ids[k], one.input_ids[0]) and np.array_equal(rows.seq_lens[k], one.seq_lens[0])
    assert any(len(s) > 1 for s in rows.seq_lens)  # packed rows by default
    batch = spec.read_batch(train, idx)
    assert isinstance(batch, Batch) and batch.shape == (6, 64) and batch.num_tokens() == rows.num_tokens()
    capped = BertData(64, 10, 200, eval_samples=100).open(mini_data, "eval")
    assert len(capped) == 100 and all(len(s) == 1 for s in capped.read(np.arange(100)).seq_lens)  # padded eval
    with pytest.raises(DataError, match="eval_samples = 5000 but the split holds 1024"):
        BertData(64, 10, 200, eval_samples=5000).open(mini_data, "eval")
    with pytest.raises(DataError, match="vocabulary|input_ids must be in"):
        BertData(64, 10, 150).open(mini_data, "train").read(np.arange(50))  # ids of a larger vocabulary


def test_weight_decay_exempts_biases_and_layernorm_weights_only() -> None:
    wl = BertWorkload(BertWorkload.load_config("mini"))
    flat = FlatParams(wl.build_model())
    exempt = {n for n in flat.names if wl.no_weight_decay(n)}
    assert exempt == {n for n in flat.names if n.endswith(".bias") or n == "mlm_bias" or "norm." in n}
    assert "embeddings.word.weight" not in exempt and "layers.0.ffn_in.weight" not in exempt
    assert {"embeddings.norm.weight", "layers.1.attention_norm.weight", "mlm_norm.weight"} <= exempt
