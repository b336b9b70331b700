"""The ``hpcbench`` command line. Each subcommand lives in ``hpcbench/commands/<name>.py`` and is
imported only when it runs (so ``--help`` and ``info`` stay fast and import no heavy packages)."""
from __future__ import annotations

import argparse
import importlib
import sys
import traceback
from collections.abc import Sequence

from hpcbench.common.errors import ConfigError, DistributedError, HpcbenchError

from . import __version__

#: subcommand -> (module in hpcbench.commands, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "info": ("info", "versions, MPI library, devices, threads, DALI, and the rank/instance layout"),
    "datagen": ("datagen", "write synthetic data in a workload's real on-disk format"),
    "pack": ("pack", "merge a dataset's many small files into few zstd-compressed shards"),
    "stage": ("stage", "distribute packed shards to node-local storage (sharded reads + MPI Allgatherv)"),
    "train": ("train", "train a workload to its quality target (one or many instances)"),
    "report": ("report", "scores, tables and plots from MLPerf result logs"),
    "run": ("run", "the embedded default end to end: datagen -> pack -> stage -> train -> report"),
    "jobs": ("jobs", "render Slurm job scripts for strong and weak scaling"),
    "convert": ("convert", "convert original datasets to the project's safe formats (oc20: pickled LMDB)"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hpcbench",
        description="MLPerf-HPC-style benchmark suite: stage datasets, train CosmoFlow, DeepCAM and "
        "OpenCatalyst (MLPerf HPC) and DLRM-DCNv2 and BERT (MLPerf Training) to target at strong and weak "
        "scale, and report trustworthy scores.",
    )
    parser.add_argument("--version", action="version", version=f"hpcbench {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for user errors too")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, summary) in COMMANDS.items():
        mod = importlib.import_module(f"hpcbench.commands.{module}")
        p = sub.add_parser(name, help=summary, description=summary)
        mod.add_arguments(p)
        p.set_defaults(_module=mod)
    return parser


def _launcher_rank() -> int:
    import os

    for var in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID"):
        if var in os.environ:
            return int(os.environ[var])
    return 0


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse on every rank, but only the first rank prints a usage error (the others wait briefly so
    their early exit does not make the launcher kill rank 0 before it printed)."""
    if _launcher_rank() == 0:
        return parser.parse_args(argv)
    import contextlib
    import io
    import time

    try:
        with contextlib.redirect_stderr(io.StringIO()):
            return parser.parse_args(argv)
    except SystemExit as exc:
        if exc.code:
            time.sleep(1.0)
        raise


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = _parse(parser, argv)
    if args.command is None:
        parser.print_help()
        return 2
    rc = _run(args)
    on_exit = getattr(args, "on_exit", None)
    if on_exit is not None:  # a command that bounds its ranks' exit (stage); may abort the job
        on_exit(rc)
    return rc


def _run(args: argparse.Namespace) -> int:
    try:
        return int(args._module.run(args) or 0)
    except HpcbenchError as exc:
        if args.debug:
            traceback.print_exc()
        agreed = getattr(exc, "agreed", False)  # raised on every rank with the same message (staging)
        if not ((agreed or isinstance(exc, (ConfigError, DistributedError))) and _launcher_rank() > 0):
            print(f"hpcbench {args.command}: error: {exc}", file=sys.stderr, flush=True)
        if agreed:  # every rank waits (bounded) for rank 0's print: an early exit would end the job first
            exc.settle()  # type: ignore[attr-defined]
        return 2  # with several ranks, rank 0 reports an error that every rank hit
    except KeyboardInterrupt:
        print(f"hpcbench {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
