"""Synthetic Criteo multi-hot days with clicks drawn from a hidden teacher, so AUROC is learnable.

Like the reference's materialization, a sample's bag for feature k is its base id followed by
h_k - 1 ids that are a fixed function of (k, base id) (the reference draws them once into a
lookup table; here a hash gives the same thing without a table, so 40M-row features cost nothing).
Base ids are skewed towards small values (a few ids are frequent, as in the click logs).

The teacher gives every (feature, id) a weight by hash (no table either) and scores a sample as
  logit = bias + a * sum_k mean_j w_k(id_kj) + b * (u . dense) + c * w_p(id_p0) * w_q(id_q0)
with one crossed pair (p, q), so both the embeddings and the cross network have something to learn;
the click is Bernoulli(sigmoid(logit)). Everything is deterministic per (seed, day) and chunked,
so days can be written in parallel and any day can be rewritten identically.
"""
from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from hpcbench.common.data.datagen import Datagen
from hpcbench.common.errors import ConfigError

from .criteo import CARDINALITIES, MULTI_HOT_SIZES, NUM_DENSE
from .format import Rows


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser: a cheap well-mixed hash of uint64 values."""
    x = x.astype(np.uint64, copy=True)
    with np.errstate(over="ignore"):
        x ^= x >> np.uint64(30)
        x *= np.uint64(0xBF58476D1CE4E5B9)
        x ^= x >> np.uint64(27)
        x *= np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    return x


def _hash(*parts: np.ndarray | int) -> np.ndarray:
    h = np.zeros((), np.uint64)
    for p in parts:
        with np.errstate(over="ignore"):
            h = _mix(h * np.uint64(0x9E3779B97F4A7C15) + np.asarray(p).astype(np.uint64))
    return h


def _unit(h: np.ndarray) -> np.ndarray:
    """Uniform in [0, 1) from a hash."""
    return (h >> np.uint64(11)).astype(np.float64) / float(1 << 53)


@dataclass(frozen=True)
class Teacher:
    """The hidden click model (see the module docstring). ``cross``: the crossed feature pair."""

    cardinalities: tuple[int, ...]
    bag_sizes: tuple[int, ...] = MULTI_HOT_SIZES
    seed: int = 0
    bias: float = -1.3
    sparse_scale: float = 0.9
    dense_scale: float = 0.6
    cross_scale: float = 1.2
    cross: tuple[int, int] = (0, 2)
    skew: float = 2.5  # base id = floor(card * u ** skew): larger is more skewed
    dense_weights: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if len(self.cardinalities) != len(self.bag_sizes):
            raise ValueError(f"{len(self.cardinalities)} cardinalities but {len(self.bag_sizes)} bag sizes")
        u = np.random.default_rng([self.seed, 7]).standard_normal(NUM_DENSE)
        object.__setattr__(self, "dense_weights", (u / np.linalg.norm(u)).astype(np.float64))

    def weight(self, k: int, ids: np.ndarray) -> np.ndarray:
        """The teacher's weight of ids of feature k: about N(0, 1) by hash (the four 16-bit parts of one
        hash as uniforms, summed and standardised)."""
        h = _hash(self.seed, 1000 + k, ids)
        parts = sum(((h >> np.uint64(s)) & np.uint64(0xFFFF)).astype(np.float64) for s in (0, 16, 32, 48))
        return (parts / 65536.0 - 2.0) * np.sqrt(3.0)

    def bags(self, k: int, base: np.ndarray) -> np.ndarray:
        """The (n, h_k) int32 bag of each base id: the id itself, then h_k - 1 ids fixed by (k, id)."""
        h, card = self.bag_sizes[k], self.cardinalities[k]
        if h == 1:
            return base[:, None].astype(np.int32)
        extra = _hash(self.seed, 5000 + k, base[:, None], np.arange(1, h, dtype=np.uint64)[None, :])
        extra = (extra % np.uint64(card)).astype(np.int64)
        return np.concatenate([base[:, None], extra], axis=1).astype(np.int32)

    def logits(self, dense: np.ndarray, sparse: Sequence[np.ndarray]) -> np.ndarray:
        s = sum(self.weight(k, ids).mean(axis=1) for k, ids in enumerate(sparse)) / np.sqrt(len(sparse))
        d = (dense.astype(np.float64) - 1.5) @ self.dense_weights
        p, q = self.cross
        c = self.weight(p, sparse[p][:, 0]) * self.weight(q, sparse[q][:, 0])
        return self.bias + self.sparse_scale * s + self.dense_scale * d + self.cross_scale * c

    def sample(self, n: int, day: int, chunk: int = 0) -> Rows:
        """``n`` samples of one chunk of one day (deterministic per (seed, day, chunk))."""
        rng = np.random.default_rng([self.seed, day, chunk])
        raw = np.floor(np.exp(rng.normal(1.0, 1.4, size=(n, NUM_DENSE)))) - 1.0  # counts >= -1, heavy-tailed
        raw[rng.random((n, NUM_DENSE)) < 0.1] = 0.0  # missing values are filled with 0, as the preprocessing
        dense = np.log(raw + 3.0).astype(np.float32)
        sparse = []
        for k, card in enumerate(self.cardinalities):
            base = np.minimum((card * rng.random(n) ** self.skew).astype(np.int64), card - 1)
            sparse.append(self.bags(k, base))
        p = 1.0 / (1.0 + np.exp(-self.logits(dense, sparse)))
        labels = (rng.random(n) < p).astype(np.int32)
        return Rows(dense, labels, sparse)

    def day(self, n: int, day: int, chunk_rows: int = 1 << 16) -> Rows:
        """All ``n`` rows of a day, made in chunks of ``chunk_rows``."""
        parts = [self.sample(min(chunk_rows, n - s), day, i) for i, s in enumerate(range(0, n, chunk_rows))]
        if not parts:
            parts = [self.sample(0, day, 0)]
        return Rows(np.concatenate([p.dense for p in parts]), np.concatenate([p.labels for p in parts]),
                    [np.concatenate([p.sparse[k] for p in parts]) for k in range(len(self.cardinalities))])


def write_synthetic(folder: str, days: int, rows_per_day: int, teacher: Teacher) -> None:
    """Write ``days`` days of ``rows_per_day`` rows each in the published layout."""
    from .format import write_day

    for d in range(days):
        r = teacher.day(rows_per_day, d)
        write_day(folder, d, r.dense, r.labels.reshape(-1, 1), r.sparse, teacher.bag_sizes, teacher.cardinalities)


def _write_one(args: tuple[str, int, int, tuple[int, ...], int]) -> int:
    """Write day ``d`` (a process-pool job); its bytes on disk."""
    from pathlib import Path

    from .criteo import day_files
    from .format import write_day

    folder, d, rows, cards, seed = args
    teacher = Teacher(cards, seed=seed)
    r = teacher.day(rows, d)
    write_day(folder, d, r.dense, r.labels.reshape(-1, 1), r.sparse, teacher.bag_sizes, teacher.cardinalities)
    return sum((Path(folder) / f).stat().st_size for f in day_files(d))


def generate(folder: str, days: int, rows_per_day: int, cardinalities: tuple[int, ...], seed: int = 0,
             workers: int = 1, progress: bool = True) -> int:
    """Write ``days`` days in parallel (one process per day, ``spawn``; each day written, read back and
    renamed by ``write_day``); the bytes written. A day is made in memory: sizes for a laptop, not
    the 4 TB of the real dataset."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    jobs = [(str(folder), d, rows_per_day, tuple(cardinalities), seed) for d in range(days)]
    total = 0
    if workers <= 1:
        results = map(_write_one, jobs)
    else:
        pool = ProcessPoolExecutor(min(workers, days), mp_context=multiprocessing.get_context("spawn"))
        results = pool.map(_write_one, jobs)
    try:
        for d, nbytes in enumerate(results):
            total += nbytes
            if progress:
                print(f"datagen dlrm_dcnv2: day {d + 1}/{days} written ({nbytes / 2**20:.1f} MiB)", flush=True)
    finally:
        if workers > 1:
            pool.shutdown()
    return total


class DLRMDatagen(Datagen):
    """Criteo multi-hot day files (``hpcbench datagen dlrm_dcnv2``)."""

    @classmethod
    def add_datagen_args(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--days", type=int, default=4, help="days D: D-1 train days and one eval day (MLPerf: 24)")
        parser.add_argument("--rows-per-day", type=int, default=32768, help="rows of each day")
        parser.add_argument("--cardinalities", default="reference",
                            help="'reference' (the MLPerf table sizes, 40M-row tables included) or 26 "
                                 "comma-separated table sizes; fewer are repeated to 26. The model's "
                                 "model.cardinalities must be the same")
        parser.add_argument("--quiet", action="store_true", help="no line per day")

    @classmethod
    def embedded_datagen_args(cls) -> list[str]:
        """The dataset the ``mini`` preset is tuned on (see configs/mini.toml)."""
        return ["--days", "4", "--rows-per-day", "32768", "--cardinalities", "200,100,50,20"]

    @classmethod
    def datagen(cls, args: argparse.Namespace) -> None:
        cards = parse_cardinalities(args.cardinalities)
        if args.days < 2 or args.rows_per_day < 2:
            raise ConfigError(f"--days must be >= 2 and --rows-per-day >= 2, got {args.days} and {args.rows_per_day}")
        nbytes = generate(args.out, args.days, args.rows_per_day, cards, seed=args.seed,
                          workers=max(1, args.workers), progress=not args.quiet)
        print(f"wrote {args.days} days x {args.rows_per_day} rows of Criteo multi-hot data "
              f"({nbytes / 2**20:.1f} MiB) to {args.out}")


def parse_cardinalities(text: str) -> tuple[int, ...]:
    if text == "reference":
        return CARDINALITIES
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"--cardinalities: expected 'reference' or comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1 or len(values) > len(CARDINALITIES):
        raise ConfigError(f"--cardinalities: 1 to {len(CARDINALITIES)} sizes >= 1, got {text!r}")
    return tuple((values * len(CARDINALITIES))[: len(CARDINALITIES)])
