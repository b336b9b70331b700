"""`hpcbench jobs render`: print a ready sbatch script (cache drop, staging, training, report)."""
from __future__ import annotations

import argparse
import shlex
import sys


def _workloads() -> str:
    """Every registered workload, by suite (the registry reads records only: light)."""
    from hpcbench import registry

    by: dict[str, list[str]] = {}
    for name in registry.names():
        by.setdefault(registry.entry(name).suite, []).append(name)
    return "; ".join(f"{', '.join(names)} ({suite} suite)" for suite, names in by.items())


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="jobs_command", metavar="ACTION", required=True)
    r = sub.add_parser("render", help="print an sbatch script for a system, workload and layout")
    r.add_argument("--system", required=True, help="settings in jobs/systems/<name>.toml, or a .toml path")
    r.add_argument("--workload", required=True,
                   help=f"one of: {_workloads()} (or package.module:Class); a training-suite workload's logs "
                        "go to results/<system>/<benchmark>/ (no mode folder; each instance is one run)")
    r.add_argument("--mode", choices=("strong", "weak"), default="weak",
                   help="strong: one run on --nodes-per-instance nodes; weak (default): --instances concurrent "
                        "instances (a training-suite workload: that many runs)")
    r.add_argument("--launch", choices=("one-srun", "srun-per-instance"), default="one-srun",
                   help="weak scaling: one srun over all nodes (default) or one srun per instance")
    r.add_argument("--instances", type=int, default=1, help="concurrent instances (weak scaling)")
    r.add_argument("--nodes-per-instance", type=int, default=1, help="nodes of one instance (strong: of the run)")
    r.add_argument("--config", default=None,
                   help="workload preset or TOML file (default: full; mini on a system that emulates its nodes on "
                        "one host, [node] emulate_nodes = true, such as local)")
    r.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    r.add_argument("--results", help="submission folder (default: the system's; weak jobs add weak-$SLURM_JOB_ID)")
    r.add_argument("--data", help="train from this dataset directly (no staging)")
    r.add_argument("--stage-from", help="packed dataset to stage in the job (default: the system file's [data])")
    r.add_argument("--stage-to", help="node-local staging folder, {node} = node index (default: the system file's "
                   "[paths] stage_dir + /DATASET, as `hpcbench stage --dataset`)")
    r.add_argument("--no-stage", action="store_true", help="do not stage even if the system file names a dataset")
    r.add_argument("--time", help="Slurm time limit (default: the system file's)")
    r.add_argument("--device", choices=("auto", "cpu", "cuda"),
                   help="hpcbench train --device in the job (default: the system file's node.device, else auto)")
    r.add_argument("--seed", type=int, default=None,
                   help="weak: base seed, instance k trains with seed+k; strong: every submission's seed "
                        "(default for both: the Slurm job id, or $HPCBENCH_SEED at submission, so that each "
                        "submission has its own; the rules ask for seeds from the clock or system randomness)")
    r.add_argument("-o", "--output", help="write the script here instead of printing it")


def run(args: argparse.Namespace) -> int:
    from hpcbench.common.atomic import atomic_write_text
    from hpcbench.jobs import JobSpec, render

    spec = JobSpec(system=args.system, workload=args.workload, mode=args.mode, launch=args.launch,
                   instances=args.instances, nodes_per_instance=args.nodes_per_instance, config=args.config,
                   results=args.results, data=args.data, stage_from=args.stage_from, stage_to=args.stage_to, no_stage=args.no_stage,
                   time=args.time, seed=args.seed, overrides=args.overrides, device=args.device,
                   command="hpcbench " + shlex.join(sys.argv[1:]))
    script = render(spec)
    if args.output:
        atomic_write_text(args.output, script)
        print(f"wrote {args.output}")
    else:
        sys.stdout.write(script)
    return 0
