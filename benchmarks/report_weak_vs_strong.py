"""Weak-scaling throughput vs one big instance on the same ranks, measured with the real runner,
harness and `hpcbench report`.

    python -m benchmarks.report_weak_vs_strong [--ranks 4] [--repeats 2]

A: K instances x 1 rank trained concurrently (one mpiexec, `--instances K`): models/min = M'/TTTa.
B: 1 instance x K ranks (baseline, the strong-scaling way to use the same ranks): models/min = 1/TTT.
A and B alternate (A, B, A, B, ...) so machine contention hits both; prints each pair and the ratio
of the medians. The toy workload is the harness's test workload (tests/harness_toy.py), so this
measures the suite's machinery (instance split, per-instance logs, scoring), not a real model.
Each run is printed when it ends; ``--budget-s`` bounds the whole run (each subprocess gets the
time left as its timeout; repeats that do not fit are skipped and said).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.budget import Budget, add_budget_argument, mpiexec, say
from benchmarks.machine import describe, header

ROOT = Path(__file__).resolve().parents[1]
TRAIN = ["-m", "hpcbench", "train", "tests.harness_toy:ToyWorkload", "--config", "tests/harness_configs/mini.toml",
         "--system-name", "bench", "--no-progress", "--ranks-per-node", "1"]


def _env() -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return env


def models_per_min(ranks: int, instances: int, work: Path, budget: Budget) -> float:
    subprocess.run([mpiexec(), "-n", str(ranks), sys.executable, *TRAIN, "--instances", str(instances),
                    "--results", str(work)], cwd=ROOT, env=_env(), check=True, capture_output=True,
                   timeout=budget.timeout(600))
    subprocess.run([sys.executable, "-m", "hpcbench", "report", str(work), "--no-plots", "--no-official"],
                   cwd=ROOT, env=_env(), check=True, capture_output=True, timeout=budget.timeout(300))
    (g,) = json.loads((work / "report" / "report.json").read_text())["groups"]
    s = g["score"]
    if s["mode"] == "weak":
        return s["models_per_min"]
    return 1.0 / (s["runs"][0]["time_to_solution_s"] / 60.0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=2, help="A/B pairs (at most)")
    add_budget_argument(ap, 300.0)
    args = ap.parse_args()
    budget = Budget(args.budget_s)
    say(header(describe()))
    say(f"A: {args.ranks} instances x 1 rank (weak) vs B: 1 instance x {args.ranks} ranks (baseline); "
        f"up to {args.repeats} pairs, --budget-s {args.budget_s:g}")
    weak, strong = [], []
    pair_s = 0.0
    with tempfile.TemporaryDirectory(prefix="hpcbench-bench-") as tmp:
        for i in range(args.repeats):
            if i and budget.left() < pair_s:
                budget.skip(f"pairs {i + 1}-{args.repeats} of {args.repeats} (one pair took {pair_s:.0f} s)")
                break
            t = time.perf_counter()
            try:
                a = models_per_min(args.ranks, args.ranks, Path(tmp) / f"weak{i}", budget)
                say(f"repeat {i}: {args.ranks} instances x 1 rank: {a:.2f} models/min")
                b = models_per_min(args.ranks, 1, Path(tmp) / f"strong{i}", budget)
                say(f"repeat {i}: 1 instance x {args.ranks} ranks: {b:.2f} models/min")
            except subprocess.TimeoutExpired as exc:
                budget.skip(f"pair {i + 1} (a subprocess ran out of the budget: {' '.join(map(str, exc.cmd[:6]))} ...)")
                break
            weak.append(a)
            strong.append(b)
            pair_s = time.perf_counter() - t
    if not weak:
        say("no complete pair measured within the budget: no ratio")
        budget.done()
        return 1
    ratio = statistics.median(weak) / statistics.median(strong)
    say(f"median models/min of {len(weak)} pairs: weak {statistics.median(weak):.2f}, one instance "
        f"{statistics.median(strong):.2f}; ratio weak/one-instance = {ratio:.2f}x on {args.ranks} ranks")
    budget.done()
    return 0


if __name__ == "__main__":
    sys.exit(main())
