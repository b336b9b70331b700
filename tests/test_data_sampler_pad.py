"""data.last_batch = "pad": the training permutation padded with its own first samples to whole global batches,
so every sample is read each epoch (the MLPerf rules allow a remainder, padded or mixed last batch; only DLRMv2
may drop it). The default, "drop", leaves the remainder out."""
from __future__ import annotations

import numpy as np
import pytest

from hpcbench import registry
from hpcbench.common.data.sampler import EpochSampler
from hpcbench.common.errors import ConfigError


@pytest.mark.parametrize("partition", ["contiguous", "strided"])
@pytest.mark.parametrize(("n", "batch", "ranks"), [(103, 4, 3), (96, 4, 3), (5, 2, 2), (7, 8, 1)])
def test_a_padded_epoch_reads_every_sample_and_pads_with_the_first(partition: str, n: int, batch: int,
                                                                   ranks: int) -> None:
    steps = -(-n // (batch * ranks))
    for epoch in (1, 2):
        per_rank = []
        for r in range(ranks):
            s = EpochSampler(n, batch, r, ranks, seed=3, partition=partition, last_batch="pad")  # type: ignore[arg-type]
            s.set_epoch(epoch)
            bs = s.batches()
            assert len(s) == steps and len(bs) == steps and all(b.size == batch for b in bs)
            per_rank.append(np.concatenate(bs))
        read = np.concatenate(per_rank)
        assert read.size == steps * batch * ranks and set(read.tolist()) == set(range(n))  # every sample
        perm = np.random.default_rng([3, epoch]).permutation(n)
        extra = np.resize(perm, steps * batch * ranks - n)  # the pad: the permutation's first samples again
        counts = np.bincount(read, minlength=n)
        want = np.ones(n, np.int64)
        np.add.at(want, extra, 1)
        assert np.array_equal(counts, want)


def test_drop_is_the_default_and_pad_only_where_it_applies() -> None:
    s = EpochSampler(103, 4, 0, 3, seed=3)
    assert len(s) == 103 // 3 // 4  # the remainder left out
    with pytest.raises(ConfigError, match="data.last_batch' = 'pad' applies to the global shuffle"):
        EpochSampler(103, 4, 0, 3, seed=3, shuffle="local", last_batch="pad")
    ev = EpochSampler(103, 4, 0, 3, seed=3, train=False, last_batch="pad")  # evaluation reads each sample once
    assert sorted(np.concatenate(ev.batches()).tolist()) == list(range(0, 103, 3))


def test_the_balanced_partition_pads_and_balances_every_sample() -> None:
    """OC20's edge-balanced sampler with pad: whole global batches from the padded permutation, each rank-step
    still balanced, every sample read (the reference's DistributedSampler pads likewise, drop_last False)."""
    n, batch, ranks = 103, 2, 3
    costs = np.random.default_rng(0).integers(10, 100, n).astype(float)
    steps = -(-n // (batch * ranks))
    per_rank = []
    for r in range(ranks):
        s = EpochSampler(n, batch, r, ranks, seed=4, partition="balanced", costs=costs, last_batch="pad")
        s.set_epoch(1)
        bs = s.batches()
        assert len(s) == steps and len(bs) == steps and all(b.size == batch for b in bs)
        per_rank.append(bs)
    read = np.concatenate([np.concatenate(bs) for bs in per_rank])
    assert set(read.tolist()) == set(range(n)) and read.size == steps * batch * ranks
    loads = np.array([[costs[per_rank[r][k]].sum() for r in range(ranks)] for k in range(steps)])
    assert float((loads.max(1) / loads.mean(1)).max()) < 1.5  # still balanced per step


def test_closed_resnet_pads_its_last_batch() -> None:
    cls = registry.get("resnet")
    assert cls.load_config("full").data.last_batch == "pad"
    with pytest.raises(ConfigError, match=r"config key 'data.last_batch' = 'drop'"):
        cls.load_config("full", ["data.last_batch=drop"])


def test_a_stored_order_workload_refuses_pad(tmp_path) -> None:  # noqa: ANN001
    """DLRM and Llama read their training split in their own stored order (StoredOrderSampler): 'pad' is refused
    there by key, not silently ignored."""
    import torch

    from hpcbench.common.workload import DataShard

    cls = registry.get("llama31_8b")
    data = tmp_path / "data"
    from conftest import run_cli

    assert run_cli(["datagen", "llama31_8b", "--out", str(data), "--train-documents", "8", "--eval-documents", "4",
                    "--vocab-size", "64", "--min-len", "64", "--max-len", "64"], timeout=60).returncode == 0
    w = cls(cls.load_config("mini", [f"data.root={data}", "data.last_batch=pad", "data.seq_len=16",
                                     "data.eval_samples=4", "model.vocab_size=64"]))
    shard = DataShard(rank=0, size=1, seed=1, local_batch_size=2, device=torch.device("cpu"))
    with pytest.raises(ConfigError, match="config key 'data.last_batch'.*stored order"):
        w.train_loader(shard)


def test_oc20_full_preset_pads_to_977_steps_at_2048() -> None:
    """docs/closed.md, OC20 partition, samples per epoch: the full preset's balanced sampler with pad over the 2,000,000
    training samples at a global batch of 2,048 (256 ranks of 8) takes 977 steps, as torch's DistributedSampler with
    drop_last False; with drop it would take 976."""
    cls = registry.get("oc20")
    cfg = cls.load_config("full")
    assert (cfg.data.last_batch, cfg.train.global_batch_size) == ("pad", 2048)
    costs = np.ones(2_000_000)
    pad = EpochSampler(2_000_000, 8, 0, 256, seed=1, partition="balanced", costs=costs, last_batch="pad")
    drop = EpochSampler(2_000_000, 8, 0, 256, seed=1, partition="balanced", costs=costs, last_batch="drop")
    assert (len(pad), len(drop)) == (977, 976)
