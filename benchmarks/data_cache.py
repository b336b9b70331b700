"""The dataset cache's speed-up: epoch-2 loader samples/s with ``data.cache`` against the uncached
loader, for CosmoFlow and DeepCAM, in the same process on the same files.

For each workload one training loader of one rank per mode (``none``: the baseline; ``host``; on a
GPU also ``device``) is built and run for ``--epochs`` epochs with no model, the modes' epochs
interleaved; epoch 1 reads the files (and fills the cache), the later epochs are what the cache is
for (their median is compared). The
uncached baseline's later epochs read files the page cache already holds (the most favourable case
for it: no disk). A batch counts when the loader has yielded it on the training device, transformed
(on a GPU the time includes a synchronize at the end of each epoch). On a CPU device both modes run
the spec's transform in the loader (into reused outputs), so the cache can save only the read and
its checks. Goal: cached epochs take at least 1.5x less CPU time per sample than uncached ones at
full shapes (printed as met or MISSED per workload).

Each epoch is printed when it ends. ``--budget-s`` bounds the whole run: datagen gets the time left
as its timeout, and epochs or workloads the budget does not reach are skipped and said (also in
the JSON); the comparison then uses the epochs measured.

    python -m benchmarks.data_cache --work /tmp/dc                  # mid shapes (CPU box)
    python -m benchmarks.data_cache --work /tmp/dc --shape full     # 128^3 x 4 and 768 x 1152 x 16
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

GOAL = 1.5  # cached epochs: at least this much less CPU time per sample than uncached ones (full shapes)
SHAPES: dict[str, dict[str, tuple[list[str], list[str]]]] = {
    # workload: (datagen options, config overrides)
    "tiny": {  # for the tests: seconds, not a measurement
        "cosmoflow": (["--samples", "8", "--val-samples", "2", "--size", "16", "--plain", "--quiet"],
                      ["data.size=16"]),
        "deepcam": (["--samples", "8", "--eval-samples", "2", "--height", "32", "--width", "48"], []),
    },
    "mid": {
        "cosmoflow": (["--samples", "96", "--val-samples", "8", "--size", "64", "--plain", "--quiet"],
                      ["data.size=64"]),
        "deepcam": (["--samples", "48", "--eval-samples", "8", "--height", "384", "--width", "576"], []),
    },
    "full": {
        "cosmoflow": (["--samples", "48", "--val-samples", "4", "--size", "128", "--plain", "--quiet"],
                      ["data.size=128"]),
        "deepcam": (["--samples", "16", "--eval-samples", "4", "--height", "768", "--width", "1152"], []),
    },
}


def dataset(work: Path, shape: str, name: str, timeout: float = 3600) -> Path:
    out = work / shape / name
    if not (out / ".done").exists():
        shutil.rmtree(out, ignore_errors=True)  # a datagen cut off (no .done) left part of it
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        proc = subprocess.run([sys.executable, "-m", "hpcbench", "datagen", name, "--out", str(out), "--workers", "2",
                               *SHAPES[shape][name][0]], env=env, capture_output=True, text=True, timeout=timeout)
        if proc.returncode:
            raise SystemExit(f"datagen {name} failed:\n{proc.stderr[-2000:]}")
        (out / ".done").write_text("")
    return out


def loaders(name: str, root: Path, overrides: list[str], modes: list[str], batch: int, threads: int,
            device: Any) -> dict[str, tuple[Any, Any]]:
    import torch  # noqa: F401

    from hpcbench.common.workload import DataShard
    from hpcbench import registry

    cls = registry.get(name)
    out = {}
    for mode in modes:
        wl = cls(cls.load_config("mini", [f"data.root={root}", f"data.cache={mode}", "train.loader=torch",
                                          f"data.threads={threads}", *overrides]))
        out[mode] = wl, wl.train_loader(DataShard(rank=0, size=1, seed=1, local_batch_size=batch, device=device))
    return out


def epoch_rate(wl: Any, loader: Any, epoch: int, device: Any) -> tuple[float, float]:
    """(samples/s of wall time, process CPU ms per sample): on a shared box the CPU time is the
    steadier measure of the work the loader does per sample."""
    import torch

    loader.set_epoch(epoch)
    t0, c0, n = time.perf_counter(), time.process_time(), 0
    for b in loader:
        n += wl.batch_size(b)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return n / (time.perf_counter() - t0), 1e3 * (time.process_time() - c0) / n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "hpcbench-data-cache")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="mid")
    ap.add_argument("--workloads", default="cosmoflow,deepcam")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=6, help="epochs per mode (at most; >= 2 to compare)")
    ap.add_argument("--threads", type=int, default=-1, help="data.threads (-1: auto, 0 on a CPU device)")
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda")
    ap.add_argument("--json", type=Path, help="also write the results here")
    from benchmarks.budget import Budget, add_budget_argument, say
    from benchmarks.machine import describe, header

    add_budget_argument(ap, 600.0)
    a = ap.parse_args()
    budget = Budget(a.budget_s)

    import torch

    dev = torch.device("cuda" if a.device == "auto" and torch.cuda.is_available() else
                       ("cpu" if a.device == "auto" else a.device))
    info = describe()
    print(header(info), flush=True)
    print(f"# benchmarks/data_cache.py --shape {a.shape} --batch {a.batch} --epochs {a.epochs} --threads {a.threads}; "
          f"device {dev}; one rank, loader only (no model); samples/s per epoch; baseline = data.cache=none on "
          "the same files in the same process (page cache warm after epoch 1), epochs interleaved", flush=True)
    modes = ["none", "host"] + (["device"] if dev.type == "cuda" else [])
    verdicts: list[str] = []
    results: dict[str, Any] = {"machine": info, "shape": a.shape, "batch": a.batch, "device": str(dev),
                               "workloads": {}}
    for name in a.workloads.split(","):
        if budget.spent():
            budget.skip(f"workload {name}")
            continue
        try:
            root = dataset(a.work, a.shape, name, budget.timeout(3600))
        except subprocess.TimeoutExpired:
            budget.skip(f"workload {name} (its datagen ran out of the budget)")
            continue
        built = loaders(name, root, SHAPES[a.shape][name][1], modes, a.batch, a.threads, dev)
        # epochs interleaved over the modes (none, host, ..., none, host, ...): a shared machine's
        # load drifts, and each mode then sees the same drift
        per_mode: dict[str, list[tuple[float, float]]] = {m: [] for m in modes}
        round_s = 0.0
        for epoch in range(1, a.epochs + 1):
            if epoch > 2 and budget.left() < round_s:  # epochs 1 and 2 always: the comparison needs both
                budget.skip(f"{name} epochs {epoch}-{a.epochs} of {a.epochs} (one epoch of each mode needs "
                            f"~{round_s:.0f} s)")
                break
            t = time.perf_counter()
            for mode in modes:
                per_mode[mode].append(epoch_rate(*built[mode], epoch, dev))
                say(f"  {name} epoch {epoch} cache={mode}: {per_mode[mode][-1][0]:.1f} samples/s, "
                    f"{per_mode[mode][-1][1]:.2f} CPU ms/sample")
            dt = time.perf_counter() - t
            round_s = dt if epoch <= 2 else min(round_s, dt)  # epoch 1 also fills the cache
        del built
        for mode in modes:
            print(f"{name} cache={mode}: samples/s " + ", ".join(f"{r:.1f}" for r, _ in per_mode[mode])
                  + "; CPU ms/sample " + ", ".join(f"{c:.2f}" for _, c in per_mode[mode]) + " (epochs 1..)",
                  flush=True)
        results["workloads"][name] = {m: [{"samples_per_s": r, "cpu_ms_per_sample": c} for r, c in v]
                                      for m, v in per_mode.items()}
        rate = {m: statistics.median(r for r, _ in v[1:]) for m, v in per_mode.items()}
        cpu = {m: statistics.median(c for _, c in v[1:]) for m, v in per_mode.items()}
        for mode in modes[1:]:
            print(f"{name}: epochs 2..{len(per_mode[mode])} median, cache={mode} vs none: {rate[mode]:.1f} vs "
                  f"{rate['none']:.1f} samples/s = {rate[mode] / rate['none']:.2f}x; CPU {cpu[mode]:.2f} vs "
                  f"{cpu['none']:.2f} ms/sample = {cpu['none'] / cpu[mode]:.2f}x less work; epoch 1 (filling the "
                  f"cache) {per_mode[mode][0][0] / per_mode['none'][0][0]:.2f}x of uncached epoch 1", flush=True)
        gain = cpu["none"] / cpu["host"]
        verdicts.append(f"{name}: cache=host {gain:.2f}x less CPU per sample than none (goal >= {GOAL}x at full "
                        f"shapes{'' if a.shape == 'full' else '; these are ' + a.shape + ' shapes'}): "
                        + ("met" if gain >= GOAL else "MISSED"))
    print(f"# load at the end {' / '.join(f'{x:.2f}' for x in os.getloadavg())} (1/5/15 min)", flush=True)
    for v in verdicts:
        print(v, flush=True)
    results["budget"] = budget.summary()
    budget.done()
    if a.json:
        a.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
