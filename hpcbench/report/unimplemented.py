"""Rule facts of benchmarks that the MLPerf rules list but no workload here implements yet.

The report still scores their results (another suite's logs, say): it needs the runs a result requires,
which a workload's record would otherwise say (:mod:`hpcbench.common.benchmark`). Only facts the report
uses are here; a benchmark moves out of this table when its workload and record arrive.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RuleFacts:
    suite: str
    ruleset: str
    required_runs: int  # mlperf_logging.benchmark_meta


UNIMPLEMENTED_BENCHMARKS: dict[str, RuleFacts] = {}
