"""OC20 at static shapes (opencatalyst/static.py): a padded batch trains exactly as the unpadded one.

Float64 throughout the step comparisons: energies, forces, the loss over its divisor and every
parameter gradient of the padded batch equal the unpadded batch's to 1e-12 relative (what is left is the
summation order inside GEMMs over more rows). The padding's labels are then set to garbage to show they
never enter the loss, its divisor or the evaluation sums.
"""
from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import numpy as np
import pytest
import torch

from hpcbench.common.data.spec import DatasetSpec
from hpcbench.common.errors import ConfigError
from hpcbench.common.step import tensors_of, tree_map
from hpcbench.common.workload import DataShard
from hpcbench.workloads.opencatalyst import datagen, lmdbio, static
from hpcbench.workloads.opencatalyst.batch import GraphBatch, collate
from hpcbench.workloads.opencatalyst.model import DimeNetPP, DimeNetPPConfig
from hpcbench.workloads.opencatalyst.workload import OC20Workload

SPEC = datagen.GenSpec(cutoff=4.0, max_neighbors=12)  # the mini preset's graphs: 13-14 atoms, small


@pytest.fixture(scope="module")
def samples() -> list[dict]:
    return [datagen.make_sample(SPEC, 0, "train", k) for k in range(4)]


def f64(b: GraphBatch) -> GraphBatch:
    return dataclasses.replace(b, pos=b.pos.double(), shift=b.shift.double(), force=b.force.double(),
                               energy=b.energy.double())


def model() -> DimeNetPP:
    torch.manual_seed(0)
    m = DimeNetPP(DimeNetPPConfig(hidden=32, out_emb=32, int_emb=16, blocks=2, cutoff=4.0)).double().train()
    with torch.no_grad():  # the reference initialises the last output layer to 0: make every path count
        m.out.final.normal_()
    return m


def step(w: OC20Workload, m: DimeNetPP, b: GraphBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                                list[torch.Tensor]]:
    """(energies, forces, loss / loss_count, parameter gradients) of one training step's maths."""
    m.zero_grad()
    out = w.forward(m, b)
    loss = w.loss(out, b) / w.loss_count(b)
    loss.backward()
    return out.energy.detach(), out.forces.detach(), loss.detach(), [p.grad.clone() for p in m.parameters()]


def padded(b: GraphBatch, graphs: int, extra: tuple[int, int, int] = (5, 37, 301)) -> GraphBatch:
    n, e, t = b.pos.shape[0], b.edge_index.shape[1], b.idx_kj.numel()
    return static.pad_batch(b, static.Shape(graphs, n + extra[0], e + extra[1], t + extra[2]), 8.0)


def close(a: torch.Tensor, b: torch.Tensor, rel: float = 1e-12) -> bool:
    return bool((a - b).abs().max() <= rel * max(float(b.abs().max()), 1e-30))


@pytest.mark.parametrize("overrides", [["model.energy_coefficient=2"], ["data.normalize_labels=false"]])
def test_padded_step_equals_unpadded(samples: list[dict], overrides: list[str]) -> None:
    w = OC20Workload(OC20Workload.load_config("full", overrides))
    m = model()
    b = collate(samples[:3])
    p = padded(b, graphs=5)  # 3 real graphs, 2 empty slots and the padding slot
    assert p.num_graphs == 6 and p.size == 3 and w.batch_size(p) == 3 and p.graph_mask.tolist() == [1, 1, 1, 0, 0, 0]
    e1, f1, l1, g1 = step(w, m, f64(b))
    e2, f2, l2, g2 = step(w, m, f64(p))
    n = b.pos.shape[0]
    assert close(e2[:3], e1) and close(f2[:n], f1) and close(l2, l1)
    assert torch.isfinite(f2).all() and float(f2[n:].abs().max()) == 0.0  # padding atoms feel no force
    assert float(w.loss_count(p)) == float(w.loss_count(b))  # the per-free-atom divisor: real atoms only
    assert all(close(a, c) for a, c in zip(g2, g1))
    assert sum(float(g.abs().sum()) for g in g1) > 0


def test_padding_labels_never_enter_loss_or_metric(samples: list[dict]) -> None:
    w = OC20Workload(OC20Workload.load_config("full", ["model.energy_coefficient=2"]))
    m = model()
    b = collate(samples[:2])
    p = padded(b, graphs=4)
    n = b.pos.shape[0]
    bad = dataclasses.replace(p, force=p.force.clone(), energy=p.energy.clone())
    bad.force[n:] = 1e6  # garbage labels on every padding atom and graph slot
    bad.energy[2:] = -1e6
    _, _, l_ok, g_ok = step(w, m, f64(p))
    _, _, l_bad, g_bad = step(w, m, f64(bad))
    assert float(l_bad) == float(l_ok) and all(torch.equal(a, c) for a, c in zip(g_bad, g_ok))
    m.eval()
    sums = {k: [] for k in ("force_abs_err", "force_components")}
    for batch in (f64(b), f64(bad)):
        out = w.forward(m, batch)
        for k, v in w.eval_sums(out, batch).items():
            sums[k].append(float(v))
    assert sums["force_components"][0] == sums["force_components"][1] == 3.0 * float(b.free.sum())
    assert sums["force_abs_err"][1] == pytest.approx(sums["force_abs_err"][0], rel=1e-12)


def test_best_boundaries_is_the_optimum_by_brute_force() -> None:
    rng = np.random.default_rng(3)
    for trial in range(20):
        values = rng.integers(10, 200, size=int(rng.integers(1, 30)))
        k = int(rng.integers(1, 4))
        got = static.best_boundaries(values, k)
        u = np.unique(values)

        def cost(bounds: tuple[int, ...]) -> int:
            return int(sum(min(x for x in bounds if x >= v) - v for v in values))

        best = min(cost(tuple(c) + (int(u[-1]),)) for r in range(min(k, len(u)))
                   for c in itertools.combinations(u[:-1].tolist(), r))
        assert got[-1] == u[-1] and len(got) <= k and cost(got) == best, (values, k, got)


def test_buckets_cover_every_batch_and_grow_past_the_largest() -> None:
    totals = np.array([[4, 50, 600, 7000], [4, 55, 640, 7400], [3, 40, 500, 5000], [4, 61, 700, 9000]])
    bk = static.choose_buckets(totals, per_dim=2)
    assert bk.graphs == 4 and len(bk.atoms) <= 2 and bk.atoms[-1] >= 62 and bk.triplets[-1] >= 9000
    for row in totals:
        s = bk.shape_for(*row)
        assert s.atoms > row[1] and s.edges > row[2] and s.triplets >= row[3] and s.graphs >= row[0]
    big = bk.shape_for(6, 500, 10_000, 100_000)  # beyond every bucket: the largest grown by 25% steps
    assert big.graphs == 6 and big.atoms >= 501 and big.triplets >= 100_000 and big.triplets % bk.align == 0
    over = static.padding_overhead(totals, bk)
    assert over["shapes"] <= 8 and all(over[d] >= 0 for d in ("atoms", "edges", "triplets"))
    # data.shape_buckets = 0: per dimension the fewest sizes with at most 8% padding of these batches
    rng = np.random.default_rng(0)
    wide = np.stack([np.full(500, 4), rng.integers(40, 200, 500), rng.integers(1000, 9000, 500),
                     rng.integers(10_000, 300_000, 500)], axis=1)
    auto = static.choose_buckets(wide, 0)
    over = static.padding_overhead(wide, auto)
    assert max(over["atoms"], over["edges"], over["triplets"]) <= static.AUTO_GOAL
    assert 1 < len(auto.triplets) <= static.MAX_AUTO and len(static.choose_buckets(wide, 1).triplets) == 1
    with pytest.raises(ValueError, match="cannot hold"):
        static.pad_batch(collate([datagen.make_sample(SPEC, 0, "train", 0)]), static.Shape(1, 5, 5, 5), 8.0)


def test_graph_batch_is_a_tensor_tree_for_graph_capture(samples: list[dict]) -> None:
    p = padded(collate(samples[:2]), graphs=2)
    leaves = tensors_of(p)
    assert len(leaves) == 11  # every tensor field incl. graph_mask: a CUDA graph copies each into its buffer
    moved = tree_map(lambda t: t.clone(), p)
    assert isinstance(moved, GraphBatch) and moved.num_graphs == p.num_graphs and moved.samples == 2


def write_split(root: Path, split: str, count: int) -> None:
    (root / split).mkdir(parents=True)
    lmdbio.write_shard(root / split / lmdbio.shard_name(0),
                       (datagen.make_sample(SPEC, 0, split, k) for k in range(count)))


def test_loaders_pad_to_few_shapes_with_static_shapes_on(tmp_path: Path) -> None:
    write_split(tmp_path, "train", 24)
    write_split(tmp_path, "validation", 7)
    w = OC20Workload(OC20Workload.load_config("mini", [f"data.root={tmp_path}", "data.static_shapes=true",
                                                       "data.shape_buckets=2", "data.threads=0"]))
    shard = DataShard(rank=0, size=1, seed=1, local_batch_size=4, device=torch.device("cpu"))
    train, ev = w.train_loader(shard), w.eval_loader(shard)
    assert w.static_shapes and 1 <= w.static_shape_count <= 8
    shapes, seen = set(), 0
    for loader in (train, ev):
        for batch in loader:
            assert batch.graph_mask is not None and batch.num_graphs == 5  # 4 graph slots + the padding slot
            shapes.add(tuple(tuple(t.shape) for t in tensors_of(batch)))
            seen += batch.size
    assert seen == 24 + 7 and len(shapes) <= w.static_shape_count
    # off (and "auto" on a CPU): batches as collated
    w2 = OC20Workload(OC20Workload.load_config("mini", [f"data.root={tmp_path}", "data.threads=0"]))
    assert next(iter(w2.train_loader(shard))).graph_mask is None and not w2.static_shapes


@pytest.mark.parametrize("key,value", [("data.static_shapes", "maybe"), ("data.shape_buckets", "17")])
def test_bad_static_shape_keys_are_refused_by_name(key: str, value: str) -> None:
    with pytest.raises(ConfigError, match=key):
        OC20Workload(OC20Workload.load_config("mini", [f"{key}={value}"]))


def test_spec_collate_is_unpadded_until_planned(samples: list[dict]) -> None:
    w = OC20Workload(OC20Workload.load_config("mini"))
    spec = w.dataset()
    assert isinstance(spec, DatasetSpec) and spec.collate(samples[:2]).graph_mask is None


def padded_training_batches(root: Path, device: torch.device, count: int) -> tuple[OC20Workload, list[GraphBatch]]:
    write_split(root, "train", 24)
    write_split(root, "validation", 4)
    w = OC20Workload(OC20Workload.load_config("mini", [f"data.root={root}", "data.static_shapes=true",
                                                       "data.shape_buckets=2", "data.threads=0"]))
    loader = w.train_loader(DataShard(rank=0, size=1, seed=1, local_batch_size=4, device=device))
    batches: list[GraphBatch] = []
    epoch = 0
    while len(batches) < count:
        loader.set_epoch(epoch)
        batches.extend(b for _, b in zip(range(count - len(batches)), loader))
        epoch += 1
    return w, batches


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graph capture needs a GPU")
def test_cuda_graph_per_bucket_equals_eager(tmp_path: Path) -> None:
    """One CUDA graph per padded shape, replayed, trains as the eager step (the tolerance of
    tests/test_gpu_graphs.py: index_add on a GPU sums in no fixed order)."""
    from tests.harness_graph import _interleave, stepper

    dev = torch.device("cuda")
    w, batches = padded_training_batches(tmp_path, dev, 10)
    steppers = [stepper(w, mode, dev) for mode in ("eager", "cuda_graph")]
    out = _interleave(steppers, batches, warm=1)
    graphed = steppers[1][0]
    shapes = {tuple(tuple(t.shape) for t in tensors_of(b)) for b in batches}
    assert graphed.graph_count == min(len(shapes), graphed.max_graphs) and len(shapes) > 1
    assert out["max_diff"] <= 1e-4 + 1e-3 * out["param_scale"], out
    assert out["loss_diff"] <= 1e-3 * max(out["loss_scale"], 1e-6), out


def test_padded_batches_through_the_harness_step_on_cpu(tmp_path: Path) -> None:
    """The same comparison as the GPU test, eager vs eager on the CPU: the padded loader's batches run
    through the harness's TrainStep (loss over the free-atom count, optimizer) and train identically."""
    from tests.harness_graph import _interleave, stepper

    dev = torch.device("cpu")
    w, batches = padded_training_batches(tmp_path, dev, 2)
    steppers = [stepper(w, "eager", dev) for _ in range(2)]
    assert steppers[0][0].max_graphs == w.static_shape_count > 1
    out = _interleave(steppers, batches, warm=1)
    assert out["max_diff"] == 0.0 and out["loss_diff"] == 0.0 and out["loss_scale"] > 0
