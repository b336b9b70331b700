"""`hpcbench pack`: staging layer (issue #3)."""
from __future__ import annotations

import argparse

from hpcbench.cli import NotImplementedYet


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> int:
    raise NotImplementedYet("the staging layer is tracked in issue #3")
