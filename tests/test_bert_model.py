"""BERT model: the reference parameter count (meta device), packed == unpacked per sequence (float64),
the masked-only MLM head == the full head at those positions, the accuracy metric, LAMB on the flat
buffer (one step on 2 ranks under mpiexec equals single-process LAMB)."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from hpcbench.common.flat import FlatParams
from hpcbench.common.optim import LAMB
from hpcbench.common.runconfig import OptimConfig
from hpcbench.workloads.mlperf_training.bert import packing, synth
from hpcbench.workloads.mlperf_training.bert.batch import collate
from hpcbench.workloads.mlperf_training.bert.metric import eval_accuracy, mlm_accuracy_sums
from hpcbench.workloads.mlperf_training.bert.model import (BertForPretraining, ModelConfig, RowLayout, no_weight_decay,
                                                           pretraining_loss)
from tests.conftest import run_mpi

L, P, V = 64, 10, 400
TINY = ModelConfig(vocab_size=V, hidden=32, layers=2, heads=4, intermediate=64, max_position=L,
                   hidden_dropout=0.0, attention_dropout=0.0)


def test_bert_large_parameter_count_on_meta_device() -> None:
    cfg = ModelConfig()
    assert (cfg.layers, cfg.hidden, cfg.heads, cfg.intermediate, cfg.max_position) == (24, 1024, 16, 4096, 512)
    assert cfg.padded_vocab == 30528  # 30522 rounded up to a multiple of 8, as NVIDIA's implementation
    with torch.device("meta"):
        model = BertForPretraining(cfg)
        unpadded = BertForPretraining(ModelConfig(vocab_multiple=1))
    total = sum(p.numel() for p in model.parameters())  # the tied decoder weight counted once
    assert total == cfg.param_count() == 336_232_258
    # embeddings + encoder + pooler at the unpadded vocabulary: the published 335,141,888 of bert-large-uncased
    encoder = sum(p.numel() for n, p in unpadded.named_parameters() if n.split(".")[0] in ("embeddings", "layers",
                                                                                           "pooler"))
    assert encoder == ModelConfig(vocab_multiple=1).encoder_param_count() == 335_141_888


def test_query_key_value_are_three_lamb_tensors_and_the_output_is_that_of_one_fused_projection() -> None:
    """The reference's query/key/value are three variables, so LAMB computes three trust ratios: three
    tensors of the flat buffer (same parameter count); the forward equals the former fused ``qkv`` layer
    (one (3H, H) projection, rows query | key | value) holding the same weights."""
    flat = FlatParams(BertForPretraining(TINY))  # what build_optimizer hands LAMB (fp32)
    names = [n for n in flat.names if n.startswith("layers.0.attention.")]
    qkv = ("query", "key", "value")
    assert names == [f"layers.0.attention.{n}.{w}" for n in (*qkv, "out") for w in ("weight", "bias")]
    assert flat.num_tensors == len(list(BertForPretraining(TINY).parameters())) and flat.numel == TINY.param_count()
    h = TINY.hidden
    assert all(flat.numels[flat.names.index(f"layers.1.attention.{n}.weight")] == h * h for n in qkv)
    # LAMB's segments (one norm pair and one trust ratio each): query, key and value weights are three
    starts = torch.cumsum(LAMB(flat, OptimConfig(name="lamb")).lengths, 0).tolist()
    for n in qkv:
        i = flat.names.index(f"layers.0.attention.{n}.weight")
        assert flat.offsets[i] in [0, *starts] and flat.offsets[i] + h * h in starts
    model = _model()  # float64 for the comparison
    # the fused projection written out: one GEMM of the concatenated weights, split per head as before
    att = model.layers[0].attention
    fused = torch.nn.Linear(h, 3 * h).double()
    with torch.no_grad():
        for seed, n in enumerate(qkv):  # distinct non-zero biases, so their order is checked too
            getattr(att, n).bias.normal_(generator=torch.Generator().manual_seed(seed))
        fused.weight.copy_(torch.cat([att.query.weight, att.key.weight, att.value.weight]))
        fused.bias.copy_(torch.cat([att.query.bias, att.key.bias, att.value.bias]))
    packed, _ = _sequences()
    batch = collate(packed, L)
    x = torch.randn(batch.num_tokens(), h, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    layout = RowLayout(batch, True)
    rows = layout.to_rows(fused(x))
    b, l, _ = rows.shape
    q, k, v = rows.view(b, l, 3, TINY.heads, h // TINY.heads).permute(2, 0, 3, 1, 4)
    o = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=layout.mask)
    expected = att.out(layout.from_rows(o.transpose(1, 2)))
    torch.testing.assert_close(att(x, layout), expected, rtol=0, atol=1e-12)
    # and per head, query/key/value each come from their own layer: Q = x W_q^T + b_q
    q_rows = layout.to_rows(att.query(x)).view(b, l, TINY.heads, h // TINY.heads).transpose(1, 2)
    torch.testing.assert_close(q_rows, q, rtol=0, atol=1e-12)
    # gradients reach the three parameters separately
    model.zero_grad()
    pretraining_loss(*model(batch), batch).backward()
    assert all(getattr(att, n).weight.grad.abs().max() > 0 for n in qkv)


def _model() -> BertForPretraining:
    torch.manual_seed(0)
    return BertForPretraining(TINY).double()


def _sequences(n: int = 14) -> tuple:
    rows = synth.generate(synth.Language(vocab_size=V, seed=1), n, seed=2, max_seq_len=L, max_pred=P)
    packed = packing.pack(rows, L, 3)
    return packed, packing.unpack(packed)  # unpack keeps the packed order: outputs line up


def test_packed_equals_unpacked_per_sequence() -> None:
    packed, single = _sequences()
    assert len(packed) < len(single)
    model = _model()
    pb, sb = collate(packed, L), collate(single, L)
    assert torch.equal(pb.mlm_labels, sb.mlm_labels) and torch.equal(pb.nsp_labels, sb.nsp_labels)
    mlm_p, nsp_p = model(pb)  # packed rows, real tokens only
    mlm_s, nsp_s = model(sb, unpad=False)  # one sequence per padded row, every position computed
    assert mlm_p.shape == (pb.mlm_labels.numel(), TINY.padded_vocab) and nsp_p.shape == (len(single), 2)
    torch.testing.assert_close(mlm_p, mlm_s, rtol=0, atol=1e-11)
    torch.testing.assert_close(nsp_p, nsp_s, rtol=0, atol=1e-11)
    mlm_pp, nsp_pp = model(pb, unpad=False)  # packed rows with padding computed too
    torch.testing.assert_close(mlm_pp, mlm_p, rtol=0, atol=1e-11)
    torch.testing.assert_close(nsp_pp, nsp_p, rtol=0, atol=1e-11)
    # same loss, same gradients: packing changes nothing but the work
    grads = []
    for batch, unpad in ((pb, True), (sb, False)):
        model.zero_grad()
        pretraining_loss(*model(batch, unpad=unpad), batch).backward()
        grads.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]))
    torch.testing.assert_close(grads[0], grads[1], rtol=0, atol=1e-11)
    assert grads[0].abs().max() > 1e-3


def test_sequences_in_one_row_do_not_see_each_other() -> None:
    packed, _ = _sequences()
    r = next(i for i, s in enumerate(packed.seq_lens) if len(s) >= 2)
    model = _model()
    before = model(collate(packed.select([r]), L))
    first = int(packed.seq_lens[r][0])
    changed = packed.select([r])
    changed.input_ids[0] = changed.input_ids[0].copy()
    changed.input_ids[0][first + 1 :] = (changed.input_ids[0][first + 1 :] + 7) % V  # edit later sequences
    after = model(collate(changed, L))
    m0 = int(packed.masked_lens[r][0])
    torch.testing.assert_close(after[0][:m0], before[0][:m0], rtol=0, atol=1e-12)
    torch.testing.assert_close(after[1][0], before[1][0], rtol=0, atol=1e-12)
    assert not torch.allclose(after[0][m0:], before[0][m0:])


def test_masked_only_head_equals_full_head() -> None:
    packed, _ = _sequences()
    model = _model()
    batch = collate(packed, L)
    hidden = model.encode(batch)
    assert hidden.shape == (batch.num_tokens(), TINY.hidden)
    full = model.mlm_logits(hidden)  # every real token
    mlm, _ = model(batch)
    torch.testing.assert_close(mlm, full[batch.mlm_index], rtol=0, atol=1e-12)


def test_mlm_accuracy_counts_positions_over_the_whole_set() -> None:
    logits = torch.zeros(5, 4)
    logits[torch.arange(5), torch.tensor([1, 2, 3, 0, 0])] = 1.0
    a = mlm_accuracy_sums(logits[:2], torch.tensor([1, 0]))  # 1 of 2
    b = mlm_accuracy_sums(logits[2:], torch.tensor([3, 0, 0]))  # 3 of 3
    assert a.tolist() == [1.0, 2.0] and b.tolist() == [3.0, 3.0]
    assert eval_accuracy(a + b) == pytest.approx(0.8)  # positions, not the mean of batch accuracies (0.75)
    with pytest.raises(ValueError, match="no predicted positions"):
        eval_accuracy(torch.zeros(2))


def test_weight_decay_exemptions_are_biases_and_layer_norms() -> None:
    names = [n for n, _ in BertForPretraining(TINY).named_parameters()]
    exempt = {n for n in names if no_weight_decay(n)}
    assert "mlm_bias" in exempt and "embeddings.norm.weight" in exempt and "layers.1.ffn_norm.weight" in exempt
    assert {"layers.0.attention.query.bias", "layers.0.attention.key.bias", "layers.0.attention.value.bias"} <= exempt
    assert not exempt & {"embeddings.word.weight", "layers.0.attention.query.weight", "layers.0.attention.key.weight",
                         "layers.0.attention.value.weight", "layers.1.ffn_in.weight", "pooler.weight", "nsp.weight"}
    assert all(n.endswith("weight") and ("norm" in n) for n in exempt if not n.endswith("bias"))


def test_flat_buffer_holds_bert_and_lamb_steps() -> None:
    torch.manual_seed(0)
    model = BertForPretraining(TINY)
    flat = FlatParams(model)
    assert flat.numel == TINY.param_count()  # tied decoder: one copy in the buffer
    packed, _ = _sequences()
    batch = collate(packed, L)
    opt = LAMB(flat, OptimConfig(name="lamb", lr=0.05, weight_decay=0.01, max_grad_norm=1.0, eps=1e-6))
    losses = []
    for _ in range(8):
        flat.zero_grad()
        loss = pretraining_loss(*model(batch), batch)
        loss.backward()
        flat.check_grads()
        opt.step(torch.tensor(0.05))
        losses.append(loss.item())
    # the same batch every step: LAMB on the flat buffer fits it
    assert losses[-1] < losses[0] - 0.5 and losses == sorted(losses, reverse=True), losses


@pytest.mark.mpi
def test_distributed_lamb_step_on_two_ranks_equals_single_process_lamb() -> None:
    proc = run_mpi(2, ["tests/mpi_scripts/bert_lamb.py"], timeout=180)
    rows = next(json.loads(x) for x in proc.stdout.splitlines() if x.startswith("[{"))
    assert sorted(r["rank"] for r in rows) == [0, 1]
    for r in rows:
        assert r["moved"] > 1e-3  # the step changed the weights
        assert r["max_diff"] < 2e-6, r
        assert r["state"] <= r["ref_state"] / 2 + 4  # each rank holds half of LAMB's moments
        assert np.isfinite(r["loss"])
