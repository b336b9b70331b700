"""Terminal tables (rich), and the JSON / CSV files of a report."""
from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

from common.atomic import atomic_write_text

from .compare import Check
from .official import Official
from .scoring import Score


def _f(x: float | None, fmt: str = ".3f") -> str:
    return "-" if x is None else format(x, fmt)


def print_group(console: Any, score: Score, off: Official | None, checks: list[Check]) -> None:
    from rich.table import Table
    from rich.text import Text

    title = f"{score.system} / {score.mode} / {score.benchmark}  (division: {score.division or '?'})"
    t = Table(title=title, title_justify="left")
    for col in ("run", "seed", "status", "start (s)", "time (s)", "epochs", "samples/s", "staging (s)",
                "metric", "checker"):
        t.add_column(col, justify="right" if col not in ("run", "status") else "left")
    for r in score.runs:
        comp = "-" if off is None else ("PASS" if off.compliance.get(r.name, (False, ""))[0] else "FAIL")
        t.add_row(r.name.removesuffix(".txt"), str(r.seed), r.status, _f(r.start_offset_s, ".1f"), _f(r.time_to_solution_s, ".2f"),
                  str(r.epochs), _f(r.samples_per_s, ".1f"), _f(r.staging_s, ".2f"), _f(r.final_metric, ".4f"), comp)
    console.print(t)
    s = Table(show_header=True, title="score", title_justify="left")
    s.add_column("")
    s.add_column("hpcbench", justify="right")
    s.add_column("official", justify="right")
    s.add_column("agree")
    for c in checks:
        if ":" in c.what and c.what.startswith("result_"):
            continue  # per-run checks are summarised below
        s.add_row(c.what, str(_round(c.ours)), str(_round(c.official)), "yes" if c.agree else "[bold red]NO[/]")
    if score.mode == "weak":
        s.add_row("T (system scale)", str(score.T), "-", "")
        s.add_row("models / min (M'/TTTa)", _f(score.models_per_min, ".4f"), "-", "")
    s.add_row("valid MLPerf result", "yes" if score.valid else "no", "-", "")
    console.print(s)
    bad = [c for c in checks if not c.agree]
    for c in bad:
        console.print(f"[bold red]DISAGREEMENT[/] {c.what}: hpcbench={c.ours!r} official={c.official!r}")
    for note in score.notes:
        console.print(f"[yellow]note[/] {note}")
    if off is not None:
        for name, (passed, output) in off.compliance.items():
            if passed:
                continue
            why = [ln.strip() for ln in output.splitlines() if ln.startswith(("WARNING", "ERROR")) and "FAILED" not in ln]
            console.print(Text(f"official compliance checker rejected {name}: " + ("; ".join(why[:4]) or "see report.json"),
                               style="yellow"))
    if off is not None and off.messages.strip():
        console.print("[dim]official summarizer said:[/]")
        for line in off.messages.strip().splitlines():
            if "CRITICAL" in line or "NOTICE" in line or " in " in line:
                console.print(Text("  " + line, style="dim"))


def _round(x: Any) -> Any:
    return round(x, 6) if isinstance(x, float) else x


def write_json(path: Path, entries: list[dict[str, Any]]) -> None:
    atomic_write_text(path, json.dumps({"groups": entries}, indent=2, default=str) + "\n")


CSV_COLUMNS = ("system", "mode", "benchmark", "division", "run", "seed", "status", "start_offset_s",
               "time_to_solution_s", "epochs", "samples_per_s", "staging_s", "final_metric", "official_compliance",
               "score_min", "official_score_min", "T", "S", "M", "M_prime", "ttta_min", "models_per_min", "valid")


def write_csv(path: Path, pairs: list[tuple[Score, Official | None]]) -> None:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(CSV_COLUMNS)
    for score, off in pairs:
        for r in score.runs:
            w.writerow([score.system, score.mode, score.benchmark, score.division, r.name, r.seed, r.status,
                        r.start_offset_s, r.time_to_solution_s, r.epochs, r.samples_per_s, r.staging_s, r.final_metric,
                        None if off is None else off.compliance.get(r.name, (False, ""))[0],
                        score.score_min, None if off is None else off.score_min, score.T, score.S, score.M,
                        score.M_prime, score.ttta_min, score.models_per_min, score.valid])
    atomic_write_text(path, buf.getvalue())
