"""TFRecord framing, masked CRC-32C and the Example protobuf, on hand-built bytes and files."""
from __future__ import annotations

import gzip
import struct

import numpy as np
import pytest

from hpcbench.common.errors import DataError
from hpcbench.common.data import tfrecord
from hpcbench.workloads.cosmoflow import data


def test_crc32c_and_mask_match_the_spec() -> None:
    import crc32c

    assert crc32c.crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value
    crc = 0xE3069283
    assert tfrecord.masked_crc(b"123456789") == ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def test_hand_built_example_decodes() -> None:
    # Example{features{feature{key:"y" value{float_list{value:[1.5]}}}}} with a non-packed float
    feature = b"\x12" + bytes([5]) + b"\x0d" + struct.pack("<f", 1.5)  # float_list{ value (fixed32) }
    entry = b"\x0a\x01y" + b"\x12" + bytes([len(feature)]) + feature
    features = b"\x0a" + bytes([len(entry)]) + entry
    example = b"\x0a" + bytes([len(features)]) + features
    out = tfrecord.decode_example(example)
    np.testing.assert_array_equal(out["y"], np.array([1.5], np.float32))
    # and our encoder writes the packed form, which decodes to the same thing
    again = tfrecord.decode_example(tfrecord.encode_example({"y": np.array([1.5], np.float32)}))
    np.testing.assert_array_equal(again["y"], out["y"])


def test_example_round_trip_all_kinds() -> None:
    feats = {"b": b"\x00\x01hello", "f": np.array([0.25, -3.0], np.float32),
             "i": np.array([1, -2, 300, 2**40], np.int64), "bl": [b"a", b"", b"ccc"]}
    out = tfrecord.decode_example(tfrecord.encode_example(feats))
    assert out["b"] == [feats["b"]]
    assert out["bl"] == feats["bl"]
    np.testing.assert_array_equal(out["f"], feats["f"])
    np.testing.assert_array_equal(out["i"], feats["i"])


@pytest.mark.parametrize("compress", [True, False])
def test_sample_file_round_trip(tmp_path, compress: bool) -> None:
    rng = np.random.default_rng(0)
    x = rng.poisson(1.0, (8, 8, 8, 4)).astype(np.int16)
    y = np.array([0.1, -0.2, 0.3, -0.4], np.float32)
    path = tmp_path / ("s.tfrecord.gz" if compress else "s.tfrecord")
    data.write_sample(path, x, y, compress=compress)
    assert tfrecord.is_gzip(path) == compress
    sample = data.read_sample(path, 8)
    np.testing.assert_array_equal(sample.x, x)
    np.testing.assert_array_equal(sample.y, y)
    # the framing is exactly the spec: length, masked crc(length), payload, masked crc(payload)
    raw = tfrecord.read_file_bytes(path)
    (length,) = struct.unpack("<Q", raw[:8])
    assert len(raw) == 8 + 4 + length + 4
    assert struct.unpack("<I", raw[8:12])[0] == tfrecord.masked_crc(raw[:8])
    assert struct.unpack("<I", raw[-4:])[0] == tfrecord.masked_crc(raw[12:12 + length])
    assert tfrecord.record_index(raw) == [(0, len(raw))]


def _sample_stream() -> bytes:
    x = np.ones((4, 4, 4, 4), np.int16)
    return tfrecord.frame(data.encode_sample(x, np.zeros(4, np.float32)))


@pytest.mark.parametrize("where", ["payload", "length"])
def test_corrupted_crc_names_the_file(tmp_path, where: str) -> None:
    raw = bytearray(_sample_stream())
    raw[20 if where == "payload" else 2] ^= 0x01
    path = tmp_path / "bad.tfrecord.gz"
    path.write_bytes(gzip.compress(bytes(raw)))
    with pytest.raises(DataError, match=rf"bad\.tfrecord\.gz.*{where} CRC-32C mismatch"):
        data.read_sample(path, 4)


def test_truncated_file(tmp_path) -> None:
    path = tmp_path / "short.tfrecord"
    path.write_bytes(_sample_stream()[:-10])
    with pytest.raises(DataError, match="short.tfrecord.*truncated"):
        data.read_sample(path, 4)


def test_wrong_shape_names_file_and_expectation(tmp_path) -> None:
    path = tmp_path / "s.tfrecord"
    path.write_bytes(_sample_stream())
    with pytest.raises(DataError, match=r"s\.tfrecord: feature 'x' has 512 bytes; expected int16 \[8,8,8,4\]"):
        data.read_sample(path, 8)


def test_missing_feature_and_bad_y(tmp_path) -> None:
    path = tmp_path / "nox.tfrecord"
    tfrecord.write_records(path, [tfrecord.encode_example({"y": np.zeros(4, np.float32)})], compress=False)
    with pytest.raises(DataError, match="nox.tfrecord: Example lacks feature 'x'"):
        data.read_sample(path, 4)
    path = tmp_path / "y3.tfrecord"
    tfrecord.write_records(path, [tfrecord.encode_example(
        {"x": np.ones((4, 4, 4, 4), np.int16).tobytes(), "y": np.zeros(3, np.float32)})], compress=False)
    with pytest.raises(DataError, match="y3.tfrecord: feature 'y' must be 4 float32"):
        data.read_sample(path, 4)


def test_list_files_errors(tmp_path) -> None:
    with pytest.raises(DataError, match="train: no such folder"):
        data.list_files(tmp_path, "train")
    (tmp_path / "train").mkdir()
    with pytest.raises(DataError, match="no TFRecord files"):
        data.list_files(tmp_path, "train")


@pytest.mark.parametrize("compress", [True, False])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_label_is_refused_at_read_time_naming_the_file(tmp_path, compress: bool, bad: float) -> None:
    """A NaN/inf label would surface only as a NaN loss epochs later: the reader refuses it, on both read
    paths (one sample, and straight into a batch slot), naming the file."""
    from hpcbench.workloads.cosmoflow.dataset import CosmoFlowData

    x = np.ones((4, 4, 4, 4), np.int16)
    good = tmp_path / ("good.tfrecord.gz" if compress else "good.tfrecord")
    data.write_sample(good, x, np.zeros(4, np.float32), compress=compress)
    path = tmp_path / ("nan_label.tfrecord.gz" if compress else "nan_label.tfrecord")
    data.write_sample(path, x, np.array([0.1, bad, 0.3, 0.4], np.float32), compress=compress)
    with pytest.raises(DataError, match=r"nan_label\.tfrecord(\.gz)?: label 'y' is not finite \(0\.1, (nan|inf), 0\.3"):
        data.read_sample(path, 4)
    spec = CosmoFlowData(size=4)
    source = type("Files", (), {"files": [good, path]})()
    with pytest.raises(DataError, match=r"nan_label\.tfrecord(\.gz)?: label 'y' is not finite"):
        spec.read_batch(source, [0, 1])
    x_batch, y_batch = spec.read_batch(source, [0])  # the good file alone still reads
    assert tuple(x_batch.shape) == (1, 4, 4, 4, 4) and float(y_batch.abs().sum()) == 0.0
