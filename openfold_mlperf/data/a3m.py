"""A3M multiple sequence alignments (HHblits/OpenProteinSet), read as the reference's ``parse_a3m``.

FASTA records; the first is the query. Upper-case letters and '-' are match states aligned to the query
columns; lower-case letters are insertions relative to the query: they are removed, and the deletion
matrix counts, per kept column, how many insertions came just before it. Every row must then have the
query's length, and every letter must be in the HHblits alphabet (the reference would otherwise fail on a
``KeyError`` inside feature construction); both are refused here by file and row.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hpcbench.common.errors import DataError

from ..residue_constants import HHBLITS_AA_TO_ID


@dataclass
class Msa:
    sequences: list[str]  # aligned rows (insertions removed), row 0 = query
    deletions: list[list[int]]  # per row, per query column
    descriptions: list[str]


def parse_fasta(text: str) -> tuple[list[str], list[str]]:
    seqs: list[str] = []
    descs: list[str] = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith(">"):
            descs.append(line[1:])
            seqs.append("")
        elif not line or line.startswith("#"):
            continue
        elif not seqs:
            raise DataError("sequence text before the first '>' header")
        else:
            seqs[-1] += line
    return seqs, descs


def parse(text: str, where: str) -> Msa:
    try:
        seqs, descs = parse_fasta(text)
    except DataError as e:
        raise DataError(f"{where}: {e}") from None
    aligned: list[str] = []
    deletions: list[list[int]] = []
    for row, s in enumerate(seqs):
        kept: list[str] = []
        dels: list[int] = []
        count = 0
        for ch in s:
            if ch.islower():
                count += 1
            else:
                if ch not in HHBLITS_AA_TO_ID:
                    raise DataError(f"{where}: row {row} ({descs[row][:40]!r}): residue code {ch!r} is not in the "
                                    f"HHblits alphabet {''.join(sorted(HHBLITS_AA_TO_ID))}")
                kept.append(ch)
                dels.append(count)
                count = 0
        aligned.append("".join(kept))
        deletions.append(dels)
    if aligned:
        n = len(aligned[0])
        for row, a in enumerate(aligned):
            if len(a) != n:
                raise DataError(f"{where}: row {row} ({descs[row][:40]!r}) has {len(a)} aligned columns after "
                                f"removing lower-case insertions, the query has {n}")
    return Msa(aligned, deletions, descs)


def msa_features(sequence: str, msas: list[tuple[str, Msa]]) -> dict[str, np.ndarray]:
    """The reference's ``create_msa_features``: the alignments in order, duplicates of a row seen before dropped,
    the bare query when there is none; ``msa`` in HHblits indices, ``deletion_matrix_int``, ``num_alignments``.
    Every alignment's query must be the chain's sequence length."""
    usable = [(w, m) for w, m in msas if m.sequences]
    if not usable:
        usable = [("query", Msa([sequence], [[0] * len(sequence)], ["query"]))]
    rows: list[list[int]] = []
    dels: list[list[int]] = []
    seen: set[str] = set()
    for where, m in usable:
        if len(m.sequences[0]) != len(sequence):
            raise DataError(f"{where}: the alignment's query has {len(m.sequences[0])} columns, the chain's "
                            f"sequence has {len(sequence)} residues")
        for s, d in zip(m.sequences, m.deletions):
            if s in seen:
                continue
            seen.add(s)
            rows.append([HHBLITS_AA_TO_ID[c] for c in s])
            dels.append(d)
    n = len(rows)
    return {"msa": np.array(rows, np.int32), "deletion_matrix_int": np.array(dels, np.int32),
            "num_alignments": np.full(len(sequence), n, np.int32)}
