"""The tiny workload's data: one float32 ``.npy`` vector per sample (12 features, then 4 targets) under
``train/`` and ``validation/``; a validating reader, the spec, and the synthetic writer of the same files."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from hpcbench.common.data.datagen import FileJob
from hpcbench.common.data.layout import FileLayout
from hpcbench.common.data.spec import DatasetSpec, FileSamples, SampleSource
from hpcbench.common.errors import DataError

FEATURES, TARGETS = 12, 4
LAYOUT = FileLayout("tiny", ("*.npy",), ("train", "validation"), describe=".npy sample files")


def read(path: Path) -> np.ndarray:
    """One sample, checked: a float32 vector of FEATURES + TARGETS finite values."""
    try:
        v = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: not a readable .npy file ({exc})") from None
    if v.dtype != np.float32 or v.shape != (FEATURES + TARGETS,):
        raise DataError(f"{path}: expected float32 of shape ({FEATURES + TARGETS},), got {v.dtype} {v.shape}")
    if not np.isfinite(v).all():
        raise DataError(f"{path}: holds NaN or infinite values")
    return v


def sample(seed: int, split: str, index: int) -> np.ndarray:
    """Features x ~ N(0, 1) and targets tanh(x A) / 2 + noise, A fixed by the seed (both splits)."""
    a = np.random.default_rng([seed, 0]).standard_normal((FEATURES, TARGETS)) / FEATURES**0.5
    g = np.random.default_rng([seed, 1 if split == "train" else 2, index])
    x = g.standard_normal(FEATURES)
    y = np.tanh(x @ a) / 2 + 0.02 * g.standard_normal(TARGETS)
    return np.concatenate([x, y]).astype(np.float32)


def write(job: FileJob, tmp: Path, seed: int) -> None:
    with open(tmp, "wb") as fh:
        np.save(fh, sample(seed, job.split, job.indices[0]), allow_pickle=False)


def verify(tmp: Path, job: FileJob) -> None:
    read(tmp)


class TinyData(DatasetSpec):
    layout = LAYOUT
    partition = "contiguous"

    def open(self, root: Path, split: str) -> SampleSource:
        return FileSamples(self.layout.list_split(root, split), read)

    def collate(self, samples: list[np.ndarray]) -> Any:  # noqa: ANN401
        import torch

        batch = torch.from_numpy(np.stack(samples))
        return {"x": batch[:, :FEATURES], "y": batch[:, FEATURES:]}

    def transform(self, batch: Any) -> Any:  # noqa: ANN401
        return batch
