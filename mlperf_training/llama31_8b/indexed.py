"""Megatron/NeMo indexed datasets: a ``PREFIX.bin`` token file and its ``PREFIX.idx`` index, read
memory-mapped without Megatron or NeMo installed, validated, and written in the same format.

The published layout (Megatron-LM ``megatron/core/datasets/indexed_dataset.py``, ``_IndexWriter`` /
``_IndexReader``; all integers little-endian)::

    .idx  magic      9 bytes  b"MMIDIDX\\x00\\x00"
          version    uint64   1
          dtype code uint8    1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16
          N          uint64   sequence count
          D          uint64   document count (entries of the document index: documents + 1)
          lengths    int32[N] tokens per sequence
          pointers   int64[N] byte offset of each sequence in .bin (cumulative lengths x itemsize)
          doc index  int64[D] sequence index where each document starts, 0 first, N last
          (modes     int8[N]  multimodal datasets only; refused here: a text corpus has none)
    .bin  the tokens of every sequence back to back, in the dtype of the code

Validation at open (:class:`IndexedDataset`): magic, version, dtype code (an integer type), the .idx
size equal to what its header announces, lengths >= 0, pointers equal to the cumulative lengths, the
document index starting at 0, non-decreasing and ending at N, and the .bin size equal to the tokens
the index describes. Token ids are checked against the vocabulary as they are read (per sequence, in
:meth:`IndexedDataset.get`), and over the whole file by :meth:`IndexedDataset.check_tokens` (datagen's
verification): at open that would read every token of a C4-sized corpus on every rank. Every failure is
a :class:`~hpcbench.common.errors.DataError` naming the file and what was expected.
"""
from __future__ import annotations

import os
import struct
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from hpcbench.common.atomic import make_temp
from hpcbench.common.errors import DataError

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
HEADER_BYTES = len(MAGIC) + 8 + 1 + 8 + 8  # 34
DTYPES: dict[int, type[np.number]] = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64,
                                       6: np.float64, 7: np.float32, 8: np.uint16}
CODES: dict[type[np.number], int] = {v: k for k, v in DTYPES.items()}


def paths(prefix: str | Path) -> tuple[Path, Path]:
    """(``PREFIX.idx``, ``PREFIX.bin``)."""
    p = str(prefix)
    return Path(p + ".idx"), Path(p + ".bin")


def token_dtype(vocab_size: int) -> type[np.number]:
    """The dtype Megatron's preprocessing picks for a vocabulary (``DType.optimal_dtype``): uint16 below
    65,500 ids, int32 above (Llama 3.1's 128,256)."""
    return np.uint16 if vocab_size < 65500 else np.int32


class IndexedDataset:
    """One ``PREFIX.idx``/``PREFIX.bin`` pair, memory-mapped and validated at open (see the module docstring).

    ``vocab_size`` > 0: every token read must be below it (and >= 0). ``files``: the (.idx, .bin) paths when they
    are not ``PREFIX.idx``/``PREFIX.bin`` (the writer's temporary files)."""

    def __init__(self, prefix: str | Path, vocab_size: int = 0, files: tuple[Path, Path] | None = None) -> None:
        self.idx_path, self.bin_path = files if files is not None else paths(prefix)
        self.vocab_size = vocab_size
        for p in (self.idx_path, self.bin_path):
            if not p.is_file():
                raise DataError(f"{p}: no such file (an indexed dataset is a PREFIX.idx + PREFIX.bin pair)")
        self._read_index()
        self._map_bin()

    # opening --------------------------------------------------------------------------------------
    def _read_index(self) -> None:
        f = self.idx_path
        size = f.stat().st_size
        if size < HEADER_BYTES:
            raise DataError(f"{f}: {size} bytes, shorter than the {HEADER_BYTES}-byte index header; not an indexed "
                            "dataset index (or truncated)")
        with open(f, "rb") as fh:
            head = fh.read(HEADER_BYTES)
        if head[:9] != MAGIC:
            raise DataError(f"{f}: magic {head[:9]!r}, expected {MAGIC!r} (a Megatron MMIDIDX index)")
        (version,) = struct.unpack("<Q", head[9:17])
        if version != VERSION:
            raise DataError(f"{f}: index version {version}, expected {VERSION}")
        code = head[17]
        if code not in DTYPES:
            raise DataError(f"{f}: dtype code {code}, expected one of {sorted(DTYPES)} ({', '.join(f'{k} {v.__name__}' for k, v in DTYPES.items())})")
        self.dtype = np.dtype(DTYPES[code])
        if self.dtype.kind not in "iu":
            raise DataError(f"{f}: dtype code {code} ({self.dtype.name}) is not an integer type; token ids are integers")
        n, d = struct.unpack("<QQ", head[18:34])
        expect = HEADER_BYTES + 4 * n + 8 * n + 8 * d
        if size != expect:
            extra = " (a multimodal index with per-sequence modes is not a text corpus)" if size == expect + n else ""
            raise DataError(f"{f}: {size} bytes, but its header announces {n} sequences and {d} document-index "
                            f"entries = {expect} bytes{extra}")
        if d < 1:
            raise DataError(f"{f}: document index is empty; it starts with 0 and ends with the sequence count {n}")
        mm = np.memmap(f, mode="r", dtype=np.uint8)
        self._idx_map = mm
        off = HEADER_BYTES
        self.sequence_lengths = np.frombuffer(mm, dtype="<i4", count=n, offset=off)
        self.sequence_pointers = np.frombuffer(mm, dtype="<i8", count=n, offset=off + 4 * n)
        self.document_indices = np.frombuffer(mm, dtype="<i8", count=d, offset=off + 12 * n)
        self.sequence_count, self.document_count = int(n), int(d) - 1
        self._check_index()

    def _check_index(self) -> None:
        f, lengths, pointers, docs = self.idx_path, self.sequence_lengths, self.sequence_pointers, self.document_indices
        n = self.sequence_count
        if n and int(lengths.min()) < 0:
            i = int(np.argmin(lengths))
            raise DataError(f"{f}: sequence {i} has length {int(lengths[i])}, expected >= 0")
        item = self.dtype.itemsize
        if n:
            starts = np.zeros(n, dtype=np.int64)
            np.cumsum(lengths[:-1].astype(np.int64) * item, out=starts[1:])
            bad = np.flatnonzero(starts != pointers)
            if bad.size:
                i = int(bad[0])
                raise DataError(f"{f}: sequence {i} points at byte {int(pointers[i])} of the .bin, expected {int(starts[i])} "
                                f"(the sum of the earlier lengths x {item} bytes)")
        if int(docs[0]) != 0 or int(docs[-1]) != n:
            raise DataError(f"{f}: document index runs from {int(docs[0])} to {int(docs[-1])}, expected from 0 to the "
                            f"sequence count {n}")
        if docs.size > 1 and bool((np.diff(docs) < 0).any()):
            i = int(np.flatnonzero(np.diff(docs) < 0)[0])
            raise DataError(f"{f}: document index decreases at entry {i + 1} ({int(docs[i])} then {int(docs[i + 1])}); "
                            "expected non-decreasing sequence indices")
        self.num_tokens = int(lengths.sum(dtype=np.int64)) if n else 0

    def _map_bin(self) -> None:
        size = self.bin_path.stat().st_size
        expect = self.num_tokens * self.dtype.itemsize
        if size != expect:
            raise DataError(f"{self.bin_path}: {size} bytes, but {self.idx_path.name} describes {self.num_tokens} tokens "
                            f"of {self.dtype.name} = {expect} bytes")
        self.tokens: np.ndarray = (np.memmap(self.bin_path, mode="r", dtype=self.dtype.newbyteorder("<"))
                                   if size else np.zeros(0, dtype=self.dtype))

    # reading --------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return self.sequence_count

    def get(self, i: int, offset: int = 0, length: int | None = None) -> np.ndarray:
        """Tokens ``[offset, offset + length)`` of sequence ``i`` (to its end when ``length`` is None), checked
        against the vocabulary."""
        if not 0 <= i < self.sequence_count:
            raise IndexError(f"{self.bin_path}: sequence {i} of {self.sequence_count}")
        n = int(self.sequence_lengths[i])
        if length is None:
            length = n - offset
        if offset < 0 or length < 0 or offset + length > n:
            raise IndexError(f"{self.bin_path}: tokens [{offset}, {offset + length}) of sequence {i} (length {n})")
        start = int(self.sequence_pointers[i]) // self.dtype.itemsize + offset
        out = self.tokens[start : start + length]
        if self.vocab_size and out.size:
            self._check_ids(out, f"sequence {i}")
        return out

    def _check_ids(self, ids: np.ndarray, where: str) -> None:
        hi, lo = int(ids.max()), int(ids.min())
        if hi >= self.vocab_size or lo < 0:
            bad = hi if hi >= self.vocab_size else lo
            raise DataError(f"{self.bin_path}: {where} holds token id {bad}, expected ids in [0, {self.vocab_size}) "
                            "(config key 'model.vocab_size')")

    def check_tokens(self, chunk: int = 1 << 24) -> None:
        """Every token of the .bin against the vocabulary (O(tokens); datagen's verification, a tool's check)."""
        if not self.vocab_size:
            return
        for lo in range(0, self.num_tokens, chunk):
            self._check_ids(self.tokens[lo : lo + chunk], f"tokens {lo}..{min(self.num_tokens, lo + chunk) - 1}")

    def close(self) -> None:
        for name in ("tokens", "_idx_map"):
            m = getattr(self, name, None)
            if isinstance(m, np.memmap) and getattr(m, "_mmap", None) is not None:
                m._mmap.close()


class IndexedWriter:
    """Writes ``PREFIX.bin`` + ``PREFIX.idx`` in the published layout, one document (of one sequence) per
    :meth:`add_document`, each to a temporary sibling that :meth:`finish` fsyncs, reopens with the validating
    reader and only then renames (the .bin first, the .idx last: a reader sees either no index or a whole pair)."""

    def __init__(self, prefix: str | Path, dtype: type[np.number], vocab_size: int = 0) -> None:
        if np.dtype(dtype).type not in CODES or np.dtype(dtype).kind not in "iu":
            raise ValueError(f"token dtype {np.dtype(dtype).name}: expected one of uint8, int8, int16, int32, int64, uint16")
        self.prefix, self.dtype, self.vocab_size = Path(prefix), np.dtype(dtype), vocab_size
        self.idx_path, self.bin_path = paths(prefix)
        self.bin_path.parent.mkdir(parents=True, exist_ok=True)
        fd, self._bin_tmp = make_temp(self.bin_path)
        self._bin = os.fdopen(fd, "wb")
        self.lengths: list[int] = []
        self.doc_starts: list[int] = [0]

    def add_document(self, tokens: Iterable[int] | np.ndarray) -> None:
        arr = np.asarray(tokens)
        if arr.ndim != 1:
            raise ValueError(f"a document is a 1-D token sequence, got shape {arr.shape}")
        if self.vocab_size and arr.size and (int(arr.max()) >= self.vocab_size or int(arr.min()) < 0):
            raise ValueError(f"document {len(self.lengths)} holds ids outside [0, {self.vocab_size})")
        self._bin.write(arr.astype(self.dtype.newbyteorder("<"), copy=False).tobytes())
        self.lengths.append(int(arr.size))
        self.doc_starts.append(len(self.lengths))

    def finish(self) -> "IndexedDataset":
        """Close, verify and rename both files; the reopened dataset (validated)."""
        idx_tmp: Path | None = None
        try:
            self._bin.flush()
            os.fsync(self._bin.fileno())
            self._bin.close()
            fd, idx_tmp = make_temp(self.idx_path)
            with os.fdopen(fd, "wb") as fh:
                fh.write(index_bytes(self.lengths, self.doc_starts, self.dtype.type))
                fh.flush()
                os.fsync(fh.fileno())
            check = IndexedDataset(self.prefix, self.vocab_size, files=(idx_tmp, self._bin_tmp))  # validate before publishing
            check.check_tokens()
            check.close()
            os.replace(self._bin_tmp, self.bin_path)
            os.replace(idx_tmp, self.idx_path)
        except BaseException:
            self._bin.close()
            self._bin_tmp.unlink(missing_ok=True)
            if idx_tmp is not None:
                idx_tmp.unlink(missing_ok=True)
            raise
        return IndexedDataset(self.prefix, self.vocab_size)


def index_bytes(lengths: Sequence[int], doc_starts: Sequence[int], dtype: type[np.number]) -> bytes:
    """The .idx file for sequences of ``lengths`` and the document index ``doc_starts`` (0 first, N last)."""
    lens = np.asarray(lengths, dtype="<i4")
    ptrs = np.zeros(lens.size, dtype="<i8")
    if lens.size > 1:
        np.cumsum(lens[:-1].astype(np.int64) * np.dtype(dtype).itemsize, out=ptrs[1:])
    docs = np.asarray(doc_starts, dtype="<i8")
    head = MAGIC + struct.pack("<Q", VERSION) + struct.pack("<B", CODES[np.dtype(dtype).type])
    head += struct.pack("<QQ", lens.size, docs.size)
    return head + lens.tobytes() + ptrs.tobytes() + docs.tobytes()


def list_prefixes(folder: Path) -> list[Path]:
    """The dataset prefixes of ``folder`` (every ``*.idx`` and ``*.bin``), in name order. A prefix with only
    one of its two files (an incomplete copy) is refused naming the missing one: skipping it would train or
    evaluate on part of the data."""
    found = [p for p in (*folder.glob("*.idx"), *folder.glob("*.bin")) if not p.name.startswith(".")]
    if not found:
        raise DataError(f"{folder}: no indexed dataset (PREFIX.idx + PREFIX.bin) found")
    out = []
    for prefix in sorted({p.with_suffix("") for p in found}, key=lambda p: paths(p)[0]):  # .idx name order
        idx, bin_ = paths(prefix)
        for have, lacks, what in ((idx, bin_, "token file"), (bin_, idx, "index file")):
            if not lacks.exists():
                raise DataError(f"{have}: its {what} {lacks.name} is missing (an indexed dataset is a "
                                "PREFIX.idx + PREFIX.bin pair)")
            if not lacks.is_file():
                raise DataError(f"{lacks}: not a regular file (an indexed dataset is a PREFIX.idx + PREFIX.bin pair)")
        out.append(prefix)
    return out
