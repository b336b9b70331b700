"""Exact binary AUROC (ties count one half), from all scores or from partial sums over ranks.

AUROC is the probability that a random positive scores above a random negative, ties counting
one half: (2 * wins + ties) / (2 * P * N) over all P * N (positive, negative) pairs. It is not a
sum of per-rank statistics of the ranks' own samples (a sample's rank depends on every other
score), and binning scores into a histogram, which would make it one, is approximate. Two exact
forms are offered:

* :func:`auroc` on all scores (gathered, or a single rank): a sort and tie-averaged ranks
  (Mann-Whitney U), in integer arithmetic (doubled ranks), so it stays exact at the 89M samples of
  the real validation set where float64 rank sums would not.
* :func:`distributed_auroc`: every rank gathers the scores of the *smaller class* only (clicks
  are a few percent of Criteo), counts its own samples of the other class against them
  (:func:`pair_counts`: wins and ties, integers) and the counts are summed over ranks: additive
  partial sums, exact, moving only the small class instead of every score (what the reference's
  torchmetrics AUROC gathers).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # pragma: no cover
    from hpcbench.common.parallel import Collectives


def _check(scores: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scores, labels = scores.reshape(-1), labels.reshape(-1)
    if scores.shape != labels.shape:
        raise ValueError(f"AUROC: {scores.numel()} scores but {labels.numel()} labels")
    if torch.isnan(scores).any():
        raise ValueError("AUROC: scores contain NaN")
    if labels.numel() and not bool(((labels == 0) | (labels == 1)).all()):
        raise ValueError("AUROC: labels must be 0 or 1")
    return scores, labels.to(torch.int64)


def from_counts(wins: int, ties: int, positives: int, negatives: int) -> float:
    """AUROC from pair counts: wins = pairs with the positive above, ties = pairs with equal scores."""
    if positives == 0 or negatives == 0:
        raise ValueError(f"AUROC is undefined with {positives} positive and {negatives} negative samples")
    return (2 * int(wins) + int(ties)) / (2 * int(positives) * int(negatives))


def auroc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """Exact AUROC of all ``scores`` (any real dtype) against 0/1 ``labels``."""
    scores, labels = _check(scores, labels)
    values, inverse, counts = torch.unique(scores, sorted=True, return_inverse=True, return_counts=True)
    start = torch.cumsum(counts, 0) - counts  # samples below each distinct value
    doubled_rank = 2 * start + counts + 1  # 2 x the average 1-based rank of a tied group
    pos_per_value = torch.zeros(values.numel(), dtype=torch.int64, device=scores.device).index_add_(0, inverse, labels)
    p = int(labels.sum())
    n = labels.numel() - p
    doubled_u = int((doubled_rank * pos_per_value).sum()) - p * (p + 1)  # 2 * (wins + ties / 2)
    if p == 0 or n == 0:
        from_counts(0, 0, p, n)  # raises with the counts
    return doubled_u / (2 * p * n)


def pair_counts(mine: torch.Tensor, others: torch.Tensor, mine_positive: bool) -> tuple[int, int]:
    """(wins, ties) of the pairs between this rank's samples of one class (``mine``) and all samples
    of the other class (``others``): wins = pairs where the positive scores above the negative."""
    others = torch.sort(others.reshape(-1)).values
    mine = mine.reshape(-1).to(others.dtype)
    below = torch.searchsorted(others, mine, right=False)  # others < mine
    below_or_equal = torch.searchsorted(others, mine, right=True)
    ties = int((below_or_equal - below).sum())
    wins = int(below.sum()) if mine_positive else int((others.numel() - below_or_equal).sum())
    return wins, ties


def distributed_auroc(scores: torch.Tensor, labels: torch.Tensor, coll: "Collectives") -> float:
    """Exact AUROC of the samples of all ranks that ``coll`` (the harness's layout object, or any object
    with its ``sum``/``gather``) spans; each rank passes its own."""
    scores, labels = _check(scores, labels)
    counts = coll.sum(torch.stack([labels.sum(), (1 - labels).sum()]).to(torch.int64))
    p, n = int(counts[0]), int(counts[1])
    gather_positives = p <= n
    small = scores[labels == (1 if gather_positives else 0)]
    others = coll.gather(small)
    mine = scores[labels == (0 if gather_positives else 1)]
    wins, ties = pair_counts(mine, others, mine_positive=not gather_positives)
    sums = coll.sum(torch.tensor([wins, ties], dtype=torch.int64, device=scores.device))
    return from_counts(int(sums[0]), int(sums[1]), p, n)
