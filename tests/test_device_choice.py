"""`--device auto|cpu|cuda`: the choice, the GPU each rank takes, and the refusal of a layout with more
ranks of an instance on a node than GPUs, before any work. The rules are pure functions tested with
made-up counts; the CLI paths run for real (on a box without CUDA, `--device cuda` must fail clearly)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from hpcbench.common.dist import assign_gpus, gpu_layout_error, resolve_device, shared_gpus_note
from hpcbench.common.errors import ConfigError, DistributedError
from tests.conftest import run_cli, run_mpi

TOY = ["tests.harness_toy:ToyWorkload", "--config", "tests/harness_configs/mini.toml", "--no-progress"]
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA error; this machine has CUDA")


def test_auto_takes_cuda_when_present_and_cuda_without_it_is_a_clear_error() -> None:
    assert resolve_device("auto", True) == "cuda" and resolve_device("auto", False) == "cpu"
    assert resolve_device("cpu", True) == "cpu" and resolve_device("cuda", True) == "cuda"
    with pytest.raises(DistributedError, match=r"--device cuda: torch sees no CUDA device here \(a CPU-only build\)"
                                               r".*--device cpu"):
        resolve_device("cuda", False, "a CPU-only build")
    with pytest.raises(DistributedError, match="one of auto, cpu, cuda, got 'gpu'"):
        resolve_device("gpu", True)


def test_two_local_ranks_on_one_gpu_are_refused_with_both_numbers_and_the_way_out() -> None:
    with pytest.raises(DistributedError) as err:
        assign_gpus([0, 0], 1, "gpu07")
    msg = str(err.value)
    assert msg == gpu_layout_error(2, 1, "gpu07")
    assert "gpu07: 2 ranks run on this node but only 1 GPU (torch.cuda.device_count() = 1)" in msg
    assert "at most 1 rank per node" in msg and "--device cpu" in msg
    with pytest.raises(DistributedError, match=r"instance 1 has 3 ranks on this node but only 2 GPUs"):
        assign_gpus([0, 0, 1, 1, 1], 2)
    with pytest.raises(DistributedError, match="only 0 GPUs"):
        assign_gpus([0], 0)


def test_ranks_map_to_gpus_by_node_local_rank() -> None:
    assert assign_gpus([0, 0, 0, 0], 4) == [0, 1, 2, 3]  # one instance: local rank i -> GPU i
    assert assign_gpus([0, 0], 4) == [0, 1]
    assert assign_gpus([0, 0, 1, 1], 4) == [0, 1, 2, 3]  # instances spread over the node's GPUs
    assert assign_gpus([0, 0, 1, 1], 2) == [0, 1, 0, 1]
    assert assign_gpus([0, 0, 1, 1], 3) == [0, 1, 2, 0]
    assert assign_gpus([0, 1, 0, 1], 2) == [0, 1, 1, 0]  # ranks placed round-robin: still distinct per instance
    assert assign_gpus([], 0) == []


def test_instances_may_share_a_gpu_and_are_told_so() -> None:
    got = assign_gpus([0, 1], 1)  # `hpcbench run` on a one-GPU node: 2 instances x 1 rank
    assert got == [0, 0]
    note = shared_gpus_note([0, 1], got, "gpu07")
    assert note is not None and "GPU 0: instances 0, 1" in note and "shared GPU" in note
    assert shared_gpus_note([0, 0], [0, 1]) is None


@no_cuda
def test_device_cuda_without_cuda_fails_before_any_work(tmp_path: Path) -> None:
    results = tmp_path / "results"
    proc = run_cli(["train", *TOY, "--device", "cuda", "--results", str(results)], timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "--device cuda: torch sees no CUDA device here" in proc.stderr and "--device cpu" in proc.stderr
    assert not results.exists()  # refused before the results folder, staging or training
    work = tmp_path / "work"
    proc = run_cli(["run", "--workdir", str(work), "--device", "cuda"], timeout=120)
    assert proc.returncode == 2 and "torch sees no CUDA device" in proc.stderr, proc.stdout + proc.stderr
    assert "datagen" not in proc.stdout and not work.exists()  # before any data is generated


@no_cuda
def test_info_shows_a_refused_device_with_the_layout_and_fails() -> None:
    proc = run_cli(["info", "--json", "--device", "cuda"])
    assert proc.returncode == 2 and proc.stderr.count("torch sees no CUDA device") == 1, proc.stderr
    report = json.loads(proc.stdout)
    assert "torch sees no CUDA device" in report["device_choice"]["error"]
    assert [r["device"] for r in report["layout"]] == ["refused"]


@no_cuda
@pytest.mark.mpi
def test_device_cuda_without_cuda_under_mpiexec_is_one_message_and_no_work(tmp_path: Path) -> None:
    results = tmp_path / "results"
    proc = run_mpi(2, ["-m", "hpcbench", "train", *TOY, "--device", "cuda", "--results", str(results)],
                   timeout=120, check=False)
    assert proc.returncode != 0
    assert proc.stderr.count("--device cuda: torch sees no CUDA device here") == 1, proc.stderr
    assert not results.exists()


def test_device_cpu_trains_with_gloo(tmp_path: Path) -> None:
    """The CPU path is a choice, not only a fallback: on a GPU node too it trains on the CPU."""
    proc = run_cli(["train", *TOY, "--device", "cpu", "--results", str(tmp_path), "--system-name", "toy",
                    "--set", "train.max_epochs=1", "--set", "train.target=0.0"], timeout=240)
    assert proc.returncode == 4, proc.stdout + proc.stderr  # one epoch, unreachable target: aborted, logged
    assert "instance 0: aborted after 1 epochs" in proc.stdout


@pytest.mark.mpi
def test_info_shows_each_ranks_device(tmp_path: Path) -> None:
    proc = run_mpi(2, ["-m", "hpcbench", "info", "--json", "--device", "cpu", "--ranks-per-node", "1"], timeout=120)
    rows = json.loads(proc.stdout)["layout"]
    assert [(r["world_rank"], r["host_local_rank"], r["device"]) for r in rows] == [(0, 0, "cpu"), (1, 1, "cpu")]
    assert all(r["hostname"] and "pci_bus_id" in r and "gpu_name" in r for r in rows)
    table = run_cli(["info", "--device", "cpu"])
    assert table.returncode == 0 and "device" in table.stdout and "cpu" in table.stdout, table.stderr


def test_job_scripts_pass_the_systems_device_and_refuse_more_ranks_than_gpus(tmp_path: Path) -> None:
    from hpcbench.jobs import JobSpec, render

    gpu = render(JobSpec(system="gpu-cluster", workload="cosmoflow", instances=2))
    assert "--device cuda" in gpu
    assert "--device cpu" in render(JobSpec(system="local", workload="cosmoflow", instances=2))
    assert "--device cpu" in render(JobSpec(system="gpu-cluster", workload="cosmoflow", device="cpu"))
    system = tmp_path / "fat.toml"
    text = (Path(__file__).resolve().parents[1] / "jobs" / "systems" / "gpu-cluster.toml").read_text()
    system.write_text(text.replace("tasks_per_node = 4", "tasks_per_node = 8"))
    with pytest.raises(ConfigError, match=r"tasks_per_node = 8 ranks per node but node.gpus_per_node = 4.*--device cpu"):
        render(JobSpec(system=str(system), workload="cosmoflow"))
    assert "--device cpu" in render(JobSpec(system=str(system), workload="cosmoflow", device="cpu"))


def test_ranks_that_see_different_gpus_do_not_compete_and_overlaps_are_caught() -> None:
    from hpcbench.common.dist import plan_host_gpus

    every = ("GPU-a", "GPU-b", "GPU-c", "GPU-d")
    assert plan_host_gpus([(0, every)] * 4) == [0, 1, 2, 3]  # all see all: by node-local rank
    # one GPU per task (CUDA_VISIBLE_DEVICES per rank, or a cgroup showing each its own GPU as device 0)
    assert plan_host_gpus([(0, (g,)) for g in every]) == [0, 0, 0, 0]
    with pytest.raises(DistributedError, match="2 ranks run on this node but only 1 GPU"):
        plan_host_gpus([(0, ("GPU-a",)), (0, ("GPU-a",))], "n1")
    with pytest.raises(DistributedError, match="ranks 0 and 1 on this node .instance 0. would both use GPU GPU-b"):
        plan_host_gpus([(0, ("GPU-b", "GPU-a")), (0, ("GPU-b",))])
    assert plan_host_gpus([(0, ("GPU-a",)), (1, ("GPU-a",))]) == [0, 0]  # two instances may share
    note = shared_gpus_note([0, 1], ["GPU-a", "GPU-a"])
    assert note is not None and "GPU-a: instances 0, 1" in note
