"""llama31_8b closed keys: the `full` preset's logged hyperparameters (the workload's keys and the harness's
generic ones, as the trainer logs them) evaluated against every CHECK of the installed training 6.0.0
closed_llama31_8b.yaml; eval_samples comes from data.eval_samples (the data sizes are the dry run's only
stand-in), and the record's closed target is the checker's bound. The second test is the real shrunk dry run:
`hpcbench train llama31_8b --config full` with only the sizes overridden, its log put through the official
checker, whose only complaints may be the shrunk eval_samples and the unreached target."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from closed_yaml import check_closed_yaml
from conftest import first_events, project_env, result_log, run_cli
from hpcbench import registry
from hpcbench.common.errors import ConfigError
from hpcbench.common.workload import DataSizes


def test_full_preset_keys_pass_the_closed_yaml() -> None:
    cls = registry.get("llama31_8b")
    cfg = cls.load_config("full")
    w = cls(cfg)
    w.sizes = DataSizes(train_samples=10**6, eval_samples=cfg.data.eval_samples, steps_per_epoch=1000,
                        local_batch_size=cfg.train.global_batch_size)
    logged = {**w.hyperparameters(), "global_batch_size": cfg.train.global_batch_size,
              "gradient_accumulation_steps": cfg.train.grad_accum, "eval_samples": w.sizes.eval_samples}
    checked = check_closed_yaml("training_6.0.0", "closed_llama31_8b.yaml", logged)
    assert len(checked) == 16  # every key of the YAML but eval_accuracy (the target, checked below)
    assert logged["opt_learning_rate_decay_steps"] == 1_200_000 - 16 and logged["max_sequence_length"] == 8192
    assert logged["init_checkpoint_step"] == 0  # the reference logs it: random weights, no checkpoint
    t = w.target()
    assert (t.threshold, t.higher_is_better, t.reached(3.29), t.reached(3.31)) == (3.3, False, True, False)


def test_closed_config_is_refused_where_it_leaves_the_rules_or_the_reference() -> None:
    """training_rules.adoc rows the checker does not test, and the reference's choices that fix the training:
    end rate = 0.1 x base rate, decay over max_steps, NeMo's warmup, evaluation every 12,288 sequences, the
    index built for max_steps x global batch samples (the shuffled order depends on it)."""
    cls = registry.get("llama31_8b")
    for over, match in ((["optim.lr=8e-4"], r"'optim\.min_lr' = 4e-05 \(closed: .*8e-05 for optim\.lr = 0\.0008\)"),
                        (["optim.total=0"], r"optim\.total.*1200000"),
                        (["optim.warmup_style=harness"], r"optim\.warmup_style.*'nemo'"),
                        (["train.eval_every_samples=1024"], r"train\.eval_every_samples.*12288"),
                        (["train.eval_every_samples=0", "train.eval_every=1"], r"train\.eval_every_samples"),
                        (["train.global_batch_size=32"], r"data\.train_samples.*1200000 x 32 = 38400000"),
                        (["data.eval_order=document"], r"data\.eval_order.*'reference'"),
                        (["data.eval_index_samples=1600512"], r"data\.eval_index_samples.*25601024")):
        with pytest.raises(ConfigError, match=match):
            cls.load_config("full", over)
    ok = cls.load_config("full", ["optim.lr=8e-4", "optim.min_lr=8e-5", "train.global_batch_size=32",
                                  "data.train_samples=38400000", "data.eval_index_samples=102401024"])
    assert ok.train.division == "closed" and ok.data.train_blend == ["10", "c4-train.en_6_text_document"]
    full = cls.load_config("full")
    assert (full.data.eval_order, full.data.eval_index_samples) == ("reference", 25_601_024)
    # the open division keeps its own choices
    assert cls.load_config("full", ["train.division=open", "optim.total=0", "train.eval_every_samples=1024"])


def test_validation_index_size_is_nemos_num_val_samples_under_the_reference_script() -> None:
    """NeMo 2.1.0 PreTrainingDataModule: num_val_samples = (max_steps // val_check_interval + 1) x limit_val_batches
    x gbs, with pretrain_llama31.py's val_check_interval = ceil(12288 / gbs) / gbs and limit_val_batches =
    ceil(1024 / gbs), worked by hand: batch 16: 768 / 16 = 48.0, 1,200,000 // 48 + 1 = 25,001, x 64 x 16;
    batch 32: 384 / 32 = 12.0, 100,001 x 32 x 32; batch 1: 12,288.0, 98 x 1024 x 1."""
    from hpcbench.workloads.mlperf_training.llama31_8b.config import reference_eval_index_samples as ref

    assert ref(1_200_000, 16) == 25_001 * 64 * 16 == 25_601_024
    assert ref(1_200_000, 32) == 100_001 * 32 * 32
    assert ref(1_200_000, 1) == 98 * 1024


def test_full_preset_warms_up_as_nemo_and_ends_at_a_tenth() -> None:
    from hpcbench.common.schedule import Schedule

    cfg = registry.get("llama31_8b").load_config("full")
    s = Schedule.from_config(cfg.optim, steps_per_epoch=1_200_000, max_epochs=1)
    assert [s.value(k) for k in (0, 15, 16)] == pytest.approx([4e-4 / 17, 4e-4 * 16 / 17, 4e-4], rel=1e-9)
    assert s.value(1_200_000) == pytest.approx(4e-5) and s.decay_steps == 1_200_000 - 16


SEPARATOR = "\n" + "-" * 30 + "\n"  # how the checker joins its messages (mlp_compliance.log_messages)


def checker_failures(output: str) -> list[str]:
    """The first line of each message the compliance checker reported: everything from its first WARNING up to
    its verdict, split at its message separator (parsing errors, failed CHECKs, missing keys, end checks)."""
    start = output.find("WARNING -")
    if start < 0:
        return []
    end = output.find("ERROR - FAILED", start)
    body = output[start:end if end >= 0 else len(output)]
    return [m.strip().removeprefix("WARNING -").strip().splitlines()[0] for m in body.split(SEPARATOR) if m.strip()]


#: the full preset with only the sizes shrunk: the synthetic corpus's prefix in the reference's blend; global batch
#: 1 so that the closed index size (max_steps x batch = 1,200,000 samples of 34 documents) builds in a second, and
#: the validation index the reference builds at batch 1 (98 x 1024 samples over 17 documents) too
SHRUNK = {"model.vocab_size": 64, "model.dim": 16, "model.layers": 1, "model.heads": 2, "model.kv_heads": 1,
          "model.ffn_dim": 32, "data.eval_samples": 16, "train.max_steps": 2, "train.global_batch_size": 1,
          "data.train_samples": 1_200_000, "data.train_blend": '["10", "synth_train_text_document"]',
          "data.eval_index_samples": 100_352}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A synthetic Markov corpus of 34 training and 17 validation documents of 8,192 tokens (vocabulary 64)."""
    data = tmp_path_factory.mktemp("llama_closed") / "data"
    gen = run_cli(["datagen", "llama31_8b", "--out", str(data), "--train-documents", "34", "--eval-documents", "17",
                   "--vocab-size", "64", "--min-len", "8192", "--max-len", "8192"], timeout=60)
    assert gen.returncode == 0, gen.stderr
    return data


def shrunk_full_run(data: Path, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    sets = [*(f"{k}={v}" for k, v in SHRUNK.items()), *extra]
    return run_cli(["train", "llama31_8b", "--config", "full", "--data", str(data), "--results", str(tmp_path / "res"),
                    "--device", "cpu", "--no-progress", *[a for kv in sets for a in ("--set", kv)]],
                   timeout=120, cwd=tmp_path)


def test_a_closed_run_with_a_fixed_key_changed_stops_before_run_start(corpus: Path, tmp_path: Path) -> None:
    """A fixed value the config check leaves to the record (AdamW beta 1): the trainer compares what it would log
    with the record's closed definition and stops before run_start, naming the key, its fixed value and the
    config's; the log is moved out of the results (it is not a run)."""
    proc = shrunk_full_run(corpus, tmp_path, "optim.betas=[0.8, 0.95]")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Traceback" not in out, out
    assert "opt_adamw_beta_1 = 0.9 (this config gives 0.8)" in out and "train.division = 'open'" in out, out
    logs = list((tmp_path / "res").rglob("result_*.txt"))
    assert len(logs) == 1 and logs[0].parent.name == "failed_before_run_start", logs
    assert '"key": "init_start"' in logs[0].read_text() and '"key": "run_start"' not in logs[0].read_text()


def test_full_preset_shrunk_dry_run_passes_the_closed_checker_but_sizes_and_target(corpus: Path,
                                                                                    tmp_path: Path) -> None:
    """`train llama31_8b --config full` with a tiny model (1 layer, width 16, vocabulary 64 of a synthetic Markov
    corpus from the workload's own datagen), 16 evaluation samples instead of 1024 (1024 samples of 8192 tokens
    take ~100 s on 2 cores) and 2 optimizer steps; max_sequence_length stays 8192 and every hyperparameter is the
    preset's but the global batch (1) and with it the closed index size (max_steps x 1), and the blend's prefix
    (the synthetic corpus's). A closed run evaluates on the rules' cadence only, every 12,288 sequences, so these
    2 steps reach none: the official training 6.0.0 checker may name only eval_samples (shrunk) and the missing
    evaluation; every other key of closed_llama31_8b.yaml passes."""
    from mlperf_logging import compliance_checker

    seq = 8192
    proc = shrunk_full_run(corpus, tmp_path)
    assert proc.returncode == 4 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr  # target not reached
    assert "aborted" in proc.stdout, proc.stdout
    log = result_log(tmp_path / "res")
    events = first_events(log)
    assert events["submission_division"] == "closed" and events["max_sequence_length"] == seq
    assert events["eval_samples"] == 16 and events["max_steps"] == 1_200_000

    rules = yaml.safe_load((Path(compliance_checker.__file__).parent / "training_6.0.0" /
                            "closed_llama31_8b.yaml").read_text())
    keys = [r["KEY"]["NAME"] for r in rules if "KEY" in r]
    # every closed key is logged but eval_accuracy: a closed run evaluates every 12,288 sequences only (the
    # record's closed_cadence_only), and 2 steps of 1 sequence reach no evaluation
    assert len(keys) == 17 and set(keys) - set(events) == {"eval_accuracy"}, set(keys) - set(events)

    check = subprocess.run([sys.executable, "-m", "mlperf_logging.compliance_checker", str(log), "--usage", "training",
                            "--ruleset", "6.0.0"], cwd=tmp_path, env=project_env(), capture_output=True, text=True,
                           timeout=60)
    out = check.stdout + check.stderr
    assert "closed_llama31_8b.yaml" in out, out  # the closed YAML was applied
    failures = checker_failures(out)
    # the shrunk eval_samples, and no evaluation at all (its first is after 12,288 sequences); nothing else
    # (the checker names an either-or pair in set order: compared as sets of words)
    named = sorted(tuple(sorted(f.split(" in line")[0].replace("'", "").split())) for f in failures)
    expected = ["CHECK for 'eval_samples' failed", "Required AT_LEAST_ONE occurrence of 'eval_accuracy' but found 0",
                "Required AT_LEAST_ONE occurrence of 'eval_start' or 'block_start'",
                "Required AT_LEAST_ONE occurrence of 'eval_stop' or 'block_stop'"]
    assert named == sorted(tuple(sorted(e.replace("'", "").split())) for e in expected), out


def test_full_preset_logs_the_index_size_as_train_samples(tmp_path: Path) -> None:
    """docs/closed.md, ``train_samples``: logged at the start as the training set's size, which for the full preset's
    one-prefix blend is exactly ``data.train_samples`` = max_steps x global batch = 19,200,000 (shrunk here: the same
    construction on a small corpus gives exactly the asked-for size)."""
    import numpy as np

    from hpcbench.workloads.mlperf_training.llama31_8b.dataset import LlamaData
    from test_llama_data import _docs, independent_write

    cfg = registry.get("llama31_8b").load_config("full")
    assert cfg.data.train_samples == cfg.model.max_steps * cfg.train.global_batch_size == 19_200_000
    assert cfg.data.train_blend == ["10", "c4-train.en_6_text_document"]
    (tmp_path / "train").mkdir()
    independent_write(tmp_path / "train" / "c4-train.en_6_text_document", _docs(np.random.RandomState(1), 50, 300))
    for asked in (7, 100, 333):  # fewer, about as many, more samples than one pass holds
        spec = LlamaData(16, 300, seed=5, train_samples=asked, train_blend=cfg.data.train_blend, index_cache="none")
        assert len(spec.open(tmp_path, "train")) == asked
