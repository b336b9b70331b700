"""End to end on tiny data: `hpcbench datagen oc20` then `hpcbench train oc20` on 2 ranks."""
from __future__ import annotations

import json
from pathlib import Path

from hpcbench.workloads.opencatalyst.lmdbio import SplitDataset, shard_paths
from tests.conftest import run_cli, run_mpi, result_log


def test_datagen_then_train_two_ranks(tmp_path: Path) -> None:
    data = tmp_path / "data"
    proc = run_cli(["datagen", "oc20", "--out", str(data), "--seed", "3", "--workers", "1", "--train", "8",
                    "--val", "5", "--size", "2,2,2", "--cutoff", "4", "--max-neighbors", "10", "--per-shard", "4",
                    "--no-progress"])
    assert proc.returncode == 0, proc.stderr
    train = SplitDataset(shard_paths(data / "train"))
    assert len(train) == 8 and len(list((data / "train").glob("data.*.lmdb"))) == 2
    again = run_cli(["datagen", "oc20", "--out", str(tmp_path / "again"), "--seed", "3", "--workers", "1", "--train",
                     "8", "--val", "0", "--size", "2,2,2", "--cutoff", "4", "--max-neighbors", "10", "--per-shard", "8",
                     "--no-progress"])
    assert again.returncode == 0, again.stderr
    other = SplitDataset(shard_paths(tmp_path / "again" / "train"))
    assert all((train[k]["force"] == other[k]["force"]).all() for k in range(8))  # deterministic per seed
    results = tmp_path / "results"
    args = ["-m", "hpcbench", "train", "oc20", "--config", "mini", "--data", str(data), "--results", str(results),
            "--device", "cpu",  # 2 ranks of one instance on this host: gloo, also on a one-GPU node
            "--no-progress", "--set", "train.max_epochs=1", "--set", "train.eval_every=1", "--set", "train.target=10",
            "--set", "train.global_batch_size=4", "--set", "model.hidden=16", "--set", "model.out_emb=16",
            "--set", "model.int_emb=8", "--set", "model.blocks=1", "--set", "model.cutoff=4.0"]
    run_mpi(2, args, timeout=300)
    lines = [json.loads(x.split(":::MLLOG ", 1)[1]) for x in result_log(results).read_text().splitlines()
             if ":::MLLOG" in x]
    keys = {x["key"]: x for x in lines}
    assert keys["opt_name"]["value"] == "AdamW" and keys["submission_benchmark"]["value"] == "oc20"
    assert keys["train_samples"]["value"] == 8 and keys["eval_samples"]["value"] == 5  # last eval batch: 1 sample, 2 ranks
    assert 0 < keys["eval_error"]["value"] < 10 and keys["run_stop"]["metadata"]["status"] == "success"
