"""Batches read straight into reused buffers (``DatasetSpec.read_batch``) equal the collate of the
validated samples, byte for byte, and the buffers are recycled only once no tensor uses them."""
from __future__ import annotations

import gc
from pathlib import Path

import numpy as np
import pytest
import torch

from hpcbench.common.data.buffers import HostBuffers
from hpcbench.workloads.cosmoflow import data as cdata
from hpcbench.workloads.cosmoflow import synth
from hpcbench.workloads.cosmoflow.dataset import CosmoFlowData
from hpcbench.workloads.deepcam.dataset import DeepCAMData
from hpcbench.workloads.deepcam.datagen import write_dataset

SIZE = 8


@pytest.mark.parametrize("compress", [False, True], ids=["plain", "gzip"])
def test_cosmoflow_read_batch_equals_collate(tmp_path: Path, compress: bool) -> None:
    synth.generate(tmp_path, 5, 1, SIZE, seed=3, workers=1, compress=compress, progress=False)
    spec = CosmoFlowData(SIZE)
    source = spec.open(tmp_path, "train")
    for order in ([0, 1, 2, 3, 4], [4, 2, 0]):  # every slot filled; the neighbours' bytes put back
        x, y = spec.read_batch(source, order)
        want_x, want_y = spec.collate([source[i] for i in order])
        assert x.dtype == torch.int16 and x.shape == (len(order), SIZE, SIZE, SIZE, 4)
        assert torch.equal(x, want_x) and torch.equal(y, want_y)
        for j, i in enumerate(order):
            np.testing.assert_array_equal(x[j].numpy(), synth.make_sample(3, "train", i, SIZE)[0])


def test_cosmoflow_misplaced_x_is_copied(tmp_path: Path) -> None:
    """A file whose headers do not show where x starts (y first, x after a long key) reads right."""
    from hpcbench.common.data import tfrecord

    x = (np.arange(SIZE ** 3 * 4) % 5).astype(np.int16).reshape(SIZE, SIZE, SIZE, 4)
    y = np.arange(4, dtype=np.float32)
    payload = tfrecord.encode_example({"pad" * 2000: b"", "y": y, "x": x.tobytes()})
    (tmp_path / "odd.tfrecord").write_bytes(tfrecord.frame(payload))
    buf = np.full(cdata.buffer_bytes(SIZE, 2), 7, np.uint8)
    np.testing.assert_array_equal(cdata.read_into(tmp_path / "odd.tfrecord", SIZE, buf, 1), y)
    np.testing.assert_array_equal(cdata.slot(buf, SIZE, 1), x)
    assert (buf[: cdata.PAD + cdata.x_bytes(SIZE)] == 7).all()  # slot 0 untouched


def test_deepcam_read_batch_equals_collate(tmp_path: Path) -> None:
    write_dataset(tmp_path, 3, 1, 32, 48, seed=5, workers=1)
    spec = DeepCAMData(list(range(16)), channels_last=True)
    source = spec.open(tmp_path, "train")
    x, y = spec.read_batch(source, [2, 0, 1])
    want_x, want_y = spec.collate([source[i] for i in [2, 0, 1]])
    assert x.dtype == torch.float32 and y.dtype == torch.uint8
    assert torch.equal(x, want_x) and torch.equal(y, want_y)
    tx, ty = spec.transform((x, y))  # normalized like the reference: (x - min) / (max - min)
    norm = spec.norm
    expected = (want_x.numpy() - norm.shift) * norm.scale
    np.testing.assert_array_equal(tx.permute(0, 2, 3, 1).numpy(), expected)
    assert ty.dtype == torch.int64 and torch.equal(ty, want_y.long())


def test_host_buffers_recycle_only_unused_memory() -> None:
    pool = HostBuffers()
    buf, t = pool.take(1024)
    view = t[64:].view(torch.int16)
    del buf, t
    gc.collect()
    other, _ = pool.take(1024)
    assert other.ctypes.data != view.data_ptr() - 64  # still in use by `view`: not handed out again
    del view, other, _
    gc.collect()
    again, _ = pool.take(1024)
    assert again.base is not None and len(pool._free[1024]) == 1  # one of the two came back for reuse
