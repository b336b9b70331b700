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
    """The reference's ``_get_weight`` (supplement 1.2.5): a length term max(min(L, 512), 256) / 512 times
    1 / sqrt(the chain's PDB-cluster size among ``rows``, the filtered training chains): mlcommons/hpc
    ``openfold/openfold/datasets.py`` since its commit 23da25c ("Set cluster_probability to 1 / sqrt")."""
    sizes = Counter(r.pdb_cluster_id for r in rows)
    return torch.tensor([max(min(r.sequence_length, 512), 256) / 512 / math.sqrt(sizes[r.pdb_cluster_id])
                         for r in rows], dtype=torch.float64)


#: the reference's CAMEO validation candidates (``openfold/data/cameo_targets.py``), shipped as data
CAMEO_TARGETS_FILE = Path(__file__).resolve().parent.parent / "cameo_targets.txt"
#: a dataset may carry its own candidates in the same format (the synthetic generator writes one)
DATASET_TARGETS = MMCIF_DIR / "cameo_targets.txt"


@dataclass(frozen=True)
class CameoTarget:
    submission_date: str  # YYYY-MM-DD
    pdb_id: str  # lower case
    chain_id: str  # mmCIF label chain id (sometimes the author's)


def read_cameo_targets(path: Path) -> list[CameoTarget]:
    """``date pdb_id chain`` per line ('#' comments): the CAMEO targets, in the file's order."""
    try:
        text = path.read_text()
    except OSError as e:
        raise DataError(f"{path}: cannot read the CAMEO targets ({e.strerror or e})") from e
    out = []
    for n, line in enumerate(text.splitlines(), start=1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        try:
            ok = len(parts) == 3 and bool(date.fromisoformat(parts[0]))
        except ValueError:
            ok = False
        if not ok:
            raise DataError(f"{path}: line {n}: {line!r} is not 'YYYY-MM-DD pdb_id chain_id'")
        out.append(CameoTarget(parts[0], parts[1].lower(), parts[2]))
    return out


def validation_rows(rows: list[store.ChainRow], targets: list[CameoTarget], min_date: str, max_date: str,
                    max_length: int) -> list[store.ChainRow]:
    """The reference's ``_select_cameo_targets_for_validation``: CAMEO targets submitted in [min, max], mapped
    from ``pdb_id`` + mmCIF chain id (or author chain id) to the author chain of ``chains.csv``, each author
    chain once, then at most ``max_length`` residues; in ``chains.csv`` order."""
    mapping: dict[str, str] = {}
    for r in rows:
        for m in r.mmcif_chain_ids.split(";"):
            mapping.setdefault(f"{r.pdb_id}_{m}", r.pdb_chain_id)
    for r in rows:  # a target named by its author chain
        mapping.setdefault(r.pdb_chain_id, r.pdb_chain_id)
    chosen: set[str] = set()
    for t in targets:
        if min_date <= t.submission_date <= max_date and f"{t.pdb_id}_{t.chain_id}" in mapping:
            chosen.add(mapping[f"{t.pdb_id}_{t.chain_id}"])
    return [r for r in rows if r.pdb_chain_id in chosen and r.sequence_length <= max_length]


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
