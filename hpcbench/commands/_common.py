"""Options shared by several subcommands."""
from __future__ import annotations

import argparse
import math

MiB = 1 << 20
#: the most threads a --threads option takes (a typo such as 10000 would start them all)
MAX_THREADS = 1024


def add_layout_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("layout (under mpiexec/mpirun/srun)")
    g.add_argument("--instances", type=int, default=1, metavar="K",
                   help="split the job's ranks into K concurrent instances of equal size (default 1)")
    g.add_argument("--ranks-per-node", type=int, default=None, metavar="R",
                   help="treat each R consecutive ranks as one node (emulate nodes on one box); "
                        "default: ranks that share memory form a node")


def add_config_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("configuration")
    g.add_argument("--config", default="mini", metavar="PRESET|FILE",
                   help="preset name (mini, full) or a TOML file (default: mini)")
    g.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override one config key, e.g. --set train.seed=7 (repeatable)")
    g.add_argument("--dump-config", action="store_true", help="print the resolved config as TOML and exit")


def add_device_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                        help="where to train: auto (default) = CUDA when torch sees a GPU, else the CPU; cuda "
                             "fails clearly without one; cpu uses gloo, also on a GPU node. On CUDA each rank "
                             "takes its own GPU by node-local rank (CUDA_VISIBLE_DEVICES respected), and more "
                             "ranks of one instance per node than GPUs is refused before any work")


def mib_bytes(option: str, value: float) -> int:
    """``value`` MiB as bytes; a value that is not finite or gives less than one byte is a named error."""
    from hpcbench.common.errors import ConfigError

    if not (math.isfinite(value) and value > 0 and int(value * MiB) >= 1):
        raise ConfigError(f"{option} must be a finite number of MiB > 0 (at least one byte), got {value:g}")
    return int(value * MiB)


def check_range(option: str, value: float, low: float, high: float, why: str = "") -> None:
    """``low <= value <= high`` (and finite), else a named error (``why`` says where the bounds come from)."""
    from hpcbench.common.errors import ConfigError

    if not (math.isfinite(value) and low <= value <= high):
        raise ConfigError(f"{option} must be from {low:g} to {high:g}{f' ({why})' if why else ''}, got {value:g}")
