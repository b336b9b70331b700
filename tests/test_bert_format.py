"""BERT HDF5 pretraining format (padded and packed): round trips, files built with plain h5py from the
published layouts, named errors; the synthetic language (determinism, lengths, baselines) and packing."""
from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

from hpcbench.common.errors import DataError
from hpcbench.workloads.mlperf_training.bert import packing, synth
from hpcbench.workloads.mlperf_training.bert.format import (PACKED_KEYS, PADDED_KEYS, PackedShard, PaddedShard, Rows, open_shard,
                                         write_packed, write_padded)

L, P, V = 64, 10, 400  # small limits for fast tests
LIMITS = {"max_seq_len": L, "max_pred": P, "vocab_size": V}
LANG = synth.Language(vocab_size=V, seed=3)


def _rows(n: int = 40, seed: int = 0) -> Rows:
    return synth.generate(LANG, n, seed=seed, max_seq_len=L, max_pred=P)


def test_padded_round_trip_and_reads_in_any_order(tmp_path: Path) -> None:
    rows = _rows()
    path = tmp_path / "part_0.hdf5"
    write_padded(path, rows, **LIMITS)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["part_0.hdf5"]  # no temporary left behind
    with h5py.File(path) as f:  # the reference converter's dtypes and shapes
        assert {k: (f[k].dtype.name, f[k].shape) for k in PADDED_KEYS} == {
            "input_ids": ("int32", (40, L)), "input_mask": ("int8", (40, L)), "segment_ids": ("int8", (40, L)),
            "masked_lm_positions": ("int32", (40, P)), "masked_lm_ids": ("int32", (40, P)),
            "next_sentence_labels": ("int8", (40,))}
        assert f["input_ids"].compression == "gzip"
    with open_shard(path, **LIMITS) as shard:
        assert isinstance(shard, PaddedShard) and len(shard) == 40
        assert shard.read().equals(rows)
        idx = [7, 3, 3, 39, 0]
        assert shard.read(idx).equals(rows.select(idx))


def test_packed_round_trip_keeps_every_sequence(tmp_path: Path) -> None:
    rows = _rows(60)
    packed = packing.pack(rows, L, 3)
    assert len(packed) < len(rows) and max(len(s) for s in packed.seq_lens) <= 3
    path = tmp_path / "packed_0.hdf5"
    write_packed(path, packed, max_per_row=3, **LIMITS)
    with h5py.File(path) as f:
        assert {k: h5py.check_vlen_dtype(f[k].dtype).name for k in PACKED_KEYS} == {
            "input_ids": "int16", "segment_ids": "int8", "masked_lm_positions": "int16", "masked_lm_ids": "int16",
            "packed_input_len": "int16", "packed_masked_lm_len": "int16", "next_sentence_labels": "int8"}
    with open_shard(path, max_per_row=3, **LIMITS) as shard:
        assert isinstance(shard, PackedShard)
        back = shard.read()
    assert back.equals(packed)
    order = [i for row in packing.assign(np.array([len(t) for t in rows.input_ids]), L, 3) for i in row]
    assert sorted(order) == list(range(len(rows)))
    assert packing.unpack(back).equals(rows.select(order))


@pytest.mark.parametrize("wide", ["i4", "i2"])
def test_reader_on_padded_file_built_from_the_published_layout(tmp_path: Path, wide: str) -> None:
    """Two samples written with plain h5py as the reference converter lays them out (not by our writer);
    ``i2``: ids and positions as NVIDIA's re-sharding tool writes them."""
    ids = np.zeros((2, L), np.int32)
    ids[0, :7] = [101, 2023, 103, 1037, 102, 3231, 102]
    ids[1, :5] = [101, 7592, 102, 2088, 102]
    mask = (ids != 0).astype(np.int8)
    seg = np.zeros((2, L), np.int8)
    seg[0, 5:7] = 1
    seg[1, 3:5] = 1
    pos = np.zeros((2, P), np.int32)
    mids = np.zeros((2, P), np.int32)
    pos[0, :2], mids[0, :2] = [2, 3], [2003, 1037]
    pos[1, :1], mids[1, :1] = [3], [2088]
    path = tmp_path / "hand.hdf5"
    with h5py.File(path, "w") as f:
        for k, a, dt in [("input_ids", ids, wide), ("input_mask", mask, "i1"), ("segment_ids", seg, "i1"),
                         ("masked_lm_positions", pos, wide), ("masked_lm_ids", mids, wide),
                         ("next_sentence_labels", np.array([0, 1]), "i1")]:
            f.create_dataset(k, data=a, dtype=dt, compression="gzip")
    with open_shard(path, max_seq_len=L, max_pred=P, vocab_size=30522) as shard:
        rows = shard.read()
    assert rows.input_ids[0].tolist() == [101, 2023, 103, 1037, 102, 3231, 102]
    assert rows.segment_ids[1].tolist() == [0, 0, 0, 1, 1]
    assert [s.tolist() for s in rows.seq_lens] == [[7], [5]]
    assert rows.masked_lm_positions[0].tolist() == [2, 3] and rows.masked_lm_ids[0].tolist() == [2003, 1037]
    assert [m.tolist() for m in rows.masked_lens] == [[2], [1]]
    assert [n.tolist() for n in rows.next_sentence_labels] == [[0], [1]]


def test_reader_on_packed_file_built_from_the_published_layout(tmp_path: Path) -> None:
    """One row of two sequences as NVIDIA's create_packed_trainset.py stores it: vlen int16/int8 rows,
    the second sequence's masked positions offset by the first one's length."""
    path = tmp_path / "packed_hand.hdf5"
    row = {"input_ids": ([101, 7, 103, 102, 9, 102, 101, 5, 102, 103, 102], "int16"),
           "segment_ids": ([0, 0, 0, 0, 1, 1, 0, 0, 0, 1, 1], "int8"),
           "masked_lm_positions": ([2, 9], "int16"), "masked_lm_ids": ([8, 6], "int16"),
           "packed_input_len": ([6, 5], "int16"), "packed_masked_lm_len": ([1, 1], "int16"),
           "next_sentence_labels": ([1, 0], "int8")}
    with h5py.File(path, "w") as f:
        for k, (vals, dt) in row.items():
            ds = f.create_dataset(k, (1,), dtype=h5py.vlen_dtype(np.dtype(dt)))
            ds[0] = np.array(vals, dt)
    with open_shard(path, max_seq_len=L, max_pred=P, vocab_size=V) as shard:
        rows = shard.read()
    assert rows.seq_lens[0].tolist() == [6, 5] and rows.masked_lm_positions[0].tolist() == [2, 9]
    single = packing.unpack(rows)
    assert single.masked_lm_positions[1].tolist() == [3]  # 9 - 6: within the second sequence
    assert single.input_ids[1].tolist() == [101, 5, 102, 103, 102]


def _padded_file(tmp_path: Path, **replace: np.ndarray) -> Path:
    path = tmp_path / "bad.hdf5"
    write_padded(path, _rows(4), **LIMITS)
    with h5py.File(path, "a") as f:
        for k, v in replace.items():
            del f[k]
            if v is not None:
                f.create_dataset(k, data=v)
    return path


def test_named_errors_for_keys_shapes_dtypes_and_values(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"missing key 'masked_lm_ids'"):
        PaddedShard(_padded_file(tmp_path, masked_lm_ids=None), **LIMITS)
    with pytest.raises(DataError, match=r"'input_ids': expected shape \(N, 64\), found \(4, 63\)"):
        PaddedShard(_padded_file(tmp_path, input_ids=np.zeros((4, L - 1), np.int32)), **LIMITS)
    with pytest.raises(DataError, match=r"'input_ids': expected dtype int16 or int32 or int64, found float32"):
        PaddedShard(_padded_file(tmp_path, input_ids=np.zeros((4, L), np.float32)), **LIMITS)
    ids = np.zeros((4, L), np.int32)
    rows = _rows(4)
    for r, t in enumerate(rows.input_ids):
        ids[r, : len(t)] = t
    ids[2, 1] = V  # out of the vocabulary: found at the shard's first read (row 0), not when row 2 is read
    with pytest.raises(DataError, match=rf"bad.hdf5: 'input_ids' row 2: id {V} is outside the vocabulary "
                                        rf"\[0, {V}\) \(1 such id\(s\) in rows 0..3\); found at the shard's first read"):
        with PaddedShard(_padded_file(tmp_path, input_ids=ids), **LIMITS) as shard:
            shard.read([0])
    mask = np.zeros((4, L), np.int8)
    mask[:, :3] = 1
    mask[0, 5] = 1  # a hole: not ones-then-zeros
    with PaddedShard(_padded_file(tmp_path, input_mask=mask), **LIMITS) as shard, \
            pytest.raises(DataError, match=r"'input_mask' row 0: expected ones then zeros"):
        shard.read()


def test_named_errors_for_packed_rows(tmp_path: Path) -> None:
    packed = packing.pack(_rows(12), L, 3)
    good = tmp_path / "p.hdf5"
    write_packed(good, packed, **LIMITS)
    with h5py.File(good, "a") as f:
        lens = f["packed_input_len"][0].copy()
        lens[0] += 1  # lengths no longer sum to the row's tokens
        f["packed_input_len"][0] = lens
    with PackedShard(good, **LIMITS) as shard, pytest.raises(DataError, match=r"p.hdf5: row 0: \d+ tokens but the "
                                                                             r"sequence lengths"):
        shard.read()
    with pytest.raises(DataError, match=r"row 0: 3 sequences, at most 2 expected"):
        bad = Rows()
        bad.extend(packed.select([int(np.argmax([len(s) for s in packed.seq_lens]))]))
        assert len(bad.seq_lens[0]) == 3
        write_packed(tmp_path / "q.hdf5", bad, max_per_row=2, **LIMITS)
    assert not (tmp_path / "q.hdf5").exists()
    flat = tmp_path / "flat.hdf5"
    with h5py.File(flat, "w") as f:
        for k in PACKED_KEYS:
            f.create_dataset(k, data=np.zeros((2, 4), np.int16))
        f.create_dataset("input_mask", data=np.zeros((2, 4), np.int8))
    with pytest.raises(DataError, match=r"'input_ids': expected a variable-length \(vlen\) integer dataset"):
        open_shard(flat, **LIMITS)


def test_truncated_and_missing_files_are_named(tmp_path: Path) -> None:
    path = tmp_path / "t.hdf5"
    write_padded(path, _rows(20), **LIMITS)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError, match=r"t.hdf5: not a readable HDF5 file, truncated or corrupt"):
        open_shard(path, **LIMITS)
    with pytest.raises(DataError, match=r"nope.hdf5: file not found"):
        open_shard(tmp_path / "nope.hdf5", **LIMITS)


def test_corrupt_metadata_and_another_datasets_file_are_named(tmp_path: Path) -> None:
    import random

    path = tmp_path / "t.hdf5"
    write_padded(path, _rows(20), **LIMITS)
    raw = bytearray(path.read_bytes())
    rng = random.Random(0)
    raw[700:900] = bytes(rng.randrange(256) for _ in range(200))  # the root group's metadata
    path.write_bytes(bytes(raw))
    with pytest.raises(DataError, match=r"t.hdf5: cannot list its keys \(.*bad heap free list.*\); the file is truncated "
                                        r"or corrupt"):
        open_shard(path, **LIMITS)  # was: a bare RuntimeError from h5py and a traceback
    other = tmp_path / "other.hdf5"
    with h5py.File(other, "w") as f:
        f["climate/data"] = np.zeros((2, 2, 2), np.float32)
    with pytest.raises(DataError, match=r"other.hdf5: not a BERT pretraining shard: its top-level keys are \['climate'\]; "
                                        r"a packed shard has .*packed_input_len.*, a padded one input_ids"):
        open_shard(other, **LIMITS)


def test_empty_split_folder_names_the_folder_and_the_pattern_once(tmp_path: Path) -> None:
    from hpcbench.workloads.mlperf_training.bert.dataset import BertData

    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "README.txt").write_text("not a shard")
    with pytest.raises(DataError) as err:
        BertData(**LIMITS).open(tmp_path, "train")
    message = str(err.value)
    assert message == f"{tmp_path / 'train'}: no BERT HDF5 pretraining shards (*.hdf5, *.hdf, part_[0-9]*)", message


def test_writer_refuses_bad_rows_and_leaves_nothing(tmp_path: Path) -> None:
    rows = _rows(3)
    rows.masked_lm_positions[1] = rows.masked_lm_positions[1][::-1].copy()
    with pytest.raises(DataError, match=r"row 1: masked_lm_positions .* must increase"):
        write_padded(tmp_path / "w.hdf5", rows, **LIMITS)
    assert list(tmp_path.iterdir()) == []


def test_synthetic_language_is_deterministic_and_learnable() -> None:
    a = synth.generate(LANG, 300, seed=5, max_seq_len=L, max_pred=P)
    assert a.equals(synth.generate(LANG, 300, seed=5, max_seq_len=L, max_pred=P))
    assert synth.generate(LANG, 20, seed=5, start=270, max_seq_len=L, max_pred=P).equals(a.select(range(270, 290)))
    assert not a.equals(synth.generate(LANG, 300, seed=6, max_seq_len=L, max_pred=P))
    labels = np.concatenate(a.next_sentence_labels)
    assert 0.4 < labels.mean() < 0.6
    trivial, oracle = synth.most_frequent_accuracy(a), synth.oracle_accuracy(LANG, a)
    assert trivial < 0.1 and oracle > 0.7, (trivial, oracle)


def test_reference_like_lengths_and_packing_at_512() -> None:
    lengths = synth.sample_lengths(np.random.default_rng(0), 8192, 512)
    assert 240 < lengths.mean() < 270  # the reference data's mean is about 254
    assert 0.07 < (lengths == 512).mean() < 0.13
    rows = packing.assign(lengths, 512, 3)
    fill = lengths.sum() / (512 * len(rows))
    assert fill > 0.92 and max(len(r) for r in rows) == 3
    assert sorted(i for r in rows for i in r) == list(range(len(lengths)))
    assert all(lengths[r].sum() <= 512 for r in rows)


def test_negative_masked_lm_id_in_a_packed_shard_is_named_at_its_first_read(tmp_path: Path) -> None:
    packed = packing.pack(_rows(12), L, 3)
    path = tmp_path / "part-00001.hdf5"
    write_packed(path, packed, **LIMITS)
    last = len(packed) - 1
    with h5py.File(path, "a") as f:
        mids = f["masked_lm_ids"][last].copy()
        mids[-1] = -5  # int16 wrap-around or a bad converter: would be read only in the epoch reaching the row
        f["masked_lm_ids"][last] = mids
    with pytest.raises(DataError, match=rf"part-00001.hdf5: 'masked_lm_ids' row {last}: id -5 is outside the "
                                        rf"vocabulary \[0, {V}\)"):
        with open_shard(path, **LIMITS) as shard:
            shard.read([0])
    with h5py.File(path, "a") as f:  # an input id past the vocabulary, in the first row
        f["masked_lm_ids"][last] = np.abs(mids)
        ids = f["input_ids"][0].copy()
        ids[3] = V + 7
        f["input_ids"][0] = ids
    with pytest.raises(DataError, match=rf"'input_ids' row 0: id {V + 7} is outside"):
        with open_shard(path, **LIMITS) as shard:
            shard.read([last])


def test_padded_shard_with_fewer_masked_lm_rows_names_the_row_counts(tmp_path: Path) -> None:
    rows = _rows(4)
    mids = np.zeros((3, P), np.int32)  # one row short: the shape (3, 10) itself looks right per row
    for r in range(3):
        mids[r, : len(rows.masked_lm_ids[r])] = rows.masked_lm_ids[r]
    with pytest.raises(DataError, match=r"bad.hdf5: 'masked_lm_ids' has 3 rows but 'input_ids' has 4; every key "
                                        r"holds one row per sample"):
        open_shard(_padded_file(tmp_path, masked_lm_ids=mids), **LIMITS)


def test_training_on_a_shard_with_a_bad_masked_lm_id_stops_at_its_first_read_without_a_traceback(tmp_path: Path) -> None:
    from conftest import run_cli

    data = tmp_path / "data"
    proc = run_cli(["datagen", "bert", "--out", str(data), "--train-samples", "256", "--eval-samples", "64",
                    "--train-shards", "2", "--vocab-size", "200", "--max-seq-len", "64"])
    assert proc.returncode == 0, proc.stderr
    shard = sorted((data / "train").glob("*.hdf5"))[-1]
    with h5py.File(shard, "a") as f:
        last = f["masked_lm_ids"].shape[0] - 1
        mids = f["masked_lm_ids"][last].copy()
        mids[0] = -1
        f["masked_lm_ids"][last] = mids
    proc = run_cli(["train", "bert", "--config", "mini", "--data", str(data), "--results", str(tmp_path / "r"),
                    "--device", "cpu", "--no-progress"])
    assert proc.returncode == 4 and "Traceback" not in proc.stderr, proc.stderr
    assert f"{shard.name}: 'masked_lm_ids' row {last}: id -1 is outside the vocabulary [0, 200)" in proc.stderr, \
        proc.stderr


def _fixed2variable(src: Path, dst: Path) -> None:
    """NVIDIA's convert_fixed2variable.py, re-written with plain h5py: each padded row without its padding, vlen
    int16 ids and positions, int8 segments, (N,) int8 labels; no input_mask."""
    with h5py.File(src, "r") as i, h5py.File(dst, "w") as o:
        n = i["next_sentence_labels"].shape[0]
        vl = {k: o.create_dataset(k, (n,), dtype=h5py.vlen_dtype(np.dtype(dt)))
              for k, dt in (("input_ids", "int16"), ("segment_ids", "int8"), ("masked_lm_positions", "int16"),
                            ("masked_lm_ids", "int16"))}
        nsp = o.create_dataset("next_sentence_labels", data=np.zeros(n, dtype="int8"), dtype="i1")
        for r in range(n):
            t = int(i["input_mask"][r].astype(np.int64).sum())
            m = int((i["masked_lm_positions"][r] != 0).sum())
            vl["input_ids"][r] = i["input_ids"][r, :t]
            vl["segment_ids"][r] = i["segment_ids"][r, :t]
            vl["masked_lm_positions"][r] = i["masked_lm_positions"][r, :m]
            vl["masked_lm_ids"][r] = i["masked_lm_ids"][r, :m]
            nsp[r] = i["next_sentence_labels"][r]


def test_nvidias_variable_length_layout_reads_as_the_padded_rows_it_came_from(tmp_path: Path) -> None:
    """The layout NVIDIA's READMEs train and evaluate on (hdf5/eval_varlength/part_eval_10k.hdf5, the shuffled
    part_NNNNN_of_NNNNN.hdf training shards): every row equals the padded source's; a row whose segment ids are
    not as long as its tokens is named."""
    padded = tmp_path / "padded.hdf5"
    write_padded(padded, _rows(12), **LIMITS)
    var = tmp_path / "part_00000_of_00001.hdf"
    _fixed2variable(padded, var)
    with open_shard(padded, **LIMITS) as a, open_shard(var, **LIMITS) as b:
        assert type(b).__name__ == "VarlenShard" and not b.packed and len(b) == 12 and b.sequences() == 12
        order = np.array([5, 0, 11, 5])
        assert a.read(order).equals(b.read(order))
    with h5py.File(var, "a") as f:
        f["segment_ids"][3] = np.zeros(2, np.int8)
    with open_shard(var, **LIMITS) as b, pytest.raises(DataError, match=r"part_00000_of_00001.hdf: row 3: segment_ids "
                                                                      r"has 2 entries for \d+ input_ids"):
        b.read([3])
    with h5py.File(var, "a") as f:
        del f["masked_lm_ids"]
    with pytest.raises(DataError, match=r"missing key 'masked_lm_ids' \(a variable-length shard has input_ids, "):
        open_shard(var, **LIMITS)


def test_nvidias_shard_names_are_found_and_its_eval_folder_reads_part_eval_10k(tmp_path: Path) -> None:
    """create_packed_trainset.py names its shards part_NNNNN (no suffix), shuffle_samples.py part_N_of_M.hdf; NVIDIA's
    hdf5/eval/ holds eval_all.hdf5 (all the evaluation data) beside part_eval_10k.hdf5, and its run_pretraining.py
    reads only the eval files named "part": so do we."""
    from hpcbench.workloads.mlperf_training.bert.dataset import BertData

    (tmp_path / "train").mkdir()
    (tmp_path / "eval").mkdir()
    write_packed(tmp_path / "train" / "part_00000", packing.pack(_rows(20, 1), L, 3), **LIMITS)
    write_padded(tmp_path / "train" / "x.hdf5", _rows(6, 2), **LIMITS)
    _fixed2variable(tmp_path / "train" / "x.hdf5", tmp_path / "train" / "part_00001_of_00002.hdf")
    (tmp_path / "train" / "x.hdf5").unlink()
    write_padded(tmp_path / "eval" / "eval_all.hdf5", _rows(30, 3), **LIMITS)
    ten_k = _rows(8, 4)
    write_padded(tmp_path / "eval" / "part_eval_10k.hdf5", ten_k, **LIMITS)
    spec = BertData(L, P, V, eval_samples=8, exact_eval=True)
    train = spec.open(tmp_path, "train")
    assert [s.path.name for s in train.shards] == ["part_00000", "part_00001_of_00002.hdf"]
    assert train.sequences() == 26
    ev = spec.open(tmp_path, "eval")
    assert [s.path.name for s in ev.shards] == ["part_eval_10k.hdf5"] and ev.read(np.arange(8)).equals(ten_k)
    from hpcbench.common.data.layout import scan  # pack and stage take the same files (every node the same eval set)

    assert scan(tmp_path, spec.layout) == {"train": ["train/part_00000", "train/part_00001_of_00002.hdf"],
                                           "eval": ["eval/part_eval_10k.hdf5"]}
    # our own eval folder (no "part" names): every shard, as before
    (tmp_path / "eval" / "part_eval_10k.hdf5").rename(tmp_path / "eval" / "eval_00001.hdf5")
    assert len(BertData(L, P, V).open(tmp_path, "eval")) == 38
