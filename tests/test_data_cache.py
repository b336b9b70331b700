"""data.cache: cached epochs give exactly the uncached batches (CosmoFlow, DeepCAM, OC20), the share
that does not fit is refused with its sizes, and the config key is checked."""
from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from hpcbench.common.data import cache as cache_mod
from hpcbench.common.data.cache import BatchCache, SampleCache, rank_share
from hpcbench.common.data.sampler import EpochSampler, StoredOrderSampler
from hpcbench.common.errors import ConfigError
from hpcbench.common.workload import DataShard, Workload

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def cosmoflow_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from hpcbench.workloads.cosmoflow import synth

    root = tmp_path_factory.mktemp("cosmo-cache")
    synth.generate(root, 11, 5, 8, seed=3, workers=1, compress=False, progress=False)
    return root


@pytest.fixture(scope="module")
def deepcam_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from hpcbench.workloads.deepcam.datagen import write_dataset

    root = tmp_path_factory.mktemp("deepcam-cache")
    write_dataset(root, samples=9, eval_samples=5, height=16, width=32, seed=7, workers=1)
    return root


@pytest.fixture(scope="module")
def oc20_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from hpcbench.workloads.opencatalyst import datagen, lmdbio

    root = tmp_path_factory.mktemp("oc20-cache")
    spec = datagen.GenSpec(size=(2, 2, 2), cutoff=5.0, max_neighbors=20)
    for split, n in (("train", 6), ("validation", 3)):
        (root / split).mkdir()
        lmdbio.write_shard(root / split / lmdbio.shard_name(0),
                           [datagen.make_sample(spec, 5, split, i) for i in range(n)])
    return root


def _workload(name: str, root: Path, cache: str) -> Workload:
    if name == "cosmoflow":
        from hpcbench.workloads.cosmoflow.workload import CosmoFlowWorkload as W
        extra = ["data.size=8", "model.conv_layers=2"]
    elif name == "deepcam":
        from hpcbench.workloads.deepcam.workload import DeepCAMWorkload as W  # type: ignore[assignment]
        extra = []
    else:
        from hpcbench.workloads.opencatalyst.workload import OC20Workload as W  # type: ignore[assignment]
        extra = ["data.preload=false"]
    return W(W.load_config("mini", [f"data.root={root}", f"data.cache={cache}", "train.loader=torch", *extra]))


def _epochs(wl: Workload, train: bool, epochs: tuple[int, ...], rank: int = 0, size: int = 1,
            batch: int = 2, device: torch.device = CPU) -> tuple[Any, list[list[Any]]]:
    shard = DataShard(rank=rank, size=size, seed=4, local_batch_size=batch, device=device)
    loader = wl.train_loader(shard) if train else wl.eval_loader(shard)
    out = []
    for e in epochs:
        loader.set_epoch(e)
        out.append([tuple(t.cpu() for t in b) if device.type == "cuda" else b for b in loader])
    return loader, out


def _tensors(batch: Any) -> list[Any]:
    if isinstance(batch, (tuple, list)):
        return list(batch)
    return [getattr(batch, f.name) for f in fields(batch)]  # OC20's GraphBatch


def _same(a: list[list[Any]], b: list[list[Any]]) -> None:
    assert [len(e) for e in a] == [len(e) for e in b]
    for ea, eb in zip(a, b):
        for ba, bb in zip(ea, eb):
            for x, y in zip(_tensors(ba), _tensors(bb), strict=True):
                if isinstance(x, torch.Tensor):
                    assert x.dtype == y.dtype and x.shape == y.shape and x.stride() == y.stride()
                    assert torch.equal(x, y)
                else:
                    assert x == y


@pytest.mark.parametrize("mode", ["host", "device"])  # "device" on a CPU device is host memory
@pytest.mark.parametrize("name", ["cosmoflow", "deepcam"])
@pytest.mark.parametrize("rank,size", [(0, 1), (1, 2)])
def test_cached_epochs_yield_exactly_the_uncached_batches(name: str, mode: str, rank: int, size: int,
                                                          request: pytest.FixtureRequest) -> None:
    root = request.getfixturevalue(f"{name}_root")
    epochs = (1, 2, 3, 4)
    _, ref = _epochs(_workload(name, root, "none"), True, epochs, rank, size)
    loader, got = _epochs(_workload(name, root, mode), True, epochs, rank, size)
    assert isinstance(loader.cache, BatchCache) and loader.cache.device == CPU
    _same(ref, got)
    first = _tensors(got[0][0])[0]
    stored = loader.cache.store[0]
    if name == "cosmoflow":  # the storage dtype is cached, the transform runs per batch
        assert stored.dtype == torch.int16 and first.dtype == torch.float32
    assert stored.shape[0] == len(loader.source)  # training: the whole split is the rank's share
    if size == 1:  # 11 or 9 samples, batch 2: the first epoch drops one, a later one reads it
        assert loader.cache.complete()
    _, ref_eval = _epochs(_workload(name, root, "none"), False, (1, 2), rank, size)
    eval_loader, got_eval = _epochs(_workload(name, root, mode), False, (1, 2), rank, size)
    _same(ref_eval, got_eval)
    assert eval_loader.cache.complete() and eval_loader.cache.store[0].shape[0] == len(eval_loader.sampler.indices())


def test_a_complete_cache_reads_no_sample_again(cosmoflow_root: Path) -> None:
    loader, _ = _epochs(_workload("cosmoflow", cosmoflow_root, "host"), True, (1, 2, 3, 4, 5))
    assert loader.cache.complete()

    class Exploding:
        def __len__(self) -> int:
            return len(loader.source)

        def __getitem__(self, i: int) -> Any:
            raise AssertionError(f"sample {i} read again")

    loader.source = Exploding()
    loader.set_epoch(9)
    assert len(list(loader)) == len(loader)


def test_oc20_host_cache_keeps_samples_and_collates_them_again(oc20_root: Path) -> None:
    _, ref = _epochs(_workload("oc20", oc20_root, "none"), True, (1, 2, 3))
    loader, got = _epochs(_workload("oc20", oc20_root, "host"), True, (1, 2, 3))
    assert isinstance(loader.source, SampleCache) and loader.source.complete()
    _same(ref, got)


def test_oc20_device_cache_is_refused_naming_the_key_and_the_way_out(oc20_root: Path) -> None:
    with pytest.raises(ConfigError, match=r"data.cache' = \"device\" is not available.*GraphBatch.*\"host\""):
        _epochs(_workload("oc20", oc20_root, "device"), True, (1,))


def test_a_share_that_does_not_fit_is_refused_with_both_sizes(cosmoflow_root: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cache_mod, "host_available_bytes", lambda: cache_mod.HOST_MARGIN_MIN + 20_000)
    per_sample = 8 ** 3 * 4 * 2 + 4 * 4  # int16 counts + 4 float32 targets
    with pytest.raises(ConfigError) as err:
        _epochs(_workload("cosmoflow", cosmoflow_root, "host"), True, (1,))
    msg = str(err.value)
    assert "'data.cache'" in msg and "11 samples" in msg and f"{per_sample / 1024:.1f} KiB per sample" in msg
    assert f"{11 * per_sample / 1024:.1f} KiB" in msg and "19.5 KiB may be used" in msg
    assert "MemAvailable" in msg and 'data.cache = "none"' in msg and "node_local" in msg


def test_device_budget_keeps_a_margin_of_the_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cache_mod, "device_memory", lambda device: (50 << 30, 80 << 30))
    room = cache_mod.budget(True, torch.device("cuda", 0))
    assert room.usable == (50 << 30) - (20 << 30) and room.where == "cuda:0"
    with pytest.raises(ConfigError, match=r"'device'.*cuda:0.*\"host\""):
        cache_mod.check_fits("device", 1 << 30, 31, room, "every training sample")


def test_host_budget_is_shared_by_the_ranks_of_a_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cache_mod, "host_available_bytes", lambda: 100 << 30)
    assert cache_mod.budget(False, CPU, host_ranks=4).usable == (90 << 30) // 4


def test_share_is_every_training_sample_and_the_fixed_evaluation_part() -> None:
    train = EpochSampler(23, 2, 1, 3, 7, "contiguous")
    assert rank_share(train)[0].tolist() == list(range(23))
    for part in ("contiguous", "strided"):
        ev = EpochSampler(23, 2, 1, 3, 7, part, train=False)
        share = rank_share(ev)[0]
        for epoch in (1, 5):
            ev.set_epoch(epoch)
            assert sorted(ev.indices().tolist()) == share.tolist()


def test_config_key_is_checked(cosmoflow_root: Path) -> None:
    from hpcbench.workloads.cosmoflow.workload import CosmoFlowWorkload

    with pytest.raises(ConfigError, match=r"'data.cache'.*'gpu'.*'none', 'host', 'device'"):
        CosmoFlowWorkload.load_config("mini", ["data.cache=gpu"])
    cfg = CosmoFlowWorkload.load_config("mini", [])
    assert cfg.data.cache == "none"
    cfg.data.cache = "disk"
    with pytest.raises(ConfigError, match="'data.cache'"):
        cfg.data.validate()


def test_device_cache_with_the_dali_loader_is_refused(cosmoflow_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hpcbench.common.data import dali

    monkeypatch.setattr(dali, "dali_available", lambda: True)  # the refusal comes before DALI is used
    from hpcbench.workloads.cosmoflow.workload import CosmoFlowWorkload

    cfg = CosmoFlowWorkload.load_config("mini", [f"data.root={cosmoflow_root}", "data.size=8", "model.conv_layers=2",
                                                 "train.loader=dali", "data.cache=device"])
    with pytest.raises(ConfigError, match=r"DALI.*train.loader = \"torch\""):
        CosmoFlowWorkload(cfg).train_loader(DataShard(0, 1, 4, 2, CPU))


def test_dali_host_cache_keeps_the_raw_samples(cosmoflow_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hpcbench.common.data import dali
    from hpcbench.workloads.cosmoflow.workload import CosmoFlowWorkload

    monkeypatch.setattr(dali, "dali_available", lambda: True)
    cfg = CosmoFlowWorkload.load_config("mini", [f"data.root={cosmoflow_root}", "data.size=8", "model.conv_layers=2",
                                                 "train.loader=dali", "data.cache=host"])
    loader = CosmoFlowWorkload(cfg).train_loader(DataShard(0, 1, 4, 2, CPU))
    assert isinstance(loader.source, SampleCache)
    raw = loader.source.source
    assert np.array_equal(loader.source[3].x, raw[3].x) and 3 in loader.source.samples


@pytest.mark.parametrize("from_rows", [True, False], ids=["transform_rows", "gathered"])
def test_cached_outputs_are_reused_but_never_under_a_batch_still_held(deepcam_root: Path, from_rows: bool,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """DeepCAM transforms straight from the cache's rows (no gather copy: the gather pool stays empty)
    into the spec's reused outputs; a spec without ``transform_rows`` (forced here) has the rows gathered
    into reused buffers first. Either way a batch still held is never overwritten."""
    from hpcbench.workloads.deepcam.dataset import DeepCAMData

    if not from_rows:
        monkeypatch.setattr(DeepCAMData, "transform_rows", lambda self, stored, rows: None)
    _, ref = _epochs(_workload("deepcam", deepcam_root, "none"), True, (1, 2, 3))
    loader, _ = _epochs(_workload("deepcam", deepcam_root, "host"), True, (1,))
    kept = []
    for e in (2, 3):
        loader.set_epoch(e)
        for k, batch in enumerate(loader):
            _same([[batch]], [[ref[e - 1][k]]])
            if k % 2 == 0:
                kept.append((e, k, batch))  # held on: its buffer must not be handed out again
    for e, k, batch in kept:
        _same([[batch]], [[ref[e - 1][k]]])
    gathers = loader.cache._out._bufs
    outputs = loader.spec._outputs._free
    assert outputs and all(len(v) <= loader.spec._outputs.keep for v in outputs.values())
    if from_rows:
        assert not gathers  # no batch was gathered: each sample was read from its cache row
    else:
        assert gathers and all(len(v) <= loader.cache._out.per_shape for v in gathers.values())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: the pinned host and GPU-memory caches")
@pytest.mark.parametrize("mode", ["host", "device"])
@pytest.mark.parametrize("name", ["cosmoflow", "deepcam"])
def test_cuda_cached_epochs_yield_exactly_the_uncached_batches(name: str, mode: str,
                                                              request: pytest.FixtureRequest) -> None:
    root, cuda = request.getfixturevalue(f"{name}_root"), torch.device("cuda", torch.cuda.current_device())
    _, ref = _epochs(_workload(name, root, "none"), True, (1, 2, 3, 4), device=cuda)
    loader, got = _epochs(_workload(name, root, mode), True, (1, 2, 3, 4), device=cuda)
    _same(ref, got)
    if mode == "device":
        assert loader.cache.store[0].is_cuda
    else:
        assert loader.cache.pinned and loader.cache.store[0].is_pinned()


@pytest.mark.parametrize("part", ["contiguous", "strided"])
def test_local_shuffle_keeps_a_fixed_disjoint_part_per_rank_and_reorders_it(part: str) -> None:
    n, size, b = 23, 3, 2
    samplers = [EpochSampler(n, b, r, size, 7, part, shuffle="local") for r in range(size)]
    parts = [s.fixed_part() for s in samplers]
    assert sum(p.size for p in parts) == (n // size) * size and len(set(np.concatenate(parts).tolist())) == 21
    for s, p in zip(samplers, parts):
        assert rank_share(s)[0].tolist() == p.tolist()  # the cache holds 1/size of the split
        orders = []
        for epoch in (1, 2, 3):
            s.set_epoch(epoch)
            got = s.indices()
            assert len(s.batches()) == len(EpochSampler(n, b, s.rank, size, 7, part)) == len(s)
            assert set(got.tolist()) <= set(p.tolist()) and len(got) == len(s) * b
            orders.append(got.tolist())
        assert orders[0] != orders[1] or orders[1] != orders[2]  # the order inside the part changes


def test_local_shuffle_is_refused_for_the_cost_balanced_sampler() -> None:
    with pytest.raises(ConfigError, match="data.shuffle"):
        EpochSampler(10, 2, 0, 2, 1, "balanced", costs=np.ones(10), shuffle="local")


def test_local_shuffle_fills_the_cache_in_one_epoch_with_a_part_of_the_split(cosmoflow_root: Path) -> None:
    wl = _workload("cosmoflow", cosmoflow_root, "host")
    wl.cfg.data.shuffle = "local"  # type: ignore[attr-defined]
    ref_wl = _workload("cosmoflow", cosmoflow_root, "none")
    ref_wl.cfg.data.shuffle = "local"  # type: ignore[attr-defined]
    _, ref = _epochs(ref_wl, True, (1, 2, 3), rank=1, size=2)
    loader, got = _epochs(wl, True, (1, 2, 3), rank=1, size=2)
    _same(ref, got)
    assert loader.cache.store[0].shape[0] == len(loader.source) // 2
    assert loader.cache.complete()


def test_stored_order_cache_holds_only_the_rows_a_rank_reads() -> None:
    """DLRM reads the stored order: rank r reads the same rows every epoch, so a host cache holds those
    (before: every training sample, "reshuffled over the ranks each epoch", which stored order never is)."""
    n, size, b = 50, 2, 4
    for r in range(size):
        s = StoredOrderSampler(n, b, r, size, train=True)
        share, why = rank_share(s)
        assert "stored order" in why and share.size == (n // (b * size)) * b
        for epoch in (0, 1, 2):
            s.set_epoch(epoch)
            assert np.array_equal(np.sort(s.indices()), share)
        ev = StoredOrderSampler(n, b, r, size, train=False)
        assert np.array_equal(rank_share(ev)[0], np.sort(ev.indices()))
    both = np.concatenate([rank_share(StoredOrderSampler(n, b, r, size))[0] for r in range(size)])
    assert sorted(both.tolist()) == list(range(48))  # disjoint; the last partial global batch dropped
