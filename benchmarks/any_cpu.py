"""`hpcbench run` on any CPU: the ``auto`` precision/layout against the old fixed preset, and the
main command's wall time, with and without AVX-512.

An x86 CPU without native bf16 is emulated here by capping torch's kernels at AVX2
(``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2``): ATen then dispatches its AVX2 kernels and
oneDNN its AVX2 ones, where bf16 is emulated — the situation of issue #16's AVX2-only machine. On a
CPU that has no AVX-512 at all, the "native" setting is already that case.

For each setting (each in its own child process, so the caps apply from the start):
  1. the CosmoFlow mini training step (the mini model and shape, batch 4, 1 thread, forward + loss
     + backward + SGD) in fp32/bf16 x default/channels-last, and what ``auto`` chooses there;
     ratio: auto vs the old preset (bf16 + channels-last, the baseline), same process;
  2. with ``--run``: ``hpcbench run --fresh`` end to end (goal <= 180 s on a 2-core CPU).

  python -m benchmarks.any_cpu --run | tee benchmarks/results/any_cpu_DATE_MACHINE.txt
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = {"native": {}, "avx2-capped": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}}
VARIANTS = (("fp32", False), ("fp32", True), ("bf16", False), ("bf16", True))


def step_rates(budget_s: float) -> dict:
    """Samples/s of the mini step per variant (interleaved rounds, best round), in this process."""
    import torch

    from benchmarks.machine import describe
    from hpcbench.common.auto import choose_precision, cpu_bf16_native
    from hpcbench.common.precision import module_to_channels_last, to_channels_last
    from hpcbench.workloads.cosmoflow.workload import CosmoFlowWorkload

    torch.set_num_threads(1)
    wl = CosmoFlowWorkload(CosmoFlowWorkload.load_config("mini"))
    size, batch = wl.cfg.data.size, 4
    counts = torch.poisson(torch.ones(batch, size, size, size, 4)).to(torch.int16)
    x, y = wl.dataset().transform((counts, torch.rand(batch, 4) * 2 - 1))
    steps = {}
    for prec, cl in VARIANTS:
        torch.manual_seed(0)
        model = wl.build_model()
        if cl:
            model = module_to_channels_last(model)
        xb = to_channels_last(x) if cl else x.contiguous()
        opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)

        def step(model=model, xb=xb, opt=opt, prec=prec) -> None:
            ctx = torch.autocast("cpu", dtype=torch.bfloat16) if prec == "bf16" else contextlib.nullcontext()
            with ctx:
                out = wl.forward(model, (xb, y))
                loss = wl.loss(out, (xb, y)).float() / batch
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        step()  # warm-up
        steps[(prec, cl)] = step
    best = {k: float("inf") for k in steps}
    t_end = time.perf_counter() + budget_s
    rounds = 0
    while rounds < 2 or (time.perf_counter() < t_end and rounds < 20):
        for k, fn in steps.items():
            n, t0 = 0, time.perf_counter()
            while n < 3 or time.perf_counter() - t0 < 0.2:
                fn()
                n += 1
            best[k] = min(best[k], (time.perf_counter() - t0) / n)
        rounds += 1
    rates = {f"{p}{'+cl' if cl else ''}": batch / t for (p, cl), t in best.items()}
    prec = choose_precision("auto", torch.device("cpu"))
    cl_auto = best[(prec.value, True)] * 1.05 <= best[(prec.value, False)]  # the trainer's rule (CL_MIN_GAIN)
    auto = f"{prec.value}{'+cl' if cl_auto else ''}"
    return {"machine": describe(), "bf16_native": cpu_bf16_native(), "rates": rates, "rounds": rounds,
            "auto": auto, "auto_reason": prec.reason}


def child(setting: str, budget_s: float, timeout_s: float) -> dict:
    env = dict(os.environ, **SETTINGS[setting], PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    code = f"import json, benchmarks.any_cpu as b; print('RESULT', json.dumps(b.step_rates({budget_s})))"
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True,
                         timeout=timeout_s)
    if out.returncode:
        raise SystemExit(f"step measurement under {setting} failed:\n{out.stderr[-2000:]}")
    line = next(l for l in out.stdout.splitlines() if l.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def full_run(setting: str, workdir: Path, timeout_s: float) -> dict:
    env = dict(os.environ, **SETTINGS[setting], PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "hpcbench", "run", "--workdir", str(workdir), "--fresh"]
    t0 = time.perf_counter()
    try:
        out = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"status": f"did not finish within {timeout_s:.0f} s", "seconds": None}
    seconds = time.perf_counter() - t0
    tail = [l for l in out.stdout.splitlines() if l.startswith("hpcbench run finished") or "train.precision" in l
            or "train.channels_last" in l or "run_stop" in l]
    return {"status": "ok" if out.returncode == 0 else f"exit {out.returncode}", "seconds": seconds, "lines": tail}


def main() -> None:
    from benchmarks.budget import Budget, add_budget_argument
    from benchmarks.machine import describe, header

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_budget_argument(p, 900.0)
    p.add_argument("--step-s", type=float, default=20.0, help="step-measurement time per setting (default 20)")
    p.add_argument("--run", action="store_true", help="also time `hpcbench run --fresh` under each setting")
    p.add_argument("--run-timeout-s", type=float, default=420.0, help="give up on one full run after this long")
    p.add_argument("--workdir", type=Path, default=Path("/tmp/hpcbench-any-cpu"))
    p.add_argument("--settings", default=",".join(SETTINGS), help=f"comma list of {', '.join(SETTINGS)}")
    p.add_argument("--json", type=Path, help="also write the results here")
    a = p.parse_args()
    print(header(describe()), flush=True)
    budget = Budget(a.budget_s)
    results: dict = {}
    for setting in a.settings.split(","):
        if budget.spent():
            budget.skip(f"setting {setting}")
            continue
        print(f"\n== {setting} ({' '.join(f'{k}={v}' for k, v in SETTINGS[setting].items()) or 'no caps'})", flush=True)
        r = child(setting, min(a.step_s, max(1.0, budget.left() / 4)), budget.timeout(600))
        cap = r["machine"].get("torch_cpu_capability", "?")
        print(f"torch CPU capability {cap}; bf16 native: {r['bf16_native'][0]} ({r['bf16_native'][1]})")
        base = r["rates"]["bf16+cl"]
        for k, v in r["rates"].items():
            print(f"  mini step {k:8s} {v:8.1f} samples/s  x{v / base:5.2f} vs the old preset (bf16+cl)", flush=True)
        auto = r["rates"][r["auto"]]
        print(f"  auto chooses {r['auto']}: {auto:.1f} samples/s = x{auto / base:.2f} the old preset's speed "
              f"({r['rounds']} rounds, best round)", flush=True)
        if a.run and budget.left() < 60:
            budget.skip(f"hpcbench run under {setting} (less than 60 s left)")
        elif a.run:
            print(f"  hpcbench run --fresh under {setting} ...", flush=True)
            fr = full_run(setting, a.workdir / setting, budget.timeout(a.run_timeout_s))
            for line in fr.get("lines", []):
                print("    " + line)
            secs = fr["seconds"]
            verdict = (f"{secs:.1f} s ({'within' if secs <= 180 else 'OVER'} the 180 s goal)" if secs is not None
                       else fr["status"])
            print(f"  hpcbench run wall time: {verdict}; status {fr['status']}", flush=True)
            r["full_run"] = fr
        results[setting] = r
    budget.done()
    if a.json:
        a.json.write_text(json.dumps({"results": results, "budget": budget.summary()}, indent=1, default=str))


if __name__ == "__main__":
    main()
