"""Cost-balanced partition (common.data.sampler, partition "balanced"): LPT over a global batch for
evaluation, window balancing for training (every sample once per epoch, disjoint over ranks,
deterministic from (seed, epoch), even per step at 2 and 8 samples per rank); loss normalisation
under real mpiexec."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hpcbench.common.data.sampler import EpochSampler, lpt_partition, window_steps
from hpcbench.workloads.opencatalyst import datagen
from tests.conftest import ROOT, run_mpi


def test_lpt_partition_is_complete_deterministic_and_balanced() -> None:
    rng = np.random.default_rng(0)
    costs = rng.integers(100, 3000, 64)
    parts = lpt_partition(costs, 8)
    assert sorted(i for p in parts for i in p) == list(range(64))
    assert parts == lpt_partition(costs.copy(), 8)
    loads = np.array([costs[p].sum() for p in parts])
    assert loads.max() - loads.min() <= costs.max()  # LPT bound
    assert lpt_partition([5, 5, 5, 5], 2) == [[0, 2], [1, 3]]  # ties: lowest index first, lowest rank first


def test_sampler_epochs_cover_data_and_balance_beats_strided() -> None:
    costs = np.random.default_rng(1).integers(50, 2500, 200)
    ratios = {}
    for balanced in (True, False):
        partition = "balanced" if balanced else "strided"
        samplers = [EpochSampler(200, 32 // 8, r, 8, seed=5, partition=partition, costs=costs) for r in range(8)]
        for s in samplers:
            s.set_epoch(2)
        steps = list(zip(*[s.batches() for s in samplers]))
        assert len(steps) == len(samplers[0]) == 200 // 32
        seen = [i for step in steps for part in step for i in part]
        assert len(seen) == len(set(seen)) == 6 * 32
        loads = np.array([[costs[p].sum() for p in step] for step in steps])
        ratios[balanced] = float((loads.max(1) / loads.mean(1)).mean())
    assert ratios[True] < 1.05 < ratios[False]
    a, b = (EpochSampler(200, 32 // 8, 0, 8, seed=5, partition="balanced", costs=costs) for _ in range(2))
    b.set_epoch(1)
    assert a.indices().tolist() != b.indices().tolist()  # reshuffled per epoch


def oc20_like_costs(n: int, seed: int = 0) -> np.ndarray:
    """Edges per system as benchmarks/oc20_sampler_balance.py draws them: 20-225 atoms, 25-40 edges each."""
    rng = np.random.default_rng(seed)
    return (rng.integers(20, 226, n) * rng.uniform(25, 40, n)).astype(np.int64)


def epoch_steps(costs: np.ndarray, per_rank: int, ranks: int, seed: int, epoch: int, window: int = 32) -> list:
    samplers = [EpochSampler(costs.size, per_rank, r, ranks, seed, "balanced", costs=costs, window=window)
                for r in range(ranks)]
    for s in samplers:
        s.set_epoch(epoch)
    return list(zip(*[s.batches() for s in samplers]))


@pytest.mark.parametrize("per_rank,goal", [(2, 1.02), (8, 1.005)])
def test_window_balanced_training_steps_are_even_complete_and_deterministic(per_rank: int, goal: float) -> None:
    costs, ranks = oc20_like_costs(5000), 8
    g = per_rank * ranks
    steps = epoch_steps(costs, per_rank, ranks, seed=4, epoch=3)
    assert len(steps) == costs.size // g  # every whole global batch: the last window is shorter (here 312 % 32)
    assert all(len(part) == per_rank for step in steps for part in step)  # each rank its local batch
    seen = np.concatenate([part for step in steps for part in step])
    assert len(set(seen.tolist())) == seen.size == len(steps) * g  # once per epoch, disjoint over ranks
    loads = np.array([[costs[part].sum() for part in step] for step in steps])
    ratio = float((loads.max(1) / loads.mean(1)).mean())
    assert ratio <= goal, ratio  # the goal is 1.05 at 2 per rank (moonshot 1.02)
    again = epoch_steps(costs, per_rank, ranks, seed=4, epoch=3)  # deterministic from (seed, epoch) alone
    assert all(np.array_equal(a, b) for s1, s2 in zip(steps, again) for a, b in zip(s1, s2))
    other = epoch_steps(costs, per_rank, ranks, seed=4, epoch=4)
    assert not np.array_equal(np.concatenate(steps[0]), np.concatenate(other[0]))


def test_the_dropped_remainder_is_what_the_permutation_leaves() -> None:
    costs, ranks, per_rank = oc20_like_costs(203), 4, 2  # 203 = 25 steps of 8, 3 left out this epoch
    s = EpochSampler(costs.size, per_rank, 0, ranks, 9, "balanced", costs=costs, window=4)
    s.set_epoch(2)
    steps = epoch_steps(costs, per_rank, ranks, seed=9, epoch=2, window=4)
    kept = set(np.concatenate([p for step in steps for p in step]).tolist())
    assert kept == set(s.order()[:25 * 8].tolist())  # windows cut from the permutation in order
    for w in range(0, 25, 4):  # each window's steps hold exactly that window's samples of the permutation
        window = set(np.concatenate([p for step in steps[w:w + 4] for p in step]).tolist())
        assert window == set(s.order()[w * 8:min(w + 4, 25) * 8].tolist())


def test_window_steps_pairs_heavy_with_light() -> None:
    costs = np.array([10.0, 1, 9, 2, 8, 3, 7, 4])  # 2 ranks x 2 steps x 2 per rank
    steps = window_steps(costs, 2, 2, np.random.default_rng(0))
    assert steps.shape == (2, 2, 2) and sorted(steps.ravel().tolist()) == list(range(8))
    assert {float(costs[part].sum()) for step in steps for part in step} == {11.0}  # 10+1, 9+2, 8+3, 7+4
    with pytest.raises(ValueError, match="not whole steps of 3 ranks x 2 samples"):
        window_steps(costs, 3, 2, np.random.default_rng(0))


def test_eval_sampler_keeps_every_sample_once() -> None:
    costs = np.arange(1, 38)
    parts = [EpochSampler(37, 8 // 4, r, 4, seed=0, partition="balanced", train=False, costs=costs).batches()
             for r in range(4)]
    seen = sorted(i for rank in parts for step in rank for i in step)
    assert seen == list(range(37))
    with pytest.raises(ValueError, match="local batch 0"):  # a global batch of 2 over 4 ranks
        EpochSampler(37, 2 // 4, 0, 4, seed=0, partition="balanced", costs=costs)


def test_loss_normalisation_matches_global_batch_under_mpiexec(tmp_path: Path) -> None:
    spec = datagen.GenSpec(size=(2, 2, 2), cutoff=4.0, max_neighbors=10)
    datagen.generate_split(tmp_path, "train", 12, spec, seed=0, workers=1, per_shard=6, progress=False)
    proc = run_mpi(3, [str(ROOT / "tests" / "oc20_mpi_loss.py"), str(tmp_path)], timeout=300)
    assert proc.stdout.count("rel_grad_err") == 3, proc.stdout
    sizes = sorted(int(line.split()[3]) for line in proc.stdout.splitlines() if "rel_grad_err" in line)
    assert sizes == [2, 2, 2]  # the training partition gives each rank its local batch; the gradient is exact
