"""`hpcbench report RESULTS_DIR`: MLPerf HPC scores (strong: olympic mean of time to solution;
weak: T, S, M', TTTa, models/min), per-instance figures, the official compliance checker and result
summarizer side by side, JSON/CSV files and PNG plots."""
from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results", metavar="RESULTS_DIR",
                        help="submission folder holding results/<system>/<strong|weak>/<benchmark>/result_*.txt "
                             "and systems/<system>.json (or any folder of result_*.txt logs)")
    parser.add_argument("--out", metavar="DIR", help="where report.json, report.csv and plots go "
                                                     "(default: RESULTS_DIR/report)")
    parser.add_argument("--no-official", action="store_true", help="skip the official checker and summarizer")
    parser.add_argument("--ruleset", action="append", metavar="[SUITE=]X.Y.Z",
                        help="check and score the folder under this ruleset of the installed mlperf-logging (e.g. "
                             "4.0.0 for a training v4.0 submission; SUITE=X.Y.Z for one suite, repeatable); it wins "
                             "over what the logs name, hpcbench's default and what the folder's benchmarks imply "
                             "(the 'rules:' line under each folder's table says which set it)")
    parser.add_argument("--no-plots", action="store_true", help="do not write PNG plots")
    parser.add_argument("--prune-failed", action="store_true",
                        help="first move the logs of failed weak-scaling instances (not converged, not rejected; "
                             "unreadable files) from results/<system>/weak/<benchmark>/ to "
                             "hpcbench/<system>/weak/<benchmark>/pruned_failed/ (never deleted or overwritten), "
                             "listing each, so the official package checker accepts the folder; then report")
    parser.add_argument("--strict", action="store_true",
                        help="exit with status 1 when hpcbench and the official tools disagree, when a log is "
                             "rejected (by the official compliance checker or by hpcbench's own checks: duplicated "
                             "runs, non-finite or absurd times), when a log of a folder that claims the closed division is not "
                             "closed-ready (NOT CLOSED-READY lines), or when a check flags an inconsistency (division of systems/<system>.json vs the logs, run_start "
                             "before init_stop, instances of a weak-scaling set that do not overlap in time)")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from hpcbench.report.build import write_report
    from hpcbench.report.discover import parse_rulesets
    from hpcbench.report.tables import print_group, print_submission

    out = Path(args.out) if args.out else Path(args.results) / "report"
    rulesets = parse_rulesets(args.ruleset)
    console = Console(width=None if Console().is_terminal else 120)
    if args.prune_failed:
        _prune(console, Path(args.results), rulesets)
    try:
        rep = write_report(Path(args.results), out, official=not args.no_official, make_plots=not args.no_plots,
                           rulesets=rulesets)
    except Exception:
        from hpcbench.report.build import stale_path

        if not out.exists():
            stale = stale_path(out)
            moved = (f"; the previous report was moved to {stale} (made from the logs as they were then)"
                     if stale.exists() else "")
            console.print(f"[bold red]no report was produced; {out} holds none{moved}[/]")
        raise
    for g in rep.groups:
        print_group(console, g.score, g.official, g.checks, g.verdict, group=g.group)
        console.print()
    if rep.submission is not None:
        print_submission(console, rep.submission)
    elif rep.official_note:
        console.print(f"[yellow]{rep.official_note}[/]")
    console.print(f"report: {out / 'report.json'}, {out / 'report.csv'}")
    for p in dict.fromkeys(p for g in rep.groups for p in g.plots):
        console.print(f"plot:   {p}")
    n_bad = sum(len(g.disagreements) for g in rep.groups)
    n_flags = sum(len(g.score.flags) for g in rep.groups)
    n_rejected = sum(len(g.score.rejected) for g in rep.groups)
    n_not_ready = sum(len(g.score.not_closed_ready) for g in rep.groups)
    if n_bad:
        console.print(f"[bold red]{n_bad} disagreement(s) between hpcbench and the official tools (listed above)[/]")
    elif rep.submission is not None:
        console.print("hpcbench and the official checker/summarizer agree on every figure they both produced")
    if n_flags:
        console.print(f"[bold red]{n_flags} inconsistenc{'y' if n_flags == 1 else 'ies'} flagged (FLAG lines above)[/]")
    if n_rejected:
        console.print(f"[bold red]{n_rejected} log(s) rejected and not scored (REJECTED lines above)[/]")
    if n_not_ready:
        console.print(f"[bold red]{n_not_ready} log(s) of closed folders not closed-ready (NOT CLOSED-READY lines "
                      "above): not a valid closed result[/]")
    valid = [g for g in rep.groups if g.verdict.valid]
    console.print(f"{len(valid)} of {len(rep.groups)} folder(s) are a valid MLPerf result as far as hpcbench checks "
                  "(the 'valid MLPerf result' row of each says what was checked, the 'not valid' lines what failed)")
    return 1 if ((n_bad or n_flags or n_rejected or n_not_ready) and args.strict) else 0


def _prune(console: "object", results: Path, rulesets: Mapping[str, str]) -> None:
    from rich.text import Text

    from hpcbench.report.prune import prune_failed

    moved, kept = prune_failed(results, rulesets)
    for m in moved:
        console.print(Text("pruned ", style="bold") + Text(f"{m.source} -> {m.dest} ({m.why})"),  # type: ignore[attr-defined]
                      soft_wrap=True)  # whole paths, copyable
    if not moved:
        console.print("--prune-failed: no failed weak-scaling instance log to move")  # type: ignore[attr-defined]
    else:
        console.print(f"--prune-failed: moved {len(moved)} log(s) aside (nothing deleted)")  # type: ignore[attr-defined]
    for path, why in kept:
        console.print(Text("not pruned ", style="yellow") + Text(  # type: ignore[attr-defined]
            f"{path}: rejected ({why}), not a failed instance; it stays for you to inspect"), soft_wrap=True)
