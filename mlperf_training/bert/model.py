"""BERT for pretraining (masked LM + next sentence) in plain torch, with packed sequences.

The architecture of the reference (post-LayerNorm BERT, ``bert_config.json`` of bert-large-uncased):
token + position + segment embeddings with LayerNorm; ``layers`` encoder layers of self-attention
and a GELU feed-forward block, each followed by residual add and LayerNorm (eps 1e-12); a tanh pooler
on each sequence's [CLS]; the MLM head (dense, GELU, LayerNorm, decoder tied to the word embeddings
plus a bias) and the next-sentence head (2 logits). The vocabulary is padded to a multiple of 8
(30522 -> 30528) as NVIDIA's implementation does. Initialisation: normal(0, 0.02) weights, zero
biases, unit LayerNorm.

**No compute to padding.** Everything that works per token (embeddings, the QKV/output projections,
the feed-forward block, LayerNorms, residuals: nearly all the FLOPs) runs on the T real tokens of the
batch, gathered row-major (``Batch.token_index``), not on B x L positions. Attention needs the row
layout: per layer the projected Q/K/V are scattered back into (B, L) rows and one
``scaled_dot_product_attention`` call runs with a block-diagonal boolean mask built from
``Batch.seq_ids`` (a position attends only to its own sequence), then the output is gathered back.
Why a mask and not a varlen split: measured once on the shared 2-core box (torch 2.13), one masked SDPA call took
0.27 s for 8 packed rows of 512 where nested (jagged) tensors took 1.9 s and a loop of per-sequence
SDPA calls 2.4 s (fwd+bwd, 4 heads x 64); the mask costs L x L scores per row, but packed rows are
~95% full, and attention scores are a small part of the FLOPs (L / 6H of the projections: 8% at
H = 1024). A CUDA build may route the same call to a fused kernel; a flash varlen kernel would skip
even the masked blocks.

``unpad=False`` runs every per-token op on all B x L positions, as a plain padded implementation
does: the baseline of ``benchmarks/bert_packing.py``. Both give the same values on the real tokens.

**The MLM head runs only at the masked positions** (``Batch.mlm_index``: at most 76 of 512 tokens),
so its vocabulary-sized GEMM is ~15% of what a full-sequence head would cost.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .batch import Batch
from .facts import MAX_SEQ_LEN, VOCAB_PAD_MULTIPLE, VOCAB_SIZE, padded_vocab


@dataclass(frozen=True)
class ModelConfig:
    """Defaults: BERT-large as MLPerf trains it."""

    vocab_size: int = VOCAB_SIZE
    hidden: int = 1024
    layers: int = 24
    heads: int = 16
    intermediate: int = 4096
    max_position: int = MAX_SEQ_LEN
    type_vocab: int = 2
    hidden_dropout: float = 0.1
    attention_dropout: float = 0.1
    layer_norm_eps: float = 1e-12
    init_std: float = 0.02
    vocab_multiple: int = VOCAB_PAD_MULTIPLE

    @property
    def padded_vocab(self) -> int:
        return padded_vocab(self.vocab_size, self.vocab_multiple)

    def encoder_param_count(self) -> int:
        """Embeddings + encoder layers + pooler (what ``BertModel`` holds), by formula."""
        h, i, v = self.hidden, self.intermediate, self.padded_vocab
        embeddings = (v + self.max_position + self.type_vocab) * h + 2 * h
        layer = 4 * (h * h + h) + 2 * h + (h * i + i) + (i * h + h) + 2 * h
        return embeddings + self.layers * layer + (h * h + h)

    def param_count(self) -> int:
        """All trainable parameters of :class:`BertForPretraining` (decoder weight tied, so counted once)."""
        h = self.hidden
        return self.encoder_param_count() + (h * h + h) + 2 * h + self.padded_vocab + (2 * h + 2)


class Embeddings(nn.Module):
    def __init__(self, c: ModelConfig) -> None:
        super().__init__()
        self.word = nn.Embedding(c.padded_vocab, c.hidden)
        self.position = nn.Embedding(c.max_position, c.hidden)
        self.segment = nn.Embedding(c.type_vocab, c.hidden)
        self.norm = nn.LayerNorm(c.hidden, eps=c.layer_norm_eps)
        self.dropout = nn.Dropout(c.hidden_dropout)

    def forward(self, ids: torch.Tensor, segments: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.norm(self.word(ids) + self.position(positions) + self.segment(segments)))


class RowLayout:
    """Moves per-token tensors (N, C) to (B, L, C) rows and back; N = T real tokens or all B*L."""

    def __init__(self, batch: Batch, unpad: bool) -> None:
        self.b, self.l = batch.shape
        self.index = batch.token_index if unpad else None
        sid = batch.seq_ids
        same = (sid[:, :, None] == sid[:, None, :]) & (sid[:, None, :] >= 0)
        # a padding query attends to itself only (all-masked rows would give NaN); its output is unused
        self.mask = (same | torch.eye(self.l, dtype=torch.bool, device=sid.device))[:, None]

    def to_rows(self, x: torch.Tensor) -> torch.Tensor:
        if self.index is None:
            return x.view(self.b, self.l, -1)
        rows = x.new_zeros(self.b * self.l, x.shape[-1]).index_copy(0, self.index, x)
        return rows.view(self.b, self.l, -1)

    def from_rows(self, x: torch.Tensor) -> torch.Tensor:
        x = x.reshape(self.b * self.l, -1)
        return x if self.index is None else x.index_select(0, self.index)


class SelfAttention(nn.Module):
    """The reference's ``query``, ``key`` and ``value`` dense layers, each its own parameters (so LAMB
    computes a trust ratio and norms for each, as the reference's per-variable LAMB does); the forward
    runs one GEMM on their concatenated weights (a 3H x H copy, far smaller than the T x 3H activations
    three GEMMs would need concatenating or scattering three times)."""

    def __init__(self, c: ModelConfig) -> None:
        super().__init__()
        self.heads, self.head_dim = c.heads, c.hidden // c.heads
        self.query = nn.Linear(c.hidden, c.hidden)
        self.key = nn.Linear(c.hidden, c.hidden)
        self.value = nn.Linear(c.hidden, c.hidden)
        self.out = nn.Linear(c.hidden, c.hidden)
        self.attention_dropout = c.attention_dropout

    def forward(self, x: torch.Tensor, layout: RowLayout) -> torch.Tensor:
        proj = (self.query, self.key, self.value)
        qkv = F.linear(x, torch.cat([m.weight for m in proj]), torch.cat([m.bias for m in proj]))
        rows = layout.to_rows(qkv)  # (B, L, 3H): query | key | value
        b, l, _ = rows.shape
        q, k, v = rows.view(b, l, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=layout.mask,
                                           dropout_p=self.attention_dropout if self.training else 0.0)
        return self.out(layout.from_rows(o.transpose(1, 2)))


class EncoderLayer(nn.Module):
    def __init__(self, c: ModelConfig) -> None:
        super().__init__()
        self.attention = SelfAttention(c)
        self.attention_norm = nn.LayerNorm(c.hidden, eps=c.layer_norm_eps)
        self.ffn_in = nn.Linear(c.hidden, c.intermediate)
        self.ffn_out = nn.Linear(c.intermediate, c.hidden)
        self.ffn_norm = nn.LayerNorm(c.hidden, eps=c.layer_norm_eps)
        self.dropout = nn.Dropout(c.hidden_dropout)

    def forward(self, x: torch.Tensor, layout: RowLayout) -> torch.Tensor:
        x = self.attention_norm(x + self.dropout(self.attention(x, layout)))
        return self.ffn_norm(x + self.dropout(self.ffn_out(F.gelu(self.ffn_in(x)))))


class BertForPretraining(nn.Module):
    """``forward(batch) -> (mlm_logits (M, padded_vocab), nsp_logits (S, 2))``: one MLM row per
    predicted position and one NSP row per sequence, in the batch's order."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        if cfg.hidden % cfg.heads:
            raise ValueError(f"hidden {cfg.hidden} is not a multiple of heads {cfg.heads}")
        self.cfg = cfg
        self.embeddings = Embeddings(cfg)
        self.layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.layers))
        self.pooler = nn.Linear(cfg.hidden, cfg.hidden)
        self.mlm_transform = nn.Linear(cfg.hidden, cfg.hidden)
        self.mlm_norm = nn.LayerNorm(cfg.hidden, eps=cfg.layer_norm_eps)
        self.mlm_bias = nn.Parameter(torch.zeros(cfg.padded_vocab))
        self.nsp = nn.Linear(cfg.hidden, 2)
        self.apply(self._init)

    def _init(self, m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=self.cfg.init_std)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)
        if isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)

    def encode(self, batch: Batch, unpad: bool = True) -> torch.Tensor:
        """Hidden states (T, hidden) of the real tokens (``unpad=False``: (B*L, hidden), all positions)."""
        layout = RowLayout(batch, unpad)
        ids, seg, pos = (t.reshape(-1) for t in (batch.input_ids, batch.segment_ids, batch.position_ids))
        if unpad:
            ids, seg, pos = ids[batch.token_index], seg[batch.token_index], pos[batch.token_index]
        x = self.embeddings(ids, seg, pos)
        for layer in self.layers:
            x = layer(x, layout)
        return x

    def mlm_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Vocabulary logits of the given hidden states (the tied decoder)."""
        h = self.mlm_norm(F.gelu(self.mlm_transform(hidden)))
        return F.linear(h, self.embeddings.word.weight, self.mlm_bias)

    def nsp_logits(self, cls_hidden: torch.Tensor) -> torch.Tensor:
        return self.nsp(torch.tanh(self.pooler(cls_hidden)))

    def forward(self, batch: Batch, unpad: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.encode(batch, unpad)
        if unpad:
            mlm, cls = batch.mlm_index, batch.cls_index
        else:  # hidden states of all B*L positions: map T-order indices to flat positions
            mlm, cls = batch.mlm_index_flat, batch.token_index[batch.cls_index]
        return self.mlm_logits(x.index_select(0, mlm)), self.nsp_logits(x.index_select(0, cls))


def pretraining_loss(mlm_logits: torch.Tensor, nsp_logits: torch.Tensor, batch: Batch) -> torch.Tensor:
    """The reference's loss: mean cross entropy over predicted tokens + mean over sequences (NSP)."""
    return (F.cross_entropy(mlm_logits.float(), batch.mlm_labels)
            + F.cross_entropy(nsp_logits.float(), batch.nsp_labels))


def no_weight_decay(name: str) -> bool:
    """Parameters the reference's LAMB exempts from weight decay: biases and LayerNorm weights."""
    return name.endswith("bias") or name.rsplit(".", 1)[0].endswith("norm")
