"""The one place that knows where each workload lives. Everything else about a workload is its record
(:class:`hpcbench.common.benchmark.Benchmark`, the ``BENCHMARK`` of its package's ``__init__``), which is
light to import: reading records never imports torch, torch-geometric, DALI or a workload's model code.
The workload class, its dataset layout, its converter and its synthetic-data writer are imported only when
asked for."""
from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcbench.common.benchmark import Benchmark
from hpcbench.common.errors import ConfigError, HpcbenchError
from hpcbench.report import unimplemented

if TYPE_CHECKING:  # pragma: no cover
    from hpcbench.common.data.layout import FileLayout
    from hpcbench.common.data.datagen import Datagen
    from hpcbench.common.workload import Workload

#: ``hpcbench convert FORMAT``: (src, out, trust_pickle, progress, workers) -> samples converted per split
Converter = Callable[[Path, Path, bool, bool, int, bool], dict[str, int]]  # ..., workers, replace

#: workload name -> its package (whose ``BENCHMARK`` is the record)
WORKLOADS: dict[str, str] = {
    "cosmoflow": "hpcbench.workloads.cosmoflow",
    "deepcam": "hpcbench.workloads.deepcam",
    "oc20": "hpcbench.workloads.opencatalyst",
    "openfold": "hpcbench.workloads.openfold_mlperf",
    "dlrm_dcnv2": "hpcbench.workloads.mlperf_training.dlrm_dcnv2",
    "bert": "hpcbench.workloads.mlperf_training.bert",
    "llama31_8b": "hpcbench.workloads.mlperf_training.llama31_8b",
    "unet3d": "hpcbench.workloads.mlperf_training.unet3d",
    "resnet": "hpcbench.workloads.mlperf_training.resnet",
}
ALIASES = {"opencatalyst": "oc20", "oc": "oc20"}


def _record(name: str, package: str) -> Benchmark:
    record = importlib.import_module(package).BENCHMARK
    if record.name != name:
        raise HpcbenchError(f"{package}.BENCHMARK is named {record.name!r}, registered as {name!r}")
    return record


RECORDS: dict[str, Benchmark] = {name: _record(name, package) for name, package in WORKLOADS.items()}
_BY_BENCHMARK: dict[str, Benchmark] = {r.benchmark: r for r in RECORDS.values()}

#: runs per benchmark key of the workloads here (same table as mlperf_logging.benchmark_meta); another
#: benchmark's come from the installed mlperf-logging (:mod:`hpcbench.report.unimplemented`)
REQUIRED_RUNS: dict[str, int] = {b: r.required_runs for b, r in _BY_BENCHMARK.items()}
#: for a benchmark the rules do not list (an out-of-tree workload)
DEFAULT_REQUIRED_RUNS = unimplemented.DEFAULT_REQUIRED_RUNS


class UnknownBenchmark(HpcbenchError):
    """A benchmark no workload here implements and no ruleset of the installed mlperf-logging defines."""

    def __init__(self, benchmark: str) -> None:
        self.benchmark = benchmark
        super().__init__(f"benchmark {benchmark!r} is known to no suite: no workload here implements it and no "
                         f"ruleset of the installed mlperf-logging ({unimplemented.describe_installed()}) defines "
                         "it, so no MLPerf rules check or score its logs")


def names() -> list[str]:
    return list(WORKLOADS)


def entry(name: str) -> Benchmark:
    """The record of workload ``name`` (or an alias)."""
    key = ALIASES.get(name, name)
    if key not in RECORDS:
        raise HpcbenchError(f"unknown workload '{name}'; valid workloads: {', '.join(WORKLOADS)}")
    return RECORDS[key]


def record_of(benchmark: str) -> Benchmark | None:
    """The record of the workload that implements MLPerf benchmark ``benchmark``, if one does."""
    return _BY_BENCHMARK.get(benchmark)


def _part(name: str, attr: str) -> str:
    """``module:attr`` of a light part (``layout``, ``workload``, ``converter``, ``datagen``), as an absolute module."""
    record = entry(name)
    return f"{WORKLOADS[record.name]}.{getattr(record, attr)}"


def _load(name: str, attr: str) -> Any:
    """The object a ``module:attr`` light part names, imported now."""
    module_name, _, obj = _part(name, attr).partition(":")
    return getattr(importlib.import_module(module_name), obj)


def get(name: str) -> "type[Workload]":
    """The workload class, imported now. ``package.module:Class`` names an out-of-tree workload (whose
    class carries its own record)."""
    target = name if ":" in name else _part(name, "workload")
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        own = exc.name is not None and (module_name == exc.name or module_name.startswith(exc.name + "."))
        if own and ":" in name:  # an out-of-tree workload named on the command line: its module is not there
            raise ConfigError(f"workload '{name}': cannot import module '{module_name}' ({exc}); give "
                              "package.module:Class of a module on PYTHONPATH, or a registered workload name") from None
        if exc.name == module_name:
            raise HpcbenchError(f"workload '{name}' is registered but not implemented yet ({module_name} is missing)") from None
        raise
    if not hasattr(module, attr):
        raise ConfigError(f"workload '{name}': module '{module_name}' has no '{attr}'")
    return getattr(module, attr)


def datagen(name: str) -> "type[Datagen]":
    """The class whose classmethods write workload ``name``'s synthetic data (``add_datagen_args``,
    ``embedded_datagen_args``, ``datagen``): the record's light ``datagen`` part, a base of the workload class
    that imports no model code (``hpcbench datagen`` and ``hpcbench run`` start without the model's imports:
    torch costs a 2-core box ~2.5 s of CPU per process), else the workload class (``package.module:Class``
    of an out-of-tree workload, or a record without the part)."""
    if ":" not in name:
        record = entry(name)
        if record.datagen:
            return _load(record.name, "datagen")
    return get(name)


def required_runs(benchmark: str) -> int:
    """Runs (strong) or converged models (weak) the rules require for a result of ``benchmark``."""
    if benchmark in REQUIRED_RUNS:
        return REQUIRED_RUNS[benchmark]
    facts = unimplemented.rule_facts(benchmark)
    return facts.required_runs if facts is not None else DEFAULT_REQUIRED_RUNS


def known_suite(benchmark: str) -> str | None:
    """The suite whose rules define ``benchmark``: its workload's record, else the installed mlperf-logging's
    rule files (every benchmark of every round it knows); None when neither does."""
    record = record_of(benchmark)
    if record is not None:
        return record.suite
    facts = unimplemented.rule_facts(benchmark)
    return facts.suite if facts is not None else None


def suite_of(benchmark: str) -> tuple[str, str]:
    """(suite, default ruleset) of a benchmark key: its workload's record, else the installed mlperf-logging's
    rules (the suite's default ruleset where it defines the benchmark, else the newest that does). Raises
    :class:`UnknownBenchmark` for a benchmark neither knows (never a guessed suite). The report checks a
    folder under one ruleset per suite, chosen from these defaults, ``--ruleset`` and the folder's
    benchmarks (:mod:`hpcbench.report.discover`)."""
    record = record_of(benchmark)
    if record is not None:
        return record.suite, record.ruleset
    facts = unimplemented.rule_facts(benchmark)
    if facts is None:
        raise UnknownBenchmark(benchmark)
    return facts.suite, facts.ruleset


def epoch_reporting(benchmark: str) -> str:
    """How ``epoch_num`` counts progress in a log of ``benchmark``: ``epoch``, ``fraction`` or ``samples``."""
    record = record_of(benchmark)
    return record.epoch_reporting if record else "epoch"


def max_dropped_runs(benchmark: str) -> int:
    """Fastest and slowest runs dropped by the olympic mean of ``benchmark`` (and the most non-converged
    runs a valid score allows)."""
    record = record_of(benchmark)
    return record.dropped_runs if record else 1


def converter_names() -> list[str]:
    """Formats ``hpcbench convert`` accepts: the workloads that have a converter."""
    return [name for name, r in RECORDS.items() if r.converter]


def converter(name: str) -> Converter:
    """The converter of format ``name``, imported now."""
    record = RECORDS.get(ALIASES.get(name, name))
    if record is None or not record.converter:
        raise ConfigError(f"unknown format {name!r}; expected one of {', '.join(converter_names())}")
    return _load(record.name, "converter")


def dataset_names() -> list[str]:
    """Names ``pack``/``stage --dataset`` accept: every workload's dataset, and ``generic``."""
    return [*WORKLOADS, "generic"]


def layout(name: str) -> "FileLayout":
    """The file layout of a dataset, from its workload's data module (``generic``: every file)."""
    from hpcbench.common.data.layout import GENERIC

    if name == GENERIC.name:
        return GENERIC
    if ALIASES.get(name, name) not in RECORDS:
        raise ConfigError(f"--dataset: unknown dataset {name!r}; expected one of {', '.join(dataset_names())}")
    return importlib.import_module(_part(name, "layout")).LAYOUT


def unimplemented_benchmarks() -> dict[str, "unimplemented.RuleFacts"]:
    """Every benchmark the installed rules define that no workload here implements, with its rule facts (suite,
    default ruleset, required runs: :func:`hpcbench.report.unimplemented.rule_facts`)."""
    names = {b for rulesets in unimplemented.known_rulesets().values() for benches in rulesets.values() for b in benches}
    out = {}
    for b in sorted(names):
        facts = unimplemented.rule_facts(b)
        if record_of(b) is None and facts is not None:
            out[b] = facts
    return out
