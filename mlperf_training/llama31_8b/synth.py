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

import argparse
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hpcbench.common.data.datagen import Datagen
from hpcbench.common.errors import ConfigError

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


class LlamaDatagen(Datagen):
    """Megatron indexed-dataset documents of the Markov corpus (``hpcbench datagen llama31_8b``)."""

    @classmethod
    def add_datagen_args(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--train-documents", type=int, default=4000)
        parser.add_argument("--eval-documents", type=int, default=400)
        parser.add_argument("--vocab-size", type=int, default=512, help="ids of the Markov corpus (the last ends a document)")
        parser.add_argument("--min-len", type=int, default=40, help="words per document, at least")
        parser.add_argument("--max-len", type=int, default=400, help="words per document, at most")

    @classmethod
    def embedded_datagen_args(cls) -> list[str]:
        return ["--train-documents", "4000", "--eval-documents", "400", "--vocab-size", "512"]

    @classmethod
    def datagen(cls, args: argparse.Namespace) -> None:
        if args.train_documents < 1 or args.eval_documents < 1:
            raise ConfigError("--train-documents and --eval-documents must be >= 1")
        src = MarkovSource(args.vocab_size, args.seed)
        out = Path(args.out)
        n_train = write_split(out / "train" / "synth_train_text_document", src, args.train_documents, args.min_len,
                              args.max_len, stream=1)
        n_eval = write_split(out / "validation" / "synth_validation_text_document", src, args.eval_documents,
                             args.min_len, args.max_len, stream=2)
        print(f"wrote {n_train} training and {n_eval} validation tokens (Markov corpus, vocabulary {args.vocab_size}, "
              f"entropy rate {src.entropy_rate():.3f} nats/token, unigram entropy {src.unigram_entropy():.2f}) to {out}")
