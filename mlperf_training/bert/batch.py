"""Rows of sequences -> the tensors the model takes (one collate for padded and packed rows).

A batch is ``B`` rows of ``L`` positions; a row holds one sequence (padded layout) or several back to
back (packed), then padding. Besides the (B, L) token, segment and position arrays (positions restart
at 0 in every sequence, as in NVIDIA's packed training), the batch carries index vectors so the model
never has to look for structure at run time:

* ``seq_ids`` (B, L): which sequence of its row a position belongs to, -1 on padding (the attention mask);
* ``token_index`` (T,): the flat (B*L) positions of the T real tokens, row-major ("unpadded" order);
* ``cls_index`` (S,): each sequence's first token ([CLS], the next-sentence head's input), in T order;
* ``mlm_index`` (M,): each predicted position, in T order; ``mlm_index_flat`` the same in B*L order.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
import torch

from hpcbench.common.errors import DataError

from .format import Rows


@dataclass
class Batch:
    input_ids: torch.Tensor  # (B, L) int64
    segment_ids: torch.Tensor  # (B, L)
    position_ids: torch.Tensor  # (B, L)
    seq_ids: torch.Tensor  # (B, L), -1 on padding
    token_index: torch.Tensor  # (T,) into B*L
    cls_index: torch.Tensor  # (S,) into T
    mlm_index: torch.Tensor  # (M,) into T
    mlm_index_flat: torch.Tensor  # (M,) into B*L
    mlm_labels: torch.Tensor  # (M,)
    nsp_labels: torch.Tensor  # (S,)

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.input_ids.shape)  # type: ignore[return-value]

    def num_tokens(self) -> int:
        return int(self.token_index.numel())

    def to(self, device: torch.device | str) -> Batch:
        return Batch(**{f.name: getattr(self, f.name).to(device, non_blocking=True) for f in fields(self)})


def collate(rows: Rows, max_seq_len: int) -> Batch:
    """``rows`` (see :class:`~.format.Rows`) as a batch of ``len(rows)`` rows of ``max_seq_len`` positions."""
    b = len(rows)
    ids = np.zeros((b, max_seq_len), np.int64)
    seg = np.zeros_like(ids)
    pos = np.zeros_like(ids)
    sid = np.full_like(ids, -1)
    row_tokens = np.array([len(t) for t in rows.input_ids], np.int64)
    if row_tokens.size and row_tokens.max() > max_seq_len:
        raise DataError(f"a row has {row_tokens.max()} tokens, more than max_seq_len {max_seq_len}")
    row_start = np.concatenate([[0], np.cumsum(row_tokens)[:-1]]).astype(np.int64)  # T offset of each row
    cls, mlm, mlm_flat = [], [], []
    for r in range(b):
        n, lens = int(row_tokens[r]), rows.seq_lens[r]
        ids[r, :n] = rows.input_ids[r]
        seg[r, :n] = rows.segment_ids[r]
        starts = np.concatenate([[0], np.cumsum(lens)[:-1]])
        sid[r, :n] = np.repeat(np.arange(len(lens)), lens)
        pos[r, :n] = np.arange(n) - np.repeat(starts, lens)
        cls.append(row_start[r] + starts)
        mlm.append(row_start[r] + rows.masked_lm_positions[r])
        mlm_flat.append(r * max_seq_len + rows.masked_lm_positions[r])
    token_index = [r * max_seq_len + np.arange(n) for r, n in enumerate(row_tokens)]

    def cat(parts: list[np.ndarray]) -> torch.Tensor:
        return torch.from_numpy(np.concatenate(parts).astype(np.int64)) if parts else torch.zeros(0, dtype=torch.int64)

    return Batch(torch.from_numpy(ids), torch.from_numpy(seg), torch.from_numpy(pos), torch.from_numpy(sid),
                 cat(token_index), cat(cls), cat(mlm), cat(mlm_flat), cat(rows.masked_lm_ids),
                 cat(rows.next_sentence_labels))
