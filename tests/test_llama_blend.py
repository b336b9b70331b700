"""llama31_8b blended training prefixes (data.train_blend, Megatron's weighted data_prefix): the greedy blending
indices against hand-worked sequences, the per-prefix sizes with the 0.5% surplus, a two-prefix blend read through
the dataset spec from files written by the independent writer, and the named refusals of a bad blend."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hpcbench.common.errors import ConfigError
from hpcbench.workloads.mlperf_training.llama31_8b import blend, gpt
from hpcbench.workloads.mlperf_training.llama31_8b.dataset import LlamaData
from hpcbench.workloads.mlperf_training.llama31_8b.indexed import IndexedDataset
from tests.test_llama_data import independent_write


def test_blending_indices_by_hand() -> None:
    # equal weights alternate, the first prefix winning the tie at sample 0
    ds, sample = blend.blending_indices([12.5, 12.5], 6)
    assert ds.dtype == np.int16 and sample.dtype == np.int64
    assert ds.tolist() == [0, 1, 0, 1, 0, 1] and sample.tolist() == [0, 0, 1, 1, 2, 2]
    # 3:1 - errors (w x max(i, 1) - taken) worked by hand: i=1 goes to the lagging 1, i=4 is a tie (0, 0) -> 0
    ds, sample = blend.blending_indices([3, 1], 8)
    assert ds.tolist() == [0, 1, 0, 0, 0, 1, 0, 0] and sample.tolist() == [0, 0, 1, 2, 3, 1, 4, 5]
    ds, _ = blend.blending_indices([5, 3, 2], 10_000)
    counts = np.bincount(ds, minlength=3)
    assert np.abs(counts - np.array([5000, 3000, 2000])).max() <= 1


def test_sizes_per_dataset_carry_the_surplus() -> None:
    # the reference's full dataset: 8 prefixes of weight 12.5; Megatron-core: ceil(ceil(size x w) x 1.005)
    assert blend.sizes_per_dataset([12.5] * 8, 1000) == [126] * 8
    assert blend.sizes_per_dataset([10], 12_288) == [12_350]  # one prefix (the reference's default) still blends
    assert blend.sizes_per_dataset([3, 1], 1000) == [754, 252]


def _two_prefixes(root: Path) -> None:
    rng = np.random.RandomState(0)
    (root / "train").mkdir(parents=True)
    # prefix a holds ids 0..49, prefix b ids 50..99: a sample tells where it came from
    independent_write(root / "train" / "a_text_document", [list(map(int, rng.randint(0, 50, rng.randint(5, 40))))
                                                          for _ in range(120)])
    independent_write(root / "train" / "b_text_document", [list(map(int, rng.randint(50, 100, rng.randint(5, 40))))
                                                          for _ in range(60)])


def test_a_weighted_blend_reads_each_prefix_as_its_own_gpt_dataset(tmp_path: Path) -> None:
    _two_prefixes(tmp_path)
    spec = LlamaData(16, 100, seed=5, train_samples=200, train_blend=["3", "a_text_document", "1", "b_text_document"])
    samples = spec.open(tmp_path, "train")
    assert len(samples) == 200
    a = gpt.GPTSamples(gpt.Corpus([IndexedDataset(tmp_path / "train" / "a_text_document", 100)]), 16, 5, 151)
    b = gpt.GPTSamples(gpt.Corpus([IndexedDataset(tmp_path / "train" / "b_text_document", 100)]), 16, 5, 51)
    ds, at = blend.blending_indices([3, 1], 200)
    for i in (0, 1, 2, 5, 100, 199):
        want = (a if ds[i] == 0 else b)[int(at[i])]
        got = samples[i]
        assert np.array_equal(got, want) and got.shape == (17,)
        assert bool((got < 50).all()) == (ds[i] == 0) and bool((got >= 50).all()) == (ds[i] == 1)
    assert samples.read([0, 1]).shape == (2, 17)
    # one pass (train_samples 0): the blend is as long as one pass over both prefixes
    one_pass = LlamaData(16, 100, seed=5, train_blend=["1", "a_text_document", "1", "b_text_document"]).open(tmp_path, "train")
    tokens = sum(int(IndexedDataset(tmp_path / "train" / p, 100).sequence_lengths.sum()) for p in ("a_text_document",
                                                                                                    "b_text_document"))
    assert abs(len(one_pass) - tokens // 16) <= 2


def test_a_blend_of_one_prefix_is_its_gpt_dataset_of_exactly_the_size(tmp_path: Path) -> None:
    """Megatron-core's builder (core_r0.11.0, "Blend consists of a single prefix") returns the prefix's GPT dataset
    built for exactly the blend's size: no surplus, no blending indices. The reference's default blend is one prefix,
    so the size fixes the passes and with them the order: built with the 0.5% surplus it would be another order.
    Here the size is exactly two passes' samples; with the surplus it would need a third pass, so another shuffle."""
    _two_prefixes(tmp_path)
    corpus = gpt.Corpus([IndexedDataset(tmp_path / "train" / "a_text_document", 100)])
    per_pass = (int(corpus.lengths.sum()) - 1) // 16
    n = 2 * per_pass
    samples = LlamaData(16, 100, seed=5, train_samples=n, train_blend=["10", "a_text_document"]).open(tmp_path, "train")
    exact = gpt.GPTSamples(corpus, 16, 5, n)
    surplus = gpt.GPTSamples(corpus, 16, 5, blend.sizes_per_dataset([10], n)[0])
    assert len(samples) == n and exact.epochs == 2 and surplus.epochs == 3
    assert all(np.array_equal(samples[i], exact[i]) for i in range(n))
    assert not all(np.array_equal(samples[i], surplus[i]) for i in range(n))


@pytest.mark.parametrize("bad, expected", [
    (["3", "a_text_document", "1"], r"'data.train_blend': expected pairs of weight and prefix"),
    (["x", "a_text_document"], r"'data.train_blend\[0\]': weight 'x' of prefix 'a_text_document' is not a number"),
    (["0", "a_text_document"], r"'data.train_blend\[0\]': weight of prefix 'a_text_document' must be > 0"),
    (["1", "c_text_document"], r"'data.train_blend\[1\]': prefix 'c_text_document' is not in the training split"),
    (["1", "a_text_document", "2", "a_text_document"], r"'data.train_blend\[3\]': prefix 'a_text_document' is named twice"),
])
def test_a_bad_blend_is_refused_by_key(tmp_path: Path, bad: list[str], expected: str) -> None:
    _two_prefixes(tmp_path)
    with pytest.raises(ConfigError, match=expected):
        LlamaData(16, 100, seed=5, train_samples=50, train_blend=bad).open(tmp_path, "train")


def test_the_config_key_reaches_the_dataset_spec() -> None:
    from hpcbench import registry

    cls = registry.get("llama31_8b")
    wl = cls(cls.load_config("mini", ["data.train_blend=[\"2\", \"x_text_document\"]"]))
    assert wl.dataset().train_blend == ["2", "x_text_document"]
    with pytest.raises(ConfigError, match="'data.train_blend': expected pairs"):
        cls.load_config("mini", ["data.train_blend=[\"2\"]"])


@pytest.mark.parametrize("missing", [".idx", ".bin"])
def test_a_blend_prefix_with_a_missing_file_is_named(tmp_path: Path, missing: str) -> None:
    """A blend over a split where one prefix lacks its .idx (or .bin): the missing file is named, whether
    or not the blend names that prefix (not 'not in the training split', not a silently smaller split)."""
    from hpcbench.common.errors import DataError

    _two_prefixes(tmp_path)
    (tmp_path / "train" / f"b_text_document{missing}").unlink()
    for names in (["1", "a_text_document", "1", "b_text_document"], ["1", "a_text_document"]):
        with pytest.raises(DataError, match=rf"b_text_document\{missing} is missing"):
            LlamaData(16, 100, seed=5, train_samples=50, train_blend=names).open(tmp_path, "train")
