"""mmCIF structures as the reference reads them (mlcommons/hpc ``openfold/data/mmcif.py``), without Biopython.

From one PDB entry (``.cif`` or ``.cif.gz``) the reference keeps: the entry id, experimental method, release
date (earliest ``_pdbx_audit_revision_history.revision_date``), resolution (``_refine.ls_d_res_high``, else
``_em_3d_reconstruction.resolution``, else ``_reflns.d_resolution_high``; the largest numeric value; NaN if
none), the peptide polymer chains (an ``_entity_poly_seq`` entity with a monomer whose ``_chem_comp.type``
contains "peptide"), their author chain ids, SEQRES sequences (unknown residues 'X') and, from model 1 of
``_atom_site``, atom37 positions and masks per SEQRES position (``label_seq_id`` minus the entity's first
``num``); residues without atoms stay masked, a selenomethionine's SE fills the SD slot, and of alternate
locations the one with the highest occupancy is kept (the first on ties), as Biopython selects.
"""
from __future__ import annotations

import gzip
import math
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

import numpy as np

from hpcbench.common.errors import DataError

from . import cif
from ..residue_constants import ATOM_ORDER, one_letter

ATOM_SITE_ITEMS = ("group_PDB", "label_atom_id", "label_comp_id", "label_asym_id", "label_seq_id",
                   "auth_asym_id", "auth_seq_id", "Cartn_x", "Cartn_y", "Cartn_z", "pdbx_PDB_model_num")


@dataclass
class ChainAtoms:
    positions: np.ndarray  # (L, 37, 3) float32
    mask: np.ndarray  # (L, 37) bool


@dataclass
class Structure:
    """The reference's ``mmcif_dict`` as a typed record (``to_reference_dict`` gives the dict itself)."""

    pdb_id: str
    exptl_method: str
    release_date: str
    resolution: float
    author_chain_ids: list[str]
    entity_id_to_mmcif_chain_ids: dict[str, list[str]]
    mmcif_chain_id_to_author_chain_id: dict[str, str]
    sequences: dict[str, str]
    atoms: dict[str, ChainAtoms] = field(default_factory=dict)

    def to_reference_dict(self) -> dict:
        return {"pdb_id": self.pdb_id, "exptl_method": self.exptl_method, "release_date": self.release_date,
                "resolution": self.resolution, "author_chain_ids": list(self.author_chain_ids),
                "entity_id_to_mmcif_chain_ids": dict(self.entity_id_to_mmcif_chain_ids),
                "mmcif_chain_id_to_author_chain_id": dict(self.mmcif_chain_id_to_author_chain_id),
                "sequences": dict(self.sequences),
                "atoms": {c: {"all_atom_positions": a.positions, "all_atom_mask": a.mask} for c, a in self.atoms.items()}}


def read_text(path: Path) -> str:
    """The text of a ``.cif`` or ``.cif.gz`` file."""
    try:
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        return raw.decode("utf-8")
    except (OSError, EOFError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: cannot read mmCIF ({e})") from e


def read(path: Path) -> Structure:
    return parse(read_text(path), str(path))


def _need(d: dict[str, list[str]], item: str, where: str, why: str) -> list[str]:
    if item not in d:
        raise DataError(f"{where}: mmCIF has no {item} ({why})")
    return d[item]


def _columns(d: dict[str, list[str]], items: tuple[str, ...], prefix: str, where: str) -> list[list[str]]:
    cols = [_need(d, f"{prefix}.{i}", where, f"the {prefix} loop needs {', '.join(items)}") for i in items]
    n = len(cols[0])
    for i, c in zip(items, cols):
        if len(c) != n:
            raise DataError(f"{where}: {prefix}.{i} has {len(c)} values, {prefix}.{items[0]} has {n}")
    return cols


def _resolution(d: dict[str, list[str]]) -> float:
    for item in ("_refine.ls_d_res_high", "_em_3d_reconstruction.resolution", "_reflns.d_resolution_high"):
        if item in d:
            vals = []
            for v in d[item]:
                try:
                    f = float(v)
                except ValueError:
                    continue
                if not math.isnan(f):
                    vals.append(f)
            return max(vals) if vals else float("nan")
    return float("nan")


def parse(text: str, where: str) -> Structure:
    """Parse one mmCIF entry into a :class:`Structure`."""
    d = cif.parse(text, where)
    entry = _need(d, "_entry.id", where, "the PDB id")
    if len(entry) != 1 or len(entry[0]) != 4:
        raise DataError(f"{where}: _entry.id {entry!r} is not one 4-character PDB id")
    pdb_id = entry[0].lower()
    methods = _need(d, "_exptl.method", where, "the experimental method")
    dates = _need(d, "_pdbx_audit_revision_history.revision_date", where, "the release date")
    for s in dates:
        try:
            date.fromisoformat(s)
        except ValueError:
            raise DataError(f"{where}: revision_date {s!r} is not YYYY-MM-DD") from None
    entity_of_asym: dict[str, str] = {}
    by_entity: dict[str, list[str]] = defaultdict(list)
    for asym, ent in zip(*_columns(d, ("id", "entity_id"), "_struct_asym", where)):
        by_entity[ent].append(asym)
        entity_of_asym[asym] = ent
    polymers: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for ent, num, mon in zip(*_columns(d, ("entity_id", "num", "mon_id"), "_entity_poly_seq", where)):
        try:
            polymers[ent].append((int(num), mon))
        except ValueError:
            raise DataError(f"{where}: _entity_poly_seq.num {num!r} of entity {ent} is not an integer") from None
    chem_type = dict(zip(*_columns(d, ("id", "type"), "_chem_comp", where)))
    legal: dict[str, list[tuple[int, str]]] = {}
    for ent, poly in polymers.items():
        for num, mon in poly:
            if mon not in chem_type:
                raise DataError(f"{where}: residue {mon} of entity {ent} has no _chem_comp entry")
        if any("peptide" in chem_type[mon].lower() for _, mon in poly):
            for asym in by_entity.get(ent, []):
                legal[asym] = poly
    if not legal:
        raise DataError(f"{where}: no peptide polymer chain (expected an _entity_poly_seq entity of amino acids)")

    cols = dict(zip(ATOM_SITE_ITEMS, _columns(d, ATOM_SITE_ITEMS, "_atom_site", where)))
    alt = d.get("_atom_site.label_alt_id")
    occ = d.get("_atom_site.occupancy")
    author_of: dict[str, str] = {}
    model_rows = [i for i, m in enumerate(cols["pdbx_PDB_model_num"]) if m == "1"]
    for i in model_rows:
        asym, auth = cols["label_asym_id"][i], cols["auth_asym_id"][i]
        if author_of.setdefault(asym, auth) != auth:
            raise DataError(f"{where}: _atom_site row {i + 1}: chain {asym} has author ids {author_of[asym]} and {auth}")
    sequences: dict[str, str] = {}
    start: dict[str, int] = {}
    for asym, poly in legal.items():
        if asym not in author_of:
            continue  # a polymer without any atom in model 1: the reference has no author id for it
        auth = author_of[asym]
        if auth in sequences:
            raise DataError(f"{where}: author chain {auth} holds two polymer chains")
        sequences[auth] = "".join(one_letter(mon) for _, mon in poly)
        start[asym] = min(n for n, _ in poly)
    if not sequences:
        raise DataError(f"{where}: no _atom_site rows of model 1 in a peptide chain")
    pos = {a: np.zeros((len(s), 37, 3), np.float32) for a, s in sequences.items()}
    mask = {a: np.zeros((len(s), 37), bool) for a, s in sequences.items()}
    best_occ: dict[tuple[str, int, int], float] = {}
    for i in model_rows:
        asym = cols["label_asym_id"][i]
        if asym not in start:
            continue
        auth = author_of[asym]
        seq_id = cols["label_seq_id"][i]
        try:
            res = int(seq_id) - start[asym]
        except ValueError:
            raise DataError(f"{where}: _atom_site row {i + 1}: label_seq_id {seq_id!r} of polymer chain {asym} "
                            "is not an integer") from None
        if not 0 <= res < len(sequences[auth]):
            raise DataError(f"{where}: _atom_site row {i + 1}: residue {seq_id} of chain {asym} is outside its "
                            f"sequence of {len(sequences[auth])} residues")
        name = cols["label_atom_id"][i]
        if name.upper() == "SE" and cols["label_comp_id"][i] == "MSE":
            name = "SD"
        slot = ATOM_ORDER.get(name)
        if slot is None:
            continue
        try:
            xyz = [float(cols[k][i]) for k in ("Cartn_x", "Cartn_y", "Cartn_z")]
            o = float(occ[i]) if occ is not None and occ[i] not in ".?" else 1.0
        except ValueError:
            raise DataError(f"{where}: _atom_site row {i + 1}: coordinates/occupancy are not numbers") from None
        if not all(math.isfinite(v) for v in xyz):
            raise DataError(f"{where}: _atom_site row {i + 1}: non-finite coordinate {xyz}")
        key = (auth, res, slot)
        if key in best_occ and (alt is None or alt[i] in ".?" or o <= best_occ[key]):
            continue
        best_occ[key] = o
        pos[auth][res, slot] = xyz
        mask[auth][res, slot] = True
    return Structure(pdb_id=pdb_id, exptl_method=";".join(methods), release_date=min(dates),
                     resolution=_resolution(d), author_chain_ids=list(sequences),
                     entity_id_to_mmcif_chain_ids={k: list(v) for k, v in by_entity.items()},
                     mmcif_chain_id_to_author_chain_id=author_of, sequences=sequences,
                     atoms={a: ChainAtoms(pos[a], mask[a]) for a in sequences})
