"""DLRM-DCNv2 reads its training data in the stored order (training_rules.adoc: "training dataset is shuffled
during preprocessing (with a fixed seed) on a per-sample basis. The resulting order of samples should be then
used during training and any other extra dataset shuffling is prohibited"). Global batch g is the rows
[g B, (g + 1) B) and rank r reads its r-th contiguous part, as the reference's MultiHotCriteoIterDataPipe
hands batch i of the file order to rank i % world_size. The sampler computes each batch's indices, so its
memory does not grow with the split (the full training set has 4,195,197,692 rows)."""
from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import torch

from hpcbench.common.data.sampler import StoredOrderSampler
from hpcbench.common.errors import ConfigError
from hpcbench.common.workload import DataShard
from hpcbench.workloads.mlperf_training.dlrm_dcnv2.dataset import CriteoData
from hpcbench.workloads.mlperf_training.dlrm_dcnv2.workload import DLRMWorkload
from conftest import run_cli

FULL_TRAIN_ROWS = 4_195_197_692


def test_the_first_batches_are_the_stored_order_split_over_the_ranks() -> None:
    b, size = 4, 3
    samplers = [StoredOrderSampler(100, b, r, size) for r in range(size)]
    for epoch in (0, 1, 5):  # the same order every epoch
        for s in samplers:
            s.set_epoch(epoch)
        firsts = [s.batches()[0].tolist() for s in samplers]
        assert firsts == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
        assert samplers[1].batches()[1].tolist() == [16, 17, 18, 19]  # global batch 1, rank 1's part


@pytest.mark.parametrize("n, b, size", [(100, 4, 3), (96, 4, 3), (7, 2, 1), (4096, 64, 8)])
def test_every_sample_once_per_epoch_across_ranks(n: int, b: int, size: int) -> None:
    train = [StoredOrderSampler(n, b, r, size) for r in range(size)]
    steps = n // (b * size)
    assert {len(s) for s in train} == {steps}  # the same steps on every rank
    seen = np.concatenate([s.indices() for s in train])
    assert np.sort(seen).tolist() == list(range(steps * b * size))  # once each; the partial last global batch dropped
    # reading the ranks' batches step by step gives the file order
    assert np.concatenate([s.batches()[k] for k in range(steps) for s in train]).tolist() == list(range(steps * b * size))
    evals = [StoredOrderSampler(n, b, r, size, train=False) for r in range(size)]
    assert np.sort(np.concatenate([s.indices() for s in evals])).tolist() == list(range(n))  # evaluation: every row


def test_evaluation_splits_a_short_last_batch_without_empty_batches() -> None:
    evals = [StoredOrderSampler(9, 2, r, 4, train=False) for r in range(4)]
    assert [[b.tolist() for b in s.batches()] for s in evals] == [[[0, 1]], [[2, 3]], [[4, 5]], [[6, 7], [8]]]


def test_memory_is_per_batch_at_the_full_dataset_size() -> None:
    tracemalloc.start()
    try:
        s = StoredOrderSampler(FULL_TRAIN_ROWS, 8192, 7, 8)
        s.set_epoch(3)
        batches = s.batches()
        first, last = batches[0], batches[len(batches) - 1]
        ahead = list(batches[:4]) + [next(iter(batches[4:]))]  # the prefetcher's slices stay lazy
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(s) == len(batches) == FULL_TRAIN_ROWS // 65536
    assert first.tolist() == list(range(7 * 8192, 8 * 8192))
    assert int(last[-1]) == (FULL_TRAIN_ROWS // 65536) * 65536 - 1
    assert len(ahead) == 5 and int(ahead[4][0]) == 4 * 65536 + 7 * 8192
    assert peak < 2 * 1024 * 1024, peak  # a few batches of 8192 int64 (64 KiB each); a permutation would be 34 GB


def test_shuffling_options_are_refused() -> None:
    with pytest.raises(ConfigError, match="'data.shuffle'"):
        StoredOrderSampler(100, 4, 0, 2, shuffle="local")
    with pytest.raises(ConfigError, match="cannot fill one batch"):
        StoredOrderSampler(7, 4, 0, 2)


def test_the_dlrm_training_loader_reads_the_stored_order(tmp_path: Path) -> None:
    assert CriteoData.order == "stored"
    out = tmp_path / "data"
    proc = run_cli(["datagen", "dlrm_dcnv2", "--out", str(out), "--quiet", "--days", "3", "--rows-per-day", "64",
                    "--cardinalities", "200,100,50,20"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    cfg = DLRMWorkload.load_config("mini", [f"data.root={out}", "train.global_batch_size=16"])
    wl = DLRMWorkload(cfg)
    source = wl.source("train")
    for rank in range(2):
        loader = wl.train_loader(DataShard(rank, 2, 1, 8, torch.device("cpu")))
        assert isinstance(loader.sampler, StoredOrderSampler) and len(loader) == 128 // 16
        loader.set_epoch(2)
        dense = next(iter(loader))[0]
        want = source.read(np.arange(rank * 8, rank * 8 + 8, dtype=np.int64)).dense
        assert torch.equal(dense, torch.from_numpy(np.ascontiguousarray(want)))


def test_the_host_cache_keeps_the_stored_order_and_only_this_ranks_rows(tmp_path: Path) -> None:
    """``data.cache = "host"`` with the stored order: every epoch's batches equal the uncached loader's,
    and each rank's cache holds its own rows only."""
    out = tmp_path / "data"
    proc = run_cli(["datagen", "dlrm_dcnv2", "--out", str(out), "--quiet", "--days", "3", "--rows-per-day", "64",
                    "--cardinalities", "200,100,50,20"])
    assert proc.returncode == 0, proc.stdout + proc.stderr

    def epochs(cache: str, rank: int) -> tuple[object, list[list[torch.Tensor]]]:
        cfg = DLRMWorkload.load_config("mini", [f"data.root={out}", "train.global_batch_size=16",
                                                f"data.cache={cache}"])
        loader = DLRMWorkload(cfg).train_loader(DataShard(rank, 2, 1, 8, torch.device("cpu")))
        got = []
        for epoch in (1, 2):
            loader.set_epoch(epoch)
            got.append([b[0].clone() for b in loader])
        return loader, got

    for rank in range(2):
        _, ref = epochs("none", rank)
        loader, got = epochs("host", rank)
        assert all(torch.equal(a, b) for e_ref, e_got in zip(ref, got) for a, b in zip(e_ref, e_got))
        held = loader.cache.share  # BatchCache and SampleCache both keep the rows they hold
        assert sorted(np.asarray(held).tolist()) == [g * 16 + rank * 8 + i for g in range(8) for i in range(8)]
