"""What the official tools of one ``hpcbench report`` cost: one Python per tool (the baseline: ``python -m
mlperf_logging.<tool>`` each, the summarizer and the package checker each importing scipy.stats and pandas)
vs the tool host (:mod:`hpcbench.report.toolhost`: one Python imports them once and forks each tool), on the
same submission folder, through the same :func:`hpcbench.report.official.start_tools` call, alternating.

    python -m benchmarks.report_tools RESULTS [--rounds 5]

RESULTS: a submission folder (``results/`` and ``systems/`` inside, e.g. the ``results`` folder of an
``hpcbench run --workdir W``), which is only read: the tools run on a copy of it, as the report runs them.
Prints, per method, the median CPU seconds of the tools' processes and the wall seconds until every tool
has finished, the ratios host / baseline, and the CPU, its flags and the load first. The verdicts of the
two methods must agree (exit 1 otherwise).
"""
from __future__ import annotations

import argparse
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.machine import describe, header
from hpcbench.report.official import start_tools


def _children_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def jobs_for(copy: Path, tmp: Path, usage: str, ruleset: str) -> dict[str, list[str]]:
    """The jobs the report starts for ``copy`` (see :func:`hpcbench.report.official._run_tools`)."""
    jobs = {"summarizer": ["mlperf_logging.result_summarizer", str(copy), usage, ruleset, "--csv", str(tmp / "s.csv")],
            "package": ["mlperf_logging.package_checker", str(copy), usage, ruleset,
                        "--log_output", str(tmp / "package_checker.log")]}
    for k, sysfile in enumerate(sorted((copy / "systems").glob("*.json"))):
        jobs[f"system:{sysfile.name}"] = ["mlperf_logging.system_desc_checker", str(sysfile), usage, ruleset,
                                          "--log_output", str(tmp / f"system_{k}.log")]
    return jobs


def once(root: Path, usage: str, ruleset: str, host: bool) -> tuple[float, float, dict[str, int | None]]:
    with tempfile.TemporaryDirectory(prefix="report-tools-") as name:
        tmp = Path(name)
        copy = tmp / root.name
        copy.mkdir()
        for sub in ("results", "systems"):
            if (root / sub).is_dir():
                shutil.copytree(root / sub, copy / sub)
        cpu0, t0 = _children_cpu_s(), time.perf_counter()
        got = start_tools(jobs_for(copy, tmp, usage, ruleset), tmp, host=host).wait()
        return _children_cpu_s() - cpu0, time.perf_counter() - t0, {k: rc for k, (_, rc, _) in got.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.report_tools", description=__doc__.split("\n\n")[0])
    ap.add_argument("results", type=Path, help="a submission folder (results/ and systems/ inside)")
    ap.add_argument("--usage", default="", help="hpc or training (default: from the folder's logs)")
    ap.add_argument("--ruleset", default="", help="e.g. 3.0.0 or 5.1.0 (default: from the folder's logs)")
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args(argv)
    usage, ruleset = a.usage, a.ruleset
    if not (usage and ruleset):
        from hpcbench.report.discover import discover

        groups = discover(a.results)
        if not groups:
            ap.error(f"{a.results}: no benchmark folder with MLPerf logs found")
        usage, ruleset = usage or groups[0].suite, ruleset or groups[0].ruleset
    print(header(describe()))
    print(f"folder {a.results} ({usage} {ruleset}), {a.rounds} rounds, baseline and host alternating")
    runs: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    verdicts: dict[bool, dict[str, int | None]] = {}
    for _ in range(a.rounds):
        for host in (False, True):
            cpu, wall, verdicts[host] = once(a.results, usage, ruleset, host)
            runs[host].append((cpu, wall))
    med = {h: (statistics.median(c for c, _ in r), statistics.median(w for _, w in r)) for h, r in runs.items()}
    for host, name in ((False, "baseline: one python per tool"), (True, "tool host: imported once, forked")):
        print(f"{name:34s} CPU {med[host][0]:6.2f} s  wall {med[host][1]:6.2f} s  exit statuses {verdicts[host]}")
    print(f"host / baseline: CPU {med[True][0] / med[False][0]:.2f}x  wall {med[True][1] / med[False][1]:.2f}x")
    if verdicts[True] != verdicts[False]:
        print("the two methods' exit statuses differ", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
