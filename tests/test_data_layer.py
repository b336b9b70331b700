"""The shared data layer: sampler partitions, prefetch, loader, datagen driver, and the rule that
workload packages own no sampler, thread/process pool or collective of their own."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from hpcbench.common.data.datagen import FileJob, generate
from hpcbench.common.data.loader import Loader
from hpcbench.common.data.prefetch import prefetch_map
from hpcbench.common.data.sampler import EpochSampler, lpt_partition
from hpcbench.common.data.spec import DatasetSpec, FileSamples
from hpcbench.common.data.layout import GENERIC
from hpcbench.common.errors import ConfigError, DataError
from tests import data_layer_jobs as jobs

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("contiguous", "strided", "balanced")


def _sampler(n: int, b: int, r: int, size: int, part: str, train: bool, epoch: int = 1) -> EpochSampler:
    costs = np.arange(n, dtype=np.float64) % 7 + 1
    s = EpochSampler(n, b, r, size, seed=3, partition=part, train=train, costs=costs)  # type: ignore[arg-type]
    s.set_epoch(epoch)
    return s


@pytest.mark.parametrize("part", PARTS)
@pytest.mark.parametrize("n,b,size", [(37, 2, 3), (40, 4, 4), (9, 1, 2), (64, 3, 1)])
def test_eval_covers_every_sample_once_and_train_is_disjoint_equal_and_reseeded(part: str, n: int, b: int, size: int) -> None:
    evals = np.concatenate([_sampler(n, b, r, size, part, train=False).indices() for r in range(size)])
    assert sorted(evals.tolist()) == list(range(n))
    train = [_sampler(n, b, r, size, part, train=True) for r in range(size)]
    counts = {len(s) for s in train}
    assert len(counts) == 1 and counts.pop() == len(train[0].batches())  # every rank: the same steps
    flat = np.concatenate([s.indices() for s in train])
    assert len(set(flat.tolist())) == len(flat)  # disjoint
    assert np.array_equal(train[0].indices(), _sampler(n, b, 0, size, part, train=True).indices())  # seeded
    other = _sampler(n, b, 0, size, part, train=True, epoch=2).indices()
    assert not np.array_equal(train[0].indices(), other)  # reshuffled per epoch


def test_balanced_partition_evens_out_the_cost_of_each_global_batch() -> None:
    rng = np.random.default_rng(0)
    costs = rng.lognormal(4, 1, 512)
    per_rank = {p: np.zeros(8) for p in ("balanced", "strided")}
    for part in per_rank:
        for r in range(8):
            s = EpochSampler(512, 4, r, 8, seed=1, partition=part, costs=costs)  # type: ignore[arg-type]
            per_rank[part][r] = max(costs[b].sum() for b in s.batches()[:1])
    assert per_rank["balanced"].max() / per_rank["balanced"].mean() < per_rank["strided"].max() / per_rank["strided"].mean()
    assert sorted(i for part in lpt_partition([3, 1, 2, 2], 2) for i in part) == [0, 1, 2, 3]


def test_too_few_training_samples_is_a_config_error_naming_the_batch() -> None:
    with pytest.raises(ConfigError, match=r"10 training samples cannot fill one batch per rank: local batch 4 x "
                                          r"3 rank\(s\) .* = 12 samples .*train.global_batch_size.* at most 3"):
        EpochSampler(10, 4, 0, 3, seed=0)
    with pytest.raises(ConfigError, match="unknown partition"):
        EpochSampler(10, 1, 0, 1, seed=0, partition="random")  # type: ignore[arg-type]


@pytest.mark.parametrize("threads", [0, 1, 3])
def test_prefetch_keeps_order_and_reraises_in_order(threads: int) -> None:
    assert list(prefetch_map(lambda x: x * x, list(range(20)), threads, 2)) == [x * x for x in range(20)]

    def boom(x: int) -> int:
        if x == 5:
            raise DataError("sample 5 is corrupt")
        return x

    got: list[int] = []
    with pytest.raises(DataError, match="sample 5"):
        for v in prefetch_map(boom, list(range(10)), threads, 2):
            got.append(v)
    assert got == [0, 1, 2, 3, 4]


class _Squares(DatasetSpec):
    layout = GENERIC

    def open(self, root: Path, split: str) -> FileSamples:
        files = sorted(Path(root, split).iterdir())
        return FileSamples(files, lambda p: float(p.read_text()))

    def collate(self, samples):  # noqa: ANN001, ANN201
        return torch.tensor(samples)

    def transform(self, batch):  # noqa: ANN001, ANN201
        return batch * batch


def test_loader_reads_validates_collates_and_transforms_in_sampler_order(tmp_path: Path) -> None:
    (tmp_path / "train").mkdir()
    for i in range(10):
        (tmp_path / "train" / f"{i:02d}").write_text(str(i))
    spec = _Squares()
    source = spec.open(tmp_path, "train")
    sampler = EpochSampler(10, 3, 0, 1, seed=0, train=False)
    batches = list(Loader(spec, source, sampler, torch.device("cpu"), threads=2, prefetch=1))
    assert len(batches) == len(sampler) == 4
    assert torch.cat(batches).tolist() == [float(i * i) for i in range(10)]
    (tmp_path / "train" / "07").write_text("not a number")
    with pytest.raises(ValueError):
        list(Loader(spec, spec.open(tmp_path, "train"), sampler, torch.device("cpu"), threads=2))


@pytest.mark.parametrize("workers", [1, 2])
def test_datagen_driver_writes_verifies_renames_and_returns_infos_in_job_order(tmp_path: Path, workers: int) -> None:
    js = [FileJob("train", f"f{k}.txt", (k, k + 10)) for k in range(5)] + [FileJob("validation", "v.txt", (7,))]
    infos = generate(tmp_path, js, jobs.write_indices, jobs.verify_nonempty, workers=workers, progress=False)
    assert infos == [sum(j.indices) for j in js]
    assert (tmp_path / "train" / "f3.txt").read_text() == "3,13"
    assert not [p for p in tmp_path.rglob(".*")]  # no temporaries left


def test_datagen_driver_never_publishes_a_file_that_fails_verification(tmp_path: Path) -> None:
    js = [FileJob("train", f"f{k}.txt", (k,)) for k in range(4)]
    with pytest.raises(DataError, match="empty"):
        generate(tmp_path, js, jobs.write_empty_for_odd, jobs.verify_nonempty, workers=1, progress=False)
    assert sorted(p.name for p in (tmp_path / "train").iterdir()) == ["f0.txt"]  # f1 failed: not renamed


WORKLOADS = ("cosmoflow", "deepcam", "opencatalyst")
FORBIDDEN = re.compile(r"ThreadPoolExecutor|ProcessPoolExecutor|multiprocessing|DataLoader|torch\.distributed|"
                       r"all_reduce|new_subgroups|SyncBatchNorm|feed_ndarray|class \w*Sampler|class \w*Loader")


def test_workload_packages_own_no_sampler_loader_pool_or_collective() -> None:
    found = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}" for pkg in WORKLOADS for p in (ROOT / pkg).rglob("*.py")
             for n, line in enumerate(p.read_text().splitlines(), 1) if FORBIDDEN.search(line)]
    assert not found, "\n".join(found)
