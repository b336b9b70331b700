"""The official mlperf-logging tools run on the same files: the compliance checker on every log and
the result summarizer's scoring functions on every benchmark folder (the ones its
``summarize_results`` calls), with their printed messages captured."""
from __future__ import annotations

import contextlib
import io
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common.mllog import RULESET, USAGE

from .discover import Group


@dataclass
class Official:
    compliance: dict[str, tuple[bool, str]] = field(default_factory=dict)  # file name -> (passed, output)
    per_run_min: dict[str, float] = field(default_factory=dict)  # runs the summarizer accepted
    score_min: float | None = None  # strong: olympic mean; weak: TTTa
    number_of_models: int | None = None  # weak
    instance_scale: int | None = None  # weak
    scored: bool = False  # the summarizer produced a score for this folder
    messages: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"compliance": {k: v[0] for k, v in self.compliance.items()},
                "compliance_failures": {k: v[1] for k, v in self.compliance.items() if not v[0]},
                "per_run_min": self.per_run_min,
                "score_min": self.score_min, "number_of_models": self.number_of_models,
                "instance_scale": self.instance_scale, "scored": self.scored, "messages": self.messages}


@contextlib.contextmanager
def _captured() -> Any:
    """Collect what the official tools print and log (they use print() and the root logger)."""
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    handler.setFormatter(logging.Formatter("%(levelname)s - %(message)s"))
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
            yield buf
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)


def check_compliance(path: Path) -> tuple[bool, str]:
    """The official compliance checker (hpc 3.0.0), in process."""
    from mlperf_logging.compliance_checker import mlp_compliance

    with _captured() as buf:
        checker = mlp_compliance.make_checker(usage=USAGE, ruleset=RULESET, quiet=False, werror=False)
        try:
            ok = bool(checker.check_file(str(path), f"{USAGE}_{RULESET}/common.yaml"))
        except Exception as exc:  # noqa: BLE001 - the checker raises on some malformed logs
            print(f"checker raised {type(exc).__name__}: {exc}")
            ok = False
    return ok, buf.getvalue()


def run_official(group: Group) -> Official:
    from mlperf_logging.result_summarizer import result_summarizer as rs

    off = Official()
    for run in group.runs:
        off.compliance[run.name] = check_compliance(run.path)
    folder = str(group.folder)
    with _captured() as buf:
        if group.mode == "strong":
            per_file, _, score, _, _ = rs._compute_strong_score_standalone(
                group.benchmark, group.system, False, folder, USAGE, RULESET, return_full_scores=True)
            off.per_run_min = {Path(k).name: float(v) for k, v in per_file.items()}
            off.score_min, off.scored = score, score is not None
        else:
            scores, _ = rs._compute_weak_score_standalone(group.benchmark, group.system, False, folder, USAGE, RULESET)
            off.scored = bool(scores)
            _weak_from_primitives(off, group, rs)
            if scores:  # the summarizer's own totals override the primitives when it scores
                off.score_min = scores[f"{group.benchmark}:time_to_train_all"]
                off.number_of_models = scores[f"{group.benchmark}:number_of_models"]
                off.instance_scale = scores[f"{group.benchmark}:instance_scale"]
    off.messages = buf.getvalue()
    return off


def _weak_from_primitives(off: Official, group: Group, rs: Any) -> None:
    """When the summarizer declines to score (too few models), recompute its numbers with its own
    per-file functions (compliance + run_start/run_stop + instance scale) so they can be compared."""
    start, stop, n, scale = float("inf"), float("-inf"), 0, None
    for run in group.runs:
        try:
            lines = rs._read_result_file(str(run.path), USAGE, RULESET)
            a, b = rs._query_run_start_stop(lines)
            scale = rs._query_instance_scale(lines)
        except ValueError as exc:
            print(f"{exc} in {run.path}")
            continue
        start, stop, n = min(start, a), max(stop, b), n + 1
        off.per_run_min[run.name] = (b - a) / 60000.0
    if n:
        off.score_min, off.number_of_models, off.instance_scale = (stop - start) / 60000.0, n, scale
