"""A run stopped after its first epoch and resumed from its checkpoint equals the uninterrupted run: the
parameters (every rank's shard: shared weights, model-parallel and sparse-gradient tables, optimizer state)
and the logged losses and metrics, bit for bit. Under ``mpiexec -n 2`` for the three kinds of state the
checkpoint manager holds: DLRM-DCNv2 with tables sharded over the ranks and sparse gradients (row-wise
Adagrad state per rank), the 3D U-Net with a spatial group of two (every rank a slab of each volume),
and CosmoFlow with DistributedLAMB (each rank the moments of its shard). Also: the manifest, and a
damaged or foreign checkpoint refused by name."""
from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch

from tests.conftest import project_env, run_cli, run_mpi

pytestmark = pytest.mark.mpi

CASES = {
    "dlrm_dcnv2": (["--days", "3", "--rows-per-day", "4096", "--cardinalities", "200,100,50,20"],
                   ["model.sparse_grads=true", "model.shard_min_rows=100", "train.target=0.999"]),
    "unet3d": (["--cases", "8", "--eval-cases", "2", "--min-shape", "32,32,32", "--max-shape", "40,40,40"],
               ["model.spatial_group=2", "data.threads=1", "train.eval_every=1"]),
    "cosmoflow": (["--samples", "64", "--val-samples", "16", "--size", "16", "--plain"],
                  ["optim.name=lamb", "optim.distributed=true", "optim.lr=0.002", "optim.weight_decay=0.01",
                   "train.global_batch_size=16", "train.target=0.0001", "train.eval_every=1"]),
}


def _values(log: Path, key: str) -> list[object]:
    return [json.loads(ln.split(":::MLLOG ", 1)[1])["value"] for ln in log.read_text().splitlines()
            if f'"key": "{key}"' in ln]


def _train(workload: str, data: Path, results: Path, sets: list[str]) -> Path:
    args = ["-m", "hpcbench", "train", workload, "--config", "mini", "--data", str(data), "--results", str(results),
            "--no-progress", "--device", "cpu", "--system-name", "box"]
    for kv in sets:
        args += ["--set", kv]
    proc = run_mpi(2, args, timeout=400, env=project_env(HPCBENCH_TORCH_THREADS="1"), check=False)
    assert proc.returncode in (0, 4), proc.stdout + proc.stderr  # 4: target not reached in the epochs asked
    return next(results.rglob("result_0.txt"))


def _load(path: Path) -> dict:
    return torch.load(io.BytesIO(path.read_bytes()), map_location="cpu", weights_only=False)


def _assert_same(a: object, b: object, where: str) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and sorted(a) == sorted(b), where
        for k in a:
            _assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where  # type: ignore[arg-type]
        for i, (x, y) in enumerate(zip(a, b)):  # type: ignore[call-overload]
            _assert_same(x, y, f"{where}[{i}]")


@pytest.mark.parametrize("workload", list(CASES))
def test_stopped_and_resumed_run_equals_the_uninterrupted_one(workload: str, tmp_path: Path) -> None:
    gen, sets = CASES[workload]
    data = tmp_path / "data"
    proc = run_cli(["datagen", workload, "--out", str(data), "--workers", "1", "--quiet", *gen])
    assert proc.returncode == 0, proc.stderr
    ck = ["train.checkpoint_every=1"]
    first = _train(workload, data, tmp_path / "first",
                   [*sets, *ck, "train.max_epochs=1", f"train.checkpoint_dir={tmp_path / 'ck'}"])
    resumed = _train(workload, data, tmp_path / "resumed",
                     [*sets, *ck, "train.max_epochs=2", f"train.checkpoint_dir={tmp_path / 'ck'}", "train.resume=true"])
    # the uninterrupted run takes the settings the interrupted one chose: "auto" is measured per run, and on a
    # loaded box it once picked the other memory layout (channels-last 1.31x there, 0.93x in the first run),
    # whose flat buffers hold the same weights in another order (equal losses, other checkpoint bytes)
    chosen = [f"train.{key}={str(_values(first, f'hpcbench_{key}')[0]['value']).lower()}"  # type: ignore[index]
              for key in ("precision", "channels_last")]
    full = _train(workload, data, tmp_path / "full",
                  [*sets, *ck, *chosen, "train.max_epochs=2", f"train.checkpoint_dir={tmp_path / 'ck_full'}"])
    # the settings chosen at start ("auto": a timing probe for the memory layout on a CPU) are the checkpoint's:
    # a busier box once made the resumed run probe the other layout, and its epoch 2 was not the full run's
    recorded = json.loads(next((tmp_path / "ck").rglob("epoch_0001/manifest.json")).read_text())["settings"]
    for key in ("precision", "channels_last"):
        was, now = (_values(log, f"hpcbench_{key}")[0] for log in (first, resumed))
        assert now["value"] == was["value"] == recorded[f"train.{key}"], key  # type: ignore[index]
        if now["requested"] == "auto":  # type: ignore[index]
            assert now["reason"] == "as the checkpoint it resumes from", now
    # the logged losses and metrics of epoch 2 are the uninterrupted run's
    losses_full = [v["train_loss"] for v in _values(full, "tracked_stats")]  # type: ignore[index]
    losses_resumed = [v["train_loss"] for v in _values(resumed, "tracked_stats")]  # type: ignore[index]
    assert len(losses_full) == 2 and losses_resumed == losses_full[1:]
    metric = "eval_error" if workload == "cosmoflow" else "eval_accuracy"
    assert len(_values(full, metric)) == 2 and _values(resumed, metric) == _values(full, metric)[1:]
    # the checkpoints after epoch 2, file by file: shared weights, and every rank's own state
    a, b = tmp_path / "ck_full" / "instance_0" / "epoch_0002", tmp_path / "ck" / "instance_0" / "epoch_0002"
    manifest = json.loads((a / "manifest.json").read_text())
    assert manifest["ranks"] == 2 and sorted(manifest["files"]) == ["rank_0.pt", "rank_1.pt", "replicated.pt"]
    for name in manifest["files"]:
        _assert_same(_load(a / name), _load(b / name), f"{workload}:{name}")
    ranks = [_load(a / f"rank_{r}.pt") for r in range(2)]
    if workload == "dlrm_dcnv2":  # the large tables live on one rank each, outside the flat buffer
        held = [set(r["rank_weights"]["outside"]) for r in ranks]
        assert held[0] and held[1] and not held[0] & held[1]
        assert all(r["optimizer"]["sparse"]["sums"] for r in ranks)
    if workload == "cosmoflow":  # DistributedLAMB: each rank holds the moments of its half
        sizes = [sum(v.numel() for k, v in r["optimizer"].items() if k not in ("step",)) for r in ranks]
        weights = _load(a / "replicated.pt")["weights"]["params"].numel()
        assert 0 < sizes[0] < 2 * weights and sizes[0] + sizes[1] >= 2 * weights


def test_a_damaged_checkpoint_file_is_refused_by_name(tmp_path: Path) -> None:
    gen, sets = CASES["cosmoflow"]
    data = tmp_path / "data"
    assert run_cli(["datagen", "cosmoflow", "--out", str(data), "--workers", "1", "--quiet", *gen]).returncode == 0
    ck = tmp_path / "ck"
    _train("cosmoflow", data, tmp_path / "a", [*sets, "train.max_epochs=1", "train.checkpoint_every=1",
                                               f"train.checkpoint_dir={ck}"])
    victim = ck / "instance_0" / "epoch_0001" / "rank_1.pt"
    raw = bytearray(victim.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    victim.write_bytes(bytes(raw))
    args = ["-m", "hpcbench", "train", "cosmoflow", "--config", "mini", "--data", str(data), "--results",
            str(tmp_path / "b"), "--no-progress", "--device", "cpu", "--system-name", "box"]
    for kv in [*sets, "train.max_epochs=2", f"train.checkpoint_dir={ck}", "train.resume=true"]:
        args += ["--set", kv]
    proc = run_mpi(2, args, timeout=300, check=False)
    assert proc.returncode != 0
    assert "rank_1.pt is damaged" in proc.stderr and "sha256" in proc.stderr, proc.stderr
    # a run that does not resume is refused before it trains: its epochs would mix with the earlier run's (was: it
    # published epoch_0001 over the old one and pruned it by name, leaving 'latest' pointing at nothing)
    fresh = [a for a in args if a != "train.resume=true"]
    fresh[fresh.index("--set", len(fresh) - 2):] = []  # drop the trailing "--set train.resume=true" pair
    proc = run_mpi(2, fresh, timeout=300, check=False)
    assert proc.returncode != 0 and "train.checkpoint_dir: " in proc.stderr, proc.stdout + proc.stderr
    assert "already holds checkpoints (epoch_0001) of an earlier run; set train.resume=true" in proc.stderr
    assert (ck / "instance_0" / "epoch_0001" / "manifest.json").is_file()  # nothing of the earlier run lost
    # a manifest of the wrong shape is named with the field, not a traceback
    manifest = ck / "instance_0" / "epoch_0001" / "manifest.json"
    for text, said in (("[]", "holds a JSON list, expected an object"),
                       ('{"format": 3, "epoch": 1, "ranks": 2, "replicated": [], "per_rank": []}',
                        "field 'files' is None, expected a JSON object")):
        manifest.write_text(text)
        proc = run_mpi(2, args, timeout=300, check=False)
        assert proc.returncode != 0 and f"checkpoint manifest {manifest}" in proc.stderr and said in proc.stderr, \
            proc.stderr
        assert "Traceback" not in proc.stderr


def test_checkpoint_settings_that_would_do_nothing_are_refused() -> None:
    from hpcbench import registry
    from hpcbench.common.errors import ConfigError

    cls = registry.get("cosmoflow")
    with pytest.raises(ConfigError, match=r"'train.checkpoint_every': must be >= 0 epochs"):
        cls.load_config("mini", ["train.checkpoint_every=-1", "train.checkpoint_dir=/tmp/x"])
    for key in ("train.checkpoint_every=1", "train.resume=true"):
        with pytest.raises(ConfigError, match=rf"'{key.split('=')[0]}' needs 'train.checkpoint_dir'"):
            cls.load_config("mini", [key])


def test_an_unwritable_checkpoint_dir_is_refused_before_the_first_epoch(tmp_path: Path) -> None:
    """A checkpoint_dir that is a file (or a read-only mount) was found only when the first epoch's checkpoint was
    written; now at the start, naming the folder, before any training."""
    gen, sets = CASES["cosmoflow"]
    data = tmp_path / "data"
    assert run_cli(["datagen", "cosmoflow", "--out", str(data), "--workers", "1", "--quiet", *gen]).returncode == 0
    blocker = tmp_path / "ck"
    blocker.write_text("a file where the checkpoint folder should be")
    args = ["train", "cosmoflow", "--config", "mini", "--data", str(data), "--results", str(tmp_path / "r"),
            "--no-progress", "--device", "cpu"]
    for kv in [*sets, "train.max_epochs=1", "train.checkpoint_every=1", f"train.checkpoint_dir={blocker}"]:
        args += ["--set", kv]
    proc = run_cli(args, timeout=300)
    assert proc.returncode != 0
    assert f"train.checkpoint_dir: cannot write checkpoints to {blocker}/instance_0: Not a directory" in proc.stderr, \
        proc.stderr
    assert "epoch_start" not in (next((tmp_path / "r").rglob("result_0.txt"))).read_text()  # no epoch trained
