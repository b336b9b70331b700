"""BERT on the harness (training suite): the logged keys cover closed_bert.yaml (the mini preset reaching its
masked-LM target on 2 ranks with a log the official training 5.0.0 checker passes is checked on the run of
`hpcbench run --workload bert` in tests/test_run_embedded.py); the shard set reads batches across shards in the asked
order; the weight-decay mask exempts exactly the biases and LayerNorm weights."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from hpcbench.common.errors import DataError
from hpcbench.common.flat import FlatParams
from hpcbench.common.workload import DataSizes
from conftest import run_cli
from hpcbench import registry
from hpcbench.workloads.mlperf_training.bert.batch import Batch
from hpcbench.workloads.mlperf_training.bert.dataset import BertData
from hpcbench.workloads.mlperf_training.bert.workload import BertWorkload


@pytest.fixture(scope="module")
def mini_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bert_mini")
    proc = run_cli(["datagen", "bert", "--out", str(out), "--workers", "2", *BertWorkload.embedded_datagen_args()])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


def test_logged_keys_cover_closed_bert_yaml_and_full_preset_is_the_reference_point() -> None:
    import mlperf_logging

    from hpcbench.registry import epoch_reporting

    e = registry.entry("bert")
    assert (e.suite, e.ruleset, e.required_runs) == ("training", "5.0.0", 10)
    assert registry.suite_of("bert") == ("training", "5.0.0")
    full = BertWorkload.load_config("full")
    assert (full.train.global_batch_size, full.optim.lr, full.train.target, full.train.division) == \
        (256, 0.00035, 0.720, "closed")
    assert full.data.eval_samples == 10000  # the reference's eval_10k (a closed run refuses a split of another size)
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
    # a closed run takes no front part of a larger evaluation split (the reference's eval_10k is a strided draw)
    with pytest.raises(DataError, match="the split holds 1024 rows; a closed run evaluates on the reference's"):
        BertData(64, 10, 200, eval_samples=100, exact_eval=True).open(mini_data, "eval")
    assert len(BertData(64, 10, 200, eval_samples=1024, exact_eval=True).open(mini_data, "eval")) == 1024
    with pytest.raises(DataError, match="vocabulary|input_ids must be in"):
        BertData(64, 10, 150).open(mini_data, "train").read(np.arange(50))  # ids of a larger vocabulary


def test_weight_decay_exempts_biases_and_layernorm_weights_only() -> None:
    wl = BertWorkload(BertWorkload.load_config("mini"))
    flat = FlatParams(wl.build_model())
    exempt = {n for n in flat.names if wl.no_weight_decay(n)}
    assert exempt == {n for n in flat.names if n.endswith(".bias") or n == "mlm_bias" or "norm." in n}
    assert "embeddings.word.weight" not in exempt and "layers.0.ffn_in.weight" not in exempt
    assert {"embeddings.norm.weight", "layers.1.attention_norm.weight", "mlm_norm.weight"} <= exempt
