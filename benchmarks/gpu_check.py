"""GPU check: the CUDA paths of every workload, run and measured on one GPU, written to one file.

1. the GPU tests (``pytest -rs``: aligned views, CUDA-graph replay vs eager per workload, NCCL
   groups, bf16 autocast through the harness, the DALI GPU pipelines where DALI is installed): the
   summary and every skip reason;
2. the machine's bf16 GEMM rate (8192^3), the reference for the model's share of the peak;
3. per workload at its full shape: the harness's training step alone on one batch read from real
   files (model-only samples/s) in eager, compile and, for static shapes, whole-step CUDA-graph mode;
4. per workload: ``hpcbench train`` end to end on the same files with ``data.cache=device`` (``host``
   for OC20, whose graph batches are collated again from cached samples; epoch 1
   reads through the loader; the throughput of the later epochs is what the cache gives), and its
   ratio to the model-only rate of the preset's graph mode (goal >= 0.90).

The datasets are generated at full shape into ``--work`` (CosmoFlow 128^3 x 4, DeepCAM 768 x 1152 x 16,
OC20 systems of ~70 atoms). On a machine without CUDA it says so and exits 0; ``--smoke`` runs the same
code with the mini presets on small data on the CPU (eager only, no tests), to check the script.
Every line is printed when it is measured. ``--budget-s`` bounds the whole run: subprocesses (tests,
datagen, training) get the time left as their timeout, and workloads or modes the budget does not
reach are skipped and said (in the output file too).

    python -m benchmarks.gpu_check --out benchmarks/results/gpu_check_$(date +%F)_h100.txt
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

import torch

from benchmarks.budget import Budget, add_budget_argument
from benchmarks.machine import describe, header

#: per workload: datagen options at the full shape, local batch, graph modes that apply
WORKLOADS: dict[str, dict[str, Any]] = {
    "cosmoflow": {"datagen": ["--samples", "64", "--val-samples", "8", "--size", "128", "--plain"], "batch": 8,
                  "modes": ("eager", "compile", "cuda_graph")},
    "deepcam": {"datagen": ["--samples", "32", "--eval-samples", "8", "--height", "768", "--width", "1152"],
                "batch": 4, "modes": ("eager", "compile", "cuda_graph")},
    "oc20": {"datagen": ["--train", "512", "--val", "64", "--size", "4,4,4"], "batch": 16,  # ~70 atoms, as OC20
             "modes": ("eager", "compile"), "cache": "host"},  # graphs: kept as samples, collated again
}
#: --smoke: small data for the mini presets
SMOKE_DATAGEN = {
    "cosmoflow": ["--samples", "16", "--val-samples", "8", "--size", "16"],
    "deepcam": ["--samples", "16", "--eval-samples", "8", "--height", "96", "--width", "144"],
    "oc20": ["--train", "32", "--val", "16"],
}
PRESET, DEVICE = "full", "cuda"
BUDGET = Budget(1e9)  # replaced in main() by --budget-s


def emit(lines: list[str], text: str) -> None:
    print(text, flush=True)
    lines.append(text)


def skip(lines: list[str], what: str) -> None:
    """Record ``what`` as skipped by the budget, on the screen and in the output file."""
    BUDGET.skipped.append(what)
    emit(lines, f"SKIPPED {what}: --budget-s {BUDGET.seconds:g} spent ({BUDGET.elapsed():.0f} s elapsed)")


def gemm_tflops(n: int = 8192, reps: int = 20) -> float:
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        a @ b
    torch.cuda.synchronize()
    return 2 * n**3 * reps / (time.perf_counter() - t) / 1e12


def run(cmd: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """``cmd`` with at most the time left in the budget (a timeout raises ``subprocess.TimeoutExpired``)."""
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=BUDGET.timeout(timeout))


def datagen(name: str, root: Path) -> None:
    if (root / ".done").exists():
        return
    shutil.rmtree(root, ignore_errors=True)  # a datagen cut off (no .done) left part of it
    args = SMOKE_DATAGEN[name] if PRESET == "mini" else WORKLOADS[name]["datagen"]
    proc = run([sys.executable, "-m", "hpcbench", "datagen", name, "--out", str(root), *args], 1800)
    if proc.returncode:
        raise SystemExit(f"datagen {name} failed:\n{proc.stderr[-2000:]}")
    (root / ".done").write_text("")


def overrides(name: str, root: Path, batch: int) -> list[str]:
    return [f"data.root={root}", f"train.global_batch_size={batch}", "train.loader=torch"]


def model_only(name: str, root: Path, mode: str, steps: int) -> float:
    """Samples/s of the harness's step alone on one batch from the files (already on the device)."""
    from hpcbench.common.step import prepare_batch
    from hpcbench import registry
    from tests.harness_graph import stepper

    cls = registry.get(name)
    batch_size = WORKLOADS[name]["batch"]
    wl = cls(cls.load_config(PRESET, overrides(name, root, batch_size)))
    device = torch.device(DEVICE)
    step, _ = stepper(wl, mode, device)  # first: it resolves the preset's "auto" settings into wl.cfg
    spec = wl.dataset()
    source = spec.open(wl.data_root(), spec.train_split)
    host = spec.collate([source[i % len(source)] for i in range(batch_size)])
    batch = prepare_batch(spec.transform(prepare_batch(host, device, channels_last=False)),
                          device, wl.cfg.train.channels_last)
    for _ in range(3):  # warm-up (and capture / compilation)
        step(batch)
    if device.type == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    loss = torch.zeros((), device=device)
    for _ in range(steps):
        loss += step(batch)
    float(loss)
    return batch_size * steps / (time.perf_counter() - t)


def end_to_end(name: str, root: Path, mode: str, epochs: int) -> tuple[float, list[float], str]:
    """``hpcbench train`` on the files with the device cache: mean tracked throughput of epochs 2.."""
    from hpcbench.report.logs import parse_log

    batch = WORKLOADS[name]["batch"]
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "hpcbench", "train", name, "--config", PRESET, "--device", DEVICE,
               "--results", tmp, "--no-progress"]
        for kv in [*overrides(name, root, batch), f"train.graph={mode}", f"data.cache={WORKLOADS[name].get('cache', 'device')}",
                   f"train.max_epochs={epochs}", f"train.eval_every={epochs}"]:
            cmd += ["--set", kv]
        proc = run(cmd, 3600)
        logs = sorted(Path(tmp).glob("results/**/result_*.txt"))
        rates = [tp for tp, _ms in parse_log(logs[0]).tracked_throughput] if logs else []
        # exit 4 = the run stopped at max_epochs without reaching the target: expected here
        if proc.returncode not in (0, 4) or not rates:
            why = (proc.stderr.strip() or proc.stdout.strip()).splitlines()[-1:]
            return 0.0, [], f"failed (exit {proc.returncode}): {why}"
    later = rates[1:] or rates
    return sum(later) / len(later), rates, "ok"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="", help="results file (default: print only)")
    ap.add_argument("--work", default="/tmp/hpcbench-gpu-check", help="where the full-shape datasets go")
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--steps", type=int, default=30, help="timed model-only steps per mode")
    ap.add_argument("--epochs", type=int, default=3, help="end-to-end epochs (the first fills the cache)")
    ap.add_argument("--skip-tests", action="store_true")
    ap.add_argument("--smoke", action="store_true", help="mini presets, small data, CPU allowed: checks this script")
    add_budget_argument(ap, 1800.0)
    a = ap.parse_args()
    global PRESET, DEVICE, BUDGET
    BUDGET = Budget(a.budget_s)
    lines: list[str] = []
    emit(lines, header(describe()))
    if a.smoke:
        PRESET, a.skip_tests, a.steps, a.epochs = "mini", True, 2, 2
        DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
        for spec in WORKLOADS.values():
            spec["batch"], spec["modes"] = 8, spec["modes"] if DEVICE == "cuda" else ("eager",)
    elif not torch.cuda.is_available():
        emit(lines, "no CUDA device: torch sees none here, so nothing on the GPU can be checked or measured")
        return 0
    if DEVICE == "cuda":
        p = torch.cuda.get_device_properties(0)
        emit(lines, f"# GPU {p.name}, {p.total_memory / 2**30:.0f} GiB, capability {p.major}.{p.minor}; torch "
                    f"{torch.__version__}, CUDA {torch.version.cuda}, NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}")
    if not a.skip_tests:
        t = time.perf_counter()
        try:
            proc = run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "tests/test_gpu.py",
                        "tests/test_gpu_graphs.py", "tests/test_harness_align.py"], 3600)
            tail = [ln for ln in proc.stdout.splitlines() if ln.startswith(("SKIPPED", "FAILED", "ERROR"))
                    or " passed" in ln or " failed" in ln]
            emit(lines, f"== GPU tests (exit {proc.returncode}, {time.perf_counter() - t:.0f} s)")
            for ln in tail:
                emit(lines, f"  {ln}")
        except subprocess.TimeoutExpired:
            skip(lines, "the GPU tests (cut off by the budget)")
    peak = gemm_tflops() if DEVICE == "cuda" else 0.0
    emit(lines, f"== bf16 GEMM 8192^3: {peak:.0f} TFLOP/s")
    work = Path(a.work)
    summary: dict[str, Any] = {"gemm_bf16_tflops": peak}
    for name in a.workloads.split(","):
        if BUDGET.spent():
            skip(lines, f"workload {name}")
            continue
        root = work / name
        t = time.perf_counter()
        try:
            datagen(name, root)
        except subprocess.TimeoutExpired:
            skip(lines, f"workload {name} (its datagen was cut off by the budget)")
            continue
        emit(lines, f"== {name}: {PRESET} preset, local batch {WORKLOADS[name]['batch']} (data ready in "
                    f"{time.perf_counter() - t:.0f} s)")
        rates = {}
        for mode in WORKLOADS[name]["modes"]:
            if BUDGET.spent():
                skip(lines, f"{name} model-only {mode}")
                continue
            try:
                rates[mode] = model_only(name, root, mode, a.steps)
                emit(lines, f"  model-only {mode:10s}: {rates[mode]:8.1f} samples/s")
            except Exception as exc:  # noqa: BLE001 - a mode that fails is reported, the others still run
                emit(lines, f"  model-only {mode:10s}: FAILED {type(exc).__name__}: {exc}")
        from hpcbench import registry

        cls = registry.get(name)
        mode = cls.load_config(PRESET).train.graph
        mode = mode if mode in rates else "eager"
        try:
            e2e, per_epoch, status = end_to_end(name, root, mode, a.epochs)
        except subprocess.TimeoutExpired:
            e2e, per_epoch, status = 0.0, [], "cut off by the budget"
            skip(lines, f"{name} end to end (cut off)")
        ratio = e2e / rates[mode] if rates.get(mode) else 0.0
        emit(lines, f"  end to end ({mode}, data.cache={WORKLOADS[name].get('cache', 'device')}): {e2e:.1f} samples/s after epoch 1 "
                    f"(per epoch {', '.join(f'{r:.1f}' for r in per_epoch)}; {status}); "
                    f"ratio to model-only {ratio:.2f} (goal >= 0.90)")
        summary[name] = {"model_only": rates, "end_to_end": e2e, "per_epoch": per_epoch, "mode": mode, "ratio": ratio}
    summary["budget"] = BUDGET.summary()
    emit(lines, f"# done in {BUDGET.elapsed():.0f} s of --budget-s {BUDGET.seconds:g}; skipped: "
                + ("; ".join(BUDGET.skipped) or "nothing"))
    emit(lines, "json " + json.dumps(summary))
    if a.out:
        Path(a.out).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
