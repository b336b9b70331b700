"""One MLPerf log file -> :class:`RunLog`: the facts the scores are computed from."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common.errors import DataError

PREFIX = ":::MLLOG "
METRIC_KEYS = ("eval_error", "eval_accuracy")


@dataclass
class RunLog:
    path: Path
    benchmark: str | None = None
    division: str | None = None
    platform: str | None = None
    org: str | None = None
    run_start_ms: float | None = None
    run_stop_ms: float | None = None
    status: str | None = None
    seed: int | None = None
    nodes: int | None = None
    accelerators_per_node: int | None = None
    train_samples: int | None = None
    global_batch_size: int | None = None
    epochs: int = 0  # epoch_stop events, or epochs covered by block_stop events
    train_ms: float = 0.0  # time inside epochs/blocks (training only)
    staging_ms: float | None = None
    staging_start_ms: float | None = None
    metric_key: str | None = None
    metrics: list[tuple[int, float]] = field(default_factory=list)  # (epoch_num, value)
    tracked_throughput: list[float] = field(default_factory=list)  # samples/s from tracked_stats
    problems: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def complete(self) -> bool:
        return self.run_start_ms is not None and self.run_stop_ms is not None

    @property
    def converged(self) -> bool:
        return self.complete and self.status == "success"

    @property
    def time_to_solution_s(self) -> float | None:
        if not self.complete:
            return None
        return (self.run_stop_ms - self.run_start_ms) / 1000.0  # type: ignore[operator]

    @property
    def instance_scale(self) -> int | None:
        """S of the weak-scaling rules: accelerators of one instance (nodes on CPU-only systems)."""
        if self.nodes is None:
            return None
        return self.nodes * max(self.accelerators_per_node or 0, 1)

    @property
    def samples_per_s(self) -> float | None:
        """Training throughput of this instance: tracked_stats if logged, else samples / epoch time."""
        if self.tracked_throughput:
            return sum(self.tracked_throughput) / len(self.tracked_throughput)
        if self.train_samples and self.epochs and self.train_ms > 0:
            return self.train_samples * self.epochs / (self.train_ms / 1000.0)
        return None


def _records(path: Path) -> list[tuple[int, dict[str, Any]]]:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise DataError(f"cannot read result log {path}: {exc.strerror}") from None
    out = []
    for lineno, line in enumerate(text.splitlines(), 1):
        pos = line.find(PREFIX)
        if pos < 0:
            continue
        try:
            rec = json.loads(line[pos + len(PREFIX):])
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}:{lineno}: MLLOG line is not valid JSON ({exc.msg})") from None
        if not isinstance(rec, dict) or "key" not in rec or "time_ms" not in rec:
            raise DataError(f"{path}:{lineno}: MLLOG record needs 'key' and 'time_ms'")
        out.append((lineno, rec))
    return out


def parse_log(path: Path) -> RunLog:
    """Parse one result file. Structural problems (no run_stop, two run_starts) are recorded in
    ``problems`` rather than raised, so the report can show them; unreadable JSON raises DataError."""
    path = Path(path)
    log = RunLog(path=path)
    open_epoch: float | None = None
    open_staging: float | None = None
    scalar = {"submission_benchmark": "benchmark", "submission_division": "division",
              "submission_platform": "platform", "submission_org": "org", "seed": "seed",
              "number_of_nodes": "nodes", "accelerators_per_node": "accelerators_per_node",
              "train_samples": "train_samples", "global_batch_size": "global_batch_size"}
    records = _records(path)
    if not records:
        raise DataError(f"{path}: no ':::MLLOG' lines; is this an MLPerf result log?")
    for lineno, rec in records:
        key, value, t = rec["key"], rec.get("value"), float(rec["time_ms"])
        meta = rec.get("metadata") or {}
        if key in scalar:
            setattr(log, scalar[key], value)
        elif key == "run_start":
            if log.run_start_ms is not None:
                log.problems.append(f"line {lineno}: second run_start")
            log.run_start_ms = t
        elif key == "run_stop":
            if log.run_stop_ms is not None:
                log.problems.append(f"line {lineno}: second run_stop")
            log.run_stop_ms, log.status = t, meta.get("status")
        elif key in ("epoch_start", "block_start"):
            open_epoch = t
        elif key in ("epoch_stop", "block_stop"):
            if open_epoch is not None:
                log.train_ms += t - open_epoch
                open_epoch = None
            log.epochs += int(meta.get("epoch_count", 1)) if key == "block_stop" else 1
        elif key == "staging_start":
            open_staging = log.staging_start_ms = t
        elif key == "staging_stop" and open_staging is not None:
            log.staging_ms = t - open_staging
        elif key in METRIC_KEYS and isinstance(value, (int, float)):
            log.metric_key = key
            log.metrics.append((int(meta.get("epoch_num", -1)), float(value)))
        elif key == "tracked_stats" and isinstance(value, dict):
            tp = value.get("throughput", value.get("samples_per_second"))
            if isinstance(tp, (int, float)):
                log.tracked_throughput.append(float(tp))
    if log.run_start_ms is None:
        log.problems.append("no run_start")
    if log.run_stop_ms is None:
        log.problems.append("no run_stop (run did not finish)")
    elif log.status is None:
        log.problems.append("run_stop has no status")
    if log.benchmark is None:
        log.problems.append("no submission_benchmark")
    return log
