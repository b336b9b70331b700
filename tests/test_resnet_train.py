"""ResNet on the harness (training suite): the mini preset reaches its top-1 target under mpiexec with
2 ranks and its log passes the official training 4.0.0 checker; the full preset's logged keys cover
closed_resnet.yaml and the closed_resnet_lars.yaml it enqueues, with every CHECK true; the class
count of the data must match the model's."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml
from mlperf_logging.compliance_checker import mlp_compliance

from hpcbench.common.data.dali import dali_available
from hpcbench.common.errors import ConfigError
from hpcbench.common.mllog import check_log
from hpcbench.common.workload import DataShard, DataSizes
from conftest import damage_jpeg_entropy_data, first_events, log_values, run_cli, run_mpi
from hpcbench import registry
from hpcbench.workloads.mlperf_training.resnet.model import ModelConfig
from hpcbench.workloads.mlperf_training.resnet.workload import ResNetWorkload

TRAIN = ["-m", "hpcbench", "train", "resnet", "--config", "mini", "--system-name", "box", "--no-progress",
         "--device", "cpu"]
RULES = Path(mlp_compliance.__file__).parent / "training_4.0.0"


@pytest.fixture(scope="module")
def mini_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("resnet_mini")
    proc = run_cli(["datagen", "resnet", "--out", str(out), "--workers", "2", "--quiet",
                    *ResNetWorkload.embedded_datagen_args()])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


def test_mini_reaches_target_on_two_ranks_and_passes_the_training_checker(mini_data: Path, tmp_path: Path) -> None:
    proc = run_mpi(2, [*TRAIN, "--data", str(mini_data), "--results", str(tmp_path)], timeout=400)
    log = tmp_path / "results" / "box" / "resnet" / "result_0.txt"
    assert "instance 0: success" in proc.stdout, proc.stdout + proc.stderr
    ev = first_events(log)
    assert ev["submission_benchmark"] == "resnet" and ev["submission_division"] == "open"
    assert ev["train_samples"] == 3000 and ev["eval_samples"] == 500 and ev["global_batch_size"] == 64
    assert ev["opt_name"] == "lars" and ev["lars_opt_learning_rate_decay_poly_power"] == 2.0
    assert ev["lars_opt_learning_rate_warmup_epochs"] == 1 and ev["lars_epsilon"] == 0.0
    steps = 3000 // 64
    assert ev["lars_opt_learning_rate_decay_steps"] == (10 - 1) * steps
    accs = log_values(log, "eval_accuracy")
    assert max(accs) >= 0.9 > 0.1 + 0.5  # the target; a trivial predictor scores 1/10
    ok, out = check_log(log, "4.0.0", "training")
    assert ok, out


def test_full_preset_logs_the_closed_keys_and_passes_their_checks() -> None:
    e = registry.entry("resnet")
    assert (e.suite, e.ruleset, e.required_runs, e.benchmark) == ("training", "4.0.0", 5, "resnet")
    full = ResNetWorkload.load_config("full")
    assert (full.train.division, full.train.target, full.train.global_batch_size, full.train.channels_last) == \
        ("closed", 0.759, 3264, True)
    assert (full.data.image_size, full.data.eval_resize, full.model.num_classes) == (224, 256, 1000)
    wl = ResNetWorkload(full)
    assert wl.model_config().param_count() == ModelConfig().param_count() == 25_557_032
    wl.sizes = DataSizes(train_samples=1_281_167, eval_samples=50_000, steps_per_epoch=1_281_167 // 3264)
    hp = wl.hyperparameters()
    logged = {**hp, "global_batch_size": 3264}
    records = [r["KEY"] for r in yaml.safe_load((RULES / "closed_resnet.yaml").read_text())]
    post = next(k["POST"] for k in records if k["NAME"] == "opt_name")
    assert "closed_resnet_{}.yaml" in post
    records += [r["KEY"] for r in yaml.safe_load((RULES / f"closed_resnet_{hp['opt_name']}.yaml").read_text())]
    for key in records:
        if key["NAME"] == "eval_accuracy":
            continue  # logged by the harness at each evaluation
        assert key["NAME"] in logged, key["NAME"]
        check = key.get("CHECK")
        if isinstance(check, str):
            env = {"math": math, "is_integer": mlp_compliance.is_integer}
            assert eval(check.strip(), env, {"v": {"value": logged[key["NAME"]]}}), (key["NAME"], check)
    assert hp["lars_opt_learning_rate_decay_steps"] == (37 - 2) * 392 and hp["lars_opt_learning_rate_warmup_epochs"] == 2


def test_class_folders_must_match_the_model(mini_data: Path) -> None:
    import torch

    cfg = ResNetWorkload.load_config("mini", [f"data.root={mini_data}", "model.num_classes=12"])
    with pytest.raises(ConfigError, match=r"model.num_classes' = 12.*holds 10 class folders"):
        ResNetWorkload(cfg).train_loader(DataShard(0, 1, 1, 8, torch.device("cpu")))


@pytest.mark.skipif(not dali_available(), reason="NVIDIA DALI is not installed")
def test_dali_loader_with_channels_last_auto_trains_through_the_cli(mini_data: Path, tmp_path: Path) -> None:
    """Issue 26: ``train.loader = dali`` with ``train.channels_last = auto`` (the mini preset's) once ended in
    a traceback before run_start (the layout probe read a DALI-encoded sample as model input). Through
    ``hpcbench train`` on the CPU: the probe measures both layouts on a decoded batch, the epoch trains on
    DALI's pipeline to the mini target and the log passes the checker."""
    cfg = ResNetWorkload.load_config("mini", ["train.loader=dali"])
    assert cfg.train.channels_last == "auto" and cfg.train.loader == "dali"
    proc = run_cli(["train", "resnet", "--config", "mini", "--system-name", "box", "--progress", "lines",
                    "--device", "cpu", "--data", str(mini_data), "--results", str(tmp_path),
                    "--set", "train.loader=dali"], timeout=300)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "train.channels_last = " in proc.stdout and "(auto: measured here: channels-last step" in proc.stdout
    assert "instance 0: success" in proc.stdout
    log = tmp_path / "results" / "box" / "resnet" / "result_0.txt"
    assert max(log_values(log, "eval_accuracy")) >= cfg.train.target
    ok, out = check_log(log, "4.0.0", "training")
    assert ok, out


@pytest.mark.parametrize("loader", ["torch", "dali"])
def test_a_jpeg_with_damaged_huffman_data_stops_hpcbench_train_by_name(mini_data: Path, tmp_path: Path,
                                                                        loader: str) -> None:
    """Issue 26 hold-out: a training JPEG whose entropy-coded bytes are damaged with its markers intact
    (libjpeg warns "Corrupt JPEG data", Pillow and DALI decode a partly grey image and trained on it)
    ends ``hpcbench train`` with an error naming the file, no traceback, under both loaders."""
    import shutil

    if loader == "dali" and not dali_available():
        pytest.skip("NVIDIA DALI is not installed")
    data = tmp_path / "data"
    shutil.copytree(mini_data, data)
    victim = sorted((data / "train").rglob("*.JPEG"))[7]
    damage_jpeg_entropy_data(victim)
    proc = run_cli(["train", "resnet", "--config", "mini", "--system-name", "box", "--progress", "lines",
                    "--device", "cpu", "--data", str(data), "--results", str(tmp_path / "out"),
                    "--set", f"train.loader={loader}", "--set", "data.cache=none"], timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Traceback" not in out, out[-3000:]
    assert f"{victim.name}: the JPEG data does not decode cleanly (libjpeg-turbo: Corrupt JPEG data" in out, out[-3000:]
