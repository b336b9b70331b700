"""What data.index_cache saves a llama31_8b rank at start: the index built vs loaded from the cache.

Both sides produce the same arrays of the same sample set (checked): the baseline builds them as every rank did
before the cache (document index, shuffle, sample index; ``data.index_cache = "none"``), the measured path loads the
stored entry (memory-mapped, every array's CRC32C checked, as a rank does). The corpus is a C4-like list of
``--documents`` documents (lognormal lengths, mean ~430 tokens; the .bin is a sparse file: no token is read, the
index depends on the lengths only), the training split's index built for ``--samples`` samples of ``--seq-len``;
the validation set as the closed preset builds it (``--eval-index`` samples, the first 1024 kept) when
``--eval-index`` > 0. Each side runs ``--rounds`` times, interleaved; the best counts. Prints the machine, both
times, the ratio and the entry's size.

    python -m benchmarks.llama_index_cache --work /tmp/lic --documents 4000000 --samples 1000000 --rounds 3

The full preset's training split is c4-train.en_6 (about 45 M documents, 19.2 M samples of 8192): scale
``--documents`` and ``--samples`` together to keep the passes over the documents (the index's size) of interest.
"""
from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

import numpy as np

from benchmarks.budget import say
from benchmarks.machine import describe, header
from hpcbench.workloads.mlperf_training.llama31_8b import gpt, indexed
from hpcbench.workloads.mlperf_training.llama31_8b.index_cache import IndexCache


def write_corpus(prefix: Path, documents: int, seed: int = 0) -> None:
    """A C4-like .idx (lognormal lengths, mean ~430) and a sparse .bin of the tokens it describes (int32)."""
    rng = np.random.default_rng(seed)
    lengths = np.maximum(1, rng.lognormal(5.7, 0.8, documents)).astype(np.int32)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    idx, bin_ = indexed.paths(prefix)
    idx.write_bytes(indexed.index_bytes(lengths, np.arange(documents + 1), np.int32))
    with open(bin_, "wb") as fh:
        fh.truncate(int(lengths.sum(dtype=np.int64)) * 4)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--documents", type=int, default=4_000_000)
    ap.add_argument("--samples", type=int, default=1_000_000, help="training samples the index is built for")
    ap.add_argument("--seq-len", type=int, default=8192)
    ap.add_argument("--eval-index", type=int, default=0, help="also the validation set over an index of this many")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    say(header(describe()))
    prefix = a.work / "corpus" / "c4-train.en_6_text_document"
    if not indexed.paths(prefix)[0].exists():
        write_corpus(prefix, a.documents)
    corpus = gpt.Corpus.open([prefix], 128256)
    sets = [("train", dict(num_samples=a.samples))]
    if a.eval_index:
        sets.append(("validation", dict(num_samples=a.eval_index, limit=1024)))
    cache_dir = a.work / "cache"
    shutil.rmtree(cache_dir, ignore_errors=True)
    cache = IndexCache(cache_dir)
    say(f"corpus: {len(corpus):,} documents, {int(corpus.lengths.sum(dtype=np.int64)):,} tokens; seq_len {a.seq_len}")
    for name, kw in sets:
        built = gpt.GPTSamples(corpus, a.seq_len, 1234, **kw, cache=cache)  # stores the entry (not timed)
        plain_s, cached_s = [], []
        for _ in range(a.rounds):
            t = time.perf_counter()
            plain = gpt.GPTSamples(corpus, a.seq_len, 1234, **kw)
            plain_s.append(time.perf_counter() - t)
            t = time.perf_counter()
            loaded = gpt.GPTSamples(corpus, a.seq_len, 1234, **kw, cache=cache)
            cached_s.append(time.perf_counter() - t)
        for arr in ("document_index", "sample_index", "shuffle_index"):
            assert np.array_equal(getattr(plain, arr), getattr(loaded, arr)), arr
            assert np.array_equal(getattr(built, arr), getattr(loaded, arr)), arr
        size = sum(p.stat().st_size for p in cache_dir.glob("*.npy"))
        say(f"{name}: {len(plain):,} samples over {plain.epochs} passes; built (no cache) best {min(plain_s):.2f} s, "
            f"loaded from the cache best {min(cached_s):.2f} s: {min(plain_s) / min(cached_s):.1f}x; entries on disk "
            f"so far {size / 2**20:.1f} MiB")
        del plain, loaded, built


if __name__ == "__main__":
    main()
