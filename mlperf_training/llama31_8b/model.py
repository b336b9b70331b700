"""Llama 3.1 in plain torch: token embedding, ``layers`` pre-norm decoder blocks (RMSNorm, grouped-query attention
with rotary position embeddings and the Llama 3.1 frequency scaling, SDPA causal attention, SwiGLU feed-forward),
a final RMSNorm and an untied output projection. :data:`LLAMA31_8B` is the MLPerf model (32 layers, hidden 4096,
32 query / 8 key-value heads, feed-forward 14336, vocabulary 128,256, RoPE theta 500,000): 8,030,261,248
parameters.

The modules are written for tensor parallelism (``parallelize.py``): attention infers its head count from the
width of its projections' outputs, so a rank that holds a column shard of ``wq``/``wk``/``wv`` runs its own
heads (consecutive query heads share consecutive key-value heads, so any degree that divides the key-value heads
keeps each query head with its key-value head).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int = 128256
    dim: int = 4096
    layers: int = 32
    heads: int = 32
    kv_heads: int = 8
    ffn_dim: int = 14336
    norm_eps: float = 1e-5
    rope_theta: float = 500000.0
    # Llama 3.1 frequency scaling of RoPE (Meta's reference and Hugging Face's "llama3" rope_type)
    rope_scaling: bool = True
    rope_factor: float = 8.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_context: int = 8192
    init_std: float = 0.02

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads

    def validate(self) -> None:
        if self.dim % self.heads or self.heads % self.kv_heads:
            raise ValueError(f"dim {self.dim}, heads {self.heads}, kv_heads {self.kv_heads}: heads must divide dim "
                             "and kv_heads must divide heads")
        if self.head_dim % 2:
            raise ValueError(f"head dimension {self.head_dim} must be even (rotary pairs)")


LLAMA31_8B = LlamaConfig()


def parameter_count(cfg: LlamaConfig) -> int:
    """Closed form: embedding + output + per layer (attention, feed-forward, two norms) + final norm."""
    kv = cfg.kv_heads * cfg.head_dim
    per_layer = 2 * cfg.dim * cfg.dim + 2 * cfg.dim * kv + 3 * cfg.dim * cfg.ffn_dim + 2 * cfg.dim
    return 2 * cfg.vocab_size * cfg.dim + cfg.layers * per_layer + cfg.dim


def rope_frequencies(cfg: LlamaConfig) -> torch.Tensor:
    """Inverse frequencies of the rotary pairs, float64, with Llama 3.1's scaling: wavelengths shorter than
    ``original / high_freq_factor`` kept, longer than ``original / low_freq_factor`` divided by ``factor``, and a
    smooth interpolation between."""
    hd = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    if not cfg.rope_scaling:
        return inv
    low_wavelen = cfg.rope_original_context / cfg.rope_low_freq_factor
    high_wavelen = cfg.rope_original_context / cfg.rope_high_freq_factor
    wavelen = 2 * math.pi / inv
    smooth = (cfg.rope_original_context / wavelen - cfg.rope_low_freq_factor) / (
        cfg.rope_high_freq_factor - cfg.rope_low_freq_factor)
    mid = (1 - smooth) * inv / cfg.rope_factor + smooth * inv
    out = torch.where(wavelen > low_wavelen, inv / cfg.rope_factor, mid)
    return torch.where(wavelen < high_wavelen, inv, out)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding in the half-split layout (Megatron/NeMo, Hugging Face): x is (B, H, S, D)."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return y.type_as(x) * self.weight


class Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        hd, kv = cfg.head_dim, cfg.kv_heads * cfg.head_dim
        self.head_dim, self.groups = hd, cfg.heads // cfg.kv_heads
        self.wq = nn.Linear(cfg.dim, cfg.heads * hd, bias=False)
        self.wk = nn.Linear(cfg.dim, kv, bias=False)
        self.wv = nn.Linear(cfg.dim, kv, bias=False)
        self.wo = nn.Linear(cfg.heads * hd, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        hd = self.head_dim
        q = self.wq(x).view(b, s, -1, hd).transpose(1, 2)  # heads held here: all, or this rank's shard
        k = self.wk(x).view(b, s, -1, hd).transpose(1, 2)
        v = self.wv(x).view(b, s, -1, hd).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        if self.groups > 1:
            k = k.repeat_interleave(self.groups, dim=1)
            v = v.repeat_interleave(self.groups, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)  # gate
        self.w3 = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)  # up
        self.w2 = nn.Linear(cfg.ffn_dim, cfg.dim, bias=False)  # down

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attention = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.feed_forward = FeedForward(cfg)
        self.checkpointed = False  # activation checkpointing (parallelize.py): recompute the block in backward

    def _forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), cos, sin)
        return h + self.feed_forward(self.ffn_norm(h))

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        if self.checkpointed and torch.is_grad_enabled():
            from torch.utils.checkpoint import checkpoint

            return checkpoint(self._forward, x, cos, sin, use_reentrant=False)
        return self._forward(x, cos, sin)


class Llama(nn.Module):
    """``forward(tokens (B, S) int64) -> logits (B, S, vocab)``."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        self.register_buffer("inv_freq", rope_frequencies(cfg).float(), persistent=False)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """Normal(0, init_std) weights, the residual outputs (``wo``, ``w2``) scaled by 1/sqrt(2 x layers)
        (Megatron's scaled init), norms 1; the rotary frequencies again (a model built on the meta device)."""
        cfg = self.cfg
        if self.inv_freq.device.type != "meta":
            self.inv_freq.copy_(rope_frequencies(cfg).to(self.inv_freq.dtype))
        std, out_std = cfg.init_std, cfg.init_std / math.sqrt(2 * cfg.layers)
        nn.init.normal_(self.tok_embeddings.weight, std=std)
        nn.init.normal_(self.output.weight, std=std)
        for block in self.layers:
            for lin in (block.attention.wq, block.attention.wk, block.attention.wv, block.feed_forward.w1,
                        block.feed_forward.w3):
                nn.init.normal_(lin.weight, std=std)
            nn.init.normal_(block.attention.wo.weight, std=out_std)
            nn.init.normal_(block.feed_forward.w2.weight, std=out_std)
            block.attention_norm.weight.fill_(1.0)
            block.ffn_norm.weight.fill_(1.0)
        self.norm.weight.fill_(1.0)

    def rotary(self, seq_len: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        pos = torch.arange(seq_len, device=self.inv_freq.device, dtype=torch.float32)
        angles = torch.outer(pos, self.inv_freq.float())
        angles = torch.cat((angles, angles), dim=-1)
        return angles.cos().to(dtype), angles.sin().to(dtype)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        cos, sin = self.rotary(tokens.shape[1], h.dtype if h.dtype != torch.bfloat16 else torch.float32)
        for block in self.layers:
            h = block(h, cos, sin)
        return self.output(self.norm(h))


def token_nll_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Summed next-token cross entropy (nats), in fp32 at least."""
    lf = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    return F.cross_entropy(lf.reshape(-1, lf.shape[-1]), labels.reshape(-1), reduction="sum")
