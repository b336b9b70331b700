"""Before/after check of the shared data layer: each workload's loader throughput and its training
step rate, measured with the same command on the same machine.

Only APIs that predate the data layer are used (``Workload.load_config``, ``train_loader(DataShard)``,
``hpcbench datagen`` and ``hpcbench train``), so the same script measures an older checkout:

    PYTHONPATH=OLD_TREE python -m benchmarks.data_layer --label before --work /tmp/dl
    python -m benchmarks.data_layer --label after --work /tmp/dl --compare /tmp/dl/before.json

Loader: one training epoch of the ``mini`` preset's loader on one rank (no model), best of
``--repeats``. Step rate: ``hpcbench train W --config mini`` for ``--epochs`` epochs on one rank, the
logged ``tracked_stats`` throughput (samples/s of the whole training epoch, data waits included).
Prints as it goes; ``--budget-s`` seconds bound the whole run (subprocesses get the time left as
their timeout; a workload not reached or cut off is reported as skipped, also in the JSON).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.budget import Budget, add_budget_argument, say
from benchmarks.machine import describe, header

DATAGEN = {  # the embedded mini datasets (oc20 smaller: EMT relaxation dominates its datagen)
    "cosmoflow": ["--samples", "4096", "--val-samples", "512", "--size", "16", "--plain", "--quiet"],
    "deepcam": ["--samples", "384", "--eval-samples", "64", "--height", "96", "--width", "144"],
    "oc20": ["--train", "160", "--val", "32", "--size", "2,2,3", "--metals", "Cu,Pt", "--adsorbates", "O,H,N,C",
             "--relax-steps", "30", "--rattle", "0.018", "--cutoff", "4", "--max-neighbors", "12", "--no-progress"],
}


def _run(args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """``hpcbench ARGS``; a timeout raises ``subprocess.TimeoutExpired`` (the caller says what was cut off)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run([sys.executable, "-m", "hpcbench", *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


def dataset(work: Path, label: str, name: str, timeout: float = 900) -> Path:
    out = work / label / name
    if not (out / ".done").exists():
        shutil.rmtree(out, ignore_errors=True)  # a datagen cut off (no .done) left part of it
        proc = _run(["datagen", name, "--out", str(out), "--workers", "2", *DATAGEN[name]], timeout)
        if proc.returncode:
            raise SystemExit(f"datagen {name} failed:\n{proc.stderr[-2000:]}")
        (out / ".done").write_text("")
    return out


def loader_rate(name: str, root: Path, repeats: int) -> dict[str, float]:
    import torch

    from hpcbench.common.workload import DataShard
    from hpcbench import registry

    cls = registry.get(name)
    wl = cls(cls.load_config("mini", [f"data.root={root}"]))
    gbs = wl.cfg.train.global_batch_size
    loader = wl.train_loader(DataShard(rank=0, size=1, seed=1, local_batch_size=gbs, device=torch.device("cpu")))
    best = 0.0
    for epoch in range(1, repeats + 1):
        loader.set_epoch(epoch)
        t0, n = time.perf_counter(), 0
        for batch in loader:
            n += wl.batch_size(batch)
        best = max(best, n / (time.perf_counter() - t0))
    return {"loader_samples_per_s": best}


def step_rate(name: str, root: Path, epochs: int, timeout: float = 1200) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        proc = _run(["train", name, "--config", "mini", "--data", str(root), "--results", tmp, "--no-progress",
                     "--set", f"train.max_epochs={epochs}", "--set", "train.eval_every=100"], timeout)
        rates = []
        for log in Path(tmp).rglob("result_*.txt"):
            for line in log.read_text().splitlines():
                if '"key": "tracked_stats"' in line:
                    rates.append(json.loads(line.split(":::MLLOG ", 1)[1])["value"]["throughput"])
        if not rates:
            raise SystemExit(f"train {name} logged no throughput (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    return {"train_samples_per_s_per_epoch": rates, "train_samples_per_s_best": max(rates)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--label", required=True, help="name of this measurement (before/after)")
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "hpcbench-data-layer")
    ap.add_argument("--workloads", default="cosmoflow,deepcam,oc20")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=2)
    add_budget_argument(ap, 1500.0)
    ap.add_argument("--budget", dest="budget_s", type=float, help=argparse.SUPPRESS)  # the old name
    ap.add_argument("--compare", type=Path, help="an earlier run's JSON: print after/before ratios")
    ap.add_argument("--json", type=Path, help="write results here (default: WORK/LABEL.json)")
    a = ap.parse_args()
    budget = Budget(a.budget_s)

    import hpcbench

    info = describe()
    print(header(info), flush=True)
    print(f"# code: {Path(hpcbench.__file__).resolve().parents[1]}  label: {a.label}", flush=True)
    results: dict[str, Any] = {"label": a.label, "machine": info, "workloads": {}}
    for name in a.workloads.split(","):
        if budget.spent():
            budget.skip(f"workload {name}")
            continue
        try:
            root = dataset(a.work, a.label, name, budget.timeout(900))
            say(f"{name}: dataset ready ({budget.elapsed():.0f} s elapsed)")
            r = loader_rate(name, root, a.repeats)
            say(f"{name}: loader {r['loader_samples_per_s']:.1f} samples/s (best of {a.repeats} epochs)")
            r.update(step_rate(name, root, a.epochs, budget.timeout(1200)))
        except subprocess.TimeoutExpired as exc:
            budget.skip(f"workload {name} (cut off: {' '.join(map(str, exc.cmd[2:5]))} ran out of the budget)")
            continue
        results["workloads"][name] = r
        say(f"{name}: training {r['train_samples_per_s_best']:.1f} samples/s (per epoch: "
            f"{', '.join(f'{x:.1f}' for x in r['train_samples_per_s_per_epoch'])})")
    results["budget"] = budget.summary()
    out = a.json or a.work / f"{a.label}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    if a.compare:
        before = json.loads(a.compare.read_text())
        say(f"# ratios {a.label} / {before['label']} (1.00 = same; the goal: no regression beyond noise, >= 0.95)")
        for name, r in results["workloads"].items():
            b = before["workloads"].get(name)
            if b:
                say(f"{name}: loader {r['loader_samples_per_s'] / b['loader_samples_per_s']:.2f}x, "
                      f"training {r['train_samples_per_s_best'] / b['train_samples_per_s_best']:.2f}x")
    budget.done()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
