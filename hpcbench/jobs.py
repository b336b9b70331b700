"""Render Slurm batch scripts from ``jobs/templates/*.sbatch.in`` and ``jobs/systems/<name>.toml`` (in an
installed wheel: ``hpcbench/jobs/...``, see :data:`JOBS_DIR`).

Templates use ``{{name}}`` placeholders; every placeholder must be known (a typo is an error, not an
empty string). Values that reach the shell are quoted with :func:`shlex.quote`.
"""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcbench.common.errors import ConfigError
from hpcbench.site import JOBS_DIR, dest_rule, packed_source, read_system, system_path


TEMPLATES = {"strong": "strong.sbatch.in", "weak": "weak.sbatch.in", "weak-per-instance": "weak_per_instance.sbatch.in"}
PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")


@dataclass
class JobSpec:
    system: str  # name in jobs/systems/ or a path to a .toml file
    workload: str
    mode: str = "weak"  # strong | weak
    launch: str = "one-srun"  # weak: one-srun | srun-per-instance
    instances: int = 1
    nodes_per_instance: int = 1
    config: str | None = None  # None: the site's default (see :func:`default_config`)
    results: str | None = None
    data: str | None = None  # an already staged / shared dataset (--data)
    stage_from: str | None = None  # packed dataset to stage inside the job (default: the system file's)
    stage_to: str | None = None  # node-local staging folder (default: <the system file's paths.stage_dir>/<dataset>)
    no_stage: bool = False
    time: str | None = None
    # weak: the base seed (instance k: seed+k); strong: every run's. Default: the Slurm job id (or
    # $HPCBENCH_SEED at submission), so that every submission and every run has its own (the rules: seeds
    # from the clock or system randomness, never one fixed value for every submission)
    seed: int | None = None
    overrides: list[str] = field(default_factory=list)
    device: str | None = None  # --device for train (default: the system file's node.device, else auto)
    command: str = ""  # the command line that rendered the script (for the header)


def load_system(name: str, jobs_dir: Path = JOBS_DIR) -> dict[str, Any]:
    """The system settings for rendering a job: :func:`read_system` with every key a job needs."""
    path, data = read_system(name, jobs_dir)
    for section, keys in {"slurm": ("time", "srun_flags"), "node": ("tasks_per_node", "emulate_nodes"),
                          "paths": ("results", "stage_dir"), "env": ("python", "setup", "cache_drop")}.items():
        for key in keys:
            if key not in data.get(section, {}):
                raise ConfigError(f"system settings {path}: missing key '{section}.{key}'")
    data.setdefault("name", path.stem)
    return data


def _benchmark(workload: str) -> str:
    from hpcbench import registry

    if ":" not in workload:
        return registry.entry(workload).benchmark
    return str(getattr(registry.get(workload), "benchmark", workload))


def default_config(sysd: dict[str, Any]) -> str:
    """The preset a job trains when ``--config`` is not given: ``mini`` on a site that emulates nodes on one
    host (``[node] emulate_nodes = true``, e.g. ``local``), else ``full`` (a real cluster: a 512-node job is
    meant to train the benchmark, not the smoke-test preset)."""
    return "mini" if bool(sysd["node"]["emulate_nodes"]) else "full"


def _presets_dir(workload: str) -> Path:
    from hpcbench import registry

    if ":" in workload:
        return registry.get(workload).presets_dir()
    import importlib.resources

    # the workload's package (light: registry imported it for its record), not its model code
    return Path(str(importlib.resources.files(registry.WORKLOADS[registry.entry(workload).name]))) / "configs"


def _config(spec: JobSpec, sysd: dict[str, Any]) -> str:
    """``--config`` as given, else :func:`default_config`, which must be one of the workload's presets."""
    if spec.config:
        return spec.config
    name = default_config(sysd)
    if not (_presets_dir(spec.workload) / f"{name}.toml").is_file():
        raise ConfigError(f"workload {spec.workload} has no '{name}' preset (the default on system "
                          f"{sysd['name']}, emulate_nodes = {str(bool(sysd['node']['emulate_nodes'])).lower()}); "
                          "pass --config PRESET|FILE")
    return name


def _suite(workload: str) -> str:
    from hpcbench import registry

    if ":" not in workload:
        return registry.entry(workload).suite
    return str(getattr(registry.get(workload), "suite", "hpc"))


def _dataset(workload: str) -> str:
    from hpcbench import registry

    return registry.entry(workload).name


def _dq(text: str) -> str:
    """Double-quoted for bash, with $VARIABLES still expanding (e.g. ${SLURM_JOB_ID})."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("`", "\\`") + '"'


def _values(spec: JobSpec, sysd: dict[str, Any]) -> dict[str, str]:
    if spec.mode not in ("strong", "weak"):
        raise ConfigError(f"--mode must be strong or weak, got {spec.mode!r}")
    if spec.instances < 1 or spec.nodes_per_instance < 1:
        raise ConfigError("--instances and --nodes-per-instance must be >= 1")
    if spec.mode == "strong" and spec.instances != 1:
        raise ConfigError("--mode strong runs one instance; use --nodes-per-instance for its size")
    slurm, node, paths, env = sysd["slurm"], sysd["node"], sysd["paths"], sysd["env"]
    tpn, emulate = int(node["tasks_per_node"]), bool(node["emulate_nodes"])
    nodes = spec.instances * spec.nodes_per_instance
    tasks, per_instance = nodes * tpn, spec.nodes_per_instance * tpn
    lines = []
    if emulate:  # one real host; each block of tpn ranks is one emulated node
        lines += ["#SBATCH --nodes=1", f"#SBATCH --ntasks={tasks}"]
        all_step, per_node, inst_step = f"--ntasks={tasks}", "--ntasks=1", f"--ntasks={per_instance}"
    else:
        lines += [f"#SBATCH --nodes={nodes}", f"#SBATCH --ntasks-per-node={tpn}"]
        all_step = f"--nodes={nodes} --ntasks-per-node={tpn}"
        per_node = f"--nodes={nodes} --ntasks-per-node=1"
        inst_step = f"--nodes={spec.nodes_per_instance} --ntasks-per-node={tpn}"
    lines.append(f"#SBATCH --cpus-per-task={int(node.get('cpus_per_task', 1))}")
    lines.append(f"#SBATCH --time={spec.time or slurm['time']}")
    for key in ("partition", "account"):
        if slurm.get(key):
            lines.append(f"#SBATCH --{key}={slurm[key]}")
    lines.append("#SBATCH --output=hpcbench-%x-%j.out")
    lines += list(slurm.get("extra", []))
    bench, suite = _benchmark(spec.workload), _suite(spec.workload)
    train = ["--config", _config(spec, sysd), "--system-name", str(sysd["name"]), "--no-progress"]
    if emulate:
        train += ["--ranks-per-node", str(tpn)]
    device = spec.device or node.get("device")
    if device is not None:
        if device not in ("auto", "cpu", "cuda"):
            raise ConfigError(f"device must be auto, cpu or cuda (system settings key 'node.device' or --device), "
                              f"got {device!r}")
        train += ["--device", str(device)]
    gpus = int(node.get("gpus_per_node", 0) or 0)
    # a node's ranks all belong to one instance; on a node with GPUs, auto means CUDA
    if device != "cpu" and gpus and tpn > gpus and not emulate:
        raise ConfigError(f"system settings: node.tasks_per_node = {tpn} ranks per node but node.gpus_per_node = "
                          f"{gpus} GPUs; NCCL needs one GPU per rank: use tasks_per_node <= {gpus}, "
                          "or --device cpu")
    dataset = spec.workload if ":" in spec.workload else _dataset(spec.workload)
    packed = spec.stage_from or packed_source(sysd, dataset)
    if spec.data:
        train += ["--data", spec.data]
    elif packed and not spec.no_stage:  # the same rule as `hpcbench stage --dataset D` with this site
        train += ["--stage-from", packed, "--stage-to", spec.stage_to or dest_rule(paths["stage_dir"], dataset)]
    for o in spec.overrides:
        train += ["--set", o]
    # srun-per-instance: instance k trains with $(( base + k )); a --set train.seed=S of the user's is the base
    user_seed = _user_seed(spec)
    if user_seed is not None and not user_seed.isdigit():
        raise ConfigError(f"--set train.seed={user_seed}: expected a non-negative integer")
    base_seed = user_seed if user_seed is not None else (JOB_SEED if spec.seed is None else str(spec.seed))
    # a weak job owns its folder (hpc: the instances are one weak-scaling result; training: K runs of one job)
    per_job = "weak" if suite == "hpc" else "runs"
    results = spec.results or (paths["results"] if spec.mode == "strong" else f"{paths['results']}/{per_job}-${{SLURM_JOB_ID}}")
    from hpcbench import registry
    from hpcbench import results_layout as rl

    # the folder the logs land in: hpc results/<system>/<strong|weak>/<benchmark>; training (no mode folder,
    # every instance is one more run) results/<system>/<benchmark>
    weak = spec.mode == "weak" and (spec.instances > 1 or spec.launch == "srun-per-instance")
    layout_mode = "" if suite == "training" else ("weak" if weak else "strong")
    logs = rl.benchmark_dir(Path("$RESULTS"), str(sysd["name"]), layout_mode, bench)

    return {
        "workload": shlex.quote(spec.workload), "benchmark": bench, "system": str(sysd["name"]),
        "nodes": str(nodes), "instances": str(spec.instances), "nodes_per_instance": str(spec.nodes_per_instance),
        "tasks": str(tasks), "tasks_per_instance": str(per_instance), "seed": base_seed,
        "seed_arg": seed_arg(spec),
        "required_runs": str(registry.required_runs(bench)), "command": spec.command or "hpcbench jobs render",
        "sbatch_lines": "\n".join(lines), "setup": "\n".join(env["setup"]), "workdir": '"${SLURM_SUBMIT_DIR:-$PWD}"',
        "results": _dq(results), "srun_flags": slurm["srun_flags"], "per_node_step": per_node,
        "all_tasks_step": all_step, "instance_step": inst_step, "cache_drop": shlex.quote(env["cache_drop"]),
        "python": env["python"], "train_args": shlex.join(train), "suite": suite,
        "logs": f"{logs}/result_<n>.txt",
        # srun per instance: an hpc job names its mode (several launches of one weak-scaling job); a
        # training-suite result folder has no mode (`hpcbench train` refuses --mode there)
        "mode_arg": "--mode weak " if suite == "hpc" else "",
    }


#: a rendered job's seed: the Slurm job id, so that each of the runs the rules ask for (one strong submission
#: each) and each weak submission trains with its own seeds (a weak job's instance k adds k);
#: $HPCBENCH_SEED at submission overrides it
JOB_SEED = "${HPCBENCH_SEED:-${SLURM_JOB_ID:-$RANDOM}}"


def _user_seed(spec: JobSpec) -> str | None:
    """The value of the user's last ``--set train.seed=...`` (spaces removed), None without one."""
    given = [o.replace(" ", "").split("=", 1)[1] for o in spec.overrides if o.replace(" ", "").startswith("train.seed=")]
    return given[-1] if given else None


def seed_arg(spec: JobSpec) -> str:
    """The job's ``--set train.seed=...`` (ahead of the user's ``--set``s), or "" where the user sets the seed
    with ``--set train.seed=...``, and for a weak job launched per instance (its template gives instance k
    ``$(( seed + k ))``). ``--seed`` fixes it (every submission then repeats it)."""
    per_instance = spec.mode == "weak" and spec.launch == "srun-per-instance"
    if per_instance or _user_seed(spec) is not None:
        return ""
    if spec.seed is not None:
        return f"--set train.seed={spec.seed} "
    return f'--set "train.seed={JOB_SEED}" '


def render(spec: JobSpec, jobs_dir: Path = JOBS_DIR) -> str:
    sysd = load_system(spec.system, jobs_dir)
    if spec.mode == "weak" and spec.launch not in ("one-srun", "srun-per-instance"):
        raise ConfigError(f"--launch must be one-srun or srun-per-instance, got {spec.launch!r}")
    key = "strong" if spec.mode == "strong" else ("weak" if spec.launch == "one-srun" else "weak-per-instance")
    template = (jobs_dir / "templates" / TEMPLATES[key]).read_text()
    values = _values(spec, sysd)
    # the job's $HPCBENCH_SYSTEM: the very file it was rendered from (the job runs in another folder)
    values["site"] = shlex.quote(str(system_path(spec.system, jobs_dir).resolve()))
    unknown = sorted(set(PLACEHOLDER.findall(template)) - set(values))
    if unknown:
        raise ConfigError(f"template {TEMPLATES[key]} uses unknown placeholders: {', '.join(unknown)}")
    return PLACEHOLDER.sub(lambda m: values[m.group(1)], template)
