"""Template features from HHR hits, as the reference's ``TemplateHitFeaturizer`` (mlcommons/hpc
``openfold/data/templates.py``): hits are prefiltered (chain known, not the query's own entry, released at
least 60 days before the query, ``aligned_cols / L > 0.1``, not a >95%-length exact subsequence of the query,
at least 10 residues), sorted by ``Sum_probs``, the top 20 shuffled with ``random.Random(seed)`` when
training, then featurized in that order until ``max_templates`` succeed. A hit's residues are mapped to
the query through the HHR alignment; the template chain is found in its entry by chain id and exact
sequence, then any chain, then with X as a wildcard; its atoms are zero-centred.

Difference: where none of those finds the hit's sequence, the reference realigns it with the external
``kalign`` program; this implementation has no kalign and skips such a hit (it is counted in ``errors``).
"""
from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date

import numpy as np

from .. import residue_constants as rc
from .hhr import TemplateHit
from .mmcif import Structure


@dataclass
class TemplateResult:
    features: dict[str, np.ndarray]
    names: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def empty(n: int) -> dict[str, np.ndarray]:
    return {"template_aatype": np.zeros((0, n), np.int64),
            "template_all_atom_positions": np.zeros((0, n, 37, 3), np.float32),
            "template_all_atom_mask": np.zeros((0, n, 37), np.float32),
            "template_sum_probs": np.zeros((0, 1), np.float32)}


def hit_pdb_chain(hit: TemplateHit) -> tuple[str, str]:
    m = re.match(r"[a-zA-Z\d]{4}_[a-zA-Z0-9.]+", hit.name)
    if not m:
        raise ValueError(f"template hit name {hit.name!r} does not start with PDBID_chain")
    pdb_id, chain = m.group(0).split("_")
    return pdb_id.lower(), chain


def query_to_hit_mapping(query: str, hit: TemplateHit) -> dict[int, int]:
    if not hit.query:
        return {}
    hq = hit.query.replace("-", "")
    hs = hit.hit_sequence.replace("-", "")
    offset = query.find(hq)
    mh = min(x for x in hit.indices_hit if x > -1)
    mq = min(x for x in hit.indices_query if x > -1)
    out = {}
    for qi, ti in zip(hit.indices_query, hit.indices_hit):
        if qi > -1 and ti > -1:
            qi, ti = qi - mq, ti - mh
            if ti < len(hs) and qi + offset < len(query):
                out[qi + offset] = ti
    return out


@dataclass
class TemplateFeaturizer:
    max_templates: int
    load_structure: Callable[[str], Structure]
    template_chain_ids: set[str]
    release_dates: dict[str, date]
    obsolete: dict[str, str]
    shuffle_top_k: int | None = 20
    days_before_release: int = 60

    def _resolve(self, hit: TemplateHit) -> tuple[str, str]:
        pdb_id, chain = hit_pdb_chain(hit)
        if pdb_id not in self.release_dates and pdb_id in self.obsolete:
            pdb_id = self.obsolete[pdb_id]
        return pdb_id, chain

    def acceptable(self, hit: TemplateHit, query: str, query_pdb_id: str | None, max_date: date) -> str | None:
        """None if the hit passes the reference's prefilter, else the reason."""
        pdb_id, chain = self._resolve(hit)
        if f"{pdb_id}_{chain}" not in self.template_chain_ids:
            return f"{pdb_id}_{chain} not a known chain"
        if query_pdb_id is not None and pdb_id == query_pdb_id.lower():
            return "template is the query's entry"
        if pdb_id in self.release_dates and self.release_dates[pdb_id] > max_date:
            return "released after the template cut-off"
        if hit.aligned_cols / len(query) <= 0.1:
            return "aligned to <= 10% of the query"
        tseq = hit.hit_sequence.replace("-", "")
        if tseq in query and len(tseq) / len(query) > 0.95:
            return "duplicate of the query"
        if len(tseq) < 10:
            return "shorter than 10 residues"
        return None

    def features(self, query: str, hits: list[TemplateHit], query_release: date, query_pdb_id: str | None,
                 seed: int | None) -> TemplateResult:
        from datetime import timedelta

        max_date = query_release - timedelta(days=self.days_before_release)
        result = TemplateResult(empty(len(query)))
        ok = [h for h in hits if self.acceptable(h, query, query_pdb_id, max_date) is None]
        ok.sort(key=lambda h: h.sum_probs, reverse=True)
        if self.shuffle_top_k is not None:
            top, rest = ok[:self.shuffle_top_k], ok[self.shuffle_top_k:]
            random.Random(seed).shuffle(top)
            ok = top + rest
        rows: list[tuple[np.ndarray, np.ndarray, np.ndarray, float]] = []
        for hit in ok:
            if len(rows) >= self.max_templates:
                break
            try:
                rows.append((*self._featurize(hit, query), hit.sum_probs))
                result.names.append(hit.name.split()[0])
            except ValueError as e:
                result.errors.append(f"{hit.name.split()[0]}: {e}")
        if rows:
            result.features = {
                "template_aatype": np.stack([r[0] for r in rows]),
                "template_all_atom_positions": np.stack([r[1] for r in rows]),
                "template_all_atom_mask": np.stack([r[2] for r in rows]),
                "template_sum_probs": np.array([[r[3]] for r in rows], np.float32)}
        return result

    def _featurize(self, hit: TemplateHit, query: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        pdb_id, chain = self._resolve(hit)
        mapping = query_to_hit_mapping(query, hit)
        tseq = hit.hit_sequence.replace("-", "")
        s = self.load_structure(pdb_id)
        found = _find_chain(s, chain, tseq)
        if found is None:
            raise ValueError(f"sequence {tseq!r} not in entry {pdb_id} (the reference would realign with kalign)")
        chain, offset = found
        pos = s.atoms[chain].positions.copy()
        mask = s.atoms[chain].mask
        if mask.any():
            pos[mask] -= pos[mask].mean(axis=0)
        ca = rc.ATOM_ORDER["CA"]
        both = mask[1:, ca] & mask[:-1, ca]  # adjacent residues that both have a CA, as the reference checks
        if both.any() and np.linalg.norm(pos[1:, ca] - pos[:-1, ca], axis=-1)[both].max() > 150.0:
            raise ValueError(f"adjacent CA atoms of {pdb_id}_{chain} are more than 150 A apart")
        n = len(query)
        out_pos = np.zeros((n, 37, 3), np.float32)
        out_mask = np.zeros((n, 37), np.float32)
        letters = ["-"] * n
        for q, t in mapping.items():
            out_pos[q] = pos[t + offset]
            out_mask[q] = mask[t + offset]
            letters[q] = tseq[t]
        if out_mask.sum() < 5:
            raise ValueError(f"template {pdb_id}_{chain} has fewer than 5 atoms on the aligned residues")
        aatype = np.array([rc.HHBLITS_AA_TO_ID[c] for c in letters], np.int64)
        return aatype, out_pos, out_mask


def _find_chain(s: Structure, chain: str, tseq: str) -> tuple[str, int] | None:
    seq = s.sequences.get(chain)
    if seq and tseq in seq:
        return chain, seq.find(tseq)
    for c, seq in s.sequences.items():
        if seq and tseq in seq:
            return c, seq.find(tseq)
    rx = re.compile("".join("." if a == "X" else f"(?:{a}|X)" for a in tseq))
    for c, seq in s.sequences.items():
        m = rx.search(seq)
        if m:
            return c, m.start()
    return None
