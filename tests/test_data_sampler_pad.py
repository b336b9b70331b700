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
        EpochSampler(103, 4, 0, 3, seed=3, partition="balanced", costs=np.ones(103), last_batch="pad")
    with pytest.raises(ConfigError, match="data.last_batch' = 'pad' applies to the global shuffle"):
        EpochSampler(103, 4, 0, 3, seed=3, shuffle="local", last_batch="pad")
    ev = EpochSampler(103, 4, 0, 3, seed=3, train=False, last_batch="pad")  # evaluation reads each sample once
    assert sorted(np.concatenate(ev.batches()).tolist()) == list(range(0, 103, 3))


def test_closed_resnet_pads_its_last_batch() -> None:
    cls = registry.get("resnet")
    assert cls.load_config("full").data.last_batch == "pad"
    with pytest.raises(ConfigError, match=r"config key 'data.last_batch' = 'drop'"):
        cls.load_config("full", ["data.last_batch=drop"])
