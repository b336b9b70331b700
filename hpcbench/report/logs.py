"""One MLPerf log file -> :class:`RunLog`: the facts the scores are computed from."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcbench.common.errors import DataError

from .targets import Target, target_for

PREFIX = ":::MLLOG "
METRIC_KEYS = ("eval_error", "eval_accuracy")
EVAL_KEYS = (*METRIC_KEYS, "eval_start", "eval_stop")
MAX_RUN_S = 7 * 24 * 3600.0  # a timed run longer than a week is taken as a broken clock or an edited log
#: records of the run itself: after the first, a setting logged again with another value is not a contradiction
#: of the run's settings (tracked_stats and evaluations change by design)
RUN_KEYS = frozenset({"run_start", "epoch_start", "block_start", "eval_start", "tracked_stats", *METRIC_KEYS})
#: records of training and evaluation: logged after run_stop (NVIDIA's and HPE's HPC v3.0 CosmoFlow keep training
#: after it) they are not part of the timed run and are not used (the rules time the run from run_start to run_stop)
#: (tracked_stats after run_stop is used when it follows an epoch that ended by run_stop and none is open:
#: dlrm_dcnv2 logs it 1 ms after run_stop)
TIMED_KEYS = frozenset({"epoch_start", "epoch_stop", "block_start", "block_stop", "tracked_stats", *EVAL_KEYS})
#: where hpcbench's logger writes the submission_* records from (``MLPerfLogger.submission``): a log whose first
#: submission_* record names it was written by hpcbench (``RunLog.by_hpcbench``)
OWN_LOGGER = "common/mllog.py"
SUBMISSION_KEYS = ("submission_benchmark", "submission_org", "submission_division")
#: logged counts read as integers (a string such as "one" is named and not used)
INTEGER_KEYS = frozenset({"seed", "number_of_nodes", "accelerators_per_node", "train_samples", "eval_samples",
                          "global_batch_size"})
MIN_UNIX_MS = 1e12  # time_ms is Unix time in milliseconds: below this (2001-09-09) a log was written in seconds


@dataclass(frozen=True)
class Eval:
    key: str  # eval_error or eval_accuracy
    epoch: float  # epoch_num as logged: whole epochs, a fraction of one (dlrm_dcnv2) or samples (bert)
    value: float
    time_ms: float


@dataclass
class RunLog:
    path: Path
    benchmark: str | None = None
    division: str | None = None
    platform: str | None = None
    org: str | None = None
    init_stop_ms: float | None = None
    run_start_ms: float | None = None
    run_stop_ms: float | None = None
    status: str | None = None
    seed: int | None = None
    seed_at: tuple[str, object] | None = None  # (file, lineno) of the seed record's metadata: the official seed check's key
    nodes: int | None = None
    accelerators_per_node: int | None = None
    train_samples: int | None = None
    eval_samples: int | None = None
    global_batch_size: int | None = None
    epochs: int = 0  # epoch_stop events, or (a log without them) epochs covered by block_stop events
    train_ms: float = 0.0  # time inside epochs/blocks (training only)
    epoch_ms: list[float] = field(default_factory=list)  # duration of each epoch (each block when no epoch is logged)
    after_stop: int = 0  # training/evaluation records logged after run_stop: not used (see TIMED_KEYS)
    staging_ms: float | None = None
    staging_start_ms: float | None = None
    metric_key: str | None = None
    metrics: list[Eval] = field(default_factory=list)
    tracked_throughput: list[tuple[float, float]] = field(default_factory=list)  # (samples/s, epoch ms)
    settings: dict[str, Any] = field(default_factory=dict)  # hpcbench_* choices, e.g. precision: "bf16"
    by_hpcbench: bool = False  # its first submission_* record was written by hpcbench's logger (OWN_LOGGER)
    values: dict[str, Any] = field(default_factory=dict)  # every POINT_IN_TIME key's first logged value
    problems: list[str] = field(default_factory=list)
    bad_lines: list[str] = field(default_factory=list)  # MLLOG lines that do not parse (the official parser rejects the file)
    # why the log is not scored: our own checks (duplicated runs, non-finite or absurd times) and the
    # official compliance checker's reasons when it rejects a log for more than a missed target
    rejections: list[str] = field(default_factory=list)
    official_rejection: str | None = None

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def complete(self) -> bool:
        return self.run_start_ms is not None and self.run_stop_ms is not None

    @property
    def rejected(self) -> bool:
        """Not scored: our checks or the official compliance checker reject the log itself (a run
        that merely missed the target is not rejected: it is a non-converged run)."""
        return bool(self.rejections) or self.official_rejection is not None

    @property
    def timed(self) -> bool:
        """run_start and run_stop logged once each, at finite, sane times: usable on a time axis."""
        return self.complete and not self.rejections

    @property
    def target(self) -> Target | None:
        return target_for(self.benchmark, self.division)

    @property
    def target_met(self) -> bool | None:
        """At least one evaluation meets the benchmark's target (the official checker's definition);
        None when the benchmark has no known target."""
        tgt = self.target
        if tgt is None:
            return None
        return any(tgt.met(e.value) for e in self.metrics if e.key == tgt.key)

    @property
    def converged(self) -> bool:
        """Counted as a converged model, as the official summarizer counts it: a complete log (run_start
        and run_stop) whose evaluations reach the target as the official checker defines it, every
        MLLOG line parsing. The checker does not read run_stop's status, so neither does this: a log
        that says aborted but met the target counts (and is flagged as contradicting itself); with no
        known target, status=success decides."""
        if not self.complete or self.bad_lines or self.rejected:
            return False
        met = self.target_met
        return met if met is not None else self.status == "success"

    @property
    def outcome(self) -> str:
        """One word for tables and plots: success, aborted, target_missed, unreadable, rejected, incomplete."""
        if self.bad_lines:
            return "unreadable"
        if self.rejected:
            return "rejected"
        if not self.complete:
            return "incomplete"
        if self.converged:
            return "success"
        if self.status != "success":
            return self.status or "no_status"
        return "target_missed"

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
        return int(self.nodes) * max(int(self.accelerators_per_node or 0), 1)

    @property
    def samples_per_s(self) -> float | None:
        """Training throughput: total samples / total time in epochs. With tracked_stats the samples
        of an epoch are its logged rate x its logged duration; else train_samples per epoch."""
        timed = [(tp, ms) for tp, ms in self.tracked_throughput if ms > 0]
        if timed:
            return sum(tp * ms for tp, ms in timed) / sum(ms for _, ms in timed)
        if self.train_samples and self.epochs and self.train_ms > 0:
            return self.train_samples * self.epochs / (self.train_ms / 1000.0)
        return None


class NotAResultLog(DataError):
    """The file is not an MLPerf log at all (no MLLOG lines, unreadable)."""


def _records(path: Path) -> tuple[list[tuple[int, dict[str, Any]]], list[str]]:
    """(parsed records, descriptions of MLLOG lines that do not parse). A killed instance leaves a
    truncated last line: it is named as such rather than stopping the report."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise NotAResultLog(f"cannot read result log {path}: {exc.strerror}") from None
    out, bad = [], []
    lines = text.splitlines()
    for lineno, line in enumerate(lines, 1):
        pos = line.rfind(PREFIX)  # the last one: two writers interleaved on a line, as the official parser reads it
        if pos < 0:
            continue
        try:
            rec = json.loads(line[pos + len(PREFIX):])
        except json.JSONDecodeError as exc:
            last = lineno == len(lines) and not text.endswith("\n")
            bad.append(f"line {lineno}: " + ("truncated last line (the writer was killed mid-line?)" if last
                                             else f"MLLOG line is not valid JSON ({exc.msg})"))
            continue
        if not isinstance(rec, dict) or "key" not in rec or "time_ms" not in rec:
            bad.append(f"line {lineno}: MLLOG record needs 'key' and 'time_ms'")
            continue
        t = rec["time_ms"]
        # float(), as the official parser reads it: a number, or a string holding one ("1.7e12")
        if isinstance(t, bool) or not isinstance(t, (int, float, str)):
            bad.append(f"line {lineno}: time_ms of {rec['key']!r} is not a number ({t!r})")
            continue
        try:
            rec["time_ms"] = float(t)
        except ValueError:
            bad.append(f"line {lineno}: time_ms of {rec['key']!r} is not a number ({t!r})")
            continue
        except OverflowError:  # an integer beyond the float range (a crafted or corrupted log)
            bad.append(f"line {lineno}: time_ms of {rec['key']!r} is beyond the float range")
            continue
        out.append((lineno, rec))
    return out, bad


def parse_log(path: Path) -> RunLog:
    """Parse one result file. Structural problems (no run_stop, two run_starts, lines that do not
    parse) are recorded in ``problems``/``bad_lines`` so the report can show them; a file with no
    MLLOG line at all raises :class:`NotAResultLog`."""
    path = Path(path)
    log = RunLog(path=path)
    open_epoch: float | None = None
    open_staging: float | None = None
    scalar = {"submission_benchmark": "benchmark", "submission_division": "division",
              "submission_platform": "platform", "submission_org": "org", "seed": "seed",
              "number_of_nodes": "nodes", "accelerators_per_node": "accelerators_per_node",
              "train_samples": "train_samples", "eval_samples": "eval_samples",
              "global_batch_size": "global_batch_size"}
    records, log.bad_lines = _records(path)
    if not records:
        raise NotAResultLog(f"{path}: no readable ':::MLLOG' lines; is this an MLPerf result log?")
    evals: list[tuple[int, str, float]] = []
    late: list[tuple[int, str, float]] = []  # training/evaluation records after run_stop: not used
    late_metrics: list[tuple[int, Eval]] = []  # the evaluations among them, to tell whether one met the target
    # what counts is the log up to run_stop (the last one logged with a finite time, as run_stop_ms ends up)
    stop_ms = next((float(rec["time_ms"]) for _, rec in reversed(records)
                    if rec["key"] == "run_stop" and math.isfinite(float(rec["time_ms"]))), math.inf)
    epoch_runs: list[float] = []  # epoch_start/epoch_stop intervals
    block_runs: list[float] = []  # block_start/block_stop intervals
    block_epochs = 0  # epochs that block_stop records cover: counted only in a log that logs no epoch_stop
    epoch_stops = 0
    open_block: float | None = None
    late_interval = False  # the last epoch_stop/block_stop seen was after run_stop (its tracked_stats too)
    running = False  # a record of the run itself seen (its start, an epoch, an evaluation): settings come before
    source_seen = False  # the first submission_* record with metadata decided by_hpcbench
    for lineno, rec in records:
        key, value, t = rec["key"], rec.get("value"), float(rec["time_ms"])
        if not isinstance(key, str):
            log.problems.append(f"line {lineno}: key {key!r} is not a string (record ignored)")
            continue
        if not source_seen and key in SUBMISSION_KEYS and isinstance(rec.get("metadata"), dict):
            source_seen = True
            log.by_hpcbench = str(rec["metadata"].get("file", "")).replace("\\", "/").endswith(OWN_LOGGER)
        meta = rec.get("metadata")
        if meta is None:
            meta = {}
        elif not isinstance(meta, dict):
            log.problems.append(f"line {lineno}: metadata of {key!r} is {type(meta).__name__} {meta!r}, expected an "
                                "object (its fields are not read)")
            meta = {}
        running = running or key in RUN_KEYS
        if not math.isfinite(t):
            log.rejections.append(f"line {lineno}: {key} at time_ms={t} (not a finite time)")
            continue  # a non-finite time is not used in any figure
        if key in ("epoch_stop", "block_stop"):
            late_interval = t > stop_ms
        closed = not late_interval and open_epoch is None and (open_block is None or epoch_stops > 0)
        if key in TIMED_KEYS and t > stop_ms and (key != "tracked_stats" or not closed):
            late.append((lineno, key, t))
            if key in METRIC_KEYS and isinstance(value, (int, float)) and not isinstance(value, bool):
                late_metrics.append((lineno, Eval(key, _number(meta.get("epoch_num"), -1.0), float(value), t)))
            continue
        if key in EVAL_KEYS:
            evals.append((lineno, key, t))
        if rec.get("event_type") == "POINT_IN_TIME":
            if (not running and key in log.values and log.values[key] != value):  # the run's settings, twice
                log.problems.append(f"line {lineno}: {key} logged again with another value ({log.values[key]!r}, "
                                    f"now {value!r}): the run's settings contradict themselves")
            log.values.setdefault(key, value)
        if key == "seed":
            log.seed_at = (str(meta.get("file")), meta.get("lineno"))
        seed = _int_string(value) if key == "seed" and isinstance(value, str) else None
        if seed is not None:  # "1696481967" (NVIDIA openfold): the official seed checker reads it with int()
            log.seed = seed
        elif key in scalar:
            if key in INTEGER_KEYS and not _is_integer(value):
                log.problems.append(f"line {lineno}: {key} is {value!r}, expected an integer (not used)")
            else:
                setattr(log, scalar[key], int(value) if key in INTEGER_KEYS else value)
        elif key == "cache_clear":  # also as an interval start (Fujitsu's HPC CosmoFlow logs it so)
            log.values.setdefault(key, value)
        elif key == "init_stop":
            log.init_stop_ms = t
        elif key == "run_start":
            if log.run_start_ms is not None:
                log.rejections.append(f"line {lineno}: second run_start (two runs in one file?)")
            log.run_start_ms = t
        elif key == "run_stop":
            if log.run_stop_ms is not None:
                log.rejections.append(f"line {lineno}: second run_stop (two runs in one file?)")
            status = meta.get("status")  # the checker's rule compares it lower-cased ("SUCCESS" passes)
            log.run_stop_ms, log.status = t, status.lower() if isinstance(status, str) else None
        elif key == "epoch_start":
            open_epoch = t
        elif key == "block_start":
            open_block = t
        elif key == "epoch_stop":  # epochs nested in blocks (NVIDIA resnet) are counted once, as epochs
            epoch_stops += 1
            if open_epoch is not None:
                epoch_runs.append(t - open_epoch)
                open_epoch = None
        elif key == "block_stop":
            block_epochs += int(_number(meta.get("epoch_count"), 1.0))
            if open_block is not None:
                block_runs.append(t - open_block)
                open_block = None
        elif key == "staging_start":
            open_staging = log.staging_start_ms = t
        elif key == "staging_stop" and open_staging is not None:
            log.staging_ms = t - open_staging
        elif key in METRIC_KEYS and isinstance(value, (int, float)):
            log.metric_key = key
            log.metrics.append(Eval(key, _number(meta.get("epoch_num"), -1.0), float(value), t))
        elif key.startswith("hpcbench_") and isinstance(value, dict) and "value" in value:
            log.settings[key.removeprefix("hpcbench_")] = value["value"]
        elif key == "tracked_stats" and isinstance(value, dict):
            tp = value.get("throughput", value.get("samples_per_second"))
            if isinstance(tp, (int, float)):  # logged after the epoch_stop (block_stop) it describes
                last = epoch_runs or block_runs
                log.tracked_throughput.append((float(tp), last[-1] if last else 0.0))
    # a log that logs epochs counts them; blocks (bert, dlrm_dcnv2: evaluation intervals) only when it logs none
    log.epoch_ms = epoch_runs if epoch_stops else block_runs
    log.epochs = epoch_stops if epoch_stops else block_epochs
    log.train_ms = sum(log.epoch_ms)
    log.after_stop = len(late)
    if log.run_start_ms is None:
        log.problems.append("no run_start")
    if log.run_stop_ms is None:
        log.problems.append("no run_stop (run did not finish)")
    elif log.status is None:
        log.problems.append("run_stop has no status")
    if log.benchmark is None:
        log.problems.append("no submission_benchmark")
    if log.init_stop_ms is not None and log.run_start_ms is not None and log.run_start_ms < log.init_stop_ms:
        log.problems.append(f"run_start is {(log.init_stop_ms - log.run_start_ms) / 1000:.3f} s before init_stop "
                            "(the timed run must start after initialization ends)")
    if log.complete and log.run_stop_ms < log.run_start_ms:  # type: ignore[operator]
        log.problems.append("run_stop is before run_start")
        log.rejections.append(f"negative time to solution: run_stop is "
                              f"{(log.run_start_ms - log.run_stop_ms) / 1000:.3f} s before run_start")  # type: ignore[operator]
    elif log.complete and log.run_stop_ms - log.run_start_ms > MAX_RUN_S * 1000:  # type: ignore[operator]
        log.rejections.append(f"time to solution of {(log.run_stop_ms - log.run_start_ms) / 1000:.4g} s is beyond "  # type: ignore[operator]
                              f"a week ({MAX_RUN_S:.0f} s): not a believable run")
    if log.run_start_ms is not None:
        _outside_run(log, [(n, k) for n, k, t in evals if t < log.run_start_ms], "before run_start")
        if log.run_start_ms < MIN_UNIX_MS:
            log.rejections.append(f"run_start at time_ms={log.run_start_ms:.0f} is not a Unix time in milliseconds "
                                  f"(before {MIN_UNIX_MS:.0f}, 2001-09-09): times logged in seconds?")
    if late:
        _after_stop(log, late, late_metrics)
    if log.status == "success" and log.target_met is False:
        tgt = log.target
        best = [e.value for e in log.metrics if tgt is not None and e.key == tgt.key]
        log.problems.append(f"run_stop says success but no evaluation met the target {tgt.describe() if tgt else ''}"
                            + (f" (last {best[-1]:g})" if best else " (no evaluation logged)"))
    if log.complete and log.status is not None and log.status != "success" and log.target_met:
        log.problems.append(f"run_stop says {log.status or 'nothing'} but an evaluation met the target: counted, as the "
                            "official summarizer counts it (it does not read the status)")
    log.problems.extend(log.bad_lines)
    return log


def _outside_run(log: RunLog, found: list[tuple[int, str]], where: str) -> None:
    """Reject ``log`` for evaluation records (line, key) logged outside its timed run (``where`` says how)."""
    if found:
        n, k = found[0]
        more = f" (and {len(found) - 1} more evaluation record(s))" if len(found) > 1 else ""
        log.rejections.append(f"line {n}: {k} is {where}{more}: evaluations belong to the timed run")


def _after_stop(log: RunLog, late: list[tuple[int, str, float]], late_metrics: list[tuple[int, Eval]]) -> None:
    """Records of training and evaluation after run_stop are not part of the timed run: they were left out of
    every figure; noted, and the log rejected when the evaluation that met the target is among them (none
    inside the run did), or when run_stop says success with evaluations after it and none inside that met the
    target. The official checker reads evaluations wherever they are; the rules time the run to run_stop."""
    tgt = log.target

    def qualifies(e: Eval) -> bool:
        return tgt.met(e.value) if tgt is not None else True  # no known target: any evaluation stands for it

    def ok(e: Eval) -> bool:
        return tgt is None or e.key == tgt.key

    inside = any(qualifies(e) for e in log.metrics if ok(e))
    late_evals = [(n, k) for n, k, _ in late if k in EVAL_KEYS]
    met_late = [(n, e) for n, e in late_metrics if ok(e) and qualifies(e)]
    keys = sorted({k for _, k, _ in late})
    log.problems.append(f"{len(late)} record(s) after run_stop not used (line {late[0][0]} on: {', '.join(keys)}): "
                        "the timed run ends at run_stop")
    if inside:
        return
    if met_late:
        n, e = met_late[0]
        log.rejections.append(f"line {n}: {e.key} {e.value:g}, the first evaluation that meets the target, is after "
                              "run_stop and none inside the timed run met it: the evaluation that met the target "
                              "must lie inside the timed run")
    elif late_evals and log.status == "success":
        n, k = late_evals[0]
        more = f" (and {len(late_evals) - 1} more evaluation record(s))" if len(late_evals) > 1 else ""
        log.rejections.append(f"line {n}: {k} is after run_stop{more}, which says success with no evaluation "
                              "inside the timed run that met the target")


def _int_string(value: str) -> int | None:
    """A seed logged as a string that Python's int() reads ("1696481967"), as the official seed checker reads it."""
    try:
        return int(value)
    except ValueError:
        return None


def _is_integer(value: Any) -> bool:
    """An integer as logged (a whole float such as 4.0 too), not a bool, a string or a fraction."""
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and math.isfinite(value) and value.is_integer())


def _number(value: Any, default: float) -> float:
    """A metadata number as logged (a fraction stays a fraction); ``default`` when absent or not a number."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default
