"""Run under mpiexec: one training step of a tiny BERT with DistributedLAMB (each rank: half the batch,
gradients reduce-scattered, its shard of the moments) vs single-process LAMB on the averaged gradients
of both halves, both with the reference's weight-decay exemptions (biases, LayerNorm weights: a mask
over tensors split between the ranks' shards). Rank 0 prints one JSON line: a list with one result per rank."""
from __future__ import annotations

import json

import torch

from hpcbench.common.dist import init_distributed
from hpcbench.common.flat import FlatParams
from hpcbench.common.optim import LAMB, DistributedLAMB
from hpcbench.common.runconfig import OptimConfig
from hpcbench.workloads.mlperf_training.bert import packing, synth
from hpcbench.workloads.mlperf_training.bert.batch import collate
from hpcbench.workloads.mlperf_training.bert.model import BertForPretraining, ModelConfig, no_weight_decay, pretraining_loss

L, P, V = 64, 10, 400
CFG = ModelConfig(vocab_size=V, hidden=32, layers=2, heads=4, intermediate=64, max_position=L,
                  hidden_dropout=0.0, attention_dropout=0.0)


def build() -> tuple[BertForPretraining, FlatParams]:
    torch.manual_seed(0)
    model = BertForPretraining(CFG)
    return model, FlatParams(model)


def grads(model: BertForPretraining, flat: FlatParams, rows) -> float:  # noqa: ANN001
    batch = collate(rows, L)
    flat.zero_grad()
    loss = pretraining_loss(*model(batch), batch)
    loss.backward()
    flat.check_grads()
    return loss.item()


def main() -> None:
    env = init_distributed(device="cpu")
    world, rank = env.layout.instance_size, env.layout.instance_rank
    opt_cfg = OptimConfig(name="lamb", lr=0.01, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01, max_grad_norm=1.0,
                          distributed=True)
    rows = packing.pack(synth.generate(synth.Language(vocab_size=V, seed=1), 24, seed=3, max_seq_len=L,
                                       max_pred=P), L, 3)
    parts = [rows.select(range(r, len(rows), world)) for r in range(world)]
    lr = torch.tensor(opt_cfg.lr)

    model, flat = build()
    loss = grads(model, flat, parts[rank])
    exempt = [no_weight_decay(n) for n in flat.names]
    dist_opt = DistributedLAMB(flat, opt_cfg, world, rank, exempt)
    assert dist_opt.decay is not None
    dist_opt.step(lr)

    ref_model, ref_flat = build()
    start = ref_flat.params.clone()
    total = torch.zeros_like(ref_flat.grads)
    for part in parts:  # the gradients every rank computed, averaged, as the reduce-scatter does
        grads(ref_model, ref_flat, part)
        total += ref_flat.grads
    ref_flat.grads.copy_(total / world)
    ref_opt = LAMB(ref_flat, opt_cfg, decay_exempt=exempt)
    ref_opt.step(lr)
    mine = {"rank": rank, "loss": loss, "max_diff": (flat.params - ref_flat.params).abs().max().item(),
            "moved": (ref_flat.params - start).abs().max().item(), "state": dist_opt.state_numel(),
            "ref_state": ref_opt.state_numel()}
    every = env.instance_comm.gather(mine, root=0)
    if rank == 0:
        print(json.dumps(every), flush=True)
    env.close()


if __name__ == "__main__":
    main()
