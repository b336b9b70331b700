"""`hpcbench train WORKLOAD`: configure and train one or many instances of a workload."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from hpcbench import registry

from ._common import add_config_args, add_layout_args


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("workload", help=f"one of: {', '.join(registry.names())}")
    add_config_args(parser)
    add_layout_args(parser)
    parser.add_argument("--data", metavar="DIR", help="dataset root (shortcut for --set data.root=DIR)")
    parser.add_argument("--results", metavar="DIR", default="results", help="where result_<instance>.txt go")
    parser.add_argument("--system", metavar="FILE", help="system description JSON (systems/<name>.json)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def resolve_config(args: argparse.Namespace):  # noqa: ANN201 - returns the workload's config type
    cls = registry.get(args.workload)
    overrides = list(args.overrides)
    if args.data:
        overrides.insert(0, f"data.root={args.data}")
    return cls, cls.load_config(args.config, overrides)


def run(args: argparse.Namespace) -> int:
    from common.config import dumps_toml

    cls, cfg = resolve_config(args)
    if args.dump_config:
        print(dumps_toml(cfg), end="")
        return 0
    return train(cls(cfg), args)


def train(workload, args: argparse.Namespace) -> int:  # noqa: ANN001 - a Workload
    """Every rank: distributed init, the instance's MLPerf log, run_training, a summary line."""
    from common.atomic import atomic_write_text
    from common.dist import init_distributed
    from common.mllog import MLPerfLogger, result_filename
    from common.system import SystemDescription
    from common.trainer import run_training

    system = SystemDescription.load(Path(args.system)) if args.system else SystemDescription()
    env = init_distributed(args.instances, args.ranks_per_node)
    results = Path(args.results)
    layout = env.layout
    log_path = results / result_filename(layout.instance) if layout.is_instance_leader else None
    if log_path is not None and log_path.exists():
        log_path.unlink()  # one run per log file: a stale log would fail the compliance checker
    mllogger = MLPerfLogger(log_path)
    try:
        progress = False if args.no_progress else None
        result = run_training(workload, env, mllogger, system, progress=progress)
    finally:
        mllogger.close()
    summaries = env.comm.gather(result.to_dict() if layout.is_instance_leader else None, root=0)
    if layout.is_world_leader:
        for s in (s for s in summaries if s is not None):
            metric = "n/a" if s["final_metric"] is None else f"{s['final_metric']:.4f}"
            print(f"instance {s['instance']}: {s['status']} after {s['epochs']} epochs, "
                  f"{s['metric_key']}={metric}, time to solution {s['time_to_solution_s']:.2f} s, "
                  f"{s['samples_per_s']:.1f} samples/s -> {results / result_filename(s['instance'])}")
        atomic_write_text(results / "train_summary.json", json.dumps(summaries, indent=2) + "\n")
    env.close()
    return 0
