"""Terminal tables (rich), and the JSON / CSV files of a report."""
from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

from hpcbench.common.atomic import atomic_write_text

from .closed import closed_not_checked
from .compare import Check, Verdict
from .discover import Group
from .official import Official, SubmissionChecks, compliance_reasons
from .scoring import Score


def _f(x: float | None, fmt: str = ".3f") -> str:
    return "-" if x is None else format(x, fmt)


def print_group(console: Any, score: Score, off: Official | None, checks: list[Check], verdict: Verdict,
                group: Group | None = None) -> None:
    """One folder's tables and lines; ``group`` (its logs) adds the rules line and what closed-readiness did
    not check."""
    from rich.table import Table
    from rich.text import Text

    where = score.mode if score.suite == "hpc" else f"training {score.ruleset}"
    title = (f"{score.system} / {where} / {score.benchmark}  (division: {score.division or '?'}; "
             f"target: {score.target or 'unknown'}"
             + (f"; the runs' own: {score.run_target}" if score.run_target and score.run_target != score.target
                else "") + ")")
    t = Table(title=title, title_justify="left")
    for col in ("run", "seed", "outcome", "start (s)", "time (s)", "epochs", "samples/s", "staging (s)",
                "last metric", "checker"):
        t.add_column(col, justify="right" if col not in ("run", "outcome") else "left")
    for r in score.runs:
        comp = "-" if off is None else ("PASS" if off.compliance.get(r.name, (False, ""))[0] else "FAIL")
        t.add_row(r.name.removesuffix(".txt"), str(r.seed), r.status, _f(r.start_offset_s, ".1f"), _f(r.time_to_solution_s, ".2f"),
                  str(r.epochs), _f(r.samples_per_s, ".1f"), _f(r.staging_s, ".2f"), _f(r.final_metric, ".4f"), comp)
    for name, _ in score.skipped:
        t.add_row(name.removesuffix(".txt"), "-", "unreadable", *["-"] * 6, "-" if off is None else "FAIL")
    console.print(t)
    if group is not None:
        console.print(Text("rules: ", style="bold") + Text(group.rules))
    s = Table(show_header=True, title="score", title_justify="left")
    s.add_column("")
    s.add_column("hpcbench", justify="right")
    s.add_column("official summarizer", justify="right")
    s.add_column("agree")
    for c in checks:
        if c.what.startswith("result_"):
            continue  # per-run checks are summarised below
        s.add_row(c.what, _cell(c.ours), _cell(c.official),
                  "-" if c.agree is None else ("yes" if c.agree else "[bold red]NO[/]"))
    if score.mode == "weak":
        if not checks:
            s.add_row("M' (converged models)", str(score.M_prime), "-", "")
            s.add_row("S (instance scale)", str(score.S), "-", "")
            s.add_row("TTTa (min)", _f(score.ttta_min, ".4f"), "-", "")
        s.add_row("T (system scale, from systems/<system>.json)", str(score.T), "-", "")
        s.add_row("models / min (M'/TTTa)", _f(score.models_per_min, ".4f"), "-", "")
        s.add_row("job span, every instance (min) (ours)", _f(score.job_span_min, ".4f"), "-", "")
    elif not checks and score.scaling_file:  # the shipped scaling.json's factor applied, as the summarizer does
        s.add_row("olympic mean before scaling (min)", _f(score.olympic_min, ".4f"), "-", "")
        s.add_row("scaling_factor (the folder's scaling.json)", _f(score.scaling_factor, ".6f"), "-", "")
        s.add_row("score = olympic mean x scaling_factor (min)", _f(score.score_min, ".4f"), "-", "")
    elif not checks:
        s.add_row("olympic mean (min)", _f(score.score_min, ".4f"), "-", "")
    s.add_row("valid MLPerf result", verdict.label, "-", "")
    console.print(s)
    if off is not None and not off.produced:
        console.print(Text(f"official summarizer produced no score for this folder: {off.why_none}", style="yellow"))
    for c in checks:
        if c.agree is False:
            console.print(f"[bold red]DISAGREEMENT[/] {c.what}: hpcbench={c.ours!r} official={c.official!r}")
    for flag in score.flags:
        console.print(Text("FLAG ", style="bold red") + Text(flag))
    for r in score.runs:
        for why in r.rejected:
            console.print(Text("REJECTED ", style="bold red") + Text(f"{r.name} (not scored): {why}"))
    for r in score.runs:
        for why in r.closed_reasons or []:
            console.print(Text("NOT CLOSED-READY ", style="bold red") + Text(f"{r.name}: {why}"))
    unchecked = closed_not_checked(group, score) if group is not None else {}
    if score.closed and not score.not_closed_ready and score.runs:
        console.print(Text("closed-ready: ", style="green") + Text(
            f"every log ({len(score.runs)}) has the {score.benchmark} closed definition's parameter count, dataset "
            "sample counts and fixed hyperparameters, and says closed as the system JSON does" if not unchecked else
            f"every log ({len(score.runs)}) says closed as the system JSON does and has no value the {score.benchmark} "
            "closed definition contradicts; what was not checked is on the 'closed, not checked' lines"))
    by_items: dict[tuple[str, ...], list[str]] = {}
    for name, items in unchecked.items():
        by_items.setdefault(tuple(items), []).append(name)
    for items, names in by_items.items():
        who = ", ".join(names[:5]) + (f", ... ({len(names)} logs)" if len(names) > 5 else "")
        for item in items:
            console.print(Text("closed, not checked ", style="yellow") + Text(f"{who}: {item}"))
    for note in score.notes:
        console.print(Text("note ", style="yellow") + Text(note))
    for r in score.runs:
        for p in r.problems:
            console.print(Text(f"{r.name}: {p}", style="dim"))
    if off is not None:
        shown = {r.name for r in score.runs if r.rejected}  # already on a REJECTED line
        for name, (passed, output) in off.compliance.items():
            if passed or name in shown:
                continue
            why = compliance_reasons(output)
            console.print(Text(f"official compliance checker rejected {name}: " + ("; ".join(why[:4]) or "see report.json"),
                               style="yellow"))
    for f in verdict.failures:
        console.print(Text("not valid: ", style="bold red") + Text(f))
    if off is not None and off.messages.strip():
        console.print("[dim]official summarizer said:[/]")
        for line in off.messages.strip().splitlines():
            console.print(Text("  " + line, style="dim"))


def print_submission(console: Any, checks: SubmissionChecks) -> None:
    """The package checker and system-description checker verdicts, with their error lines."""
    from rich.text import Text

    runs = [("package checker", checks.package)] + [(f"system_desc_checker {k}", v) for k, v in checks.systems.items()]
    for what, run in runs:
        if run is None:
            continue
        style = "green" if run.ok else "bold red"
        console.print(Text(f"official {what}: ", style="bold") + Text(run.verdict(), style=style)
                      + Text(f"  ({' '.join(run.command[2:6])})", style="dim"))
        if not run.ok:
            lines = [ln for ln in run.output.splitlines()
                     if ln.startswith(("ERROR", "WARNING", "Traceback")) or "Error" in ln or "Unknown files" in ln]
            for ln in (lines or run.output.strip().splitlines())[-8:]:
                console.print(Text("  " + ln, style="dim"))
        else:
            for ln in run.output.splitlines():
                if "Unknown files" in ln or "do not conform" in ln:
                    console.print(Text("  " + ln, style="yellow"))


def _round(x: Any) -> Any:
    return round(x, 6) if isinstance(x, float) else x


def _cell(x: Any) -> str:
    """A score-table cell: '-' for nothing, yes/no for a flag, numbers rounded."""
    if x is None:
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "no"
    return str(_round(x))


def write_json(path: Path, entries: dict[str, Any]) -> None:
    atomic_write_text(path, json.dumps(entries, indent=2, default=str) + "\n")


CSV_COLUMNS = ("system", "mode", "benchmark", "division", "run", "seed", "status", "converged", "start_offset_s",
               "time_to_solution_s", "epochs", "samples_per_s", "staging_s", "final_metric", "official_compliance",
               "score_min", "official_score_min", "T", "S", "M", "M_prime", "ttta_min", "models_per_min",
               "job_span_min_ours", "valid", "closed_ready", "olympic_min", "scaling_factor")


def write_csv(path: Path, pairs: list[tuple[Score, Official | None, Verdict]]) -> None:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(CSV_COLUMNS)
    for score, off, verdict in pairs:
        for r in score.runs:
            w.writerow([score.system, score.mode, score.benchmark, score.division, r.name, r.seed, r.status,
                        r.converged, r.start_offset_s, r.time_to_solution_s, r.epochs, r.samples_per_s, r.staging_s,
                        r.final_metric, None if off is None else off.compliance.get(r.name, (False, ""))[0],
                        score.score_min, None if off is None else off.score_min, score.T, score.S, score.M,
                        score.M_prime, score.ttta_min, score.models_per_min, score.job_span_min, verdict.valid,
                        r.closed_ready, score.olympic_min, score.scaling_factor])
    atomic_write_text(path, buf.getvalue())
