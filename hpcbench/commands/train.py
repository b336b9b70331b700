"""`hpcbench train WORKLOAD`: configure and train one or many instances of a workload."""
from __future__ import annotations

import argparse

from hpcbench import registry
from hpcbench.cli import NotImplementedYet

from ._common import add_config_args, add_layout_args


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("workload", help=f"one of: {', '.join(registry.names())}")
    add_config_args(parser)
    add_layout_args(parser)
    parser.add_argument("--data", metavar="DIR", help="dataset root (shortcut for --set data.root=DIR)")
    parser.add_argument("--results", metavar="DIR", default="results", help="where result_<instance>.txt go")
    parser.add_argument("--system", metavar="FILE", help="system description JSON (systems/<name>.json)")


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
    raise NotImplementedYet("the training harness is tracked in issue #4")
