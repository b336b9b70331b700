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


def _train_line(script: str) -> str:
    return next(line for line in script.splitlines() if "-m hpcbench train" in line)


def test_config_defaults_to_full_on_a_cluster_and_mini_on_the_local_box() -> None:
    """A site that emulates nodes on one host (local) trains the mini preset by default; a real cluster
    (emulate_nodes = false) the full one; an explicit --config always wins."""
    cluster = render(JobSpec(system="gpu-cluster", workload="cosmoflow", instances=128, nodes_per_instance=4))
    assert "--config full" in _train_line(cluster) and "--config mini" not in cluster
    local = render(JobSpec(system="local", workload="cosmoflow", instances=2))
    assert "--config mini" in _train_line(local)
    mine = render(JobSpec(system="gpu-cluster", workload="cosmoflow", instances=2, config="mini"))
    assert "--config mini" in _train_line(mine)
    proc = run_cli(["jobs", "render", "--system", "gpu-cluster", "--workload", "cosmoflow", "--mode", "weak",
                    "--instances", "128", "--nodes-per-instance", "4"], timeout=60)
    assert proc.returncode == 0 and "--config full" in _train_line(proc.stdout), proc.stderr


def test_a_workload_without_the_default_preset_is_told_to_pass_config() -> None:
    with pytest.raises(ConfigError, match="no 'full' preset .*emulate_nodes = false.*pass --config"):
        render(JobSpec(system="gpu-cluster", workload="tests.harness_toy:ToyWorkload"))
    s = render(JobSpec(system="gpu-cluster", workload="tests.harness_toy:ToyWorkload", config="mini"))
    assert "--config mini" in _train_line(s)


def test_workload_help_lists_every_registered_workload() -> None:
    from hpcbench import registry

    proc = run_cli(["jobs", "render", "--help"], timeout=60)
    assert proc.returncode == 0
    help_text = " ".join(proc.stdout.split())
    for name in registry.names():
        assert name in help_text, (name, proc.stdout)
    assert "training" in help_text and "default: full" in help_text


@pytest.mark.parametrize("workload", ["dlrm_dcnv2", "bert", "unet3d", "resnet"])
@pytest.mark.parametrize("mode,launch,instances,npi", LAYOUTS)
def test_training_suite_workloads_render_with_the_training_results_layout(
        workload: str, mode: str, launch: str, instances: int, npi: int, tmp_path: Path) -> None:
    from hpcbench import registry

    bench = registry.entry(workload).benchmark
    s = render(JobSpec(system="gpu-cluster", workload=workload, mode=mode, launch=launch, instances=instances,
                       nodes_per_instance=npi))
    _bash_n(s, tmp_path)
    assert f"hpcbench train {workload}" in s and "--config full" in s
    # no mode folder: results/<system>/<benchmark>/result_<n>.txt, and no --mode (train refuses it there)
    assert f"# Logs (training suite): $RESULTS/results/gpu-cluster/{bench}/result_<n>.txt" in s
    assert "--mode" not in s.split("#SBATCH --job-name")[1]
    if mode == "weak":
        assert 'RESULTS="results/runs-${SLURM_JOB_ID}"' in s


def test_hpc_workloads_name_their_mode_folder() -> None:
    weak = render(JobSpec(system="gpu-cluster", workload="deepcam", launch="srun-per-instance", instances=8))
    assert "# Logs (hpc suite): $RESULTS/results/gpu-cluster/weak/deepcam/result_<n>.txt" in weak
    assert "--instances 1 --mode weak --instance-offset" in weak
    strong = render(JobSpec(system="gpu-cluster", workload="oc20", mode="strong", nodes_per_instance=8))
    assert "# Logs (hpc suite): $RESULTS/results/gpu-cluster/strong/oc20/result_<n>.txt" in strong


def test_the_job_tells_training_whether_the_cache_was_dropped(tmp_path: Path) -> None:
    """HPCBENCH_CACHE_CLEARED follows the drop step's exit status (the step is run here with a stand-in
    srun that runs its command: `true` and `false` as the site's cache_drop)."""
    for drop, expected in (("true", "1"), ("false", "0")):
        site = tmp_path / f"site-{drop}.toml"
        text = (JOBS_DIR / "systems" / "local.toml").read_text()
        site.write_text(text.replace(text[text.index("cache_drop ="):].splitlines()[0], f'cache_drop = "{drop}"'))
        script = render(JobSpec(system=str(site), workload="cosmoflow"))
        lines = script.splitlines()
        start = next(i for i, ln in enumerate(lines) if ln.startswith("export HPCBENCH_CACHE_CLEARED"))
        drop_step = "\n".join(lines[start:start + 3])
        fake = tmp_path / "bin"
        fake.mkdir(exist_ok=True)
        (fake / "srun").write_text('#!/bin/bash\nwhile [[ "$1" == -* ]]; do shift; done\nexec "$@"\n')
        (fake / "srun").chmod(0o755)
        proc = subprocess.run(["bash", "-c", f"set -euo pipefail\n{drop_step}\necho CLEARED=$HPCBENCH_CACHE_CLEARED"],
                              capture_output=True, text=True, env={"PATH": f"{fake}:/usr/bin:/bin"})
        assert proc.returncode == 0 and f"CLEARED={expected}" in proc.stdout, proc.stdout + proc.stderr + drop_step
        assert ("logged as cache_clear false" in proc.stderr) == (drop == "false")


def _strong(**kw) -> str:  # noqa: ANN003
    return render(JobSpec(system=SYSTEMS[0], workload="cosmoflow", mode="strong", nodes_per_instance=2, **kw))


def test_strong_job_gives_each_submission_its_own_seed(tmp_path: Path) -> None:
    from hpcbench.jobs import JOB_SEED

    s = _strong()
    _bash_n(s, tmp_path)
    (line,) = [ln for ln in s.splitlines() if "hpcbench train" in ln]
    assert f'--set "train.seed={JOB_SEED}"' in line
    seeds = []
    for job in ("101", "102"):  # what the shell makes of the seed in two submissions
        proc = subprocess.run(["bash", "-uc", f'echo "{JOB_SEED}"'], capture_output=True, text=True,
                              env={"SLURM_JOB_ID": job, "PATH": "/usr/bin:/bin"})
        seeds.append(proc.stdout.strip())
    assert seeds == ["101", "102"]


def test_weak_jobs_take_their_seeds_from_the_submission(tmp_path: Path) -> None:
    """The rules want seeds from the clock or system randomness: without --seed a weak job's base seed is the
    Slurm job id (instance k adds k), in both launch styles, so two submissions never repeat one set of seeds."""
    from hpcbench.jobs import JOB_SEED

    one = render(JobSpec(system="gpu-cluster", workload="deepcam", instances=8, nodes_per_instance=2))
    (line,) = [ln for ln in one.splitlines() if "hpcbench train" in ln]
    assert f'--set "train.seed={JOB_SEED}"' in line and "train.seed=1 " not in one
    per = render(JobSpec(system="gpu-cluster", workload="deepcam", launch="srun-per-instance", instances=8,
                         nodes_per_instance=2))
    assert f"train.seed=$(( {JOB_SEED} + k ))" in per
    for s in (one, per):
        _bash_n(s, tmp_path)
    mine = render(JobSpec(system="gpu-cluster", workload="deepcam", launch="srun-per-instance", instances=8,
                          nodes_per_instance=2, overrides=["train.seed=70"]))
    assert "train.seed=$(( 70 + k ))" in mine and JOB_SEED not in mine  # the user's seed is the base
    seeds = [subprocess.run(["bash", "-uc", f"k=3; echo $(( {JOB_SEED} + k ))"], capture_output=True, text=True,
                            env={"SLURM_JOB_ID": job, "PATH": "/usr/bin:/bin"}).stdout.strip() for job in ("101", "102")]
    assert seeds == ["104", "105"]


def test_strong_job_explicit_seed_wins() -> None:
    from hpcbench.jobs import JOB_SEED

    s = _strong(overrides=["train.seed=9"])
    assert JOB_SEED not in s and "--set train.seed=9" in s
    s = _strong(seed=5)
    assert JOB_SEED not in s and "--set train.seed=5" in s
