"""The CLI skeleton: help, version, clear errors, lazy imports."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hpcbench.cli import COMMANDS, main
from tests.conftest import project_env, run_cli


def test_version_and_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert "hpcbench 0.1.0" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for name in COMMANDS:
        assert name in out


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_subcommand_has_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main([command, "--help"])
    assert exc.value.code == 0
    assert "usage: hpcbench " + command in capsys.readouterr().out


def test_unknown_workload_lists_valid_ones(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "nosuch"]) == 2
    err = capsys.readouterr().err
    assert "unknown workload 'nosuch'" in err and "cosmoflow, deepcam, oc20" in err


def test_importing_cli_is_light() -> None:
    code = ("import sys, hpcbench.cli as c; c.build_parser(); "
            "heavy=[m for m in ('torch','torch_geometric','nvidia.dali','h5py','lmdb','mpi4py') if m in sys.modules]; "
            "print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], env=project_env(), capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_harness_imports_no_dtensor_until_a_model_is_sharded() -> None:
    """Every training process imports the harness; torch's DTensor (and with it sympy) costs ~0.6 s of CPU a
    process, and only a sharded model needs it (common/sharded.py imports it on first use)."""
    code = ("import sys, hpcbench.common.trainer, hpcbench.common.build; "
            "print([m for m in ('torch.distributed.tensor', 'sympy') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], env=project_env(), capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_dev_py_runs_the_tests_in_two_workers_unless_told_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util
    import os

    from tests.conftest import ROOT

    spec = importlib.util.spec_from_file_location("hpcbench_dev_py", ROOT / "dev.py")
    dev = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dev)
    monkeypatch.setattr(dev, "VENV", Path(sys.prefix))  # the environment running these tests has pytest-xdist
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    assert dev.test_workers(["-q", "-ra"]) == ["-n", "2", "--dist", "loadfile"]
    for own in (["-n", "0"], ["-n4"], ["--numprocesses=3"], ["--dist", "load"], ["-p", "no:xdist"]):
        assert dev.test_workers(["-q", *own]) == [], own
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    assert dev.test_workers([]) == []  # one core: one process
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(dev, "VENV", ROOT / "no-such-venv")
    assert dev.test_workers([]) == []  # no pytest-xdist installed: one process


def test_no_command_prints_help_and_fails() -> None:
    proc = run_cli([])
    assert proc.returncode == 2
    assert "COMMAND" in proc.stdout
