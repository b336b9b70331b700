"""The dataset cache's speed-up: epoch-2 loader samples/s with ``data.cache`` against the uncached
loader, for CosmoFlow and DeepCAM, in the same process on the same files.

For each workload one training loader of one rank per mode (``none``: the baseline; ``host``; on a
GPU also ``device``) is built and run for ``--epochs`` epochs with no model, the modes' epochs
interleaved; epoch 1 reads the files (and fills the cache), the later epochs are what the cache is
for (their median is compared). The
uncached baseline's later epochs read files the page cache already holds (the most favourable case
for it: no disk). A batch counts when the loader has yielded it on the training device, transformed
(on a GPU the time includes a synchronize at the end of each epoch). On a CPU device both modes run
the spec's transform in the loader (into reused outputs; the cached mode straight from the cache's
rows where the spec offers ``transform_rows``, no gather copy first), so the cache can save only the
read and its checks; on a CPU device each mode is therefore measured twice: ``storage`` (the
transform left out: the loader's work up to the storage-dtype batch, a gather from the cache, all the
host does on a GPU, where reading is the cost) and ``transform`` (as when training on the CPU). Full
shapes use the full presets' channels-last layout. Goal: cached epochs take at least 1.5x less CPU
time per sample than uncached ones at full shapes (printed as met or MISSED per workload and
variant), judged on the median over rounds (epochs 2..) of the ratio of the two modes' CPU per sample
measured in the same round (paired: a shared machine's load drifts between rounds); the ratio of
the modes' medians is printed beside it.

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

VARIANTS = {"storage": "the loader up to the storage-dtype batch (the host's work on a GPU: where reading is the cost)",
            "transform": "the loader with the CPU transform (training on the CPU)"}
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
                      ["data.size=128", "train.channels_last=true"]),  # the full presets' layout
        "deepcam": (["--samples", "16", "--eval-samples", "4", "--height", "768", "--width", "1152"],
                    ["train.channels_last=true"]),
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


def loaders(name: str, root: Path, overrides: list[str], keys: list[tuple[str, str]], batch: int, threads: int,
            device: Any) -> dict[tuple[str, str], tuple[Any, Any]]:
    """One (workload, training loader) per (cache mode, variant). Variant ``storage``: the spec's transform
    left out (an identity on the spec object the loader uses), i.e. the loader's work up to the batch
    in the storage dtype, which on a GPU is all the host does (the transform runs on the device)."""
    import torch  # noqa: F401

    from hpcbench.common.workload import DataShard
    from hpcbench import registry

    cls = registry.get(name)
    out = {}
    for mode, variant in keys:
        wl = cls(cls.load_config("mini", [f"data.root={root}", f"data.cache={mode}", "train.loader=torch",
                                          f"data.threads={threads}", *overrides]))
        loader = wl.train_loader(DataShard(rank=0, size=1, seed=1, local_batch_size=batch, device=device))
        if variant == "storage":
            loader.spec.transform = lambda batch: batch
            loader.spec.transform_rows = lambda stored, rows: None  # the cache gathers the batch, as for a GPU
        out[mode, variant] = wl, loader
    return out


def epoch_rate(wl: Any, loader: Any, epoch: int, device: Any) -> tuple[float, float, float]:
    """(samples/s of wall time, process CPU ms per sample, minor page faults per batch): on a shared
    box the CPU time is the steadier measure of the work the loader does per sample; the page faults
    show whether anything is allocated afresh per batch (a reused buffer faults only when first used)."""
    import resource

    import torch

    loader.set_epoch(epoch)
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    t0, c0, n, batches = time.perf_counter(), time.process_time(), 0, 0
    for b in loader:
        n += wl.batch_size(b)
        batches += 1
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
    return n / (time.perf_counter() - t0), 1e3 * (time.process_time() - c0) / n, faults / max(1, batches)


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
    variants = ["storage", "transform"] if dev.type == "cpu" else ["transform"]
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
        keys = [(m, v) for v in variants for m in modes]
        built = loaders(name, root, SHAPES[a.shape][name][1], keys, a.batch, a.threads, dev)
        # epochs interleaved over the modes (none, host, ..., none, host, ...): a shared machine's
        # load drifts, and each mode then sees the same drift
        per_mode: dict[tuple[str, str], list[tuple[float, float, float]]] = {k: [] for k in keys}
        round_s = 0.0
        for epoch in range(1, a.epochs + 1):
            if epoch > 2 and budget.left() < round_s:  # epochs 1 and 2 always: the comparison needs both
                budget.skip(f"{name} epochs {epoch}-{a.epochs} of {a.epochs} (one epoch of each mode needs "
                            f"~{round_s:.0f} s)")
                break
            t = time.perf_counter()
            for key in keys:
                per_mode[key].append(epoch_rate(*built[key], epoch, dev))
                say(f"  {name} epoch {epoch} cache={key[0]} {key[1]}: {per_mode[key][-1][0]:.1f} samples/s, "
                    f"{per_mode[key][-1][1]:.2f} CPU ms/sample, {per_mode[key][-1][2]:.0f} minor page faults/batch")
            dt = time.perf_counter() - t
            round_s = dt if epoch <= 2 else min(round_s, dt)  # epoch 1 also fills the cache
        del built
        for (mode, variant), v in per_mode.items():
            print(f"{name} cache={mode} {variant}: samples/s " + ", ".join(f"{r:.1f}" for r, _, _ in v)
                  + "; CPU ms/sample " + ", ".join(f"{c:.2f}" for _, c, _ in v)
                  + "; minor page faults/batch " + ", ".join(f"{f:.0f}" for _, _, f in v) + " (epochs 1..)", flush=True)
        results["workloads"][name] = {variant: {m: [{"samples_per_s": r, "cpu_ms_per_sample": c,
                                                     "minor_faults_per_batch": f}
                                                    for r, c, f in per_mode[m, variant]] for m in modes}
                                      for variant in variants}
        rate = {k: statistics.median(r for r, _, _ in v[1:]) for k, v in per_mode.items()}
        cpu = {k: statistics.median(c for _, c, _ in v[1:]) for k, v in per_mode.items()}
        for variant in variants:
            base = ("none", variant)
            for mode in modes[1:]:
                k = (mode, variant)
                print(f"{name} {variant}: epochs 2..{len(per_mode[k])} median, cache={mode} vs none: {rate[k]:.1f} "
                      f"vs {rate[base]:.1f} samples/s = {rate[k] / rate[base]:.2f}x; CPU {cpu[k]:.2f} vs "
                      f"{cpu[base]:.2f} ms/sample = {cpu[base] / cpu[k]:.2f}x less work; epoch 1 (filling the "
                      f"cache) {per_mode[k][0][0] / per_mode[base][0][0]:.2f}x of uncached epoch 1", flush=True)
            paired = [n[1] / h[1] for n, h in zip(per_mode[base][1:], per_mode["host", variant][1:])]
            gain = statistics.median(paired)
            results["workloads"][name][variant]["paired_cpu_ratio"] = paired
            print(f"{name} {variant}: cache=host vs none, CPU per sample ratio per round (epochs 2..): "
                  + ", ".join(f"{r:.2f}" for r in paired) + f"; median {gain:.2f}x (ratio of the medians "
                  f"{cpu[base] / cpu['host', variant]:.2f}x)", flush=True)
            verdicts.append(f"{name}: cache=host {gain:.3f}x less CPU per sample than none (median of paired rounds), "
                            f"{VARIANTS[variant]} "
                            f"(goal >= {GOAL}x at full shapes{'' if a.shape == 'full' else '; these are ' + a.shape + ' shapes'}): "
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
