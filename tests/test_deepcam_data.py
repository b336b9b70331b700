"""DeepCAM data: synthetic writer -> real layout -> reader, validation errors, sharding, DALI."""
from __future__ import annotations

import re
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from hpcbench.common.data.sampler import EpochSampler
from hpcbench.common.errors import DataError
from hpcbench.common.workload import DataShard, EpochLoader
from hpcbench.workloads.deepcam.data import Normalizer, list_samples, read_sample, sample_shape
from hpcbench.workloads.deepcam.datagen import write_dataset
from hpcbench.workloads.deepcam.synth import CHANNELS
from hpcbench.workloads.deepcam.workload import DeepCAMWorkload

from conftest import run_cli

H, W = 32, 48
ALL = list(range(16))


def workload_loader(root: Path, batch: int, train: bool, channels_last: bool, seed: int = 0, threads: int = 2,
           dali: bool = False) -> EpochLoader:
    """The workload's train (shuffled, uneven tail dropped) or eval loader on one CPU rank."""
    cfg = DeepCAMWorkload.load_config("mini", [f"data.root={root}", f"train.channels_last={str(channels_last).lower()}",
                                               f"data.threads={threads}", f"train.loader={'dali' if dali else 'torch'}"])
    shard = DataShard(rank=0, size=1, seed=seed, local_batch_size=batch, device=torch.device("cpu"))
    wl = DeepCAMWorkload(cfg)
    return wl.train_loader(shard) if train else wl.eval_loader(shard)


def strided(n: int, rank: int, size: int, seed: int, epoch: int, train: bool) -> np.ndarray:
    """This rank's samples of an epoch under DeepCAM's partition (batches of one)."""
    sampler = EpochSampler(n, 1, rank, size, seed, "strided", train=train)
    sampler.set_epoch(epoch)
    return sampler.indices()


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("deepcam")
    write_dataset(root, samples=10, eval_samples=5, height=H, width=W, seed=7, workers=1)
    return root


def test_layout_shapes_and_stats(dataset: Path) -> None:
    train, val = list_samples(dataset, "train"), list_samples(dataset, "validation")
    assert len(train) == 10 and len(val) == 5
    with h5py.File(train[0], "r") as f:
        assert f["climate/data"].shape == (H, W, 16) and f["climate/data"].dtype == np.float32
        assert f["climate/labels_0"].shape == (H, W)
    stack = np.stack([read_sample(p, ALL)[0] for p in train]).reshape(-1, 16).astype(np.float64)
    with h5py.File(dataset / "stats.h5", "r") as f:
        s = {k: f[f"climate/{k}"][...] for k in ("count", "mean", "sqmean", "minval", "maxval")}
    assert np.allclose(s["count"], stack.shape[0])
    assert np.allclose(s["mean"], stack.mean(0), rtol=1e-6)
    assert np.allclose(s["sqmean"], (stack**2).mean(0), rtol=1e-6)
    assert np.allclose(s["minval"], stack.min(0)) and np.allclose(s["maxval"], stack.max(0))


def test_normalization_and_nchw(dataset: Path) -> None:
    files = list_samples(dataset, "validation")
    loader = workload_loader(dataset, 2, train=False, channels_last=False)
    x, y = next(iter(loader))
    raw, labels = read_sample(files[0], ALL)
    with h5py.File(dataset / "stats.h5", "r") as f:
        lo, hi = f["climate/minval"][...], f["climate/maxval"][...]
    expect = ((raw - lo) / (hi - lo)).transpose(2, 0, 1)
    assert x.shape == (2, 16, H, W) and x.is_contiguous() and y.dtype == torch.int64
    assert np.allclose(x[0].numpy(), expect, atol=1e-5)
    assert torch.equal(y[0], torch.from_numpy(labels.astype(np.int64)))
    assert sum(len(b[0]) for b in loader) == 5  # eval keeps the last partial batch


def test_channel_subset(dataset: Path) -> None:
    files = list_samples(dataset, "train")
    sub = [0, 7, 10]
    data, _ = read_sample(files[0], sub)
    full, _ = read_sample(files[0], ALL)
    assert np.array_equal(data, full[..., sub])


def test_planted_features_and_background_fraction(tmp_path: Path) -> None:
    write_dataset(tmp_path, samples=24, eval_samples=1, height=96, width=144, seed=3, workers=1)
    labels = np.stack([read_sample(p, ALL)[1] for p in list_samples(tmp_path, "train")])
    freq = np.bincount(labels.ravel(), minlength=3) / labels.size
    assert 0.95 < freq[0] < 0.995 and freq[1] > 0 and freq[2] > 0
    # cyclones sit in pressure lows, rivers are moist: check the physics the labels mark
    data = np.stack([read_sample(p, ALL)[0] for p in list_samples(tmp_path, "train")])
    psl, tmq = data[..., CHANNELS.index("PSL")], data[..., CHANNELS.index("TMQ")]
    assert psl[labels == 1].mean() < psl[labels == 0].mean() - 1000
    assert tmq[labels == 2].mean() > tmq[labels == 0].mean() + 10


def test_missing_dataset_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="does not exist"):
        list_samples(tmp_path / "nowhere", "train")
    (tmp_path / "train").mkdir()
    with pytest.raises(DataError, match="no data-"):
        list_samples(tmp_path, "train")
    with pytest.raises(DataError, match="stats.h5"):
        Normalizer.from_stats(tmp_path / "stats.h5", ALL)


def _write(path: Path, data: np.ndarray, labels: np.ndarray) -> Path:
    with h5py.File(path, "w") as f:
        f["climate/data"] = data
        f["climate/labels_0"] = labels
    return path


def _scramble_metadata(path: Path) -> None:
    """200 seeded random bytes over the file's first group's metadata (offset 700): h5py then raises a
    RuntimeError ("bad heap free list") from a membership test, not an OSError."""
    import random

    raw = bytearray(path.read_bytes())
    rng = random.Random(0)
    raw[700:900] = bytes(rng.randrange(256) for _ in range(200))
    path.write_bytes(bytes(raw))


def test_corrupt_hdf5_metadata_names_the_file(tmp_path: Path) -> None:
    p = _write(tmp_path / "data-0.h5", np.zeros((H, W, 16), np.float32), np.zeros((H, W), np.uint8))
    _scramble_metadata(p)
    with pytest.raises(DataError, match=r"cannot read DeepCAM sample '.*data-0\.h5': .*bad heap free list"):
        read_sample(p, ALL, (H, W))  # was: a bare RuntimeError and a traceback
    with pytest.raises(DataError, match=r"cannot read DeepCAM sample '.*data-0\.h5'"):
        sample_shape(p)


def test_wrong_shape_names_the_file(tmp_path: Path) -> None:
    good = np.zeros((H, W, 16), np.float32)
    p = _write(tmp_path / "data-0.h5", np.zeros((H, W + 16, 16), np.float32), np.zeros((H, W + 16)))
    with pytest.raises(DataError, match=r"data-0\.h5.*expected 32x48"):
        read_sample(p, ALL, (H, W))
    p = _write(tmp_path / "data-1.h5", np.zeros((H, W, 4), np.float32), np.zeros((H, W)))
    with pytest.raises(DataError, match=r"data-1\.h5.*\(H, W, C\)"):
        read_sample(p, ALL)
    p = _write(tmp_path / "data-2.h5", good, np.zeros((H, W - 1)))
    with pytest.raises(DataError, match=r"data-2\.h5.*labels_0 has shape"):
        read_sample(p, ALL)
    (tmp_path / "data-3.h5").write_bytes(b"not hdf5")
    with pytest.raises(DataError, match=r"data-3\.h5"):
        read_sample(tmp_path / "data-3.h5", ALL)


def test_bad_label_value_names_the_file(tmp_path: Path) -> None:
    labels = np.zeros((H, W), np.float32)
    labels[3, 4] = 3
    p = _write(tmp_path / "data-9.h5", np.zeros((H, W, 16), np.float32), labels)
    with pytest.raises(DataError, match=r"data-9\.h5.*value 3"):
        read_sample(p, ALL)
    labels[3, 4] = 1.5
    p = _write(tmp_path / "data-8.h5", np.zeros((H, W, 16), np.float32), labels)
    with pytest.raises(DataError, match=r"data-8\.h5.*1\.5"):
        read_sample(p, ALL)


def test_sharding_is_disjoint_seeded_and_reshuffled() -> None:
    n, size = 23, 4
    train = [strided(n, r, size, seed=5, epoch=1, train=True) for r in range(size)]
    assert {len(t) for t in train} == {n // size}
    assert len(set(np.concatenate(train))) == size * (n // size)
    evals = np.concatenate([strided(n, r, size, 5, 1, False) for r in range(size)])
    assert sorted(evals) == list(range(n))  # every validation sample exactly once
    again = strided(n, 0, size, 5, 1, True)
    assert np.array_equal(again, train[0])
    assert not np.array_equal(strided(n, 0, size, 5, 2, True), train[0])


def test_channels_last_batch_is_a_view_of_the_hwc_data(dataset: Path) -> None:
    a = workload_loader(dataset, 3, train=True, channels_last=True, seed=1, threads=2)
    b = workload_loader(dataset, 3, train=True, channels_last=False, seed=1, threads=1)
    assert len(a) == 3
    for (xa, ya), (xb, yb) in zip(a, b):
        assert xa.is_contiguous(memory_format=torch.channels_last)
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


def test_dali_pipeline_matches_threaded_loader(dataset: Path) -> None:
    pytest.importorskip("nvidia.dali")

    for cl in (True, False):
        plain = workload_loader(dataset, 2, train=False, channels_last=cl)
        dali = workload_loader(dataset, 2, train=False, channels_last=cl, dali=True)
        for epoch in (1, 2):
            plain.set_epoch(epoch)
            dali.set_epoch(epoch)
            got, ref = list(dali), list(plain)
            assert len(got) == len(ref) == 3
            for (xd, yd), (xp, yp) in zip(got, ref):
                assert torch.allclose(xd, xp, atol=1e-6) and torch.equal(yd, yp)


def test_datagen_cli_writes_dataset_and_refuses_to_overwrite(tmp_path: Path) -> None:
    out = tmp_path / "cam"
    args = ["datagen", "deepcam", "--out", str(out), "--samples", "3", "--eval-samples", "2",
            "--height", "32", "--width", "48", "--workers", "1"]
    proc = run_cli(args)
    assert proc.returncode == 0, proc.stderr
    assert len(list_samples(out, "train")) == 3 and (out / "stats.h5").is_file()
    assert not list(out.rglob(".*.tmp"))
    again = run_cli(args)
    assert again.returncode != 0 and "already holds" in again.stderr and "Traceback" not in again.stderr
    with pytest.raises(DataError, match="multiples of 16"):
        write_dataset(tmp_path / "x", 1, 1, 30, 48, seed=0, workers=1)


def test_mini_target_is_well_above_all_background() -> None:
    from hpcbench.workloads.deepcam.metric import iou_per_sample
    from hpcbench.workloads.deepcam.synth import make_sample
    from hpcbench.workloads.deepcam.workload import DeepCAMWorkload

    labels = torch.from_numpy(np.stack([make_sample((11, 1, i), 96, 144)[1] for i in range(48)])).long()
    baseline = iou_per_sample(torch.zeros_like(labels), labels, 3).mean().item()
    target = DeepCAMWorkload.load_config("mini").train.target
    assert target >= 0.82 and target - baseline >= 0.25, (target, baseline)


def test_same_seed_writes_the_same_files(tmp_path: Path) -> None:
    for name in ("a", "b"):
        write_dataset(tmp_path / name, samples=2, eval_samples=1, height=H, width=W, seed=4, workers=1)
    rel = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*") if p.is_file())
    assert [str(p) for p in rel] == ["stats.h5", "train/data-000000.h5", "train/data-000001.h5",
                                     "validation/data-000000.h5"]
    assert all((tmp_path / "a" / p).read_bytes() == (tmp_path / "b" / p).read_bytes() for p in rel)


@pytest.mark.parametrize("dali", [False, True])
def test_corrupt_file_fails_with_its_name_under_either_loader(tmp_path: Path, dali: bool) -> None:
    if dali:
        pytest.importorskip("nvidia.dali")
    write_dataset(tmp_path, samples=2, eval_samples=3, height=H, width=W, seed=2, workers=1)
    (tmp_path / "validation" / "data-000001.h5").write_bytes(b"not hdf5")
    loader = workload_loader(tmp_path, 1, train=False, channels_last=True, dali=dali)
    with pytest.raises(DataError, match=r"validation/data-000001\.h5"):
        list(loader)


def test_missing_stats_file_is_named_when_opening_a_split(tmp_path: Path) -> None:
    write_dataset(tmp_path, samples=2, eval_samples=1, height=H, width=W, seed=2, workers=1)
    (tmp_path / "stats.h5").unlink()
    with pytest.raises(DataError, match="stats.h5"):
        workload_loader(tmp_path, 1, train=True, channels_last=True)


def _write_stats(root: Path, channels: int = 16) -> None:
    with h5py.File(root / "stats.h5", "w") as f:
        for key, value in (("count", 1.0), ("mean", 0.5), ("sqmean", 0.5), ("minval", 0.0), ("maxval", 1.0)):
            f[f"climate/{key}"] = np.full(channels, value, np.float64)


def _raw_dataset(root: Path, train: int, shape: tuple[int, int], data_dtype: object = np.float32) -> Path:
    """A dataset root written directly with h5py (train/ and validation/, stats.h5)."""
    for split, n in (("train", train), ("validation", 1)):
        (root / split).mkdir(parents=True)
        for i in range(n):
            data = np.zeros((*shape, 16), np.float32)
            with h5py.File(root / split / f"data-{i:06d}.h5", "w") as f:
                f["climate/data"] = data.astype(data_dtype) if data_dtype is not np.float32 else data
                f["climate/labels_0"] = np.zeros(shape, np.uint8)
    _write_stats(root)
    return root


def test_grid_not_a_multiple_of_the_output_stride_is_named_before_training(tmp_path: Path) -> None:
    from hpcbench.workloads.deepcam.model import OUTPUT_STRIDE, DeepLabV3Plus, ModelConfig

    root = _raw_dataset(tmp_path, 2, (100, 150))
    with pytest.raises(DataError, match=r"train/data-000000\.h5': climate/data is a 100x150 grid; .*output stride 16"
                                        r".*Crop the data to 96x144 or pad it to 112x160"):
        workload_loader(root, 1, train=True, channels_last=False)
    # the suggested grids run through the model; the refused one would have failed inside it
    model = DeepLabV3Plus(ModelConfig(width=0.0625, middle_blocks=1)).eval()
    with torch.no_grad():
        assert model(torch.zeros(1, 16, 96, 144)).shape == (1, 3, 96, 144)
        with pytest.raises(RuntimeError, match="Sizes of tensors must match"):
            model(torch.zeros(1, 16, 100, 150))
    assert OUTPUT_STRIDE == 16


@pytest.mark.parametrize("dataset_name", ["climate/data", "climate/labels_0"])
def test_string_typed_dataset_is_named(tmp_path: Path, dataset_name: str) -> None:
    path = tmp_path / "data-000000.h5"
    with h5py.File(path, "w") as f:
        f["climate/data"] = np.zeros((H, W, 16), np.float32)
        f["climate/labels_0"] = np.zeros((H, W), np.uint8)
        del f[dataset_name]
        shape = (H, W, 16) if dataset_name == "climate/data" else (H, W)
        f.create_dataset(dataset_name, data=np.full(shape, "0.5", dtype=object), dtype=h5py.string_dtype())
    expected = "float32" if dataset_name == "climate/data" else "uint8 class indices"
    with pytest.raises(DataError, match=rf"data-000000\.h5': {dataset_name} has dtype object \(strings\); "
                                        rf"expected {expected}"):
        read_sample(path, ALL, (H, W))
    if dataset_name == "climate/data":  # found already when the split is opened (its first file)
        from hpcbench.workloads.deepcam.data import sample_shape

        with pytest.raises(DataError, match=r"climate/data has dtype object \(strings\)"):
            sample_shape(path, 16)
    # fixed-length byte strings too
    with h5py.File(path, "a") as f:
        del f[dataset_name]
        f[dataset_name] = np.full(shape, b"1", dtype="S1")
    with pytest.raises(DataError, match=rf"{dataset_name} has dtype \|S1 \(strings\)"):
        read_sample(path, ALL, (H, W))


def test_fewer_training_samples_than_the_global_batch_is_named(tmp_path: Path) -> None:
    root = _raw_dataset(tmp_path / "data", 3, (H, W))
    proc = run_cli(["train", "deepcam", "--config", "mini", "--data", str(root), "--results", str(tmp_path / "r"),
                    "--device", "cpu", "--no-progress", "--set", "train.global_batch_size=4"])
    assert proc.returncode == 4, proc.stderr
    found = re.search(r"3 training samples in \S+/train cannot fill one batch per rank: local batch 4 x 1 "
                      r"rank\(s\) reading them = 4 samples per step .*'train.global_batch_size'.* at most 3", proc.stderr)
    assert found, proc.stderr
    assert "different or zero batches" not in proc.stderr


def _no_traceback(proc) -> None:  # type: ignore[no-untyped-def]
    assert proc.returncode == 4 and "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_non_finite_statistics_are_refused_when_a_split_opens(tmp_path: Path, value: float) -> None:
    root = _raw_dataset(tmp_path / "data", 2, (H, W))
    with h5py.File(root / "stats.h5", "a") as f:
        maxval = f["climate/maxval"][...]
        maxval[3] = value  # NaN passes the maxval > minval check; it would make channel 3 NaN
        f["climate/maxval"][...] = maxval
    with pytest.raises(DataError, match=rf"stats\.h5': climate/maxval is {value} for channel 3; .*finite"):
        workload_loader(root, 1, train=True, channels_last=True)
    proc = run_cli(["train", "deepcam", "--config", "mini", "--data", str(root), "--results", str(tmp_path / "r"),
                    "--device", "cpu", "--no-progress", "--set", "train.global_batch_size=1"])
    _no_traceback(proc)
    assert re.search(r"stats\.h5': climate/maxval is \S+ for channel 3", proc.stderr), proc.stderr


def test_nan_channel_in_one_training_file_is_named_at_read_time(tmp_path: Path) -> None:
    write_dataset(tmp_path, samples=4, eval_samples=1, height=H, width=W, seed=2, workers=1)
    bad = tmp_path / "train" / "data-000002.h5"
    with h5py.File(bad, "a") as f:
        data = f["climate/data"][...]
        data[5, 7, 11] = np.nan
        f["climate/data"][...] = data
    with pytest.raises(DataError, match=r"train/data-000002\.h5': climate/data channel 11 holds nan at 1 pixel"):
        read_sample(bad, ALL, (H, W))
    with pytest.raises(DataError, match=r"channel 11 holds nan"):  # the channel's number in the file
        read_sample(bad, [0, 11], (H, W))
    read_sample(bad, [0, 1], (H, W))  # channels the run does not read do not matter
    with h5py.File(bad, "a") as f:  # -inf too; huge finite values (their squares overflow float32) are fine
        data[5, 7, 11] = -np.inf
        f["climate/data"][...] = data
    with pytest.raises(DataError, match=r"channel 11 holds -inf at 1 pixel"):
        read_sample(bad, ALL, (H, W))
    _write(tmp_path / "huge.h5", np.full((H, W, 16), 3e38, np.float32), np.zeros((H, W), np.uint8))
    assert read_sample(tmp_path / "huge.h5", ALL, (H, W))[0].max() == np.float32(3e38)
    with pytest.raises(DataError, match=r"train/data-000002\.h5': climate/data channel 11"):
        list(workload_loader(tmp_path, 2, train=True, channels_last=True))  # the batched reader (read_into)


def test_nan_channel_stops_training_with_a_named_error(tmp_path: Path) -> None:
    root = _raw_dataset(tmp_path / "data", 2, (H, W))
    with h5py.File(root / "train" / "data-000001.h5", "a") as f:
        data = f["climate/data"][...]
        data[..., 4] = np.nan
        f["climate/data"][...] = data
    proc = run_cli(["train", "deepcam", "--config", "mini", "--data", str(root), "--results", str(tmp_path / "r"),
                    "--device", "cpu", "--no-progress", "--set", "train.global_batch_size=2"])
    _no_traceback(proc)
    assert re.search(r"train/data-000001\.h5': climate/data channel 4 holds nan at 1536 pixel", proc.stderr), \
        proc.stderr


@pytest.mark.parametrize("dtype", [np.int16, np.float64])
def test_data_not_stored_as_float32_is_refused(tmp_path: Path, dtype: type) -> None:
    root = _raw_dataset(tmp_path / "data", 2, (H, W), data_dtype=dtype)
    name = np.dtype(dtype).name
    with pytest.raises(DataError, match=rf"train/data-000000\.h5': climate/data has dtype {name}; expected float32"):
        workload_loader(root, 1, train=True, channels_last=True)  # the split's first file, at open
    with pytest.raises(DataError, match=rf"validation/data-000000\.h5': climate/data has dtype {name}"):
        read_sample(root / "validation" / "data-000000.h5", ALL, (H, W))
    big_endian = tmp_path / "data-be.h5"
    _write(big_endian, np.ones((H, W, 16), ">f4"), np.zeros((H, W), np.uint8))
    assert read_sample(big_endian, ALL, (H, W))[0].dtype == np.float32  # float32 in either byte order
