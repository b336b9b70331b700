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
    """``forward(tokens (B, S) int64) -> logits (B, S, vocab)``.

    Built on the current default device (under ``with torch.device("meta")``: no storage, no random draws, for
    :func:`~.parallelize.build_sharded`); the submodules are always constructed on the meta device, so their own
    default initialisations draw nothing, and a model with storage is then initialised by :meth:`init_weights`
    alone: the values depend only on the generator's state, as those of a sharded model built from the meta
    device do."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        target = torch.get_default_device()
        with torch.device("meta"):
            self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
            self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
            self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
            self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
            self.register_buffer("inv_freq", torch.empty(cfg.head_dim // 2), persistent=False)
        if target.type != "meta":
            self.to_empty(device=target)
            self.init_weights()

    def init_plan(self) -> list[tuple[nn.Parameter, float | None]]:
        """Every parameter with its initialisation, in the order of the random draws: (parameter, std of a
        zero-mean normal) or (parameter, None) for ones. Normal(0, init_std) weights, the residual outputs (``wo``,
        ``w2``) scaled by 1/sqrt(2 x layers) (Megatron's scaled init), norms 1."""
        cfg = self.cfg
        std, out_std = cfg.init_std, cfg.init_std / math.sqrt(2 * cfg.layers)
        plan: list[tuple[nn.Parameter, float | None]] = [(self.tok_embeddings.weight, std), (self.output.weight, std)]
        for block in self.layers:
            a, f = block.attention, block.feed_forward
            plan += [(a.wq.weight, std), (a.wk.weight, std), (a.wv.weight, std), (f.w1.weight, std),
                     (f.w3.weight, std), (a.wo.weight, out_std), (f.w2.weight, out_std)]
            plan += [(block.attention_norm.weight, None), (block.ffn_norm.weight, None)]
        return plan + [(self.norm.weight, None)]

    @torch.no_grad()
    def init_weights(self, generator: torch.Generator | None = None) -> None:
        """Initialise every parameter as :meth:`init_plan` says, and the rotary frequencies again (a model built
        on the meta device). The values do not depend on where the model lives or how it is sharded: each
        parameter is drawn whole, in float32, from the CPU generator (``generator``, else the global one) in the
        plan's order, and each rank keeps the part it holds (a DTensor's local shard), so a model built on the
        meta device, sharded (FSDP2/TP) and materialised with ``to_empty`` gets the values of the whole-model
        init with the same seed. Parameters still on the meta device are skipped without drawing."""
        if self.inv_freq.device.type != "meta":
            self.inv_freq.copy_(rope_frequencies(self.cfg).to(self.inv_freq.dtype))
        for param, std in self.init_plan():
            init_parameter(param, std, generator)

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


def init_parameter(param: torch.Tensor, std: float | None, generator: torch.Generator | None = None) -> None:
    """``param`` = the whole tensor drawn on the CPU in float32 (N(0, std), or ones for ``std`` None), or this
    rank's part of it where ``param`` is a DTensor (FSDP2/TP shard): the draws are those of the whole tensor
    whichever part is kept, so every layout gets the same values. One parameter is whole at a time."""
    if param.device.type == "meta":
        return
    whole = torch.empty(tuple(param.shape), dtype=torch.float32)
    if std is None:
        whole.fill_(1.0)
    else:
        whole.normal_(0.0, std, generator=generator)
    from torch.distributed.tensor import DTensor

    if isinstance(param, DTensor):
        mine = local_part(whole, param)
        param.to_local().copy_(mine)
    else:
        param.copy_(whole)


def local_part(whole: torch.Tensor, like: "torch.distributed.tensor.DTensor") -> torch.Tensor:
    """This rank's part of ``whole`` laid out as ``like`` (its mesh and placements), without communication:
    the whole tensor replicated on every rank, redistributed to the placements (a local slice)."""
    from torch.distributed.tensor import DTensor, Replicate

    mesh = like.device_mesh
    rep = DTensor.from_local(whole.to(device=like.device, dtype=like.dtype), mesh, [Replicate()] * mesh.ndim,
                             run_check=False)
    return rep.redistribute(mesh, like.placements).to_local()


def token_nll_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Summed next-token cross entropy (nats), in fp32 at least."""
    lf = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    return F.cross_entropy(lf.reshape(-1, lf.shape[-1]), labels.reshape(-1), reduction="sum")
