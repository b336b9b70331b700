"""docs/adding-a-workload.md, proven: a workload defined only inside one test package (``tests/tiny_workload``:
its record, file format and synthetic data, model, config and preset) writes its data with ``hpcbench
datagen``, trains to its target under ``mpiexec -n 2``, checkpoints and resumes to the same result, and its
log passes the official compliance checker; no file outside that package names it."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcbench.common.mllog import check_log
from tests.conftest import ROOT, project_env, run_cli, run_mpi

NAME = "tests.tiny_workload.workload:TinyWorkload"
PACKAGE = ROOT / "tests" / "tiny_workload"


def _train(data: Path, results: Path, *sets: str) -> tuple[Path, str]:
    args = ["-m", "hpcbench", "train", NAME, "--config", "mini", "--data", str(data), "--results", str(results),
            "--no-progress", "--device", "cpu", "--system-name", "box"]
    for kv in sets:
        args += ["--set", kv]
    proc = run_mpi(2, args, timeout=300, env=project_env(HPCBENCH_TORCH_THREADS="1"), check=False)
    assert proc.returncode in (0, 4), proc.stdout + proc.stderr
    return next(results.rglob("result_0.txt")), proc.stdout


def _metrics(log: Path) -> list[float]:
    return [json.loads(ln.split(":::MLLOG ", 1)[1])["value"] for ln in log.read_text().splitlines()
            if '"key": "eval_error"' in ln]


@pytest.mark.mpi
def test_a_workload_in_one_package_trains_checkpoints_resumes_and_passes_the_checker(tmp_path: Path) -> None:
    data = tmp_path / "data"
    proc = run_cli(["datagen", NAME, "--out", str(data), "--workers", "1", "--quiet"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert len(list((data / "train").glob("*.npy"))) == 512 and len(list((data / "validation").glob("*.npy"))) == 128

    full, out = _train(data, tmp_path / "full")
    assert "instance 0: success" in out, out
    ok, checker = check_log(full)
    assert ok, checker
    assert min(_metrics(full)) <= 0.07 < _metrics(full)[0]  # the preset's target, not met at once

    ck = tmp_path / "ck"
    _, out = _train(data, tmp_path / "first", "train.max_epochs=2", f"train.checkpoint_dir={ck}",
                    "train.checkpoint_every=1")
    assert "aborted" in out
    assert json.loads((ck / "instance_0" / "epoch_0002" / "manifest.json").read_text())["ranks"] == 2
    resumed, out = _train(data, tmp_path / "resumed", f"train.checkpoint_dir={ck}", "train.checkpoint_every=1",
                          "train.resume=true")
    assert "instance 0: success" in out, out
    assert _metrics(resumed) == _metrics(full)[2:]  # the evaluations after the stop, bit for bit
    ok, checker = check_log(resumed)
    assert ok, checker


def test_nothing_outside_the_package_names_it() -> None:
    here = Path(__file__).resolve()
    named = [p.relative_to(ROOT) for d in ("hpcbench", "common", "staging", "cosmoflow", "deepcam", "opencatalyst",
                                           "mlperf_training", "tests", "benchmarks", "docs")
             for p in (ROOT / d).rglob("*") if p.is_file() and p.suffix in (".py", ".toml", ".md")
             and PACKAGE not in p.parents and p != here and "tiny_workload" in p.read_text(errors="replace")]
    assert named == [Path("docs/adding-a-workload.md")] or named == [], named


def test_an_out_of_tree_name_that_does_not_import_is_a_clear_error() -> None:
    """``hpcbench train package.module:Class`` with a missing module or class: a ConfigError naming it (was: a
    ModuleNotFoundError traceback)."""
    from hpcbench import registry
    from hpcbench.common.errors import ConfigError

    with pytest.raises(ConfigError, match=r"workload 'nosuch.mod:Cls': cannot import module 'nosuch.mod' "
                                          r"\(No module named 'nosuch'\)"):
        registry.get("nosuch.mod:Cls")
    with pytest.raises(ConfigError, match=r"workload 'tests.harness_toy:Nope': module 'tests.harness_toy' has no 'Nope'"):
        registry.get("tests.harness_toy:Nope")
