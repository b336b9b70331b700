"""DLRM-DCNv2 Criteo multi-hot format: writer -> reader, reader on files built with plain numpy from
the published layout, the reference's last-day split, memory mapping, and named errors."""
from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import pytest

from hpcbench.common.errors import DataError
from hpcbench.workloads.mlperf_training.dlrm_dcnv2.criteo import CARDINALITIES, MULTI_HOT_SIZES
from hpcbench.workloads.mlperf_training.dlrm_dcnv2.format import CriteoSplit, Day, eval_halves, write_day
from hpcbench.workloads.mlperf_training.dlrm_dcnv2.synth import Teacher, write_synthetic

CARDS = tuple(min(c, 500) for c in CARDINALITIES)
BAGS = MULTI_HOT_SIZES


def handmade_day(folder: Path, day: int, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """One day written with plain numpy calls from the published layout (not by the project's writer)."""
    rng = np.random.default_rng(seed)
    dense = np.log(rng.integers(0, 50, size=(n, 13)) + 3.0).astype(np.float32)
    labels = rng.integers(0, 2, size=(n, 1)).astype(np.int32)
    sparse = [rng.integers(0, c, size=(n, h)).astype(np.int32) for c, h in zip(CARDS, BAGS)]
    np.save(folder / f"day_{day}_dense.npy", dense)
    np.save(folder / f"day_{day}_labels.npy", labels)
    np.savez(folder / f"day_{day}_sparse_multi_hot.npz", **{str(k): s for k, s in enumerate(sparse)})
    return dense, labels, sparse


def test_reader_on_handmade_files_maps_without_reading(tmp_path: Path) -> None:
    dense, labels, sparse = handmade_day(tmp_path, 0, 37)
    day = Day.open(tmp_path, 0, BAGS, CARDS)
    assert len(day) == 37
    assert isinstance(day.dense, np.memmap) and isinstance(day.labels, np.memmap)
    assert all(isinstance(s, np.memmap) for s in day.sparse)  # npz members mapped at their offsets
    np.testing.assert_array_equal(day.dense, dense)
    np.testing.assert_array_equal(day.labels, labels)
    for got, want, h in zip(day.sparse, sparse, BAGS):
        assert got.shape == (37, h) and got.dtype == np.int32
        np.testing.assert_array_equal(got, want)
    rows = day.rows(np.array([3, 10, 36]))
    np.testing.assert_array_equal(rows.labels, labels[[3, 10, 36], 0])
    np.testing.assert_array_equal(rows.sparse[20], sparse[20][[3, 10, 36]])


def test_writer_reader_round_trip_and_np_load(tmp_path: Path) -> None:
    t = Teacher(CARDS, seed=3)
    r = t.day(101, 5)
    write_day(tmp_path, 5, r.dense, r.labels.reshape(-1, 1), r.sparse, BAGS, CARDS)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["day_5_dense.npy", "day_5_labels.npy",
                                                          "day_5_sparse_multi_hot.npz"]
    with np.load(tmp_path / "day_5_sparse_multi_hot.npz") as z:  # what any numpy user reads
        assert sorted(z.files, key=int) == [str(k) for k in range(26)]
        np.testing.assert_array_equal(z["20"], r.sparse[20])
        assert z["20"].shape == (101, 100) and z["20"].dtype == np.int32
    with zipfile.ZipFile(tmp_path / "day_5_sparse_multi_hot.npz") as z:
        assert {i.compress_type for i in z.infolist()} == {zipfile.ZIP_STORED}
    day = Day.open(tmp_path, 5, BAGS, CARDS)
    got = day.rows(slice(0, len(day)))
    np.testing.assert_array_equal(got.dense, r.dense)
    np.testing.assert_array_equal(got.labels, r.labels)
    for a, b in zip(got.sparse, r.sparse):
        np.testing.assert_array_equal(a, b)
    assert np.load(tmp_path / "day_5_dense.npy").dtype == np.float32


def test_synthetic_is_deterministic_and_bags_follow_their_base_id() -> None:
    t = Teacher(CARDS, seed=1)
    a, b = t.day(300, 2, chunk_rows=128), t.day(300, 2, chunk_rows=128)
    np.testing.assert_array_equal(a.sparse[20], b.sparse[20])
    np.testing.assert_array_equal(a.labels, b.labels)
    s = a.sparse[20]  # a bag is a fixed function of its first id (the reference's multi-hot lookup table)
    first = {}
    for row in s:
        first.setdefault(int(row[0]), row)
        np.testing.assert_array_equal(first[int(row[0])], row)
    assert all(0 <= x.min() and x.max() < c for x, c in zip(a.sparse, CARDS))
    assert np.all(a.dense >= np.log(2.0) - 1e-6)  # log(x + 3) of counts >= -1


def test_teacher_clicks_are_learnable() -> None:
    import torch

    from hpcbench.workloads.mlperf_training.dlrm_dcnv2.auroc import auroc

    t = Teacher(CARDS, seed=2)
    r = t.day(6000, 0)
    bayes = auroc(torch.tensor(t.logits(r.dense, r.sparse)), torch.tensor(r.labels))
    assert 0.72 < bayes < 0.9, bayes  # a trivial predictor has 0.5
    assert 0.1 < r.labels.mean() < 0.5


def test_splits_follow_the_reference(tmp_path: Path) -> None:
    assert eval_halves(7) == (slice(0, 4), slice(4, 7))  # first half rounded up is validation
    assert eval_halves(178_274_637)[0].stop == 89_137_319  # the real day 23 -> the pinned eval_samples
    write_synthetic(str(tmp_path), 3, 9, Teacher(CARDS, seed=0))
    train = CriteoSplit(tmp_path, "train", 3, BAGS, CARDS)
    val = CriteoSplit(tmp_path, "validation", 3, BAGS, CARDS)
    test = CriteoSplit(tmp_path, "test", 3, BAGS, CARDS)
    assert (len(train), len(val), len(test)) == (18, 5, 4)
    day2 = Day.open(tmp_path, 2, BAGS, CARDS).rows(slice(0, 9))
    np.testing.assert_array_equal(val.read(np.arange(5)).dense, day2.dense[:5])
    np.testing.assert_array_equal(test.read(np.arange(4)).sparse[3], day2.sparse[3][5:])
    day1 = Day.open(tmp_path, 1, BAGS, CARDS).rows(slice(0, 9))
    got = train.read(np.array([10, 2, 17]))  # across days, any order
    np.testing.assert_array_equal(got.dense[0], day1.dense[1])
    np.testing.assert_array_equal(got.dense[2], day1.dense[8])


# -- bad input --------------------------------------------------------------------------------------------


def test_missing_file_is_named(tmp_path: Path) -> None:
    handmade_day(tmp_path, 0, 5)
    (tmp_path / "day_0_labels.npy").unlink()
    with pytest.raises(DataError, match=r"day_0_labels\.npy: file not found"):
        Day.open(tmp_path, 0, BAGS, CARDS)


@pytest.mark.parametrize("which, bad, message", [
    ("dense", np.zeros((5, 13), np.float64), r"day_0_dense\.npy: expected float32 \(N, 13\), found float64"),
    ("dense", np.zeros((5, 12), np.float32), r"day_0_dense\.npy: expected float32 \(N, 13\), found float32 \(5, 12\)"),
    ("labels", np.zeros((5,), np.int32), r"day_0_labels\.npy: expected int32 \(N, 1\)"),
    ("labels", np.zeros((4, 1), np.int32), r"day_0_labels\.npy: 4 rows but day_0_dense\.npy has 5"),
])
def test_bad_npy_named(tmp_path: Path, which: str, bad: np.ndarray, message: str) -> None:
    handmade_day(tmp_path, 0, 5)
    np.save(tmp_path / f"day_0_{which}.npy", bad)
    with pytest.raises(DataError, match=message):
        Day.open(tmp_path, 0, BAGS, CARDS)


def test_big_endian_npy_shows_the_byte_order(tmp_path: Path) -> None:
    """A big-endian float32 file is not the format; the message shows both byte orders, not
    "expected float32 ..., found float32 ..." of the same shape."""
    handmade_day(tmp_path, 0, 5)
    dense = np.load(tmp_path / "day_0_dense.npy")
    np.save(tmp_path / "day_0_dense.npy", dense.astype(">f4"))
    with pytest.raises(DataError, match=r"day_0_dense\.npy: expected float32 '<f4' \(N, 13\), "
                                        r"found float32 '>f4' \(big-endian\) \(5, 13\)"):
        Day.open(tmp_path, 0, BAGS, CARDS)
    handmade_day(tmp_path, 0, 5)
    _rewrite_npz(tmp_path, {"3": np.zeros((5, 2), ">i4")})
    with pytest.raises(DataError, match=r"day_0_sparse_multi_hot\.npz: member '3': expected int32 '<i4' \(N, 2\), "
                                        r"found int32 '>i4' \(big-endian\) \(5, 2\)"):
        Day.open(tmp_path, 0, BAGS, CARDS)


@pytest.mark.parametrize("remove, named", [
    (["day_2_labels.npy"], r"day 2: day_2_labels\.npy missing"),  # the eval day without labels
    (["day_1_labels.npy"], r"day 1: day_1_labels\.npy missing"),
    (["day_1_dense.npy", "day_1_sparse_multi_hot.npz"],
     r"day 1: day_1_dense\.npy, day_1_sparse_multi_hot\.npz missing"),
    (["day_2_dense.npy"], r"day 2: day_2_dense\.npy missing"),
])
def test_half_present_day_is_named_not_dropped(tmp_path: Path, remove: list[str], named: str) -> None:
    """A day with some of its three files is an error naming the missing ones, never a smaller dataset
    (counting days by their labels alone dropped such a day: fewer train rows, another eval day)."""
    from hpcbench.workloads.mlperf_training.dlrm_dcnv2.dataset import count_days

    write_synthetic(str(tmp_path), 3, 9, Teacher(CARDS, seed=0))
    assert count_days(tmp_path) == 3
    for name in remove:
        (tmp_path / name).unlink()
    with pytest.raises(DataError, match=named):
        count_days(tmp_path)


def test_extra_day_without_labels_is_named(tmp_path: Path) -> None:
    from hpcbench.workloads.mlperf_training.dlrm_dcnv2.dataset import count_days

    write_synthetic(str(tmp_path), 3, 9, Teacher(CARDS, seed=0))
    for name in ("dense.npy", "sparse_multi_hot.npz"):
        (tmp_path / f"day_3_{name}").write_bytes((tmp_path / f"day_2_{name}").read_bytes())
    with pytest.raises(DataError, match=r"day 3: day_3_labels\.npy missing"):
        count_days(tmp_path)


def _rewrite_npz(folder: Path, change: dict[str, np.ndarray | None], compressed: bool = False) -> None:
    path = folder / "day_0_sparse_multi_hot.npz"
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    for k, v in change.items():
        if v is None:
            arrays.pop(k)
        else:
            arrays[k] = v
    (np.savez_compressed if compressed else np.savez)(path, **arrays)


@pytest.mark.parametrize("change, message", [
    ({"7": None}, r"missing member\(s\) '7'"),
    ({"26": np.zeros((5, 1), np.int32)}, r"unexpected member\(s\) 26\.npy"),
    ({"20": np.zeros((5, 99), np.int32)}, r"member '20': expected int32 \(N, 100\), found int32 \(5, 99\)"),
    ({"3": np.zeros((5, 2), np.int64)}, r"member '3': expected int32 \(N, 2\), found int64"),
    ({"4": np.zeros((6, 6), np.int32)}, r"member '4' has 6 rows but day_0_dense\.npy has 5"),
])
def test_bad_npz_members_named(tmp_path: Path, change: dict[str, np.ndarray | None], message: str) -> None:
    handmade_day(tmp_path, 0, 5)
    _rewrite_npz(tmp_path, change)
    with pytest.raises(DataError, match=r"day_0_sparse_multi_hot\.npz: " + message):
        Day.open(tmp_path, 0, BAGS, CARDS)


def test_compressed_npz_refused(tmp_path: Path) -> None:
    handmade_day(tmp_path, 0, 5)
    _rewrite_npz(tmp_path, {}, compressed=True)
    with pytest.raises(DataError, match=r"member '0' is compressed; the format is np\.savez"):
        Day.open(tmp_path, 0, BAGS, CARDS)


def test_truncated_files_named(tmp_path: Path) -> None:
    handmade_day(tmp_path, 0, 50)
    path = tmp_path / "day_0_sparse_multi_hot.npz"
    path.write_bytes(path.read_bytes()[:-4000])
    with pytest.raises(DataError, match=r"day_0_sparse_multi_hot\.npz: not a readable \.npz"):
        Day.open(tmp_path, 0, BAGS, CARDS)
    handmade_day(tmp_path, 0, 50)
    path = tmp_path / "day_0_dense.npy"
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(DataError, match=r"day_0_dense\.npy: not a readable \.npy"):
        Day.open(tmp_path, 0, BAGS, CARDS)


def test_bad_values_named_on_read(tmp_path: Path) -> None:
    dense, labels, sparse = handmade_day(tmp_path, 0, 8)
    sparse[11][6, 2] = CARDS[11]
    np.savez(tmp_path / "day_0_sparse_multi_hot.npz", **{str(k): s for k, s in enumerate(sparse)})
    day = Day.open(tmp_path, 0, BAGS, CARDS)
    day.rows(slice(0, 6))  # rows without the bad id read fine
    with pytest.raises(DataError, match=rf"member '11': rows 4\.\.8: ids must be in \[0, {CARDS[11]}\)"):
        day.rows(slice(4, 8))
    labels[2] = 2
    np.save(tmp_path / "day_0_labels.npy", labels)
    with pytest.raises(DataError, match=r"day_0_labels\.npy: rows 0\.\.4: labels must be 0 or 1"):
        Day.open(tmp_path, 0, BAGS, CARDS).rows(slice(0, 4))


@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_non_finite_dense_value_is_named_on_read(tmp_path: Path, value: float) -> None:
    dense, labels, sparse = handmade_day(tmp_path, 0, 8)
    dense = dense.astype(np.float32)
    dense[5, 3] = value
    np.save(tmp_path / "day_0_dense.npy", dense)
    day = Day.open(tmp_path, 0, BAGS, CARDS)
    day.rows(slice(0, 4))  # rows without it read fine
    with pytest.raises(DataError, match=rf"day_0_dense\.npy: rows 4\.\.8: dense feature 3 of row 1 of these is {value}"):
        day.rows(slice(4, 8))


def test_writer_refuses_bad_arrays_and_leaves_nothing(tmp_path: Path) -> None:
    r = Teacher(CARDS, seed=0).day(4, 0)
    with pytest.raises(DataError, match=r"labels: expected int32 \(4, 1\)"):
        write_day(tmp_path, 0, r.dense, r.labels, r.sparse, BAGS, CARDS)  # labels must be (N, 1)
    bad = list(r.sparse)
    bad[0] = bad[0] + CARDS[0]  # ids outside the table: caught by the read-back before the rename
    with pytest.raises(DataError, match=r"ids must be in"):
        write_day(tmp_path, 0, r.dense, r.labels.reshape(-1, 1), bad, BAGS, CARDS)
    with pytest.raises(DataError, match=r"dense: expected float32 '<f4' \(4, 13\), got float32 '>f4' \(big-endian\)"):
        write_day(tmp_path, 0, r.dense.astype(">f4"), r.labels.reshape(-1, 1), r.sparse, BAGS, CARDS)
    assert list(tmp_path.iterdir()) == []
