"""Several official mlperf-logging command-line tools from one Python that imported them once.

    python -m hpcbench.report.toolhost SPEC.json

SPEC names the jobs (``{"jobs": [{"name", "module", "args", "cwd", "output"}], "status": path}``). The host
imports the tools' modules (the result summarizer and the package checker each import scipy.stats and pandas
through their RCP checker: about 1.5-2 s of CPU per tool process), then forks one child per job. Each child
runs its tool exactly as ``python -m <module> <args>`` would (``runpy``, ``__main__``, the same ``sys.argv``),
in the job's folder, with its stdout and stderr in the job's output file, and exits with the tool's status;
the jobs run at once, each in its own process (a tool that configures logging, calls ``sys.exit`` or crashes
touches only its own child). As each ends, the host writes the exit statuses so far (negative: the signal
that ended it) to ``status``, whole and then renamed, so that a host stopped from outside (the caller kills
its process group at its time limit: it starts it in a session of its own) keeps those of the tools that
had finished.
"""
from __future__ import annotations

import importlib
import json
import os
import runpy
import sys
import traceback
from pathlib import Path
from typing import Any

from hpcbench.common.atomic import atomic_write_text

# what the tools import before their main() runs; imported once here, shared by every child
PRELOAD = ("mlperf_logging.result_summarizer.result_summarizer", "mlperf_logging.package_checker.package_checker",
           "mlperf_logging.system_desc_checker.system_desc_checker")


def _exit_code(code: Any) -> int:
    """``sys.exit(code)`` as the interpreter maps it to an exit status."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _child(job: dict[str, Any]) -> int:
    """In the forked child: the tool as ``python -m module args`` runs it; returns its exit status."""
    fd = os.open(job["output"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    os.chdir(job["cwd"])
    sys.argv = [job["module"], *job["args"]]
    try:
        runpy.run_module(job["module"], run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except BaseException:  # noqa: BLE001 - the tool crashed: its traceback is its output, as under python -m
        traceback.print_exc()
        code = 1
    return code


def run(spec: dict[str, Any]) -> dict[str, int]:
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - only a head start: a tool that cannot import fails in its child, in its words
            pass
    sys.stdout.flush()
    sys.stderr.flush()
    pids: dict[int, str] = {}
    for job in spec["jobs"]:
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = _child(job)
            except BaseException:  # noqa: BLE001 - before the tool ran (its output file, its folder): to the host's output
                traceback.print_exc()
            finally:
                try:
                    sys.stdout.flush()
                    sys.stderr.flush()
                finally:
                    os._exit(code)
        pids[pid] = job["name"]
    status: dict[str, int] = {}
    while pids:
        pid, st = os.wait()
        if pid in pids:
            status[pids.pop(pid)] = os.waitstatus_to_exitcode(st)
            atomic_write_text(spec["status"], json.dumps(status))  # so far: a host stopped later keeps these
    return status


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m hpcbench.report.toolhost SPEC.json", file=sys.stderr)
        return 2
    spec = json.loads(Path(args[0]).read_text())
    atomic_write_text(spec["status"], json.dumps(run(spec)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
