"""The GPU check's command line: what runs, in which order, within ``--budget-s``."""
from __future__ import annotations

import argparse
import datetime
import shutil
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

import torch

from benchmarks.budget import Budget, add_budget_argument, say
from benchmarks.machine import describe, header

from . import measure, nvidia, report, suite
from .plan import Plan, plan_for, workloads

ROOT = Path(__file__).resolve().parents[2]


def device_line(device: torch.device) -> str:
    if device.type != "cuda":
        return f"# device cpu (no GPU measured); torch {torch.__version__}"
    p = torch.cuda.get_device_properties(device)
    nccl = ".".join(map(str, torch.cuda.nccl.version())) if hasattr(torch.cuda, "nccl") else "?"
    return (f"# GPU {p.name}, {p.total_memory / 2**30:.0f} GiB, capability {p.major}.{p.minor}; torch "
            f"{torch.__version__}, CUDA {torch.version.cuda}, NCCL {nccl}")


def datagen(plan: Plan, root: Path, smoke: bool, timeout: float) -> None:
    """The plan's dataset under ``root``, once (a ``.done`` marker; a folder without it is written again)."""
    args = plan.datagen_smoke if smoke else plan.datagen_full
    marker = root / ".done"
    if marker.exists() and marker.read_text() == " ".join(args):
        return
    shutil.rmtree(root, ignore_errors=True)
    proc = subprocess.run([sys.executable, "-m", "hpcbench", "datagen", plan.name, "--out", str(root), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    if proc.returncode:
        tail = (proc.stderr.strip() or proc.stdout.strip()).splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"datagen {plan.name} {' '.join(args)} failed (exit {proc.returncode}): {tail[0][:300]}")
    marker.write_text(" ".join(args))


def evict(root: Path) -> None:
    """Drop the dataset's pages from the page cache, so that epoch 1 of a run reads the files from storage."""
    from hpcbench.common.pagecache import evict_path

    for path in root.rglob("*"):
        if path.is_file():
            evict_path(path)


def e2e_mode(plan: Plan, preset_mode: str, rates: dict[str, dict[str, Any]]) -> str:
    """The preset's graph mode where it ran model-only, else the fastest mode that did, else eager."""
    ok = {m: r["samples_per_s"] for m, r in rates.items() if "error" not in r}
    if preset_mode in ok:
        return preset_mode
    return max(ok, key=ok.__getitem__) if ok else "eager"


def run_workload(name: str, a: argparse.Namespace, budget: Budget, device: torch.device, share: float,
                 skipped: list[str], out: dict[str, Any], save: Callable[[], None]) -> None:
    """Measures ``name`` into ``out`` (already in the results), calling ``save`` after each figure, so that
    a run cut off by its device call's limit leaves every figure it measured."""
    plan = plan_for(name)
    preset = "mini" if a.smoke else "full"
    root = Path(a.work) / name
    t = time.perf_counter()
    datagen(plan, root, a.smoke, budget.timeout(max(share, 60)))
    say(f"== {name}: data ready in {time.perf_counter() - t:.0f} s ({root})")
    wl = measure.load_workload(name, preset, [f"data.root={root}", *([] if a.smoke else plan.overrides_full)])
    static = getattr(wl, "static_shapes", True)
    modes = [m for m in plan.modes if (device.type == "cuda" or m == "eager" or (m == "compile" and a.compile_on_cpu))
             and (m != "cuda_graph" or static)]
    batches = (plan.batch_smoke,) if a.smoke else plan.batches_full
    base_mode = wl.cfg.train.graph
    out.update({"note": ("default plan: " if plan.default else "") + plan.note, "batches": []})
    if getattr(wl, "shards_parameters", False):
        # built on the meta device and materialised by distribute() over the instance's layout, which
        # only the harness builds: measured end to end only, and said
        modes = []
        out["note"] += ("; " if out["note"] else "") + ("model-only not measured: the model is built sharded "
                                                       "(meta device, distribute over the instance), end to end only")
    deadline = time.monotonic() + share
    for bi, batch in enumerate(batches):
        # each batch gets an equal part of what is left; its model-only modes half of that, the two
        # end-to-end runs the rest (what a batch does not use goes to the next)
        batch_end = time.monotonic() + (deadline - time.monotonic()) / (len(batches) - bi)
        modes_end = time.monotonic() + (batch_end - time.monotonic()) / 2
        fig = nvidia.figure(name, batch)
        comparable = fig is not None and not a.smoke
        if fig is None and a.smoke:  # shown, not compared: the smoke run's shapes are not NVIDIA's
            fig = next(iter(nvidia.figures_for(name)), None)
        row: dict[str, Any] = {"batch": batch, "nvidia": asdict(fig) if fig else None, "comparable": comparable,
                               "model_only": {}}
        if fig is None:
            row["missing"] = nvidia.missing_reason(name) if not nvidia.figures_for(name) else \
                f"no NVIDIA figure at local batch {batch}"
        out["batches"].append(row)
        overrides = [f"data.root={root}", f"train.global_batch_size={batch}", "train.loader=torch",
                     *([] if a.smoke else plan.overrides_full)]
        for i, mode in enumerate(modes):
            if budget.spent() or time.monotonic() > modes_end:
                skipped.append(f"{name} batch {batch} model-only {mode}")
                continue
            try:
                if mode == "compile":  # compilation cannot be interrupted in-process: a child, bounded
                    r = measure.model_only_bounded(name, preset, overrides, mode, device, a.seconds, i == 0,
                                                   budget.timeout(max(10.0, modes_end - time.monotonic())))
                else:
                    r = measure.model_only(name, preset, overrides, mode, device, a.seconds, count_flops=i == 0)
                row["model_only"][mode] = asdict(r)
                if i == 0:
                    row["flops_per_sample"], row["flops_error"] = r.flops_per_sample, r.flops_error
                say(f"  batch {batch} model-only {mode}: {r.samples_per_s:.1f} samples/s ({r.steps} steps)")
            except Exception as exc:  # noqa: BLE001 - a mode that fails is reported; the others still run
                row["model_only"][mode] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
                say(f"  batch {batch} model-only {mode}: FAILED {type(exc).__name__}: {str(exc)[:300]}")
            finally:
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                save()
        mode = e2e_mode(plan, base_mode, row["model_only"])
        runs = (("loader", "none"), ("cache", plan.cache)) if plan.cache else (("loader", "none"),)
        if not plan.cache:
            row["cache"] = {"cache": "", "mode": mode, "per_epoch": [], "rate": 0.0, "status": f"not offered: {plan.note}"}
        for k, (key, cache) in enumerate(runs):
            if budget.spent() or time.monotonic() > batch_end:
                skipped.append(f"{name} batch {batch} end to end data.cache={cache}")
                continue
            evict(root)
            e = measure.end_to_end(name, preset, overrides, mode, cache, device.type, a.epochs,
                                   budget.timeout(max(5.0, (batch_end - time.monotonic()) / (len(runs) - k))))
            if cache == "device" and "'data.cache'" in e.status and plan.default:
                cache = "host"  # a workload without a plan whose batches the device cache cannot hold
                e = measure.end_to_end(name, preset, overrides, mode, cache, device.type, a.epochs,
                                       budget.timeout(max(5.0, batch_end - time.monotonic())))
            row[key] = {"cache": cache, "mode": mode, "per_epoch": e.per_epoch, "rate": e.rate, "status": e.status,
                        "per_step_ms": e.per_step_ms}
            say(f"  batch {batch} end to end data.cache={cache} ({mode}): {e.rate:.1f} samples/s ({e.status})")
            save()


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check",
                                 description=(__import__("benchmarks.gpu_check").gpu_check.__doc__ or ""),
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="", help="results path without suffix: writes OUT.txt and OUT.json")
    ap.add_argument("--work", default="/tmp/hpcbench-gpu-check", help="where the datasets are written")
    ap.add_argument("--workloads", default="all", help="comma-separated registered workloads, or all")
    ap.add_argument("--seconds", type=float, default=8.0, help="timed seconds per model-only mode")
    ap.add_argument("--epochs", type=int, default=3, help="end-to-end epochs (the first compiles / fills the cache)")
    ap.add_argument("--tests", choices=("gpu", "all", "none"), default="gpu",
                    help="the GPU test files, the whole suite, or none (default gpu; --smoke: none)")
    ap.add_argument("--test-workers", type=int, default=0, help="pytest-xdist workers for --tests (0: none)")
    ap.add_argument("--no-workloads", action="store_true", help="only the tests and the peak")
    ap.add_argument("--smoke", action="store_true", help="mini presets, tiny data, on the CPU where no GPU is")
    ap.add_argument("--compile-on-cpu", action="store_true", help="also torch.compile on the CPU (slow)")
    ap.add_argument("--merge", nargs="+", default=[], metavar="JSON",
                    help="merge the JSON results of parts of one session into --out and exit")
    add_budget_argument(ap, 540.0)
    a = ap.parse_args(argv)
    if a.smoke and "--tests" not in (argv if argv is not None else sys.argv):
        a.tests = "none"
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    if a.merge:
        if not a.out:
            raise SystemExit("--merge needs --out")
        res = report.merge([report.load(Path(p)) for p in a.merge])
        txt, js = report.write(res, Path(a.out))
        print("\n".join(report.render(res)))
        print(f"# wrote {txt} and {js}")
        return 0
    budget = Budget(a.budget_s)
    cuda = torch.cuda.is_available()
    if not cuda and not a.smoke:
        say("no CUDA device: torch sees none here, so nothing on the GPU can be checked (--smoke runs the "
            "same code on the CPU)")
        return 0
    device = torch.device("cuda" if cuda else "cpu")
    names = workloads() if a.workloads == "all" else [w for w in a.workloads.split(",") if w]
    unknown = sorted(set(names) - set(workloads()))
    if unknown:
        raise SystemExit(f"--workloads: {', '.join(unknown)} not registered; registered: {', '.join(workloads())}")
    res: dict[str, Any] = {"machine": header(describe()), "device_line": device_line(device),
                           "date": datetime.date.today().isoformat(), "complete": False,
                           "preset": "mini" if a.smoke else "full", "workloads": {}, "skipped": []}
    say(res["machine"])
    say(res["device_line"])

    def save() -> None:  # after every figure: a run killed at its limit keeps what it measured, marked partial
        if a.out:
            report.write(res, Path(a.out))

    flops, what = measure.gemm_peak(device)  # first: cheap, and every later figure is read against it
    res["peak"] = {"flops": flops, "what": what}
    say(f"== peak: {what} {flops / 1e12:.1f} TFLOP/s")
    save()
    if a.tests != "none":
        share = 0.9 if a.no_workloads else 0.4  # the rest: the workloads
        t = suite.run_suite(a.tests, budget.timeout(budget.left() * share), a.test_workers)
        res["tests"] = asdict(t)
        say(f"== GPU tests: {t.counts} (exit {t.exit_code}, {t.seconds:.0f} s)")
        save()
    todo = [] if a.no_workloads else names
    for i, name in enumerate(todo):
        if budget.spent():
            res["skipped"].append(f"workload {name} (--budget-s {a.budget_s:g} spent)")
            continue
        share = budget.left() / (len(todo) - i)
        res["workloads"][name] = {}
        try:
            run_workload(name, a, budget, device, share, res["skipped"], res["workloads"][name], save)
        except Exception as exc:  # noqa: BLE001 - one workload's failure is reported; the others still run
            res["workloads"][name] = {"error": f"{type(exc).__name__}: {str(exc)[:500]}"}
            say(f"== {name}: FAILED {type(exc).__name__}: {str(exc)[:500]}")
        save()
    res["budget"] = budget.summary()
    res["complete"] = True
    for line in report.render(res):
        say(line)
    if a.out:
        txt, js = report.write(res, Path(a.out))
        say(f"# wrote {txt} and {js}")
    return 0
