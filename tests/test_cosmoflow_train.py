"""CosmoFlow on the harness end to end: datagen, then 2 ranks under mpiexec with each loader."""
from __future__ import annotations

import json

import pytest

from tests.conftest import run_cli, run_mpi, result_log


@pytest.mark.parametrize("loader", ["torch", "dali"])
def test_train_two_ranks_logs_the_cosmoflow_keys(tmp_path, loader: str) -> None:
    if loader == "dali":
        pytest.importorskip("nvidia.dali", reason="train.loader=dali needs NVIDIA DALI, which is not installed")
    data, results = tmp_path / "data", tmp_path / "results"
    proc = run_cli(["datagen", "cosmoflow", "--out", str(data), "--samples", "16", "--val-samples", "4",
                    "--size", "8", "--quiet", "--workers", "1"] + (["--plain"] if loader == "dali" else []))
    assert proc.returncode == 0, proc.stderr
    # 2 ranks of one instance on this host: the CPU (gloo), also on a GPU node with fewer GPUs than ranks
    proc = run_mpi(2, ["-m", "hpcbench", "train", "cosmoflow", "--config", "mini", "--data", str(data), "--device", "cpu",
                "--results", str(results), "--no-progress", "--set", "data.size=8", "--set", "model.conv_layers=2",
                "--set", "train.max_epochs=2", "--set", "train.global_batch_size=4", "--set", f"train.loader={loader}"],
            timeout=240, check=False)
    events = [json.loads(line.split(":::MLLOG ", 1)[1]) for line in result_log(results).read_text().splitlines()
              if ":::MLLOG " in line]
    by_key = {e["key"]: e for e in events}
    assert by_key["submission_benchmark"]["value"] == "cosmoflow"
    assert by_key["submission_division"]["value"] == "open"
    assert by_key["opt_name"]["value"] == "sgd"
    for key in ("opt_base_learning_rate", "opt_learning_rate_warmup_epochs", "opt_learning_rate_warmup_factor",
                "opt_learning_rate_decay_boundary_epochs", "opt_learning_rate_decay_factor", "dropout",
                "opt_weight_decay", "global_batch_size", "train_samples", "eval_samples"):
        assert key in by_key, key
    assert by_key["train_samples"]["value"] == 16 and by_key["eval_samples"]["value"] == 4
    evals = [e for e in events if e["key"] == "eval_error"]
    assert [e["metadata"]["epoch_num"] for e in evals] == [1, 2]
    assert all(0.0 < e["value"] < 2.0 for e in evals)
    status = by_key["run_stop"]["metadata"]["status"]
    assert status in ("aborted", "success")
    # `hpcbench train` exits 4 when an instance ends without reaching its target
    assert proc.returncode == (0 if status == "success" else 4), proc.stderr
