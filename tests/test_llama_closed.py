"""llama31_8b closed keys: the `full` preset's logged hyperparameters (the workload's keys and the harness's
generic ones, as the trainer logs them) evaluated against every CHECK of the installed training 6.0.0
closed_llama31_8b.yaml; eval_samples comes from data.eval_samples (the data sizes are the dry run's only
stand-in), and the record's closed target is the checker's bound."""
from __future__ import annotations

from pathlib import Path

import yaml

from hpcbench import registry
from hpcbench.common.workload import DataSizes


def test_full_preset_keys_pass_the_closed_yaml() -> None:
    from mlperf_logging import compliance_checker

    cls = registry.get("llama31_8b")
    cfg = cls.load_config("full")
    w = cls(cfg)
    w.sizes = DataSizes(train_samples=10**6, eval_samples=cfg.data.eval_samples, steps_per_epoch=1000,
                        local_batch_size=cfg.train.global_batch_size)
    logged = {**w.hyperparameters(), "global_batch_size": cfg.train.global_batch_size,
              "gradient_accumulation_steps": cfg.train.grad_accum, "eval_samples": w.sizes.eval_samples}
    rules = yaml.safe_load((Path(compliance_checker.__file__).parent / "training_6.0.0" /
                            "closed_llama31_8b.yaml").read_text())
    state: dict = {}
    checked = []
    for rule in rules:
        key = rule.get("KEY")
        if not key or key["NAME"] == "eval_accuracy":
            continue
        name = key["NAME"]
        assert name in logged, f"{name} is not logged"
        v = {"value": logged[name], "metadata": {}}
        checks = key.get("CHECK", [])
        for check in [checks] if isinstance(checks, str) else checks:
            assert eval(check, {}, {"v": v, "s": state}), (name, check, logged[name])  # noqa: S307 - the checker's own
        if "POST" in key:
            exec(key["POST"], {}, {"v": v, "s": state})  # noqa: S102
        checked.append(name)
    assert len(checked) == 16  # every key of the YAML but eval_accuracy (the target, checked below)
    assert logged["opt_learning_rate_decay_steps"] == 1_200_000 - 16 and logged["max_sequence_length"] == 8192
    t = w.target()
    assert (t.threshold, t.higher_is_better, t.reached(3.29), t.reached(3.31)) == (3.3, False, True, False)
