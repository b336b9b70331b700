"""The official mlperf-logging tools on the same files.

* the compliance checker on every log (in process, through the same ``make_checker``/``check_file``
  calls its command line makes, with the log's suite and ruleset: hpc 3.0.0 or e.g. training 5.1.0),
  with its messages captured;
* the result summarizer, the package checker and the system-description checker, each run as the
  command-line tool (``python -m mlperf_logging.<tool>``; forked from one :mod:`.toolhost` that imported them
  once, where the OS can fork) once per (usage, ruleset) of the folder's benchmarks, on a temporary copy of the submission folder's ``results/`` and ``systems/`` (the summarizer
  and the package checker each on its own copy, so they can run at once): in a closed folder both run the
  RCP checker with ``set_scaling=True``, which deletes and rewrites ``scaling.json`` in each benchmark
  folder, so on the input itself they would change the results and each other's figures (the summarizer
  reads the file before its own RCP check rewrites it, so on a fresh copy it uses the shipped one). The
  input is left byte-identical; paths in the tools' output are mapped back to the input's. The "official"
  figures of the report are only what the summarizer wrote out, taken from the row whose ``details_url``
  names the benchmark's system file (``.../systems/<system folder>.json``, unique per system folder;
  ``system_name`` is not: NVIDIA's four HPC v3.0 system files all say "eos"); when it produced nothing for
  a folder the report says so, with what it printed.
"""
from __future__ import annotations

import contextlib
import csv
import io
import json
import logging
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcbench.common.mllog import RULESET, USAGE

from .discover import Group
from .scaling import SCALING_FILE, ScalingError, read_scaling

PACKAGE_OK = "PACKAGE CHECKER FOUND NO ERRORS"
SYSTEM_OK = "System description checker passed"
TOOL_TIMEOUT_S = 600


@dataclass
class Official:
    """What the official tools said about one benchmark folder."""

    compliance: dict[str, tuple[bool, str]] = field(default_factory=dict)  # file name -> (passed, output)
    summarizer_ran: bool = False
    produced: bool = False  # the summarizer wrote a score for this folder
    score_min: float | None = None  # strong: olympic mean; weak: time_to_train_all (TTTa)
    number_of_models: int | None = None  # weak
    instance_scale: int | None = None  # weak
    messages: str = ""  # the summarizer's lines about this folder
    why_none: str = ""  # why the summarizer produced nothing, in its words where it gave any
    crashed: bool = False  # the summarizer exited non-zero or was stopped: it judged nothing
    scaling_factor: float | None = None  # strong: the factor the summarizer applied (its detailed CSV's rcp_scaling_factor)
    # strong, closed: what the package checker's RCP check left in its copy of the folder, where that differs from
    # what was shipped (rcp_rewrote): the factor it wrote, or None when it removed the file
    rcp_rewrote: bool = False
    rcp_factor: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"compliance": {k: v[0] for k, v in self.compliance.items()},
                "compliance_failures": {k: v[1] for k, v in self.compliance.items() if not v[0]},
                "summarizer_ran": self.summarizer_ran, "produced": self.produced,
                "score_min": self.score_min, "number_of_models": self.number_of_models,
                "instance_scale": self.instance_scale, "messages": self.messages, "why_none": self.why_none,
                "crashed": self.crashed, "scaling_factor": self.scaling_factor,
                "rcp_check_rewrote_scaling_json": self.rcp_rewrote, "rcp_check_scaling_factor": self.rcp_factor}


@dataclass
class ToolRun:
    """One run of an official command-line tool."""

    command: list[str]
    ok: bool | None  # None: the tool could not be run
    output: str

    def to_dict(self) -> dict[str, Any]:
        return {"command": " ".join(self.command), "ok": self.ok, "output": self.output}

    def verdict(self) -> str:
        if self.ok is None:
            return "not run: " + self.output.strip().splitlines()[-1] if self.output.strip() else "not run"
        return "passed" if self.ok else "FAILED"


@dataclass
class SubmissionChecks:
    """The package and system-description checkers on the whole submission folder."""

    root: Path
    package: ToolRun | None = None
    systems: dict[str, ToolRun] = field(default_factory=dict)  # systems/<name>.json -> run

    def to_dict(self) -> dict[str, Any]:
        return {"root": str(self.root), "ran_on": COPY_NOTE,
                "package_checker": None if self.package is None else self.package.to_dict(),
                "system_desc_checker": {k: v.to_dict() for k, v in self.systems.items()}}


COPY_NOTE = ("a temporary copy of the submission folder's results/ and systems/ (one for the summarizer, one for the "
             "package checker): their RCP check deletes and rewrites scaling.json in closed benchmark folders; "
             "the input is not changed, the figures use the scaling.json it ships, and paths in the tools' output "
             "name the input's files")


@contextlib.contextmanager
def _captured() -> Any:
    """Collect what the compliance checker prints and logs (print() and the root logger)."""
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


def check_compliance(path: Path, usage: str = USAGE, ruleset: str = RULESET) -> tuple[bool, str]:
    """The official compliance checker (default hpc 3.0.0), in process."""
    from mlperf_logging.compliance_checker import mlp_compliance

    with _captured() as buf:
        checker = mlp_compliance.make_checker(usage=usage, ruleset=ruleset, quiet=False, werror=False)
        try:
            ok = bool(checker.check_file(str(path), f"{usage}_{ruleset}/common.yaml"))
        except Exception as exc:  # noqa: BLE001 - the checker raises on some malformed logs
            print(f"checker raised {type(exc).__name__}: {exc}")
            ok = False
    return ok, buf.getvalue()


def compliance_reasons(output: str) -> list[str]:
    """The compliance checker's reasons for a rejection, from its captured output (its WARNING/ERROR
    lines and an exception it raised), without its closing FAILED line."""
    return [ln.strip() for ln in output.splitlines()
            if (ln.startswith(("WARNING", "ERROR")) and "FAILED" not in ln) or ln.startswith("checker raised")]


def rejection(run: Any, passed: bool, output: str) -> str | None:
    """Why the official checker rejects the log ``run`` (a :class:`~.logs.RunLog`) as a log, or None.

    A complete, readable log that the checker fails only on the target check is a run that did not
    converge (the rules count it as a failed run), not a rejected log; so is a run that did not finish
    (no run_stop) or a killed writer's unreadable file, which the report already names as such. Any
    other failure of a complete log rejects it, and so does any failure of a log that our own parse
    would count."""
    if passed:
        return None
    reasons = compliance_reasons(output)
    if run.converged:  # before official_rejection is set: what our parse alone would count
        return "; ".join(reasons) or "rejected without a reason printed"
    if not run.complete or run.bad_lines:
        return None
    metric = run.target.key if run.target is not None else run.metric_key
    others = [r for r in reasons if not (metric and f"Failed checks for {metric} " in r)]
    if reasons and not others:
        return None
    return "; ".join(others) or "rejected without a reason printed"


def available() -> bool:
    try:
        import mlperf_logging  # noqa: F401
    except ImportError:
        return False
    return True


ToolResults = dict[str, tuple[list[str], int | None, str]]  # name -> (command, exit status or None, output)


def _start(args: list[str], cwd: Path) -> tuple[list[str], subprocess.Popen[str]]:
    cmd = [sys.executable, "-m", *args]
    return cmd, subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _finish(cmd: list[str], proc: subprocess.Popen[str]) -> tuple[int | None, str]:
    try:
        out, _ = proc.communicate(timeout=TOOL_TIMEOUT_S)
        return proc.returncode, out
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        return None, out + f"\n(stopped after {TOOL_TIMEOUT_S} s)"


class RunningTools:
    """The official tools of one report, started at once (:func:`start_tools`): :meth:`wait` for what they
    said; :meth:`stop` (also on leaving a ``with`` block) ends any still running, e.g. when the report itself
    stops early (Ctrl-C reaches the report, not the tool host: it runs in a session of its own)."""

    def __init__(self, jobs: dict[str, list[str]], cwd: Path, host: bool) -> None:
        self.cmds = {name: [sys.executable, "-m", *args] for name, args in jobs.items()}
        self.procs: dict[str, tuple[list[str], subprocess.Popen[str]]] = {}
        self.host: subprocess.Popen[str] | None = None
        if not host:
            self.procs = {name: _start(args, cwd) for name, args in jobs.items()}
            return
        self.outputs = {name: cwd / f"tool-{k}.out" for k, name in enumerate(jobs)}
        self.status_file, spec_file = cwd / "tools-status.json", cwd / "tools-spec.json"
        spec_file.write_text(json.dumps({"status": str(self.status_file), "jobs": [
            {"name": name, "module": args[0], "args": args[1:], "cwd": str(cwd), "output": str(self.outputs[name])}
            for name, args in jobs.items()]}))
        self.host = subprocess.Popen([sys.executable, "-m", "hpcbench.report.toolhost", str(spec_file)], cwd=cwd,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True)

    def __enter__(self) -> "RunningTools":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """End every tool still running (nothing to do after :meth:`wait`)."""
        if self.host is not None and self.host.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.host.pid, signal.SIGKILL)  # the host and every tool it forked
            self.host.communicate()
        for _, proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.communicate()

    def wait(self) -> ToolResults:
        """name -> (command, exit status or None, output), each tool given at most :data:`TOOL_TIMEOUT_S`."""
        if self.host is None:
            return {name: (cmd, *_finish(cmd, proc)) for name, (cmd, proc) in self.procs.items()}
        stopped = False
        try:
            said, _ = self.host.communicate(timeout=TOOL_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            stopped = True
            self.stop()
            said = ""
        try:
            status = json.loads(self.status_file.read_text()) if self.status_file.exists() else {}
        except (OSError, ValueError):
            status = {}
        results: ToolResults = {}
        for name, cmd in self.cmds.items():
            rc = status.get(name)
            try:
                out, ran = self.outputs[name].read_text(errors="replace"), True
            except OSError as exc:  # the tool never ran: why is in the host's own output
                out, ran = f"(no output from the tool: {exc})\n", False
            if rc is None:
                out += said + (f"\n(stopped after {TOOL_TIMEOUT_S} s)" if stopped else
                               f"\n(the tool host ended with status {self.host.returncode} before this tool's status)")
            elif not ran:
                out += said
            results[name] = (cmd, rc, out)
        return results


def start_tools(jobs: dict[str, list[str]], cwd: Path, host: bool = hasattr(os, "fork")) -> RunningTools:
    """Start the official tools ``jobs`` (name -> [module, *args], each as ``python -m module args``) at once in
    ``cwd``. ``host`` (where the OS can fork): one :mod:`.toolhost` process imports the tools once and forks
    each (the summarizer and the package checker otherwise import scipy.stats and pandas each, 1.5-2 s of CPU
    apiece); else one Python per tool. The commands reported are the ``python -m`` ones either way."""
    return RunningTools(jobs, cwd, host)


def _num(text: str | None) -> float | None:
    if text is None or not text.strip():
        return None
    try:
        x = float(text)
    except ValueError:
        return None
    return None if math.isnan(x) else x


def _summary_rows(csv_text: str) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """The summarizer's CSV holds a strong-scaling table and then a weak-scaling one, each with its
    own header row (it appends the second); (strong rows, weak rows)."""
    strong: list[dict[str, str]] = []
    weak: list[dict[str, str]] = []
    header: list[str] | None = None
    for row in csv.reader(io.StringIO(csv_text)):
        if row and row[0] == "division":
            header = row
            continue
        if header is None or not row:
            continue
        rec = dict(zip(header, row))
        (weak if any(h.endswith(":time_to_train_all") for h in header) else strong).append(rec)
    return strong, weak


def run_tools(root: Path, groups: list[Group]) -> tuple[dict[int, Official], SubmissionChecks]:
    """Run the summarizer, the package checker and the system-description checker (concurrently) on
    the submission folder ``root`` once per (usage, ruleset) of ``groups``, and the compliance checker
    on every log of ``groups`` with its group's suite and ruleset."""
    rulesets = sorted({(g.suite, g.ruleset) for g in groups}) or [(USAGE, RULESET)]
    offs: dict[int, Official] = {}
    checks = SubmissionChecks(root)
    for usage, ruleset in rulesets:
        mine = [g for g in groups if (g.suite, g.ruleset) == (usage, ruleset)]
        got, sub = _run_tools(root, mine, usage, ruleset)
        offs.update(got)
        tag = "" if len(rulesets) == 1 else f"[{usage} {ruleset}] "
        if checks.package is None:
            checks.package = sub.package
        elif sub.package is not None:  # one submission folder, two suites: both verdicts, joined
            checks.package = ToolRun(checks.package.command + ["&&", *sub.package.command],
                                     checks.package.ok and sub.package.ok,
                                     checks.package.output + "\n" + tag + sub.package.output)
        for name, run in sub.systems.items():
            checks.systems[tag + name] = run
    return offs, checks


def _copy_submission(root: Path, dest: Path) -> Path:
    """What the official tools read of ``root`` (``results/`` and ``systems/``) copied under ``dest/<root name>``,
    links followed (a linked log becomes a file: nothing the tools write can reach the input)."""
    copy = dest / root.name
    copy.mkdir(parents=True)
    for sub in ("results", "systems"):
        if (root / sub).is_dir():
            shutil.copytree(root / sub, copy / sub, symlinks=False)
    return copy


def _unmap(text: str, copies: list[Path], root: Path) -> str:
    for copy in copies:
        text = text.replace(str(copy), str(root))
    return text


def _run_tools(root: Path, groups: list[Group], usage: str, ruleset: str) -> tuple[dict[int, Official], SubmissionChecks]:
    checks = SubmissionChecks(root)
    offs = {id(g): Official() for g in groups}
    with tempfile.TemporaryDirectory(prefix="hpcbench-official-") as tmp_name:
        tmp = Path(tmp_name)
        summary_csv = tmp / "summary.csv"
        try:  # the summarizer and the package checker each on its own copy: both rewrite scaling.json
            sum_root, pkg_root = _copy_submission(root, tmp / "summarizer"), _copy_submission(root, tmp / "package")
        except (OSError, shutil.Error) as exc:
            why = f"could not copy {root}/results and systems to run the official tools on (the input is never " \
                  f"given to them: they rewrite scaling.json): {exc}"
            checks.package = ToolRun(["mlperf_logging.package_checker", str(root), usage, ruleset], None, why)
            for g in groups:
                _fill(offs[id(g)], g, [], None, why)
            return offs, checks
        copies = [sum_root, pkg_root]
        jobs = {"summarizer": ["mlperf_logging.result_summarizer", str(sum_root), usage, ruleset,
                               "--csv", str(summary_csv)],
                "package": ["mlperf_logging.package_checker", str(pkg_root), usage, ruleset,
                            "--log_output", str(tmp / "package_checker.log")]}
        for k, sysfile in enumerate(sorted((sum_root / "systems").glob("*.json"))):
            jobs[f"system:{sysfile.name}"] = ["mlperf_logging.system_desc_checker", str(sysfile), usage, ruleset,
                                              "--log_output", str(tmp / f"system_{k}.log")]
        with start_tools(jobs, tmp) as tools:
            for g in groups:  # in process, on the input (read only), while the tools run
                for run in g.runs:
                    offs[id(g)].compliance[run.name] = check_compliance(run.path, usage, ruleset)
                for path, _ in g.skipped:
                    offs[id(g)].compliance[path.name] = check_compliance(path, usage, ruleset)
            said = tools.wait()
        done = {name: ([_unmap(a, copies, root) for a in cmd], rc, _unmap(out, copies, root))
                for name, (cmd, rc, out) in said.items()}
        cmd, rc, out = done.pop("package")
        checks.package = ToolRun(cmd, rc == 0 and PACKAGE_OK in out, out)
        for name, (cmd, rc, out) in done.items():
            if name.startswith("system:"):
                checks.systems[name.split(":", 1)[1]] = ToolRun(cmd, rc == 0 and SYSTEM_OK in out, out)
        cmd, rc, out = done["summarizer"]
        csv_text = summary_csv.read_text() if summary_csv.exists() else ""
        detailed = tmp / "summary_detailed.csv"
        detailed_text = detailed.read_text() if detailed.exists() else ""
        for g in groups:  # what the package checker's RCP check left in its copy, against what was shipped
            if g.mode == "strong" and Path(g.folder).is_relative_to(root):
                _rcp_scaling(offs[id(g)], Path(g.folder), pkg_root / Path(g.folder).relative_to(root))
    strong, weak = _summary_rows(csv_text)
    details = _summary_rows(detailed_text)[0]
    for g in groups:
        _fill(offs[id(g)], g, strong if g.mode == "strong" else weak, rc, out, details)
    return offs, checks


def _scaling_bytes(folder: Path) -> bytes | None:
    f = folder / SCALING_FILE
    try:
        return f.read_bytes() if f.is_file() else None
    except OSError:
        return None


def _factor(folder: Path) -> float | None:
    try:
        return read_scaling(folder)
    except ScalingError:
        return None


def _rcp_scaling(off: Official, shipped: Path, copy: Path) -> None:
    """Whether the package checker's RCP check (``set_scaling=True``) left another scaling.json in its copy of
    the benchmark folder than the one shipped, and the factor it wrote (None: it removed the file)."""
    before, after = _scaling_bytes(shipped), _scaling_bytes(copy)
    if before == after:
        return
    if before is not None and after is not None and _factor(shipped) is not None \
            and _factor(shipped) == _factor(copy):
        return  # the same factor, written out again
    off.rcp_rewrote = True
    off.rcp_factor = None if after is None else _factor(copy)


def _row_for(g: Group, rows: list[dict[str, str]]) -> tuple[dict[str, str] | None, str]:
    """The summarizer's row for ``g``'s system folder, or None and why. A row's ``details_url`` ends in
    ``/systems/<system folder>.json`` (``result_summarizer._details_url``), one per system folder, and its division
    is that system file's; ``system_name`` may be shared (NVIDIA's HPC v3.0 "eos" x4, Fujitsu's closed and open
    "fugaku_A64FX_tensorflow"), so it is used only where a summarizer writes no details_url, and then only if
    one row is left."""
    desc = g.system_desc or {}
    division = desc.get("division") if isinstance(desc.get("division"), str) else None
    suffix = f"/systems/{g.system}.json"
    if any(r.get("details_url") for r in rows):
        mine = [r for r in rows if (r.get("details_url") or "").endswith(suffix)]
        how = f"whose details_url names systems/{g.system}.json"
    else:
        name = str(desc.get("system_name", g.system))
        mine = [r for r in rows if r.get("system") == name]
        how = f"for system {name!r} (it wrote no details_url)"
        if len(mine) > 1 and desc.get("number_of_nodes") is not None:
            mine = [r for r in mine if r.get("number_of_nodes") == str(desc["number_of_nodes"])] or mine
    if division is not None:
        mine = [r for r in mine if r.get("division") == division]
        how += f" in the {division} division"
    if not mine:
        return None, f"no row {how} in its output"
    if len(mine) > 1 and any(r.get(g.benchmark) != mine[0].get(g.benchmark) for r in mine[1:]):
        return None, f"{len(mine)} rows {how} in its output, with different figures: none taken"
    return mine[0], ""


def _fill(off: Official, g: Group, rows: list[dict[str, str]], rc: int | None, out: str,
          details: list[dict[str, str]] | None = None) -> None:
    off.summarizer_ran = True
    off.crashed = rc != 0
    folder = str(g.folder)
    tag = f"{g.system}/{g.benchmark}"  # its CRITICAL/NOTICE lines name system/benchmark, not the mode
    mine = [ln for ln in out.splitlines()
            if folder + "/" in ln or (tag in ln and ("weak scaling" in ln) == (g.mode == "weak"))]
    off.messages = "\n".join(mine)
    row, no_row = _row_for(g, rows)
    if g.mode == "strong":
        off.score_min = _num(row.get(g.benchmark)) if row else None
        detail = _row_for(g, details or [])[0] if off.score_min is not None else None
        off.scaling_factor = _num(detail.get(f"{g.benchmark}:rcp_scaling_factor")) if detail else None
    elif row:
        off.score_min = _num(row.get(f"{g.benchmark}:time_to_train_all"))
        models, scale = _num(row.get(f"{g.benchmark}:number_of_models")), _num(row.get(f"{g.benchmark}:instance_scale"))
        off.number_of_models = None if models is None else int(models)
        off.instance_scale = None if scale is None else int(scale)
    off.produced = off.score_min is not None
    if not off.produced:
        said = [ln for ln in mine if "CRITICAL" in ln or "ERROR" in ln]
        if rc != 0:
            how = f"exited with status {rc}" if rc is not None else "was stopped or could not be run"
            said.append(f"the summarizer {how}: " + (out.strip().splitlines() or ["no output"])[-1])
        elif row is None:
            said.append(no_row)
        off.why_none = "; ".join(dict.fromkeys(said)) or "it printed nothing for this folder"
