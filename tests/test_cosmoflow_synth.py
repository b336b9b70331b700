"""The synthetic generator: real format, deterministic per seed, about one particle per voxel."""
from __future__ import annotations

import numpy as np

from hpcbench.common.data import tfrecord
from hpcbench.workloads.cosmoflow import data, synth
from tests.conftest import run_cli


def test_generate_is_deterministic_and_realistic(tmp_path) -> None:
    synth.generate(tmp_path / "a", 3, 1, 16, seed=5, workers=2, progress=False)
    synth.generate(tmp_path / "b", 3, 1, 16, seed=5, workers=1, progress=False)
    files = data.list_files(tmp_path / "a", "train")
    assert [f.name for f in files] == [f"univ_{i:07d}.tfrecord.gz" for i in range(3)]
    assert len(data.list_files(tmp_path / "a", "validation")) == 1
    for f in files:
        assert tfrecord.read_file_bytes(f) == tfrecord.read_file_bytes(tmp_path / "b" / "train" / f.name)
    samples = [data.read_sample(f, 16) for f in files]
    means = np.array([s.x.mean() for s in samples])
    assert np.all((means > 0.4) & (means < 2.5))  # ~1 particle per voxel
    assert all(np.all(np.abs(s.y) <= 1) for s in samples)
    assert len({tuple(s.y) for s in samples}) == 3


def test_parameters_drive_the_statistics() -> None:
    lo = synth.make_sample(0, "train", 0, 32)[0]
    # same noise, different parameters: nbar (y[2]) sets the mean count, sigma (y[0]) the spread
    rng_y = {"low": np.array([-1, 0, -1, 0], np.float32), "high": np.array([1, 0, 1, 0], np.float32)}
    stats = {}
    for k, y in rng_y.items():
        c = synth.Cosmology.from_params(y)
        delta = synth.gaussian_field(np.random.default_rng(1), 32, c.slope)
        dens = c.nbar * np.exp(c.sigma * delta - 0.5 * c.sigma ** 2)
        stats[k] = (dens.mean(), np.log(dens).std())
    assert stats["high"][0] > 2 * stats["low"][0]
    assert stats["high"][1] > 3 * stats["low"][1]
    assert lo.dtype == np.int16


def test_cli_datagen_plain(tmp_path) -> None:
    proc = run_cli(["datagen", "cosmoflow", "--out", str(tmp_path), "--samples", "2", "--val-samples", "1",
                    "--size", "8", "--plain", "--quiet", "--workers", "1"])
    assert proc.returncode == 0, proc.stderr
    files = data.list_files(tmp_path, "train")
    assert [f.name for f in files] == ["univ_0000000.tfrecord", "univ_0000001.tfrecord"]
    assert not tfrecord.is_gzip(files[0])
    assert data.read_sample(files[0], 8).x.shape == (8, 8, 8, 4)
