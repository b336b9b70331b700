"""The openfold workload: one feature schema for both sides, the reference's sampling and validation targets,
the closed keys of the full preset against every CHECK of the installed hpc 3.0.0 closed_openfold.yaml, the
pinned initial checkpoint, and the harness's weight average ("SWA") and Adam clipping it trains with."""
from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from closed_yaml import check_closed_yaml
from hpcbench import registry
from hpcbench.common.errors import ConfigError, DataError, DistributedError
from hpcbench.common.workload import DataShard, DataSizes
from hpcbench.workloads.openfold_mlperf import INIT_CHECKPOINT_SHA256, features
from hpcbench.workloads.openfold_mlperf.data import dataset, store, synth
from hpcbench.workloads.openfold_mlperf.model import checkpoint
from hpcbench.workloads.openfold_mlperf.model.alphafold import MODEL_FEATURES, TEMPLATE_FEATURES
from hpcbench.workloads.openfold_mlperf.model.losses import LOSS_FEATURES
from hpcbench.workloads.openfold_mlperf.spec import RecyclingDraws, TrainChains

MINI = ["data.crop_size=16", "data.max_msa_clusters=4", "data.max_extra_msa=4", "data.max_templates=2",
        "data.num_recycling_iters=1", "model.c_m=8", "model.c_z=8", "model.c_s=8", "model.evoformer_blocks=1",
        "model.structure_blocks=1", "model.init_checkpoint="]  # random weights (no pretrained mini checkpoint here)


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("openfold")
    synth.generate_raw(root, synth.SynthConfig(families=3, members=3, min_length=20, max_length=30, msa_rows=6))
    synth.preprocess(root)
    return root


def _workload(root: Path, *over: str):  # noqa: ANN202
    cls = registry.get("openfold")
    return cls(cls.load_config("mini", [*MINI, f"data.root={root}", *over]))


def test_model_and_loss_features_are_the_schema() -> None:
    schema = set(features.FEATURES) | {features.USE_CLAMPED_FAPE}
    for name, names in (("MODEL_FEATURES", MODEL_FEATURES), ("TEMPLATE_FEATURES", TEMPLATE_FEATURES),
                        ("LOSS_FEATURES", LOSS_FEATURES)):
        assert set(names) <= schema, (name, sorted(set(names) - schema))
    assert features.FEATURES["msa_feat"].shape[-1] == 49 and features.FEATURES["target_feat"].shape[-1] == 22


def test_the_model_trains_on_the_pipeline_batches(synthetic: Path) -> None:
    """A batch of the spec (two training draws) passes the schema check, the model's feature check, the
    loss, backward; an evaluation batch of two whole chains of different lengths is padded and scored."""
    w = _workload(synthetic)
    spec = w.dataset()
    train = w.source("train")
    sample = train[0]
    features.check(sample, spec.pipeline_config().sizes(16), train=True)
    batch = spec.collate([train[0], train[1]])
    model = w.build_model()
    out = w.forward(model, batch)
    loss = w.loss(out, batch)
    assert loss.ndim == 0 and torch.isfinite(loss) and float(w.loss_count(batch)) == 2.0
    loss.backward()
    no_grad = {n.rsplit('.', 1)[0] for n, p in model.named_parameters() if p.grad is None}
    # the experimentally-resolved head has loss weight 0 in initial training (not computed), as the reference's
    assert no_grad == {'auxiliary_heads.experimentally_resolved.linear'}, no_grad
    ev = w.source("validation")
    lengths = sorted({ev.chains.rows[i].sequence_length for i in range(len(ev))})
    assert len(ev) == 3 and len(lengths) > 1  # one target per family, of different lengths
    a, b = (next(i for i in range(len(ev)) if ev.chains.rows[i].sequence_length == n) for n in lengths[:2])
    eb = spec.collate([ev[a], ev[b]])
    assert eb["aatype"].shape[1] == lengths[1] and float(eb["seq_mask"][0, lengths[0]:].sum()) == 0.0
    model.eval()
    with torch.no_grad():
        sums = w.eval_sums(w.forward(model, eb), eb)
        alone = w.eval_sums(w.forward(model, spec.collate([ev[a]])), spec.collate([ev[a]]))
    assert float(sums["samples"]) == 2.0 and 0.0 <= w.metric({k: float(v) for k, v in sums.items()}) <= 1.0
    # the padded residues do not count: the shorter chain scores alike alone (model noise of padding aside)
    assert abs(float(alone["lddt_ca"]) - float(sums["lddt_ca"]) + 0.0) <= 1.0


def test_sampling_weights_and_weighted_draws(synthetic: Path) -> None:
    rows = store.read_chains(synthetic / "pdb_mmcif/processed/chains.csv")
    train = dataset.train_filter(rows, "2021-09-16")
    w = dataset.sampling_weights(train).numpy()
    sizes = {c: sum(r.pdb_cluster_id == c for r in train) for c in {r.pdb_cluster_id for r in train}}
    # the reference's _get_weight: length term x 1 / sqrt(cluster size)
    assert w == pytest.approx([max(min(r.sequence_length, 512), 256) / 512 / sizes[r.pdb_cluster_id] ** 0.5
                               for r in train])
    # hand-worked: a 100-residue chain alone in its cluster and a 600-residue one in a cluster of 4
    row = train[0]
    hand = dataset.sampling_weights([dataclasses.replace(row, sequence_length=100, pdb_cluster_id=1)]
                                    + [dataclasses.replace(row, sequence_length=600, pdb_cluster_id=2)] * 4).numpy()
    assert hand == pytest.approx([0.5, 0.5, 0.5, 0.5, 0.5])  # 256/512 / 1 and 512/512 / sqrt(4)
    weights = np.array([1.0, 3.0, 0.0, 4.0])
    src = TrainChains(list(range(4)), weights, seed=5)
    draws = [src.draw(i) for i in range(4000)]
    counts = np.bincount([c for c, _ in draws], minlength=4) / 4000
    assert counts == pytest.approx(weights / weights.sum(), abs=0.03) and counts[2] == 0.0
    assert src.draw(7) == draws[7]  # deterministic per (seed, epoch, slot)
    src.epoch = 1
    assert [src.draw(i) for i in range(50)] != draws[:50]  # another epoch draws again
    assert len({s for _, s in draws}) == len(draws)  # every draw its own crop / MSA seed


def test_validation_targets_as_the_reference_selects_them(tmp_path: Path) -> None:
    def row(pdb: str, chain: str, mmcif: str, n: int) -> store.ChainRow:
        return store.ChainRow(f"{pdb}_{chain}", pdb, chain, mmcif, "2021-10-01", 2.0, 1, n, "A" * n)

    rows = [row("7abc", "A", "A;C", 100), row("7abc", "B", "B", 100), row("7xyz", "H", "K", 800),
            row("7def", "A", "A", 50)]
    path = tmp_path / "targets.txt"
    path.write_text("# comment\n2021-09-18 7ABC C\n2021-09-25 7abc A\n2021-10-02 7xyz K\n2021-12-12 7def A\n"
                    "2021-10-09 7def A\n2021-10-09 9zzz A\n")
    targets = dataset.read_cameo_targets(path)
    got = dataset.validation_rows(rows, targets, "2021-09-17", "2021-12-11", 700)
    # 7abc C and A are the same author chain (once); 7xyz too long; 7def by its author chain; 9zzz absent
    assert [r.pdb_chain_id for r in got] == ["7abc_A", "7def_A"]
    assert len(dataset.read_cameo_targets(dataset.CAMEO_TARGETS_FILE)) == 183
    path.write_text("2021-09-18 7abc\n")
    with pytest.raises(DataError, match="line 1: '2021-09-18 7abc' is not 'YYYY-MM-DD pdb_id chain_id'"):
        dataset.read_cameo_targets(path)


def test_full_preset_keys_pass_the_closed_yaml() -> None:
    """Every key of closed_openfold.yaml, as the harness logs the full preset (the workload's keys and the
    harness's generic ones), evaluated with the checker's own CHECK expressions; the sample counts are the
    real dataset's (the dry run's stand-in for the data)."""
    cls = registry.get("openfold")
    cfg = cls.load_config("full")
    w = cls(cfg)
    w.sizes = DataSizes(train_samples=594_595, eval_samples=180, steps_per_epoch=2322,
                        local_batch_size=1)
    logged = {**w.hyperparameters(), "global_batch_size": cfg.train.global_batch_size,
              "train_samples": w.sizes.train_samples, "eval_samples": w.sizes.eval_samples}
    checked = check_closed_yaml("hpc_3.0.0", "closed_openfold.yaml", logged)
    assert len(checked) == 38  # every key of the YAML but eval_accuracy (the target, checked below)
    assert logged["precision"] == "fp32"  # not in the YAML; the reference logs its --precision
    closed = cls.record.closed
    assert closed is not None and logged["model_parameters_count"] == closed.parameters[0] == 93_229_082
    assert all(logged[k] == v for k, v in closed.fixed.items())
    t = w.target()
    assert (t.threshold, t.higher_is_better, t.reached(0.8), t.reached(0.79)) == (0.8, True, True, False)


def test_a_closed_run_needs_the_pinned_checkpoint() -> None:
    cls = registry.get("openfold")
    with pytest.raises(ConfigError, match="model.init_checkpoint"):
        cls.load_config("full", ["model.init_checkpoint_sha256=" + "0" * 64])
    with pytest.raises(ConfigError, match=r"'model\.init_checkpoint' = ''"):
        cls.load_config("full", ["model.init_checkpoint="])
    with pytest.raises(ConfigError, match="model.preset"):
        cls.load_config("full", ["model.preset=mini"])
    with pytest.raises(ConfigError, match="train.eval_every_samples"):
        cls.load_config("full", ["train.eval_every_samples=1000"])
    assert checkpoint.CLOSED_INIT_CHECKPOINT_SHA256 == INIT_CHECKPOINT_SHA256


def test_a_closed_config_is_refused_where_it_leaves_the_references_training() -> None:
    """Rows the official checker does not test (or tests only after the run): the 40-iteration cadence at any
    global batch, Adam from the checkpoint's state, the drawn recycling iterations, the reference's warmup shape;
    the PQ loader's order is not reproduced in either division."""
    cls = registry.get("openfold")
    with pytest.raises(ConfigError, match=r"'train\.eval_every_samples' = 10240 \(closed: 5120, every 40 iterations"):
        cls.load_config("full", ["train.global_batch_size=128"])  # a rules-tunable batch with the preset's cadence
    assert cls.load_config("full", ["train.global_batch_size=128", "train.eval_every_samples=5120"])
    with pytest.raises(ConfigError, match=r"train\.eval_every_samples"):
        cls.load_config("full", ["train.eval_every_samples=20480"])  # every 80 iterations
    for key, bad in (("model.init_optimizer_state", "false"), ("data.random_recycling", "false"),
                     ("optim.warmup_style", "harness"), ("model.dropout", "false")):
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            cls.load_config("full", [f"{key}={bad}"])
    # every departure is named at once, each with its value and what the closed division requires
    with pytest.raises(ConfigError) as err:
        cls.load_config("full", ["model.dropout=false", "data.random_recycling=false"])
    assert "'data.random_recycling' = False (closed: True" in str(err.value)
    assert "'model.dropout' = False (closed: True" in str(err.value)
    for preset in ("full", "mini"):
        with pytest.raises(ConfigError, match=r"data\.loader_type.*PQ loader"):
            cls.load_config(preset, ["data.loader_type=InitialTrainingDataloaderPQ"])
    # the open division may train with a fixed number of recycling iterations
    assert not cls.load_config("mini", ["data.random_recycling=false"]).data.random_recycling


def test_recycling_draws_are_the_references_shuffled_cycles() -> None:
    """spec.RecyclingDraws: per step one value of a shuffled cycle of 0..N, cycle after cycle, from the seed alone
    (every rank of an instance draws alike); any span of steps is the same slice of the one stream."""
    draws = RecyclingDraws(seed=7, max_iters=3)
    stream = draws.for_steps(0, 400)
    for c in range(100):
        assert sorted(stream[4 * c:4 * c + 4]) == [0, 1, 2, 3]
    assert len({tuple(stream[4 * c:4 * c + 4]) for c in range(100)}) > 10  # shuffled, not one fixed order
    assert draws.for_steps(37, 50) == stream[37:87]
    assert RecyclingDraws(seed=7, max_iters=3).for_steps(0, 400) == stream
    assert RecyclingDraws(seed=8, max_iters=3).for_steps(0, 400) != stream
    assert RecyclingDraws(seed=7, max_iters=0).for_steps(0, 5) == [0] * 5


def test_training_batches_run_the_drawn_recycling_iterations(synthetic: Path) -> None:
    """The workload's training loader cuts each batch to the step's draw (features of iterations 0..k, the last
    dimension), epoch after epoch of the one stream; the evaluation loader keeps every iteration."""
    w = _workload(synthetic, "data.num_recycling_iters=3")
    shard = DataShard(rank=0, size=1, seed=5, local_batch_size=1, device=torch.device("cpu"))
    loader = w.train_loader(shard)
    n = len(loader)
    draws = RecyclingDraws(5, 3).for_steps(0, 2 * n)
    seen = []
    for epoch in (1, 2):
        loader.set_epoch(epoch)
        for batch in loader:
            cycles = {int(v.shape[-1]) for v in batch.values()}
            assert len(cycles) == 1, cycles  # every feature cut alike
            seen.append(cycles.pop() - 1)
    assert seen == draws
    ev = w.eval_loader(shard)
    ev.set_epoch(1)
    assert all(int(b["aatype"].shape[-1]) == 4 for b in ev)
    fixed = _workload(synthetic, "data.num_recycling_iters=3", "data.random_recycling=false").train_loader(shard)
    fixed.set_epoch(1)
    assert all(int(b["aatype"].shape[-1]) == 4 for b in fixed)


def test_the_initial_checkpoint_is_hashed_logged_and_another_refused(synthetic: Path) -> None:
    """A checkpoint in the reference's resumable layout (random weights of the mini model) starts the run:
    its weights are the model's and its sha256 is init_checkpoint_sha256sum; with another expected hash the
    workload refuses it, naming the key, before loading anything."""
    w = _workload(synthetic)
    torch.manual_seed(3)
    ref = w.build_model()
    path = synthetic / "init.pt"
    torch.save({"iteration": 10, "alphafold_state_dict": ref.state_dict(), "optimizer_state_dict": {}}, path)
    digest = checkpoint.sha256_file(path)
    w2 = _workload(synthetic, "model.init_checkpoint=init.pt", f"model.init_checkpoint_sha256={digest}")
    torch.manual_seed(4)
    model = w2.build_model()
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), ref.state_dict().values()))
    w2.sizes = DataSizes(4, 3, 4, 1)
    assert w2.hyperparameters()["init_checkpoint_sha256sum"] == digest
    w3 = _workload(synthetic, "model.init_checkpoint=init.pt", f"model.init_checkpoint_sha256={'1' * 64}")
    with pytest.raises(ConfigError, match=f"model.init_checkpoint.*sha256 {digest}, expected {'1' * 64}"):
        w3.build_model()


def test_weight_average_is_the_references_swa() -> None:
    """common/swa.py: the first update copies the weights, each next one moves decay-weighted towards them
    (AveragedModel with the reference's averaging function); the evaluation sees the average, training
    continues on its own weights; the state round-trips."""
    from hpcbench.common.flat import FlatParams
    from hpcbench.common.swa import WeightAverage

    lin = torch.nn.Linear(3, 2)
    flat = FlatParams(lin)
    avg = WeightAverage(flat, 0.9)
    start = [p.detach().clone() for p in lin.parameters()]
    history = []
    for step in range(4):
        with torch.no_grad():
            for p in lin.parameters():
                p.add_(1.0 + step)
        avg.update()
        history.append([p.detach().clone() for p in lin.parameters()])
    expect = [h.clone() for h in history[0]]
    for h in history[1:]:
        expect = [e + (x - e) * (1 - 0.9) for e, x in zip(expect, h)]
    trained = [p.detach().clone() for p in lin.parameters()]
    with avg.applied():
        assert all(torch.allclose(p, e) for p, e in zip(lin.parameters(), expect))
    assert all(torch.equal(p, t) for p, t in zip(lin.parameters(), trained))
    assert not all(torch.equal(s, t) for s, t in zip(start, trained))
    other = WeightAverage(flat, 0.9)
    other.load_state_dict(avg.state_dict())
    assert torch.equal(other.average, avg.average) and int(other.count) == 4
    with pytest.raises(ConfigError, match="optim.swa_decay"):
        WeightAverage(flat, 1.0)


def test_flat_adam_clips_as_torch() -> None:
    """The flat Adam with optim.max_grad_norm equals torch.optim.Adam after clip_grad_norm_ (the reference's
    step), over steps whose gradient norms are above and below the limit."""
    from hpcbench.common.flat import FlatParams
    from hpcbench.common.optim import build_optimizer
    from hpcbench.common.runconfig import OptimConfig

    torch.manual_seed(0)
    a, b = torch.nn.Linear(4, 3).double(), torch.nn.Linear(4, 3).double()
    b.load_state_dict(a.state_dict())
    start = {k: v.clone() for k, v in a.state_dict().items()}
    cfg = OptimConfig(name="adam", lr=0.01, eps=1e-6, max_grad_norm=0.1)
    flat = FlatParams(a, dtype=torch.float64)
    ours = build_optimizer(flat, cfg)
    ref = torch.optim.Adam(b.parameters(), lr=0.01, eps=1e-6)
    inputs = [torch.randn(8, 4, dtype=torch.float64) * scale for scale in (10.0, 0.001, 5.0)]
    for x in inputs:
        flat.zero_grad()
        (a(x) ** 2).sum().backward()
        ours.step(torch.tensor(0.01, dtype=torch.float64))
        ref.zero_grad()
        (b(x) ** 2).sum().backward()
        torch.nn.utils.clip_grad_norm_(b.parameters(), 0.1)
        ref.step()
    unclipped = torch.nn.Linear(4, 3).double()
    unclipped.load_state_dict(start)
    plain = torch.optim.Adam(unclipped.parameters(), lr=0.01, eps=1e-6)
    for x in inputs:
        plain.zero_grad()
        (unclipped(x) ** 2).sum().backward()
        plain.step()
    for p, q, u in zip(a.parameters(), b.parameters(), unclipped.parameters()):
        # equal up to the float32 step counter of the bias correction; without the clip far apart
        assert torch.allclose(p, q, rtol=0, atol=1e-6), (p - q).abs().max()
        assert float((p - u).abs().max()) > 1e-4
    assert math.isclose(cfg.max_grad_norm, 0.1)


def test_datagen_cli_and_the_packed_layout(tmp_path: Path) -> None:
    """`hpcbench datagen openfold` writes the raw files and the processed layout; pack/stage see exactly the
    processed files (and an initial checkpoint beside them), every one replicated to every node."""
    from conftest import run_cli

    from hpcbench.common.data.layout import REPLICATED, scan

    out = tmp_path / "of"
    proc = run_cli(["datagen", "openfold", "--out", str(out), "--families", "2", "--members", "3",
                    "--min-length", "20", "--max-length", "24", "--msa-rows", "6", "--pinned-checkpoint",
                    "--pretrain-steps", "2"], timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "wrote 6 synthetic chains (4 training, 2 validation targets" in proc.stdout
    # not the pinned checkpoint's dataset: datagen says so and fine-tunes the pinned checkpoint on it
    assert "is not the one the pinned checkpoint" in proc.stdout and "fine-tuning it on this dataset" in proc.stdout
    assert "2 steps of 2 training samples fine-tuned from the pinned checkpoint" in proc.stdout
    assert "wrote the pretrained mini checkpoint" in proc.stdout
    files = scan(out, registry.layout("openfold"))
    assert list(files) == [REPLICATED]
    got = files[REPLICATED]
    assert "mini_pretrained_checkpoint.pt" in got and "pdb_mmcif/processed/chains.csv" in got
    assert "pdb_mmcif/processed/cameo_targets.txt" in got and "open_protein_set/processed/pdb_alignments/super.index" in got
    assert not [f for f in got if "/raw/" in f or "/original/" in f]  # the downloads are not the dataset
    bad = run_cli(["datagen", "openfold", "--out", str(tmp_path / "bad"), "--members", "1"], timeout=60)
    assert bad.returncode != 0 and "--val-members" in bad.stderr
    neg = run_cli(["datagen", "openfold", "--out", str(tmp_path / "neg"), "--families", "1", "--members", "2",
                   "--min-length", "20", "--max-length", "20", "--msa-rows", "3", "--pretrain-steps", "-1"], timeout=60)
    assert neg.returncode != 0 and "--pretrain-steps" in neg.stderr
    for until, steps in (("1.5", "2"), ("0.5", "0")):  # an lDDT-Ca is at most 1; a gate needs a step limit
        gate = run_cli(["datagen", "openfold", "--out", str(tmp_path / "gate"), "--families", "1", "--members", "2",
                        "--min-length", "20", "--max-length", "20", "--msa-rows", "3", "--pretrain-steps", steps,
                        "--pretrain-until", until], timeout=60)
        assert gate.returncode != 0 and "--pretrain-until" in gate.stderr


def test_dropout_off_is_every_rate_zero_and_open_only(synthetic: Path) -> None:
    w = _workload(synthetic, "model.dropout=false")
    mc = w.model_config()
    rates = (mc.evoformer.msa_dropout, mc.evoformer.pair_dropout, mc.extra_msa.msa_dropout,
             mc.extra_msa.pair_dropout, mc.template.dropout_rate, mc.structure.dropout_rate)
    assert rates == (0.0,) * 6
    on = _workload(synthetic, "model.dropout=true").model_config()
    assert (on.evoformer.msa_dropout, on.evoformer.pair_dropout, on.structure.dropout_rate) == (0.15, 0.25, 0.1)
    with pytest.raises(ConfigError, match="model.dropout"):
        registry.get("openfold").load_config("full", ["model.dropout=false"])


def test_the_checkpoints_adam_state_starts_the_flat_adam(synthetic: Path) -> None:
    """A resumable checkpoint (weights + torch Adam after two steps): the flat Adam starts from its moments and
    step, and its next step equals torch's next step from the same state (clipping included)."""
    from hpcbench.common.flat import FlatParams
    from hpcbench.common.optim import build_optimizer

    w = _workload(synthetic)
    spec = w.dataset()
    batch = spec.collate([w.source("train")[0]])
    torch.manual_seed(5)
    ref = w.build_model()
    ref.eval()  # no dropout: the same gradients twice
    opt = torch.optim.Adam(ref.parameters(), lr=1e-3, eps=1e-6)

    def grads(model: torch.nn.Module) -> None:
        model.zero_grad()
        w.loss(w.forward(model, batch), batch).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)

    for _ in range(2):
        grads(ref)
        opt.step()
    path = synthetic / "resumable.pt"
    torch.save({"iteration": 2, "alphafold_state_dict": ref.state_dict(), "optimizer_state_dict": opt.state_dict()},
               path)
    w2 = _workload(synthetic, "model.init_checkpoint=resumable.pt")
    model = w2.build_model()
    model.eval()
    flat = FlatParams(model)
    ours = build_optimizer(flat, w2.cfg.optim)
    ours.load_initial(w2.initial_optimizer_state(flat.names), "test")
    assert float(ours.step_count) == 2.0
    first = opt.state[next(iter(ref.parameters()))]["exp_avg"]
    assert torch.equal(ours.state["exp_avg"][: first.numel()], first.reshape(-1))
    flat.zero_grad()
    w2.loss(w2.forward(model, batch), batch).backward()
    ours.step(torch.tensor(1e-3))  # clips at optim.max_grad_norm = 0.1 itself
    grads(ref)
    opt.step()
    diff = max(float((p - q).abs().max()) for p, q in zip(model.parameters(), ref.parameters()))
    assert diff < 1e-6, diff
    off = _workload(synthetic, "model.init_checkpoint=resumable.pt", "model.init_optimizer_state=false")
    off.build_model()
    assert off.initial_optimizer_state(flat.names) is None


def test_a_harness_run_starts_from_the_checkpoint_and_logs_its_hash(synthetic: Path, tmp_path: Path) -> None:
    """The harness builds the run from the resumable checkpoint of the test above (weights, Adam moments and
    step), trains one epoch on the synthetic chains and logs the keys; the log passes the hpc 3.0.0 checker
    but for the target (open_openfold.yaml: eval_accuracy >= 0.8)."""
    import json

    from hpcbench.common.dist import init_distributed
    from hpcbench.common.mllog import MLPerfLogger
    from hpcbench.common.system import SystemDescription
    from hpcbench.common.trainer import Trainer

    path = synthetic / "resumable.pt"
    if not path.exists():
        pytest.skip("written by test_the_checkpoints_adam_state_starts_the_flat_adam")
    cls = registry.get("openfold")
    cfg = cls.load_config("mini", [*MINI, f"data.root={synthetic}", "model.init_checkpoint=resumable.pt",
                                   "train.max_epochs=1", "train.eval_every_samples=2"])
    env = init_distributed(device="cpu")
    try:
        log = tmp_path / "result_0.txt"
        tr = Trainer(cls(cfg), env, MLPerfLogger(log), SystemDescription(), progress=False)
        result = tr.run()
        tr.log.close()
    finally:
        env.close()
    # Adam continues the checkpoint's step count (its bias correction), the run's own steps after it
    assert tr.parts is not None and float(tr.parts.optimizer.step_count) == 2 + tr.parts.position.global_step == 8
    assert result.status == "aborted"
    lines = [json.loads(ln.split(":::MLLOG ", 1)[1]) for ln in log.read_text().splitlines() if ":::MLLOG" in ln]
    keys = {d["key"]: d["value"] for d in lines}
    assert keys["init_checkpoint_sha256sum"] == checkpoint.sha256_file(path)
    assert keys["swa_enabled"] is True and keys["val_every_iters"] == 2
    # the reference's key for the accumulation (train.py: GRADIENT_ACCUMULATION_STEPS), not DeepCAM's
    assert keys["gradient_accumulation_steps"] == 1 and "gradient_accumulation_frequency" not in keys
    # the schedule counts the run's steps from 0 (not the checkpoint's Adam step 2): the reference's warmup_lr_init
    assert keys["opt_learning_rate_warmup_init"] == 1e-5 and result.steps == 6
    evals = [d for d in lines if d["key"] == "eval_accuracy"]
    assert [d["metadata"]["epoch_num"] for d in evals] == [2, 4, 6]  # every 2 iterations, in samples
    from hpcbench.common.mllog import check_log

    ok, output = check_log(log, "3.0.0", "hpc")
    failed = [ln for ln in output.splitlines() if "Failed checks" in ln]
    assert not ok and failed == [ln for ln in failed if "eval_accuracy : v['value'] >= 0.8" in ln] and failed, output


def test_an_open_run_may_evaluate_per_epoch(synthetic: Path) -> None:
    w = _workload(synthetic, "train.eval_every_samples=0", "train.eval_every=2")
    w.sizes = DataSizes(train_samples=6, eval_samples=3, steps_per_epoch=6, local_batch_size=1)
    assert w.hyperparameters()["val_every_iters"] == 12
    with pytest.raises(ConfigError, match="train.eval_every_samples"):
        registry.get("openfold").load_config("full", ["train.eval_every_samples=0"])


@pytest.fixture(scope="module")
def run_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The data `hpcbench run --workload openfold` trains the mini on (embedded_datagen_args, seed 0) and the
    pinned checkpoint datagen writes beside them; with no pretraining to fall back on, a dataset that is not the
    pinned checkpoint's would fail here."""
    from hpcbench.commands.datagen import workload_parser

    root = tmp_path_factory.mktemp("openfold_run_data")
    cls = registry.get("openfold")
    ns = workload_parser("openfold").parse_args(["--out", str(root), "--seed", "0", *cls.embedded_datagen_args()])
    assert ns.pinned_checkpoint
    ns.pretrain_steps, ns.pretrain_until = 0, 0.0  # no pretraining to fall back on, no start gate
    cls.datagen(ns)
    return root


def test_the_pinned_checkpoint_fits_the_run_data_and_starts_below_the_target(run_data: Path) -> None:
    """The shipped mini checkpoint (openfold_mlperf/pinned) is written beside the run's data with its sha256; it
    loads into the mini model with Adam's state, and on freshly generated validation targets it scores what it
    scored when it was pinned: above the start gate, below the target (a run must still train to reach it)."""
    import hashlib

    from hpcbench.workloads.openfold_mlperf import pinned, pretrain
    from hpcbench.workloads.openfold_mlperf.datagen import MINI_START_GATE

    cls = registry.get("openfold")
    path = run_data / pretrain.MINI_CHECKPOINT
    assert hashlib.sha256(path.read_bytes()).hexdigest() == pinned.MINI.sha256
    w = cls(cls.load_config("mini", [f"data.root={run_data}"]))
    w.build_model()
    assert w.hyperparameters()["init_checkpoint_sha256sum"] == pinned.MINI.sha256
    names = [n for n, _ in w.build_model().named_parameters()]
    state = w.initial_optimizer_state(names)
    assert state is not None and state["step"] == pinned.MINI.steps
    score = pretrain.evaluate(cls, cls.load_config("mini"), run_data, path)
    assert score == pytest.approx(pinned.MINI.score, abs=5e-3)
    assert MINI_START_GATE <= score < w.target().threshold


def test_the_pinned_checkpoint_is_refused_for_other_data_and_when_damaged(run_data: Path, tmp_path: Path) -> None:
    """Other data (another seed) are refused by name without --pretrain-steps, and a checkpoint an earlier datagen
    left in the folder does not stay beside them; a damaged pinned file is refused by its sha256."""
    from dataclasses import replace

    from conftest import run_cli

    from hpcbench.workloads.openfold_mlperf import pinned

    other = tmp_path / "reused"
    first = run_cli(["datagen", "openfold", "--out", str(other), "--seed", "0", *pinned.MINI.datagen_args,
                     "--pinned-checkpoint"], timeout=120)
    assert first.returncode == 0 and (other / "mini_pretrained_checkpoint.pt").exists(), first.stderr
    args = ["datagen", "openfold", "--out", str(other), "--seed", "1", *pinned.MINI.datagen_args, "--pinned-checkpoint"]
    proc = run_cli(args, timeout=120)
    assert proc.returncode != 0 and "--pretrain-steps" in proc.stderr and "--seed 0" in proc.stderr, proc.stderr
    assert not (other / "mini_pretrained_checkpoint.pt").exists()  # the seed-0 checkpoint is not left beside seed 1
    assert "not the one the pinned checkpoint" in (pinned.MINI.mismatch(other) or "")
    cfg = run_cli(["datagen", "openfold", "--out", str(tmp_path / "cfg"), *pinned.MINI.datagen_args,
                   "--pinned-checkpoint", "--pretrain-config", "full"], timeout=60)
    assert cfg.returncode != 0 and "--pretrain-config 'full'" in cfg.stderr, cfg.stderr
    # a damaged install: refused by its sha256, nothing written
    bad = tmp_path / "damaged.pt"
    data = bytearray(pinned.MINI.file.read_bytes())
    data[len(data) // 2] ^= 1
    bad.write_bytes(bytes(data))
    with pytest.raises(DataError, match="damaged.pt: sha256 .* expected the pinned"):
        replace(pinned.MINI, file=bad).install(tmp_path / "out" / "ckpt.pt")
    assert not (tmp_path / "out" / "ckpt.pt").exists() and not list((tmp_path / "out").glob("*"))
    with pytest.raises(DataError, match="chains.csv: missing"):
        pinned.dataset_fingerprint(tmp_path / "empty")


def test_hpcbench_run_with_another_seed_fine_tunes_the_pinned_checkpoint_through_the_gate(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """`hpcbench run --workload openfold --seed 1` (datagen with embedded_datagen_args): the data are not the pinned
    checkpoint's, so datagen fine-tunes the pinned checkpoint on them under the start gate, at most
    MINI_PRETRAIN_STEPS steps (the pretraining itself is recorded here, not run)."""
    from hpcbench.commands.datagen import workload_parser
    from hpcbench.workloads.openfold_mlperf import pinned
    from hpcbench.workloads.openfold_mlperf.datagen import MINI_PRETRAIN_STEPS, MINI_START_GATE

    cls = registry.get("openfold")
    calls: list[tuple] = []
    monkeypatch.setattr(cls, "_pretrain", classmethod(lambda c, *a: calls.append(a)))
    ns = workload_parser("openfold").parse_args(["--out", str(tmp_path), "--seed", "1", *cls.embedded_datagen_args()])
    assert (ns.pretrain_steps, ns.pretrain_until, ns.pinned_checkpoint) == (MINI_PRETRAIN_STEPS, MINI_START_GATE, True)
    cls.datagen(ns)
    assert calls == [(tmp_path, "mini", MINI_PRETRAIN_STEPS, 1, MINI_START_GATE, pinned.MINI.file)]
    assert "fine-tuning it on this dataset" in capsys.readouterr().out


def test_pretraining_from_a_start_checkpoint_begins_at_its_weights(synthetic: Path, tmp_path: Path) -> None:
    from hpcbench.workloads.openfold_mlperf import pretrain

    cls = registry.get("openfold")
    cfg = cls.load_config("mini", [*MINI, f"data.root={synthetic}"])
    torch.manual_seed(3)
    model = pretrain._workload(cls, cfg, synthetic).build_model()
    path = tmp_path / "start_checkpoint.pt"
    torch.save({"alphafold_state_dict": model.state_dict()}, path)
    torch.manual_seed(4)  # another random initialisation: the start checkpoint's weights replace it
    wl = pretrain._workload(cls, cfg, synthetic, path)
    assert cfg.model.init_checkpoint == "" and cfg.model.init_optimizer_state  # the caller's config is unchanged
    assert wl.cfg.model.init_checkpoint == str(path) and not wl.cfg.model.init_optimizer_state
    started = wl.build_model()
    fresh = pretrain._workload(cls, cfg, synthetic).build_model()
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), started.state_dict().values()))
    assert not all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), fresh.state_dict().values()))


def test_fine_tuning_the_pinned_checkpoint_in_two_processes_starts_from_its_weights(run_data: Path,
                                                                                      tmp_path: Path) -> None:
    """One step of 2 samples from the pinned weights (two spawned processes, as datagen runs it) still scores near
    the pinned checkpoint's 0.783 on the run data's validation targets; from random weights it would score ~0.1."""
    from hpcbench.workloads.openfold_mlperf import pinned, pretrain

    cls = registry.get("openfold")
    res = pretrain.pretrain(cls, cls.load_config("mini"), run_data, 1, 1, tmp_path / "tuned_checkpoint.pt",
                            processes=2, start=pinned.MINI.file)
    assert res.steps == 1 and res.processes == 2
    assert pretrain.evaluate(cls, cls.load_config("mini"), run_data, res.path) == pytest.approx(pinned.MINI.score,
                                                                                                 abs=0.05)


def test_trivial_predictors_stay_below_the_mini_target_on_the_run_data(run_data: Path) -> None:
    """On the data `hpcbench run` trains the mini on (embedded_datagen_args), an ideal helix and an extended chain
    of each validation target's length stay far below the mini's 0.8."""
    from hpcbench.workloads.openfold_mlperf.model.losses import lddt_ca

    cls = registry.get("openfold")
    w = cls(cls.load_config("mini", [f"data.root={run_data}", "model.init_checkpoint="]))
    rows = w.source("validation").chains.rows
    assert len(rows) == 4 and all(24 <= r.sequence_length <= 40 for r in rows)
    dicts = store.Dicts(run_data / "pdb_mmcif/processed/dicts")
    scores: dict[str, list[float]] = {"helix": [], "extended": [], "rule": []}
    for r in rows:
        atoms = dicts.load(r.pdb_id).atoms["A"]
        true, mask = torch.from_numpy(atoms.positions)[None], torch.from_numpy(atoms.mask.astype(np.float32))[None]
        for name, seq in (("helix", "A" * r.sequence_length), ("extended", "V" * r.sequence_length),
                          ("rule", r.sequence)):
            pred = torch.from_numpy(synth.structure(seq)[0])[None]
            scores[name].append(float(lddt_ca(pred, true, mask, eps=1e-8, per_residue=False)))
    means = {k: float(np.mean(v)) for k, v in scores.items()}
    target = w.target().threshold
    assert means["rule"] > 0.99  # the targets are their sequences' rule
    print(means)
    assert 0.3 < means["helix"] < target - 0.15 and 0.3 < means["extended"] < target - 0.15, means


@pytest.fixture
def one_thread():  # noqa: ANN201
    """One torch thread, as datagen pretrains (two spinning threads on a shared 2-core box are 20x slower)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_a_failing_pretraining_process_ends_the_others_with_its_error(tmp_path: Path) -> None:
    """Both spawned processes fail to open the training chains: the call raises with the data error
    (naming the folder) instead of leaving a rank waiting in the all-reduce, and no checkpoint is left."""
    from hpcbench.workloads.openfold_mlperf import pretrain

    cls = registry.get("openfold")
    missing = tmp_path / "no_data"
    t0 = time.monotonic()
    with pytest.raises(DistributedError, match=r"pretraining: a process failed: .*no_data"):
        pretrain.pretrain(cls, cls.load_config("mini", [*MINI, f"data.root={missing}"]), missing, 2, 0,
                          tmp_path / "x_checkpoint.pt", processes=2)
    assert time.monotonic() - t0 < 120 and not (tmp_path / "x_checkpoint.pt").exists()


def test_pretraining_warms_up_to_a_multiple_of_the_preset_rate(synthetic: Path, tmp_path: Path, one_thread: None,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Step k's rate is PRETRAIN_LR_FACTOR x optim.lr x min(1, (k + 1) / PRETRAIN_WARMUP_STEPS), and the
    optimizer steps with it."""
    from hpcbench.workloads.openfold_mlperf import pretrain

    base, warm, factor = 3e-3, pretrain.PRETRAIN_WARMUP_STEPS, pretrain.PRETRAIN_LR_FACTOR
    assert warm > 1 and factor > 1
    assert pretrain.pretrain_lr(base, 0) == pytest.approx(base * factor / warm)
    assert pretrain.pretrain_lr(base, warm // 2 - 1) == pytest.approx(base * factor * (warm // 2) / warm)
    assert pretrain.pretrain_lr(base, warm - 1) == pretrain.pretrain_lr(base, 10 * warm) == pytest.approx(base * factor)
    seen: list[float] = []
    step = torch.optim.Adam.step

    def spy(self, *a, **k):  # noqa: ANN001, ANN002, ANN003, ANN202
        seen.append(self.param_groups[0]["lr"])
        return step(self, *a, **k)

    monkeypatch.setattr(torch.optim.Adam, "step", spy)
    cls = registry.get("openfold")
    cfg = cls.load_config("mini", [*MINI, f"data.root={synthetic}", f"optim.lr={base}"])
    pretrain.pretrain(cls, cfg, synthetic, 3, 5, tmp_path / "w_checkpoint.pt", processes=1)
    assert seen == pytest.approx([pretrain.pretrain_lr(base, k) for k in range(3)])


def test_pretraining_writes_a_resumable_checkpoint_of_its_weights_average_and_adam_state(
        synthetic: Path, tmp_path: Path, one_thread: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The checkpoint is the reference's resumable layout: ``alphafold_state_dict`` holds the weights'
    exponential moving average over the steps (the first step's weights copied, then avg + (w - avg) x
    (1 - PRETRAIN_AVERAGE_DECAY)), not the last weights, and ``optimizer_state_dict`` Adam's step and moments,
    which a run's workload hands to the harness's Adam."""
    from hpcbench.common.flat import FlatParams
    from hpcbench.workloads.openfold_mlperf import pretrain

    after: list[torch.Tensor] = []  # the flat weights after each optimizer step
    step = torch.optim.Adam.step

    def spy(self, *a, **k):  # noqa: ANN001, ANN002, ANN003, ANN202
        out = step(self, *a, **k)
        after.append(self.param_groups[0]["params"][0].detach().clone())
        return out

    monkeypatch.setattr(torch.optim.Adam, "step", spy)
    cls = registry.get("openfold")
    cfg = cls.load_config("mini", [*MINI, f"data.root={synthetic}"])
    result = pretrain.pretrain(cls, cfg, synthetic, 4, 5, tmp_path / "avg_checkpoint.pt", processes=1)
    assert len(after) == 4 and not torch.equal(after[-1], after[-2])
    d = pretrain.PRETRAIN_AVERAGE_DECAY
    assert 0.9 <= d < 1
    average = after[0].clone()
    for w in after[1:]:
        average = average + (w - average) * (1 - d)
    model = pretrain._workload(cls, cls.load_config("mini", [*MINI, f"data.root={synthetic}"]), synthetic).build_model()
    flat = FlatParams(model)
    with torch.no_grad():
        flat.params.copy_(average)
    want = model.state_dict()
    saved = torch.load(result.path, weights_only=True)
    assert saved["iteration"] == 4
    got = saved["alphafold_state_dict"]
    assert got.keys() == want.keys()
    for k in want:
        assert torch.allclose(got[k], want[k], rtol=1e-5, atol=1e-7), k
    with torch.no_grad():
        flat.params.copy_(after[-1])
    last = model.state_dict()
    assert any(not torch.allclose(got[k], last[k]) for k in last)  # not the last weights
    # Adam's state in torch's layout (one group over model.parameters()), as the reference's resumable
    # checkpoint holds it: the moments of the flat optimizer, per parameter, and its step
    opt_state = saved["optimizer_state_dict"]
    names = [n for n, _ in model.named_parameters()]
    assert opt_state["param_groups"][0]["params"] == list(range(len(names)))
    for i, (name, p) in enumerate(model.named_parameters()):
        st = opt_state["state"][i]
        assert float(st["step"]) == 4.0
        assert st["exp_avg"].shape == p.shape and st["exp_avg_sq"].shape == p.shape, name
        assert bool((st["exp_avg_sq"] >= 0).all())
    assert any(float(st["exp_avg"].abs().sum()) > 0 for st in opt_state["state"].values())
    # a run loads it: the workload hands the moments and the step to the harness's Adam
    w = _workload(synthetic, f"model.init_checkpoint={result.path}")
    w.build_model()
    init = w.initial_optimizer_state(names)
    assert init is not None and init["step"] == 4.0 and len(init["exp_avg"]) == len(names)
    assert all(torch.equal(a, opt_state["state"][i]["exp_avg"]) for i, a in enumerate(init["exp_avg"]))


def test_pretraining_is_reproducible_and_its_checkpoint_starts_a_run(synthetic: Path, tmp_path: Path,
                                                                     one_thread: None) -> None:
    """The mini's initial checkpoint is our code's output: the same seed writes the same bytes, another seed
    other weights; a workload loads it and logs its sha256; the validation targets are only scored."""
    from hpcbench.workloads.openfold_mlperf import pretrain

    cls = registry.get("openfold")

    def cfg():  # noqa: ANN202
        return cls.load_config("mini", [*MINI, f"data.root={synthetic}"])

    a = pretrain.pretrain(cls, cfg(), synthetic, 3, 5, tmp_path / "a_checkpoint.pt", processes=1)
    b = pretrain.pretrain(cls, cfg(), synthetic, 3, 5, tmp_path / "b_checkpoint.pt", processes=1)
    c = pretrain.pretrain(cls, cfg(), synthetic, 3, 6, tmp_path / "c_checkpoint.pt", processes=1)
    assert a.steps == 3 and a.batch == pretrain.PRETRAIN_BATCH == 2 and a.processes == 1 and math.isfinite(a.final_loss)
    assert a.sha256 == b.sha256 == checkpoint.sha256_file(a.path) and c.sha256 != a.sha256
    # two processes (gloo all-reduce of the gradients) train on the same samples: the same mean loss and
    # weights up to the order of the float sums
    losses: dict[int, list[float]] = {1: [], 2: []}
    two = pretrain.pretrain(cls, cfg(), synthetic, 3, 5, tmp_path / "two_checkpoint.pt",
                            lambda step, loss, _: losses[2].append(loss), processes=2)
    pretrain.pretrain(cls, cfg(), synthetic, 3, 5, tmp_path / "one_checkpoint.pt",
                      lambda step, loss, _: losses[1].append(loss), processes=1)
    assert two.processes == 2 and len(losses[2]) == 3 and losses[2] == pytest.approx(losses[1], rel=1e-4)
    one_w = torch.load(tmp_path / "one_checkpoint.pt", weights_only=True)["alphafold_state_dict"]
    two_w = torch.load(two.path, weights_only=True)["alphafold_state_dict"]
    assert one_w.keys() == two_w.keys()
    assert all(torch.allclose(one_w[k], two_w[k], rtol=1e-3, atol=1e-5) for k in one_w)
    score = pretrain.evaluate(cls, cfg(), synthetic, a.path)
    assert 0.0 <= score <= 1.0
    w = _workload(synthetic, f"model.init_checkpoint={a.path}")
    w.build_model()
    assert w.hyperparameters()["init_checkpoint_sha256sum"] == a.sha256
    with pytest.raises(ConfigError, match="optim.schedule"):
        pretrain.pretrain(cls, cls.load_config("mini", [*MINI, "optim.schedule=cosine"]), synthetic, 1, 0, tmp_path / "x.pt")


def test_pretraining_stops_at_its_start_gate_and_fails_clearly_below_it(synthetic: Path, tmp_path: Path,
                                                                        one_thread: None) -> None:
    """With a start gate the pretraining scores the weights' average (what the checkpoint holds) on the validation
    targets at the gate's steps and stops at the first that passes, in every process; the checkpoint written
    scores what the check saw. Below the gate at the step limit it raises, naming the score and the gate, and
    writes nothing."""
    from hpcbench.workloads.openfold_mlperf import pretrain

    with pytest.raises(ConfigError, match="start gate"):
        pretrain.StartGate(0.0)
    gate = pretrain.StartGate(0.5, first=3, every=2)
    assert [s for s in range(1, 9) if gate.checks(s)] == [3, 5, 7]
    cls = registry.get("openfold")

    def cfg():  # noqa: ANN202
        return cls.load_config("mini", [*MINI, f"data.root={synthetic}"])

    checks: list[tuple[int, float | None]] = []
    low = pretrain.StartGate(1e-9, first=2, every=1)  # any weights pass it: the first check stops the training
    out = tmp_path / "gated_checkpoint.pt"
    res = pretrain.pretrain(cls, cfg(), synthetic, 6, 5, out, lambda step, loss, c: checks.append((step, c)),
                            processes=2, gate=low)
    assert res.steps == 2 and [s for s, _ in checks] == [1, 2] and checks[0][1] is None
    assert res.score is not None and res.score == checks[1][1]
    assert torch.load(out, weights_only=True)["iteration"] == 2
    assert pretrain.evaluate(cls, cfg(), synthetic, out) == pytest.approx(res.score, abs=1e-5)
    checks.clear()
    never = tmp_path / "never_checkpoint.pt"
    losses: dict[str, list[float]] = {"gated": [], "plain": []}

    def record(step: int, loss: float, c: float | None) -> None:
        checks.append((step, c))
        losses["gated"].append(loss)

    with pytest.raises(pretrain.GateNotReached, match=r"after 3 steps .* below the start gate 1.0") as err:
        pretrain.pretrain(cls, cfg(), synthetic, 3, 5, never, record, processes=1,
                          gate=pretrain.StartGate(1.0, first=2, every=1))
    assert str(never) in str(err.value) and not never.exists()
    assert [s for s, c in checks if c is not None] == [2, 3]
    # the check after step 2 draws nothing the training draws: step 3 is the ungated pretraining's step 3
    pretrain.pretrain(cls, cfg(), synthetic, 3, 5, tmp_path / "plain_checkpoint.pt",
                      lambda step, loss, c: losses["plain"].append(loss), processes=1)
    assert losses["gated"] == losses["plain"]


def test_a_closed_run_evaluates_every_40_steps_and_nowhere_else() -> None:
    """docs/closed.md, evaluation cadence: the reference evaluates when ``iteration % val_every_iters == 0`` (40) and
    nowhere else; the record's ``closed_cadence_only`` drops the harness's extra evaluation at the end of the run."""
    from hpcbench.common.cadence import cadence_of
    from tests.test_harness_cadence import _points

    cls = registry.get("openfold")
    cfg = cls.load_config("full")
    assert cls.record.closed_cadence_only and cfg.train.division == "closed"
    cfg.train.max_epochs = 2
    steps = [(e - 1) * 50 + s for e, s in _points(cadence_of(cls.record, cfg.train, 50), 2)]
    assert steps == [40, 80]  # not the run's last step, 100
    cfg.train.division = "open"  # the open division keeps "a run ends with a metric"
    assert [(e - 1) * 50 + s for e, s in _points(cadence_of(cls.record, cfg.train, 50), 2)] == [40, 80, 100]
