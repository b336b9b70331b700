"""MLPerf logging: the one wrapper over ``mlperf_logging.mllog`` that the whole suite uses.

One log per instance: rank 0 of the instance writes ``result_<instance>.txt``; other ranks get a
logger whose calls do nothing, so call sites need no rank checks. Each :class:`MLPerfLogger` owns
its own ``logging.Logger`` (no global state), so several can coexist in one process (tests).
"""
from __future__ import annotations

import itertools
import logging
import re
import sys
from pathlib import Path
from typing import Any

from mlperf_logging.mllog.mllog import MLLogger
from mlperf_logging.mllog import constants

from .system import SystemDescription
from .errors import DataError

_ids = itertools.count()

#: the ruleset of the hpc suite's logs (a training-suite workload names its own: common.suites)
RULESET = "3.0.0"
USAGE = "hpc"


#: keys the official RCP (convergence) checker finds by substring anywhere in a ``:::MLLOG`` line, not by the
#: line's key (``mlperf_logging.rcp_checker.read_submission_file``): a line that merely mentions
#: ``eval_error`` is read as an eval line and its ``metadata["epoch_num"]`` looked up (KeyError), one that
#: mentions ``global_batch_size`` overrides the batch size the reference curve is chosen by
RCP_SUBSTRINGS = ("eval_error", "eval_accuracy", "global_batch_size", "train_samples", "submission_benchmark",
                  "run_stop")
#: the keys hpcbench adds to the official ones (besides ``hpcbench_*``)
OWN_KEYS = ("steps_per_epoch",)


def is_own_key(key: str) -> bool:
    """A key that hpcbench logs beside the official ones (the checkers ignore it)."""
    return key.startswith("hpcbench_") or key in OWN_KEYS


def hide_from_rcp(line: str) -> str:
    """``line`` (an MLLOG line of one of hpcbench's own keys) with every name in :data:`RCP_SUBSTRINGS`
    spelled with ``\\u005f`` for its underscores. Those names can only stand inside JSON strings, where the
    escape decodes to the same text: every JSON reader (the compliance checker, the report) sees the same
    line, and the RCP checker's substring tests no longer mistake it for an eval or batch-size line."""
    for name in RCP_SUBSTRINGS:
        line = line.replace(name, name.replace("_", "\\u005f"))
    return line


class _OwnLines(logging.Filter):
    """Rewrites hpcbench's own lines with :func:`hide_from_rcp` before a handler writes them."""

    _key = re.compile(r'"key": "([^"]*)"')

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        m = self._key.search(msg)
        if m and is_own_key(m.group(1)):
            record.msg, record.args = hide_from_rcp(msg), ()
        return True


def result_filename(instance: int) -> str:
    return f"result_{instance}.txt"


class _LogFile(logging.FileHandler):
    """The log file's handler: a failed write (a full disk, a lost mount) is an error of the run, raised to the
    caller naming the file, not printed by logging's handleError while the run trains on without its log."""

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 - logging's name
        exc = sys.exc_info()[1]
        if isinstance(exc, OSError):
            self.failed = True  # said once: closing the file later does not say it again
            raise DataError(f"cannot write the MLPerf log {self.baseFilename}: {exc.strerror or exc}; the log is "
                            "incomplete (no run_stop): free space and run again") from None
        super().handleError(record)


class MLPerfLogger:
    """Writes ``:::MLLOG`` lines for one instance. Disabled loggers accept calls and write nothing. A line that
    cannot be written raises :class:`~hpcbench.common.errors.DataError` naming the file."""

    def __init__(self, path: Path | None, echo: bool = False, root_dir: str | None = None) -> None:
        self.path = Path(path) if path is not None else None
        self.enabled = path is not None
        self._handlers: list[logging.Handler] = []
        self._logger: MLLogger | None = None
        if not self.enabled:
            return
        assert self.path is not None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        logger = logging.getLogger(f"hpcbench.mllog.{next(_ids)}")
        logger.propagate = False
        logger.setLevel(logging.INFO)
        logger.addFilter(_OwnLines())
        fh = _LogFile(self.path, mode="a")
        fh.setLevel(logging.INFO)
        logger.addHandler(fh)
        self._handlers.append(fh)
        if echo:
            sh = logging.StreamHandler(sys.stdout)
            logger.addHandler(sh)
            self._handlers.append(sh)
        self._logger = MLLogger(logger=logger, default_stack_offset=2, root_dir=root_dir)
        self._ml_logger = logger

    # raw events ---------------------------------------------------------------------------
    def event(self, key: str, value: Any = None, metadata: dict[str, Any] | None = None, time_ms: float | None = None) -> None:
        if self._logger is not None:
            self._logger.event(key=key, value=value, metadata=metadata, time_ms=time_ms)

    def start(self, key: str, value: Any = None, metadata: dict[str, Any] | None = None, time_ms: float | None = None) -> None:
        if self._logger is not None:
            self._logger.start(key=key, value=value, metadata=metadata, time_ms=time_ms)

    def end(self, key: str, value: Any = None, metadata: dict[str, Any] | None = None, time_ms: float | None = None) -> None:
        if self._logger is not None:
            self._logger.end(key=key, value=value, metadata=metadata, time_ms=time_ms)

    # groups of required keys --------------------------------------------------------------
    def submission(self, system: SystemDescription, benchmark: str, division: str) -> None:
        """The submission_* keys plus number_of_nodes and accelerators_per_node."""
        self.event(constants.SUBMISSION_ORG, system.submitter)
        self.event(constants.SUBMISSION_PLATFORM, system.system_name)
        self.event(constants.SUBMISSION_DIVISION, division)
        self.event(constants.SUBMISSION_STATUS, system.status)
        self.event(constants.SUBMISSION_BENCHMARK, benchmark)
        self.event("number_of_nodes", system.number_of_nodes)
        self.event("accelerators_per_node", system.accelerators_per_node)

    def hyperparameters(self, params: dict[str, Any]) -> None:
        for key, value in params.items():
            self.event(key, value)

    def close(self) -> None:
        failed: OSError | None = None
        for handler in self._handlers:
            try:
                handler.flush()
                handler.close()
            except OSError as exc:  # the last buffered lines did not reach the disk
                if not getattr(handler, "failed", False):
                    failed = failed or exc
            self._ml_logger.removeHandler(handler)
        self._handlers.clear()
        self._logger = None
        if failed is not None:
            raise DataError(f"cannot write the MLPerf log {self.path}: {failed.strerror or failed}; the log is "
                            "incomplete: free space and run again")


def check_log(path: Path, ruleset: str = RULESET, usage: str = USAGE) -> tuple[bool, str]:
    """Run the official compliance checker on one log (``usage`` hpc or training); (passed, its output)."""
    import subprocess
    import tempfile

    # the checker writes compliance_checker.log into its working directory: keep that out of the
    # user's folders
    with tempfile.TemporaryDirectory(prefix="hpcbench-checker-") as scratch:
        proc = subprocess.run(
            [sys.executable, "-m", "mlperf_logging.compliance_checker", str(Path(path).resolve()),
             "--usage", usage, "--ruleset", ruleset],
            capture_output=True,
            text=True,
            cwd=scratch,
        )
    output = proc.stdout + proc.stderr
    return proc.returncode == 0 and "SUCCESS" in output, output
