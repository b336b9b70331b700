"""The unet3d dataset spec: one folder of ``case_XXXXX_{x,y}.npy`` pairs, split by the reference's list.

``open(root, "train")`` gives :class:`TrainCases`, whose item ``i`` is a fresh random training patch
of case ``i`` (the reference's foreground-balanced crop, flips, brightness and noise, :mod:`.patches`) drawn from a stream seeded by
``(seed, rank, case, how many times this rank read it)``, so a run is reproducible without any
per-epoch state; ``open(root, "validation")`` gives :class:`EvalCases`, whose items are whole cases.
A batch is ``(image float32 (B, 1, D, H, W), label uint8 (B, 1, D, H, W))``; evaluation batches hold
one case (sizes differ). The splits are the files of one folder, as in the reference, so every node
needs the whole folder (the layout replicates it). Light to import (``hpcbench pack``/``stage`` load
:data:`LAYOUT`).
"""
from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from hpcbench.common.data.layout import FileLayout
from hpcbench.common.data.spec import DatasetSpec
from hpcbench.common.errors import ConfigError, DataError

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from .format import CasePair

CASE_FILES = ("case_*_x.npy", "case_*_y.npy")
LAYOUT = FileLayout("unet3d", (), None, replicate=CASE_FILES, describe="KiTS19 preprocessed case files")

Sample = tuple[np.ndarray, np.ndarray]
Batch = tuple["torch.Tensor", "torch.Tensor"]


def check_min_shape(shape: Sequence[int], least: Sequence[int], path: Path, what: str, key: str) -> None:
    """A case volume must be at least ``least`` voxels per axis (the training patch or the validation
    window); otherwise a :class:`DataError` naming the file, its size and the minimum."""
    if any(s < m for s, m in zip(shape, least)):
        raise DataError(f"{path}: volume {tuple(int(s) for s in shape)} is smaller than the {what} "
                        f"{tuple(least)} ({key}); every case must be at least that per axis (the reference "
                        f"pads every case to at least 128 per axis)")


class TrainCases:
    """Training cases; item ``i`` is a random (image, label) patch of case ``i`` (validated as read)."""

    def __init__(self, pairs: Sequence["CasePair"], patch: Sequence[int], oversampling: float, flips: bool,
                 seed: int, augment: bool = True) -> None:
        self.pairs, self.patch, self.oversampling, self.flips, self.seed = list(pairs), tuple(patch), oversampling, flips, seed
        self.augment = augment  # the reference's brightness and noise augmentations
        self.stream = 0  # the reading rank (set by the workload): ranks draw different patches
        self._reads: dict[int, int] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.pairs)

    # the read counts are this rank's data position: a resumed run draws the patches the uninterrupted one would
    def state_dict(self) -> dict[str, Any]:
        with self._lock:
            return {"stream": self.stream, "reads": dict(self._reads)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["stream"] != self.stream:
            raise ConfigError(f"the checkpoint's training patches were drawn by reader {state['stream']}, this rank "
                              f"reads as {self.stream}; resume with the same ranks")
        with self._lock:
            self._reads = {int(k): int(v) for k, v in state["reads"].items()}

    def rng(self, i: int) -> np.random.Generator:
        with self._lock:
            n = self._reads.get(i, 0)
            self._reads[i] = n + 1
        return np.random.default_rng([self.seed, self.stream, i, n])

    def __getitem__(self, i: int) -> Sample:
        """The reference's training sample: ``RandBalancedCrop``, flips, cast, brightness, noise (:mod:`.patches`)."""
        from .format import check_image, check_labels, open_pair
        from .patches import Draws, crop_corner, flip_axes, intensity

        pair = self.pairs[i]
        x, y = open_pair(pair)
        shape = x.shape[1:]
        check_min_shape(shape, self.patch, pair.image, "training patch", "data.patch")
        draws = Draws(self.rng(i))

        def whole_label() -> np.ndarray:
            whole = np.asarray(y[0])
            check_labels(whole, pair.label)
            return whole

        c = crop_corner(shape, self.patch, draws, self.oversampling, whole_label)
        box = (slice(None), *(slice(a, a + p) for a, p in zip(c, self.patch)))
        image, label = np.array(x[box]), np.array(y[box])
        check_image(image, pair.image)
        check_labels(label, pair.label)
        axes = flip_axes(draws, self.flips)
        if axes:
            image, label = np.flip(image, axes).copy(), np.flip(label, axes).copy()
        if self.augment:
            image = intensity(image, draws)
        return image, label

    def costs(self) -> np.ndarray:
        return np.ones(len(self.pairs))


class EvalCases:
    """Validation cases; item ``i`` is the whole case ``i`` (every check done). With ``roi`` (the
    sliding window, ``data.roi``) a case smaller than the window on any axis is refused by name: the
    reference's preprocessing pads every case to at least the 128^3 window, and its sliding-window
    trim would cut an axis under half a stride to nothing (an empty case scores a perfect Dice)."""

    def __init__(self, pairs: Sequence["CasePair"], roi: Sequence[int] | None = None) -> None:
        self.pairs = list(pairs)
        self.roi = None if roi is None else tuple(roi)

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, i: int) -> Sample:
        from .format import open_pair, read_case

        pair = self.pairs[i]
        if self.roi is not None:
            check_min_shape(open_pair(pair)[0].shape[1:], self.roi, pair.image, "validation window", "data.roi")
        return read_case(pair)

    def costs(self) -> np.ndarray:
        return np.ones(len(self.pairs))


class KiTSData(DatasetSpec):
    layout = LAYOUT
    partition = "contiguous"

    def __init__(self, patch: Sequence[int], oversampling: float, flips: bool, seed: int,
                 augment: bool = True, roi: Sequence[int] | None = None) -> None:
        self.patch, self.oversampling, self.flips, self.seed = tuple(patch), oversampling, flips, seed
        self.augment = augment
        self.roi = None if roi is None else tuple(roi)  # validation cases at least this (the workload's data.roi)

    def open(self, root: Path, split: str) -> TrainCases | EvalCases:
        from .format import list_cases, split_cases

        pairs = split_cases(list_cases(root), split, Path(root))
        if split == self.train_split:
            return TrainCases(pairs, self.patch, self.oversampling, self.flips, self.seed, self.augment)
        return EvalCases(pairs, self.roi)

    def collate(self, samples: Sequence[Sample]) -> Batch:
        import torch

        shapes = {s[0].shape for s in samples}
        if len(shapes) != 1:
            raise DataError(f"unet3d: cases of different sizes {sorted(shapes)} in one batch; evaluation batches "
                            f"hold one case each")
        return (torch.from_numpy(np.stack([s[0] for s in samples])),
                torch.from_numpy(np.stack([s[1] for s in samples])))
