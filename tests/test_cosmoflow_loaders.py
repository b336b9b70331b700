"""Sharding, the torch and DALI loaders (same samples for the same seed and shard), the input transform."""
from __future__ import annotations

import json
import sys

import numpy as np
import pytest
import torch

from hpcbench.common.data.sampler import EpochSampler
from hpcbench.common.errors import DataError
from hpcbench.common.workload import DataShard
from hpcbench.workloads.cosmoflow import data, synth
from hpcbench.workloads.cosmoflow.dataset import CosmoFlowData
from hpcbench.workloads.cosmoflow.workload import CosmoFlowWorkload
from tests.conftest import ROOT, run_mpi

SIZE = 8


@pytest.fixture(scope="module")
def datasets(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("cosmo")
    out = {}
    for kind, compress in (("gzip", True), ("plain", False)):
        synth.generate(root / kind, 10, 5, SIZE, seed=3, workers=1, compress=compress, progress=False)
        out[kind] = str(root / kind)
    return out


def _workload(root: str, loader: str) -> CosmoFlowWorkload:
    cfg = CosmoFlowWorkload.load_config("mini", [f"data.root={root}", f"data.size={SIZE}", f"train.loader={loader}",
                                                 "model.conv_layers=2"])
    return CosmoFlowWorkload(cfg)


def _shard(files: list[str], rank: int, size: int, seed: int, epoch: int, local_batch: int,
           train: bool = True) -> list[str]:
    """The files a rank reads in an epoch under CosmoFlow's partition (the workload's sampler)."""
    sampler = EpochSampler(len(files), local_batch, rank, size, seed, CosmoFlowData.partition, train=train)
    sampler.set_epoch(epoch)
    return [files[i] for i in sampler.indices()]


def test_train_sharding_is_a_disjoint_equal_split_reshuffled_per_epoch() -> None:
    files = [f"f{i}" for i in range(23)]
    per_epoch = []
    for epoch in (0, 1):
        parts = [_shard(files, r, 3, 7, epoch, 2) for r in range(3)]
        assert all(len(p) == 6 for p in parts)  # 23 // 3 = 7 -> 3 full batches of 2
        flat = [f for p in parts for f in p]
        assert len(set(flat)) == len(flat)
        per_epoch.append(flat)
    assert per_epoch[0] != per_epoch[1]
    assert _shard(files, 1, 3, 7, 0, 2) == _shard(files, 1, 3, 7, 0, 2)
    evals = [_shard(files, r, 3, 7, 0, 1, train=False) for r in range(3)]
    assert sorted(f for p in evals for f in p) == sorted(files)


@pytest.mark.parametrize("kind", ["gzip", "plain"])
@pytest.mark.parametrize("rank", [0, 1])
def test_torch_and_dali_yield_identical_batches(datasets, kind: str, rank: int) -> None:
    pytest.importorskip("nvidia.dali")
    shard = DataShard(rank=rank, size=2, seed=11, local_batch_size=2, device=torch.device("cpu"))
    loaders = {name: (_workload(datasets[kind], name).train_loader(shard),
                      _workload(datasets[kind], name).eval_loader(shard)) for name in ("torch", "dali")}
    for epoch in (0, 1):
        got = {}
        for name, (train, evl) in loaders.items():
            train.set_epoch(epoch)
            got[name] = (list(train), list(evl))
            assert len(got[name][0]) == len(train) == 2
            assert len(got[name][1]) == len(evl)
        for (a_x, a_y), (b_x, b_y) in zip(got["torch"][0] + got["torch"][1], got["dali"][0] + got["dali"][1]):
            assert a_x.shape == b_x.shape and a_x.shape[1:] == (4, SIZE, SIZE, SIZE)
            torch.testing.assert_close(a_x, b_x, rtol=1e-6, atol=1e-6)  # log1p vs log(1+x): 1 ulp
            torch.testing.assert_close(a_y, b_y, rtol=0, atol=0)
    # eval: 5 files over 2 ranks -> rank 0 reads 3 (batches 2 + 1), rank 1 reads 2
    assert [b[0].shape[0] for b in got["dali"][1]] == ([2, 1] if rank == 0 else [2])


def test_loader_values_are_log1p_of_the_file(datasets) -> None:
    shard = DataShard(rank=0, size=1, seed=0, local_batch_size=5, device=torch.device("cpu"))
    (x, y), = list(_workload(datasets["gzip"], "torch").eval_loader(shard))
    first = data.read_sample(data.list_files(datasets["gzip"], "validation")[0], SIZE)
    torch.testing.assert_close(x[0], torch.log1p(torch.from_numpy(first.x.copy()).float()).permute(3, 0, 1, 2))
    torch.testing.assert_close(y[0], torch.from_numpy(first.y))


def test_transform_is_the_reference_log1p_within_one_ulp() -> None:
    # every int16 count, as a batch of 2 cubes of 16^3 x 4
    x = np.arange(2 * 16 ** 3 * 4, dtype=np.int64).reshape(2, 16, 16, 16, 4).astype(np.int16)
    y = torch.zeros(2, 4)
    for channels_last in (True, False):
        got, _ = CosmoFlowData(16, channels_last=channels_last).transform((torch.from_numpy(x), y))
        assert got.dtype == torch.float32 and got.shape == (2, 4, 16, 16, 16)
        ref = np.stack([np.log1p(np.moveaxis(s, -1, 0).astype(np.float32)) for s in x])  # the old torch path
        ulps = np.abs(np.ascontiguousarray(got.numpy()).view(np.int32).astype(np.int64) - ref.view(np.int32))
        assert ulps.max() <= 1, ulps.max()


@pytest.mark.parametrize("loader", ["torch", "dali"])
def test_input_layout_follows_channels_last(datasets, loader: str) -> None:
    if loader == "dali":
        pytest.importorskip("nvidia.dali")
    shard = DataShard(rank=0, size=1, seed=0, local_batch_size=5, device=torch.device("cpu"))
    got = {}
    for cl in (True, False):
        cfg = CosmoFlowWorkload.load_config("mini", [f"data.root={datasets['gzip']}", f"data.size={SIZE}",
                                                     f"train.loader={loader}", "model.conv_layers=2",
                                                     f"train.channels_last={str(cl).lower()}"])
        wl = CosmoFlowWorkload(cfg)
        (x, y), = list(wl.eval_loader(shard))
        assert x.shape == (5, 4, SIZE, SIZE, SIZE) and x.dtype == torch.float32
        if cl:  # the permuted NDHWC batch: channels_last_3d without a copy
            assert x.is_contiguous(memory_format=torch.channels_last_3d) and not x.is_contiguous()
        else:
            assert x.is_contiguous()
        model = wl.build_model().eval()
        if cl:
            model = model.to(memory_format=torch.channels_last_3d)
        assert wl.forward(model, (x, y)).shape == (5, 4)
        got[cl] = x
    torch.testing.assert_close(got[True], got[False], rtol=0, atol=0)


def test_first_n_files(datasets) -> None:
    cfg = CosmoFlowWorkload.load_config("mini", [f"data.root={datasets['plain']}", f"data.size={SIZE}",
                                                 "data.n_train=4", "data.n_eval=2"])
    wl = CosmoFlowWorkload(cfg)
    assert wl.dataset_sizes() == (4, 2)
    assert wl.source("train").files == data.list_files(datasets["plain"], "train")[:4]


def test_length_crc_error_names_the_file_under_dali(datasets, tmp_path) -> None:
    pytest.importorskip("nvidia.dali")
    root = tmp_path / "data"
    (root / "validation").mkdir(parents=True)
    files = data.list_files(datasets["plain"], "train")[:2]
    (root / "validation" / files[1].name).write_bytes(files[1].read_bytes())
    raw = bytearray(files[0].read_bytes())
    raw[3] ^= 0xFF
    (root / "validation" / "bad.tfrecord").write_bytes(bytes(raw))
    shard = DataShard(rank=0, size=1, seed=0, local_batch_size=1, device=torch.device("cpu"))
    with pytest.raises(DataError, match="bad.tfrecord.*length CRC-32C mismatch"):
        list(_workload(str(root), "dali").eval_loader(shard))


def test_too_few_files_for_a_batch(datasets) -> None:
    from hpcbench.common.errors import ConfigError

    shard = DataShard(rank=0, size=4, seed=0, local_batch_size=4, device=torch.device("cpu"))
    with pytest.raises(ConfigError, match=r"training samples in \S+train cannot fill one batch per rank: local "
                                          r"batch 4 x 4 rank\(s\).*'train.global_batch_size'"):
        len(_workload(datasets["gzip"], "torch").train_loader(shard))


_MPI_SCRIPT = """
import json, sys, torch
from mpi4py import MPI
from hpcbench.common.workload import DataShard
from hpcbench.workloads.cosmoflow.workload import CosmoFlowWorkload
comm = MPI.COMM_WORLD
cfg = CosmoFlowWorkload.load_config("mini", ["data.root=" + sys.argv[1], "data.size=8", "train.loader=" + sys.argv[2],
                                             "model.conv_layers=2"])
wl = CosmoFlowWorkload(cfg)
shard = DataShard(comm.rank, comm.size, 5, 2, torch.device("cpu"))
seen = {}
for split, loader in (("train", wl.train_loader(shard)), ("eval", wl.eval_loader(shard))):
    seen[split] = [round(float(v), 6) for x, y in loader for v in y[:, 0]]
allv = comm.gather(seen, root=0)
if comm.rank == 0:
    print("RESULT " + json.dumps(allv))
"""


@pytest.mark.parametrize("loader", ["torch", "dali"])
def test_ranks_read_disjoint_shards_under_mpiexec(datasets, tmp_path, loader: str) -> None:
    if loader == "dali":
        pytest.importorskip("nvidia.dali")
    script = tmp_path / "shard_check.py"
    script.write_text(_MPI_SCRIPT)
    proc = run_mpi(3, [str(script), datasets["plain"], loader], timeout=120)
    ranks = json.loads(proc.stdout.split("RESULT ", 1)[1])
    train = [v for r in ranks for v in r["train"]]
    evals = [v for r in ranks for v in r["eval"]]
    assert all(len(r["train"]) == 2 for r in ranks)  # 10 // 3 = 3 per rank -> one full batch of 2
    assert len(set(train)) == len(train) == 6
    assert len(evals) == len(set(evals)) == 5  # every validation sample exactly once
