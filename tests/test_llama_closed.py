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

import yaml

from closed_yaml import check_closed_yaml
from conftest import first_events, project_env, result_log, run_cli
from hpcbench import registry
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
    t = w.target()
    assert (t.threshold, t.higher_is_better, t.reached(3.29), t.reached(3.31)) == (3.3, False, True, False)


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


def test_full_preset_shrunk_dry_run_passes_the_closed_checker_but_sizes_and_target(tmp_path: Path) -> None:
    """`train llama31_8b --config full` with a tiny model (1 layer, width 16, vocabulary 64 of a synthetic Markov
    corpus from the workload's own datagen), 16 evaluation samples instead of 1024 (1024 samples of 8192 tokens
    take ~100 s on 2 cores) and 2 optimizer steps; max_sequence_length stays 8192 and every hyperparameter is the
    preset's. The official training 6.0.0 checker may name only eval_samples (shrunk) and eval_accuracy's
    ATLEAST_ONE_CHECK (the target, unreachable in 2 steps); every other key of closed_llama31_8b.yaml passes."""
    from mlperf_logging import compliance_checker

    data, seq = tmp_path / "data", 8192
    gen = run_cli(["datagen", "llama31_8b", "--out", str(data), "--train-documents", "34", "--eval-documents", "17",
                   "--vocab-size", "64", "--min-len", str(seq), "--max-len", str(seq)], timeout=60)
    assert gen.returncode == 0, gen.stderr
    sizes = {"model.vocab_size": 64, "model.dim": 16, "model.layers": 1, "model.heads": 2, "model.kv_heads": 1,
             "model.ffn_dim": 32, "data.eval_samples": 16, "train.max_steps": 2}
    proc = run_cli(["train", "llama31_8b", "--config", "full", "--data", str(data), "--results", str(tmp_path / "res"),
                    "--device", "cpu", "--no-progress", *[a for k, v in sizes.items() for a in ("--set", f"{k}={v}")]],
                   timeout=120, cwd=tmp_path)
    assert proc.returncode == 4 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr  # target not reached
    assert "aborted" in proc.stdout, proc.stdout
    log = result_log(tmp_path / "res")
    events = first_events(log)
    assert events["submission_division"] == "closed" and events["max_sequence_length"] == seq
    assert events["eval_samples"] == 16 and events["max_steps"] == 1_200_000

    rules = yaml.safe_load((Path(compliance_checker.__file__).parent / "training_6.0.0" /
                            "closed_llama31_8b.yaml").read_text())
    keys = [r["KEY"]["NAME"] for r in rules if "KEY" in r]
    assert len(keys) == 17 and not set(keys) - set(events), set(keys) - set(events)  # every closed key is logged

    check = subprocess.run([sys.executable, "-m", "mlperf_logging.compliance_checker", str(log), "--usage", "training",
                            "--ruleset", "6.0.0"], cwd=tmp_path, env=project_env(), capture_output=True, text=True,
                           timeout=60)
    out = check.stdout + check.stderr
    assert "closed_llama31_8b.yaml" in out, out  # the closed YAML was applied
    failures = checker_failures(out)
    allowed = {"CHECK for 'eval_samples' failed", "Failed checks for eval_accuracy : "}
    unexpected = [f for f in failures if not any(f.startswith(a) for a in allowed)]
    assert not unexpected, out
    # both shrunk items are named, so the parse above saw the checker's messages
    assert sorted(f.split(" in line")[0].split(" : ")[0] for f in failures) == [
        "CHECK for 'eval_samples' failed", "Failed checks for eval_accuracy"], out
