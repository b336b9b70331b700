"""The NVIDIA-style HDF5 BERT pretraining format (padded) and its packed variant: validating readers
and atomic writers.

**Padded** (what NVIDIA's TFRecord -> HDF5 converters write; one sample per row, N rows):

===================== ========== ======== ===============================================
key                   shape      dtype    meaning
===================== ========== ======== ===============================================
input_ids             (N, 512)   int32    token ids, zero-padded
input_mask            (N, 512)   int8     1 on the sample's tokens, then 0 (a prefix)
segment_ids           (N, 512)   int8     0 for sentence A (with [CLS] and its [SEP]), 1 for B
masked_lm_positions   (N, 76)    int32    positions of the predicted tokens, zero-padded
masked_lm_ids         (N, 76)    int32    their original ids, zero-padded
next_sentence_labels  (N,)       int8     1 when B is a random sentence, 0 when it follows A
===================== ========== ======== ===============================================

(``gzip`` compressed.) NVIDIA's later re-sharding tool writes the ids and positions as int16;
the reader takes int16/int32/int64 there and int8..int64 for the small ones. Position 0 is always
[CLS], which is never predicted, so a zero position marks an unused prediction slot.

**Packed** (NVIDIA's ``create_packed_trainset.py``, read by ``run_pretraining.py --packed_samples``):
every key is a variable-length (``h5py.vlen_dtype``) dataset of N rows, a row holding up to 3
sequences back to back without padding:

========================= ===== =========================================================
key                       dtype per row
========================= ===== =========================================================
input_ids                 int16 the tokens of all its sequences (at most 512 in all)
segment_ids               int8  their segment ids
masked_lm_positions       int16 predicted positions *within the row* (sequence k's offset added)
masked_lm_ids             int16 their original ids
packed_input_len          int16 the length of each sequence
packed_masked_lm_len      int16 how many predictions belong to each sequence
next_sentence_labels      int8  one label per sequence
========================= ===== =========================================================

**Variable-length** (NVIDIA's ``convert_fixed2variable.py`` and ``shuffle_samples.py``: the training shards
``part_XXXXX_of_YYYYY.hdf`` and ``eval_varlength/part_eval_10k.hdf5`` its READMEs train and evaluate on): the
padded layout's rows without their padding, one sequence per row: ``input_ids`` (int16), ``segment_ids`` (int8),
``masked_lm_positions`` and ``masked_lm_ids`` (int16) variable-length, ``next_sentence_labels`` (N,) int8; no
``input_mask`` (the row's length is the mask, as NVIDIA's ``run_pretraining.py`` builds it) and no
``packed_input_len``.

All three layouts read into one in-memory form, :class:`Rows` (per row: real tokens back to back and the
per-sequence lengths; a padded sample is a row with one sequence), which is what the model's
collate takes. Every error is a :class:`DataError` naming the file, the key and what was expected.
Opening a shard checks the row counts of its keys; the first read of any of its rows checks the range of
every token and masked-LM id of the whole shard (vectorised, :data:`ID_KEYS`), so a bad id fails the run
the first time its shard is touched (with global shuffling, in the first steps), not in the epoch that
first reads its row, and no rank reads shards it never touches (at open, every rank would read every id of
the dataset: minutes at full size); the other value checks run on the rows read.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import h5py
import numpy as np

from hpcbench.common.atomic import make_temp
from hpcbench.common.errors import HDF5_ERRORS, DataError

from .facts import MAX_PRED, MAX_SEQ_LEN, VOCAB_SIZE

PADDED_KEYS = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids",
               "next_sentence_labels")
PACKED_KEYS = ("input_ids", "segment_ids", "masked_lm_positions", "masked_lm_ids", "packed_input_len",
               "packed_masked_lm_len", "next_sentence_labels")
VARLEN_KEYS = ("input_ids", "segment_ids", "masked_lm_positions", "masked_lm_ids", "next_sentence_labels")
#: what the reference writes (padded: the TFRecord -> HDF5 converter; packed: create_packed_trainset.py)
PADDED_DTYPES = {"input_ids": np.int32, "input_mask": np.int8, "segment_ids": np.int8,
                 "masked_lm_positions": np.int32, "masked_lm_ids": np.int32, "next_sentence_labels": np.int8}
PACKED_DTYPES = {"input_ids": np.int16, "segment_ids": np.int8, "masked_lm_positions": np.int16,
                 "masked_lm_ids": np.int16, "packed_input_len": np.int16, "packed_masked_lm_len": np.int16,
                 "next_sentence_labels": np.int8}
_WIDE = (np.int16, np.int32, np.int64)  # ids and positions need 16 bits at least (vocab 30522, position 511)
_ANY_INT = (np.int8, np.int16, np.int32, np.int64)
#: the keys holding vocabulary ids, checked in [0, vocab_size) over the whole shard when it is opened;
#: the padded layout's zero padding is id 0 ([PAD]), inside that range
ID_KEYS = ("input_ids", "masked_lm_ids")
_CHUNK_ROWS = 8192  # rows per read of the open-time id check (bounds its memory on big shards)
_ACCEPTED = {"input_ids": _WIDE, "masked_lm_positions": _WIDE, "masked_lm_ids": _WIDE,
             "packed_input_len": _WIDE, "packed_masked_lm_len": _WIDE,
             "input_mask": _ANY_INT, "segment_ids": _ANY_INT, "next_sentence_labels": _ANY_INT}


@dataclass
class Rows:
    """Rows of sequences, no padding: per row its tokens back to back and per sequence its length.

    ``masked_lm_positions`` are positions within the row (sequence k's start already added), sorted.
    """

    input_ids: list[np.ndarray] = field(default_factory=list)
    segment_ids: list[np.ndarray] = field(default_factory=list)
    seq_lens: list[np.ndarray] = field(default_factory=list)
    masked_lm_positions: list[np.ndarray] = field(default_factory=list)
    masked_lm_ids: list[np.ndarray] = field(default_factory=list)
    masked_lens: list[np.ndarray] = field(default_factory=list)
    next_sentence_labels: list[np.ndarray] = field(default_factory=list)

    FIELDS = ("input_ids", "segment_ids", "seq_lens", "masked_lm_positions", "masked_lm_ids", "masked_lens",
              "next_sentence_labels")

    def __len__(self) -> int:
        return len(self.input_ids)

    def num_sequences(self) -> int:
        return int(sum(len(s) for s in self.seq_lens))

    def num_tokens(self) -> int:
        return int(sum(len(t) for t in self.input_ids))

    def select(self, index: Sequence[int] | np.ndarray) -> Rows:
        return Rows(*[[getattr(self, f)[int(i)] for i in index] for f in self.FIELDS])

    def extend(self, other: Rows) -> None:
        for f in self.FIELDS:
            getattr(self, f).extend(getattr(other, f))

    def equals(self, other: Rows) -> bool:
        return len(self) == len(other) and all(
            np.array_equal(a, b) for f in self.FIELDS for a, b in zip(getattr(self, f), getattr(other, f)))


def check_rows(rows: Rows, where: str, max_seq_len: int = MAX_SEQ_LEN, max_pred: int = MAX_PRED,
               vocab_size: int = VOCAB_SIZE, max_per_row: int | None = None,
               numbers: np.ndarray | None = None) -> None:
    """Value checks of rows (``where`` names the file, ``numbers`` the rows' numbers in it)."""
    for f in Rows.FIELDS:
        if len(getattr(rows, f)) != len(rows):
            raise DataError(f"{where}: '{f}' has {len(getattr(rows, f))} rows, expected {len(rows)}")
    for r in range(len(rows)):
        ids, seg, lens = rows.input_ids[r], rows.segment_ids[r], rows.seq_lens[r]
        pos, mids, mlens, nsp = (rows.masked_lm_positions[r], rows.masked_lm_ids[r], rows.masked_lens[r],
                                 rows.next_sentence_labels[r])
        row = f"{where}: row {r if numbers is None else int(numbers[r])}"
        if len(lens) == 0 or (lens <= 0).any():
            raise DataError(f"{row}: sequence lengths must be positive, found {lens.tolist()}")
        if max_per_row is not None and len(lens) > max_per_row:
            raise DataError(f"{row}: {len(lens)} sequences, at most {max_per_row} expected")
        if len(ids) != lens.sum() or len(ids) > max_seq_len:
            raise DataError(f"{row}: {len(ids)} tokens but the sequence lengths {lens.tolist()} sum to "
                            f"{lens.sum()} (at most {max_seq_len} expected)")
        if len(seg) != len(ids):
            raise DataError(f"{row}: segment_ids has {len(seg)} entries, input_ids {len(ids)}")
        if len(mlens) != len(lens) or len(nsp) != len(lens):
            raise DataError(f"{row}: {len(lens)} sequences but {len(mlens)} masked-LM counts and {len(nsp)} "
                            f"next-sentence labels")
        if len(pos) != mlens.sum() or len(mids) != len(pos) or (mlens < 0).any() or (mlens > max_pred).any():
            raise DataError(f"{row}: {len(pos)} masked positions and {len(mids)} ids for per-sequence counts "
                            f"{mlens.tolist()} (each 0..{max_pred})")
        if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
            raise DataError(f"{row}: input_ids must be in [0, {vocab_size}), found {ids.min()}..{ids.max()}")
        if mids.size and (mids.min() < 0 or mids.max() >= vocab_size):
            raise DataError(f"{row}: masked_lm_ids must be in [0, {vocab_size}), found {mids.min()}..{mids.max()}")
        if seg.size and (seg.min() < 0 or seg.max() > 1):
            raise DataError(f"{row}: segment_ids must be 0 or 1, found {seg.min()}..{seg.max()}")
        if nsp.size and (nsp.min() < 0 or nsp.max() > 1):
            raise DataError(f"{row}: next_sentence_labels must be 0 or 1, found {nsp.tolist()}")
        starts = np.concatenate([[0], np.cumsum(lens)])
        owner = np.repeat(np.arange(len(lens)), mlens)
        if pos.size and ((pos < starts[owner]).any() or (pos >= starts[owner + 1]).any()
                         or (np.diff(pos) <= 0).any()):
            raise DataError(f"{row}: masked_lm_positions {pos.tolist()} must increase and each lie inside its "
                            f"sequence (sequence starts {starts.tolist()})")


# ---------------------------------------------------------------------------------------------- files
def _open_h5(path: Path) -> h5py.File:
    if not path.is_file():
        raise DataError(f"{path}: file not found (expected an HDF5 BERT pretraining shard)")
    try:
        return h5py.File(path, "r")
    except HDF5_ERRORS as exc:
        raise DataError(f"{path}: not a readable HDF5 file, truncated or corrupt ({exc})") from None


def _dataset(f: h5py.File, path: Path, key: str, vlen: bool, layout: tuple[str, Sequence[str]]) -> h5py.Dataset:
    try:
        return _checked_dataset(f, path, key, vlen, layout)
    except HDF5_ERRORS as exc:
        raise DataError(f"{path}: cannot open dataset '{key}' ({exc}); the file is truncated or corrupt") from None


def _checked_dataset(f: h5py.File, path: Path, key: str, vlen: bool, layout: tuple[str, Sequence[str]]) -> h5py.Dataset:
    """``layout``: (its name, its keys), for the messages."""
    name, keys = layout
    if key not in f:
        raise DataError(f"{path}: missing key '{key}' (a {name} shard has {', '.join(keys)})")
    ds = f[key]
    if not isinstance(ds, h5py.Dataset):
        raise DataError(f"{path}: '{key}' is a group, expected a dataset")
    base = h5py.check_vlen_dtype(ds.dtype)
    if vlen and base is None:
        raise DataError(f"{path}: '{key}': expected a variable-length (vlen) integer dataset ({name} layout), "
                        f"found {ds.dtype} {ds.shape}")
    dtype = base if vlen else ds.dtype
    if not vlen and base is not None:
        raise DataError(f"{path}: '{key}': expected a fixed-shape integer dataset ({name} layout), found vlen")
    if np.dtype(dtype).type not in _ACCEPTED[key]:
        raise DataError(f"{path}: '{key}': expected dtype {' or '.join(np.dtype(t).name for t in _ACCEPTED[key])}, "
                        f"found {np.dtype(dtype).name}")
    return ds


def _read(ds: h5py.Dataset, path: Path, index: np.ndarray) -> np.ndarray:
    """Rows ``index`` (any order, repeats allowed) of a dataset; h5py wants increasing unique indices."""
    uniq, inverse = np.unique(index, return_inverse=True)
    try:
        if len(uniq) and uniq[-1] - uniq[0] + 1 == len(uniq):
            got = ds[int(uniq[0]) : int(uniq[-1]) + 1]
        else:
            got = ds[uniq]
    except HDF5_ERRORS as exc:
        raise DataError(f"{path}: '{ds.name.lstrip('/')}': cannot read rows ({exc}); the file is truncated "
                        f"or corrupt") from None
    return got[inverse]


class Shard:
    """One open HDF5 shard of either layout; :meth:`read` returns validated :class:`Rows`."""

    packed: bool  # rows of several sequences
    keys: tuple[str, ...]
    vlen_keys: frozenset[str] = frozenset()  # the keys stored as variable-length rows
    layout: str = ""

    def __init__(self, path: str | Path, max_seq_len: int = MAX_SEQ_LEN, max_pred: int = MAX_PRED,
                 vocab_size: int = VOCAB_SIZE, max_per_row: int | None = None) -> None:
        self.path = Path(path)
        self.max_seq_len, self.max_pred, self.vocab_size = max_seq_len, max_pred, vocab_size
        self.max_per_row = max_per_row
        self.file = _open_h5(self.path)
        try:
            self.data = {k: _dataset(self.file, self.path, k, k in self.vlen_keys, (self.layout, self.keys))
                         for k in self.keys}
            self.rows = self._check_row_counts()
            self._check_shapes()
            self._ids_checked = False  # the whole shard's id ranges, on its first read (_check_ids)
        except BaseException:
            self.file.close()
            raise

    def _check_row_counts(self) -> int:
        """Every key holds one row per sample: a key with another count is named with both counts."""
        counts = {k: (ds.shape[0] if ds.ndim else 0) for k, ds in self.data.items()}
        n = counts["input_ids"]
        wrong = [f"'{k}' has {c} rows" for k, c in counts.items() if c != n]
        if wrong:
            raise DataError(f"{self.path}: {', '.join(wrong)} but 'input_ids' has {n}; every key holds one row "
                            "per sample (a truncated or mismatched write?)")
        return n

    def _check_shapes(self) -> None:
        raise NotImplementedError

    def _check_ids(self) -> None:
        """Every id of :data:`ID_KEYS` in [0, vocab_size), read in chunks of rows; names the first bad row."""
        for key in ID_KEYS:
            ds = self.data[key]
            for start in range(0, self.rows, _CHUNK_ROWS):
                stop = min(start + _CHUNK_ROWS, self.rows)
                try:
                    chunk = ds[start:stop]
                except HDF5_ERRORS as exc:
                    raise DataError(f"{self.path}: '{key}': cannot read rows {start}..{stop - 1} ({exc}); the file "
                                    "is truncated or corrupt") from None
                vlen = key in self.vlen_keys
                if vlen:  # vlen rows: one flat array and the row of each entry
                    lengths = np.fromiter((len(a) for a in chunk), np.int64, len(chunk))
                    flat = np.concatenate(list(chunk)) if lengths.sum() else np.zeros(0, np.int64)
                else:
                    flat = chunk.reshape(-1)
                bad = (flat < 0) | (flat >= self.vocab_size)
                if bad.any():
                    at = int(np.argmax(bad))
                    row = (int(np.searchsorted(np.cumsum(lengths), at, side="right")) if vlen
                           else at // chunk.shape[1])
                    raise DataError(f"{self.path}: '{key}' row {start + row}: id {int(flat[at])} is outside the "
                                    f"vocabulary [0, {self.vocab_size}) ({int(bad.sum())} such id(s) in rows "
                                    f"{start}..{stop - 1}); found at the shard's first read")

    def __len__(self) -> int:
        return self.rows

    def sequences(self, rows: int | None = None) -> int:
        """Sequences in the first ``rows`` rows (default all): the rows themselves in the padded layout;
        in the packed one the entries of ``packed_input_len`` (one per sequence), read in chunks of rows
        (about 0.6 s per million rows)."""
        rows = self.rows if rows is None else min(rows, self.rows)
        if not self.packed:
            return rows
        ds, total = self.data["packed_input_len"], 0
        for start in range(0, rows, _CHUNK_ROWS * 8):
            stop = min(start + _CHUNK_ROWS * 8, rows)
            try:
                chunk = ds[start:stop]
            except HDF5_ERRORS as exc:
                raise DataError(f"{self.path}: 'packed_input_len': cannot read rows {start}..{stop - 1} ({exc}); "
                                "the file is truncated or corrupt") from None
            total += sum(map(len, chunk))
        return total

    def close(self) -> None:
        self.file.close()

    def __enter__(self) -> Shard:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def read(self, index: Sequence[int] | np.ndarray | slice | None = None) -> Rows:
        """Rows ``index`` (default all), value-checked (ids in the vocabulary, positions inside their sequence)."""
        if index is None:
            index = slice(0, self.rows)
        if isinstance(index, slice):
            index = np.arange(self.rows)[index]
        index = np.asarray(index, dtype=np.int64)
        if index.size and (index.min() < 0 or index.max() >= self.rows):
            raise IndexError(f"{self.path}: row index out of range 0..{self.rows - 1}")
        if not self._ids_checked:
            self._check_ids()
            self._ids_checked = True
        raw = {k: _read(ds, self.path, index) for k, ds in self.data.items()}
        rows = self._to_rows(raw, index)
        check_rows(rows, str(self.path), self.max_seq_len, self.max_pred, self.vocab_size, self.max_per_row,
                   numbers=index)
        return rows

    def _to_rows(self, raw: dict[str, np.ndarray], numbers: np.ndarray) -> Rows:
        raise NotImplementedError


class PaddedShard(Shard):
    """The padded layout: (N, max_seq_len) token arrays, (N, max_pred) predictions, (N,) labels."""

    packed = False
    keys = PADDED_KEYS
    layout = "padded"

    def _check_shapes(self) -> None:
        n = self.rows
        want = {"input_ids": (n, self.max_seq_len), "input_mask": (n, self.max_seq_len),
                "segment_ids": (n, self.max_seq_len), "masked_lm_positions": (n, self.max_pred),
                "masked_lm_ids": (n, self.max_pred), "next_sentence_labels": (n,)}
        for k, shape in want.items():
            if self.data[k].shape != shape:
                raise DataError(f"{self.path}: '{k}': expected shape {_shape(shape)}, found {self.data[k].shape} "
                                "(the row length is the config's data.max_seq_len; data from `hpcbench datagen bert` "
                                "must be generated with the same --max-seq-len, and --vocab-size as model.vocab_size)")
        return n

    def _to_rows(self, raw: dict[str, np.ndarray], numbers: np.ndarray) -> Rows:
        mask, ids, seg = raw["input_mask"], raw["input_ids"], raw["segment_ids"]
        pos, mids, nsp = raw["masked_lm_positions"], raw["masked_lm_ids"], raw["next_sentence_labels"]
        lens = mask.sum(axis=1, dtype=np.int64)
        out = Rows()
        for r in range(len(ids)):
            n, where = int(lens[r]), f"row {int(numbers[r])}"
            if (mask[r, :n] != 1).any() or (mask[r, n:] != 0).any():
                raise DataError(f"{self.path}: 'input_mask' {where}: expected ones then zeros (0/1 values)")
            if (ids[r, n:] != 0).any() or (seg[r, n:] != 0).any():
                raise DataError(f"{self.path}: {where}: input_ids/segment_ids must be 0 past input_mask's "
                                f"{n} tokens")
            m = int(np.count_nonzero(pos[r]))
            if (pos[r, m:] != 0).any() or (mids[r, m:] != 0).any():
                raise DataError(f"{self.path}: {where}: masked_lm_positions/ids must be the {m} used slots "
                                f"followed by zeros (position 0 is [CLS], never predicted)")
            out.input_ids.append(ids[r, :n].astype(np.int64))
            out.segment_ids.append(seg[r, :n].astype(np.int64))
            out.seq_lens.append(np.array([n], np.int64))
            out.masked_lm_positions.append(pos[r, :m].astype(np.int64))
            out.masked_lm_ids.append(mids[r, :m].astype(np.int64))
            out.masked_lens.append(np.array([m], np.int64))
            out.next_sentence_labels.append(np.array([nsp[r]], np.int64))
        return out


class PackedShard(Shard):
    """The packed layout: variable-length rows of up to ``max_per_row`` sequences (NVIDIA: 3)."""

    packed = True
    keys = PACKED_KEYS
    vlen_keys = frozenset(PACKED_KEYS)
    layout = "packed"

    def _check_shapes(self) -> None:
        n = self.rows
        for k, ds in self.data.items():
            if ds.shape != (n,):
                raise DataError(f"{self.path}: '{k}': expected {n} variable-length rows, shape ({n},), "
                                f"found {ds.shape}")

    def _to_rows(self, raw: dict[str, np.ndarray], numbers: np.ndarray) -> Rows:
        def col(k: str) -> list[np.ndarray]:
            return [np.asarray(a, dtype=np.int64) for a in raw[k]]

        return Rows(col("input_ids"), col("segment_ids"), col("packed_input_len"), col("masked_lm_positions"),
                    col("masked_lm_ids"), col("packed_masked_lm_len"), col("next_sentence_labels"))


class VarlenShard(Shard):
    """NVIDIA's variable-length layout: one sequence per row, unpadded; the row's length is its mask."""

    packed = False
    keys = VARLEN_KEYS
    vlen_keys = frozenset(VARLEN_KEYS) - {"next_sentence_labels"}
    layout = "variable-length"

    def _check_shapes(self) -> None:
        n = self.rows
        for k, ds in self.data.items():
            if ds.shape != (n,):
                raise DataError(f"{self.path}: '{k}': expected {n} rows, shape ({n},), found {ds.shape}")

    def _to_rows(self, raw: dict[str, np.ndarray], numbers: np.ndarray) -> Rows:
        out = Rows()
        for r in range(len(numbers)):
            ids, seg = raw["input_ids"][r], raw["segment_ids"][r]
            pos, mids = raw["masked_lm_positions"][r], raw["masked_lm_ids"][r]
            if len(seg) != len(ids) or len(mids) != len(pos):
                raise DataError(f"{self.path}: row {int(numbers[r])}: segment_ids has {len(seg)} entries for "
                                f"{len(ids)} input_ids, masked_lm_ids {len(mids)} for {len(pos)} positions "
                                "(each pair must be as long)")
            out.input_ids.append(np.asarray(ids, dtype=np.int64))
            out.segment_ids.append(np.asarray(seg, dtype=np.int64))
            out.seq_lens.append(np.array([len(ids)], np.int64))
            out.masked_lm_positions.append(np.asarray(pos, dtype=np.int64))
            out.masked_lm_ids.append(np.asarray(mids, dtype=np.int64))
            out.masked_lens.append(np.array([len(pos)], np.int64))
            out.next_sentence_labels.append(np.array([raw["next_sentence_labels"][r]], np.int64))
        return out


def _shape(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join("N" if i == 0 else str(s) for i, s in enumerate(shape)) + ")"


def open_shard(path: str | Path, **limits: int | None) -> Shard:
    """A padded, packed or variable-length shard: packed with the ``packed_input_len`` key, variable-length with
    variable-length ``input_ids`` and no ``input_mask``, else padded."""
    path = Path(path)
    with _open_h5(path) as f:
        try:
            packed = "packed_input_len" in f
            keys = sorted(f.keys())
            varlen = (not packed and "input_mask" not in f and isinstance(f.get("input_ids"), h5py.Dataset)
                      and h5py.check_vlen_dtype(f["input_ids"].dtype) is not None)
        except HDF5_ERRORS as exc:
            raise DataError(f"{path}: cannot list its keys ({exc}); the file is truncated or corrupt") from None
    if not packed and not set(keys) & set(PADDED_KEYS):  # no layout's keys: another dataset's file
        raise DataError(f"{path}: not a BERT pretraining shard: its top-level keys are {keys[:8]}; a packed shard has "
                        f"{', '.join(PACKED_KEYS)}, a padded one {', '.join(PADDED_KEYS)}, a variable-length one "
                        f"{', '.join(VARLEN_KEYS)}")
    return (PackedShard if packed else VarlenShard if varlen else PaddedShard)(path, **limits)


# -------------------------------------------------------------------------------------------- writers
def _padded_arrays(rows: Rows, max_seq_len: int, max_pred: int) -> dict[str, np.ndarray]:
    n = len(rows)
    out = {k: np.zeros((n, max_seq_len if k in ("input_ids", "input_mask", "segment_ids") else max_pred),
                       PADDED_DTYPES[k]) for k in PADDED_KEYS if k != "next_sentence_labels"}
    out["next_sentence_labels"] = np.zeros(n, PADDED_DTYPES["next_sentence_labels"])
    for r in range(n):
        if len(rows.seq_lens[r]) != 1:
            raise DataError(f"row {r}: the padded layout holds one sequence per row, found {len(rows.seq_lens[r])}")
        t, m = len(rows.input_ids[r]), len(rows.masked_lm_positions[r])
        out["input_ids"][r, :t] = rows.input_ids[r]
        out["input_mask"][r, :t] = 1
        out["segment_ids"][r, :t] = rows.segment_ids[r]
        out["masked_lm_positions"][r, :m] = rows.masked_lm_positions[r]
        out["masked_lm_ids"][r, :m] = rows.masked_lm_ids[r]
        out["next_sentence_labels"][r] = rows.next_sentence_labels[r][0]
    return out


def _write_atomic(path: Path, fill: Callable[[h5py.File], None], reader: type[Shard], rows: Rows,
                  limits: dict[str, int | None]) -> None:
    """Write through ``fill(h5file)`` into a temporary sibling, read it back with ``reader`` and compare
    with ``rows``, then rename: a shard under its final name is complete and readable."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = make_temp(path)
    os.close(fd)
    try:
        with h5py.File(tmp, "w") as f:
            fill(f)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        with reader(tmp, **limits) as back:
            if not back.read().equals(rows):
                raise DataError(f"{path}: the shard read back differs from what was written")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_padded(path: str | Path, rows: Rows, max_seq_len: int = MAX_SEQ_LEN, max_pred: int = MAX_PRED,
                 vocab_size: int = VOCAB_SIZE) -> None:
    """One padded shard (one sequence per row) with the reference converter's dtypes, gzip-compressed."""
    check_rows(rows, str(path), max_seq_len, max_pred, vocab_size, max_per_row=1)
    arrays = _padded_arrays(rows, max_seq_len, max_pred)

    def fill(f: h5py.File) -> None:
        for k in PADDED_KEYS:
            f.create_dataset(k, data=arrays[k], dtype=PADDED_DTYPES[k], compression="gzip")

    _write_atomic(Path(path), fill, PaddedShard, rows,
                  {"max_seq_len": max_seq_len, "max_pred": max_pred, "vocab_size": vocab_size})


def write_packed(path: str | Path, rows: Rows, max_seq_len: int = MAX_SEQ_LEN, max_pred: int = MAX_PRED,
                 vocab_size: int = VOCAB_SIZE, max_per_row: int | None = None) -> None:
    """One packed shard: vlen rows with the dtypes of NVIDIA's ``create_packed_trainset.py`` (uncompressed)."""
    check_rows(rows, str(path), max_seq_len, max_pred, vocab_size, max_per_row)
    columns = {"input_ids": rows.input_ids, "segment_ids": rows.segment_ids,
               "masked_lm_positions": rows.masked_lm_positions, "masked_lm_ids": rows.masked_lm_ids,
               "packed_input_len": rows.seq_lens, "packed_masked_lm_len": rows.masked_lens,
               "next_sentence_labels": rows.next_sentence_labels}

    def fill(f: h5py.File) -> None:
        for k in PACKED_KEYS:
            dt = PACKED_DTYPES[k]
            ds = f.create_dataset(k, (len(rows),), dtype=h5py.vlen_dtype(np.dtype(dt)))
            if len(rows):
                ragged = np.empty(len(rows), dtype=object)
                for r, a in enumerate(columns[k]):
                    ragged[r] = np.asarray(a, dtype=dt)
                ds[:] = ragged

    _write_atomic(Path(path), fill, PackedShard, rows,
                  {"max_seq_len": max_seq_len, "max_pred": max_pred, "vocab_size": vocab_size,
                   "max_per_row": max_per_row})
