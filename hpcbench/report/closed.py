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
* the hyperparameters the closed rules fix have their fixed values (or a value the rules allow besides it:
  its ``also_allowed``).

Every failed comparison is one reason, naming the key, what the log says and what the definition wants.

hpcbench's own logs are held to all of it: its harness logs every one of those keys. A log hpcbench did not
write (another submitter's, the references') is compared on what it logs: a wrong value is a reason, but a key
it does not log is "not checked" (:func:`not_checked`), not a failure, since the official closed YAML decides
which keys a log must carry and its checker already fails a log without them; so are the parameter count
(``hpcbench_model_parameters``, which only hpcbench logs) and a benchmark hpcbench has no closed definition of.
A log is hpcbench's when it carries hpcbench's own ``hpcbench_*`` records (the harness always logs
``hpcbench_target``, ``hpcbench_eval_ranks`` and the parameter count) or its ``submission_*`` records were
written by hpcbench's logger (their ``metadata.file`` is ``.../common/mllog.py``: ``MLPerfLogger.submission``).
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcbench import registry
from hpcbench.common.benchmark import PARAMETERS_KEY, same_value

from .logs import RunLog

if TYPE_CHECKING:  # pragma: no cover
    from .discover import Group
    from .scoring import Score

DIVISIONS = ("closed", "open")
__all__ = ["cache_clear_problem", "claims_closed", "closed_not_checked", "folder_division",
           "is_hpcbench_log", "not_checked", "readiness", "same_value"]

def is_hpcbench_log(run: RunLog) -> bool:
    """Written by hpcbench: it carries hpcbench's ``hpcbench_*`` records, or its submission_* records name
    hpcbench's logger (common/mllog.py) as their source (``RunLog.by_hpcbench``, read when the log was parsed)."""
    return run.by_hpcbench or bool(run.settings) or any(k.startswith("hpcbench_") for k in run.values)


def cache_clear_problem(run: RunLog) -> str | None:
    """What is wrong with a closed log's ``cache_clear`` record, or None. The rules (training_rules.adoc, "Data
    State at Start of Run", which the HPC rules follow) say "You must flush the cache or restart the system
    prior to benchmarking"; the official checker (hpc 3.0.0 and training common.yaml) requires at least one
    cache_clear record with a value field, any value. The HPC references log the event without a value
    (``log_event(key="cache_clear")``: null), the training ones ``true``: both state that the cache was
    cleared. ``false`` says it was not; no record says nothing. hpcbench's own logs say ``true`` or ``false``
    (``false`` when the job did not drop the cache), so for them anything but ``true`` is a problem."""
    if "cache_clear" not in run.values:
        return "logged no cache_clear record: the page cache is not known to have been dropped before the run"
    value = run.values["cache_clear"]
    if value is False:
        return "logged cache_clear false: the page cache was not dropped before the run"
    if value is not True and (value is not None or is_hpcbench_log(run)):
        return f"logged cache_clear {value!r}, not true: the page cache is not known to have been dropped"
    return None


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


def _allowed(closed: Any, key: str, want: Any) -> list[Any]:
    return [want, *closed.also_allowed.get(key, ())]


def _show_allowed(values: list[Any]) -> str:
    return " or ".join(_show(v) for v in values)


def _judge(run: RunLog, system_division: str | None, folder_div: str | None) -> tuple[list[str], list[str]]:
    """(why ``run`` is not closed-ready, what was not checked and why)."""
    why: list[str] = []
    unchecked: list[str] = []
    ours = is_hpcbench_log(run)
    foreign = "not an hpcbench log"
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
        if ours:
            why.append(f"no closed definition of benchmark {run.benchmark!r} is known to hpcbench: its model, dataset "
                       "and hyperparameters cannot be compared")
        else:
            unchecked.append(f"model, dataset and hyperparameters: not checked (hpcbench has no closed definition of "
                             f"{run.benchmark!r}; {foreign})")
        return why, unchecked
    c = record.closed
    if c.parameters:
        want = " or ".join(f"{n:,}" for n in c.parameters)
        n = run.settings.get(PARAMETERS_KEY.removeprefix("hpcbench_"))
        if n is None and not ours:
            unchecked.append(f"model: parameter count not checked ({foreign}: only hpcbench logs {PARAMETERS_KEY}; "
                             f"the closed {record.benchmark} model has {want})")
        elif n is None:
            why.append(f"model: no parameter count logged ({PARAMETERS_KEY}); the closed {record.benchmark} model "
                       f"has {want}")
        elif n not in c.parameters:
            why.append(f"model: {PARAMETERS_KEY} is {_show(n)}; the closed {record.benchmark} model has {want} "
                       "parameters")
    for key, want_n in (("train_samples", c.train_samples), ("eval_samples", c.eval_samples)):
        if want_n is None:
            continue
        if key not in run.values and not ours:
            unchecked.append(f"dataset: {key} not checked: not logged ({foreign}); the real {record.benchmark} "
                             f"dataset has {want_n:,}")
        elif key not in run.values:
            why.append(f"dataset: {key} is not logged; the real {record.benchmark} dataset has {want_n:,}")
        elif not same_value(run.values[key], want_n):
            why.append(f"dataset: {key} is {_show(run.values[key])}; the real {record.benchmark} dataset has "
                       f"{want_n:,} (a subset, another data.size or synthetic data?)")
    for key, want_v in c.fixed_for(run.values.get("opt_name")).items():
        allowed = _allowed(c, key, want_v)
        if key not in run.values and not ours:
            unchecked.append(f"hyperparameter: {key} not checked: not logged ({foreign}); the closed rules fix it "
                             f"to {_show_allowed(allowed)}")
        elif key not in run.values:
            why.append(f"hyperparameter: {key} is not logged; the closed rules fix it to {_show_allowed(allowed)}")
        elif not any(same_value(run.values[key], v) for v in allowed):
            why.append(f"hyperparameter: {key} is {_show(run.values[key])}; the closed rules fix it to "
                       f"{_show_allowed(allowed)}")
    return why, unchecked


def readiness(run: RunLog, system_division: str | None, folder_div: str | None) -> list[str]:
    """Why ``run`` is not a closed-ready log (empty: it is), one reason per failed comparison."""
    return _judge(run, system_division, folder_div)[0]


def not_checked(run: RunLog, system_division: str | None, folder_div: str | None) -> list[str]:
    """What of the closed definition was not compared for ``run`` and why (a log not written by hpcbench:
    the keys it does not log, the parameter count, a benchmark hpcbench has no definition of); empty for
    hpcbench's own logs, which are held to all of it."""
    return _judge(run, system_division, folder_div)[1]


def closed_not_checked(group: "Group", score: "Score") -> dict[str, list[str]]:
    """log -> what was not checked, for every log of a folder judged closed (empty when nothing was left out)."""
    if not score.closed:
        return {}
    out = {}
    for run in group.runs:
        items = not_checked(run, score.system_division, score.folder_division)
        if items:
            out[run.name] = items
    return out
