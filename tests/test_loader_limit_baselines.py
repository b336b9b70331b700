"""benchmarks/loader_limit.py's DeepCAM limits read what the loader reads: the raw extents (d) are the
stored bytes of climate/data and climate/labels_0, and read_direct (c) fills reused arrays with them."""
from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np

from benchmarks.loader_limit import raw_extents, read_extents, read_h5_direct, read_raw
from hpcbench.workloads.deepcam.datagen import write_dataset


def test_raw_extents_are_the_dataset_bytes(tmp_path: Path) -> None:
    write_dataset(tmp_path, 2, 1, 32, 48, seed=3, workers=1)
    files = sorted((tmp_path / "train").glob("data-*.h5"))
    extents = raw_extents(files)
    assert extents is not None and len(files) == 2
    for f in files:
        with h5py.File(f, "r") as h:
            data, labels = h["climate/data"][...], h["climate/labels_0"][...]
        buf = bytearray(data.nbytes + labels.nbytes + 5)
        assert read_extents(f, extents[f], buf) == data.nbytes + labels.nbytes
        assert bytes(buf[:data.nbytes]) == data.tobytes()  # stored as read: no conversion in between
        assert bytes(buf[data.nbytes:data.nbytes + labels.nbytes]) == labels.tobytes()
    want = sum(32 * 48 * 16 * 4 + 32 * 48 for _ in files)  # float32 data x 16 channels + uint8 labels
    assert read_raw(files, extents) == read_h5_direct(files) == want


def test_a_chunked_dataset_has_no_raw_extent(tmp_path: Path) -> None:
    f = tmp_path / "data-chunked.h5"
    with h5py.File(f, "w") as h:
        h.create_dataset("climate/data", data=np.zeros((8, 8, 2), np.float32), chunks=(4, 4, 2), compression="gzip")
        h.create_dataset("climate/labels_0", data=np.zeros((8, 8), np.uint8))
    assert raw_extents([f]) is None
