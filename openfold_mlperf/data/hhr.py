"""HHsearch ``.hhr`` template hits (OpenProteinSet ``hhr/pdb70_hits.hhr``), read as the reference's ``parse_hhr``.

A hit block starts with ``No <n>``, then ``>`` + the hit name (``<pdbid>_<chain> ...``), then the summary line
(``Probab=... E-value=... Score=... Aligned_cols=... Identities=...% Similarity=... Sum_probs=...
Template_Neff=...``), then alignment rows ``Q <name> <start> <residues> <end> (<length>)`` and
``T <name> <start> <residues> <end> (<length>)`` (columns from 17 on), skipping ``ss_dssp``, ``ss_pred``
and ``Consensus`` rows. Indices are zero-based, -1 at gaps. A malformed block is refused by file and hit.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from hpcbench.common.errors import DataError

_SUMMARY = re.compile(r"Probab=(.*)[\t ]*E-value=(.*)[\t ]*Score=(.*)[\t ]*Aligned_cols=(.*)[\t ]*"
                      r"Identities=(.*)%[\t ]*Similarity=(.*)[\t ]*Sum_probs=(.*)[\t ]*Template_Neff=(.*)")
_Q_ROW = re.compile(r"[\t ]*([0-9]*) ([A-Z-]*)[\t ]*([0-9]*) \([0-9]*\)")
_T_ROW = re.compile(r"[\t ]*([0-9]*) ([A-Z-]*)[\t ]*[0-9]* \([0-9]*\)")
_SKIP = ("ss_dssp", "ss_pred", "Consensus")


@dataclass(frozen=True)
class TemplateHit:
    index: int
    name: str
    aligned_cols: int
    sum_probs: float
    query: str
    hit_sequence: str
    indices_query: list[int]
    indices_hit: list[int]


def _indices(seq: str, start: int, out: list[int]) -> None:
    for ch in seq:
        if ch == "-":
            out.append(-1)
        else:
            out.append(start)
            start += 1


def _hit(lines: list[str], where: str) -> TemplateHit:
    head = f"{where}: hit block '{lines[0].strip()}'"
    try:
        number = int(lines[0].split()[-1])
    except ValueError:
        raise DataError(f"{head}: 'No' line has no hit number") from None
    if len(lines) < 3 or not lines[1].startswith(">"):
        raise DataError(f"{head}: expected a '>' name line after the 'No' line")
    m = _SUMMARY.match(lines[2])
    if m is None:
        raise DataError(f"{head}: summary line {lines[2]!r} lacks Probab/E-value/Score/Aligned_cols/Identities/"
                        "Similarity/Sum_probs/Template_Neff")
    try:
        vals = [float(x) for x in m.groups()]
    except ValueError:
        raise DataError(f"{head}: summary line {lines[2]!r} has a value that is not a number") from None
    query, hit = "", ""
    iq: list[int] = []
    ih: list[int] = []
    block: int | None = None
    for line in lines[3:]:
        kind = line[:2]
        if kind not in ("Q ", "T ") or any(line.startswith(f"{kind}{s}") for s in _SKIP):
            continue
        rx = _Q_ROW if kind == "Q " else _T_ROW
        g = rx.match(line[17:])
        if g is None or not g.group(1):
            raise DataError(f"{head}: alignment row {line!r} is not '<start> <residues> <end> (<length>)'")
        start, seq = int(g.group(1)) - 1, g.group(2)
        if kind == "Q ":
            end = int(g.group(3))
            block = end - start + seq.count("-")
            if block != len(seq):
                raise DataError(f"{head}: query row {line!r} spans {block} columns but shows {len(seq)}")
            query += seq
            _indices(seq, start, iq)
        else:
            if block != len(seq):
                raise DataError(f"{head}: template row {line!r} has {len(seq)} columns, its query row {block}")
            hit += seq
            _indices(seq, start, ih)
    return TemplateHit(index=number, name=lines[1][1:], aligned_cols=int(vals[3]), sum_probs=vals[6],
                       query=query, hit_sequence=hit, indices_query=iq, indices_hit=ih)


def parse(text: str, where: str) -> list[TemplateHit]:
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("No ")]
    starts.append(len(lines))
    return [_hit(lines[a:b], where) for a, b in zip(starts, starts[1:])]
