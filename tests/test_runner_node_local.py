"""Staged training with several nodes per instance: node j holds shard-set j only, the node's ranks
split its files, and the logged dataset size is the sum over nodes."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import first_events as _events
from tests.conftest import result_log, run_cli, run_mpi
from tests.conftest import visible_files as _files


@pytest.mark.mpi
def test_two_instances_of_two_nodes_train_on_node_local_parts(tmp_path: Path) -> None:
    raw, packed, local, results = (tmp_path / n for n in ("raw", "packed", "local", "results"))
    assert run_cli(["datagen", "cosmoflow", "--out", str(raw), "--samples", "48", "--val-samples", "16",
                    "--size", "8", "--plain", "--quiet", "--workers", "1"]).returncode == 0
    proc = run_cli(["pack", "--dataset", "cosmoflow", "--source", str(raw), "--dest", str(packed),
                    "--shard-mb", "0.05", "--no-progress"])
    assert proc.returncode == 0, proc.stderr
    # 2 ranks per instance on this host: the CPU (gloo), also on a GPU node with fewer GPUs than that
    proc = run_mpi(4, ["-m", "hpcbench", "train", "cosmoflow", "--config", "mini", "--instances", "2", "--device", "cpu",
                       "--ranks-per-node", "1", "--stage-from", str(packed), "--stage-to", str(local / "node{node}"),
                       "--results", str(results), "--no-progress", "--set", "data.size=8",
                       "--set", "model.conv_layers=2", "--set", "train.max_epochs=1",
                       "--set", "train.global_batch_size=4"], timeout=300, check=False)
    assert proc.returncode in (0, 4), proc.stdout + proc.stderr  # 4: one epoch need not reach the target
    for first in (0, 2):  # nodes of instance 0 and of instance 1
        a, b = _files(local / f"node{first}" / "train"), _files(local / f"node{first + 1}" / "train")
        assert a and b and not (a & b) and a | b == _files(raw / "train")
    for instance in (0, 1):
        ev = _events(result_log(results, instance))
        assert ev["number_of_nodes"] == 2
        assert ev["train_samples"] == 48 and ev["eval_samples"] == 16  # summed over the instance's nodes
        # each node holds ~24 training files and its 1 rank a local batch of 2: about 12 steps, the
        # same on both nodes (the smaller node's count), never the 24 of a whole-dataset count
        assert 10 <= ev["steps_per_epoch"] <= 12
