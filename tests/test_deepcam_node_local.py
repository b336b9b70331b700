"""DeepCAM staged with two nodes per instance: each node holds its part of the files and its own
copy of stats.h5 (the layout replicates it), and the logged dataset sizes are the sums over nodes."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import first_events as _events
from tests.conftest import result_log, train_staged
from tests.conftest import visible_files as _files


@pytest.mark.mpi
def test_one_instance_of_two_nodes_trains_on_node_local_parts(tmp_path: Path) -> None:
    raw, local, results = train_staged(tmp_path, "deepcam", ["--samples", "8", "--eval-samples", "4", "--height", "32",
                                                             "--width", "48"], ranks=2, instances=1,
                                       sets=["train.global_batch_size=2", "data.threads=1", "optim.warmup=1"])
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
