"""The BERT dataset spec: ``train/`` and ``eval/`` folders of NVIDIA-style HDF5 shards, read by rows.

A split is all its shards (``*.hdf5``, and NVIDIA's ``part_NNNNN`` and ``*.hdf`` names) in name order (the
evaluation split: only the names holding "part" where there are any, ``LAYOUT.prefer``), opened once (:func:`~.format.open_shard`: keys,
dtypes and shapes checked; either layout) and seen as one run of rows. ``read_batch`` reads a whole
batch with one ``Shard.read(indices)`` per shard it touches (values checked there), not row by row,
then collates it (:func:`~.batch.collate`) into the model's :class:`~.batch.Batch`. A row is one
sample of the harness: one sequence (padded layout) or up to 3 (packed). Training reads the packed
shards ``datagen`` writes by default; evaluation reads the padded eval shards, and ``eval_samples``
keeps the first N rows (the reference's fixed 10,000-sample eval set). Light to import (``hpcbench
pack``/``stage`` load :data:`LAYOUT`): h5py and torch are imported when a split is opened.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from hpcbench.common.data.layout import FileLayout
from hpcbench.common.data.spec import DatasetSpec
from hpcbench.common.errors import DataError

if TYPE_CHECKING:  # pragma: no cover
    from .batch import Batch
    from .format import Rows, Shard

# describe without the patterns: list_split adds them ("no BERT HDF5 pretraining shards (*.hdf5, ...)"). The names
# NVIDIA's tools give their shards: *.hdf5 (the fixed-length shards, eval files), part_NNNNN with no suffix
# (create_packed_trainset.py's packed shards) and part_NNNNN_of_NNNNN.hdf (shuffle_samples.py, variable-length)
# The evaluation split: where some names hold "part", only those, as NVIDIA's run_pretraining.py picks its eval files
# (its hdf5/eval/ holds eval_all.hdf5, the whole evaluation data, beside the 10,000 samples of part_eval_10k.hdf5);
# else every shard (datagen's and convert's eval_NNNNN.hdf5). In the layout, so pack and stage take the same files.
LAYOUT = FileLayout("bert", ("*.hdf5", "*.hdf", "part_[0-9]*"), ("train", "eval"), describe="BERT HDF5 pretraining shards",
                    prefer={"eval": "*part*"})


class ShardSet:
    """The rows of a split's shards back to back (the first ``limit`` rows when ``limit`` > 0)."""

    def __init__(self, files: Sequence[Path], max_seq_len: int, max_pred: int, vocab_size: int, limit: int = 0,
                 exact: bool = False) -> None:
        from .facts import MAX_SEQ_PER_ROW
        from .format import open_shard

        self.shards: list[Shard] = []
        try:
            for f in files:
                self.shards.append(open_shard(f, max_seq_len=max_seq_len, max_pred=max_pred, vocab_size=vocab_size,
                                              max_per_row=MAX_SEQ_PER_ROW))
        except BaseException:
            self.close()
            raise
        self.starts = np.concatenate([[0], np.cumsum([len(s) for s in self.shards])]).astype(np.int64)
        total = int(self.starts[-1])
        if limit > total:
            raise DataError(f"{Path(files[0]).parent}: data.eval_samples = {limit} but the split holds {total} rows")
        if exact and limit and total != limit:  # a closed run: the reference's eval_10k, not the front of a bigger set
            raise DataError(f"{Path(files[0]).parent}: the split holds {total} rows; a closed run evaluates on the "
                            f"reference's {limit}-sequence evaluation set (eval_10k, drawn at a stride over the "
                            f"whole evaluation data), not on the first {limit} rows of a larger one")
        self.rows = limit or total
        self._sequences: int | None = None
        if self.rows == 0:
            raise DataError(f"{Path(files[0]).parent}: the shards hold no rows")

    def __len__(self) -> int:
        return self.rows

    @property
    def packed(self) -> bool:
        """Whether any shard is in the packed layout (rows of 1-3 sequences)."""
        return any(s.packed for s in self.shards)

    def sequences(self) -> int:
        """The sequences (the rules' samples) in the split's rows, counted once (:meth:`Shard.sequences`)."""
        if self._sequences is None:
            left, total = self.rows, 0
            for s in self.shards:
                if left <= 0:
                    break
                total += s.sequences(left)
                left -= len(s)
            self._sequences = total
        return self._sequences

    def __getitem__(self, i: int) -> "Rows":
        return self.read(np.array([i]))

    def read(self, indices: np.ndarray) -> "Rows":
        """Rows ``indices`` (global numbers, any order) with one read per shard touched."""
        from .format import Rows

        indices = np.asarray(indices, dtype=np.int64)
        if indices.size and (indices.min() < 0 or indices.max() >= self.rows):
            raise IndexError(f"row index out of range 0..{self.rows - 1}")
        shard_of = np.searchsorted(self.starts, indices, side="right") - 1
        parts: list[Rows] = []
        where: list[np.ndarray] = []
        for k in np.unique(shard_of):
            pick = np.flatnonzero(shard_of == k)
            parts.append(self.shards[int(k)].read(indices[pick] - self.starts[k]))
            where.append(pick)
        out = Rows()
        for part in parts:
            out.extend(part)
        order = np.argsort(np.concatenate(where), kind="stable") if where else np.zeros(0, np.int64)
        return out.select(order)

    def costs(self) -> np.ndarray:
        """Uniform: packed rows are ~95% full, and the eval rows are read in contiguous chunks."""
        return np.ones(self.rows)

    def close(self) -> None:
        for s in self.shards:
            s.close()


class BertData(DatasetSpec):
    layout = LAYOUT
    partition = "contiguous"
    train_split = "train"
    eval_split = "eval"

    def __init__(self, max_seq_len: int, max_pred: int, vocab_size: int, eval_samples: int = 0,
                 exact_eval: bool = False) -> None:
        self.max_seq_len, self.max_pred, self.vocab_size = max_seq_len, max_pred, vocab_size
        self.eval_samples, self.exact_eval = eval_samples, exact_eval  # exact: the split holds eval_samples rows

    def open(self, root: Path, split: str) -> ShardSet:
        files = self.layout.list_split(root, split)
        limit = self.eval_samples if split == self.eval_split else 0
        return ShardSet(files, self.max_seq_len, self.max_pred, self.vocab_size, limit,
                        exact=self.exact_eval and split == self.eval_split)

    def collate(self, samples: Sequence["Rows"]) -> "Batch":
        from .batch import collate
        from .format import Rows

        rows = Rows()
        for s in samples:
            rows.extend(s)
        return collate(rows, self.max_seq_len)

    def read_batch(self, source: Any, indices: Sequence[int], pin: bool = False) -> "Batch":
        """The whole batch in one ``ShardSet.read`` (one HDF5 read per shard it touches)."""
        from .batch import collate

        read = getattr(source, "read", None)
        if read is None:
            return super().read_batch(source, indices, pin)
        return collate(read(np.asarray(indices, dtype=np.int64)), self.max_seq_len)
