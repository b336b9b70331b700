"""The benchmarks each suite's rulesets define, as the installed mlperf-logging knows them, and the rule facts
of those no workload here implements.

The official compliance checker keeps one folder per (suite, ruleset), ``<suite>_<X.Y.Z>`` (``hpc_3.0.0``,
``training_4.0.0``, ...), with a ``closed_<benchmark>.yaml`` per benchmark, and its ``closed_common.yaml``
names the benchmarks that round accepts (the CHECK on ``submission_benchmark``, whose POST loads
``closed_<benchmark>.yaml``). A benchmark of a ruleset is one both say: the list alone also names benchmarks
whose files a later package dropped (training 4.0.0 lists maskrcnn and rnnt), the files alone include
optimizer variants (closed_resnet_lars.yaml, closed_deepcam_lamb.yaml). Nothing here is a hand list: a newer
mlperf-logging brings its rounds and benchmarks with it.

The report needs a few facts of a benchmark whose results it scores without a workload here (another
submitter's logs, say): its suite, a default ruleset and the runs a result requires
(``mlperf_logging.benchmark_meta``), which a workload's record would otherwise say
(:mod:`hpcbench.common.benchmark`).
"""
from __future__ import annotations

import ast
import functools
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SUITES = ("hpc", "training")
#: runs of a benchmark whose run count the rules do not state (an out-of-tree workload's)
DEFAULT_REQUIRED_RUNS = 5
_FOLDER = re.compile(r"^(hpc|training)_(\d+\.\d+\.\d+)$")
_LIST = re.compile(r"in\s*(\[[^\]]*\])")


@dataclass(frozen=True)
class RuleFacts:
    suite: str
    ruleset: str  # the ruleset its logs are checked under unless the folder says otherwise
    required_runs: int  # mlperf_logging.benchmark_meta


def version_key(ruleset: str) -> tuple[int, ...]:
    """'4.0.0' -> (4, 0, 0), for ordering rulesets."""
    return tuple(int(x) for x in ruleset.split(".") if x.isdigit())


def checker_dir() -> Path | None:
    """The installed compliance checker's folder of rule files, or None without mlperf-logging."""
    spec = importlib.util.find_spec("mlperf_logging")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations))) / "compliance_checker"
    return folder if folder.is_dir() else None


def _accepted(folder: Path) -> set[str] | None:
    """The benchmark names closed_common.yaml's submission_benchmark check accepts (None: not readable)."""
    try:
        import yaml

        rules = yaml.safe_load((folder / "closed_common.yaml").read_text())
    except Exception:  # noqa: BLE001 - no PyYAML, no file or a malformed one: the list is not readable
        return None
    for item in rules if isinstance(rules, list) else []:
        key: Any = item.get("KEY") if isinstance(item, dict) else None
        if isinstance(key, dict) and key.get("NAME") == "submission_benchmark":
            m = _LIST.search(str(key.get("CHECK", "")))
            if m:
                try:
                    names = ast.literal_eval(m.group(1))
                except (ValueError, SyntaxError):
                    return None
                return {str(n) for n in names}
    return None


@functools.cache
def known_rulesets() -> dict[str, dict[str, frozenset[str]]]:
    """suite -> {ruleset -> its benchmarks}, oldest ruleset first, from the installed checker's folders
    (empty without mlperf-logging)."""
    out: dict[str, dict[str, frozenset[str]]] = {s: {} for s in SUITES}
    base = checker_dir()
    if base is None:
        return out
    found = []
    for folder in base.iterdir():
        m = _FOLDER.match(folder.name)
        if not m or not folder.is_dir():
            continue
        files = {p.name[len("closed_"):-len(".yaml")] for p in folder.glob("closed_*.yaml")} - {"common"}
        accepted = _accepted(folder)
        if accepted is None:  # no readable list: the benchmarks with both a closed and an open file
            benches = {b for b in files if (folder / f"open_{b}.yaml").exists()}
        else:
            benches = files & accepted
        if benches:
            found.append((m.group(1), m.group(2), frozenset(benches)))
    for suite, ruleset, benches in sorted(found, key=lambda f: (f[0], version_key(f[1]))):
        out[suite][ruleset] = benches
    return out


def rulesets_of(benchmark: str) -> dict[str, list[str]]:
    """suite -> the installed rulesets (oldest first) that define ``benchmark``; empty: no suite knows it."""
    out: dict[str, list[str]] = {}
    for suite, rulesets in known_rulesets().items():
        having = [r for r, benches in rulesets.items() if benchmark in benches]
        if having:
            out[suite] = having
    return out


def describe_installed() -> str:
    """'hpc 1.0.0-3.0.0, training 0.7.0-6.1.0' (what the installed mlperf-logging defines)."""
    parts = []
    for suite, rulesets in known_rulesets().items():
        if rulesets:
            names = list(rulesets)
            parts.append(f"{suite} {names[0]}" + (f"-{names[-1]}" if len(names) > 1 else ""))
    return ", ".join(parts) or "none: mlperf-logging is not installed"


def _result_counts(suite: str) -> dict[str, int]:
    try:
        from mlperf_logging.benchmark_meta import get_result_file_counts

        return dict(get_result_file_counts(suite))
    except (ImportError, ValueError):
        return {}


def rule_facts(benchmark: str) -> RuleFacts | None:
    """The suite, default ruleset and required runs of a benchmark the installed rules define (None: no
    suite's rules do). The default ruleset is the suite's own default (``common.suites``) when it defines
    the benchmark, else the newest that does. A name two suites define (none does up to mlperf-logging
    6.1) is taken as the first of :data:`SUITES` that does."""
    from hpcbench.common.suites import suite as suite_of

    having = rulesets_of(benchmark)
    for name in SUITES:
        if name in having:
            default = suite_of(name).default_ruleset
            ruleset = default if default in having[name] else having[name][-1]
            runs = _result_counts(name).get(benchmark, DEFAULT_REQUIRED_RUNS)
            return RuleFacts(name, ruleset, runs)
    return None
