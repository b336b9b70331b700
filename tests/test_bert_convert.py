"""`hpcbench convert bert`: TFRecords of tf.train.Example records as the reference's create_pretraining_data.py
writes them (written here by an independent writer: framing with masked crc32c and the Example protobuf by
hand) to our packed and padded HDF5 layouts; named errors for bad records; a non-empty --out refused
unless --replace."""
from __future__ import annotations

import struct
from pathlib import Path

import crc32c
import numpy as np
import pytest

from conftest import run_cli
from hpcbench.common.errors import ConfigError, DataError
from hpcbench.workloads.mlperf_training.bert import packing
from hpcbench.workloads.mlperf_training.bert.convert import convert
from hpcbench.workloads.mlperf_training.bert.format import open_shard

SEQ, PRED, VOCAB = 32, 5, 300


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _ld(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def example(features: dict[str, list[int] | list[float]]) -> bytes:
    """tf.train.Example: Features{map<string, Feature>}; ints as packed Int64List, floats as packed FloatList."""
    entries = b""
    for k, v in features.items():
        if v and isinstance(v[0], float):
            feature = _ld(2, _ld(1, struct.pack(f"<{len(v)}f", *v)))
        else:
            feature = _ld(3, _ld(1, b"".join(_varint(int(x)) for x in v)))
        entries += _ld(1, _ld(1, k.encode()) + _ld(2, feature))
    return _ld(1, entries)


def _masked(b: bytes) -> int:
    c = crc32c.crc32c(b)
    return ((((c >> 15) | (c << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def write_tfrecord(path: Path, payloads: list[bytes]) -> None:
    with open(path, "wb") as f:
        for p in payloads:
            n = struct.pack("<Q", len(p))
            f.write(n + struct.pack("<I", _masked(n)) + p + struct.pack("<I", _masked(p)))


def sample(g: np.random.Generator) -> dict[str, list]:
    n = int(g.integers(8, SEQ + 1))
    ids = [101, *g.integers(1000 % VOCAB, VOCAB, n - 2).tolist(), 102] + [0] * (SEQ - n)
    seg = [0] * (n // 2) + [1] * (n - n // 2) + [0] * (SEQ - n)
    m = int(g.integers(1, PRED + 1))
    pos = sorted(g.choice(np.arange(1, n - 1), m, replace=False).tolist())
    return {"input_ids": ids, "input_mask": [1] * n + [0] * (SEQ - n), "segment_ids": seg,
            "masked_lm_positions": pos + [0] * (PRED - m), "masked_lm_ids": g.integers(0, VOCAB, m).tolist() + [0] * (PRED - m),
            "masked_lm_weights": [1.0] * m + [0.0] * (PRED - m), "next_sentence_labels": [int(g.integers(0, 2))]}


def make_source(root: Path, per_file: tuple[int, ...] = (40, 30), evals: int = 20, seed: int = 0) -> list[list[dict]]:
    g = np.random.default_rng(seed)
    out = []
    for k, n in enumerate(per_file):
        samples = [sample(g) for _ in range(n)]
        write_tfrecord(root / f"part-{k:05d}-of-{len(per_file):05d}", [example(s) for s in samples])
        out.append(samples)
    ev = [sample(g) for _ in range(evals)]
    write_tfrecord(root / "eval_10k", [example(s) for s in ev])
    return [*out, ev]


def _same(rows_seq, samples: list[dict]) -> None:  # noqa: ANN001
    assert len(rows_seq) == len(samples)
    for r, s in enumerate(samples):
        n, m = sum(s["input_mask"]), int(sum(s["masked_lm_weights"]))
        assert rows_seq.input_ids[r].tolist() == s["input_ids"][:n]
        assert rows_seq.segment_ids[r].tolist() == s["segment_ids"][:n]
        assert rows_seq.masked_lm_positions[r].tolist() == s["masked_lm_positions"][:m]
        assert rows_seq.masked_lm_ids[r].tolist() == s["masked_lm_ids"][:m]
        assert rows_seq.next_sentence_labels[r].tolist() == s["next_sentence_labels"]


def test_convert_packed_and_padded(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    train0, train1, ev = make_source(src)
    limits = {"max_seq_len": SEQ, "max_pred": PRED, "vocab_size": VOCAB}
    counts = convert(src, tmp_path / "packed", progress=False, vocab_size=VOCAB)
    assert counts == {"train": 70, "eval": 20}
    shard = open_shard(tmp_path / "packed" / "train" / "part_00000_of_00002.hdf5", max_per_row=3, **limits)
    assert shard.packed and len(shard) < 40 and shard.sequences() == 40
    unpacked = packing.unpack(shard.read())
    assert sorted(map(tuple, (r.tolist() for r in unpacked.input_ids))) == sorted(
        tuple(s["input_ids"][: sum(s["input_mask"])]) for s in train0)
    _same(open_shard(tmp_path / "packed" / "eval" / "eval_00000.hdf5", **limits).read(), ev)  # padded, in order
    counts = convert(src, tmp_path / "padded", progress=False, layout="padded", vocab_size=VOCAB)
    _same(open_shard(tmp_path / "padded" / "train" / "part_00001_of_00002.hdf5", **limits).read(), train1)


def test_convert_refuses_a_non_empty_out_unless_replace(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    make_source(src, (10,), 5)
    out = tmp_path / "out"
    (out / "train").mkdir(parents=True)
    (out / "train" / "part_00009_of_00010.hdf5").write_bytes(b"stale")
    with pytest.raises(ConfigError, match=r"--out .*out: the output folder is not empty \(it holds train/part_00009"):
        convert(src, out, progress=False, vocab_size=VOCAB)
    assert convert(src, out, progress=False, replace=True, vocab_size=VOCAB) == {"train": 10, "eval": 5}
    assert sorted(p.name for p in (out / "train").iterdir()) == ["part_00000_of_00001.hdf5"]  # the stale shard went


@pytest.mark.parametrize("breakage,match", [
    ("missing", r"part-00000-of-00001: record 3: missing feature\(s\) masked_lm_weights"),
    ("length", r"part-00000-of-00001: record 3: 'input_ids' has 31 values, expected 32"),
    ("mask", r"record 3: 'input_mask' must be ones then zeros"),
    ("vocab", r"part-00000-of-00001: row 3: input_ids must be in \[0, 300\)"),
    ("crc", r"part-00000-of-00001: record 3 at byte \d+: payload CRC-32C mismatch"),
])
def test_bad_records_are_named_and_nothing_is_left(tmp_path: Path, breakage: str, match: str) -> None:
    g = np.random.default_rng(1)
    samples = [sample(g) for _ in range(6)]
    bad = samples[3]
    if breakage == "missing":
        del bad["masked_lm_weights"]
    elif breakage == "length":
        bad["input_ids"] = bad["input_ids"][:-1]
    elif breakage == "mask":
        bad["input_mask"] = [0] + bad["input_mask"][1:]
    elif breakage == "vocab":
        bad["input_ids"][1] = VOCAB + 5
    src = tmp_path / "src"
    src.mkdir()
    payloads = [example(s) for s in samples]
    write_tfrecord(src / "part-00000-of-00001", payloads)
    if breakage == "crc":
        raw = bytearray((src / "part-00000-of-00001").read_bytes())
        at = sum(len(p) + 16 for p in payloads[:3]) + 12 + 5
        raw[at] ^= 0xFF
        (src / "part-00000-of-00001").write_bytes(bytes(raw))
    write_tfrecord(src / "eval_10k", [example(sample(g))])
    with pytest.raises(DataError, match=match):
        convert(src, tmp_path / "out", progress=False, vocab_size=VOCAB)
    assert not (tmp_path / "out").exists() and [p.name for p in tmp_path.iterdir()] == ["src"]


def test_cli_convert_bert(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "train").mkdir(parents=True)
    (src / "eval").mkdir()
    g = np.random.default_rng(2)
    write_tfrecord(src / "train" / "a.tfrecord", [example(sample(g)) for _ in range(4)])
    write_tfrecord(src / "eval" / "e.tfrecord", [example(sample(g)) for _ in range(3)])
    proc = run_cli(["convert", "bert", "--src", str(src), "--out", str(tmp_path / "out"), "--layout", "padded",
                    "--no-progress"])
    assert proc.returncode == 0, proc.stderr
    assert "converted train: 4 samples" in proc.stdout and "converted eval: 3 samples" in proc.stdout
    assert open_shard(tmp_path / "out" / "train" / "part_00000_of_00001.hdf5", max_seq_len=SEQ, max_pred=PRED).rows == 4
    again = run_cli(["convert", "bert", "--src", str(src), "--out", str(tmp_path / "out"), "--no-progress"])
    assert again.returncode != 0 and "the output folder is not empty" in again.stderr and "Traceback" not in again.stderr


def test_a_flat_reference_folder_converts_eval_10k_not_eval_intermediate(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """The reference README's flat folder: part-* training files, eval_intermediate (the whole evaluation data) and
    eval_10k picked from it. Only eval_10k becomes eval/ (said), as the reference evaluates on it alone."""
    src = tmp_path / "src"
    src.mkdir()
    *_, ev = make_source(src, per_file=(10,), evals=7)
    g = np.random.default_rng(9)
    write_tfrecord(src / "eval_intermediate", [example(sample(g)) for _ in range(15)])
    counts = convert(src, tmp_path / "out", progress=False, vocab_size=VOCAB)
    assert counts["eval"] == 7 and "not converted: eval_intermediate" in capsys.readouterr().out
    _same(open_shard(tmp_path / "out" / "eval" / "eval_00000.hdf5", max_seq_len=SEQ, max_pred=PRED,
                     vocab_size=VOCAB).read(), ev)
    assert sorted(p.name for p in (tmp_path / "out" / "eval").iterdir()) == ["eval_00000.hdf5"]
