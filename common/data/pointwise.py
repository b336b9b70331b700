"""Per-value CPU batch transforms that make one pass over memory: each sample is taken in pieces of about
:data:`PIECE` values (cache-resident, yet large enough that numpy's cost per call is small), each piece
computed straight into the caller's output (or into a piece-sized scratch and then laid out
channels-first from there), in numpy on the calling thread (no intra-op threads to spin idle).

Why: the transforms of the host batches (CosmoFlow's ``log1p`` of int16 counts, DeepCAM's per-channel
shift and scale) cost more than reading the batch. As whole-batch torch ops they made two or three passes
over tens of MiB (cast, then ``log1p_``; ``sub`` then ``mul_``) and, on a small shared box, paid
OpenMP's idle spinning of the second intra-op thread in CPU time: 8.5 ms of CPU per 128^3 x 4 CosmoFlow
sample, 9.4 ms per 768 x 1152 x 16 DeepCAM sample (benchmarks/data_cache.py, 2026-11-25). Here:

- :class:`Int16Table`: ``f`` of an int16 array as a lookup in a 65,536-entry float32 table made by
  ``f`` itself (the same torch kernel on every int16 value), so the result is bit-equal to ``f`` of the
  float32 cast, for every value, negatives included.
- :class:`ShiftScale`: ``(x - shift) * scale`` per channel (channels last in storage), the two float32
  roundings of the formula kept (no fused multiply-add), so bit-equal to the torch formula.

Both take the samples as a sequence of arrays (the rows of a batch, or rows of a cache picked by slot:
no gather copy first) and write an output of ``[N, *sample]`` or, channels-first, ``[N, C, *rest]``.
Scratch is per thread (reader threads may transform batches at once) and kept: no page faults per batch.
"""
from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence

import numpy as np
import torch

PIECE = 1 << 19  # values per piece (2 MiB of float32); on the 2-core EPYC 2^18..2^20 cost alike, 2^16 up to 1.5x more
INT16_VALUES = 1 << 16


class _Pieces:
    """The piece loop and the per-thread scratch both transforms share."""

    def __init__(self) -> None:
        self._local = threading.local()

    def scratch(self, name: str, n: int, dtype: type) -> np.ndarray:
        """A kept array of at least ``n`` values for this thread (grown when a larger one is asked)."""
        arrays = self._local.__dict__.setdefault("arrays", {})
        got = arrays.get(name)
        if got is None or got.size < n:
            got = arrays[name] = np.empty(n, dtype)
        return got[:n]

    @staticmethod
    def rows_per_piece(sample_shape: Sequence[int]) -> tuple[int, int]:
        """(rows of a sample's first axis per piece, values per row)."""
        row = math.prod(sample_shape[1:])
        return max(1, PIECE // max(1, row)), row

    def run(self, samples: Sequence[np.ndarray], out: np.ndarray, channels_first: bool,
            piece: Callable[[np.ndarray, np.ndarray], None]) -> None:
        """``piece(src, dst)`` over flat pieces of every sample; ``samples[i]`` is C-contiguous
        ``[A, ..., C]``; ``out`` is C-contiguous ``[N, A, ..., C]`` or, ``channels_first``, ``[N, C, A, ...]``."""
        if len(samples) == 0:
            return
        shape = samples[0].shape
        _check(samples, out, shape, channels_first)
        rows, row = self.rows_per_piece(shape)
        perm = (len(shape) - 1, *range(len(shape) - 1))  # [a, ..., C] -> [C, a, ...]
        tmp = self.scratch("layout", min(rows, shape[0]) * row, out.dtype.type) if channels_first else None
        for i, sample in enumerate(samples):
            for r in range(0, shape[0], rows):
                src = sample[r:r + rows]
                if tmp is None:
                    piece(src.reshape(-1), out[i, r:r + rows].reshape(-1))
                else:  # computed into a piece-sized scratch, then laid out channels-first from there
                    dst = tmp[:src.size]
                    piece(src.reshape(-1), dst)
                    out[i, :, r:r + rows] = dst.reshape(src.shape).transpose(perm)


def _check(samples: Sequence[np.ndarray], out: np.ndarray, shape: tuple[int, ...], channels_first: bool) -> None:
    """Shapes and layouts the piece loop relies on (a programming error otherwise, not bad data)."""
    want = (len(samples), shape[-1], *shape[:-1]) if channels_first else (len(samples), *shape)
    if out.shape != want or not out.flags.c_contiguous:
        raise ValueError(f"output must be C-contiguous {want}, got {out.shape}"
                         f"{'' if out.flags.c_contiguous else ' (not contiguous)'}")
    for s in samples:
        if s.shape != shape or not s.flags.c_contiguous:
            raise ValueError(f"every sample must be C-contiguous {shape}, got {s.shape}")


class Int16Table(_Pieces):
    """``fn`` of int16 values as a table lookup: ``fn`` (a float32 torch function, e.g. ``torch.log1p``)
    runs once on the float32 cast of all 65,536 int16 values; the table is indexed by the 16-bit
    pattern (``uint16`` view), so a value v >= 0 is entry v and a negative one entry v + 65536."""

    def __init__(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        values = torch.arange(INT16_VALUES, dtype=torch.int32).to(torch.int16)  # the patterns 0..65535 as int16
        table = fn(values.to(torch.float32))
        if table.dtype != torch.float32 or table.shape != values.shape:
            raise ValueError(f"fn must map float32 [{INT16_VALUES}] to float32 of the same shape, "
                             f"got {table.dtype} {tuple(table.shape)}")
        self.table = np.ascontiguousarray(table.numpy())

    def into(self, samples: Sequence[np.ndarray], out: np.ndarray, channels_first: bool = False) -> None:
        """``out[i] = fn(float32(samples[i]))`` (int16 samples, float32 out; see :meth:`_Pieces.run`)."""
        if out.dtype != np.float32 or any(s.dtype != np.int16 for s in samples):
            raise ValueError(f"int16 samples and a float32 output expected, got {out.dtype}")
        if len(samples) == 0:
            return
        shape = samples[0].shape
        rows, row = self.rows_per_piece(shape)
        idx = self.scratch("index", min(rows, shape[0]) * row, np.intp)
        if channels_first:  # the layout change happens in the index pass, not in a pass over the output
            self._into_channels_first(samples, out, idx, rows)
            return

        def piece(src: np.ndarray, dst: np.ndarray) -> None:
            i = idx[:src.size]
            i[...] = src.view(np.uint16)  # the pattern: an index into the table, always in range
            np.take(self.table, i, out=dst, mode="wrap")  # wrap: no bounds check to raise on

        self.run(samples, out, channels_first, piece)

    def _into_channels_first(self, samples: Sequence[np.ndarray], out: np.ndarray, idx: np.ndarray,
                             rows: int) -> None:
        """``[A, ..., C]`` int16 samples into ``[N, C, A, ...]``: each piece's index is written channel by
        channel (the transposed copy reads int16 and writes the index it needs anyway), then one lookup per
        channel lands in the output's contiguous run of that channel; no float32 scratch and no transposed
        float32 copy (a CosmoFlow batch of 4: 32.2 -> 28.2 ms, benchmarks/transform_outputs.py, 2-core EPYC)."""
        shape = samples[0].shape
        _check(samples, out, shape, True)
        c = shape[-1]
        for i, sample in enumerate(samples):
            for r in range(0, shape[0], rows):
                src = sample[r:r + rows]
                n = src.size // c
                index = idx[:src.size].reshape(c, n)
                index[...] = src.view(np.uint16).reshape(n, c).T  # channel k's patterns in index[k]
                for k in range(c):
                    np.take(self.table, index[k], out=out[i, k, r:r + rows].reshape(-1), mode="wrap")


class ShiftScale(_Pieces):
    """``(x - shift) * scale`` per channel of float32 samples stored channels-last (``shift`` and
    ``scale`` float32 ``[C]``), in that order and with both roundings, as the torch formula."""

    def __init__(self, shift: np.ndarray, scale: np.ndarray) -> None:
        super().__init__()
        self.shift = np.ascontiguousarray(shift, np.float32).reshape(-1)
        self.scale = np.ascontiguousarray(scale, np.float32).reshape(-1)
        if self.shift.shape != self.scale.shape:
            raise ValueError(f"shift {self.shift.shape} and scale {self.scale.shape} must have one value per channel")
        self._tiled: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._lock = threading.Lock()

    def tiled(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """shift and scale repeated over ``n`` values (a piece is whole rows: channel 0 first), so each
        piece is two flat numpy ops with no broadcast over a length-C inner loop."""
        with self._lock:
            got = self._tiled.get(n)
            if got is None:
                reps = -(-n // self.shift.size)
                got = self._tiled[n] = (np.tile(self.shift, reps)[:n], np.tile(self.scale, reps)[:n])
        return got

    def into(self, samples: Sequence[np.ndarray], out: np.ndarray, channels_first: bool = False) -> None:
        """``out[i] = (samples[i] - shift) * scale`` (float32; see :meth:`_Pieces.run`)."""
        if out.dtype != np.float32 or any(s.dtype != np.float32 for s in samples):
            raise ValueError(f"float32 samples and a float32 output expected, got {out.dtype}")
        if len(samples) == 0:
            return
        if samples[0].shape[-1] != self.shift.size:
            raise ValueError(f"samples have {samples[0].shape[-1]} channels; shift/scale have {self.shift.size}")
        rows, row = self.rows_per_piece(samples[0].shape)
        shift, scale = self.tiled(min(rows, samples[0].shape[0]) * row)

        def piece(src: np.ndarray, dst: np.ndarray) -> None:
            np.subtract(src, shift[:src.size], out=dst)
            np.multiply(dst, scale[:src.size], out=dst)

        self.run(samples, out, channels_first, piece)
