"""How fast a small BERT learns the synthetic language: masked-LM accuracy vs steps, beside the trivial
predictor (most frequent masked word) and the oracle (the chain known), measured on the same eval set.

For choosing a ``mini`` target: a target must sit well above the trivial baseline and below what a
small model reaches in the preset's time. Trains on packed rows with LAMB on the flat buffer (linear
warmup over 10 steps); prints eval accuracy every ``--eval-every`` steps as it goes; ``--budget-s``
stops training (said) when the time left cannot hold another eval interval.

    python -m benchmarks.bert_learn [--vocab 200 --seq-len 64 --hidden 128 --steps 400] [--budget-s 120]
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from hpcbench.common.flat import FlatParams
from hpcbench.common.optim import LAMB
from hpcbench.common.runconfig import OptimConfig
from hpcbench.workloads.mlperf_training.bert import packing, synth
from hpcbench.workloads.mlperf_training.bert.batch import collate
from hpcbench.workloads.mlperf_training.bert.metric import eval_accuracy, mlm_accuracy_sums
from hpcbench.workloads.mlperf_training.bert.model import BertForPretraining, ModelConfig, pretraining_loss

from benchmarks.budget import Budget, add_budget_argument, say
from benchmarks.machine import describe, header


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, default=200)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--rows", type=int, default=32, help="packed rows per step")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--eval-every", type=int, default=40)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's choice)")
    add_budget_argument(ap, 120.0)
    args = ap.parse_args()
    budget = Budget(args.budget_s)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    say(header(describe()))
    max_pred = max(1, round(0.15 * args.seq_len))
    lang = synth.Language(vocab_size=args.vocab, seed=0)
    train = packing.pack(synth.generate(lang, 4096, seed=1, max_seq_len=args.seq_len, max_pred=max_pred), args.seq_len)
    held = synth.generate(lang, 512, seed=2, max_seq_len=args.seq_len, max_pred=max_pred)
    say(f"eval set: {held.num_sequences()} sequences, {sum(len(p) for p in held.masked_lm_positions)} predicted "
        f"tokens; trivial (most frequent word) {synth.most_frequent_accuracy(held):.3f}, "
        f"oracle (chain known) {synth.oracle_accuracy(lang, held):.3f}")
    cfg = ModelConfig(vocab_size=args.vocab, hidden=args.hidden, layers=args.layers, heads=args.heads,
                      intermediate=2 * args.hidden, max_position=args.seq_len, hidden_dropout=0.0,
                      attention_dropout=0.0)
    torch.manual_seed(0)
    model = BertForPretraining(cfg)
    flat = FlatParams(model)
    opt = LAMB(flat, OptimConfig(name="lamb", lr=args.lr, weight_decay=0.01, max_grad_norm=1.0, eps=1e-6))
    say(f"model: {cfg.layers} layers, hidden {cfg.hidden}, {flat.numel / 1e6:.2f}M parameters; {args.rows} packed rows "
        f"of {args.seq_len} per step ({len(train)} rows of {train.num_sequences()} sequences), LAMB lr {args.lr}; "
        f"torch threads {torch.get_num_threads()}")
    eval_batch = collate(held, args.seq_len)
    rng = np.random.default_rng(0)
    t0, chunk_s = time.perf_counter(), 0.0
    for step in range(1, args.steps + 1):
        batch = collate(train.select(rng.integers(0, len(train), args.rows)), args.seq_len)
        flat.zero_grad()
        loss = pretraining_loss(*model(batch), batch)
        loss.backward()
        flat.check_grads()
        opt.step(torch.tensor(args.lr * min(1.0, step / 10)))
        if step % args.eval_every == 0 or step == args.steps:
            with torch.no_grad():
                model.eval()
                mlm, nsp = model(eval_batch)
                model.train()
            acc = eval_accuracy(mlm_accuracy_sums(mlm, eval_batch.mlm_labels))
            nsp_acc = float((nsp.argmax(1) == eval_batch.nsp_labels).double().mean())
            elapsed = time.perf_counter() - t0
            say(f"  step {step:4d} ({elapsed:5.1f} s): loss {loss.item():.3f}, eval masked-LM accuracy {acc:.3f}, "
                f"next-sentence accuracy {nsp_acc:.3f}")
            chunk_s = elapsed / step * args.eval_every
            if step < args.steps and budget.left() < chunk_s:
                budget.skip(f"steps {step + 1}-{args.steps} (one eval interval needs ~{chunk_s:.0f} s)")
                break
    budget.done()


if __name__ == "__main__":
    main()
