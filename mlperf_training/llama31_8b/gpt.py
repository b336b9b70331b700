"""GPT training samples over indexed datasets, built as Megatron-LM's ``GPTDataset`` builds them.

A sample is ``seq_len + 1`` consecutive tokens of the stream of documents (inputs = the first ``seq_len``,
labels = the last ``seq_len``), crossing document boundaries; consecutive samples share one token. Three
arrays fix which tokens and in which order (Megatron ``megatron/core/datasets/gpt_dataset.py``:
``_build_document_sample_shuffle_indices``, ``_build_document_index``, ``_build_shuffle_index`` and
``helpers.build_sample_idx``), all from one ``numpy.random.RandomState(seed)``:

* the **document index**: every document id once per epoch (as many epochs as the requested samples need:
  ``epochs x tokens_per_epoch >= num_samples x seq_len + 1``), shuffled as one array - or, when the last epoch
  would contribute fewer than 80% of an epoch's samples, the first ``epochs - 1`` shuffled together and the last
  one on its own (``separate_final_epoch``);
* the **sample index**: ``(position in the document index, offset in that document)`` where each sample starts,
  ``(epochs x tokens_per_epoch - 1) // seq_len`` samples + 1 rows; sample ``i`` runs from row ``i`` to row
  ``i + 1`` inclusive. Computed here by ``searchsorted`` over the cumulative document lengths, a chunk of the
  document index at a time (the C++ helper walks the documents; the rows are the same, empty documents included);
* the **shuffle index**: a permutation of the samples (the samples of a separate final epoch shuffled apart).

``shuffle=False`` keeps the document order and the identity permutation (``data.eval_order = "document"``: the
evaluation set as the reference's README states it, "the first 1024 sequences", "we do not shuffle the validation
dataset"). The reference's code instead builds the validation GPTDataset as the training one, seeded with the run's
seed, over an index of NeMo's ``num_val_samples`` (25,601,024 at batch 16), and every evaluation reads its first
1024 samples (``data.eval_order = "reference"``, the closed default; docs/closed.md).

Memory is that of Megatron's arrays: O(documents x epochs) for the document index, O(samples) for the shuffle
index; nothing is per token, and a sample's tokens are read from the memory-mapped .bin when it is asked for. The
full sample index (O(samples)) is built for a set read in full (the training split); a set cut to its first ``limit`` samples (the evaluation set) keeps only those samples'
rows, found in one streaming pass over the document index, and the document ids they span (the reference's
validation index: 405 M document entries, 1.6 GB while it is built, ~100 KB kept).
"""
from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from hpcbench.common.errors import DataError

from .indexed import IndexedDataset

if TYPE_CHECKING:  # pragma: no cover
    from .index_cache import IndexCache

SEPARATE_FINAL_EPOCH_THRESHOLD = 0.80  # Megatron's: a last epoch under 80% of one is shuffled on its own
MAX_DOCUMENT_INDEX = 2**32  # int32 document-index entries built at most (16 GiB): beyond it a size is a mistake


class Corpus:
    """Several indexed datasets seen as one list of documents (sequences), in the given order."""

    def __init__(self, datasets: Sequence[IndexedDataset]) -> None:
        if not datasets:
            raise DataError("an empty corpus: no indexed dataset given")
        self.datasets = list(datasets)
        self.lengths = np.concatenate([d.sequence_lengths for d in datasets]).astype(np.int32)
        self.starts = np.cumsum([0] + [len(d) for d in datasets]).astype(np.int64)
        self._fingerprint: list[dict[str, object]] | None = None

    @classmethod
    def open(cls, prefixes: Sequence[Path], vocab_size: int) -> "Corpus":
        return cls([IndexedDataset(p, vocab_size) for p in prefixes])

    def __len__(self) -> int:
        return int(self.starts[-1])

    def get(self, doc: int, offset: int = 0, length: int | None = None) -> np.ndarray:
        k = int(np.searchsorted(self.starts, doc, side="right")) - 1
        return self.datasets[k].get(doc - int(self.starts[k]), offset, length)

    def where(self) -> str:
        return ", ".join(str(d.bin_path) for d in self.datasets)

    def fingerprint(self) -> list[dict[str, object]]:
        """What an index over these documents depends on, per dataset: its documents, tokens and the SHA-256 of
        its sequence lengths (the index cache's key; computed once)."""
        if self._fingerprint is None:
            self._fingerprint = [{"documents": len(d), "tokens": int(d.sequence_lengths.sum(dtype=np.int64)),
                                  "lengths_sha256": hashlib.sha256(
                                      np.ascontiguousarray(d.sequence_lengths, dtype="<i4").data).hexdigest()}
                                 for d in self.datasets]
        return self._fingerprint

    def close(self) -> None:
        for d in self.datasets:
            d.close()


def num_epochs_for(tokens_per_epoch: int, num_samples: int, seq_len: int) -> int:
    """Megatron's ``_get_num_epochs``: passes over the documents that give ``num_samples x seq_len + 1`` tokens."""
    need = num_samples * seq_len + 1
    return max(1, -(-need // tokens_per_epoch))


def build_document_index(documents: np.ndarray, epochs: int, rng: np.random.RandomState | None,
                         separate_final_epoch: bool) -> np.ndarray:
    """Every document once per epoch, shuffled (``rng``) as Megatron's ``_build_document_index``; int32."""
    if not separate_final_epoch or epochs == 1:
        index = np.tile(documents.astype(np.int32), epochs)
        if rng is not None:
            rng.shuffle(index)
        return index
    first = build_document_index(documents, epochs - 1, rng, False)
    last = build_document_index(documents, 1, rng, False)
    return np.concatenate((first, last))


def build_sample_index(lengths: np.ndarray, document_index: np.ndarray, seq_len: int, epochs: int,
                       tokens_per_epoch: int) -> np.ndarray:
    """``(num_samples + 1, 2)`` int64 rows (document-index position, offset) where samples start and end, the
    rows ``helpers.build_sample_idx`` writes: sample ``i`` is the tokens from row ``i`` to row ``i + 1`` inclusive
    (:func:`sample_rows_at` for every row)."""
    num_samples = (epochs * tokens_per_epoch - 1) // seq_len
    return sample_rows_at(lengths, document_index, seq_len, np.arange(num_samples + 1, dtype=np.int64))


def sample_rows_at(lengths: np.ndarray, document_index: np.ndarray, seq_len: int, samples: np.ndarray,
                   chunk: int = 1 << 22) -> np.ndarray:
    """The rows of :func:`build_sample_index` at the given sample numbers (any order, repeats allowed), found in one
    pass over the document index ``chunk`` entries at a time: memory O(chunk + len(samples)), not O(documents x
    epochs). Row ``k`` is the (document-index position, offset) where sample ``k`` starts."""
    samples = np.asarray(samples, dtype=np.int64)
    positions = samples * seq_len
    order = np.argsort(positions, kind="stable")
    ordered = positions[order]  # the queries in position order (views of it below, no copy per chunk)
    out = np.empty((samples.size, 2), dtype=np.int64)
    q, base = 0, 0  # the next query (in position order); tokens before this chunk
    for start in range(0, document_index.size, chunk):
        if q == samples.size:
            break
        doc_lengths = lengths[document_index[start : start + chunk]].astype(np.int64)
        cum = np.empty(doc_lengths.size + 1, dtype=np.int64)
        cum[0] = base
        np.cumsum(doc_lengths, out=cum[1:])
        cum[1:] += base
        end = int(np.searchsorted(ordered[q:], cum[-1], side="left")) + q  # queries inside this chunk
        if end > q:
            p = ordered[q:end]
            where = np.searchsorted(cum, p, side="right") - 1  # the non-empty document holding each position
            out[order[q:end], 0] = start + where
            out[order[q:end], 1] = p - cum[where]
            q = end
        base = int(cum[-1])
    if q != samples.size:
        raise ValueError(f"sample {int(samples[order[q]])} starts past the document index's {base} tokens")
    out[samples == 0] = (0, 0)  # the helper starts at the first document, empty or not (the same tokens)
    return out


def build_shuffle_index(num_samples: int, total: int, rng: np.random.RandomState | None) -> np.ndarray:
    """``[0, num_samples)`` shuffled, then ``[num_samples, total)`` shuffled apart (Megatron's ``_build_shuffle_index``)."""
    dtype = np.uint32 if total < np.iinfo(np.uint32).max - 1 else np.int64
    first = np.arange(num_samples, dtype=dtype)
    if rng is not None:
        rng.shuffle(first)
    if num_samples == total:
        return first
    last = np.arange(num_samples, total, dtype=dtype)
    if rng is not None:
        rng.shuffle(last)
    return np.concatenate((first, last))


class SampleRows:
    """What a sample set of ``size`` samples of ``seq_len + 1`` tokens gives the loader: batches of rows, and
    equal costs (every sample is the same length)."""

    size: int
    seq_len: int

    def __getitem__(self, i: int) -> np.ndarray:  # pragma: no cover - defined by each set
        raise NotImplementedError

    def read(self, indices: Sequence[int]) -> np.ndarray:
        """``(len(indices), seq_len + 1)`` int64 tokens."""
        out = np.empty((len(indices), self.seq_len + 1), dtype=np.int64)
        for row, i in enumerate(indices):
            out[row] = self[int(i)]
        return out

    def costs(self) -> np.ndarray:
        return np.ones(self.size)


class GPTSamples(SampleRows):
    """The samples of one split: item ``i`` is ``seq_len + 1`` int64 tokens (a :class:`SampleSource`).

    ``num_samples``: the samples the run asks for (Megatron: training iterations x global batch); 0 = one pass
    over the documents. As in Megatron, the index holds every sample of the epochs it needed, at least
    ``num_samples``; ``limit`` > 0 keeps the first ``limit`` of them: only their rows (``compact``, the evaluation
    set), or the whole index read no further (the training split of a one-prefix blend)."""

    def __init__(self, corpus: Corpus, seq_len: int, seed: int, num_samples: int = 0, shuffle: bool = True,
                 limit: int = 0, compact: bool = True, cache: "IndexCache | None" = None) -> None:
        if seq_len < 1:
            raise ValueError(f"sequence length {seq_len}")
        self.corpus, self.seq_len = corpus, seq_len
        tokens = int(corpus.lengths.sum(dtype=np.int64))
        if tokens < seq_len + 1:
            raise DataError(f"{corpus.where()}: {tokens} tokens in all, fewer than one sample of {seq_len + 1} "
                            "(config key 'data.seq_len')")
        if num_samples <= 0:
            num_samples = (tokens - 1) // seq_len
        epochs = num_epochs_for(tokens, num_samples, seq_len)
        if epochs * len(corpus) > MAX_DOCUMENT_INDEX:
            raise DataError(f"{corpus.where()}: an index of {num_samples} samples of {seq_len + 1} tokens takes {epochs} "
                            f"passes over its {len(corpus)} documents, {epochs * len(corpus):,} document-index entries "
                            f"(over {MAX_DOCUMENT_INDEX:,}, {epochs * len(corpus) * 4 / 2**30:.0f} GiB): too many to "
                            "build (config keys 'data.train_samples' / 'data.eval_index_samples')")
        separate, before_final = False, 0
        if epochs > 1:
            before_final = ((epochs - 1) * tokens - 1) // seq_len
            per_epoch = (tokens - 1) // seq_len
            separate = num_samples - before_final < int(SEPARATE_FINAL_EPOCH_THRESHOLD * per_epoch)
        self.epochs, self.separate_final_epoch = epochs, separate
        self.num_samples = num_samples
        total = (epochs * tokens - 1) // seq_len  # the sample index's samples (build_sample_index)
        self.size = total
        if limit:
            if limit > total:
                raise DataError(f"{corpus.where()}: {limit} samples of {seq_len + 1} tokens asked for (config key "
                                f"'data.eval_samples'), the split holds {total}")
            self.size = limit

        def build() -> dict[str, np.ndarray]:
            rng = np.random.RandomState(seed) if shuffle else None
            document_index = build_document_index(np.arange(len(corpus), dtype=np.int64), epochs, rng, separate)
            shuffle_index = build_shuffle_index(before_final if separate else total, total, rng)
            if limit and compact:
                return _keep_first(corpus.lengths, document_index, shuffle_index[:limit].astype(np.int64), seq_len)
            return {"document_index": document_index, "shuffle_index": shuffle_index,
                    "sample_index": build_sample_index(corpus.lengths, document_index, seq_len, epochs, tokens)}

        if cache is None:
            arrays = build()
        else:  # what the arrays depend on: the documents' lengths (not where they are), sizes, seed, layout
            cut = bool(limit and compact)
            arrays = cache.get_or_build(
                {"class": "GPTSamples", "datasets": corpus.fingerprint(), "seq_len": seq_len,
                 "seed": seed if shuffle else None, "num_samples": num_samples, "shuffle": shuffle, "limit": limit,
                 "compact": cut, "separate_final_epoch_threshold": SEPARATE_FINAL_EPOCH_THRESHOLD}, build,
                frozenset({"document_index", "sample_index", "shuffle_index", *(("chosen",) if cut else ())}))
        self.document_index, self.sample_index = arrays["document_index"], arrays["sample_index"]
        self.shuffle_index = arrays["shuffle_index"]
        if "chosen" in arrays:
            self.chosen = arrays["chosen"]  # the samples of the full index these are (tests; nothing reads it)

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> np.ndarray:
        if not 0 <= i < self.size:
            raise IndexError(f"sample {i} of {self.size}")
        j = int(self.shuffle_index[i])
        (d0, o0), (d1, o1) = self.sample_index[j], self.sample_index[j + 1]
        doc = self.document_index
        if d0 == d1:
            parts = [self.corpus.get(int(doc[d0]), int(o0), int(o1 - o0 + 1))]
        else:
            parts = [self.corpus.get(int(doc[d0]), int(o0))]
            parts += [self.corpus.get(int(doc[k])) for k in range(int(d0) + 1, int(d1))]
            parts.append(self.corpus.get(int(doc[d1]), 0, int(o1) + 1))
        out = np.concatenate(parts).astype(np.int64)
        if out.size != self.seq_len + 1:  # the index arithmetic is ours: never hand out a short sample
            raise DataError(f"{self.corpus.where()}: sample {i} has {out.size} tokens, expected {self.seq_len + 1}")
        return out


def _keep_first(lengths: np.ndarray, document_index: np.ndarray, chosen: np.ndarray, seq_len: int) -> dict[str, np.ndarray]:
    """Only what samples ``chosen`` (in this order) need: sample ``i`` becomes rows ``2i`` and ``2i + 1`` of a small
    sample index over a small document index holding the document ids each one spans."""
    rows = sample_rows_at(lengths, document_index, seq_len, np.stack([chosen, chosen + 1], axis=1).ravel())
    spans = [document_index[int(rows[2 * i, 0]) : int(rows[2 * i + 1, 0]) + 1] for i in range(chosen.size)]
    starts = np.cumsum([0] + [s.size for s in spans[:-1]]).astype(np.int64)
    sample_index = np.empty_like(rows)
    sample_index[0::2, 0] = starts
    sample_index[1::2, 0] = starts + (rows[1::2, 0] - rows[0::2, 0])
    sample_index[:, 1] = rows[:, 1]
    return {"document_index": np.concatenate(spans) if spans else np.empty(0, dtype=np.int32),
            "sample_index": sample_index, "shuffle_index": np.arange(0, 2 * chosen.size, 2, dtype=np.int64),
            "chosen": chosen}
