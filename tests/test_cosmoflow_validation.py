"""Every kind of bad CosmoFlow file, hand-built among good ones in a tiny dataset, fails the training
and the evaluation loader with the file's name and what was expected, under the torch and the DALI
loader (the reader threads validate before either transform runs)."""
from __future__ import annotations

import gzip
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from hpcbench.common.errors import DataError
from hpcbench.common.workload import DataShard
from hpcbench.common.data import tfrecord
from hpcbench.workloads.cosmoflow import data, synth
from hpcbench.workloads.cosmoflow.workload import CosmoFlowWorkload

SIZE = 8
GOOD_X = np.arange(SIZE ** 3 * 4, dtype=np.int16).reshape(SIZE, SIZE, SIZE, 4) % 7
GOOD_Y = np.array([0.1, -0.2, 0.3, -0.4], np.float32)


def _example(**features: object) -> bytes:
    return tfrecord.encode_example(features)  # type: ignore[arg-type]


def _good() -> bytes:
    return tfrecord.frame(data.encode_sample(GOOD_X, GOOD_Y))


def _bad_payload_crc() -> bytes:
    raw = bytearray(_good())
    raw[tfrecord.HEADER_BYTES + 40] ^= 0x01  # a byte of x; the payload CRC no longer matches
    return bytes(raw)


BAD: dict[str, tuple[Callable[[], bytes], str]] = {
    "payload_crc": (_bad_payload_crc, r"record 0 at byte 0: payload CRC-32C mismatch"),
    "missing_y": (lambda: tfrecord.frame(_example(x=GOOD_X.tobytes())),
                  r"Example lacks feature 'y' \(has: x\); expected 'x' \(int16 bytes\) and 'y' \(4 float32\)"),
    "y_int64": (lambda: tfrecord.frame(_example(x=GOOD_X.tobytes(), y=np.array([1, 2, 3, 4], np.int64))),
                r"feature 'y' must be 4 float32 values \(float_list\), got int64_list of 4 values"),
    "y_3_values": (lambda: tfrecord.frame(_example(x=GOOD_X.tobytes(), y=GOOD_Y[:3])),
                   r"feature 'y' must be 4 float32 values \(float_list\), got float_list of 3 values"),
    "two_records": (lambda: _good() + _good(),
                    rf"a second TFRecord record starts at byte {len(_good())} .*expected exactly one record per file"),
    "x_size": (lambda: tfrecord.frame(data.encode_sample(GOOD_X[:-1], GOOD_Y)),
               rf"feature 'x' has {7 * 8 * 8 * 4 * 2} bytes; expected int16 \[8,8,8,4\] = 4096 bytes"),
}


@pytest.fixture(scope="module")
def good_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cosmo_good")
    synth.generate(root, 5, 3, SIZE, seed=1, workers=1, compress=True, progress=False)
    return root


def _loaders(root: Path, loader: str, batch: int) -> dict[str, object]:
    cfg = CosmoFlowWorkload.load_config("mini", [f"data.root={root}", f"data.size={SIZE}", f"train.loader={loader}",
                                                 "model.conv_layers=2", "data.threads=2"])
    wl = CosmoFlowWorkload(cfg)
    shard = DataShard(rank=0, size=1, seed=4, local_batch_size=batch, device=torch.device("cpu"))
    return {"train": wl.train_loader(shard), "validation": wl.eval_loader(shard)}


@pytest.mark.parametrize("compress", [False, True], ids=["plain", "gzip"])
@pytest.mark.parametrize("loader", ["torch", "dali"])
@pytest.mark.parametrize("kind", list(BAD))
def test_bad_file_fails_both_loaders_with_its_name(good_dataset: Path, tmp_path: Path, kind: str, loader: str,
                                                    compress: bool) -> None:
    if loader == "dali":
        pytest.importorskip("nvidia.dali")
    make, expected = BAD[kind]
    root = tmp_path / "data"
    shutil.copytree(good_dataset, root)
    stream = make()
    name = f"univ_bad_{kind}.tfrecord" + (".gz" if compress else "")
    for split in ("train", "validation"):  # sorted among the good files, read by every batch order
        (root / split / name).write_bytes(gzip.compress(stream, mtime=0) if compress else stream)
    for split, batches in _loaders(root, loader, batch=2).items():
        with pytest.raises(DataError, match=re.escape(str(root / split / name)) + ": " + expected):
            for _ in batches:  # type: ignore[attr-defined]
                pass


def test_good_files_read_back_exactly(good_dataset: Path) -> None:
    for path in data.list_files(good_dataset, "train"):
        index = int(path.name.split("_")[1].split(".")[0])
        x, y = synth.make_sample(1, "train", index, SIZE)
        sample = data.read_sample(path, SIZE)
        assert sample.x.dtype == np.int16 and sample.x.shape == (SIZE, SIZE, SIZE, 4)
        np.testing.assert_array_equal(sample.x, x)
        np.testing.assert_array_equal(sample.y, y)


def test_second_record_in_a_second_gzip_member_is_found(tmp_path: Path) -> None:
    path = tmp_path / "two_members.tfrecord.gz"
    second = tfrecord.frame(data.encode_sample(GOOD_X, -GOOD_Y))
    path.write_bytes(gzip.compress(_good(), mtime=0) + gzip.compress(second, mtime=0))
    with pytest.raises(DataError, match="two_members.tfrecord.gz: a second TFRecord record"):
        data.read_sample(path, SIZE)


def test_gzip_damage_names_the_file(tmp_path: Path) -> None:
    packed = gzip.compress(_good(), mtime=0)
    cases = {"trailing.tfrecord.gz": packed + b"garbage!", "cut.tfrecord.gz": packed[:-20],
             "flipped.tfrecord.gz": packed[:30] + bytes([packed[30] ^ 0xFF]) + packed[31:]}
    for name, raw in cases.items():
        (tmp_path / name).write_bytes(raw)
        with pytest.raises(DataError, match=rf"{re.escape(name)}: (corrupt gzip stream|record 0)"):
            data.read_sample(tmp_path / name, SIZE)
    padded = tmp_path / "padded.tfrecord.gz"  # zero padding after the member is allowed, as by gzip
    padded.write_bytes(packed + bytes(16))
    np.testing.assert_array_equal(data.read_sample(padded, SIZE).x, GOOD_X)


def test_x_as_a_float_list_or_two_values(tmp_path: Path) -> None:
    cases = {"xf.tfrecord": (_example(x=np.zeros(4, np.float32), y=GOOD_Y), "got float_list of 4 values"),
             "x2.tfrecord": (_example(x=[GOOD_X.tobytes(), b""], y=GOOD_Y), "got bytes_list of 2 values")}
    for name, (payload, got) in cases.items():
        (tmp_path / name).write_bytes(tfrecord.frame(payload))
        with pytest.raises(DataError, match=rf"{name}: feature 'x' must be one bytes value \(bytes_list\), {got}"):
            data.read_sample(tmp_path / name, SIZE)


def test_empty_file(tmp_path: Path) -> None:
    (tmp_path / "empty.tfrecord").write_bytes(b"")
    with pytest.raises(DataError, match="empty.tfrecord: holds no TFRecord record; expected exactly one"):
        data.read_sample(tmp_path / "empty.tfrecord", SIZE)
