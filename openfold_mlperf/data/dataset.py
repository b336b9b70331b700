"""The reference's training/validation datasets over its preprocessed layout (mlcommons/hpc
``openfold/datasets.py``)::

    <root>/pdb_mmcif/processed/{chains.csv, obsolete.dat, dicts/}
    <root>/open_protein_set/processed/pdb_alignments/{super.index, <k>.db}

A sample is ``(index, seed)``: the chain's structure (from ``dicts``), its alignments (``uniref90_hits.a3m``,
``bfd_uniclust_hits.a3m``, ``mgnify_hits.a3m`` in that order, ``pdb70_hits.hhr`` for templates), template
features seeded with ``seed``, then :func:`pipeline.process_features`. Training chains are filtered as the
reference does (release date window, resolution < 9 A or unknown, no residue type above 80%, in a PDB
cluster) and weighted for sampling by length and cluster size (supplement 1.2.5).
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import torch

from hpcbench.common.errors import DataError

from . import a3m, hhr, pipeline, store
from .templates import TemplateFeaturizer

MMCIF_DIR = Path("pdb_mmcif/processed")
ALIGNMENTS_DIR = Path("open_protein_set/processed/pdb_alignments")
A3M_FILES = ("uniref90_hits.a3m", "bfd_uniclust_hits.a3m", "mgnify_hits.a3m")
HHR_FILE = "pdb70_hits.hhr"


def aa_frequency_ok(sequence: str, max_frequency: float = 0.8) -> bool:
    if not sequence:
        return False
    return Counter(sequence).most_common(1)[0][1] / len(sequence) <= max_frequency


def train_filter(rows: list[store.ChainRow], max_release_date: str, min_release_date: str = "1900-01-01") -> list[store.ChainRow]:
    return [r for r in rows if min_release_date <= r.release_date <= max_release_date
            and (math.isnan(r.resolution) or r.resolution < 9.0) and aa_frequency_ok(r.sequence)
            and r.pdb_cluster_id != -1]


def sampling_weights(rows: list[store.ChainRow]) -> torch.Tensor:
    """length term max(min(L, 512), 256) / 512 times 1/sqrt(cluster size) over the given rows."""
    sizes = Counter(r.pdb_cluster_id for r in rows)
    return torch.tensor([max(min(r.sequence_length, 512), 256) / 512 / math.sqrt(sizes[r.pdb_cluster_id])
                         for r in rows], dtype=torch.float64)


@dataclass
class Layout:
    root: Path

    @property
    def chains(self) -> Path:
        return self.root / MMCIF_DIR / "chains.csv"

    @property
    def obsolete(self) -> Path:
        return self.root / MMCIF_DIR / "obsolete.dat"

    @property
    def dicts(self) -> Path:
        return self.root / MMCIF_DIR / "dicts"

    @property
    def alignments(self) -> Path:
        return self.root / ALIGNMENTS_DIR


class ChainDataset:
    """Chains of ``rows`` (a subset of ``chains.csv``) turned into feature dicts by ``(index, seed)``."""

    def __init__(self, root: Path, rows: list[store.ChainRow], all_rows: list[store.ChainRow],
                 cfg: pipeline.PipelineConfig, mode: str, trust_pickle: bool = False) -> None:
        layout = Layout(Path(root))
        self.rows, self.cfg, self.mode = rows, cfg, mode
        self.dicts = store.Dicts(layout.dicts, trust_pickle)
        self.alignments = store.AlignmentDB(layout.alignments)
        missing = [r.pdb_chain_id for r in rows if r.pdb_chain_id not in self.alignments]
        if missing:
            raise DataError(f"{layout.alignments / 'super.index'}: no alignments for {len(missing)} chains of "
                            f"{layout.chains}, e.g. {missing[:3]}")
        dates = {r.pdb_id: date.fromisoformat(r.release_date) for r in all_rows}
        self.templates = TemplateFeaturizer(
            max_templates=cfg.max_templates, load_structure=self.dicts.load,
            template_chain_ids={r.pdb_chain_id for r in all_rows}, release_dates=dates,
            obsolete=store.read_obsolete(layout.obsolete) if layout.obsolete.exists() else {},
            shuffle_top_k=20 if mode == "train" else None)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index_seed: tuple[int, int]) -> dict[str, torch.Tensor]:
        index, seed = index_seed
        row = self.rows[index]
        s = self.dicts.load(row.pdb_id)
        if row.author_chain_id not in s.atoms:
            raise DataError(f"{self.dicts.folder}: entry {row.pdb_id} has no chain {row.author_chain_id!r}")
        if s.sequences[row.author_chain_id] != row.sequence:
            raise DataError(f"{self.dicts.folder}: {row.pdb_chain_id} sequence differs from chains.csv")
        files = self.alignments.load(row.pdb_chain_id)
        where = f"{self.alignments.folder}[{row.pdb_chain_id}]"
        msas = [(f"{where}/{n}", a3m.parse(files[n], f"{where}/{n}")) for n in A3M_FILES if files.get(n)]
        hits = hhr.parse(files.get(HHR_FILE, ""), f"{where}/{HHR_FILE}")
        tf = self.templates.features(row.sequence, hits, date.fromisoformat(row.release_date), row.pdb_id, seed)
        atoms = s.atoms[row.author_chain_id]
        raw = pipeline.raw_features(row.sequence, atoms.positions, atoms.mask, s.resolution,
                                    a3m.msa_features(row.sequence, msas), tf.features)
        return pipeline.process_features(raw, self.cfg, self.mode, seed)
