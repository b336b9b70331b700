"""Weak-scaling throughput vs one big instance on the same ranks, measured with the real runner,
harness and `hpcbench report`.

    python benchmarks/report_weak_vs_strong.py [--ranks 4] [--repeats 2]

A: K instances x 1 rank trained concurrently (one mpiexec, `--instances K`): models/min = M'/TTTa.
B: 1 instance x K ranks (baseline, the strong-scaling way to use the same ranks): models/min = 1/TTT.
A and B alternate (A, B, A, B, ...) so machine contention hits both; prints each pair and the ratio
of the medians. The toy workload is the harness's test workload (tests/harness_toy.py), so this
measures the suite's machinery (instance split, per-instance logs, scoring), not a real model.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRAIN = ["-m", "hpcbench", "train", "tests.harness_toy:ToyWorkload", "--config", "tests/harness_configs/mini.toml",
         "--system-name", "bench", "--no-progress", "--ranks-per-node", "1"]


def _env() -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return env


def models_per_min(ranks: int, instances: int, work: Path) -> float:
    mpiexec = str(Path(sys.executable).parent / "mpiexec")
    subprocess.run([mpiexec, "-n", str(ranks), sys.executable, *TRAIN, "--instances", str(instances),
                    "--results", str(work)], cwd=ROOT, env=_env(), check=True, capture_output=True, timeout=600)
    subprocess.run([sys.executable, "-m", "hpcbench", "report", str(work), "--no-plots", "--no-official"],
                   cwd=ROOT, env=_env(), check=True, capture_output=True, timeout=300)
    (g,) = json.loads((work / "report" / "report.json").read_text())["groups"]
    s = g["score"]
    if s["mode"] == "weak":
        return s["models_per_min"]
    return 1.0 / (s["runs"][0]["time_to_solution_s"] / 60.0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    weak, strong = [], []
    with tempfile.TemporaryDirectory(prefix="hpcbench-bench-") as tmp:
        for i in range(args.repeats):
            a = models_per_min(args.ranks, args.ranks, Path(tmp) / f"weak{i}")
            b = models_per_min(args.ranks, 1, Path(tmp) / f"strong{i}")
            weak.append(a)
            strong.append(b)
            print(f"repeat {i}: {args.ranks} instances x 1 rank: {a:.2f} models/min | "
                  f"1 instance x {args.ranks} ranks: {b:.2f} models/min")
    ratio = statistics.median(weak) / statistics.median(strong)
    print(f"median models/min: weak {statistics.median(weak):.2f}, one instance {statistics.median(strong):.2f}; "
          f"ratio weak/one-instance = {ratio:.2f}x on {args.ranks} ranks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
