"""`hpcbench report RESULTS_DIR`: MLPerf HPC scores (strong: olympic mean of time to solution;
weak: T, S, M', TTTa, models/min), per-instance figures, the official compliance checker and result
summarizer side by side, JSON/CSV files and PNG plots."""
from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results", metavar="RESULTS_DIR",
                        help="submission folder holding results/<system>/<strong|weak>/<benchmark>/result_*.txt "
                             "and systems/<system>.json (or any folder of result_*.txt logs)")
    parser.add_argument("--out", metavar="DIR", help="where report.json, report.csv and plots go "
                                                     "(default: RESULTS_DIR/report)")
    parser.add_argument("--no-official", action="store_true", help="skip the official checker and summarizer")
    parser.add_argument("--no-plots", action="store_true", help="do not write PNG plots")
    parser.add_argument("--strict", action="store_true",
                        help="exit with status 1 when hpcbench and the official tools disagree")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from hpcbench.report.build import build
    from hpcbench.report.tables import print_group, write_csv, write_json

    out = Path(args.out) if args.out else Path(args.results) / "report"
    reports = build(Path(args.results), out, official=not args.no_official, make_plots=not args.no_plots)
    console = Console(width=None if Console().is_terminal else 120)
    for rep in reports:
        print_group(console, rep.score, rep.official, rep.checks)
        console.print()
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "report.json", [r.to_dict() for r in reports])
    write_csv(out / "report.csv", [(r.score, r.official) for r in reports])
    n_bad = sum(len(r.disagreements) for r in reports)
    console.print(f"report: {out / 'report.json'}, {out / 'report.csv'}")
    for p in dict.fromkeys(p for rep in reports for p in rep.plots):
        console.print(f"plot:   {p}")
    if n_bad:
        console.print(f"[bold red]{n_bad} disagreement(s) between hpcbench and the official tools (listed above)[/]")
    elif not args.no_official:
        console.print("hpcbench and the official checker/summarizer agree on every number")
    return 1 if (n_bad and args.strict) else 0
