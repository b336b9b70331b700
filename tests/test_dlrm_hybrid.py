"""Hybrid-parallel DLRM-DCNv2 embeddings under real mpiexec (gloo all_to_all_single on the CPU): equal to
the single-rank model with the same weights on 1, 2 and 4 ranks (outputs, gradients, one Adagrad step),
each rank holding only its own large tables; and the sharding plan."""
from __future__ import annotations

import json

import pytest

from hpcbench.workloads.mlperf_training.dlrm_dcnv2.criteo import CARDINALITIES
from hpcbench.workloads.mlperf_training.dlrm_dcnv2.hybrid import ShardingPlan
from tests.conftest import run_mpi


def test_plan_balances_large_tables_and_replicates_small_ones() -> None:
    plan = ShardingPlan.build(CARDINALITIES, 4, min_rows=1_000_000)
    assert plan.replicated == [k for k, c in enumerate(CARDINALITIES) if c < 1_000_000]
    loads = [sum(CARDINALITIES[k] for k in plan.owned(r)) for r in range(4)]
    # five 40M tables and one of 3M over 4 ranks, largest first to the least loaded rank
    assert sorted(len(plan.owned(r)) for r in range(4)) == [1, 1, 2, 2]
    assert sorted(loads) == [40_000_000, 40_000_000, 43_067_956, 80_000_000]
    assert ShardingPlan.build((5, 9), 3, min_rows=10).replicated == [0, 1]


@pytest.mark.parametrize("ranks, grads", [(1, "dense"), (2, "sparse"), (4, "dense")])
def test_hybrid_equals_single_rank(ranks: int, grads: str) -> None:
    proc = run_mpi(ranks, ["tests/mpi_scripts/dlrm_hybrid.py", grads], timeout=240)
    lines = next(json.loads(x) for x in proc.stdout.splitlines() if x.startswith("[{"))
    assert sorted(r["rank"] for r in lines) == list(range(ranks))
    for r in lines:
        assert r["world"] == ranks
        for what, diff in r["diffs"].items():
            assert diff < 1e-12, (r["rank"], what, diff)  # float64 model: equal up to summation order
        assert r["moved"] > 0.05  # the step changed the weights, so equal-after-step means something
        owners = r["owners"]
        assert r["sharded_here"] == [k for k, o in enumerate(owners) if o == r["rank"]]
    # every large table lives on exactly one rank; the others hold only the replicated part
    assert sum(r["sharded_numel"] for r in lines) == sum(c * 8 for c in (1000, 500, 2000))
    assert all(r["held"] == r["full"] - (sum(x["sharded_numel"] for x in lines) - r["sharded_numel"]) for r in lines)
    if ranks == 4:
        assert any(r["sharded_here"] == [] for r in lines)  # a rank with no table still joins the all-to-alls
