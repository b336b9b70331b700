"""OC20 batches at static shapes: each batch padded to one of a few bucket sizes (``data.static_shapes``).

A disjoint-union graph batch has new sizes every step (atoms, edges, triplets), so a GPU step is
launch-bound: no CUDA graph, no static compilation. Padding each batch up to the smallest bucket that
holds it leaves a handful of shapes (the product of the few buckets per dimension that the batches
actually reach), each compiled and captured once.

Padding contributes exactly nothing (``tests/test_oc20_static.py`` checks it against the unpadded step):

* graphs: ``graphs`` slots for the real graphs (the empty ones sum no atoms: energy 0) plus one padding
  slot; ``graph_mask`` is False for every slot but the real graphs, and the energy loss is masked by it;
* atoms (at least one): atomic number 0 at the origin, in the padding slot, *not free*, force label 0,
  so they are outside the force loss, the force metric and the loss divisor (the free-atom count);
* edges (at least one): self-loops of the first padding atom whose periodic shift is ``pad_distance``
  long (twice the model's cutoff). DimeNet++'s envelope is multiplied by the step ``d < cutoff``, so it
  and each of its derivatives are exactly 0 there, and so is every radial and spherical basis value of a
  padding edge. Its state never reaches an atom (the output blocks weight edge states by a bias-free
  projection of that basis) nor a message (``x_kj * rbf`` is 0 and ``lin_down`` has no bias);
* triplets: pairs of the first padding edge with itself: each message is a 0 state times a 0 basis.

Real atoms, edges and triplets keep their indices, so the real graphs' energies, forces and every
gradient are those of the unpadded batch (up to the order of sums inside GEMMs over more rows).

Buckets come from the split's stored per-sample sizes (the LMDB files' ``"sizes"`` key) and the batches
the rank's sampler will actually form (its first epochs, as it forms them): for each dimension, the ``k``
boundaries that minimise the total padding over those batches (an exact dynamic programme over the
batch totals, rounded up to ``align``), ``k`` = ``data.shape_buckets``, or with 0 the fewest that keep
that dimension's padding within 8% (at most 16). Dimensions are bucketed independently, so a batch's
shape is one of the combinations; the sizes correlate, and the batches reach only some of them
(``benchmarks/oc20_static_buckets.py`` counts them). A batch above the largest bucket (possible only
outside the simulated epochs) is padded to the largest bucket grown by 25% steps, so shapes stay few
even then.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from hpcbench.common.errors import ConfigError

from .batch import GraphBatch

DIMS = ("graphs", "atoms", "edges", "triplets")
GROWTH = 1.25  # overflow buckets: the largest one times GROWTH**k
MAX_CANDIDATES = 512  # distinct batch totals the optimiser works on (more are rounded up onto quantiles)
AUTO_GOAL = 0.08  # data.shape_buckets = 0: per dimension the fewest sizes with <= 8% padding of the simulated batches
MAX_AUTO = 16


def _round_up(x: int | np.ndarray, align: int) -> int | np.ndarray:
    return -(-x // align) * align


@dataclass(frozen=True)
class Shape:
    """One padded batch shape: real-graph slots, atoms, edges, triplets."""

    graphs: int
    atoms: int
    edges: int
    triplets: int


@dataclass(frozen=True)
class Buckets:
    """Ascending bucket sizes per dimension; ``graphs`` is the real-graph capacity (the padded energy
    vector has ``graphs + 1`` entries, the last one the padding slot's)."""

    graphs: int
    atoms: tuple[int, ...]
    edges: tuple[int, ...]
    triplets: tuple[int, ...]
    align: int = 8

    def __post_init__(self) -> None:
        for name in DIMS[1:]:
            values = getattr(self, name)
            if not values or any(b <= 0 for b in values) or list(values) != sorted(set(values)):
                raise ConfigError(f"static-shape buckets '{name}': {values!r}; expected ascending positive sizes")
        if self.graphs < 1:
            raise ConfigError(f"static-shape buckets 'graphs': {self.graphs}; expected at least 1")

    def _fit(self, need: int, table: Sequence[int]) -> int:
        for b in table:
            if b >= need:
                return b
        k = math.ceil(math.log(need / table[-1]) / math.log(GROWTH))
        return int(_round_up(math.ceil(table[-1] * GROWTH ** k), self.align))

    def shape_for(self, graphs: int, atoms: int, edges: int, triplets: int) -> Shape:
        """The bucket of a batch with these real sizes (one padding atom and one padding edge reserved)."""
        return Shape(max(self.graphs, graphs), self._fit(atoms + 1, self.atoms), self._fit(edges + 1, self.edges),
                     self._fit(triplets, self.triplets))


def batch_totals(sizes: np.ndarray, batches: Iterable[np.ndarray]) -> np.ndarray:
    """int64 [batches, 4]: (graphs, atoms, edges, triplets) of each batch of sample indices, from the
    per-sample (natoms, edges, triplets) ``sizes`` [n, 3]."""
    sizes = np.asarray(sizes, np.int64).reshape(-1, 3)
    rows = [(len(b), *sizes[np.asarray(b, np.int64)].sum(0)) for b in batches if len(b)]
    return np.asarray(rows, np.int64).reshape(-1, 4)


def sampler_totals(sampler: Any, sizes: np.ndarray, first_epoch: int, epochs: int) -> np.ndarray:
    """:func:`batch_totals` of the batches a sampler (``set_epoch``/``batches``, e.g. the shared
    ``EpochSampler``) forms in ``epochs`` epochs from ``first_epoch``; the sampler's epoch is restored."""
    saved = getattr(sampler, "epoch", None)
    batches: list[np.ndarray] = []
    for epoch in range(first_epoch, first_epoch + epochs):
        sampler.set_epoch(epoch)
        batches.extend(sampler.batches())
    if saved is not None:
        sampler.set_epoch(saved)
    return batch_totals(sizes, batches)


def best_boundaries(values: np.ndarray, k: int, align: int = 1) -> tuple[int, ...]:
    """At most ``k`` sizes, the largest = max(values), minimising sum(bucket(v) - v) where bucket(v) is
    the smallest size >= v: an exact dynamic programme over the distinct values (rounded up to
    ``align``; above MAX_CANDIDATES distinct values they are first rounded up onto quantiles)."""
    if k < 1:
        raise ConfigError(f"static-shape buckets per dimension: {k}; expected at least 1")
    v = np.sort(_round_up(np.asarray(values, np.int64), align))
    if v.size == 0:
        return (align,)
    u = np.unique(v)
    if u.size > MAX_CANDIDATES:
        cand = np.unique(np.quantile(u, np.linspace(0, 1, MAX_CANDIDATES), method="higher").astype(np.int64))
        u = cand
    # weight and value sum of the totals that round up to each candidate
    slot = np.searchsorted(u, v, side="left")
    count = np.bincount(slot, minlength=u.size).astype(np.float64)
    total = np.bincount(slot, weights=v.astype(np.float64), minlength=u.size)
    if u.size <= k:
        return tuple(int(x) for x in u)
    pc, ps = np.concatenate([[0.0], np.cumsum(count)]), np.concatenate([[0.0], np.cumsum(total)])
    m = u.size
    # cost[i, j]: the totals in candidates i..j padded to u[j]
    best = np.full((k + 1, m + 1), np.inf)
    arg = np.zeros((k + 1, m + 1), np.int64)
    best[0, 0] = 0.0
    for b in range(1, k + 1):
        for j in range(1, m + 1):  # candidates [0, j) covered, the last bucket u[j-1]
            i = np.arange(0, j)  # the last bucket covers candidates i..j-1
            cost = best[b - 1, i] + u[j - 1] * (pc[j] - pc[i]) - (ps[j] - ps[i])
            a = int(np.argmin(cost))
            best[b, j], arg[b, j] = cost[a], a
    b = int(np.argmin(best[1:, m])) + 1
    out, j = [], m
    while j > 0:
        out.append(int(u[j - 1]))
        j, b = int(arg[b, j]), b - 1
    return tuple(sorted(out))


def _fewest(values: np.ndarray, k: int, align: int, goal: float, reserve: int) -> tuple[int, ...]:
    """``k`` boundaries, or with ``k`` = 0 the fewest (at most MAX_AUTO) padding ``values`` by at most ``goal``
    of their real sum (``values`` minus the ``reserve`` padding entries each holds)."""
    if k:
        return best_boundaries(values, k, align)
    real = max(float(np.sum(values)) - reserve * len(values), 1.0)
    for n in range(1, MAX_AUTO + 1):
        bounds = best_boundaries(values, n, align)
        padded = float(np.asarray(bounds)[np.searchsorted(bounds, values)].sum())
        if padded - real <= goal * real:
            return bounds
    return bounds


def choose_buckets(totals: np.ndarray, per_dim: int, align: int = 8, goal: float = AUTO_GOAL) -> Buckets:
    """Buckets for batches with these (graphs, atoms, edges, triplets) ``totals`` [m, 4]: ``per_dim`` sizes
    per dimension, or with 0 the fewest per dimension whose padding of these batches is at most ``goal``
    of the real atoms, edges or triplets; atoms and edges reserve one padding entry."""
    totals = np.asarray(totals, np.int64).reshape(-1, 4)
    if totals.shape[0] == 0:
        raise ConfigError("static shapes: no batches to choose bucket sizes from (the split gives no batch)")
    return Buckets(graphs=int(totals[:, 0].max()), atoms=_fewest(totals[:, 1] + 1, per_dim, align, goal, 1),
                   edges=_fewest(totals[:, 2] + 1, per_dim, align, goal, 1),
                   triplets=_fewest(np.maximum(totals[:, 3], 1), per_dim, align, goal, 0), align=align)


def padding_overhead(totals: np.ndarray, buckets: Buckets) -> dict[str, float]:
    """Padded minus real over real, summed over the batches, per dimension (atoms, edges, triplets), and
    ``shapes``: the distinct shapes these batches take."""
    totals = np.asarray(totals, np.int64).reshape(-1, 4)
    shapes = [buckets.shape_for(*map(int, row)) for row in totals]
    out = {}
    for k, name in enumerate(DIMS[1:], start=1):
        real = float(totals[:, k].sum())
        padded = float(sum(getattr(s, name) for s in shapes))
        out[name] = (padded - real) / max(real, 1.0)
    out["shapes"] = float(len(set(shapes)))
    return out


def pad_batch(batch: GraphBatch, shape: Shape, pad_distance: float) -> GraphBatch:
    """``batch`` padded to ``shape`` (see the module doc); ``pad_distance`` >= the model's cutoff."""
    if batch.graph_mask is not None:
        raise ValueError("pad_batch: the batch is padded already")
    n, e, t = batch.pos.shape[0], batch.edge_index.shape[1], batch.idx_kj.numel()
    g = batch.num_graphs
    if shape.atoms <= n or shape.edges <= e or shape.triplets < t or shape.graphs < g:
        raise ValueError(f"shape {shape} cannot hold a batch of {g} graphs, {n} atoms, {e} edges, {t} triplets "
                         "(one padding atom and edge are needed)")
    na, ne, nt = shape.atoms - n, shape.edges - e, shape.triplets - t
    slot = shape.graphs  # the padding graph slot

    def cat(x: torch.Tensor, fill: float | int, rows: int) -> torch.Tensor:
        return torch.cat([x, x.new_full((rows, *x.shape[1:]), fill)])

    shift = batch.shift.new_zeros(ne, 3)
    shift[:, 0] = pad_distance
    pad_atom = n  # every padding edge is a self-loop of the first padding atom
    graph_mask = torch.zeros(shape.graphs + 1, dtype=torch.bool)
    graph_mask[:g] = True
    return GraphBatch(
        z=cat(batch.z, 0, na), pos=cat(batch.pos, 0.0, na), batch=cat(batch.batch, slot, na),
        edge_index=torch.cat([batch.edge_index, batch.edge_index.new_full((2, ne), pad_atom)], dim=1),
        shift=torch.cat([batch.shift, shift]), idx_kj=cat(batch.idx_kj, e, nt), idx_ji=cat(batch.idx_ji, e, nt),
        force=cat(batch.force, 0.0, na), free=cat(batch.free, False, na),
        energy=torch.cat([batch.energy[:g], batch.energy.new_zeros(shape.graphs + 1 - g)]),
        num_graphs=shape.graphs + 1, graph_mask=graph_mask, samples=g)
