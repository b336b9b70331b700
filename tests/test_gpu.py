"""GPU paths that only a CUDA machine can run: an NCCL group on each rank's own GPU, two instances
sharing one GPU, the refusal of more ranks than GPUs, bf16 autocast through the harness, and the DALI
GPU pipelines. Each test skips, with its reason, where torch sees no GPU (or DALI is not installed);
the same rules are tested without a GPU in test_device_choice.py."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.conftest import project_env, run_cli, run_mpi

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU; torch sees none here")


def _dali() -> None:
    pytest.importorskip("nvidia.dali", reason="NVIDIA DALI (nvidia-dali-cuda120) is not installed")


def _rows(stdout: str) -> list[dict]:
    return sorted(json.loads(stdout.strip().splitlines()[-1]), key=lambda r: r["world_rank"])


@needs_cuda
@pytest.mark.mpi
def test_nccl_group_all_reduces_with_each_rank_on_its_own_gpu() -> None:
    n = 2 if torch.cuda.device_count() >= 2 else 1  # two ranks need two GPUs; else one rank's NCCL init
    rows = _rows(run_mpi(n, ["tests/mpi_scripts/dist_check.py", "1", "-", "cuda"], timeout=180).stdout)
    assert [r["backend"] for r in rows] == ["nccl"] * n
    assert [r["device"] for r in rows] == [f"cuda:{i}" for i in range(n)]  # by node-local rank
    assert [r["current_device"] for r in rows] == list(range(n))  # set before the NCCL group existed
    assert all(r["tensor_device"].startswith("cuda") and r["torch_sum"] == sum(range(n)) for r in rows)


@needs_cuda
@pytest.mark.mpi
def test_two_instances_may_share_one_gpu_with_separate_nccl_groups() -> None:
    proc = run_mpi(2, ["tests/mpi_scripts/dist_check.py", "2", "1", "cuda"], timeout=180,
                   env=project_env(CUDA_VISIBLE_DEVICES=_first_gpu()))
    rows = _rows(proc.stdout)
    assert [r["device"] for r in rows] == ["cuda:0", "cuda:0"] and [r["backend"] for r in rows] == ["nccl", "nccl"]
    assert [r["torch_sum"] for r in rows] == [0.0, 1.0]  # each instance reduces over itself only
    assert "instances share GPUs" in proc.stderr


@needs_cuda
@pytest.mark.mpi
def test_two_ranks_of_one_instance_on_one_visible_gpu_are_refused_before_any_work(tmp_path: Path) -> None:
    results = tmp_path / "results"
    proc = run_mpi(2, ["-m", "hpcbench", "train", "tests.harness_toy:ToyWorkload", "--config",
                       "tests/harness_configs/mini.toml", "--no-progress", "--device", "cuda",
                       "--results", str(results)],
                   timeout=180, check=False, env=project_env(CUDA_VISIBLE_DEVICES=_first_gpu()))
    assert proc.returncode != 0
    assert proc.stderr.count("2 ranks run on this node but only 1 GPU") == 1, proc.stderr
    assert "--device cpu" in proc.stderr and "Duplicate GPU" not in proc.stderr
    assert not results.exists()  # refused before the results folder, staging and NCCL


def _first_gpu() -> str:
    """CUDA_VISIBLE_DEVICES that shows the ranks one GPU: the first of those this process sees."""
    import os

    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return visible.split(",")[0] if visible else "0"


@needs_cuda
def test_info_names_each_ranks_gpu() -> None:
    proc = run_cli(["info", "--json", "--device", "cuda"], timeout=120)
    assert proc.returncode == 0, proc.stderr
    (row,) = json.loads(proc.stdout)["layout"]
    assert row["device"] == "cuda:0" and row["gpu_name"] == torch.cuda.get_device_name(0)
    assert row["pci_bus_id"] is None or row["pci_bus_id"].count(":") == 2


@pytest.fixture(scope="module")
def cuda_env():  # noqa: ANN201 - one NCCL group of one rank for the in-process runs of this module
    if not CUDA:
        pytest.skip("needs a CUDA GPU; torch sees none here")
    from hpcbench.common.dist import init_distributed

    env = init_distributed(device="cuda")
    yield env
    env.close()


def test_bf16_autocast_through_the_harness_on_cuda(cuda_env) -> None:  # noqa: ANN001
    assert cuda_env.torch_backend == "nccl" and cuda_env.device.type == "cuda"
    check_bf16_autocast_through_the_harness(cuda_env)


def check_bf16_autocast_through_the_harness(env) -> None:  # noqa: ANN001
    """One epoch of the toy workload in fp32 and in bf16 on ``env.device``: bf16 autocast reaches the
    model, the master weights stay fp32 on the device, and the first losses agree within 10%."""
    from hpcbench.common.mllog import MLPerfLogger
    from hpcbench.common.system import SystemDescription
    from hpcbench.common.trainer import Trainer
    from tests.harness_toy import ToyWorkload

    class Recording(ToyWorkload):
        dtypes: set[torch.dtype]

        def forward(self, model, batch):  # noqa: ANN001, ANN201
            out = super().forward(model, batch)
            if model.training:
                self.dtypes.add(out.dtype)
            return out

    out = {}
    for precision in ("fp32", "bf16"):
        cfg = ToyWorkload.load_config("mini", ["train.target=0.0", "train.max_epochs=1", "data.train=128",
                                               f"train.precision={precision}"])
        wl = Recording(cfg)
        wl.dtypes = set()
        tr = Trainer(wl, env, MLPerfLogger(None), SystemDescription(), progress=False)
        result = tr.run()
        out[precision] = (tr.parts.flat.params.detach().clone(), result.epoch_losses, wl.dtypes)
    (p32, l32, d32), (p16, l16, d16) = out["fp32"], out["bf16"]
    assert d32 == {torch.float32} and d16 == {torch.bfloat16}  # the training steps ran under bf16 autocast
    assert p16.device.type == env.device.type and p16.dtype == torch.float32  # fp32 master weights
    assert torch.isfinite(p16).all() and not torch.equal(p16, p32)
    assert l16[0] == pytest.approx(l32[0], rel=0.1)


@needs_cuda
@pytest.mark.parametrize("kind", ["plain", "gzip"])
def test_cosmoflow_dali_gpu_pipeline_matches_the_torch_loader(tmp_path: Path, kind: str) -> None:
    _dali()
    check_cosmoflow_dali(tmp_path, kind, torch.device("cuda", 0))


@needs_cuda
def test_deepcam_dali_gpu_pipeline_matches_the_torch_loader(tmp_path: Path) -> None:
    _dali()
    check_deepcam_dali(tmp_path, torch.device("cuda", 0))


def check_cosmoflow_dali(root: Path, kind: str, device: torch.device) -> None:
    """CosmoFlow's DALI pipeline on ``device`` yields the torch loader's CPU batches (one train epoch
    and the eval set): the same samples, and log1p on the device within an ulp."""
    from hpcbench.common.workload import DataShard
    from hpcbench.workloads.cosmoflow import synth
    from hpcbench.workloads.cosmoflow.workload import CosmoFlowWorkload

    synth.generate(root, 6, 3, 8, seed=3, workers=1, compress=kind == "gzip", progress=False)

    def batches(loader: str, dev: torch.device) -> list:
        cfg = CosmoFlowWorkload.load_config("mini", [f"data.root={root}", "data.size=8", f"train.loader={loader}",
                                                     "model.conv_layers=2"])
        shard = DataShard(rank=0, size=1, seed=5, local_batch_size=2, device=dev)
        wl = CosmoFlowWorkload(cfg)
        train, evl = wl.train_loader(shard), wl.eval_loader(shard)
        train.set_epoch(1)
        evl.set_epoch(1)
        return list(train) + list(evl)

    got, ref = batches("dali", device), batches("torch", torch.device("cpu"))
    assert len(got) == len(ref) == 5  # 3 train batches of 2, eval 2 + 1
    for (xg, yg), (xr, yr) in zip(got, ref):
        assert xg.device.type == yg.device.type == device.type
        torch.testing.assert_close(xg.cpu(), xr, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(yg.cpu(), yr, rtol=0, atol=0)


def check_deepcam_dali(root: Path, device: torch.device) -> None:
    """DeepCAM's DALI pipeline on ``device`` yields the torch loader's CPU eval batches, in either layout."""
    from hpcbench.common.workload import DataShard
    from hpcbench.workloads.deepcam.datagen import write_dataset
    from hpcbench.workloads.deepcam.workload import DeepCAMWorkload

    write_dataset(root, samples=4, eval_samples=3, height=32, width=48, seed=7, workers=1)
    for cl in (True, False):
        def batches(loader: str, dev: torch.device) -> list:
            cfg = DeepCAMWorkload.load_config("mini", [f"data.root={root}", f"train.loader={loader}",
                                                       f"train.channels_last={str(cl).lower()}", "data.threads=2"])
            shard = DataShard(rank=0, size=1, seed=0, local_batch_size=2, device=dev)
            evl = DeepCAMWorkload(cfg).eval_loader(shard)
            evl.set_epoch(1)
            return list(evl)

        got, ref = batches("dali", device), batches("torch", torch.device("cpu"))
        assert len(got) == len(ref) == 2
        for (xg, yg), (xr, yr) in zip(got, ref):
            assert xg.device.type == device.type
            torch.testing.assert_close(xg.cpu(), xr, rtol=1e-5, atol=1e-5)
            assert torch.equal(yg.cpu(), yr)


@needs_cuda
def test_auto_choices_on_the_gpu_follow_its_compute_capability() -> None:
    from torch import nn

    from hpcbench.common.auto import choose_channels_last, choose_precision

    dev = torch.device("cuda", 0)
    major, _ = torch.cuda.get_device_capability(dev)
    prec = choose_precision("auto", dev)
    assert prec.value == ("bf16" if major >= 8 else "fp32") and torch.cuda.get_device_name(dev) in prec.reason
    cl = choose_channels_last("auto", dev, nn.Conv2d(2, 2, 3), prec.value,
                              probe=lambda: pytest.fail("no probe on a GPU: a rule decides"))
    assert cl.value is (major >= 7 and prec.value == "bf16")
    assert choose_channels_last("auto", dev, nn.Linear(2, 2), prec.value, probe=None).value is False
