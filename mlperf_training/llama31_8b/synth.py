"""A synthetic corpus with learnable structure and a known entropy, written as indexed datasets.

Documents are runs of a first-order Markov chain over the ``vocab_size - 1`` word ids (the last id is the
end-of-document token that Megatron's preprocessing appends, ``--append-eod``): each word ``t`` has
``len(PROBS)`` successors - ``(t + 1) mod W`` first, which makes the chain irreducible, then distinct random
words fixed by the seed - taken with probabilities :data:`PROBS`. A document's first word is uniform, its
length uniform in ``[min_len, max_len]``.

What is known exactly (:class:`MarkovSource`): the chain's entropy rate ``sum_t pi(t) H(P[t])`` (nats per
token; 0.518 with :data:`PROBS`), the floor of any predictor's log perplexity apart from the document
boundaries, and the unigram entropy ``H(pi)`` (about ``ln W``), the log perplexity of the best predictor that
ignores context. The ``mini`` target sits between the two, so a unigram model cannot reach it and a model
must learn the transitions (tests/test_llama_data.py checks both bounds).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .indexed import IndexedWriter, token_dtype

PROBS = (0.85, 0.10, 0.05)


@dataclass(frozen=True)
class MarkovSource:
    vocab_size: int  # ids 0 .. vocab_size - 2 are words, vocab_size - 1 ends a document
    seed: int

    def __post_init__(self) -> None:
        if self.vocab_size - 1 < 2 * len(PROBS):
            raise ValueError(f"vocabulary {self.vocab_size}: at least {2 * len(PROBS) + 1} ids are needed")

    @property
    def words(self) -> int:
        return self.vocab_size - 1

    @property
    def eod(self) -> int:
        return self.vocab_size - 1

    def successors(self) -> np.ndarray:
        """``(words, len(PROBS))`` successor ids (distinct per row, ``t + 1`` first)."""
        w, k = self.words, len(PROBS)
        rng = np.random.RandomState(self.seed)
        out = np.empty((w, k), dtype=np.int64)
        for t in range(w):
            first = (t + 1) % w
            rest = rng.choice(w - 1, size=k - 1, replace=False)
            rest = np.where(rest >= first, rest + 1, rest)  # any word but the first successor
            out[t] = (first, *rest)
        return out

    def transition(self) -> np.ndarray:
        w = self.words
        p = np.zeros((w, w))
        succ = self.successors()
        for j, pr in enumerate(PROBS):
            p[np.arange(w), succ[:, j]] += pr
        return p

    def stationary(self) -> np.ndarray:
        p = self.transition()
        pi = np.full(self.words, 1.0 / self.words)
        for _ in range(10000):
            nxt = pi @ p
            if np.abs(nxt - pi).max() < 1e-14:
                break
            pi = nxt
        return nxt / nxt.sum()

    def entropy_rate(self) -> float:
        """Nats per token of the chain: the best possible log perplexity inside a document."""
        row = -sum(p * np.log(p) for p in PROBS)
        return float(row)  # every row has the same probabilities, so pi-weighting changes nothing

    def unigram_entropy(self) -> float:
        """Nats per token of the best context-free predictor (the stationary word frequencies)."""
        pi = self.stationary()
        pi = pi[pi > 0]
        return float(-(pi * np.log(pi)).sum())

    def document(self, rng: np.random.RandomState, length: int, succ: np.ndarray) -> np.ndarray:
        """One document of ``length`` words followed by the end-of-document id."""
        out = np.empty(length + 1, dtype=np.int64)
        choice = rng.choice(len(PROBS), size=length, p=PROBS)
        t = int(rng.randint(self.words))
        out[0] = t
        for i in range(1, length):
            t = int(succ[t, choice[i]])
            out[i] = t
        out[length] = self.eod
        return out


def write_split(prefix: Path, source: MarkovSource, documents: int, min_len: int, max_len: int,
                stream: int) -> int:
    """``documents`` documents of stream ``stream`` (train and validation differ) as ``prefix.bin/.idx``; tokens written."""
    if documents < 1 or not 1 <= min_len <= max_len:
        raise ValueError(f"{documents} documents of {min_len}..{max_len} words")
    rng = np.random.RandomState([source.seed, stream])
    succ = source.successors()
    writer = IndexedWriter(prefix, token_dtype(source.vocab_size), source.vocab_size)
    total = 0
    for _ in range(documents):
        doc = source.document(rng, int(rng.randint(min_len, max_len + 1)), succ)
        writer.add_document(doc)
        total += doc.size
    writer.finish().close()
    return total
