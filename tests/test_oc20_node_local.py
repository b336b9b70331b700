"""OC20 staged to node-local storage with 2 nodes per instance: each node holds some of a split's
LMDB files only, reads the sample sizes from its own files (no split-wide metadata), and the logged
dataset sizes are the sums over the instance's nodes."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import first_events as _events
from tests.conftest import result_log, run_cli, run_mpi
from tests.conftest import visible_files as _files


@pytest.mark.mpi
def test_one_instance_of_two_nodes_trains_on_node_local_lmdb_files(tmp_path: Path) -> None:
    raw, packed, local, results = (tmp_path / n for n in ("raw", "packed", "local", "results"))
    proc = run_cli(["datagen", "oc20", "--out", str(raw), "--seed", "1", "--workers", "1", "--train", "8", "--val", "4",
                    "--size", "2,2,2", "--cutoff", "4", "--max-neighbors", "10", "--per-shard", "2", "--no-progress"])
    assert proc.returncode == 0, proc.stderr
    assert len(_files(raw / "train")) == 4 and len(_files(raw / "validation")) == 2  # files to share out
    proc = run_cli(["pack", "--dataset", "oc20", "--source", str(raw), "--dest", str(packed), "--shard-mb", "0.02",
                    "--no-progress"])
    assert proc.returncode == 0, proc.stderr
    proc = run_mpi(2, ["-m", "hpcbench", "train", "oc20", "--config", "mini", "--instances", "1",
                       "--ranks-per-node", "1", "--stage-from", str(packed), "--stage-to", str(local / "node{node}"),
                       "--results", str(results), "--no-progress", "--set", "train.max_epochs=1",
                       "--set", "train.global_batch_size=2", "--set", "model.hidden=16", "--set", "model.out_emb=16",
                       "--set", "model.int_emb=8", "--set", "model.blocks=1", "--set", "model.cutoff=4.0"],
                   timeout=300, check=False)
    assert proc.returncode in (0, 4), proc.stdout + proc.stderr  # 4: one epoch need not reach the target
    for split in ("train", "validation"):
        a, b = _files(local / "node0" / split), _files(local / "node1" / split)
        assert a and b and not (a & b) and a | b == _files(raw / split)
    ev = _events(result_log(results))
    assert ev["number_of_nodes"] == 2 and "epoch_stop" in ev
    assert ev["train_samples"] == 8 and ev["eval_samples"] == 4  # summed over the instance's nodes
    # one rank per node, local batch 1, 2 samples per LMDB file: the smaller node's sample count
    per_node = [2 * len(_files(local / f"node{n}" / "train")) for n in (0, 1)]
    assert ev["steps_per_epoch"] == min(per_node)
