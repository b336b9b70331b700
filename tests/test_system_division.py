"""The run's division, node count and accelerators in systems/<name>.json; hpcbench's own log lines do not
trip the official RCP (convergence) checker; a system's results hold one division."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from mlperf_logging.rcp_checker import rcp_checker

from hpcbench.common.mllog import hide_from_rcp
from hpcbench.common.system import SystemDescription
from hpcbench.runner import RunnerOptions, system_for_run
from conftest import run_cli

TOY = ["train", "tests.harness_toy:ToyWorkload", "--config", "tests/harness_configs/mini.toml", "--no-progress",
       "--device", "cpu"]
CLOSED = ["--set", "train.division=closed", "--set", "train.target=0.124"]  # the closed cosmoflow target


def test_closed_run_system_file_and_rcp_check(tmp_path: Path) -> None:
    proc = run_cli([*TOY, *CLOSED, "--results", str(tmp_path), "--system-name", "box"], timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    desc = json.loads((tmp_path / "systems" / "box.json").read_text())
    assert desc["division"] == "closed"
    assert desc["number_of_nodes"] == "1" and desc["accelerators_per_node"] == "0"  # one host, a CPU run
    folder = tmp_path / "results" / "box" / "strong" / "cosmoflow"
    log = folder / "result_0.txt"
    text = log.read_text()
    assert '"key": "hpcbench_target"' in text
    # the log says the ruleset it is written for, and the report takes it from there
    assert '"key": "hpcbench_ruleset", "value": {"value": "hpc 3.0.0"}' in text
    rep = run_cli(["report", str(tmp_path), "--no-official", "--no-plots", "--out", str(tmp_path.parent / "rep")])
    assert rep.returncode == 0, rep.stdout + rep.stderr
    assert "named by the logs (hpcbench_ruleset)" in " ".join(rep.stdout.split()), rep.stdout
    # what the package checker runs on a closed folder: it reads every line by substring and must not crash
    not_converged, epochs, bs, benchmark = rcp_checker.read_submission_file(str(log), "3.0.0", False)
    assert (bs, benchmark) == (16, "cosmoflow") and not_converged == 0 and epochs > 0
    ok, msg, _ = rcp_checker.check_directory(str(folder), "hpc", "3.0.0", verbose=False, bert_train_samples=False,
                                             rcp_pass="pruned_rcps", rcp_bypass=False, set_scaling=True)
    assert isinstance(msg, str)  # a toy may fail convergence; it got through the check
    # an open run into the same system's results is refused, naming the closed log
    proc = run_cli([*TOY, "--results", str(tmp_path), "--system-name", "box"], timeout=240)
    assert proc.returncode != 0 and str(log) in proc.stderr and "open division" in proc.stderr
    assert json.loads((tmp_path / "systems" / "box.json").read_text())["division"] == "closed"


def test_own_lines_decode_unchanged() -> None:
    line = ('{"key": "hpcbench_target", "value": {"value": "eval_error <= 0.124", '
            '"reason": "global_batch_size and train_samples"}}')
    hidden = hide_from_rcp(line)
    assert json.loads(hidden) == json.loads(line)
    assert not any(k in hidden for k in ("eval_error", "global_batch_size", "train_samples"))


def _env(device: str, num_nodes: int, local_size: int) -> SimpleNamespace:
    return SimpleNamespace(device=SimpleNamespace(type=device),
                           layout=SimpleNamespace(num_nodes=num_nodes, local_size=local_size))


def test_system_for_run_counts_nodes_and_gpus(monkeypatch) -> None:  # noqa: ANN001
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    opts = RunnerOptions(results=Path("."), system=SystemDescription(system_name="x"), division="closed")
    sysd = system_for_run(_env("cuda", 4, 4), opts)  # 16 ranks, 4 per node, 8 GPUs a node
    assert (sysd.division, sysd.number_of_nodes, sysd.accelerators_per_node) == ("closed", 4, 4)
    sysd = system_for_run(_env("cpu", 2, 3), opts)
    assert (sysd.number_of_nodes, sysd.accelerators_per_node) == (2, 0)
    opts.system.accelerators_per_node, opts.system_nodes = 2, 64  # a system file's count and --system-nodes win
    sysd = system_for_run(_env("cuda", 4, 4), opts)
    assert (sysd.number_of_nodes, sysd.accelerators_per_node) == (64, 2)
