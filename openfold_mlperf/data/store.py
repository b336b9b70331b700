"""The reference's preprocessed dataset (mlcommons/hpc openfold README, ``scripts/preprocess_*.py``)::

    pdb_mmcif/processed/chains.csv         one row per author chain (columns CHAIN_COLUMNS)
    pdb_mmcif/processed/obsolete.dat       PDB's obsolete list (OBSLTE lines: old id -> new id)
    pdb_mmcif/processed/dicts/<xy>         pickled {pdb_id: mmcif_dict} per pdb_id[1:3], atoms zlib-compressed
    open_protein_set/processed/pdb_alignments/super.index   JSON {pdb_chain_id: {"db": "<k>.db",
                                                            "files": [[filename, start, size], ...]}}
    open_protein_set/processed/pdb_alignments/<k>.db        the alignment files' bytes back to back

Everything but ``dicts/<xy>`` is plain text or bytes. The pickled dicts run code when unpickled, so they are
read only with ``trust_pickle`` (the OC20 rule); ``dicts/<xy>.npz`` is this project's pickle-free
equivalent (written by :func:`write_dicts`, read with ``allow_pickle=False``) and is preferred when present.
"""
from __future__ import annotations

import csv
import io
import json
import math
import pickle
import re
import zipfile
import zlib
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import numpy as np

from hpcbench.common.atomic import atomic_write
from hpcbench.common.errors import DataError

from .mmcif import ChainAtoms, Structure

CHAIN_COLUMNS = ("pdb_chain_id", "pdb_id", "author_chain_id", "mmcif_chain_ids", "release_date", "resolution",
                 "pdb_cluster_id", "sequence_length", "sequence")
ISO_DATE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")
TRUST_HINT = ("unpickling runs code from the file. If you trust its source (the reference's published "
              "dataset), train with `--set data.trust_pickle=true`, or convert the dicts once to the pickle-free "
              "dicts/<xy>.npz with hpcbench.workloads.openfold_mlperf.data.store.convert_pickled_dicts")


@dataclass(frozen=True)
class ChainRow:
    pdb_chain_id: str
    pdb_id: str
    author_chain_id: str
    mmcif_chain_ids: str
    release_date: str
    resolution: float
    pdb_cluster_id: int
    sequence_length: int
    sequence: str


def read_chains(path: Path) -> list[ChainRow]:
    """``chains.csv`` as the reference loads it (empty resolution -> NaN, no other NA strings)."""
    try:
        text = path.read_text()
    except OSError as e:
        raise DataError(f"{path}: cannot read chains table ({e})") from e
    reader = csv.DictReader(io.StringIO(text))
    missing = [c for c in CHAIN_COLUMNS if c not in (reader.fieldnames or [])]
    if missing:
        raise DataError(f"{path}: missing columns {missing} (expected {list(CHAIN_COLUMNS)})")
    rows = []
    for n, r in enumerate(reader, start=2):
        try:
            res = float(r["resolution"]) if r["resolution"] != "" else math.nan
            row = ChainRow(r["pdb_chain_id"], r["pdb_id"], r["author_chain_id"], r["mmcif_chain_ids"],
                           r["release_date"], res, int(r["pdb_cluster_id"]), int(r["sequence_length"]), r["sequence"])
        except (TypeError, ValueError):
            raise DataError(f"{path}: line {n}: resolution/pdb_cluster_id/sequence_length are not numbers") from None
        if not _is_iso_date(row.release_date):
            raise DataError(f"{path}: line {n}: column release_date: {row.release_date!r} is not a date YYYY-MM-DD "
                            "(the training date window compares it as one)")
        if row.pdb_chain_id != f"{row.pdb_id}_{row.author_chain_id}":
            raise DataError(f"{path}: line {n}: pdb_chain_id {row.pdb_chain_id!r} is not pdb_id_author_chain_id")
        if row.sequence_length != len(row.sequence):
            raise DataError(f"{path}: line {n}: sequence_length {row.sequence_length} but the sequence has "
                            f"{len(row.sequence)} residues")
        rows.append(row)
    return rows


def _is_iso_date(s: str) -> bool:
    """``s`` is exactly YYYY-MM-DD and a real date (``date.fromisoformat`` alone also takes 20200515, 2020-W20-5)."""
    if not ISO_DATE.fullmatch(s):
        return False
    try:
        date.fromisoformat(s)
    except ValueError:
        return False
    return True


def write_chains(path: Path, rows: list[ChainRow]) -> None:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CHAIN_COLUMNS)
    for r in rows:
        w.writerow([r.pdb_chain_id, r.pdb_id, r.author_chain_id, r.mmcif_chain_ids, r.release_date,
                    "" if math.isnan(r.resolution) else repr(r.resolution), r.pdb_cluster_id,
                    r.sequence_length, r.sequence])
    with atomic_write(path, "w", verify=lambda tmp: _same(read_chains(tmp), rows, path)) as fh:
        fh.write(buf.getvalue())


def _same(a: object, b: object, path: Path) -> None:
    if repr(a) != repr(b):
        raise DataError(f"{path}: read-back differs from what was written")


def read_obsolete(path: Path) -> dict[str, str]:
    """PDB ``obsolete.dat``: ``OBSLTE`` lines map the old id (columns 21-24) to its replacement (30-33)."""
    try:
        lines = path.read_text().strip().split("\n")
    except OSError as e:
        raise DataError(f"{path}: cannot read obsolete list ({e})") from e
    out = {}
    for line in lines:
        line = line.strip()
        if line.startswith("OBSLTE") and len(line) > 30:
            out[line[20:24].lower()] = line[29:33].lower()
    return out


class AlignmentDB:
    """``pdb_alignments/``: ``super.index`` and the ``<k>.db`` shards it points into."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        index = folder / "super.index"
        try:
            raw = json.loads(index.read_text())
        except (OSError, ValueError) as e:
            raise DataError(f"{index}: cannot read the alignments index ({e})") from e
        if not isinstance(raw, dict):
            raise DataError(f"{index}: expected a JSON object {{pdb_chain_id: {{db, files}}}}")
        for key, entry in raw.items():
            ok = (isinstance(entry, dict) and isinstance(entry.get("db"), str) and isinstance(entry.get("files"), list)
                  and all(isinstance(f, list) and len(f) == 3 and isinstance(f[0], str) and isinstance(f[1], int)
                          and isinstance(f[2], int) and f[1] >= 0 and f[2] >= 0 for f in entry["files"]))
            if not ok:
                raise DataError(f"{index}: entry {key!r} is not {{\"db\": \"<k>.db\", \"files\": "
                                "[[filename, start, size], ...]}")
            if "/" in entry["db"] or entry["db"].startswith("."):
                raise DataError(f"{index}: entry {key!r} names shard {entry['db']!r} outside the folder")
        self.index: dict[str, dict] = raw

    def __contains__(self, key: str) -> bool:
        return key in self.index

    def load(self, key: str) -> dict[str, str]:
        """Every alignment file of chain ``key``: file name -> text."""
        if key not in self.index:
            raise DataError(f"{self.folder / 'super.index'}: no alignments for chain {key!r}")
        entry = self.index[key]
        shard = self.folder / entry["db"]
        out = {}
        try:
            with open(shard, "rb") as fh:
                size = fh.seek(0, 2)
                for name, start, n in entry["files"]:
                    if start + n > size:
                        raise DataError(f"{shard}: {key}/{name} spans bytes {start}..{start + n}, the shard has {size}")
                    fh.seek(start)
                    out[name] = fh.read(n).decode("utf-8")
        except OSError as e:
            raise DataError(f"{shard}: cannot read alignments of {key!r} ({e})") from e
        except UnicodeDecodeError:
            raise DataError(f"{shard}: alignments of {key!r} are not UTF-8 text") from None
        return out


def write_alignment_db(folder: Path, shards: dict[int, list[tuple[list[str], dict[str, bytes]]]]) -> None:
    """Write ``<k>.db`` shards and ``super.index``: per shard, (chain ids sharing the alignments, file name ->
    bytes) in order, as ``preprocess_open_protein_set.py`` lays them out (files sorted by name)."""
    index: dict[str, dict] = {}
    for k, entries in sorted(shards.items()):
        name = f"{k}.db"
        start = 0
        with atomic_write(folder / name, "wb") as fh:
            for chain_ids, files in entries:
                spec = {"db": name, "files": []}
                for fname in sorted(files):
                    data = files[fname]
                    fh.write(data)
                    spec["files"].append([fname, start, len(data)])
                    start += len(data)
                for cid in chain_ids:
                    if cid in index:
                        raise DataError(f"{folder}: chain {cid} is in two alignment clusters")
                    index[cid] = spec
    with atomic_write(folder / "super.index", "w", verify=lambda tmp: None) as fh:
        json.dump(index, fh)
    AlignmentDB(folder)  # the written index reads back


def _structure_from_reference(d: dict, where: str) -> Structure:
    try:
        atoms = {}
        for chain, a in d["atoms"].items():
            pos, mask = a["all_atom_positions"], a["all_atom_mask"]
            if isinstance(pos, tuple):  # compressed as compress_mmcif_dict_atoms does
                pos = np.frombuffer(zlib.decompress(pos[0]), np.float32).reshape(pos[1]).copy()
                mask = np.frombuffer(zlib.decompress(mask[0]), bool).reshape(mask[1]).copy()
            atoms[chain] = ChainAtoms(np.asarray(pos, np.float32), np.asarray(mask, bool))
        return Structure(d["pdb_id"], d["exptl_method"], d["release_date"], float(d["resolution"]),
                         list(d["author_chain_ids"]), dict(d["entity_id_to_mmcif_chain_ids"]),
                         dict(d["mmcif_chain_id_to_author_chain_id"]), dict(d["sequences"]), atoms)
    except (KeyError, TypeError, ValueError, zlib.error) as e:
        raise DataError(f"{where}: not a reference mmcif_dict ({type(e).__name__}: {e})") from None


def _dicts_name(pdb_id: str) -> str:
    return pdb_id[1:3]


def write_dicts(folder: Path, structures: list[Structure]) -> None:
    """The pickle-free ``dicts/<xy>.npz``: per entry a JSON header and the chains' positions and masks."""
    groups: dict[str, list[Structure]] = {}
    for s in structures:
        groups.setdefault(_dicts_name(s.pdb_id), []).append(s)
    for name, group in groups.items():
        arrays: dict[str, np.ndarray] = {}
        for s in group:
            head = s.to_reference_dict()
            del head["atoms"]
            arrays[f"{s.pdb_id}/meta"] = np.frombuffer(json.dumps(head).encode(), np.uint8)
            for chain, a in s.atoms.items():
                arrays[f"{s.pdb_id}/{chain}/positions"] = a.positions
                arrays[f"{s.pdb_id}/{chain}/mask"] = a.mask
        path = folder / f"{name}.npz"
        with atomic_write(path, "wb", verify=lambda tmp, g=group: [_read_npz(tmp, s.pdb_id) for s in g]) as fh:
            np.savez(fh, **arrays)


def _read_npz(path: Path, pdb_id: str) -> Structure:
    try:
        with np.load(path, allow_pickle=False) as z:
            if f"{pdb_id}/meta" not in z.files:
                raise DataError(f"{path}: no entry {pdb_id!r}")
            head = json.loads(bytes(z[f"{pdb_id}/meta"]).decode())
            head["atoms"] = {c: {"all_atom_positions": z[f"{pdb_id}/{c}/positions"],
                                 "all_atom_mask": z[f"{pdb_id}/{c}/mask"]} for c in head["author_chain_ids"]}
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, zlib.error) as e:  # BadZipFile: cut short
        raise DataError(f"{path}: cannot read entry {pdb_id!r} ({type(e).__name__}: {e}); the file is corrupt or "
                        "truncated") from None
    s = _structure_from_reference(head, str(path))
    for c, a in s.atoms.items():
        n = len(s.sequences[c])
        if a.positions.shape != (n, 37, 3) or a.mask.shape != (n, 37):
            raise DataError(f"{path}: {pdb_id} chain {c}: atoms {a.positions.shape}/{a.mask.shape}, expected "
                            f"({n}, 37, 3)/({n}, 37) for its {n} residues")
    return s


class Dicts:
    """``dicts/``: one entry per PDB id, from ``<xy>.npz`` or (with ``trust_pickle``) the reference's pickle."""

    def __init__(self, folder: Path, trust_pickle: bool = False) -> None:
        self.folder = folder
        self.trust_pickle = trust_pickle
        self._pickled: dict[str, dict] = {}

    def load(self, pdb_id: str) -> Structure:
        name = _dicts_name(pdb_id)
        npz = self.folder / f"{name}.npz"
        if npz.exists():
            return _read_npz(npz, pdb_id)
        pkl = self.folder / name
        if not pkl.exists():
            raise DataError(f"{self.folder}: no {name}.npz or {name} holding entry {pdb_id!r}")
        if not self.trust_pickle:
            raise DataError(f"{pkl}: is a pickle; {TRUST_HINT}")
        if name not in self._pickled:
            try:
                with open(pkl, "rb") as fh:
                    self._pickled = {name: pickle.load(fh)}  # noqa: S301 - explicit opt-in above
            except (OSError, pickle.UnpicklingError, EOFError) as e:
                raise DataError(f"{pkl}: cannot unpickle ({e})") from e
        group = self._pickled[name]
        if not isinstance(group, dict) or pdb_id not in group:
            raise DataError(f"{pkl}: no entry {pdb_id!r} (expected a dict of pdb_id -> mmcif_dict)")
        return _structure_from_reference(group[pdb_id], f"{pkl}[{pdb_id}]")


def convert_pickled_dicts(src: Path, dest: Path) -> int:
    """Convert every pickled ``dicts/<xy>`` under ``src`` (trusted by calling this) to ``dest/<xy>.npz``."""
    n = 0
    for f in sorted(p for p in src.iterdir() if p.is_file() and "." not in p.name):
        with open(f, "rb") as fh:
            group = pickle.load(fh)  # noqa: S301 - the caller trusts src
        write_dicts(dest, [_structure_from_reference(d, f"{f}[{k}]") for k, d in group.items()])
        n += len(group)
    return n
