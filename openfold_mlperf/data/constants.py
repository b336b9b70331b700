"""The residue tables the data side needs (restypes, atom37/atom14 names, chi angles, HHblits codes).

Minimal on purpose: the model side owns ``openfold_mlperf/residue_constants.py`` with the full geometry
(rigid-group frames, bond lengths); after the merge this module should import its tables from there. The
values are those of mlcommons/hpc ``openfold/openfold/data/residue_constants.py`` (AlphaFold's order).
"""
from __future__ import annotations

RESTYPES = ("A", "R", "N", "D", "C", "Q", "E", "G", "H", "I", "L", "K", "M", "F", "P", "S", "T", "W", "Y", "V")
RESTYPE_ORDER = {r: i for i, r in enumerate(RESTYPES)}
RESTYPES_WITH_X = (*RESTYPES, "X")
RESTYPE_ORDER_WITH_X = {r: i for i, r in enumerate(RESTYPES_WITH_X)}
UNK = 20  # aatype of an unknown residue
GAP = 21  # index of '-' in the MSA after mapping to our order
RESTYPE_1TO3 = {"A": "ALA", "R": "ARG", "N": "ASN", "D": "ASP", "C": "CYS", "Q": "GLN", "E": "GLU",
                "G": "GLY", "H": "HIS", "I": "ILE", "L": "LEU", "K": "LYS", "M": "MET", "F": "PHE",
                "P": "PRO", "S": "SER", "T": "THR", "W": "TRP", "Y": "TYR", "V": "VAL"}
RESTYPE_3TO1 = {v: k for k, v in RESTYPE_1TO3.items()}
#: modified residues whose one-letter code is their parent's (a subset of Biopython's SCOP table, which
#: the reference uses); any other three-letter code reads as 'X'
MODIFIED_3TO1 = {"MSE": "M", "SEP": "S", "TPO": "T", "PTR": "Y", "HYP": "P", "MLY": "K", "CSO": "C",
                 "CME": "C", "KCX": "K", "LLP": "K", "CSD": "C", "OCS": "C", "MLZ": "K", "M3L": "K"}

ATOM_TYPES = ("N", "CA", "C", "CB", "O", "CG", "CG1", "CG2", "OG", "OG1", "SG", "CD", "CD1", "CD2", "ND1",
              "ND2", "OD1", "OD2", "SD", "CE", "CE1", "CE2", "CE3", "NE", "NE1", "NE2", "OE1", "OE2", "CH2",
              "NH1", "NH2", "OH", "CZ", "CZ2", "CZ3", "NZ", "OXT")
ATOM_ORDER = {a: i for i, a in enumerate(ATOM_TYPES)}

ATOM14_NAMES: dict[str, tuple[str, ...]] = {
    "ALA": ("N", "CA", "C", "O", "CB"),
    "ARG": ("N", "CA", "C", "O", "CB", "CG", "CD", "NE", "CZ", "NH1", "NH2"),
    "ASN": ("N", "CA", "C", "O", "CB", "CG", "OD1", "ND2"),
    "ASP": ("N", "CA", "C", "O", "CB", "CG", "OD1", "OD2"),
    "CYS": ("N", "CA", "C", "O", "CB", "SG"),
    "GLN": ("N", "CA", "C", "O", "CB", "CG", "CD", "OE1", "NE2"),
    "GLU": ("N", "CA", "C", "O", "CB", "CG", "CD", "OE1", "OE2"),
    "GLY": ("N", "CA", "C", "O"),
    "HIS": ("N", "CA", "C", "O", "CB", "CG", "ND1", "CD2", "CE1", "NE2"),
    "ILE": ("N", "CA", "C", "O", "CB", "CG1", "CG2", "CD1"),
    "LEU": ("N", "CA", "C", "O", "CB", "CG", "CD1", "CD2"),
    "LYS": ("N", "CA", "C", "O", "CB", "CG", "CD", "CE", "NZ"),
    "MET": ("N", "CA", "C", "O", "CB", "CG", "SD", "CE"),
    "PHE": ("N", "CA", "C", "O", "CB", "CG", "CD1", "CD2", "CE1", "CE2", "CZ"),
    "PRO": ("N", "CA", "C", "O", "CB", "CG", "CD"),
    "SER": ("N", "CA", "C", "O", "CB", "OG"),
    "THR": ("N", "CA", "C", "O", "CB", "OG1", "CG2"),
    "TRP": ("N", "CA", "C", "O", "CB", "CG", "CD1", "CD2", "NE1", "CE2", "CE3", "CZ2", "CZ3", "CH2"),
    "TYR": ("N", "CA", "C", "O", "CB", "CG", "CD1", "CD2", "CE1", "CE2", "CZ", "OH"),
    "VAL": ("N", "CA", "C", "O", "CB", "CG1", "CG2"),
}

CHI_ANGLES_ATOMS: dict[str, tuple[tuple[str, str, str, str], ...]] = {
    "ALA": (), "GLY": (),
    "ARG": (("N", "CA", "CB", "CG"), ("CA", "CB", "CG", "CD"), ("CB", "CG", "CD", "NE"), ("CG", "CD", "NE", "CZ")),
    "ASN": (("N", "CA", "CB", "CG"), ("CA", "CB", "CG", "OD1")),
    "ASP": (("N", "CA", "CB", "CG"), ("CA", "CB", "CG", "OD1")),
    "CYS": (("N", "CA", "CB", "SG"),),
    "GLN": (("N", "CA", "CB", "CG"), ("CA", "CB", "CG", "CD"), ("CB", "CG", "CD", "OE1")),
    "GLU": (("N", "CA", "CB", "CG"), ("CA", "CB", "CG", "CD"), ("CB", "CG", "CD", "OE1")),
    "HIS": (("N", "CA", "CB", "CG"), ("CA", "CB", "CG", "ND1")),
    "ILE": (("N", "CA", "CB", "CG1"), ("CA", "CB", "CG1", "CD1")),
    "LEU": (("N", "CA", "CB", "CG"), ("CA", "CB", "CG", "CD1")),
    "LYS": (("N", "CA", "CB", "CG"), ("CA", "CB", "CG", "CD"), ("CB", "CG", "CD", "CE"), ("CG", "CD", "CE", "NZ")),
    "MET": (("N", "CA", "CB", "CG"), ("CA", "CB", "CG", "SD"), ("CB", "CG", "SD", "CE")),
    "PHE": (("N", "CA", "CB", "CG"), ("CA", "CB", "CG", "CD1")),
    "PRO": (("N", "CA", "CB", "CG"), ("CA", "CB", "CG", "CD")),
    "SER": (("N", "CA", "CB", "OG"),),
    "THR": (("N", "CA", "CB", "OG1"),),
    "TRP": (("N", "CA", "CB", "CG"), ("CA", "CB", "CG", "CD1")),
    "TYR": (("N", "CA", "CB", "CG"), ("CA", "CB", "CG", "CD1")),
    "VAL": (("N", "CA", "CB", "CG1"),),
}
#: [restype][chi] 1.0 where the chi angle is defined (AlphaFold's CHI_ANGLES_MASK)
CHI_ANGLES_MASK = tuple(tuple(1.0 if i < len(CHI_ANGLES_ATOMS[RESTYPE_1TO3[r]]) else 0.0 for i in range(4))
                        for r in RESTYPES)
#: [restype incl. UNK][chi] 1.0 where the chi angle is pi-periodic (ASP chi2, GLU chi3, PHE/TYR chi2)
CHI_PI_PERIODIC = tuple(
    tuple(1.0 if (r, i) in {("D", 1), ("E", 2), ("F", 1), ("Y", 1)} else 0.0 for i in range(4))
    for r in (*RESTYPES, "X"))
RESIDUE_ATOM_RENAMING_SWAPS = {"ASP": {"OD1": "OD2"}, "GLU": {"OE1": "OE2"},
                               "PHE": {"CD1": "CD2", "CE1": "CE2"}, "TYR": {"CD1": "CD2", "CE1": "CE2"}}

#: HHblits alphabet (A3M/HHR letters) -> HHblits index: B->D, Z->E, U->C, J/O/X->X, '-' gap
HHBLITS_AA_TO_ID = {"A": 0, "B": 2, "C": 1, "D": 2, "E": 3, "F": 4, "G": 5, "H": 6, "I": 7, "J": 20, "K": 8,
                    "L": 9, "M": 10, "N": 11, "O": 20, "P": 12, "Q": 13, "R": 14, "S": 15, "T": 16, "U": 1,
                    "V": 17, "W": 18, "X": 20, "Y": 19, "Z": 3, "-": 21}
_ID_TO_HHBLITS_AA = "ACDEFGHIKLMNPQRSTVWYX-"
#: HHblits index -> our index (``RESTYPES`` + X + gap)
MAP_HHBLITS_AATYPE_TO_OUR_AATYPE = tuple((*RESTYPES_WITH_X, "-").index(a) for a in _ID_TO_HHBLITS_AA)


def one_letter(resname: str) -> str:
    """One-letter code of a three-letter residue name as the reference's sequences use it ('X' if unknown)."""
    return RESTYPE_3TO1.get(resname) or MODIFIED_3TO1.get(resname, "X")


def atom37_names(resname3: str) -> tuple[str, ...]:
    """The heavy atoms of a standard residue (atom37 names)."""
    return tuple(a for a in ATOM14_NAMES[resname3])
