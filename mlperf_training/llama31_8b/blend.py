"""Training prefixes blended by weight, as Megatron-LM's ``BlendedMegatronDatasetBuilder`` and ``BlendedDataset``
blend them (``megatron/core/datasets/blended_megatron_dataset_builder.py``, ``blended_dataset.py``,
``helpers.cpp: build_blending_indices``).

The reference names its training data as Megatron's ``data_prefix`` list, weight then prefix:
``["12.5", "c4-train.en_0_text_document", ..., "12.5", "c4-train.en_7_text_document"]`` with the full dataset,
``["10", "c4-train.en_6_text_document"]`` without (``small_llm_pretraining/nemo/pretrain_llama31.py``). Config key
``data.train_blend`` takes the same list (prefix names inside ``root/train/``). For a blend of ``size`` samples:

* the weights are normalised to sum 1;
* prefix ``d`` becomes its own GPT dataset (:class:`~.gpt.GPTSamples`, the run's seed) asked for
  ``ceil(ceil(size x w_d) x (1 + surplus))`` samples, ``surplus`` = 0.005 (Megatron-core's
  ``mid_level_dataset_surplus``; older releases wrote ``ceil(size x w_d x 1.005)``, equal but for rounding);
* sample ``i`` of the blend is sample ``dataset_sample_index[i]`` of prefix ``dataset_index[i]``, the prefix chosen
  greedily where the blend lags its weight most: ``argmax_d (w_d x max(i, 1) - taken_d)``, the first on ties.

``size`` is ``data.train_samples`` (Megatron: iterations x global batch), or with 0 the samples of one pass over
all the prefixes. A blend of one prefix (the reference's default, ``["10", "c4-train.en_6_text_document"]``) is no
blend: Megatron-core's builder returns that prefix's GPT dataset built for exactly ``size`` samples, no surplus
(``blended_megatron_dataset_builder.py``, core_r0.11.0: "Blend consists of a single prefix"), and so does
:func:`open_blend` (the size fixes the passes, so the order: 19,200,000, not 19,296,000).

Memory of a blend: 10 bytes per blended sample (int16 + int64), nothing per token.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from hpcbench.common.errors import ConfigError

from .gpt import GPTSamples, SampleRows

if TYPE_CHECKING:  # pragma: no cover
    from .index_cache import IndexCache

SURPLUS = 0.005  # Megatron-core's default mid_level_dataset_surplus


def parse_blend(blend: Sequence[str], available: Sequence[str], key: str = "data.train_blend") -> list[tuple[float, str]]:
    """``[weight, prefix, weight, prefix, ...]`` as ``[(weight, prefix), ...]``; refused by name: an odd length, a
    weight that is not a positive number, a prefix not among ``available``, a prefix named twice."""
    if len(blend) % 2 or not blend:
        raise ConfigError(f"config key '{key}': expected pairs of weight and prefix (\"12.5\", \"c4-train.en_0_text_document\""
                          f", ...), got {len(blend)} items")
    out: list[tuple[float, str]] = []
    for i in range(0, len(blend), 2):
        w, name = blend[i], str(blend[i + 1])
        try:
            weight = float(w)
        except (TypeError, ValueError):
            raise ConfigError(f"config key '{key}[{i}]': weight {w!r} of prefix {name!r} is not a number") from None
        if not math.isfinite(weight) or weight <= 0:
            raise ConfigError(f"config key '{key}[{i}]': weight of prefix {name!r} must be > 0, got {w!r}")
        if name not in available:
            raise ConfigError(f"config key '{key}[{i + 1}]': prefix {name!r} is not in the training split (it holds "
                              f"{', '.join(available) or 'nothing'})")
        if any(name == n for _, n in out):
            raise ConfigError(f"config key '{key}[{i + 1}]': prefix {name!r} is named twice")
        out.append((weight, name))
    return out


def normalized(weights: Sequence[float]) -> np.ndarray:
    w = np.asarray(weights, dtype=np.float64)
    return w / w.sum()


def sizes_per_dataset(weights: Sequence[float], size: int, surplus: float = SURPLUS) -> list[int]:
    """Samples each prefix's GPT dataset is built for (``weights`` normalised)."""
    return [int(math.ceil(math.ceil(size * w) * (1 + surplus))) for w in normalized(weights)]


def blending_indices(weights: Sequence[float], size: int) -> tuple[np.ndarray, np.ndarray]:
    """``(dataset_index int16, dataset_sample_index int64)`` of ``size`` blended samples (``weights`` normalised):
    each sample goes to the prefix with the largest ``w_d x max(i, 1) - taken_d`` (the first on ties)."""
    w = [float(x) for x in normalized(weights)]
    if len(w) > np.iinfo(np.int16).max + 1:
        raise ConfigError(f"{len(w)} prefixes in a blend: at most {np.iinfo(np.int16).max + 1} (int16 dataset ids)")
    dataset_index = np.empty(size, dtype=np.int16)
    sample_index = np.empty(size, dtype=np.int64)
    taken = [0] * len(w)
    ids = range(len(w))
    for i in range(size):
        at = float(max(i, 1))
        best, best_err = 0, w[0] * at - taken[0]
        for d in ids:
            err = w[d] * at - taken[d]
            if err > best_err:
                best, best_err = d, err
        dataset_index[i] = best
        sample_index[i] = taken[best]
        taken[best] += 1
    return dataset_index, sample_index


class BlendedSamples(SampleRows):
    """``size`` samples drawn from the prefixes' GPT datasets by weight (a :class:`SampleSource` like
    :class:`~.gpt.GPTSamples`)."""

    def __init__(self, parts: Sequence[GPTSamples], weights: Sequence[float], size: int) -> None:
        if len(parts) != len(weights) or not parts:
            raise ValueError(f"{len(parts)} datasets and {len(weights)} weights")
        self.parts, self.weights, self.size = list(parts), list(normalized(weights)), size
        self.seq_len = parts[0].seq_len
        self.dataset_index, self.dataset_sample_index = blending_indices(weights, size)
        for d, part in enumerate(self.parts):  # the surplus makes each part long enough; checked, not assumed
            need = int((self.dataset_index == d).sum())
            if need > len(part):
                raise ConfigError(f"{part.corpus.where()}: the blend takes {need} samples of it, it was built with "
                                  f"{len(part)}")

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> np.ndarray:
        if not 0 <= i < self.size:
            raise IndexError(f"sample {i} of {self.size}")
        return self.parts[int(self.dataset_index[i])][int(self.dataset_sample_index[i])]



def open_blend(corpora: Sequence[object], weights: Sequence[float], seq_len: int, seed: int,
               num_samples: int, cache: "IndexCache | None" = None) -> SampleRows:
    """The blend of ``corpora`` (one :class:`~.gpt.Corpus` per prefix) of ``num_samples`` samples (0: one pass over
    all of them), each part a GPT dataset with the run's seed, built for its share plus the surplus (its index
    arrays kept in ``cache``, an :class:`~.index_cache.IndexCache`, when given)."""
    if num_samples <= 0:
        num_samples = sum((int(c.lengths.sum(dtype=np.int64)) - 1) // seq_len for c in corpora)  # type: ignore[attr-defined]
    if len(corpora) == 1:  # Megatron builds no BlendedDataset for one prefix: one GPT dataset of exactly the size
        return GPTSamples(corpora[0], seq_len, seed, num_samples, shuffle=True, limit=num_samples,  # type: ignore[arg-type]
                          compact=False, cache=cache)
    sizes = sizes_per_dataset(weights, num_samples)
    parts = [GPTSamples(c, seq_len, seed, n, shuffle=True, cache=cache) for c, n in zip(corpora, sizes)]  # type: ignore[arg-type]
    return BlendedSamples(parts, weights, num_samples)
