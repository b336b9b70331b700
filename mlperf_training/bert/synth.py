"""A synthetic language with learnable structure, written as BERT pretraining samples.

Words are the ids ``[104, vocab_size)`` (below them: [PAD] 0, [UNK] 100, [CLS] 101, [SEP] 102,
[MASK] 103, as in bert-large-uncased's vocabulary). Text is a first-order Markov chain: every word
has ``successors`` (default 4) fixed next words chosen by the seed, taken with probabilities
0.5/0.25/0.15/0.10; with probability ``noise`` the next word is instead drawn from a Zipf
distribution over all words (also the distribution of the first word). So a masked word is
predictable from its neighbours (the left one names 4 candidates, the right one narrows them), and
a word's frequency alone predicts little.

Samples follow the reference's ``create_pretraining_data.py``: ``[CLS] A [SEP] B [SEP]``, segment 0
up to the first [SEP], 1 after; with probability 1/2 B is "random" (label 1: the chain restarts at
a fresh Zipf word, as a sentence from another document would) else it continues A (label 0), so
next-sentence prediction is learnable from the A/B junction. 15% of the tokens (at most
``max_pred``, [CLS]/[SEP] never) are predicted: 80% replaced by [MASK], 10% by a random word, 10%
kept; positions sorted.

Lengths (with [CLS] and both [SEP]): 10% of the samples fill ``max_seq_len`` (the reference's
generator aims 90% of its samples at the maximum, and long documents reach it); the rest are
``low + (max_seq_len - 1 - low) * Beta(1, 1.35)``, ``low = max(5, max_seq_len / 32)``: roughly the
uniform remainders of documents that end first, skewed a little short. At 512 the mean is about 255
tokens, as in the reference data (4.04e10 padding tokens over 156.7M sequences: mean 254), so padding
wastes half of a padded batch, and packing (:mod:`.packing`, up to 3 per row) fills rows to about
95% (NVIDIA's offline packer reaches 1.999 sequences per row on the real data; 1.9 here).

Baselines: :func:`most_frequent_accuracy` (always predict the most frequent masked word; the
trivial predictor a target must beat) and :func:`oracle_accuracy` (the best guess from the true
neighbours with the chain known: a ceiling a model cannot exceed by much).

Deterministic: sample ``i`` depends only on (language, seed, i): samples are made in chunks of
:data:`CHUNK` from a generator seeded with (seed, chunk), so any range can be made in any order.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from functools import cached_property, partial
from pathlib import Path
from typing import Any

import numpy as np

from hpcbench.common.data.datagen import Datagen, FileJob
from hpcbench.common.data.datagen import generate as generate_files
from hpcbench.common.errors import ConfigError, DataError

from . import packing
from .facts import CLS_ID, MASK_ID, MASKED_LM_PROB, MAX_PRED, MAX_SEQ_LEN, SEP_ID, VOCAB_SIZE
from .format import Rows, open_shard, write_packed, write_padded

FIRST_WORD = MASK_ID + 1
CHUNK = 256
SUCCESSOR_PROBS = (0.5, 0.25, 0.15, 0.10)
FULL_FRACTION, BETA_A, BETA_B = 0.10, 1.0, 1.35


@dataclass(frozen=True)
class Language:
    """The hidden grammar; ``vocab_size`` is the model's (unpadded) vocabulary."""

    vocab_size: int = VOCAB_SIZE
    seed: int = 0
    noise: float = 0.1
    zipf: float = 1.1

    def __post_init__(self) -> None:
        if self.vocab_size < FIRST_WORD + 2 * len(SUCCESSOR_PROBS):
            raise ConfigError(f"vocab_size {self.vocab_size} too small for the synthetic language: words start at "
                              f"id {FIRST_WORD}, at least {FIRST_WORD + 2 * len(SUCCESSOR_PROBS)} needed")
        if not 0 <= self.noise <= 1:
            raise ConfigError(f"noise must be in [0, 1], got {self.noise}")

    @property
    def words(self) -> int:
        return self.vocab_size - FIRST_WORD

    @cached_property
    def word_probs(self) -> np.ndarray:
        """Zipf over the words, in a seeded random order (so frequent words are not the low ids)."""
        rank = np.random.default_rng([self.seed, 1]).permutation(self.words)
        p = 1.0 / (rank + 1.0) ** self.zipf
        return p / p.sum()

    @cached_property
    def successors(self) -> np.ndarray:
        """(words, 4) word indices: the fixed next words of each word, distinct, chosen uniformly (so the
        chain's word frequencies stay fairly flat: Zipf enters only through starts and noise)."""
        rng = np.random.default_rng([self.seed, 2])
        k = len(SUCCESSOR_PROBS)
        out = rng.integers(0, self.words, (self.words, k))
        while True:  # redraw rows with a repeated successor
            s = np.sort(out, axis=1)
            bad = (s[:, 1:] == s[:, :-1]).any(axis=1)
            if not bad.any():
                return out
            out[bad] = rng.integers(0, self.words, (int(bad.sum()), k))

    @cached_property
    def top_words(self) -> np.ndarray:
        return np.argsort(-self.word_probs, kind="stable")[: 2 * len(SUCCESSOR_PROBS) + 1]

    @cached_property
    def predecessors(self) -> list[np.ndarray]:
        """For each word, the words that have it as a successor."""
        src = np.repeat(np.arange(self.words), self.successors.shape[1])
        dst = self.successors.reshape(-1)
        order = np.argsort(dst, kind="stable")
        return np.split(src[order], np.searchsorted(dst[order], np.arange(1, self.words)))

    def draw_words(self, rng: np.random.Generator, size: int | tuple[int, ...]) -> np.ndarray:
        return rng.choice(self.words, size=size, p=self.word_probs)

    def next_prob(self, prev: int, word: np.ndarray) -> np.ndarray:
        """P(word | prev) for word indices (prev < 0: the first word of a chain)."""
        p = self.word_probs[word] * (self.noise if prev >= 0 else 1.0)
        if prev >= 0:
            for j, q in enumerate(SUCCESSOR_PROBS):
                p = p + (1 - self.noise) * q * (self.successors[prev, j] == word)
        return p


def sample_lengths(rng: np.random.Generator, n: int, max_seq_len: int) -> np.ndarray:
    """Total lengths (with [CLS] and two [SEP]) of ``n`` samples: see the module docstring."""
    low = max(5, max_seq_len // 32)
    if max_seq_len < 6:
        raise ConfigError(f"max_seq_len must be at least 6 ([CLS] A [SEP] B [SEP] and room), got {max_seq_len}")
    body = low + np.round((max_seq_len - 1 - low) * rng.beta(BETA_A, BETA_B, n)).astype(np.int64)
    return np.where(rng.random(n) < FULL_FRACTION, max_seq_len, body)


def _chunk(lang: Language, seed: int, chunk: int, max_seq_len: int, max_pred: int) -> Rows:
    """CHUNK samples, made in lockstep (one numpy step per position across the chunk)."""
    rng = np.random.default_rng([seed, 7, chunk])
    n = CHUNK
    total = sample_lengths(rng, n, max_seq_len)
    body = total - 3
    a_len = rng.integers(1, body)  # body >= 2, so A and B get at least one word each
    random_next = rng.random(n) < 0.5
    width = int(body.max())
    words = np.empty((n, width), np.int64)
    words[:, 0] = lang.draw_words(rng, n)
    fresh = lang.draw_words(rng, (n, width))
    pick = np.searchsorted(np.cumsum(SUCCESSOR_PROBS), rng.random((n, width)) * sum(SUCCESSOR_PROBS))
    noisy = rng.random((n, width)) < lang.noise
    for t in range(1, width):
        nxt = lang.successors[words[:, t - 1], pick[:, t]]
        restart = noisy[:, t] | (random_next & (a_len == t))
        words[:, t] = np.where(restart, fresh[:, t], nxt)
    rows = Rows()
    mask_choice = rng.random((n, max_pred))
    replace = lang.draw_words(rng, (n, max_pred)) + FIRST_WORD
    for i in range(n):
        a, b = int(a_len[i]), int(body[i])
        w = words[i, :b] + FIRST_WORD
        tokens = np.concatenate([[CLS_ID], w[:a], [SEP_ID], w[a:], [SEP_ID]])
        seg = np.zeros(len(tokens), np.int64)
        seg[a + 2 :] = 1
        candidates = np.flatnonzero((tokens != CLS_ID) & (tokens != SEP_ID))
        k = min(max_pred, max(1, int(round(len(tokens) * MASKED_LM_PROB))), len(candidates))
        pos = np.sort(rng.choice(candidates, size=k, replace=False))
        original = tokens[pos].copy()
        u = mask_choice[i, :k]
        tokens[pos] = np.where(u < 0.8, MASK_ID, np.where(u < 0.9, original, replace[i, :k]))
        rows.input_ids.append(tokens)
        rows.segment_ids.append(seg)
        rows.seq_lens.append(np.array([len(tokens)], np.int64))
        rows.masked_lm_positions.append(pos.astype(np.int64))
        rows.masked_lm_ids.append(original)
        rows.masked_lens.append(np.array([k], np.int64))
        rows.next_sentence_labels.append(np.array([int(random_next[i])], np.int64))
    return rows


def generate(lang: Language, count: int, seed: int = 0, start: int = 0, max_seq_len: int = MAX_SEQ_LEN,
             max_pred: int = MAX_PRED) -> Rows:
    """Samples ``start .. start+count-1`` (one sequence per row), the same whichever range asks for them."""
    out = Rows()
    first, last = start // CHUNK, (start + count - 1) // CHUNK
    for c in range(first, last + 1) if count > 0 else ():
        rows = _chunk(lang, seed, c, max_seq_len, max_pred)
        lo, hi = max(start - c * CHUNK, 0), min(start + count - c * CHUNK, CHUNK)
        out.extend(rows.select(range(lo, hi)))
    return out


def most_frequent_accuracy(rows: Rows) -> float:
    """Masked-LM accuracy of always predicting the most frequent masked word of ``rows``."""
    ids = np.concatenate(rows.masked_lm_ids)
    return float(np.bincount(ids).max() / len(ids)) if len(ids) else 0.0


def originals(rows: Rows) -> list[np.ndarray]:
    """Each row's tokens with the masked ones restored."""
    out = []
    for ids, pos, orig in zip(rows.input_ids, rows.masked_lm_positions, rows.masked_lm_ids):
        t = ids.copy()
        t[pos] = orig
        out.append(t)
    return out


def oracle_accuracy(lang: Language, rows: Rows) -> float:
    """Accuracy of argmax_x P(x | true left word) P(true right word | x) with the chain known (a
    ceiling: it sees the true neighbours even where they are masked, and ignores that a random B
    restarts the chain). The argmax is exact over a few candidates: the left word's successors, the
    right word's predecessors and the most frequent words (any other word scores below the latter)."""
    correct = total = 0
    for t, pos, orig in zip(originals(rows), rows.masked_lm_positions, rows.masked_lm_ids):
        for p, y in zip(pos.tolist(), orig.tolist()):
            left, right = int(t[p - 1]) - FIRST_WORD, int(t[p + 1]) - FIRST_WORD if p + 1 < len(t) else -1
            cand = [lang.top_words]
            if left >= 0:
                cand.append(lang.successors[left])
            if right >= 0:
                cand.append(lang.predecessors[right])
            cand = np.unique(np.concatenate(cand))
            score = lang.next_prob(left, cand)
            if right >= 0:
                score = score * np.array([lang.next_prob(int(c), np.array([right]))[0] for c in cand])
            correct += int(cand[int(score.argmax())] + FIRST_WORD == y)
            total += 1
    return correct / total if total else 0.0


class BertDatagen(Datagen):
    """Packed training and padded eval HDF5 shards of the synthetic language (``hpcbench datagen bert``)."""

    @classmethod
    def add_datagen_args(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--train-samples", type=int, default=65536, help="training sequences")
        parser.add_argument("--eval-samples", type=int, default=10000, help="eval sequences (the reference: 10,000)")
        parser.add_argument("--train-shards", type=int, default=4, help="training shard files (eval: one)")
        parser.add_argument("--layout", choices=("packed", "padded"), default="packed",
                            help="training shards' layout: packed (up to 3 sequences per row, the default) or "
                                 "padded; the eval shard is always padded, as the reference's")
        parser.add_argument("--vocab-size", type=int, default=30522,
                            help="vocabulary of the synthetic language; the model's model.vocab_size must match")
        parser.add_argument("--max-seq-len", type=int, default=512, help="tokens per row (data.max_seq_len)")
        parser.add_argument("--max-pred", type=int, default=0,
                            help="predictions per sequence at most (data.max_pred); 0: 76 at 512, "
                                 "else 15%% of the length")

    @classmethod
    def embedded_datagen_args(cls) -> list[str]:
        """The dataset the ``mini`` preset is tuned on (see configs/mini.toml)."""
        return ["--train-samples", "8192", "--eval-samples", "1024", "--train-shards", "2",
                "--vocab-size", "200", "--max-seq-len", "64"]

    @classmethod
    def datagen(cls, args: argparse.Namespace) -> None:
        if args.train_samples < 1 or args.eval_samples < 1 or args.train_shards < 1:
            raise ConfigError(f"--train-samples, --eval-samples and --train-shards must be >= 1, got "
                              f"{args.train_samples}, {args.eval_samples}, {args.train_shards}")
        plan = DataPlan(args.vocab_size, args.max_seq_len, max_pred_for(args.max_seq_len, args.max_pred), args.seed)
        plan.language()  # bad sizes fail here, named, before any process starts
        per = -(-args.train_samples // args.train_shards)
        jobs = [FileJob("train", f"part_{k:05d}_of_{args.train_shards:05d}.hdf5",
                        tuple(range(k * per, min((k + 1) * per, args.train_samples))))
                for k in range(args.train_shards) if k * per < args.train_samples]
        jobs.append(FileJob("eval", "eval_00000.hdf5", tuple(range(args.eval_samples))))
        generate_files(args.out, jobs, partial(write_shard, plan, args.layout), partial(verify_shard, plan),
                 workers=max(1, args.workers), progress=True, desc="bert datagen")
        print(f"wrote {args.train_samples} training sequences ({args.layout}, {len(jobs) - 1} shards) and "
              f"{args.eval_samples} eval sequences (padded) of at most {args.max_seq_len} tokens, vocabulary "
              f"{args.vocab_size}, to {args.out}")


def max_pred_for(max_seq_len: int, asked: int = 0) -> int:
    """The reference's 76 predictions at 512 tokens; 15% of the length (at least 1) for shorter rows."""
    if asked:
        return asked
    return MAX_PRED if max_seq_len == MAX_SEQ_LEN else max(1, round(MASKED_LM_PROB * max_seq_len))


class DataPlan:
    """What every datagen worker needs to make its shard (picklable)."""

    def __init__(self, vocab_size: int, max_seq_len: int, max_pred: int, seed: int) -> None:
        self.vocab_size, self.max_seq_len, self.max_pred, self.seed = vocab_size, max_seq_len, max_pred, seed

    def language(self) -> Any:
        return Language(vocab_size=self.vocab_size, seed=self.seed)

    def sample_seed(self, split: str) -> int:
        """Training and eval samples of one language come from different streams."""
        return self.seed * 2 + (1 if split == "train" else 2)


def write_shard(plan: DataPlan, layout: str, job: Any, tmp: Path) -> int:
    start, count = job.indices[0], len(job.indices)
    rows = generate(plan.language(), count, seed=plan.sample_seed(job.split), start=start,
                          max_seq_len=plan.max_seq_len, max_pred=plan.max_pred)
    limits = {"max_seq_len": plan.max_seq_len, "max_pred": plan.max_pred, "vocab_size": plan.vocab_size}
    if job.split == "train" and layout == "packed":
        write_packed(tmp, packing.pack(rows, plan.max_seq_len), **limits)
    else:
        write_padded(tmp, rows, **limits)
    return rows.num_sequences()


def verify_shard(plan: DataPlan, tmp: Path, job: Any) -> None:
    with open_shard(tmp, max_seq_len=plan.max_seq_len, max_pred=plan.max_pred, vocab_size=plan.vocab_size) as shard:
        got = shard.read().num_sequences()
    if got != len(job.indices):
        raise DataError(f"{tmp}: holds {got} sequences, {len(job.indices)} were written")
