"""llama31_8b data: the Megatron indexed-dataset reader against an independent writer built here from the
published layout, refusals of corrupt files by name, our writer read back independently, the GPT sample /
document / shuffle indices against a direct transcription of Megatron's sample-index walk, and the synthetic
corpus's entropy bounds."""
from __future__ import annotations

import re
import struct
from pathlib import Path

import numpy as np
import pytest

from hpcbench.common.errors import DataError
from hpcbench.workloads.mlperf_training.llama31_8b import gpt, indexed, synth

CODES = {"uint8": 1, "int8": 2, "int16": 3, "int32": 4, "int64": 5, "float64": 6, "float32": 7, "uint16": 8}


def independent_write(prefix: Path, docs: list[list[int]], dtype: str = "int32") -> None:
    """The published layout with struct only: header, int32 lengths, int64 byte pointers, int64 doc index."""
    fmt = {"int32": "i", "uint16": "H", "int64": "q", "uint8": "B"}[dtype]
    size = struct.calcsize(fmt)
    with open(str(prefix) + ".bin", "wb") as fh:
        for d in docs:
            fh.write(struct.pack(f"<{len(d)}{fmt}", *d))
    lengths = [len(d) for d in docs]
    pointers, at = [], 0
    for n in lengths:
        pointers.append(at)
        at += n * size
    doc_index = list(range(len(docs) + 1))
    with open(str(prefix) + ".idx", "wb") as fh:
        fh.write(b"MMIDIDX\x00\x00")
        fh.write(struct.pack("<Q", 1))
        fh.write(struct.pack("<B", CODES[dtype]))
        fh.write(struct.pack("<Q", len(lengths)))
        fh.write(struct.pack("<Q", len(doc_index)))
        fh.write(struct.pack(f"<{len(lengths)}i", *lengths))
        fh.write(struct.pack(f"<{len(pointers)}q", *pointers))
        fh.write(struct.pack(f"<{len(doc_index)}q", *doc_index))


def independent_read(prefix: Path) -> list[list[int]]:
    raw = Path(str(prefix) + ".idx").read_bytes()
    assert raw[:9] == b"MMIDIDX\x00\x00" and struct.unpack("<Q", raw[9:17])[0] == 1
    code = raw[17]
    fmt = {1: "B", 4: "i", 5: "q", 8: "H"}[code]
    n, d = struct.unpack("<QQ", raw[18:34])
    lengths = struct.unpack(f"<{n}i", raw[34 : 34 + 4 * n])
    pointers = struct.unpack(f"<{n}q", raw[34 + 4 * n : 34 + 12 * n])
    docs = struct.unpack(f"<{d}q", raw[34 + 12 * n :])
    assert docs[0] == 0 and docs[-1] == n
    data = Path(str(prefix) + ".bin").read_bytes()
    size = struct.calcsize(fmt)
    return [list(struct.unpack(f"<{m}{fmt}", data[p : p + m * size])) for m, p in zip(lengths, pointers)]


def _docs(rng: np.random.RandomState, n: int, vocab: int, empty: bool = False) -> list[list[int]]:
    out = [list(map(int, rng.randint(0, vocab, size=rng.randint(1, 40)))) for _ in range(n)]
    if empty:
        out[3] = []
        out[7] = []
    return out


def test_reader_reads_an_independently_written_dataset(tmp_path: Path) -> None:
    rng = np.random.RandomState(0)
    for dtype, vocab in (("int32", 128256), ("uint16", 5000)):
        docs = _docs(rng, 20, vocab, empty=True)
        docs[0] = list(range(1, 9))
        independent_write(tmp_path / dtype, docs, dtype)
        ds = indexed.IndexedDataset(tmp_path / dtype, vocab_size=vocab)
        assert len(ds) == 20 and ds.document_count == 20 and ds.dtype == np.dtype(dtype)
        assert [ds.get(i).tolist() for i in range(20)] == docs
        assert ds.get(0, 2, 3).tolist() == docs[0][2:5]
        ds.check_tokens()
        ds.close()


def test_our_writer_is_read_by_the_independent_reader(tmp_path: Path) -> None:
    docs = _docs(np.random.RandomState(1), 15, 128256)
    w = indexed.IndexedWriter(tmp_path / "ours", np.int32, vocab_size=128256)
    for d in docs:
        w.add_document(d)
    w.finish().close()
    assert independent_read(tmp_path / "ours") == docs
    assert not list(tmp_path.glob(".*"))  # no temporary file left behind


def _corrupt(tmp_path: Path, name: str) -> Path:
    prefix = tmp_path / name
    independent_write(prefix, [[1, 2, 3], [4, 5], [6]], "int32")
    return prefix


@pytest.mark.parametrize("damage, expected", [
    (lambda idx, b: idx.write_bytes(b"XXIDIDX\x00\x00" + idx.read_bytes()[9:]), "magic"),
    (lambda idx, b: idx.write_bytes(idx.read_bytes()[:9] + struct.pack("<Q", 2) + idx.read_bytes()[17:]), "version 2"),
    (lambda idx, b: idx.write_bytes(idx.read_bytes()[:17] + bytes([9]) + idx.read_bytes()[18:]), "dtype code 9"),
    (lambda idx, b: idx.write_bytes(idx.read_bytes()[:17] + bytes([7]) + idx.read_bytes()[18:]), "not an integer"),
    (lambda idx, b: idx.write_bytes(idx.read_bytes()[:-3]), "header announces"),
    (lambda idx, b: idx.write_bytes(idx.read_bytes()[:20]), "shorter than the 34-byte index header"),
    (lambda idx, b: b.write_bytes(b.read_bytes()[:-4]), "describes 6 tokens"),
    (lambda idx, b: idx.write_bytes(idx.read_bytes()[:34 + 12] + struct.pack("<q", 8) + idx.read_bytes()[34 + 20:]),
     "points at byte 8"),
    (lambda idx, b: idx.write_bytes(idx.read_bytes()[:-8] + struct.pack("<q", 2)), "document index runs from 0 to 2"),
    (lambda idx, b: idx.write_bytes(idx.read_bytes()[:34] + struct.pack("<i", -1) + idx.read_bytes()[38:]),
     "length -1"),
])
def test_corrupt_files_are_refused_by_name(tmp_path: Path, damage, expected: str) -> None:  # noqa: ANN001
    prefix = _corrupt(tmp_path, "c4")
    idx, b = Path(str(prefix) + ".idx"), Path(str(prefix) + ".bin")
    damage(idx, b)
    with pytest.raises(DataError, match=expected) as err:
        indexed.IndexedDataset(prefix, vocab_size=100)
    assert "c4." in str(err.value)


def test_token_ids_beyond_the_vocabulary_and_missing_files(tmp_path: Path) -> None:
    independent_write(tmp_path / "big", [[1, 2], [3, 500]], "int32")
    ds = indexed.IndexedDataset(tmp_path / "big", vocab_size=100)
    assert ds.get(0).tolist() == [1, 2]
    with pytest.raises(DataError, match=r"big.bin.*sequence 1 holds token id 500.*\[0, 100\)"):
        ds.get(1)
    with pytest.raises(DataError, match="token id 500"):
        ds.check_tokens()
    Path(str(tmp_path / "big") + ".bin").unlink()
    with pytest.raises(DataError, match=r"big.bin: no such file"):
        indexed.IndexedDataset(tmp_path / "big")
    with pytest.raises(ValueError, match="outside"):
        indexed.IndexedWriter(tmp_path / "w", np.uint16, vocab_size=10).add_document([3, 11])


def walk_sample_index(sizes: np.ndarray, doc_idx: np.ndarray, seq_length: int, num_epochs: int,
                      tokens_per_epoch: int) -> np.ndarray:
    """Megatron's helpers.build_sample_idx, transcribed as its loop (the reference for our vectorized form)."""
    num_samples = (num_epochs * tokens_per_epoch - 1) // seq_length
    out = np.zeros((num_samples + 1, 2), dtype=np.int64)
    doc_i, offset = 0, 0
    out[0] = (doc_i, offset)
    for s in range(1, num_samples + 1):
        remaining = seq_length + 1
        while remaining != 0:
            length = int(sizes[doc_idx[doc_i]]) - offset
            remaining -= length
            if remaining <= 0:
                offset += remaining + length - 1
                remaining = 0
            else:
                doc_i += 1
                offset = 0
        out[s] = (doc_i, offset)
    return out


@pytest.mark.parametrize("seq_len", [1, 7, 16, 64])
def test_sample_index_equals_megatrons_walk(seq_len: int) -> None:
    rng = np.random.RandomState(seq_len)
    lengths = rng.randint(0, 30, size=40).astype(np.int32)
    lengths[[0, 5, 6, 39]] = 0  # empty documents, the first and the last among them
    tokens = int(lengths.sum())
    for epochs in (1, 3):
        doc_index = gpt.build_document_index(np.arange(40), epochs, np.random.RandomState(3), False)
        ours = gpt.build_sample_index(lengths, doc_index, seq_len, epochs, tokens)
        assert np.array_equal(ours, walk_sample_index(lengths, doc_index, seq_len, epochs, tokens))


def _corpus(tmp_path: Path, docs: list[list[int]]) -> gpt.Corpus:
    independent_write(tmp_path / "corpus", docs, "int32")
    return gpt.Corpus.open([tmp_path / "corpus"], vocab_size=1000)


def test_gpt_samples_cross_documents_in_the_seeded_order(tmp_path: Path) -> None:
    docs = _docs(np.random.RandomState(5), 30, 1000, empty=True)
    corpus = _corpus(tmp_path, docs)
    seq = 16
    s = gpt.GPTSamples(corpus, seq, seed=1234, num_samples=50)
    assert len(s) >= 50 and s.epochs >= 1
    # the token stream of the shuffled document order, and each sample a window of it (one shared token)
    stream = np.concatenate([np.array(docs[d], dtype=np.int64) for d in s.document_index])
    for i in range(len(s)):
        j = int(s.shuffle_index[i])
        assert np.array_equal(s[i], stream[j * seq : j * seq + seq + 1])
    assert sorted(map(int, s.shuffle_index)) == list(range(len(s)))
    same = gpt.GPTSamples(corpus, seq, seed=1234, num_samples=50)
    other = gpt.GPTSamples(corpus, seq, seed=99, num_samples=50)
    assert np.array_equal(same.read(range(10)), s.read(range(10)))
    assert not np.array_equal(other.read(range(10)), s.read(range(10)))
    assert s.read([3, 1]).shape == (2, seq + 1)


def test_megatron_epochs_and_separate_final_epoch(tmp_path: Path) -> None:
    docs = [[1] * 10 for _ in range(10)]  # 100 tokens, 9 samples of 11 per epoch at seq 11 ... (100-1)//11 = 9
    corpus = _corpus(tmp_path, docs)
    one = gpt.GPTSamples(corpus, 11, seed=1, num_samples=0)
    assert (one.epochs, len(one)) == (1, 9)
    # 10 samples need a second epoch, whose 1 sample is < 80% of an epoch: shuffled apart
    two = gpt.GPTSamples(corpus, 11, seed=1, num_samples=10)
    assert two.epochs == 2 and two.separate_final_epoch
    before = ((2 - 1) * 100 - 1) // 11
    assert sorted(map(int, two.shuffle_index[:before])) == list(range(before))
    # 17 samples: the last epoch gives 8 >= 0.8 x 9, shuffled with the rest
    assert not gpt.GPTSamples(corpus, 11, seed=1, num_samples=17).separate_final_epoch


def test_eval_samples_are_the_first_in_document_order(tmp_path: Path) -> None:
    docs = _docs(np.random.RandomState(6), 20, 1000)
    corpus = _corpus(tmp_path, docs)
    ev = gpt.GPTSamples(corpus, 8, seed=0, shuffle=False, limit=5)
    stream = np.concatenate([np.array(d, dtype=np.int64) for d in docs])
    assert len(ev) == 5 and all(np.array_equal(ev[i], stream[8 * i : 8 * i + 9]) for i in range(5))
    with pytest.raises(DataError, match="data.eval_samples"):
        gpt.GPTSamples(corpus, 8, seed=0, shuffle=False, limit=10**6)
    with pytest.raises(DataError, match="data.seq_len"):
        gpt.GPTSamples(corpus, 10**6, seed=0)


@pytest.mark.parametrize("empty", [False, True])
@pytest.mark.parametrize("seq_len, num_samples, chunk", [(8, 0, 5), (16, 200, 7), (11, 17, 1 << 22), (5, -1, 3)])
def test_a_set_cut_to_its_first_samples_equals_the_whole_index(tmp_path: Path, empty: bool, seq_len: int,
                                                                num_samples: int, chunk: int) -> None:
    """The evaluation set keeps only its first ``limit`` samples' rows (found streaming, ``chunk`` document entries
    at a time): its samples are the whole index's first ``limit``, token for token, over several passes, a separate
    final pass (-1: two passes and one sample) and empty documents; the rows equal the full sample index's."""
    docs = _docs(np.random.RandomState(9), 30, 1000, empty=empty)
    corpus = _corpus(tmp_path, docs)
    final = num_samples < 0
    if final:
        num_samples = (2 * int(corpus.lengths.sum()) - 1) // seq_len + 1
    for seed in (1, 4):
        whole = gpt.GPTSamples(corpus, seq_len, seed, num_samples, shuffle=True)
        limit = min(23, len(whole))
        cut = gpt.GPTSamples(corpus, seq_len, seed, num_samples, shuffle=True, limit=limit)
        assert (cut.epochs, cut.separate_final_epoch) == (whole.epochs, whole.separate_final_epoch)
        assert len(cut) == limit and list(cut.chosen) == list(map(int, whole.shuffle_index[:limit]))
        assert all(np.array_equal(cut[i], whole[i]) for i in range(limit))
        every = np.arange(whole.sample_index.shape[0])
        rows = gpt.sample_rows_at(corpus.lengths, whole.document_index, seq_len, every[::-1], chunk=chunk)
        assert np.array_equal(rows[::-1], whole.sample_index)
        assert cut.document_index.size < whole.document_index.size or whole.epochs == 1
    assert whole.separate_final_epoch or not final


def test_a_validation_split_smaller_than_the_evaluation_set_is_passed_over_again(tmp_path: Path) -> None:
    """data.eval_index_samples = 0 builds the index for data.eval_samples: a split holding fewer samples than that is
    passed over as many times as they need, as Megatron builds any index (was: refused as too small, which stopped
    gpu_check --smoke's Llama on its small synthetic split: 256 asked, 26 held)."""
    from hpcbench.workloads.mlperf_training.llama31_8b.dataset import LlamaData

    (tmp_path / "validation").mkdir()
    independent_write(tmp_path / "validation" / "v_text_document", _docs(np.random.RandomState(4), 6, 100), "int32")
    one_pass = gpt.GPTSamples(gpt.Corpus.open([tmp_path / "validation" / "v_text_document"], 100), 8, 3, 0)
    ev = LlamaData(8, 100, seed=3, eval_samples=4 * len(one_pass)).open(tmp_path, "validation")
    assert len(ev) == 4 * len(one_pass) and ev.epochs >= 4


def test_an_index_too_large_to_build_is_refused_by_key(tmp_path: Path) -> None:
    corpus = _corpus(tmp_path, _docs(np.random.RandomState(2), 30, 1000))
    with pytest.raises(DataError, match="data.eval_index_samples"):
        gpt.GPTSamples(corpus, 8, 1, num_samples=10**12, limit=4)


def test_synthetic_corpus_entropy_bounds_the_mini_target(tmp_path: Path) -> None:
    import tomllib

    src = synth.MarkovSource(vocab_size=512, seed=1)
    target = tomllib.loads((Path(__file__).parents[1] / "mlperf_training/llama31_8b/configs/mini.toml").read_text())
    target = target["train"]["target"]
    assert src.entropy_rate() == pytest.approx(0.5181, abs=1e-3)
    assert src.entropy_rate() + 0.1 < target < 1.0 < src.unigram_entropy() - 4  # unigram ~ ln 511 = 6.2 nats
    n = synth.write_split(tmp_path / "train" / "synth", src, documents=50, min_len=20, max_len=60, stream=0)
    ds = indexed.IndexedDataset(tmp_path / "train" / "synth", vocab_size=512)
    assert ds.num_tokens == n and ds.dtype == np.uint16 and len(ds) == 50
    succ = src.successors()
    doc = ds.get(0)
    assert doc[-1] == src.eod and all(int(b) in succ[int(a)] for a, b in zip(doc[:-2], doc[1:-1]))


@pytest.mark.parametrize("split", ["train", "validation"])
@pytest.mark.parametrize("missing", [".idx", ".bin"])
def test_a_prefix_with_one_of_its_two_files_is_refused_by_name(tmp_path: Path, split: str, missing: str) -> None:
    """A ``.bin`` whose ``.idx`` is missing (or the reverse) is an incomplete copy: refused naming the missing
    file, never skipped (the run would train or evaluate on part of the data)."""
    from hpcbench.workloads.mlperf_training.llama31_8b.dataset import LlamaData

    rng = np.random.RandomState(3)
    for s in ("train", "validation"):
        (tmp_path / s).mkdir()
        for name in ("a_text_document", "b_text_document"):
            independent_write(tmp_path / s / name, _docs(rng, 20, 100), "uint16")
    assert [p.name for p in indexed.list_prefixes(tmp_path / split)] == ["a_text_document", "b_text_document"]
    gone = tmp_path / split / f"b_text_document{missing}"
    gone.unlink()
    other = ".bin" if missing == ".idx" else ".idx"
    want = rf"{split}/b_text_document{other}: .*b_text_document{re.escape(missing)} is missing"
    with pytest.raises(DataError, match=want):
        indexed.list_prefixes(tmp_path / split)
    with pytest.raises(DataError, match=want):
        LlamaData(16, 100, seed=1, eval_samples=4).open(tmp_path, split)
    (tmp_path / split / f"a_text_document{missing}").unlink()  # no complete pair left at all
    with pytest.raises(DataError, match=rf"a_text_document{re.escape(missing)} is missing"):
        indexed.list_prefixes(tmp_path / split)


@pytest.mark.parametrize("order", ["reference", "document"])
@pytest.mark.parametrize("ranks, local_batch", [(3, 4), (4, 3), (1, 96), (2, 5)])
def test_evaluation_reads_exactly_eval_samples_once(tmp_path: Path, ranks: int, local_batch: int, order: str) -> None:
    """Shrunk: 40 evaluation samples of 9 tokens with global batches (12, 12, 96, 10) that mostly do not divide 40.
    The instance's ranks together read exactly the first 40 samples of the validation set, each once: the global
    batches in order, a last partial one split over the ranks, none dropped or padded. ``reference`` (the reference's
    code): the first 40 of the validation GPTDataset shuffled with the run's seed (its index: 40 samples here), so
    another seed reads other windows; ``document`` (its README): the first 40 in document order, whatever the seed.
    The reference script evaluates ceil(1024 / gbs)
    whole global batches (limit_val_batches); at the batch sizes it accepts with a whole-step val_check_interval
    (ceil(12288 / gbs) / gbs: gbs 1, 2, 4, ..., 64, 37, 111) that is 1024 but at 37 and 111 (1036, 1110)."""
    import torch

    from hpcbench import registry
    from hpcbench.common.workload import DataShard

    docs = _docs(np.random.RandomState(11), 60, 1000)
    for split in ("train", "validation"):
        (tmp_path / split).mkdir()
        independent_write(tmp_path / split / f"c4-{split}_text_document", docs, "int32")
    seq, n = 8, 40
    stream = np.concatenate([np.array(d, dtype=np.int64) for d in docs])
    in_order = np.stack([stream[seq * i : seq * i + seq + 1] for i in range(n)])
    cls = registry.get("llama31_8b")
    seen = []
    for seed in (1, 7):
        if order == "document":
            want = in_order
        else:  # the whole seeded index (the training split's code path), its first n
            whole = gpt.GPTSamples(gpt.Corpus.open([tmp_path / "validation" / "c4-validation_text_document"], 1000),
                                   seq, seed, n, shuffle=True)
            want = np.stack([whole[i] for i in range(n)])
        seen.append(want)
        cfg = cls.load_config("mini", [f"data.root={tmp_path}", f"data.seq_len={seq}", f"data.eval_samples={n}",
                                       "model.vocab_size=1000", "data.threads=0", f"train.seed={seed}",
                                       f"data.eval_order={order}"])
        w = cls(cfg)
        per_rank = [list(w.eval_loader(DataShard(rank=r, size=ranks, seed=seed, local_batch_size=local_batch,
                                                 device=torch.device("cpu"))))
                    for r in range(ranks)]
        batches = -(-n // (ranks * local_batch))  # global batches, the last one partial unless gbs divides n
        got = [b.numpy() for g in range(batches) for rank in per_rank if g < len(rank) for b in rank[g:g + 1]]
        assert sum(len(b) for b in got) == n and w.dataset_sizes()[1] == n
        assert np.array_equal(np.concatenate(got), want)
    assert np.array_equal(seen[0], seen[1]) == (order == "document")
