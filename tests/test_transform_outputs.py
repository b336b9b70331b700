"""CPU batch transforms write into reused host outputs (common/data/buffers.py HostBuffers.output):
the values equal the plain formula, a batch still held is never overwritten by the next one, and an
output is handed out again once nothing views it (no fresh multi-MiB batch, and its page faults, per step)."""
from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from hpcbench.common.data.buffers import HostBuffers
from hpcbench.workloads.cosmoflow.dataset import CosmoFlowData
from hpcbench.workloads.deepcam.data import Normalizer
from hpcbench.workloads.deepcam.dataset import DeepCAMData
from hpcbench.workloads.mlperf_training.resnet.dataset import ImageNetData
from hpcbench.workloads.mlperf_training.resnet.transforms import MEAN, STD

rng = np.random.default_rng(0)


def cosmoflow(channels_last: bool) -> tuple[Any, Callable[[int], Any], Callable[[Any], torch.Tensor]]:
    spec = CosmoFlowData(size=6, channels_last=channels_last)

    def batch(seed: int) -> Any:
        g = np.random.default_rng(seed)
        return (torch.from_numpy(g.integers(0, 300, (3, 6, 6, 6, 4)).astype(np.int16)),
                torch.from_numpy(g.random((3, 4), dtype=np.float32)))

    return spec, batch, lambda b: torch.log1p(b[0].double()).float().permute(0, 4, 1, 2, 3)


def deepcam(channels_last: bool) -> tuple[Any, Callable[[int], Any], Callable[[Any], torch.Tensor]]:
    spec = DeepCAMData(list(range(5)), channels_last=channels_last)
    lo = rng.random(5).astype(np.float32)
    spec._norm = Normalizer(lo, (1.0 / (lo + 2.0)).astype(np.float32))  # what open() loads from stats.h5

    def batch(seed: int) -> Any:
        g = np.random.default_rng(seed)
        return (torch.from_numpy(g.random((2, 8, 12, 5), dtype=np.float32)),
                torch.from_numpy(g.integers(0, 3, (2, 8, 12)).astype(np.uint8)))

    def want(b: Any) -> torch.Tensor:
        n = spec.norm
        return torch.from_numpy((b[0].numpy() - n.shift) * n.scale).permute(0, 3, 1, 2)

    return spec, batch, want


def resnet(channels_last: bool) -> tuple[Any, Callable[[int], Any], Callable[[Any], torch.Tensor]]:
    spec = ImageNetData(8, 10, channels_last=channels_last)

    def batch(seed: int) -> Any:
        g = np.random.default_rng(seed)
        return (torch.from_numpy(g.integers(0, 256, (3, 8, 8, 3)).astype(np.uint8)),
                torch.from_numpy(g.integers(0, 1000, 3)))

    def want(b: Any) -> torch.Tensor:
        mean = torch.tensor(MEAN).view(1, 3, 1, 1) * 255.0
        inv_std = 1.0 / (torch.tensor(STD).view(1, 3, 1, 1) * 255.0)
        return (b[0].permute(0, 3, 1, 2).float() - mean) * inv_std  # the formula before the reused output

    return spec, batch, want


@pytest.mark.parametrize("channels_last", [True, False])
@pytest.mark.parametrize("make", [cosmoflow, deepcam, resnet], ids=["cosmoflow", "deepcam", "resnet"])
def test_transform_writes_a_reused_output_and_never_one_in_use(make: Any, channels_last: bool) -> None:
    spec, batch, want = make(channels_last)
    b1, b2 = batch(1), batch(2)
    first = spec.transform(b1)
    x1 = first[0]
    assert x1.dtype == torch.float32 and x1.shape == want(b1).shape
    torch.testing.assert_close(x1, want(b1), rtol=1e-6, atol=1e-6)
    layout = (torch.channels_last if x1.dim() == 4 else torch.channels_last_3d) if channels_last else torch.contiguous_format
    assert x1.is_contiguous(memory_format=layout)  # a channels-last view, or contiguous N x C x ...
    if isinstance(spec, DeepCAMData):
        assert first[1].dtype == torch.int64 and torch.equal(first[1], b1[1].long())
    kept = x1.clone()
    second = spec.transform(b2)  # `first` is still held (as a batch in flight is): a different buffer
    assert second[0].data_ptr() != x1.data_ptr()
    assert torch.equal(x1, kept)
    torch.testing.assert_close(second[0], want(b2), rtol=1e-6, atol=1e-6)
    ptr = x1.data_ptr()
    del first, x1
    gc.collect()
    third = spec.transform(b1)  # nothing views the first output any more: its memory is reused
    assert third[0].data_ptr() == ptr
    torch.testing.assert_close(third[0], want(b1), rtol=1e-6, atol=1e-6)
    assert torch.equal(second[0], spec.transform(b2)[0])  # same input, same output, whatever the buffer


def test_output_on_the_host_is_pooled_and_shaped() -> None:
    pool = HostBuffers()
    t = pool.output((2, 3, 5), torch.int64, torch.device("cpu"))
    assert t.shape == (2, 3, 5) and t.dtype == torch.int64 and t.is_contiguous()
    ptr = t.data_ptr()
    t.fill_(7)
    held = t.view(-1)[3:]
    del t
    gc.collect()
    assert pool.output((2, 3, 5), torch.int64, torch.device("cpu")).data_ptr() != ptr  # `held` views it
    del held
    gc.collect()
    assert pool.output((2, 3, 5), torch.int64, torch.device("cpu")).data_ptr() == ptr


@pytest.mark.parametrize("make", [cosmoflow, deepcam, resnet], ids=["cosmoflow", "deepcam", "resnet"])
def test_off_the_host_the_output_is_the_devices_own(make: Any) -> None:
    spec, batch, want = make(True)
    b = tuple(t.to("meta") for t in batch(1))  # a device other than the host: shapes and dtypes only
    out = spec.transform(b)
    assert out[0].device.type == "meta" and out[0].shape == want(batch(1)).shape and out[0].dtype == torch.float32
    assert not any(getattr(spec, "_outputs")._free.values())  # nothing taken from (or given to) the host pool


def _bits_equal(a: Any, b: Any) -> bool:
    """Same fields, dtypes, shapes, strides and bit patterns."""
    for x, y in zip(a, b, strict=True):
        if x.dtype != y.dtype or x.shape != y.shape or x.stride() != y.stride():
            return False
        if not torch.equal(x.contiguous().view(torch.uint8), y.contiguous().view(torch.uint8)):
            return False
    return True


@pytest.mark.parametrize("channels_last", [True, False])
@pytest.mark.parametrize("make", [cosmoflow, deepcam], ids=["cosmoflow", "deepcam"])
def test_transform_rows_equals_the_transform_of_the_gathered_rows(make: Any, channels_last: bool) -> None:
    """The host cache's shortcut (each sample transformed straight from its cache row) gives what the
    gather-then-transform path gives, bit for bit, in the same layout."""
    spec, batch, _ = make(channels_last)
    stored = batch(5)  # as the cache holds it: every cached sample in the storage dtype
    rows = np.array([len(stored[0]) - 1, 0, len(stored[0]) - 1], np.int64)
    got = spec.transform_rows(stored, rows)
    want = spec.transform(tuple(t[torch.from_numpy(rows)] for t in stored))
    assert _bits_equal(got, want)
    assert torch.equal(stored[0], batch(5)[0])  # the cache's rows are read, never written


@pytest.mark.parametrize("make", [cosmoflow, deepcam], ids=["cosmoflow", "deepcam"])
def test_a_steady_host_transform_makes_no_page_faults(make: Any) -> None:
    """After the first batches, a host transform allocates nothing new (outputs, scratch and tables
    are kept): the minor page faults of a call are a few pages at most, not the output's size."""
    import resource

    spec, _, _ = make(True)
    if isinstance(spec, CosmoFlowData):
        b = (torch.randint(0, 400, (2, 32, 32, 32, 4), dtype=torch.int16), torch.rand(2, 4))
    else:
        b = (torch.rand(2, 128, 192, 5), torch.randint(0, 3, (2, 128, 192), dtype=torch.uint8))
    pages = b[0].numel() * 4 // 4096  # the float32 output's pages
    rows = np.array([1, 0], np.int64)
    for call in (lambda: spec.transform(b), lambda: spec.transform_rows(b, rows)):
        for _ in range(2):
            out = call()
            del out
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        out = call()
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
        del out
        assert pages >= 100 and faults <= 8, (faults, pages)
