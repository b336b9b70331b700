"""`hpcbench run`: runner and reporting (issue #7)."""
from __future__ import annotations

import argparse

from hpcbench.cli import NotImplementedYet


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> int:
    raise NotImplementedYet("runners, reports and jobs are tracked in issue #7")
