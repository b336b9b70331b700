"""The single-box gap of staging (issue 13, item 3): packed vs ``--method copy`` with no bandwidth cap,
before and after a change, in one session.

``python -m benchmarks.staging_gap --before REV --gib 0.5 --repeats 2 --rounds 2`` exports commit REV
(``git archive``) to a temporary folder and then runs the same benchmark command
``mpiexec -n 8 python -m benchmarks.staging_bench --gib G --repeats R --shard-mb 16`` alternately
with REV's code (before) and this checkout's (after), ``--rounds`` times each, on the same generated
data (``--keep``; each job still evicts the source from the page cache before every run). Prints every
job's per-run wall and CPU seconds (all ranks' processes, user + system: a rank waiting for a core is
not charged, so CPU is the steadier figure on a loaded machine) and, per side, the packed/copy ratios
and the after/before ratios. Both sides run this checkout's ``staging_bench.py`` and ``staging_common.py``
(only the staging code differs). Machine contention hits both sides alike (they alternate); the spread is printed.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


from benchmarks.machine import describe, header

ROOT = Path(__file__).resolve().parents[1]


def export(rev: str, where: Path) -> None:
    """The tree of commit ``rev`` in ``where`` (no .git: only its code runs)."""
    tar = subprocess.run(["git", "-C", str(ROOT), "archive", rev], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(where)], input=tar, check=True)


def one_job(tree: Path, a: argparse.Namespace) -> list[tuple[str, float, float]]:
    cmd = [a.mpiexec, "-n", str(a.ranks), sys.executable, "-m", "benchmarks.staging_bench",
           "--gib", str(a.gib), "--repeats", str(a.repeats), "--shard-mb", str(a.shard_mb), "--work", str(a.work),
           "--keep"]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=tree, env=os.environ | {"PYTHONPATH": str(tree)})
    if res.returncode:
        sys.exit(f"benchmark job failed ({res.returncode}) with {tree}: {' '.join(cmd)}\n{res.stderr[-3000:]}")
    runs = re.findall(r"run \d+\s+(\w+):\s+([\d.]+) s \(cpu ([\d.]+) s", res.stdout)
    return [(m, float(w), float(c)) for m, w, c in runs]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", required=True, help="git revision whose code is 'before'")
    ap.add_argument("--gib", type=float, default=0.5)
    ap.add_argument("--repeats", type=int, default=2, help="copy/packed pairs per job")
    ap.add_argument("--rounds", type=int, default=2, help="jobs per side (before, after alternate)")
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--shard-mb", type=float, default=16)
    ap.add_argument("--work", type=Path, default=Path("/tmp/hpcbench-staging-gap"))
    ap.add_argument("--budget-s", type=float, default=900.0, help="start no new round after this")
    ap.add_argument("--out", type=Path, default=None, help="also write the output here")
    ap.add_argument("--mpiexec", default=str(Path(sys.executable).with_name("mpiexec")))
    a = ap.parse_args()
    lines: list[str] = []

    def say(s: str) -> None:
        print(s, flush=True)
        lines.append(s)

    say(header(describe()))
    rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", a.before], check=True,
                         capture_output=True, text=True).stdout.strip()
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    say(f"command per job: mpiexec -n {a.ranks} python -m benchmarks.staging_bench --gib {a.gib:g} --repeats "
        f"{a.repeats} --shard-mb {a.shard_mb:g} (no cap: local disk + page cache, source evicted per run); "
        f"before = {rev}, after = this checkout ({head} + working tree); {a.rounds} jobs each, alternating")
    t0 = time.perf_counter()
    got: dict[str, list[tuple[str, float, float]]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory() as tmp:
        before = Path(tmp)
        export(a.before, before)
        # the same benchmark harness on both sides: only the staging code differs
        for name in ("staging_bench.py", "staging_common.py"):
            shutil.copy2(ROOT / "benchmarks" / name, before / "benchmarks" / name)
        for r in range(a.rounds):
            if r and time.perf_counter() - t0 > a.budget_s:
                say(f"time budget {a.budget_s:.0f} s spent: stopping after {r} rounds")
                break
            for side, tree in (("before", before), ("after", ROOT)):
                runs = one_job(tree, a)
                got[side] += runs
                say(f"round {r} {side:>6}: " + ", ".join(f"{m} {w:.2f}s (cpu {c:.1f}s)" for m, w, c in runs))
    stat: dict[tuple[str, str, str], float] = {}
    for side, runs in got.items():
        for m in ("copy", "packed"):
            for i, what in ((1, "wall"), (2, "cpu")):
                v = [r[i] for r in runs if r[0] == m]
                stat[side, m, what] = statistics.median(v)
                stat[side, m, what + "_min"] = min(v)
                say(f"{side:>6} {m:>6} {what:>4}: median {statistics.median(v):6.2f} s, min-max {min(v):.2f}-{max(v):.2f} "
                    f"({len(v)} runs)")
        say(f"{side:>6} packed/copy: wall medians {stat[side, 'packed', 'wall'] / stat[side, 'copy', 'wall']:.2f}, "
            f"wall best {stat[side, 'packed', 'wall_min'] / stat[side, 'copy', 'wall_min']:.2f}, "
            f"cpu medians {stat[side, 'packed', 'cpu'] / stat[side, 'copy', 'cpu']:.2f}")
    for what in ("wall", "cpu"):
        say(f"after/before (medians), {what}: packed {stat['after', 'packed', what] / stat['before', 'packed', what]:.2f}, "
            f"copy {stat['after', 'copy', what] / stat['before', 'copy', what]:.2f} (copy's code is unchanged: its "
            "ratio shows the session's drift)")
    say(f"elapsed {time.perf_counter() - t0:.0f} s")
    if a.out:
        a.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
