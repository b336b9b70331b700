"""Closed-readiness of one log: is it a closed-division run of the benchmark the rules define?

The official compliance checker checks the keys its closed YAML names (a few fixed values, a quality target);
it does not see that a "closed" log trained a tiny model on a synthetic subset. This module compares each log
of a folder that claims the closed division with the benchmark's :class:`~hpcbench.common.benchmark.
ClosedDefinition` (declared once, in the benchmark record):

* the division: the log's ``submission_division``, ``systems/<system>.json``'s ``division`` and the
  submission folder's (``closed/`` or ``open/`` above ``<org>/results``, MLPerf's package layout) must all
  say closed;
* the model: the parameter count the harness logs (``hpcbench_model_parameters``) is one of the definition's;
* the dataset: ``train_samples`` / ``eval_samples`` are the real dataset's counts;
* the hyperparameters the closed rules fix have their fixed values.

Every failed comparison is one reason, naming the key, what the log says and what the definition wants.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from hpcbench import registry
from hpcbench.common.benchmark import PARAMETERS_KEY, same_value

from .logs import RunLog

DIVISIONS = ("closed", "open")
__all__ = ["claims_closed", "folder_division", "readiness", "same_value"]


def folder_division(folder: Path) -> str | None:
    """The division a submission folder sits in: MLPerf packages are ``<division>/<org>/results/...``, so the
    name of the folder holding ``results/`` or of its parent, when it is ``closed`` or ``open``; else None."""
    parts = Path(folder).resolve().parts
    if "results" not in parts:
        return None
    root = Path(*parts[:len(parts) - 1 - parts[::-1].index("results")])  # the folder holding results/
    for candidate in (root.name, root.parent.name):
        if candidate in DIVISIONS:
            return candidate
    return None


def claims_closed(divisions: list[str | None]) -> bool:
    """A folder is judged as closed when any of its divisions (a log's, the system JSON's, the folder's) is."""
    return "closed" in divisions


def _show(x: Any) -> str:
    if isinstance(x, int) and not isinstance(x, bool):
        return f"{x:,}"
    return repr(x)


def readiness(run: RunLog, system_division: str | None, folder_div: str | None) -> list[str]:
    """Why ``run`` is not a closed-ready log (empty: it is), one reason per failed comparison."""
    why: list[str] = []
    if run.division != "closed":
        why.append(f"division: the log's submission_division is {run.division!r}, not 'closed'")
    if system_division is None:
        why.append("division: systems/<system>.json states no division (missing or unreadable), not 'closed'")
    elif system_division != "closed":
        why.append(f"division: systems/<system>.json says {system_division!r}, not 'closed'")
    if folder_div is not None and folder_div != "closed":
        why.append(f"division: the submission folder is under {folder_div}/, not closed/")
    record = registry.record_of(run.benchmark or "")
    if record is None or record.closed is None:
        why.append(f"no closed definition of benchmark {run.benchmark!r} is known to hpcbench: its model, dataset "
                   "and hyperparameters cannot be compared")
        return why
    c = record.closed
    if c.parameters:
        want = " or ".join(f"{n:,}" for n in c.parameters)
        n = run.settings.get(PARAMETERS_KEY.removeprefix("hpcbench_"))
        if n is None:
            why.append(f"model: no parameter count logged ({PARAMETERS_KEY}); the closed {record.benchmark} model "
                       f"has {want}")
        elif n not in c.parameters:
            why.append(f"model: {PARAMETERS_KEY} is {_show(n)}; the closed {record.benchmark} model has {want} "
                       "parameters")
    for key, want_n in (("train_samples", c.train_samples), ("eval_samples", c.eval_samples)):
        if want_n is None:
            continue
        if key not in run.values:
            why.append(f"dataset: {key} is not logged; the real {record.benchmark} dataset has {want_n:,}")
        elif not same_value(run.values[key], want_n):
            why.append(f"dataset: {key} is {_show(run.values[key])}; the real {record.benchmark} dataset has "
                       f"{want_n:,} (a subset, another data.size or synthetic data?)")
    for key, want_v in c.fixed_for(run.values.get("opt_name")).items():
        if key not in run.values:
            why.append(f"hyperparameter: {key} is not logged; the closed rules fix it to {_show(want_v)}")
        elif not same_value(run.values[key], want_v):
            why.append(f"hyperparameter: {key} is {_show(run.values[key])}; the closed rules fix it to "
                       f"{_show(want_v)}")
    return why
