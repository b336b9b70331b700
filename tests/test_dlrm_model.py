"""DLRM-DCNv2 model: the reference parameter count (at the MLPerf sizes on the meta device, and for
small tables), shapes, the cross-layer formula, and exact AUROC against a brute-force pair count."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from hpcbench.workloads.mlperf_training.dlrm_dcnv2.auroc import auroc, from_counts, pair_counts
from hpcbench.workloads.mlperf_training.dlrm_dcnv2.criteo import CARDINALITIES
from hpcbench.workloads.mlperf_training.dlrm_dcnv2.model import DLRMDCNv2, LowRankCrossNet, ModelConfig, param_count


def reference_count(cards: tuple[int, ...], d: int, bottom: list[int], top: list[int], layers: int, rank: int) -> int:
    """Written out from the reference's layer list: 13 -> bottom; (F + 1) * D cross layers with
    V (r x N), W (N x r), b (N); N -> top."""
    n = (len(cards) + 1) * d
    dims_b, dims_t = [13, *bottom], [n, *top]
    linear = sum(a * b + b for a, b in zip(dims_b, dims_b[1:])) + sum(a * b + b for a, b in zip(dims_t, dims_t[1:]))
    return sum(cards) * d + linear + layers * (rank * n + n * rank + n)


def test_mlperf_size_parameter_count_on_meta() -> None:
    cfg = ModelConfig()
    model = DLRMDCNv2(cfg, device="meta")  # 204M embedding rows: no memory on the meta device
    got = sum(p.numel() for p in model.parameters())
    want = reference_count(CARDINALITIES, 128, [512, 256, 128], [1024, 1024, 512, 256, 1], 3, 512)
    assert got == want == param_count(cfg)
    assert sum(CARDINALITIES) == 204_184_588
    dense_part = want - sum(CARDINALITIES) * 128
    assert dense_part == 171_392 + 5_245_953 + 10_627_200  # bottom MLP + top MLP + cross network (by hand)


def small_cfg(**kw: object) -> ModelConfig:
    base = dict(cardinalities=(50, 7, 30), bag_sizes=(3, 1, 2), embedding_dim=4, bottom_mlp=(8, 4),
                top_mlp=(16, 8, 1), dcn_layers=2, dcn_low_rank=3)
    base.update(kw)
    return ModelConfig(**base)  # type: ignore[arg-type]


def test_small_model_count_shapes_and_init() -> None:
    cfg = small_cfg()
    torch.manual_seed(0)
    model = DLRMDCNv2(cfg)
    assert sum(p.numel() for p in model.parameters()) == param_count(cfg) == reference_count(
        (50, 7, 30), 4, [8, 4], [16, 8, 1], 2, 3)
    dense = torch.randn(5, 13)
    sparse = [torch.randint(0, c, (5, h), dtype=torch.int32) for c, h in zip(cfg.cardinalities, cfg.bag_sizes)]
    out = model(dense, sparse)
    assert out.shape == (5,)
    for bag, rows in zip(model.sparse_arch.bags, cfg.cardinalities):
        assert bag.weight.abs().max() <= (1 / rows) ** 0.5
    assert all(float(b.detach().abs().max()) == 0.0 for b in model.cross.b)
    pooled = model.sparse_arch(sparse)
    torch.testing.assert_close(pooled[:, 0], model.sparse_arch.bags[0].weight[sparse[0].long()].sum(1))


def test_cross_layer_formula() -> None:
    torch.manual_seed(1)
    net = LowRankCrossNet(6, 2, 3)
    with torch.no_grad():
        for b in net.b:
            b.normal_()
    x0 = torch.randn(4, 6)
    x = x0
    for v, w, b in zip(net.v, net.w, net.b):
        x = x0 * (x @ v.T @ w.T + b) + x
    torch.testing.assert_close(net(x0), x)


def test_config_checks() -> None:
    with pytest.raises(ValueError, match="bottom MLP must end at embedding_dim 4"):
        small_cfg(bottom_mlp=(8, 5))
    with pytest.raises(ValueError, match="top MLP must end with one logit"):
        small_cfg(top_mlp=(16, 2))
    with pytest.raises(ValueError, match="3 cardinalities but 2 bag sizes"):
        small_cfg(bag_sizes=(1, 1))


def brute_force(scores: np.ndarray, labels: np.ndarray) -> float:
    pos, neg = scores[labels == 1], scores[labels == 0]
    diff = pos[:, None] - neg[None, :]
    return float(((diff > 0).sum() + 0.5 * (diff == 0).sum()) / diff.size)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_auroc_exact_with_ties(seed: int) -> None:
    rng = np.random.default_rng(seed)
    scores = np.round(rng.random(301), 1).astype(np.float32)  # 11 distinct values: many ties
    labels = (rng.random(301) < 0.3).astype(np.int64)
    want = brute_force(scores, labels)
    assert auroc(torch.tensor(scores), torch.tensor(labels)) == pytest.approx(want, abs=1e-12)
    # partial sums: positives split over "ranks", each counted against all negatives
    neg = torch.tensor(scores[labels == 0])
    counts = [pair_counts(torch.tensor(part), neg, mine_positive=True)
              for part in np.array_split(scores[labels == 1], 3)]
    wins, ties = sum(c[0] for c in counts), sum(c[1] for c in counts)
    assert from_counts(wins, ties, int(labels.sum()), int((1 - labels).sum())) == pytest.approx(want, abs=1e-12)
    pos = torch.tensor(scores[labels == 1])  # and the other way round
    counts = [pair_counts(torch.tensor(part), pos, mine_positive=False)
              for part in np.array_split(scores[labels == 0], 4)]
    assert from_counts(sum(c[0] for c in counts), sum(c[1] for c in counts), int(labels.sum()),
                       int((1 - labels).sum())) == pytest.approx(want, abs=1e-12)


def test_auroc_edges() -> None:
    assert auroc(torch.tensor([0.1, 0.9]), torch.tensor([0, 1])) == 1.0
    assert auroc(torch.tensor([0.5, 0.5, 0.5]), torch.tensor([0, 1, 1])) == 0.5
    with pytest.raises(ValueError, match="undefined with 0 positive and 3 negative"):
        auroc(torch.tensor([0.1, 0.2, 0.3]), torch.tensor([0, 0, 0]))
    with pytest.raises(ValueError, match="labels must be 0 or 1"):
        auroc(torch.tensor([0.1, 0.2]), torch.tensor([0, 2]))
    with pytest.raises(ValueError, match="NaN"):
        auroc(torch.tensor([float("nan"), 0.2]), torch.tensor([0, 1]))


def test_auroc_matches_sklearn_when_installed() -> None:
    metrics = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(5)
    scores = np.round(rng.random(500), 2)
    labels = (rng.random(500) < 0.4).astype(np.int64)
    assert auroc(torch.tensor(scores), torch.tensor(labels)) == pytest.approx(metrics.roc_auc_score(labels, scores))
