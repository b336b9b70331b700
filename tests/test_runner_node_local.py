"""Staged training with several nodes per instance: node j holds shard-set j only, the node's ranks
split its files, and the logged dataset size is the sum over nodes."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import first_events as _events
from tests.conftest import result_log, train_staged
from tests.conftest import visible_files as _files


@pytest.mark.mpi
def test_two_instances_of_two_nodes_train_on_node_local_parts(tmp_path: Path) -> None:
    raw, local, results = train_staged(tmp_path, "cosmoflow", ["--samples", "48", "--val-samples", "16", "--size", "8",
                                                               "--plain", "--quiet"], ranks=4, instances=2,
                                       sets=["data.size=8", "model.conv_layers=2", "train.global_batch_size=4"])
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
