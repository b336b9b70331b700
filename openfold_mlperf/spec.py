"""The OpenFold dataset spec: the reference's samplers over its processed layout, and batches of feature dicts.

Training (``split`` "train"): the chains of ``chains.csv`` that pass the reference's training filter (release
date up to ``data.train_max_pdb_release_date``, resolution, residue frequency, PDB cluster), one epoch = one
pass of that many samples. Sample ``i`` of epoch ``e`` is a chain drawn by the reference's weights (length term
over the square root of the PDB-cluster size, with replacement, as ``InitialTrainingSampler``'s multinomial)
together with the seed of its crop, MSA sampling and masking, both from ``(seed, e, i)``; the harness's epoch
order only places the draws. Each training step runs a drawn number of recycling iterations (``RecyclingDraws``).
Evaluation (``split`` "validation"): the CAMEO targets submitted in the configured window, at most
``val_max_sequence_length`` residues, each whole (no crop) with the seed of its chain id, as
``ValidationSampler``. A batch stacks the samples' feature dicts (recycling dimension last), evaluation samples
of different lengths padded with masked residues.
"""
from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hpcbench.common.data.spec import DatasetSpec
from hpcbench.common.errors import DataError

from .config import OpenFoldDataConfig
from .layout import LAYOUT

Feats = dict[str, Any]


def chain_seed(pdb_chain_id: str) -> int:
    """A sample seed from a chain id (the validation samples' seeds do not change between evaluations)."""
    return int.from_bytes(hashlib.sha256(pdb_chain_id.encode()).digest()[:8], "little") % (2**63 - 1)


class TrainChains:
    """Weighted draws of training chains: ``[i]`` is the processed sample drawn for slot ``i`` of ``epoch``."""

    def __init__(self, chains: Any, weights: Any, seed: int) -> None:
        self.chains, self.seed, self.epoch = chains, seed, 0
        w = np.asarray(weights, np.float64)
        self.cdf = np.cumsum(w / w.sum())

    def __len__(self) -> int:
        return len(self.chains)

    def draw(self, i: int) -> tuple[int, int]:
        """(chain index, sample seed) of slot ``i`` in the current epoch."""
        rng = np.random.default_rng((self.seed, self.epoch, int(i)))
        chain = int(np.searchsorted(self.cdf, rng.random() * self.cdf[-1], side="right"))
        return min(chain, len(self.chains) - 1), int(rng.integers(0, 2**63 - 1))

    def __getitem__(self, i: int) -> Feats:
        return self.chains[self.draw(i)]

    def costs(self) -> np.ndarray:
        return np.ones(len(self.chains))


class EvalChains:
    """Every validation chain once, whole, seeded by its chain id."""

    def __init__(self, chains: Any) -> None:
        self.chains = chains

    def __len__(self) -> int:
        return len(self.chains)

    def __getitem__(self, i: int) -> Feats:
        return self.chains[(int(i), chain_seed(self.chains.rows[int(i)].pdb_chain_id))]

    def costs(self) -> np.ndarray:
        return np.asarray([r.sequence_length ** 2 for r in self.chains.rows], np.float64)


class OpenFoldData(DatasetSpec):
    layout = LAYOUT
    partition = "contiguous"
    train_split = "train"
    eval_split = "validation"

    def __init__(self, cfg: OpenFoldDataConfig, seed: int) -> None:
        self.cfg, self.seed = cfg, seed

    def pipeline_config(self) -> Any:
        from .data.pipeline import PipelineConfig

        c = self.cfg
        return PipelineConfig(crop_size=c.crop_size, max_msa_clusters=c.max_msa_clusters,
                              max_extra_msa=c.max_extra_msa, max_templates=c.max_templates,
                              num_recycling_iters=c.num_recycling_iters)

    def open(self, root: Path, split: str) -> TrainChains | EvalChains:
        from .data import dataset, store

        c, layout = self.cfg, dataset.Layout(Path(root))
        rows = store.read_chains(layout.chains)
        if split == self.train_split:
            train = dataset.train_filter(rows, c.train_max_pdb_release_date)
            if not train:
                raise DataError(f"{layout.chains}: no chain passes the training filter (released on or before "
                                f"{c.train_max_pdb_release_date}, resolution < 9 A, in a PDB cluster)")
            chains = dataset.ChainDataset(Path(root), train, rows, self.pipeline_config(), "train", c.trust_pickle)
            return TrainChains(chains, dataset.sampling_weights(train).numpy(), self.seed)
        if split != self.eval_split:
            raise DataError(f"{root}: unknown split {split!r}; expected {self.train_split!r} or {self.eval_split!r}")
        own = Path(root) / dataset.DATASET_TARGETS
        targets = dataset.read_cameo_targets(own if own.exists() else dataset.CAMEO_TARGETS_FILE)
        val = dataset.validation_rows(rows, targets, c.val_min_cameo_submission_date,
                                      c.val_max_cameo_submission_date, c.val_max_sequence_length)
        if not val:
            raise DataError(f"{layout.chains}: none of the CAMEO targets submitted {c.val_min_cameo_submission_date} "
                            f"..{c.val_max_cameo_submission_date} with <= {c.val_max_sequence_length} residues is a "
                            f"chain of the dataset (targets: {own if own.exists() else dataset.CAMEO_TARGETS_FILE})")
        return EvalChains(dataset.ChainDataset(Path(root), val, rows, self.pipeline_config(), "eval", c.trust_pickle))

    def collate(self, samples: Sequence[Feats]) -> Feats:
        """The samples' feature dicts stacked on a leading batch dimension; shorter chains (evaluation) padded
        with zeros (masked residues) to the longest along every residue dimension."""
        import torch
        import torch.nn.functional as F

        from . import features as schema

        n_res = max(int(s["aatype"].shape[0]) for s in samples)
        out: Feats = {}
        for key in samples[0]:
            spec = schema.FEATURES.get(key)
            parts = []
            for s in samples:
                x = s[key]
                if spec is not None and schema.N_RES in spec.shape:
                    pad: list[int] = [0, 0]  # the trailing recycling dimension
                    for dim, size in reversed(list(zip(spec.shape, x.shape))):
                        pad += [0, n_res - size] if dim == schema.N_RES else [0, 0]
                    if any(pad):
                        x = F.pad(x, pad)
                parts.append(x)
            out[key] = torch.stack(parts)
        return out


class RecyclingDraws:
    """The number of recycling iterations of each training step, as the reference's ``TrainBatchProperties``
    (``openfold/dataloaders.py``, ``_random_num_recycling_iters_generator``): a ``random.Random(seed)`` shuffles
    the values 0..``max_iters`` and hands them out in that order, then shuffles them again, one value per optimizer
    step. Every rank of an instance draws from the same seed, so all run the same number of iterations in a
    step; the step then uses the features of iterations 0..k only (``batch[..., :k + 1]``), and evaluation all
    of them. The seed is the instance's, hashed for this stream (the reference hashes
    ``initial_training_dataloader_<seed>``)."""

    def __init__(self, seed: int, max_iters: int) -> None:
        if max_iters < 0:
            raise ValueError(f"max_iters must be >= 0, got {max_iters}")
        digest = hashlib.sha256(f"recycling_{seed}".encode()).digest()
        self.seed, self.max_iters = int.from_bytes(digest[:8], "little"), max_iters

    def for_steps(self, first: int, count: int) -> list[int]:
        """The draws of the 0-based optimizer steps ``first`` .. ``first + count - 1`` of the run."""
        rng = random.Random(self.seed)
        values = list(range(self.max_iters + 1))
        out: list[int] = []
        step = 0
        while step < first + count:
            cycle = values.copy()
            rng.shuffle(cycle)
            for k in cycle:
                if step >= first and step < first + count:
                    out.append(k)
                step += 1
        return out


def recycled(batch: Feats, k: int) -> Feats:
    """The batch with the features of recycling iterations 0..k only (every tensor's last dimension)."""
    return {key: v[..., :k + 1] for key, v in batch.items()}


class EpochLoader:
    """The harness's training loader, telling the weighted source which epoch it draws for; with ``recycling``,
    each batch cut to the step's drawn number of recycling iterations (epoch ``e`` >= 1 holds the run's steps
    (e - 1) x len .. e x len - 1: the harness checkpoints at epoch ends, so an epoch always starts whole)."""

    def __init__(self, loader: Any, source: TrainChains, recycling: RecyclingDraws | None = None) -> None:
        self.loader, self.source, self.recycling = loader, source, recycling
        self.epoch = 1

    def set_epoch(self, epoch: int) -> None:
        self.source.epoch = self.epoch = epoch
        self.loader.set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        if self.recycling is None:
            return iter(self.loader)
        return self._recycled(self.recycling)

    def _recycled(self, draws: RecyclingDraws) -> Iterator[Any]:
        n = len(self.loader)
        ks = draws.for_steps(max(0, self.epoch - 1) * n, n)
        for i, batch in enumerate(self.loader):
            yield recycled(batch, ks[i])

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str) -> Any:  # state_dict, close, ...: the loader's
        return getattr(self.loader, name)
