"""llama31_8b model: the full model's parameter count on the meta device, the Llama 3.1 RoPE frequency scaling,
causality and GQA of a tiny model, and the loss of an untrained model near ln(vocab)."""
from __future__ import annotations

import math

import torch

from hpcbench.workloads.mlperf_training.llama31_8b.model import (LLAMA31_8B, Llama, LlamaConfig, parameter_count,
                                                                 rope_frequencies, token_nll_sum)

TINY = LlamaConfig(vocab_size=97, dim=32, layers=2, heads=4, kv_heads=2, ffn_dim=48)


def test_full_model_has_8_030_261_248_parameters_on_the_meta_device() -> None:
    with torch.device("meta"):
        model = Llama(LLAMA31_8B)
    n = sum(p.numel() for p in model.parameters())
    assert n == parameter_count(LLAMA31_8B) == 8_030_261_248
    assert model.output.weight is not model.tok_embeddings.weight  # untied
    a = model.layers[0].attention
    assert (a.wq.weight.shape, a.wk.weight.shape, model.layers[0].feed_forward.w1.weight.shape) == (
        (4096, 4096), (1024, 4096), (14336, 4096))


def test_llama31_rope_scaling() -> None:
    inv = rope_frequencies(LLAMA31_8B)
    plain = 1.0 / (500000.0 ** (torch.arange(0, 128, 2, dtype=torch.float64) / 128))
    wavelen = 2 * math.pi / plain
    high = wavelen < 8192 / 4  # short wavelengths kept
    low = wavelen > 8192 / 1  # long ones divided by 8
    assert torch.equal(inv[high], plain[high]) and torch.allclose(inv[low], plain[low] / 8)
    mid = ~(high | low)
    assert mid.any() and bool(((inv[mid] < plain[mid]) & (inv[mid] > plain[mid] / 8)).all())


def test_tiny_model_is_causal_and_starts_near_uniform() -> None:
    torch.manual_seed(0)
    model = Llama(TINY).double()
    x = torch.randint(0, 97, (2, 12))
    y = model(x)
    x2 = x.clone()
    x2[:, 8:] = (x2[:, 8:] + 1) % 97
    y2 = model(x2)
    assert torch.allclose(y[:, :8], y2[:, :8]) and not torch.allclose(y[:, 8:], y2[:, 8:])
    nll = token_nll_sum(y[:, :-1], x[:, 1:]) / x[:, 1:].numel()
    assert abs(float(nll) - math.log(97)) < 0.1


def test_init_follows_the_plan_and_a_meta_built_model_equals_the_whole_one() -> None:
    """Llama(cfg) draws only init_weights' values (its submodules are built on the meta device), so build_sharded
    on one process - meta, to_empty, init - equals it after the same seed, in float64 too; the plan's stds hold."""
    from hpcbench.workloads.mlperf_training.llama31_8b.parallelize import build_sharded

    torch.manual_seed(3)
    whole = Llama(TINY)
    torch.manual_seed(3)
    meta = build_sharded(TINY, None, "cpu", dtype=torch.float64)
    for (n, p), (m, q) in zip(whole.state_dict().items(), meta.state_dict().items()):
        assert n == m and q.dtype == torch.float64 and torch.equal(p.double(), q), n
    assert torch.equal(whole.inv_freq, meta.inv_freq.float())
    plan = whole.init_plan()
    assert len(plan) == len(list(whole.parameters()))
    for p, std in plan:
        if std is None:
            assert bool((p == 1).all())
        else:
            assert abs(float(p.std()) / std - 1) < 0.15 and abs(float(p.mean())) < 0.2 * std
    out_std = TINY.init_std / math.sqrt(2 * TINY.layers)
    assert dict((id(p), s) for p, s in plan)[id(whole.layers[0].feed_forward.w2.weight)] == out_std
    with torch.device("meta"):
        assert Llama(TINY).output.weight.is_meta
