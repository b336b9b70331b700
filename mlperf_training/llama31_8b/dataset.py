"""The Llama 3.1 8B dataset spec: ``train/`` and ``validation/`` folders of Megatron indexed datasets
(``PREFIX.bin`` + ``PREFIX.idx``, the files the reference's preprocessing writes for C4:
``c4-train.en_<k>_text_document`` and ``c4-validation-91205-samples.en_text_document``).

A split's prefixes (name order) form one list of documents (:class:`~.gpt.Corpus`) - or, for the training split
with ``data.train_blend`` (the reference's weighted prefix list), each named prefix is its own GPT dataset and
the samples are blended by weight as Megatron's ``BlendedDataset`` blends them (:mod:`.blend`); the training
samples are built as Megatron's GPT dataset builds them, in the order its shuffle index fixes from the run's seed
(:mod:`.gpt`), and read in that stored order (``order = "stored"``: contiguous global batches, as Megatron's
sampler hands them out). The evaluation samples are the first ``data.eval_samples`` of the validation split
built as the reference's code builds it (``data.eval_order = "reference"``: NeMo 2.1.0 on Megatron-core
core_r0.11.0 builds the validation GPTDataset like the training one, documents and samples shuffled with the run's
seed, over an index of ``data.eval_index_samples`` = NeMo's num_val_samples, and every evaluation reads the same
first 1024 of it), or the first of the split in document order (``"document"``: the reference's README, "We do
not shuffle the validation dataset"). The index arrays of each set are kept between ranks and runs in
``data.index_cache`` (:mod:`.index_cache`). A batch is ``(B, seq_len + 1)`` int64 tokens. Light to import
(``hpcbench pack``/``stage`` load :data:`LAYOUT`).
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from hpcbench.common.data.layout import FileLayout
from hpcbench.common.data.spec import DatasetSpec

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from .gpt import GPTSamples

LAYOUT = FileLayout("llama31_8b", ("*.bin", "*.idx"), ("train", "validation"),
                    describe="Megatron indexed datasets (PREFIX.bin + PREFIX.idx)")


class LlamaData(DatasetSpec):
    layout = LAYOUT
    order = "stored"
    partition = "contiguous"
    train_split = "train"
    eval_split = "validation"

    def __init__(self, seq_len: int, vocab_size: int, seed: int, train_samples: int = 0, eval_samples: int = 0,
                 train_blend: Sequence[str] = (), eval_order: str = "reference", eval_index_samples: int = 0,
                 index_cache: str = "none") -> None:
        self.seq_len, self.vocab_size, self.seed = seq_len, vocab_size, seed
        self.train_samples, self.eval_samples = train_samples, eval_samples
        self.train_blend = list(train_blend)
        self.eval_order, self.eval_index_samples = eval_order, eval_index_samples
        self.index_cache = index_cache

    def open(self, root: Path, split: str) -> "GPTSamples":
        from .gpt import Corpus, GPTSamples
        from .index_cache import resolve
        from .indexed import list_prefixes

        self.layout.list_split(root, split)  # a missing or empty split folder, named
        prefixes = list_prefixes(Path(root) / split)
        cache = resolve(self.index_cache, Path(root))
        if split == self.train_split and self.train_blend:
            from .blend import open_blend, parse_blend

            pairs = parse_blend(self.train_blend, [p.name for p in prefixes])
            by_name = {p.name: p for p in prefixes}
            corpora = [Corpus.open([by_name[name]], self.vocab_size) for _, name in pairs]
            return open_blend(corpora, [w for w, _ in pairs], self.seq_len, self.seed, self.train_samples,  # type: ignore[return-value]
                              cache)
        corpus = Corpus.open(prefixes, self.vocab_size)
        if split == self.train_split:
            return GPTSamples(corpus, self.seq_len, self.seed, self.train_samples, shuffle=True, cache=cache)
        if self.eval_order == "document":  # the first samples in document order: the seed draws nothing
            return GPTSamples(corpus, self.seq_len, 0, self.eval_samples, shuffle=False, limit=self.eval_samples,
                              cache=cache)
        # 0: an index of just the evaluation samples (as many passes over a small split as they need)
        return GPTSamples(corpus, self.seq_len, self.seed, self.eval_index_samples or self.eval_samples, shuffle=True,
                          limit=self.eval_samples, cache=cache)

    def collate(self, samples: Sequence[np.ndarray]) -> "torch.Tensor":
        import torch

        return torch.from_numpy(np.stack(samples))

    def read_batch(self, source: Any, indices: Sequence[int], pin: bool = False) -> "torch.Tensor":
        import torch

        out = torch.from_numpy(source.read(indices))
        return out.pin_memory() if pin else out
