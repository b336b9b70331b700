"""BERT training throughput, packed vs padded rows: real (non-padding) tokens per second.

The same pool of synthetic sequences (``hpcbench.workloads.mlperf_training.bert.synth``: lengths like the reference
data, mean ~255 of 512) is batched two ways, ``--rows`` rows of ``--seq-len`` per step:

* ``padded`` (baseline): one sequence per row, every op on all rows x seq-len positions (attention
  masks the padding keys), as a padded implementation computes;
* ``packed``: up to 3 sequences per row (best-fit packing), per-token ops on the real tokens only,
  block-diagonal attention per row (``hpcbench.workloads.mlperf_training.bert.model``);
* ``padded+unpad`` (with ``--unpad-variant``): padded rows, but per-token ops on real tokens only:
  what unpadding alone gives without packing.

A step is forward, loss, backward and a LAMB step on the flat parameter buffer (``hpcbench.common.optim``).
Each variant gets ``--batches`` fixed batches (the padded ones hold the first sequences of the pool,
the packed ones rows of the whole pool, shuffled). A round runs every variant on each of its batches,
interleaved (so machine contention hits all of them); after a warm-up round, ``--repeats`` rounds are
timed and each (variant, batch) keeps its fastest time: on a shared machine other load only ever adds
time. Throughput = real tokens of the batches / sum of their fastest times; the ratio to the padded
baseline is printed (goal of issue 14: >= 1.5x). Prints every step as it runs; ``--budget-s`` bounds
the run: rounds stop when the time left cannot hold another round (said).

    python -m benchmarks.bert_packing [--layers 4 --hidden 256 --rows 8 --batches 3 --repeats 3] [--budget-s 300]
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
from hpcbench.workloads.mlperf_training.bert.batch import Batch, collate
from hpcbench.workloads.mlperf_training.bert.facts import MAX_PRED, MAX_SEQ_PER_ROW, VOCAB_SIZE
from hpcbench.workloads.mlperf_training.bert.format import Rows
from hpcbench.workloads.mlperf_training.bert.model import BertForPretraining, ModelConfig, pretraining_loss

from benchmarks.budget import Budget, add_budget_argument, say
from benchmarks.machine import describe, header


def batches(rows: Rows, per_step: int, seq_len: int, steps: int) -> list[Batch]:
    return [collate(rows.select(range(s * per_step, (s + 1) * per_step)), seq_len) for s in range(steps)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--intermediate", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=VOCAB_SIZE)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--rows", type=int, default=8, help="rows per step (the same for both layouts)")
    ap.add_argument("--batches", type=int, default=3, help="fixed batches per variant")
    ap.add_argument("--repeats", type=int, default=3, help="timed rounds over the batches (at most; +1 warm-up)")
    ap.add_argument("--unpad-variant", action="store_true", help="also time padded rows with unpadded compute")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's choice)")
    ap.add_argument("--seed", type=int, default=0)
    add_budget_argument(ap, 300.0)
    args = ap.parse_args()
    budget = Budget(args.budget_s)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    say(header(describe()))

    steps = args.batches
    max_pred = min(MAX_PRED, max(1, round(0.15 * args.seq_len)))
    lang = synth.Language(vocab_size=args.vocab, seed=args.seed)
    # enough sequences for the padded batches; packed, they fill about half as many rows
    pool = synth.generate(lang, args.rows * steps * 5 // 2, seed=args.seed, max_seq_len=args.seq_len, max_pred=max_pred)
    packed = packing.pack(pool, args.seq_len, MAX_SEQ_PER_ROW)
    order = np.random.default_rng(args.seed).permutation(len(packed))  # packing sorts by length: shuffle rows
    packed = packed.select(order)
    if len(packed) < args.rows * steps:
        raise SystemExit(f"{len(packed)} packed rows, {args.rows * steps} needed: raise the pool")
    variants = {"padded": (batches(pool, args.rows, args.seq_len, steps), False),
                "packed": (batches(packed, args.rows, args.seq_len, steps), True)}
    if args.unpad_variant:
        variants["padded+unpad"] = (variants["padded"][0], True)
    lengths = np.array([len(t) for t in pool.input_ids])
    say(f"pool of {len(pool)} sequences: mean length {lengths.mean():.1f} of {args.seq_len} "
        f"(median {np.median(lengths):.0f}, "
        f"{(lengths == args.seq_len).mean():.0%} full); rows filled: padded {lengths.mean() / args.seq_len:.1%}, "
        f"packed {packed.num_tokens() / (len(packed) * args.seq_len):.1%} ({packed.num_sequences() / len(packed):.2f} "
        f"sequences/row)")

    cfg = ModelConfig(vocab_size=args.vocab, hidden=args.hidden, layers=args.layers, heads=args.heads,
                      intermediate=args.intermediate, max_position=args.seq_len)
    torch.manual_seed(args.seed)
    model = BertForPretraining(cfg)
    flat = FlatParams(model)
    opt = LAMB(flat, OptimConfig(name="lamb", lr=1e-4, weight_decay=0.01, max_grad_norm=1.0, eps=1e-6))
    lr = torch.tensor(1e-4)
    say(f"model: {cfg.layers} layers, hidden {cfg.hidden}, {cfg.heads} heads, intermediate {cfg.intermediate}, "
        f"vocab {cfg.padded_vocab} ({flat.numel / 1e6:.1f}M parameters); {args.rows} rows x {args.seq_len} per step; "
        f"torch threads {torch.get_num_threads()}")

    def step(batch: Batch, unpad: bool) -> float:
        t0 = time.perf_counter()
        flat.zero_grad()
        loss = pretraining_loss(*model(batch, unpad=unpad), batch)
        loss.backward()
        flat.check_grads()
        opt.step(lr)
        return time.perf_counter() - t0

    best: dict[str, list[float]] = {k: [float("inf")] * steps for k in variants}
    round_s, timed = 0.0, 0
    for rnd in range(args.repeats + 1):
        if rnd > 1 and budget.left() < round_s:
            budget.skip(f"rounds {rnd}-{args.repeats} of {args.repeats} (one round needs ~{round_s:.0f} s)")
            break
        this_round = 0.0
        for s in range(steps):
            line = []
            for name, (bs, unpad) in variants.items():
                dt = step(bs[s], unpad)
                this_round += dt
                if rnd:
                    best[name][s] = min(best[name][s], dt)
                line.append(f"{name} {dt:6.2f} s")
            say(f"  {'warm-up' if rnd == 0 else f'round {rnd}'} batch {s}: " + "; ".join(line))
        timed += rnd > 0
        round_s = this_round if rnd <= 1 else min(round_s, this_round)
    if not timed:
        say("no timed round fitted in the budget")
        budget.done()
        return
    rate = {k: sum(b.num_tokens() for b in variants[k][0]) / sum(v) for k, v in best.items()}
    say(f"real tokens/s (tokens of the {steps} batches / sum of each batch's fastest of {timed} timed rounds):")
    for name, r in rate.items():
        tokens = sum(b.num_tokens() for b in variants[name][0])
        say(f"  {name:13s} {tokens:6d} tokens in {sum(best[name]):6.2f} s = {r:7.0f} tok/s   "
            f"ratio to padded {r / rate['padded']:.2f}x")
    per_row = {k: sum(b.num_tokens() for b in variants[k][0]) / (steps * args.rows) for k in ("padded", "packed")}
    say(f"real tokens per row in these batches: padded {per_row['padded']:.0f}, packed {per_row['packed']:.0f} "
        f"(ratio {per_row['packed'] / per_row['padded']:.2f}: the throughput ratio if a row cost the same)")
    say(f"packed / padded = {rate['packed'] / rate['padded']:.2f}x (goal >= 1.5x)")
    budget.done()


if __name__ == "__main__":
    main()
