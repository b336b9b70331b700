"""`hpcbench train WORKLOAD`: configure and train one or many instances of a workload.

With ``--instances 1`` (default) this is one strong-scaling run; with K > 1 the job's ranks form K
concurrent instances (weak scaling). Logs land where the official summarizer reads them:
``RESULTS/results/<system>/{strong,weak}/<benchmark>/result_<n>.txt`` (hpc suite) or
``RESULTS/results/<system>/<benchmark>/result_<n>.txt`` (training suite: each instance is one more run)
and ``RESULTS/systems/<system>.json``.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from hpcbench import registry
from hpcbench.common.errors import ConfigError

from ._common import add_config_args, add_device_arg, add_layout_args


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = ("exit status: 0 when every instance reached its quality target; 4 when an instance "
                     "stopped without it (aborted at max_epochs) or failed; 2 for bad input")
    parser.add_argument("workload", help=f"one of: {', '.join(registry.names())}")
    add_config_args(parser)
    add_layout_args(parser)
    add_device_arg(parser)
    parser.add_argument("--data", metavar="DIR", help="dataset root (shortcut for --set data.root=DIR)")
    parser.add_argument("--results", metavar="DIR", default="results",
                        help="submission folder: results/<system>/... and systems/<system>.json go below it")
    parser.add_argument("--system", metavar="FILE", help="system description JSON (systems/<name>.json)")
    parser.add_argument("--system-name", metavar="NAME", help="system name for the results folder "
                        "(default: the system file's system_name, else this host's name)")
    parser.add_argument("--stage-from", metavar="PACKED", nargs="?", const="",
                        help="stage this packed dataset inside the job first (without a value: the site's "
                             "[data] entry for the workload's dataset)")
    parser.add_argument("--stage-to", metavar="LOCAL", nargs="?", const="",
                        help="node-local staging folder ({node} = node index); training then reads from it "
                             "(without a value: the site's [paths] stage_dir + /DATASET)")
    parser.add_argument("--stage", action="store_true",
                        help="stage the workload's dataset inside the job from the site's entries (same as "
                             "--stage-from --stage-to without values; explicit values win)")
    parser.add_argument("--site", metavar="NAME|FILE",
                        help="site settings jobs/systems/<NAME>.toml (or a .toml path) for --stage, as in "
                             "`hpcbench stage --system` (default: $HPCBENCH_SYSTEM)")
    parser.add_argument("--overwrite", action="store_true", help="replace an earlier weak-scaling job's logs")
    parser.add_argument("--timeout", type=float, default=600.0, metavar="S",
                        help="seconds a collective of the torch group may wait for a rank (a stopped or hung rank then "
                             "fails its instance instead of holding the job until the allocation ends); default 600")
    parser.add_argument("--straggler-grace", type=float, default=120.0, metavar="S",
                        help="seconds to wait for the other ranks of a failed instance before ending the job")
    g = parser.add_argument_group("one srun per instance (weak scaling launched as K separate job steps)")
    g.add_argument("--mode", choices=("strong", "weak"), help="default: strong for 1 instance, weak for several")
    g.add_argument("--instance-offset", type=int, metavar="N",
                   help="this launch's instance k writes result_<N+k>.txt and leaves other logs alone")
    g.add_argument("--system-nodes", type=int, metavar="N", help="nodes of the whole system for systems/<name>.json")
    parser.add_argument("--progress", choices=("auto", "bar", "lines", "none"), default="auto",
                        help="bar: a progress bar (one instance at a terminal); lines: each instance's leader "
                             "prints its epochs, evaluations and samples/s; auto (default): bar for one instance "
                             "at a terminal, else lines")
    parser.add_argument("--no-progress", action="store_true", help="same as --progress none")


def resolve_config(args: argparse.Namespace):  # noqa: ANN201
    """The workload class and its config: defaults <- preset/TOML <- the data root <- ``--set``, validated.
    Resolved once per process: ``run`` passes the result on to ``train``. Staged inside the job
    (``--stage-from``), the data root is ``--stage-to`` (``{node}`` still in it) and holds this node's part."""
    cls = registry.get(args.workload)
    _site_staging(args)
    overrides = list(args.overrides)
    if args.stage_from and args.stage_to:  # staged inside the job: this node's part of the dataset
        overrides[:0] = [f"data.root={args.stage_to}", "data.node_local=true"]
    elif args.data:
        overrides.insert(0, f"data.root={args.data}")
    return cls, cls.load_config(args.config, overrides)


def _site_staging(args: argparse.Namespace) -> None:
    """--stage, or --stage-from/--stage-to given without a value (or one without the other): the missing
    paths, and --ranks-per-node where the site emulates nodes, from the site settings (hpcbench.site)."""
    from hpcbench.site import Options, resolve

    if not (args.stage or args.stage_from is not None or args.stage_to is not None):
        return
    dataset = None if ":" in args.workload else registry.entry(args.workload).name
    found = resolve(dataset, args.stage_from, args.stage_to, args.site,
                    Options(f"train {args.workload} --stage", "--stage-from", "--stage-to", "--site",
                            "an out-of-tree workload names no dataset to look up in the site settings"))
    args.stage_from, args.stage_to = found.source, found.dest
    if args.ranks_per_node is None:
        args.ranks_per_node = found.ranks_per_node


def run(args: argparse.Namespace) -> int:
    from hpcbench.common.config import dumps_toml

    cls, cfg = resolve_config(args)
    if args.dump_config:
        print(dumps_toml(cfg), end="")
        return 0
    return train(args, cls, cfg)


def train(args: argparse.Namespace, cls: Any, cfg: Any) -> int:
    """Train ``cls(cfg)`` (``cfg``: the config ``resolve_config`` made) on every rank of the job."""
    from hpcbench.common.dist import init_distributed
    from hpcbench.common.nodepath import node_path
    from hpcbench.common.system import SystemDescription
    from hpcbench.runner import RunnerOptions, run_instances

    system = SystemDescription.load(Path(args.system)) if args.system else SystemDescription()
    if args.system_name:
        system.system_name = args.system_name
    if not (1.0 <= args.timeout <= 7 * 24 * 3600.0):  # nan fails too
        raise ConfigError(f"--timeout must be between 1 s and a week, got {args.timeout:g}")
    env = init_distributed(args.instances, args.ranks_per_node, device=args.device, timeout_s=args.timeout)
    opts = RunnerOptions(results=Path(args.results), system=system,
                         stage_from=Path(args.stage_from) if args.stage_from else None, stage_to=args.stage_to,
                         dataset=None if ":" in args.workload else registry.entry(args.workload).name,
                         overwrite=args.overwrite, straggler_grace_s=args.straggler_grace,
                         progress="none" if args.no_progress else args.progress, mode=args.mode,
                         instance_offset=args.instance_offset, system_nodes=args.system_nodes,
                         suite=cls.suite, division=cfg.train.division)

    def make_workload(data_root: str | None):  # noqa: ANN202
        from hpcbench.staging.marker import require_staged

        # data_root (staged in the job) is --stage-to for this node: cfg.data.root already says so
        # one place: the marker check and the loader read the same folder
        cfg.data.root = node_path(str(cfg.data.root), env.layout.node_index, "data.root")
        require_staged(cfg.data, env.layout, opts.dataset)  # node-local data: completely staged, or refused
        return cls(cfg)

    summary = run_instances(env, cls.benchmark, make_workload, opts)
    if summary is None:
        return 0
    failed = [s for s in summary if s["status"] != "success"]
    return 4 if failed else 0
