"""Sparse embedding gradients for DLRM-DCNv2's owned tables (``model.sparse_grads``): the harness's step
with them equals the dense flat-buffer path (float64, 1 and 2 ranks under mpiexec); their gradient
holds one row per distinct id, not the table; the row-wise Adagrad equals torch's sparse Adagrad and
refuses what sparse rows cannot express."""
from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from hpcbench.common.errors import ConfigError
from hpcbench.common.flat import FlatParams
from hpcbench.common.parallel import Parallel
from hpcbench.common.optim import build_optimizer
from hpcbench.common.runconfig import OptimConfig
from hpcbench.common.sparse_optim import SparseAdagrad
from hpcbench.workloads.mlperf_training.dlrm_dcnv2.workload import DLRMWorkload
from tests.conftest import run_mpi


@pytest.mark.parametrize("ranks", [1, 2])
def test_sparse_grads_equal_the_dense_path_and_hold_touched_rows_only(ranks: int) -> None:
    proc = run_mpi(ranks, ["tests/mpi_scripts/dlrm_sparse.py"], timeout=180)
    results = next(json.loads(x) for x in proc.stdout.splitlines() if x.startswith("[{"))
    assert sorted(r["rank"] for r in results) == list(range(ranks))
    for r in results:
        assert r["diff"] < 1e-12, r["diff"]  # float64: equal up to summation order
        assert r["moved"] > 0.05  # three steps moved the weights, so equality means something
        # the owned tables are out of the flat buffer: it shrank by exactly their size
        assert r["flat_numel"] == r["dense_flat_numel"] - r["outside_numel"] and r["outside_numel"] > 0
        assert r["tables"], "every rank owns a large table here"
        for t in r["tables"]:
            # one gradient row per distinct id of the global batch routed to this table, not one per table row
            assert t["nnz"] == t["distinct_ids"] < t["rows"], t
            assert t["grad_elems"] == t["nnz"] * t["table_elems"] // t["rows"], t
    # together the ranks hold each large table once
    assert sum(r["outside_numel"] for r in results) == results[0]["outside_numel"] * ranks


def test_row_wise_adagrad_equals_torch_sparse_adagrad() -> None:
    torch.manual_seed(0)
    a = nn.EmbeddingBag(50, 4, mode="sum", sparse=True)
    b = nn.EmbeddingBag(50, 4, mode="sum", sparse=True)
    b.load_state_dict(a.state_dict())
    cfg = OptimConfig(name="adagrad", lr=0.1, eps=1e-8, lr_decay=0.05, initial_accumulator=0.1)
    ours = SparseAdagrad([a.weight], cfg)
    ref = torch.optim.Adagrad(b.parameters(), lr=0.1, eps=1e-8, lr_decay=0.05, initial_accumulator_value=0.1)
    for step in range(4):
        ids = torch.randint(0, 20, (8, 3))  # rows 20.. are never touched
        a(ids).square().sum().backward()
        ours.step(torch.tensor(cfg.lr), torch.tensor(float(step)))
        assert a.weight.grad is None  # consumed: its memory is gone before the next forward
        ref.zero_grad()
        b(ids).square().sum().backward()
        ref.step()
        torch.testing.assert_close(a.weight, b.weight, rtol=1e-6, atol=1e-7, msg=f"step {step}")
    torch.testing.assert_close(ours.sums[0], ref.state[b.weight]["sum"])


def test_sparse_parameters_stay_outside_the_flat_buffer_and_refusals() -> None:
    m = nn.ModuleDict({"emb": nn.EmbeddingBag(30, 4, sparse=True), "lin": nn.Linear(4, 1)})
    flat = FlatParams(m, outside=[m["emb"].weight])
    assert flat.names == ["lin.weight", "lin.bias"] and flat.outside == [m["emb"].weight]
    opt = build_optimizer(flat, OptimConfig(name="adagrad", lr=0.1))
    assert opt.sparse is not None and opt.state_numel() == flat.size + 30 * 4
    m["emb"].weight.grad = torch.ones(30, 4).to_sparse()
    flat.zero_grad()
    assert m["emb"].weight.grad is None
    with pytest.raises(ConfigError, match="optim.name.*only adagrad"):
        build_optimizer(flat, OptimConfig(name="sgd", lr=0.1))
    with pytest.raises(ConfigError, match="optim.weight_decay"):
        build_optimizer(flat, OptimConfig(name="adagrad", lr=0.1, weight_decay=0.01))
    with pytest.raises(ConfigError, match="held by every rank"):  # a replicated sparse table: no sparse all-reduce
        build_optimizer(flat, OptimConfig(name="adagrad", lr=0.1), world=2)


@pytest.mark.parametrize("sparse", [True, False])
def test_workload_switch_marks_only_the_large_tables(sparse: bool) -> None:
    wl = DLRMWorkload(DLRMWorkload.load_config("mini", [f"model.sparse_grads={str(sparse).lower()}"]))
    model = wl.distribute(wl.build_model(), Parallel.of_default_group())
    large = [k for k, c in enumerate(wl.cfg.model.cardinalities) if c >= wl.cfg.model.shard_min_rows]
    got = wl.sparse_parameters(model)
    assert [id(p) for p in got] == ([id(model.sparse_arch.bags[k].weight) for k in large] if sparse else [])
    assert DLRMWorkload.load_config("full").model.sparse_grads  # the 40M-row tables need it
    assert not DLRMWorkload.load_config("mini").model.sparse_grads  # 200-row tables: dense was faster
