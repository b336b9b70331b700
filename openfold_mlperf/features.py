"""The feature dict the data pipeline hands the model: one typed schema, read from the reference.

Source: mlcommons/hpc ``openfold/openfold/config.py`` (``FEATURE_SHAPES``) and the transforms that build
each feature (``openfold/openfold/data/transforms.py``, ``features.py``). Every array below carries the
recycling dimension LAST (``N_recycle`` = ``num_recycling_iters + 1``), as the reference stacks the
per-iteration ("ensembled") dicts with ``torch.stack(..., dim=-1)``; a batch adds a leading batch dim.

Symbols: ``N_res`` residues (crop size when training), ``N_clust`` clustered MSA rows (124 closed),
``N_extra_seq`` extra MSA rows (1024 closed), ``N_templ`` templates (4 closed), ``N_recycle``.
Integers in the schema are fixed sizes (37 atom types, 14 compact atoms, 8 rigid groups, 7 torsions).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Union

import numpy as np

Dim = Union[str, int]

N_RES = "N_res"
N_CLUST = "N_clust"
N_EXTRA = "N_extra_seq"
N_TEMPL = "N_templ"
N_RECYCLE = "N_recycle"
SIZE_SYMBOLS = (N_RES, N_CLUST, N_EXTRA, N_TEMPL, N_RECYCLE)


@dataclass(frozen=True)
class FeatureSpec:
    """One model input: dtype (numpy/torch name) and shape without the trailing recycling dim."""

    dtype: str
    shape: tuple[Dim, ...]

    def full_shape(self) -> tuple[Dim, ...]:
        """The shape as handed to the model: recycling dim last."""
        return (*self.shape, N_RECYCLE)


_F, _I = "float32", "int64"

#: name -> spec; the keys and per-iteration shapes are the reference's ``FEATURE_SHAPES`` plus
#: ``use_clamped_fape`` (added by ``process_features`` in train mode, shape ``(N_recycle,)``).
#: dtypes follow the reference transforms: ints are cast to int64 (``cast_to_64bit_ints``), masks,
#: one-hots and geometry are float32.
FEATURES: dict[str, FeatureSpec] = {
    # sequence
    "aatype": FeatureSpec(_I, (N_RES,)),
    "residue_index": FeatureSpec(_I, (N_RES,)),
    "seq_length": FeatureSpec(_I, ()),
    "seq_mask": FeatureSpec(_F, (N_RES,)),
    "target_feat": FeatureSpec(_F, (N_RES, 22)),
    # clustered MSA (BERT-corrupted) and its targets
    "msa_feat": FeatureSpec(_F, (N_CLUST, N_RES, 49)),
    "msa_mask": FeatureSpec(_F, (N_CLUST, N_RES)),
    "msa_row_mask": FeatureSpec(_F, (N_CLUST,)),
    "bert_mask": FeatureSpec(_F, (N_CLUST, N_RES)),
    "true_msa": FeatureSpec(_I, (N_CLUST, N_RES)),
    # extra MSA
    "extra_msa": FeatureSpec(_I, (N_EXTRA, N_RES)),
    "extra_msa_mask": FeatureSpec(_F, (N_EXTRA, N_RES)),
    "extra_msa_row_mask": FeatureSpec(_F, (N_EXTRA,)),
    "extra_has_deletion": FeatureSpec(_F, (N_EXTRA, N_RES)),
    "extra_deletion_value": FeatureSpec(_F, (N_EXTRA, N_RES)),
    # templates
    "template_aatype": FeatureSpec(_I, (N_TEMPL, N_RES)),
    "template_all_atom_positions": FeatureSpec(_F, (N_TEMPL, N_RES, 37, 3)),
    "template_all_atom_mask": FeatureSpec(_F, (N_TEMPL, N_RES, 37)),
    "template_mask": FeatureSpec(_F, (N_TEMPL,)),
    "template_pseudo_beta": FeatureSpec(_F, (N_TEMPL, N_RES, 3)),
    "template_pseudo_beta_mask": FeatureSpec(_F, (N_TEMPL, N_RES)),
    "template_sum_probs": FeatureSpec(_F, (N_TEMPL, 1)),
    "template_torsion_angles_sin_cos": FeatureSpec(_F, (N_TEMPL, N_RES, 7, 2)),
    "template_alt_torsion_angles_sin_cos": FeatureSpec(_F, (N_TEMPL, N_RES, 7, 2)),
    "template_torsion_angles_mask": FeatureSpec(_F, (N_TEMPL, N_RES, 7)),
    # atom layouts
    "atom14_atom_exists": FeatureSpec(_F, (N_RES, 14)),
    "atom37_atom_exists": FeatureSpec(_F, (N_RES, 37)),
    "residx_atom14_to_atom37": FeatureSpec(_I, (N_RES, 14)),
    "residx_atom37_to_atom14": FeatureSpec(_I, (N_RES, 37)),
    # ground truth (train and eval)
    "all_atom_positions": FeatureSpec(_F, (N_RES, 37, 3)),
    "all_atom_mask": FeatureSpec(_F, (N_RES, 37)),
    "atom14_gt_positions": FeatureSpec(_F, (N_RES, 14, 3)),
    "atom14_gt_exists": FeatureSpec(_F, (N_RES, 14)),
    "atom14_alt_gt_positions": FeatureSpec(_F, (N_RES, 14, 3)),
    "atom14_alt_gt_exists": FeatureSpec(_F, (N_RES, 14)),
    "atom14_atom_is_ambiguous": FeatureSpec(_F, (N_RES, 14)),
    "rigidgroups_gt_frames": FeatureSpec(_F, (N_RES, 8, 4, 4)),
    "rigidgroups_alt_gt_frames": FeatureSpec(_F, (N_RES, 8, 4, 4)),
    "rigidgroups_gt_exists": FeatureSpec(_F, (N_RES, 8)),
    "rigidgroups_group_exists": FeatureSpec(_F, (N_RES, 8)),
    "rigidgroups_group_is_ambiguous": FeatureSpec(_F, (N_RES, 8)),
    "backbone_rigid_tensor": FeatureSpec(_F, (N_RES, 4, 4)),
    "backbone_rigid_mask": FeatureSpec(_F, (N_RES,)),
    "chi_angles_sin_cos": FeatureSpec(_F, (N_RES, 4, 2)),
    "chi_mask": FeatureSpec(_F, (N_RES, 4)),
    "pseudo_beta": FeatureSpec(_F, (N_RES, 3)),
    "pseudo_beta_mask": FeatureSpec(_F, (N_RES,)),
    "resolution": FeatureSpec(_F, ()),
    "is_distillation": FeatureSpec(_F, ()),
}
#: added by ``process_features`` in train mode only, already per recycling iteration (no extra dim)
USE_CLAMPED_FAPE = "use_clamped_fape"
USE_CLAMPED_FAPE_SPEC = FeatureSpec(_F, ())

#: features that exist only with ground truth (mode "train" or "eval"); the rest exist in every mode
SUPERVISED = frozenset({
    "all_atom_positions", "all_atom_mask", "atom14_gt_positions", "atom14_gt_exists",
    "atom14_alt_gt_positions", "atom14_alt_gt_exists", "atom14_atom_is_ambiguous",
    "rigidgroups_gt_frames", "rigidgroups_alt_gt_frames", "rigidgroups_gt_exists",
    "rigidgroups_group_exists", "rigidgroups_group_is_ambiguous", "backbone_rigid_tensor",
    "backbone_rigid_mask", "chi_angles_sin_cos", "chi_mask", "pseudo_beta", "pseudo_beta_mask",
    "resolution", "is_distillation",
})


@dataclass(frozen=True)
class Sizes:
    """Concrete sizes for the symbols (the closed setup: crop 256, 124 clusters, 1024 extra, 4 templates,
    3 recycling iterations)."""

    n_res: int = 256
    n_clust: int = 124
    n_extra_seq: int = 1024
    n_templ: int = 4
    n_recycle: int = 4

    def resolve(self, shape: tuple[Dim, ...]) -> tuple[int, ...]:
        table = {N_RES: self.n_res, N_CLUST: self.n_clust, N_EXTRA: self.n_extra_seq,
                 N_TEMPL: self.n_templ, N_RECYCLE: self.n_recycle}
        return tuple(table[d] if isinstance(d, str) else d for d in shape)


def expected(train: bool = True, supervised: bool = True) -> dict[str, FeatureSpec]:
    """The names a processed sample holds: every feature, less ground truth without supervision, plus
    ``use_clamped_fape`` when training (the reference's train/eval/predict modes)."""
    out = {k: v for k, v in FEATURES.items() if supervised or k not in SUPERVISED}
    if train:
        out[USE_CLAMPED_FAPE] = USE_CLAMPED_FAPE_SPEC
    return out


def check(sample: Mapping[str, object], sizes: Sizes, train: bool = True, supervised: bool = True,
          where: str = "sample") -> None:
    """Raise ``ValueError`` naming the feature when ``sample`` (numpy arrays or torch tensors, no batch dim)
    differs from the schema in names, dtypes or shapes."""
    want = expected(train, supervised)
    missing = sorted(set(want) - set(sample))
    extra = sorted(set(sample) - set(want))
    if missing or extra:
        raise ValueError(f"{where}: feature names differ from the schema: missing {missing}, unexpected {extra}")
    for name, spec in want.items():
        value = sample[name]
        shape = tuple(getattr(value, "shape", ()))
        dtype = str(getattr(value, "dtype", "")).replace("torch.", "")
        full = spec.full_shape() if name != USE_CLAMPED_FAPE else (N_RECYCLE,)
        if shape != sizes.resolve(full):
            raise ValueError(f"{where}: feature '{name}' has shape {shape}, expected {full} = {sizes.resolve(full)}")
        if np.dtype(dtype) != np.dtype(spec.dtype):
            raise ValueError(f"{where}: feature '{name}' has dtype {dtype}, expected {spec.dtype}")
