"""Residue constants of AlphaFold2 / OpenFold: residue and atom vocabularies, the atom14/atom37 layouts,
the idealised rigid-group geometry, chi-angle definitions and the tables derived from them.

The facts (residue/atom names and their order, the per-residue atom coordinates in their rigid-group
frames, the chi-angle atom quadruples, pi-periodic chis, symmetric renaming swaps) are the published
AlphaFold2 constants (Jumper et al. 2021, supplement 1.2.1 and 1.8; the same values as the MLPerf HPC
openfold reference's ``openfold/data/residue_constants.py``). The derived numpy tables are built here once,
at import, by :func:`_derive` and are read-only.

Indices follow the reference exactly: ``aatype`` 0..19 in ``RESTYPES`` order, 20 = unknown (``X``/``UNK``);
MSA tokens add 21 = gap and 22 = the masked-MSA mask token; atom37 in ``ATOM_TYPES`` order; atom14 per
residue in ``RESTYPE_NAME_TO_ATOM14_NAMES`` order; rigid groups 0 backbone, 1 pre-omega, 2 phi, 3 psi,
4..7 chi1..chi4.
"""
from __future__ import annotations

import numpy as np

#: the 20 standard amino acids, one-letter codes, in AlphaFold order (aatype index)
RESTYPES: tuple[str, ...] = tuple("ARNDCQEGHILKMFPSTWYV")
RESTYPE_ORDER: dict[str, int] = {r: i for i, r in enumerate(RESTYPES)}
RESTYPE_NUM = len(RESTYPES)  # 20
UNK_RESTYPE_INDEX = RESTYPE_NUM  # 20: any unknown / non-standard residue
RESTYPES_WITH_X: tuple[str, ...] = RESTYPES + ("X",)
RESTYPE_ORDER_WITH_X: dict[str, int] = {r: i for i, r in enumerate(RESTYPES_WITH_X)}
#: MSA vocabulary: 20 residues, X (20), gap "-" (21); the masked-MSA head adds the mask token (22)
MSA_GAP_INDEX = 21
MSA_MASK_INDEX = 22
MSA_NUM_CLASSES = 23

_THREE = ("ALA ARG ASN ASP CYS GLN GLU GLY HIS ILE LEU LYS MET PHE PRO SER THR TRP TYR VAL").split()
RESTYPE_1TO3: dict[str, str] = dict(zip(RESTYPES, _THREE))
RESTYPE_3TO1: dict[str, str] = {v: k for k, v in RESTYPE_1TO3.items()}
UNK_RESTYPE = "UNK"
RESNAMES: tuple[str, ...] = tuple(_THREE) + (UNK_RESTYPE,)
RESNAME_TO_IDX: dict[str, int] = {n: i for i, n in enumerate(RESNAMES)}
#: modified residues whose one-letter code is their parent's (a subset of Biopython's SCOP table, which the
#: reference's mmCIF parser uses); any other three-letter code reads as "X"
MODIFIED_3TO1: dict[str, str] = {"MSE": "M", "SEP": "S", "TPO": "T", "PTR": "Y", "HYP": "P", "MLY": "K", "CSO": "C",
                                 "CME": "C", "KCX": "K", "LLP": "K", "CSD": "C", "OCS": "C", "MLZ": "K", "M3L": "K"}


def one_letter(resname: str) -> str:
    """One-letter code of a three-letter residue name as the reference's sequences write it ("X" if unknown)."""
    return RESTYPE_3TO1.get(resname) or MODIFIED_3TO1.get(resname, "X")


#: HHblits alphabet (A3M letters) -> HHblits index; ambiguous codes fold as HHblits does (B->D, Z->E, U->C,
#: J/O/X -> unknown), "-" is the gap
HHBLITS_AA_TO_ID: dict[str, int] = {
    **{a: i for i, a in enumerate("ACDEFGHIKLMNPQRSTVWY")}, "X": 20, "-": 21,
    "B": 2, "Z": 3, "U": 1, "J": 20, "O": 20,
}
_ID_TO_HHBLITS = "ACDEFGHIKLMNPQRSTVWYX-"
#: HHblits index -> our MSA token (RESTYPES order, X = 20, gap = 21)
MAP_HHBLITS_AATYPE_TO_OUR_AATYPE: tuple[int, ...] = tuple(
    (RESTYPES_WITH_X + ("-",)).index(a) for a in _ID_TO_HHBLITS)

#: the 37 heavy-atom types of the atom37 layout
ATOM_TYPES: tuple[str, ...] = tuple(
    "N CA C CB O CG CG1 CG2 OG OG1 SG CD CD1 CD2 ND1 ND2 OD1 OD2 SD CE CE1 CE2 CE3 NE NE1 NE2 OE1 OE2 "
    "CH2 NH1 NH2 OH CZ CZ2 CZ3 NZ OXT".split())
ATOM_ORDER: dict[str, int] = {a: i for i, a in enumerate(ATOM_TYPES)}
ATOM_TYPE_NUM = len(ATOM_TYPES)  # 37

#: atom14 layout: the heavy atoms of each residue in its 14 slots ("" = empty slot)
_ATOM14 = {
    "ALA": "N CA C O CB",
    "ARG": "N CA C O CB CG CD NE CZ NH1 NH2",
    "ASN": "N CA C O CB CG OD1 ND2",
    "ASP": "N CA C O CB CG OD1 OD2",
    "CYS": "N CA C O CB SG",
    "GLN": "N CA C O CB CG CD OE1 NE2",
    "GLU": "N CA C O CB CG CD OE1 OE2",
    "GLY": "N CA C O",
    "HIS": "N CA C O CB CG ND1 CD2 CE1 NE2",
    "ILE": "N CA C O CB CG1 CG2 CD1",
    "LEU": "N CA C O CB CG CD1 CD2",
    "LYS": "N CA C O CB CG CD CE NZ",
    "MET": "N CA C O CB CG SD CE",
    "PHE": "N CA C O CB CG CD1 CD2 CE1 CE2 CZ",
    "PRO": "N CA C O CB CG CD",
    "SER": "N CA C O CB OG",
    "THR": "N CA C O CB OG1 CG2",
    "TRP": "N CA C O CB CG CD1 CD2 NE1 CE2 CE3 CZ2 CZ3 CH2",
    "TYR": "N CA C O CB CG CD1 CD2 CE1 CE2 CZ OH",
    "VAL": "N CA C O CB CG1 CG2",
    "UNK": "",
}
RESTYPE_NAME_TO_ATOM14_NAMES: dict[str, tuple[str, ...]] = {
    k: tuple(v.split()) + ("",) * (14 - len(v.split())) for k, v in _ATOM14.items()}
#: the same without the empty slots: a residue's heavy atoms in atom14 order (what a structure file holds)
ATOM14_NAMES: dict[str, tuple[str, ...]] = {k: tuple(v.split()) for k, v in _ATOM14.items() if v}

#: chi1..chi4 of each residue as the four atoms that define the dihedral (chi5 of ARG is left out)
_CHI = {
    "ALA": "", "GLY": "",
    "ARG": "N CA CB CG|CA CB CG CD|CB CG CD NE|CG CD NE CZ",
    "ASN": "N CA CB CG|CA CB CG OD1",
    "ASP": "N CA CB CG|CA CB CG OD1",
    "CYS": "N CA CB SG",
    "GLN": "N CA CB CG|CA CB CG CD|CB CG CD OE1",
    "GLU": "N CA CB CG|CA CB CG CD|CB CG CD OE1",
    "HIS": "N CA CB CG|CA CB CG ND1",
    "ILE": "N CA CB CG1|CA CB CG1 CD1",
    "LEU": "N CA CB CG|CA CB CG CD1",
    "LYS": "N CA CB CG|CA CB CG CD|CB CG CD CE|CG CD CE NZ",
    "MET": "N CA CB CG|CA CB CG SD|CB CG SD CE",
    "PHE": "N CA CB CG|CA CB CG CD1",
    "PRO": "N CA CB CG|CA CB CG CD",
    "SER": "N CA CB OG",
    "THR": "N CA CB OG1",
    "TRP": "N CA CB CG|CA CB CG CD1",
    "TYR": "N CA CB CG|CA CB CG CD1",
    "VAL": "N CA CB CG1",
}
CHI_ANGLES_ATOMS: dict[str, tuple[tuple[str, ...], ...]] = {
    k: tuple(tuple(q.split()) for q in v.split("|")) if v else () for k, v in _CHI.items()}
#: [20, 4] 1.0 where the residue has that chi angle
CHI_ANGLES_MASK: tuple[tuple[float, ...], ...] = tuple(
    tuple(1.0 if c < len(CHI_ANGLES_ATOMS[RESTYPE_1TO3[r]]) else 0.0 for c in range(4)) for r in RESTYPES)
#: chi angles that are symmetric under a rotation by pi: ASP chi2, GLU chi3, PHE chi2, TYR chi2
_PI_PERIODIC = {"ASP": 1, "GLU": 2, "PHE": 1, "TYR": 1}
#: [21, 4] (UNK row included)
CHI_PI_PERIODIC: tuple[tuple[float, ...], ...] = tuple(
    tuple(1.0 if _PI_PERIODIC.get(n) == c else 0.0 for c in range(4)) for n in RESNAMES)

#: symmetric atoms whose names may be swapped in the ground truth
RESIDUE_ATOM_RENAMING_SWAPS: dict[str, dict[str, str]] = {
    "ASP": {"OD1": "OD2"}, "GLU": {"OE1": "OE2"},
    "PHE": {"CD1": "CD2", "CE1": "CE2"}, "TYR": {"CD1": "CD2", "CE1": "CE2"},
}

#: Ideal positions of each residue's heavy atoms, as "ATOM GROUP x y z" (Angstrom) in the frame of the
#: rigid group they belong to (0 backbone, 3 psi, 4..7 chi1..chi4): the x axis runs along the group's
#: rotation axis, the y axis puts the dihedral-defining atom in the xy plane.
_GEOMETRY = """
ALA
  N   0  -0.525   1.363   0.000
  CA  0   0.000   0.000   0.000
  C   0   1.526  -0.000  -0.000
  CB  0  -0.529  -0.774  -1.205
  O   3   0.627   1.062   0.000
ARG
  N   0  -0.524   1.362  -0.000
  CA  0   0.000   0.000   0.000
  C   0   1.525  -0.000  -0.000
  CB  0  -0.524  -0.778  -1.209
  O   3   0.626   1.062   0.000
  CG  4   0.616   1.390  -0.000
  CD  5   0.564   1.414   0.000
  NE  6   0.539   1.357  -0.000
  NH1 7   0.206   2.301   0.000
  NH2 7   2.078   0.978  -0.000
  CZ  7   0.758   1.093  -0.000
ASN
  N   0  -0.536   1.357   0.000
  CA  0   0.000   0.000   0.000
  C   0   1.526  -0.000  -0.000
  CB  0  -0.531  -0.787  -1.200
  O   3   0.625   1.062   0.000
  CG  4   0.584   1.399   0.000
  ND2 5   0.593  -1.188   0.001
  OD1 5   0.633   1.059   0.000
ASP
  N   0  -0.525   1.362  -0.000
  CA  0   0.000   0.000   0.000
  C   0   1.527   0.000  -0.000
  CB  0  -0.526  -0.778  -1.208
  O   3   0.626   1.062  -0.000
  CG  4   0.593   1.398  -0.000
  OD1 5   0.610   1.091   0.000
  OD2 5   0.592  -1.101  -0.003
CYS
  N   0  -0.522   1.362  -0.000
  CA  0   0.000   0.000   0.000
  C   0   1.524   0.000   0.000
  CB  0  -0.519  -0.773  -1.212
  O   3   0.625   1.062  -0.000
  SG  4   0.728   1.653   0.000
GLN
  N   0  -0.526   1.361  -0.000
  CA  0   0.000   0.000   0.000
  C   0   1.526   0.000   0.000
  CB  0  -0.525  -0.779  -1.207
  O   3   0.626   1.062  -0.000
  CG  4   0.615   1.393   0.000
  CD  5   0.587   1.399  -0.000
  NE2 6   0.593  -1.189  -0.001
  OE1 6   0.634   1.060   0.000
GLU
  N   0  -0.528   1.361   0.000
  CA  0   0.000   0.000   0.000
  C   0   1.526  -0.000  -0.000
  CB  0  -0.526  -0.781  -1.207
  O   3   0.626   1.062   0.000
  CG  4   0.615   1.392   0.000
  CD  5   0.600   1.397   0.000
  OE1 6   0.607   1.095  -0.000
  OE2 6   0.589  -1.104  -0.001
GLY
  N   0  -0.572   1.337   0.000
  CA  0   0.000   0.000   0.000
  C   0   1.517  -0.000  -0.000
  O   3   0.626   1.062  -0.000
HIS
  N   0  -0.527   1.360   0.000
  CA  0   0.000   0.000   0.000
  C   0   1.525   0.000   0.000
  CB  0  -0.525  -0.778  -1.208
  O   3   0.625   1.063   0.000
  CG  4   0.600   1.370  -0.000
  CD2 5   0.889  -1.021   0.003
  ND1 5   0.744   1.160  -0.000
  CE1 5   2.030   0.851   0.002
  NE2 5   2.145  -0.466   0.004
ILE
  N   0  -0.493   1.373  -0.000
  CA  0   0.000   0.000   0.000
  C   0   1.527  -0.000  -0.000
  CB  0  -0.536  -0.793  -1.213
  O   3   0.627   1.062  -0.000
  CG1 4   0.534   1.437  -0.000
  CG2 4   0.540  -0.785  -1.199
  CD1 5   0.619   1.391   0.000
LEU
  N   0  -0.520   1.363   0.000
  CA  0   0.000   0.000   0.000
  C   0   1.525  -0.000  -0.000
  CB  0  -0.522  -0.773  -1.214
  O   3   0.625   1.063  -0.000
  CG  4   0.678   1.371   0.000
  CD1 5   0.530   1.430  -0.000
  CD2 5   0.535  -0.774   1.200
LYS
  N   0  -0.526   1.362  -0.000
  CA  0   0.000   0.000   0.000
  C   0   1.526   0.000   0.000
  CB  0  -0.524  -0.778  -1.208
  O   3   0.626   1.062  -0.000
  CG  4   0.619   1.390   0.000
  CD  5   0.559   1.417   0.000
  CE  6   0.560   1.416   0.000
  NZ  7   0.554   1.387   0.000
MET
  N   0  -0.521   1.364  -0.000
  CA  0   0.000   0.000   0.000
  C   0   1.525   0.000   0.000
  CB  0  -0.523  -0.776  -1.210
  O   3   0.625   1.062  -0.000
  CG  4   0.613   1.391  -0.000
  SD  5   0.703   1.695   0.000
  CE  6   0.320   1.786  -0.000
PHE
  N   0  -0.518   1.363   0.000
  CA  0   0.000   0.000   0.000
  C   0   1.524   0.000  -0.000
  CB  0  -0.525  -0.776  -1.212
  O   3   0.626   1.062  -0.000
  CG  4   0.607   1.377   0.000
  CD1 5   0.709   1.195  -0.000
  CD2 5   0.706  -1.196   0.000
  CE1 5   2.102   1.198  -0.000
  CE2 5   2.098  -1.201  -0.000
  CZ  5   2.794  -0.003  -0.001
PRO
  N   0  -0.566   1.351  -0.000
  CA  0   0.000   0.000   0.000
  C   0   1.527  -0.000   0.000
  CB  0  -0.546  -0.611  -1.293
  O   3   0.621   1.066   0.000
  CG  4   0.382   1.445   0.000
  CD  5   0.477   1.424   0.000
SER
  N   0  -0.529   1.360  -0.000
  CA  0   0.000   0.000   0.000
  C   0   1.525  -0.000  -0.000
  CB  0  -0.518  -0.777  -1.211
  O   3   0.626   1.062  -0.000
  OG  4   0.503   1.325   0.000
THR
  N   0  -0.517   1.364   0.000
  CA  0   0.000   0.000   0.000
  C   0   1.526   0.000  -0.000
  CB  0  -0.516  -0.793  -1.215
  O   3   0.626   1.062   0.000
  CG2 4   0.550  -0.718  -1.228
  OG1 4   0.472   1.353   0.000
TRP
  N   0  -0.521   1.363   0.000
  CA  0   0.000   0.000   0.000
  C   0   1.525  -0.000   0.000
  CB  0  -0.523  -0.776  -1.212
  O   3   0.627   1.062   0.000
  CG  4   0.609   1.370  -0.000
  CD1 5   0.824   1.091   0.000
  CD2 5   0.854  -1.148  -0.005
  CE2 5   2.186  -0.678  -0.007
  CE3 5   0.622  -2.530  -0.007
  NE1 5   2.140   0.690  -0.004
  CH2 5   3.028  -2.890  -0.013
  CZ2 5   3.283  -1.543  -0.011
  CZ3 5   1.715  -3.389  -0.011
TYR
  N   0  -0.522   1.362   0.000
  CA  0   0.000   0.000   0.000
  C   0   1.524  -0.000  -0.000
  CB  0  -0.522  -0.776  -1.213
  O   3   0.627   1.062  -0.000
  CG  4   0.607   1.382  -0.000
  CD1 5   0.716   1.195  -0.000
  CD2 5   0.713  -1.194  -0.001
  CE1 5   2.107   1.200  -0.002
  CE2 5   2.104  -1.201  -0.003
  OH  5   4.168  -0.002  -0.005
  CZ  5   2.791  -0.001  -0.003
VAL
  N   0  -0.494   1.373  -0.000
  CA  0   0.000   0.000   0.000
  C   0   1.527  -0.000  -0.000
  CB  0  -0.533  -0.795  -1.213
  O   3   0.627   1.062  -0.000
  CG1 4   0.540   1.429  -0.000
  CG2 4   0.533  -0.776   1.203
"""


def _parse_geometry(text: str) -> dict[str, tuple[tuple[str, int, tuple[float, float, float]], ...]]:
    out: dict[str, list[tuple[str, int, tuple[float, float, float]]]] = {}
    current: list[tuple[str, int, tuple[float, float, float]]] | None = None
    for line in text.strip().splitlines():
        if not line.startswith(" "):
            current = out.setdefault(line.strip(), [])
            continue
        name, group, x, y, z = line.split()
        assert current is not None
        current.append((name, int(group), (float(x), float(y), float(z))))
    return {k: tuple(v) for k, v in out.items()}


#: residue name -> ((atom name, rigid group, (x, y, z)), ...)
RIGID_GROUP_ATOM_POSITIONS = _parse_geometry(_GEOMETRY)
#: residue name -> its heavy atoms (from the geometry table)
RESIDUE_ATOMS: dict[str, tuple[str, ...]] = {
    k: tuple(a for a, _, _ in v) for k, v in RIGID_GROUP_ATOM_POSITIONS.items()}


def _frame(ex: np.ndarray, ey: np.ndarray, origin: np.ndarray) -> np.ndarray:
    """4x4 rigid transform whose x axis is ``ex``, whose xy plane holds ``ey``, translated to ``origin``."""
    e1 = ex / np.linalg.norm(ex)
    u2 = ey - np.dot(ey, e1) * e1
    e2 = u2 / np.linalg.norm(u2)
    m = np.eye(4)
    m[:3, 0], m[:3, 1], m[:3, 2], m[:3, 3] = e1, e2, np.cross(e1, e2), origin
    return m


def _derive() -> dict[str, np.ndarray]:
    t: dict[str, np.ndarray] = {
        "atom37_mask": np.zeros((21, 37), np.float32),
        "atom37_to_group": np.zeros((21, 37), np.int64),
        "atom37_group_positions": np.zeros((21, 37, 3), np.float32),
        "atom14_mask": np.zeros((21, 14), np.float32),
        "atom14_to_group": np.zeros((21, 14), np.int64),
        "atom14_group_positions": np.zeros((21, 14, 3), np.float32),
        "default_frames": np.zeros((21, 8, 4, 4), np.float32),
        "atom14_to_atom37": np.zeros((21, 14), np.int64),
        "atom37_to_atom14": np.zeros((21, 37), np.int64),
        "atom14_ambiguous": np.zeros((21, 14), np.float32),
        "atom14_swap_index": np.tile(np.arange(14, dtype=np.int64), (21, 1)),
        "chi_atom_indices": np.zeros((21, 4, 4), np.int64),
        "group_exists": np.zeros((21, 8), np.float32),
    }
    # absent groups and the UNK row stay all-zero, as in the reference
    for r, letter in enumerate(RESTYPES):
        name = RESTYPE_1TO3[letter]
        slots = RESTYPE_NAME_TO_ATOM14_NAMES[name]
        pos = {}
        for atom, group, xyz in RIGID_GROUP_ATOM_POSITIONS[name]:
            a37, a14 = ATOM_ORDER[atom], slots.index(atom)
            t["atom37_mask"][r, a37] = 1
            t["atom37_to_group"][r, a37] = group
            t["atom37_group_positions"][r, a37] = xyz
            t["atom14_mask"][r, a14] = 1
            t["atom14_to_group"][r, a14] = group
            t["atom14_group_positions"][r, a14] = xyz
            t["atom14_to_atom37"][r, a14] = a37
            t["atom37_to_atom14"][r, a37] = a14
            pos[atom] = np.asarray(xyz, np.float64)
        t["default_frames"][r, 0] = t["default_frames"][r, 1] = np.eye(4)
        # groups 0 (backbone) and 1 (pre-omega) are the identity; 2 (phi) rotates about CA->N;
        # 3 (psi) about CA->C; chi1 about CA->CB (in the backbone frame); chi2..4 about the previous
        # chi group's x axis, from that group's axis-end atom.
        t["default_frames"][r, 2] = _frame(pos["N"] - pos["CA"], np.array([1.0, 0.0, 0.0]), pos["N"])
        t["default_frames"][r, 3] = _frame(pos["C"] - pos["CA"], pos["CA"] - pos["N"], pos["C"])
        t["group_exists"][r, [0, 3]] = 1
        chis = CHI_ANGLES_ATOMS[name]
        if chis:
            a, b, c = (pos[x] for x in chis[0][:3])
            t["default_frames"][r, 4] = _frame(c - b, a - b, c)
        for k in range(1, len(chis)):
            end = pos[chis[k][2]]
            t["default_frames"][r, 4 + k] = _frame(end, np.array([-1.0, 0.0, 0.0]), end)
        for k, quad in enumerate(chis):
            t["chi_atom_indices"][r, k] = [ATOM_ORDER[x] for x in quad]
            t["group_exists"][r, 4 + k] = 1
    for name, pairs in RESIDUE_ATOM_RENAMING_SWAPS.items():
        r, slots = RESTYPE_ORDER[RESTYPE_3TO1[name]], RESTYPE_NAME_TO_ATOM14_NAMES[name]
        for a1, a2 in pairs.items():
            i, j = slots.index(a1), slots.index(a2)
            t["atom14_ambiguous"][r, [i, j]] = 1
            t["atom14_swap_index"][r, i], t["atom14_swap_index"][r, j] = j, i
    for v in t.values():
        v.setflags(write=False)
    return t


_T = _derive()
#: [21, 37] 1 where the residue type has that atom37 atom (STANDARD_ATOM_MASK in the reference; UNK row 0)
RESTYPE_ATOM37_MASK: np.ndarray = _T["atom37_mask"]
STANDARD_ATOM_MASK: np.ndarray = RESTYPE_ATOM37_MASK
RESTYPE_ATOM37_TO_RIGID_GROUP: np.ndarray = _T["atom37_to_group"]
RESTYPE_ATOM37_RIGID_GROUP_POSITIONS: np.ndarray = _T["atom37_group_positions"]
#: [21, 14] 1 where the slot holds an atom of that residue type
RESTYPE_ATOM14_MASK: np.ndarray = _T["atom14_mask"]
#: [21, 14] rigid group (0..7) of each atom14 slot
RESTYPE_ATOM14_TO_RIGID_GROUP: np.ndarray = _T["atom14_to_group"]
#: [21, 14, 3] ideal position of each atom14 slot in its rigid group's frame
RESTYPE_ATOM14_RIGID_GROUP_POSITIONS: np.ndarray = _T["atom14_group_positions"]
#: [21, 8, 4, 4] frame of each rigid group relative to its parent group at torsion angle 0
RESTYPE_RIGID_GROUP_DEFAULT_FRAME: np.ndarray = _T["default_frames"]
#: [21, 8] 1 where the residue type has that rigid group (backbone, psi, its chis)
RESTYPE_RIGID_GROUP_EXISTS: np.ndarray = _T["group_exists"]
#: [21, 14] atom37 index of each atom14 slot (0 for empty slots)
RESTYPE_ATOM14_TO_ATOM37: np.ndarray = _T["atom14_to_atom37"]
#: [21, 37] atom14 slot of each atom37 atom (0 where absent)
RESTYPE_ATOM37_TO_ATOM14: np.ndarray = _T["atom37_to_atom14"]
#: [21, 14] 1 for atoms whose name the renaming swaps touch
RESTYPE_ATOM14_AMBIGUOUS_ATOMS: np.ndarray = _T["atom14_ambiguous"]
#: [21, 14] slot each atom14 slot swaps with (itself if none)
RESTYPE_ATOM14_AMBIGUOUS_ATOMS_SWAP_IDX: np.ndarray = _T["atom14_swap_index"]
#: [21, 4, 4] atom37 indices of the four atoms of chi1..chi4 (0 where the chi is absent)
CHI_ANGLES_ATOM_INDICES: np.ndarray = _T["chi_atom_indices"]
