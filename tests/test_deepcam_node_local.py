"""DeepCAM staged with two nodes per instance: each node holds its part of the files and its own
copy of stats.h5 (the layout replicates it), and the logged dataset sizes are the sums over nodes."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import first_events as _events
from tests.conftest import result_log, run_cli, run_mpi
from tests.conftest import visible_files as _files


@pytest.mark.mpi
def test_one_instance_of_two_nodes_trains_on_node_local_parts(tmp_path: Path) -> None:
    raw, packed, local, results = (tmp_path / n for n in ("raw", "packed", "local", "results"))
    proc = run_cli(["datagen", "deepcam", "--out", str(raw), "--samples", "8", "--eval-samples", "4",
                    "--height", "32", "--width", "48", "--workers", "1"])
    assert proc.returncode == 0, proc.stderr
    proc = run_cli(["pack", "--dataset", "deepcam", "--source", str(raw), "--dest", str(packed),
                    "--shard-mb", "0.05", "--no-progress"])
    assert proc.returncode == 0, proc.stderr
    # two ranks of one instance on this host: the CPU (gloo), also on a GPU node with fewer GPUs than ranks
    proc = run_mpi(2, ["-m", "hpcbench", "train", "deepcam", "--config", "mini", "--instances", "1", "--device", "cpu",
                       "--ranks-per-node", "1", "--stage-from", str(packed), "--stage-to", str(local / "node{node}"),
                       "--results", str(results), "--no-progress", "--set", "train.max_epochs=1",
                       "--set", "train.global_batch_size=2", "--set", "data.threads=1",
                       "--set", "optim.warmup=1"], timeout=300, check=False)
    assert proc.returncode in (0, 4), proc.stdout + proc.stderr  # 4: one epoch need not reach the target
    for split in ("train", "validation"):
        a, b = _files(local / "node0" / split), _files(local / "node1" / split)
        assert a and b and not (a & b) and a | b == _files(raw / split)
    assert (local / "node0" / "stats.h5").is_file() and (local / "node1" / "stats.h5").is_file()
    ev = _events(result_log(results))
    assert ev["number_of_nodes"] == 2
    assert ev["train_samples"] == 8 and ev["eval_samples"] == 4  # summed over the instance's nodes
    assert "epoch_stop" in ev
    # one rank per node, local batch 1: every rank runs the smaller node's sample count
    per_node = [len(_files(local / f"node{n}" / "train")) for n in (0, 1)]
    assert ev["steps_per_epoch"] == min(per_node)
