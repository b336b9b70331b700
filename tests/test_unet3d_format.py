"""unet3d KiTS19 preprocessed format: the reader on files built with plain ``np.save`` from the published
layout, the reference's evaluation split, writer round trip, the synthetic generator, and named errors
for each kind of bad file."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hpcbench.common.errors import DataError
from hpcbench.workloads.mlperf_training.unet3d.dataset import KiTSData
from hpcbench.workloads.mlperf_training.unet3d.facts import EVAL_CASES, TRAIN_SAMPLES
from hpcbench.workloads.mlperf_training.unet3d.format import list_cases, read_case, split_cases, write_case
from hpcbench.workloads.mlperf_training.unet3d.synth import ShapeRange, case_ids, make_case


def handmade_case(folder: Path, case: int, shape: tuple[int, int, int], seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """One case as the reference's preprocess_dataset.py saves it: np.save of float32 / uint8 (1, D, H, W)."""
    rng = np.random.default_rng(seed + case)
    x = rng.normal(size=(1, *shape)).astype(np.float32)
    y = rng.integers(0, 3, size=(1, *shape)).astype(np.uint8)
    np.save(folder / f"case_{case:05d}_x.npy", x, allow_pickle=False)
    np.save(folder / f"case_{case:05d}_y.npy", y, allow_pickle=False)
    return x, y


def test_reference_evaluation_list() -> None:
    assert len(EVAL_CASES) == 42 and len(set(EVAL_CASES)) == 42 and TRAIN_SAMPLES == 168
    assert EVAL_CASES[:5] == (0, 3, 5, 6, 12) and EVAL_CASES[-3:] == (203, 206, 207) and max(EVAL_CASES) < 210
    assert case_ids(210, 42) == list(range(210))  # the full dataset: every KiTS19 case id
    small = case_ids(10, 2)
    assert small == [0, 1, 2, 3, 4, 7, 8, 9, 10, 11]  # ids 0 and 3 from the list, the first 8 others


def test_reader_on_handmade_files_and_the_split(tmp_path: Path) -> None:
    made = {c: handmade_case(tmp_path, c, (5 + c % 3, 6, 7)) for c in (0, 1, 2, 3, 4, 12, 13)}
    pairs = list_cases(tmp_path)
    assert [p.case for p in pairs] == [0, 1, 2, 3, 4, 12, 13]
    assert [p.case for p in split_cases(pairs, "validation", tmp_path)] == [0, 3, 12]
    assert [p.case for p in split_cases(pairs, "train", tmp_path)] == [1, 2, 4, 13]
    for p in pairs:
        x, y = read_case(p)
        np.testing.assert_array_equal(x, made[p.case][0])
        np.testing.assert_array_equal(y, made[p.case][1])
    ev = KiTSData((4, 4, 4), 0.4, True, seed=1).open(tmp_path, "validation")
    assert len(ev) == 3 and ev[2][0].shape == (1, 5, 6, 7)  # case 12: whole


def test_writer_round_trip_is_plain_npy(tmp_path: Path) -> None:
    x, y = make_case(3, 7, ShapeRange((20, 21, 22), (24, 24, 24)))
    write_case(tmp_path, 7, x, y)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["case_00007_x.npy", "case_00007_y.npy"]
    np.testing.assert_array_equal(np.load(tmp_path / "case_00007_x.npy"), x)  # what any numpy user reads
    back = np.load(tmp_path / "case_00007_y.npy")
    assert back.dtype == np.uint8 and back.shape == x.shape and set(np.unique(back)) == {0, 1, 2}


def test_synthetic_cases_vary_in_size_and_are_deterministic() -> None:
    shapes = ShapeRange((32, 32, 32), (48, 48, 48))
    a, b = make_case(1, 5, shapes), make_case(1, 5, shapes)
    np.testing.assert_array_equal(a[0], b[0])
    sizes = {make_case(1, c, shapes)[0].shape for c in range(6)}
    assert len(sizes) > 3 and all(32 <= s <= 48 for shp in sizes for s in shp[1:])
    assert not np.array_equal(make_case(2, 5, shapes)[0][..., :32, :32, :32], a[0][..., :32, :32, :32])
    x, y = a
    kidney, tumour = x[y == 1].mean(), x[y == 2].mean()
    assert kidney > tumour + 0.5 and tumour > x[y == 0].mean()  # the signal: bright kidney, darker tumour
    assert 0.005 < (y == 1).mean() < 0.05 and (y == 2).sum() > 10


def _corrupt(tmp_path: Path, how: str) -> str:
    handmade_case(tmp_path, 1, (6, 6, 6))
    handmade_case(tmp_path, 0, (6, 6, 6))
    x, y = tmp_path / "case_00000_x.npy", tmp_path / "case_00000_y.npy"
    if how == "missing_label":
        y.unlink()
        return "case_00000_y.npy: missing"
    if how == "truncated":
        x.write_bytes(x.read_bytes()[:-10])
        return r"case_00000_x.npy: 982 bytes but its header .* needs 992 \(truncated\)"
    if how == "dtype":
        np.save(x, np.zeros((1, 6, 6, 6), np.float64))
        return "case_00000_x.npy: expected float32"
    if how == "label_dtype":
        np.save(y, np.zeros((1, 6, 6, 6), np.int64))
        return "case_00000_y.npy: expected uint8"
    if how == "no_channel":
        np.save(x, np.zeros((6, 6, 6), np.float32))
        return r"case_00000_x.npy: expected float32 \(1, D, H, W\)"
    if how == "shape_mismatch":
        np.save(y, np.zeros((1, 6, 6, 5), np.uint8))
        return "case_00000_y.npy: shape .* differs from its image"
    if how == "label_values":
        np.save(y, np.full((1, 6, 6, 6), 3, np.uint8))
        return "case_00000_y.npy: label value 3"
    if how == "nan":
        np.save(x, np.full((1, 6, 6, 6), np.nan, np.float32))
        return "case_00000_x.npy: non-finite"
    if how == "garbage":
        x.write_bytes(b"not a numpy file at all")
        return "case_00000_x.npy: not a readable .npy"
    raise AssertionError(how)


@pytest.mark.parametrize("how", ["missing_label", "truncated", "dtype", "label_dtype", "no_channel",
                                 "shape_mismatch", "label_values", "nan", "garbage"])
def test_bad_files_are_named(tmp_path: Path, how: str) -> None:
    pattern = _corrupt(tmp_path, how)
    with pytest.raises(DataError, match=pattern):
        pairs = list_cases(tmp_path)
        ev = KiTSData((4, 4, 4), 0.4, True, seed=1).open(tmp_path, "validation")
        assert [p.case for p in pairs] == [0, 1]
        ev[0]


def test_training_patch_checks_values_and_size(tmp_path: Path) -> None:
    handmade_case(tmp_path, 1, (6, 6, 6))
    handmade_case(tmp_path, 0, (6, 6, 6))
    np.save(tmp_path / "case_00001_y.npy", np.full((1, 6, 6, 6), 7, np.uint8))
    train = KiTSData((4, 4, 4), 0.0, False, seed=1).open(tmp_path, "train")
    with pytest.raises(DataError, match="case_00001_y.npy: label value 7"):
        train[0]
    big = KiTSData((8, 4, 4), 0.0, False, seed=1).open(tmp_path, "train")
    with pytest.raises(DataError, match=r"case_00001_x.npy: volume \(6, 6, 6\) is smaller than the training patch"):
        big[0]
    with pytest.raises(DataError, match="no validation cases"):
        split_cases(list_cases(tmp_path)[1:], "validation", tmp_path)


def test_validation_case_smaller_than_the_window_is_refused_by_name(tmp_path: Path) -> None:
    """A validation case thinner than the sliding window (data.roi) is refused naming its file and the
    minimum, as a training case smaller than the patch is: the reference pads every case to the window,
    and its border trim would cut an axis under half a stride to nothing (scored as a perfect Dice)."""
    from hpcbench.workloads.mlperf_training.unet3d.workload import UNet3DWorkload

    handmade_case(tmp_path, 0, (38, 40, 6))  # validation: 6 voxels along W, under half the 16-voxel stride
    handmade_case(tmp_path, 3, (32, 32, 32))  # validation, as big as the window: read whole
    handmade_case(tmp_path, 1, (32, 32, 32))
    ev = KiTSData((32, 32, 32), 0.4, True, seed=1, roi=(32, 32, 32)).open(tmp_path, "validation")
    with pytest.raises(DataError, match=r"case_00000_x.npy: volume \(38, 40, 6\) is smaller than the validation "
                                        r"window \(32, 32, 32\) \(data.roi\)"):
        ev[0]
    assert ev[1][0].shape == (1, 32, 32, 32)
    # the workload's dataset checks against its data.roi
    wl = UNet3DWorkload(UNet3DWorkload.load_config("mini"))
    with pytest.raises(DataError, match=r"case_00000_x.npy: .*smaller than the validation window \(32, 32, 32\)"):
        wl.dataset().open(tmp_path, "validation")[0]

