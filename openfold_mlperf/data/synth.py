"""Synthetic proteins in the reference's raw formats, and the preprocessing into its processed layout.

The rule a model can learn: a chain is a series of segments whose residue class sets the secondary structure
(helix formers A L E K M Q R -> alpha helix, strand formers V I Y F W T -> beta strand, turn formers
G P N D S C H -> a turn whose backbone dihedrals are fixed per residue type); the backbone is built from those
ideal (phi, psi) with ideal bond geometry, plus O, CB and the chi1 atom at a chi1 set by the segment class.
Families share a segment layout and their turn residues; members differ by within-class substitutions in
helices and strands (whose dihedrals are the class's), so a family has one structure.

MSAs mutate the chain's sequence, within class mostly, and co-vary residue pairs in contact (CB-CB < 8 A):
when one side of a contact mutates, its partner takes the matching substitution. Rows carry insertions
(lower case) and gaps. Template hits (HHR) are the other members of the chain's family released earlier.

Raw layout (as downloaded): ``pdb_mmcif/raw/<xy>/<id>.cif.gz``, ``open_protein_set/original/pdb/<id>_A/
{a3m/*.a3m, hhr/pdb70_hits.hhr}``; :func:`preprocess` builds the processed layout the dataset reads
(``chains.csv``, ``dicts/<xy>.npz``, ``pdb_alignments/``) by reading those files back with the readers.
"""
from __future__ import annotations

import gzip
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path

import numpy as np

from hpcbench.common.atomic import atomic_write

from .. import residue_constants as rc
from . import a3m, hhr, mmcif, store

HELIX, STRAND, TURN = "H", "E", "T"
CLASSES = {HELIX: "ALEKMQR", STRAND: "VIYFWT", TURN: "GPNDSCH"}
CLASS_OF = {a: k for k, v in CLASSES.items() for a in v}
PHI_PSI = {HELIX: (-57.0, -47.0), STRAND: (-120.0, 130.0)}
TURN_PHI_PSI = {"G": (80.0, 10.0), "P": (-65.0, 140.0), "N": (-90.0, 0.0), "D": (-70.0, 150.0),
                "S": (-80.0, 80.0), "C": (-100.0, 120.0), "H": (-75.0, -20.0)}
CHI1 = {HELIX: -65.0, STRAND: 180.0, TURN: 60.0}
SEG_LEN = {HELIX: (5, 8), STRAND: (4, 7), TURN: (3, 5)}
HELIX_SHARE = 0.35  # chance that a structured segment is a helix (else a strand): with SEG_LEN it keeps an
# ideal helix and an extended chain near lDDT-Ca 0.5 on these chains (0.51 and 0.46 over 20 chains of 40-80)
TRAIN_END = date(2021, 9, 16)


def _place(a: np.ndarray, b: np.ndarray, c: np.ndarray, bond: float, angle: float, torsion: float) -> np.ndarray:
    """Atom d with |cd| = bond, angle bcd, dihedral abcd (degrees) (NeRF)."""
    bc = c - b
    bc /= np.linalg.norm(bc)
    n = np.cross(b - a, bc)
    n /= np.linalg.norm(n)
    m = np.cross(n, bc)
    ang, tor = np.radians(angle), np.radians(torsion)
    d2 = np.array([-bond * np.cos(ang), bond * np.sin(ang) * np.cos(tor), bond * np.sin(ang) * np.sin(tor)])
    return c + d2[0] * bc + d2[1] * m + d2[2] * n


def layout(rng: np.random.Generator, length: int) -> str:
    """A segment string (one class letter per residue), alternating structure and turns."""
    out = ""
    kind = TURN
    while len(out) < length:
        kind = (HELIX if rng.random() < HELIX_SHARE else STRAND) if kind == TURN else TURN
        lo, hi = SEG_LEN[kind]
        out += kind * int(rng.integers(lo, hi + 1))
    return out[:length]


def sequence_for(rng: np.random.Generator, segments: str, turns: str = "") -> str:
    """A sequence for a segment string: helix and strand residues drawn from their class; turn residues
    from ``turns`` where given (a family keeps its turn residues, which set the turn's dihedrals)."""
    return "".join(turns[i] if k == TURN and turns else CLASSES[k][rng.integers(len(CLASSES[k]))]
                   for i, k in enumerate(segments))


def structure(sequence: str) -> tuple[np.ndarray, np.ndarray]:
    """atom37 positions and mask of a chain, a function of its sequence alone."""
    n = len(sequence)
    pos = np.zeros((n, 37, 3), np.float64)
    mask = np.zeros((n, 37), bool)
    N, CA, C, O, CB = (rc.ATOM_ORDER[a] for a in ("N", "CA", "C", "O", "CB"))
    for i, aa in enumerate(sequence):
        k = CLASS_OF[aa]
        phi, psi = PHI_PSI.get(k) or TURN_PHI_PSI[aa]
        if i == 0:
            n_, ca = np.array([0.0, 0.0, 0.0]), np.array([1.458, 0.0, 0.0])
            c = _place(np.array([0.0, 1.0, 0.0]), n_, ca, 1.525, 111.0, phi)
        else:
            pn, pca, pc = pos[i - 1, N], pos[i - 1, CA], pos[i - 1, C]
            ppsi = (PHI_PSI.get(CLASS_OF[sequence[i - 1]]) or TURN_PHI_PSI[sequence[i - 1]])[1]
            n_ = _place(pn, pca, pc, 1.329, 116.2, ppsi)
            ca = _place(pca, pc, n_, 1.458, 121.7, 180.0)
            c = _place(pc, n_, ca, 1.525, 111.0, phi)
        pos[i, N], pos[i, CA], pos[i, C] = n_, ca, c
        pos[i, O] = _place(n_, ca, c, 1.231, 120.5, psi + 180.0)
        mask[i, [N, CA, C, O]] = True
        if aa != "G":
            pos[i, CB] = _place(c, n_, ca, 1.53, 110.5, -122.6)
            mask[i, CB] = True
            chi = rc.CHI_ANGLES_ATOMS[rc.RESTYPE_1TO3[aa]]
            if chi:
                g = rc.ATOM_ORDER[chi[0][3]]
                pos[i, g] = _place(n_, ca, pos[i, CB], 1.52, 114.0, CHI1[k])
                mask[i, g] = True
    return pos.astype(np.float32), mask


def write_cif(pdb_id: str, sequence: str, pos: np.ndarray, mask: np.ndarray, release: date, resolution: float) -> str:
    """One-chain mmCIF entry with the categories the reference reads."""
    up = pdb_id.upper()
    lines = [f"data_{up}", "#", f"_entry.id {up}", "_exptl.method 'X-RAY DIFFRACTION'",
             f"_refine.ls_d_res_high {resolution:.2f}", "#", "loop_", "_pdbx_audit_revision_history.ordinal",
             "_pdbx_audit_revision_history.revision_date", f"1 {release.isoformat()}",
             f"2 {(release + timedelta(days=400)).isoformat()}", "#", "loop_", "_struct_asym.id",
             "_struct_asym.entity_id", "A 1", "B 2", "#", "loop_", "_chem_comp.id", "_chem_comp.type"]
    for r3 in sorted({rc.RESTYPE_1TO3[a] for a in sequence}):
        lines.append(f"{r3} 'L-peptide linking'")
    lines += ["HOH non-polymer", "#", "loop_", "_entity_poly_seq.entity_id", "_entity_poly_seq.num",
              "_entity_poly_seq.mon_id"]
    lines += [f"1 {i + 1} {rc.RESTYPE_1TO3[a]}" for i, a in enumerate(sequence)]
    cols = ("group_PDB", "id", "type_symbol", "label_atom_id", "label_alt_id", "label_comp_id", "label_asym_id",
            "label_entity_id", "label_seq_id", "pdbx_PDB_ins_code", "Cartn_x", "Cartn_y", "Cartn_z", "occupancy",
            "B_iso_or_equiv", "auth_seq_id", "auth_comp_id", "auth_asym_id", "auth_atom_id", "pdbx_PDB_model_num")
    lines += ["#", "loop_"] + [f"_atom_site.{c}" for c in cols]
    k = 0
    for i, a in enumerate(sequence):
        r3 = rc.RESTYPE_1TO3[a]
        for name in rc.ATOM14_NAMES[r3]:
            j = rc.ATOM_ORDER[name]
            if not mask[i, j]:
                continue
            k += 1
            x, y, z = pos[i, j]
            lines.append(f"ATOM {k} {name[0]} {name} . {r3} A 1 {i + 1} ? {x:.3f} {y:.3f} {z:.3f} 1.00 20.00 "
                         f"{i + 1} {r3} A {name} 1")
    k += 1
    lines.append(f"HETATM {k} O O . HOH B 2 . ? 99.000 99.000 99.000 1.00 30.00 {len(sequence) + 1} HOH A O 1")
    return "\n".join(lines) + "\n#\n"


def _mutate(rng: np.random.Generator, seq: str, contacts: list[tuple[int, int]], rate: float) -> list[str]:
    out = list(seq)
    for i in np.nonzero(rng.random(len(seq)) < rate)[0]:
        cls = CLASSES[CLASS_OF[seq[i]]]
        out[i] = cls[rng.integers(len(cls))] if rng.random() < 0.8 else "ACDEFGHIKLMNPQRSTVWY"[rng.integers(20)]
    for i, j in contacts:  # co-variation: a contact's partner follows the same shift within its class
        if out[i] != seq[i]:
            ci, cj = CLASSES[CLASS_OF[seq[i]]], CLASSES[CLASS_OF[seq[j]]]
            shift = (ci.index(out[i]) - ci.index(seq[i])) if out[i] in ci else 1
            out[j] = cj[(cj.index(seq[j]) + shift) % len(cj)]
    return out


def write_a3m(rng: np.random.Generator, seq: str, contacts: list[tuple[int, int]], rows: int) -> str:
    text = [f">query\n{seq}"]
    for r in range(rows):
        m = _mutate(rng, seq, contacts, rate=float(rng.uniform(0.05, 0.4)))
        for i in np.nonzero(rng.random(len(seq)) < 0.03)[0]:
            m[i] = "-"
        row = ""
        for i, ch in enumerate(m):
            if ch != "-" and rng.random() < 0.02:
                row += "".join("acdefghiklmnpqrstvwy"[x] for x in rng.integers(20, size=int(rng.integers(1, 4))))
            row += ch
        text.append(f">hom{r} synthetic homolog\n{row}")
    return "\n".join(text) + "\n"


def write_hhr(query_name: str, query: str, hits: list[tuple[str, str]]) -> str:
    """HHsearch output: a summary table and one full block per hit (query and hit aligned column by column)."""
    L = len(query)
    out = [f"Query         {query_name}", f"Match_columns {L}", "No_of_seqs    1 out of 1", "",
           " No Hit                             Prob E-value P-value  Score    SS Cols Query HMM  Template HMM"]
    for n, (name, seq) in enumerate(hits, 1):
        out.append(f"{n:3d} {name:<30} 99.9 1e-30 1e-34  200.0   0.0 {L:4d}    1-{L:<4d}    1-{len(seq):<4d} ({len(seq)})")
    out.append("")
    for n, (name, seq) in enumerate(hits, 1):
        same = sum(a == b for a, b in zip(query, seq))
        out += [f"No {n}", f">{name} synthetic family member",
                f"Probab=99.9 E-value=1e-30 Score=200.0 Aligned_cols={L} Identities={100 * same // L}% "
                f"Similarity=0.9 Sum_probs={float(same):.1f} Template_Neff=5.0", ""]
        for s in range(0, L, 80):
            q, t = query[s:s + 80], seq[s:s + 80]
            out.append(f"Q {query_name[:14]:<15}{s + 1:>4} {q} {s + len(q):>4} ({L})")
            out.append(f"T {name[:14]:<15}{s + 1:>4} {t} {s + len(t):>4} ({len(seq)})")
            out.append("")
    return "\n".join(out) + "\n"


@dataclass(frozen=True)
class SynthConfig:
    families: int = 6
    members: int = 4
    min_length: int = 40
    max_length: int = 80
    msa_rows: int = 48
    seed: int = 0
    val_members: int = 1  # per family, released after the training cut-off
    conserved_turns: bool = True  # family members share their turn residues (so one structure per family)


def generate_raw(root: Path, cfg: SynthConfig) -> list[str]:
    """Write the raw dataset under ``root``; returns the pdb chain ids (``<id>_A``)."""
    rng = np.random.default_rng(cfg.seed)
    chains: list[str] = []
    fam_members: list[list[tuple[str, str, date]]] = []
    for f in range(cfg.families):
        length = int(rng.integers(cfg.min_length, cfg.max_length + 1))
        seg = layout(rng, length)
        turns = sequence_for(rng, seg) if cfg.conserved_turns else ""
        members = []
        for m in range(cfg.members):
            pdb_id = f"{1 + (f * cfg.members + m) // 100}{'abcdefghijklmnopqrstuvwxyz'[f % 26]}{(f * cfg.members + m) % 100:02d}"
            val = m >= cfg.members - cfg.val_members
            release = (TRAIN_END + timedelta(days=int(rng.integers(1, 80)))) if val else \
                date(2015, 1, 1) + timedelta(days=int(rng.integers(0, 2000)))
            members.append((pdb_id, sequence_for(rng, seg, turns), release))
        fam_members.append(members)
    for members in fam_members:
        for pdb_id, seq, release in members:
            pos, mask = structure(seq)
            text = write_cif(pdb_id, seq, pos, mask, release, float(rng.uniform(1.5, 3.0)))
            path = root / "pdb_mmcif/raw" / pdb_id[1:3] / f"{pdb_id}.cif.gz"
            with atomic_write(path, "wb", verify=lambda t: mmcif.read(t)) as fh:
                fh.write(gzip.compress(text.encode(), mtime=0))
            cb = np.where(mask[:, rc.ATOM_ORDER["CB"], None], pos[:, rc.ATOM_ORDER["CB"]], pos[:, rc.ATOM_ORDER["CA"]])
            d = np.linalg.norm(cb[:, None] - cb[None], axis=-1)
            contacts = [(i, j) for i in range(len(seq)) for j in range(i + 4, len(seq)) if d[i, j] < 8.0]
            chain = f"{pdb_id}_A"
            chains.append(chain)
            base = root / "open_protein_set/original/pdb" / chain
            per = max(1, cfg.msa_rows // 3)
            for name in a3m_names():
                body = write_a3m(rng, seq, contacts, per)
                with atomic_write(base / "a3m" / name, "w", verify=lambda t, n=name: a3m.parse(t.read_text(), n)) as fh:
                    fh.write(body)
            hits = [(f"{p}_A", s) for p, s, r in members if p != pdb_id]
            body = write_hhr(chain, seq, hits)
            with atomic_write(base / "hhr" / "pdb70_hits.hhr", "w", verify=lambda t: hhr.parse(t.read_text(), str(t))) as fh:
                fh.write(body)
    text = "".join(f"{c}\n" for c in chains)
    with atomic_write(root / "open_protein_set/original/duplicate_pdb_chains.txt", "w") as fh:
        fh.write(text)
    with atomic_write(root / "pdb_mmcif/original/clusters-by-entity-40.txt", "w") as fh:
        fh.write("".join(" ".join(f"{p.upper()}_1" for p, _, _ in members) + "\n" for members in fam_members))
    with atomic_write(root / "pdb_mmcif/original/obsolete.dat", "w") as fh:
        fh.write(" LIST OF OBSOLETE COORDINATE ENTRIES AND SUCCESSORS\n")
    return chains


def a3m_names() -> tuple[str, ...]:
    return ("uniref90_hits.a3m", "bfd_uniclust_hits.a3m", "mgnify_hits.a3m")


def preprocess(root: Path, num_shards: int = 2) -> None:
    """The reference's two preprocessing scripts on the raw layout: mmCIF -> ``chains.csv`` and dicts
    (pickle-free ``.npz``), OpenProteinSet folders -> ``pdb_alignments`` shards + ``super.index``."""
    import hashlib

    clusters: dict[str, int] = {}
    for k, line in enumerate((root / "pdb_mmcif/original/clusters-by-entity-40.txt").read_text().split("\n")):
        for ent in line.split():
            clusters[ent.upper()] = k
    structures = []
    rows: list[store.ChainRow] = []
    for path in sorted((root / "pdb_mmcif/raw").glob("*/*.cif.gz")):
        s = mmcif.read(path)
        structures.append(s)
        for chain in s.author_chain_ids:
            asyms = [a for a, c in s.mmcif_chain_id_to_author_chain_id.items() if c == chain]
            ents = {e for e, lst in s.entity_id_to_mmcif_chain_ids.items() if set(lst) & set(asyms)}
            ids = [clusters[f"{s.pdb_id}_{e}".upper()] for e in ents if f"{s.pdb_id}_{e}".upper() in clusters]
            rows.append(store.ChainRow(f"{s.pdb_id}_{chain}", s.pdb_id, chain, ";".join(asyms), s.release_date,
                                       s.resolution, ids[0] if ids else -1, len(s.sequences[chain]),
                                       s.sequences[chain]))
    out = root / "pdb_mmcif/processed"
    store.write_chains(out / "chains.csv", rows)
    # the chains released after the training cut-off are the validation targets, as CAMEO lists them
    # ("date pdb_id mmcif_chain"; the reference's CAMEO table, dataset.read_cameo_targets)
    targets = "".join(f"{r.release_date} {r.pdb_id} {r.mmcif_chain_ids.split(';')[0]}\n" for r in rows
                      if r.release_date > TRAIN_END.isoformat())
    with atomic_write(out / "cameo_targets.txt", "w") as fh:
        fh.write("# synthetic validation targets: submission (release) date, pdb id, mmCIF chain\n" + targets)
    store.write_dicts(out / "dicts", structures)
    with atomic_write(out / "obsolete.dat", "wb") as fh:
        fh.write((root / "pdb_mmcif/original/obsolete.dat").read_bytes())
    dup = [line.split() for line in (root / "open_protein_set/original/duplicate_pdb_chains.txt").read_text().strip().split("\n")]
    shards: dict[int, list] = {k: [] for k in range(num_shards)}
    for group in dup:
        folder = root / "open_protein_set/original/pdb" / group[0]
        files = {p.name: p.read_bytes() for p in sorted(folder.glob("*/*"))}
        k = int.from_bytes(hashlib.sha256(group[0].encode()).digest()[:8], "little") % num_shards
        shards[k].append((group, files))
    store.write_alignment_db(root / "open_protein_set/processed/pdb_alignments", shards)
