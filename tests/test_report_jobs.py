"""`hpcbench jobs render`: every template x system renders a script that bash accepts."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from hpcbench.common.errors import ConfigError
from hpcbench.jobs import JOBS_DIR, JobSpec, render
from conftest import run_cli

SYSTEMS = sorted(p.stem for p in (JOBS_DIR / "systems").glob("*.toml"))
LAYOUTS = [("strong", "one-srun", 1, 8), ("weak", "one-srun", 128, 4), ("weak", "srun-per-instance", 16, 2)]


def _bash_n(script: str, tmp_path: Path) -> None:
    path = tmp_path / "job.sh"
    path.write_text(script)
    proc = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr + script


@pytest.mark.parametrize("system", SYSTEMS)
@pytest.mark.parametrize("mode,launch,instances,npi", LAYOUTS)
def test_rendered_scripts_pass_bash_n(system: str, mode: str, launch: str, instances: int, npi: int,
                                      tmp_path: Path) -> None:
    script = render(JobSpec(system=system, workload="cosmoflow", mode=mode, launch=launch, instances=instances,
                            nodes_per_instance=npi))
    _bash_n(script, tmp_path)
    assert "{{" not in script and "hpcbench train cosmoflow" in script and "hpcbench report" in script
    assert "cache drop" in script


def test_weak_gpu_script_layout(tmp_path: Path) -> None:
    proc = run_cli(["jobs", "render", "--system", "gpu-cluster", "--workload", "cosmoflow", "--mode", "weak",
                    "--instances", "128", "--nodes-per-instance", "4"], timeout=60)
    assert proc.returncode == 0, proc.stderr
    s = proc.stdout
    assert "#SBATCH --nodes=512" in s and "#SBATCH --ntasks-per-node=4" in s
    assert "--instances 128" in s and "--stage-from /lustre/datasets/mlperf-hpc/cosmoflow-packed" in s
    assert sum(line.startswith("srun ") for line in s.splitlines()) == 2  # cache drop + one launch
    _bash_n(s, tmp_path)


def test_per_instance_launch_gives_each_step_its_seed_and_slot() -> None:
    s = render(JobSpec(system="gpu-cluster", workload="deepcam", launch="srun-per-instance", instances=8,
                       nodes_per_instance=2, seed=5))
    assert "--instance-offset \"$k\"" in s and "train.seed=$(( 5 + k ))" in s and "--system-nodes 16" in s
    assert "--nodes=2 --ntasks-per-node=4" in s and "wait \"${pids[$k]}\"" in s


def test_local_system_emulates_nodes() -> None:
    s = render(JobSpec(system="local", workload="cosmoflow", instances=2, nodes_per_instance=2))
    assert "#SBATCH --nodes=1" in s and "#SBATCH --ntasks=4" in s and "--ranks-per-node 1" in s


def test_errors_name_what_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="known systems: .*local"):
        render(JobSpec(system="nosuch", workload="cosmoflow"))
    with pytest.raises(ConfigError, match="--mode strong runs one instance"):
        render(JobSpec(system="local", workload="cosmoflow", mode="strong", instances=4))
    bad = tmp_path / "bad.toml"
    bad.write_text('[slurm]\ntime = "1:00:00"\n')
    with pytest.raises(ConfigError, match="missing key 'slurm.srun_flags'"):
        render(JobSpec(system=str(bad), workload="cosmoflow"))
    proc = run_cli(["jobs", "render", "--system", "nosuch", "--workload", "cosmoflow"], timeout=60)
    assert proc.returncode == 2 and "nosuch.toml not found" in proc.stderr
