"""A minimal CIF 1.1 reader (the syntax of PDB mmCIF files), without Biopython.

Returns what Biopython's ``MMCIF2Dict`` returns and the reference reads: ``{"_category.item": [values]}``
for the first data block, single items as one-element lists, loop columns as lists. Handles ``loop_``,
single/double-quoted values (a quote closes only before whitespace), ``;``-delimited text fields, and
``#`` comments. Malformed input raises :class:`DataError` naming the file and line.
"""
from __future__ import annotations

from collections.abc import Iterator

from hpcbench.common.errors import DataError


def _tokens(text: str, where: str) -> Iterator[tuple[str, int, bool]]:
    """(token, line number, was quoted) for every token of a CIF text."""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith(";"):
            start = i
            parts = [line[1:]]
            i += 1
            while i < len(lines) and not lines[i].startswith(";"):
                parts.append(lines[i])
                i += 1
            if i == len(lines):
                raise DataError(f"{where}: line {start + 1}: text field opened with ';' is never closed")
            yield "\n".join(parts).strip("\n"), start + 1, True
            i += 1
            continue
        j, n = 0, len(line)
        while j < n:
            c = line[j]
            if c.isspace():
                j += 1
            elif c == "#":
                break
            elif c in "'\"":
                k = j + 1
                while True:
                    k = line.find(c, k)
                    if k < 0:
                        raise DataError(f"{where}: line {i + 1}: quoted value opened with {c} is never closed")
                    if k + 1 == n or line[k + 1].isspace():
                        break
                    k += 1
                yield line[j + 1:k], i + 1, True
                j = k + 1
            else:
                k = j
                while k < n and not line[k].isspace():
                    k += 1
                yield line[j:k], i + 1, False
                j = k
        i += 1


def parse(text: str, where: str) -> dict[str, list[str]]:
    """The first data block of a CIF text as ``{"_cat.item": [values]}``."""
    out: dict[str, list[str]] = {}
    toks = list(_tokens(text, where))
    pos = 0
    seen_block = False
    while pos < len(toks):
        tok, line, quoted = toks[pos]
        low = tok.lower()
        if not quoted and low.startswith("data_"):
            if seen_block:
                break  # only the first data block, as the reference reads one entry per file
            seen_block = True
            out["data_"] = [tok[5:]]
            pos += 1
        elif not quoted and low == "loop_":
            pos += 1
            names: list[str] = []
            while pos < len(toks) and not toks[pos][2] and toks[pos][0].startswith("_"):
                names.append(toks[pos][0])
                pos += 1
            if not names:
                raise DataError(f"{where}: line {line}: loop_ without item names")
            values: list[str] = []
            while pos < len(toks):
                t, _, q = toks[pos]
                if not q and (t.startswith("_") or t.lower() == "loop_" or t.lower().startswith("data_")):
                    break
                values.append(t)
                pos += 1
            if len(values) % len(names):
                raise DataError(f"{where}: line {line}: loop of {names[0].split('.')[0]} has {len(values)} values "
                                f"for {len(names)} columns (expected a multiple of {len(names)})")
            for c, name in enumerate(names):
                out[name] = values[c::len(names)]
        elif not quoted and tok.startswith("_"):
            if pos + 1 >= len(toks) or (not toks[pos + 1][2] and (toks[pos + 1][0].startswith("_")
                                                                   or toks[pos + 1][0].lower() == "loop_")):
                raise DataError(f"{where}: line {line}: item {tok} has no value")
            out[tok] = [toks[pos + 1][0]]
            pos += 2
        else:
            raise DataError(f"{where}: line {line}: unexpected value {tok!r} outside an item or loop")
    if not seen_block:
        raise DataError(f"{where}: no 'data_' block (expected a CIF file starting with data_<ID>)")
    return out
