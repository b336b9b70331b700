"""Distributed bootstrap: real MPI ranks, instance split, one torch (gloo) group per instance."""
from __future__ import annotations

import json
import re

import pytest

from hpcbench.common.dist import init_distributed, split_instances
from hpcbench.common.errors import DistributedError
from tests.conftest import run_cli, run_mpi


def test_split_instances_requires_even_division() -> None:
    assert split_instances(8, 4) == 2
    with pytest.raises(DistributedError, match=r"cannot split 6 ranks into 4 instances.*1, 2, 3, 6"):
        split_instances(6, 4)
    with pytest.raises(DistributedError, match=">= 1"):
        split_instances(4, 0)


@pytest.mark.parametrize("device", ["auto", "cpu"])
def test_single_process_layout_and_torch_group(device: str) -> None:
    import torch
    import torch.distributed as tdist

    env = init_distributed(instances=1, device=device)
    try:
        lay = env.layout
        assert (lay.world_rank, lay.world_size, lay.instance, lay.instance_size, lay.num_nodes) == (0, 1, 0, 1, 1)
        assert (lay.host_local_rank, lay.host_local_size) == (0, 1)
        # auto: CUDA + NCCL where torch sees a GPU; cpu: gloo on the CPU, also on a GPU node
        cuda = device == "auto" and torch.cuda.is_available()
        assert env.device.type == ("cuda" if cuda else "cpu")
        assert env.torch_backend == ("nccl" if cuda else "gloo") and tdist.get_world_size() == 1
    finally:
        env.close()


@pytest.mark.mpi
def test_four_ranks_two_instances_have_separate_groups() -> None:
    proc = run_mpi(4, ["tests/mpi_scripts/dist_check.py", "2", "2"], timeout=120)
    rows = sorted(json.loads(proc.stdout.strip().splitlines()[-1]), key=lambda r: r["world_rank"])
    assert [r["instance"] for r in rows] == [0, 0, 1, 1]
    assert [r["instance_rank"] for r in rows] == [0, 1, 0, 1]
    assert [r["node_index"] for r in rows] == [0, 0, 1, 1]
    assert all(r["num_nodes"] == 2 and r["nodes_per_instance"] == 1 for r in rows)
    # all-reduce inside an instance sums only that instance's world ranks: {0,1} -> 1, {2,3} -> 5
    assert [r["torch_sum"] for r in rows] == [1.0, 1.0, 5.0, 5.0]
    assert [r["mpi_sum"] for r in rows] == [1, 1, 5, 5]
    assert all(r["torch_world"] == 2 and r["backend"] == "gloo" and r["device"] == "cpu" for r in rows)  # --device cpu
    # 4 ranks share this host (nodes of 2 are emulated): threads = CPUs // 4, at least 1
    assert all(r["host_local_size"] == 4 and r["threads"] >= 1 for r in rows)
    assert [r["host_local_rank"] for r in rows] == [0, 1, 2, 3] and [r["local_rank"] for r in rows] == [0, 1, 0, 1]


@pytest.mark.mpi
def test_info_under_mpiexec_shows_ranks_and_instances() -> None:
    # --device cpu: 2 ranks per instance on this host would be refused on a node with one GPU
    proc = run_mpi(4, ["-m", "hpcbench", "info", "--instances", "2", "--json", "--device", "cpu"], timeout=120)
    report = json.loads(proc.stdout)
    assert report["ranks"] == 4
    assert report["nodes"] == 1  # shared-memory split: one host
    assert report["instances"] == 2 and report["ranks_per_instance"] == 2
    assert "MPICH" in report["mpi_library"] or "Open MPI" in report["mpi_library"]
    assert [r["instance"] for r in report["layout"]] == [0, 0, 1, 1]


@pytest.mark.mpi
def test_uneven_instances_error_once_and_nonzero() -> None:
    proc = run_mpi(4, ["-m", "hpcbench", "info", "--instances", "3"], timeout=120, check=False)
    assert proc.returncode != 0
    assert proc.stderr.count("cannot split 4 ranks into 3 instances") == 1


def test_info_single_process_table() -> None:
    proc = run_cli(["info"])
    assert proc.returncode == 0, proc.stderr
    assert "MPI library" in proc.stdout and "DALI" in proc.stdout and "rank layout" in proc.stdout


def test_idle_barrier_waits_for_the_last_rank_while_sleeping() -> None:
    """``idle_barrier`` (the long waits: a finished instance for the others, the ranks while rank 0 probes the
    layout) is a barrier, since no rank leaves before rank 0 arrives, and the waiting ranks sleep instead of
    busy-polling as MPICH's MPI_Barrier does. Run through ``benchmarks.idle_wait``, which times both in one
    job."""
    proc = run_mpi(3, ["-m", "benchmarks.idle_wait", "--hold", "1", "--rounds", "2", "--calls", "5"], timeout=120)
    rows = {ln.split(":")[0].strip(): ln for ln in proc.stdout.splitlines() if "held wait" in ln}
    assert set(rows) == {"MPI_Barrier (baseline)", "idle_barrier"}, proc.stdout
    idle = rows["idle_barrier"]
    cpu = float(re.search(r"waiting ranks' CPU +([0-9.]+) s", idle).group(1))
    released_ms = float(re.search(r"released +(-?[0-9.]+) ms after rank 0 arrived", idle).group(1))
    # two ranks waiting 1 s: spinning would cost up to 2 s of CPU; sleeping between polls a few ms
    assert cpu < 0.5, idle
    assert released_ms >= 0, idle  # nobody left before rank 0 had entered
    assert "idle / baseline: CPU of the waiting ranks" in proc.stdout
