"""Dedicated evaluation ranks vs inline evaluation: time to train the toy workload to its target when
the evaluation is expensive (a validation set several times the training set).

Runs, each a real ``mpiexec`` job of ``Trainer.run`` (one torch thread per rank, so ranks = cores used):

* ``inline``  - T training ranks that also evaluate (``train.eval_ranks = 0``), the baseline;
* ``eval``    - the same T training ranks plus E dedicated evaluation ranks (``train.eval_ranks = E``):
  the *same training ranks* comparison (the evaluation ranks are extra resources, as NVIDIA's 3D U-Net
  runs 640 GPUs of training beside 160 of evaluation). Same seed and shards, so the same epoch meets the
  target and the time difference is the evaluation that is no longer on the training ranks' path;
* ``inline_all`` (optional, ``--same-total``) - T + E ranks that all train and evaluate: the *same total
  ranks* comparison.

Pairs are interleaved (inline, eval, inline, eval, ...) so machine noise hits both; the median time to
train (``run_stop - run_start`` from the MLPerf log's clock) of each is compared, with the evaluation time on the training ranks' path and the training step time
(the evaluation ranks take cores from training where none are free). Also measured: the cost
of the per-step result poll on the training ranks (``TrainSide.poll``: ``MPI_Iprobe`` on training rank
0 and an 8-byte broadcast to the others) against a training step.

    python -m benchmarks.async_eval [--train-ranks 1] [--eval-ranks 1] [--same-total] [--budget-s 300]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
from benchmarks.budget import Budget, add_budget_argument, mpiexec, one_thread_rank_env, say
from benchmarks.machine import describe, header


def overrides(args: argparse.Namespace, eval_ranks: int) -> list[str]:
    return [f"model.hidden={args.hidden}", f"data.train={args.train}", f"data.eval={args.eval}",
            f"train.global_batch_size={args.batch}", f"train.target={args.target}", "train.max_epochs=30",
            f"train.eval_ranks={eval_ranks}"]


def worker(argv: list[str]) -> None:
    """Inside the mpiexec job: one run, one JSON line per rank; ``poll N``: time N result polls."""
    from hpcbench.common.dist import init_distributed
    from hpcbench.common.mllog import MLPerfLogger
    from hpcbench.common.system import SystemDescription
    from hpcbench.common.trainer import Trainer
    from tests.harness_toy import ToyWorkload

    env = init_distributed(device="cpu")
    mode, rest = argv[0], argv[1:]
    cfg = ToyWorkload.load_config("mini", rest[1:] if mode == "poll" else rest)
    tr = Trainer(ToyWorkload(cfg), env, MLPerfLogger(None), SystemDescription(), progress=False)
    if mode == "poll":
        n = int(rest[0])
        parts = tr.setup()
        row: dict[str, Any] = {}
        instance_comm = parts.parallel.instance_env.instance_comm
        if tr.evals is not None:  # a training rank: n polls (no result is due), then stop the evaluators
            instance_comm.Barrier()
            t0 = time.perf_counter()
            for _ in range(n):
                tr.evals.poll(tr.record_metric)
            row["poll_us"] = 1e6 * (time.perf_counter() - t0) / n
            batch = next(iter(parts.train_loader))
            parts.step(batch)
            t0 = time.perf_counter()
            for _ in range(20):
                parts.step(batch)
            row["step_us"] = 1e6 * (time.perf_counter() - t0) / 20
            tr.evals.stop("aborted", cfg.train.eval_timeout_s)
        else:
            instance_comm.Barrier()
            from hpcbench.common.async_eval import EvalSide

            EvalSide(parts, parts.parallel.roles, tr.workload).serve(env.layout.instance)
    else:
        r = tr.run()
        row = {"status": r.status, "tts": r.time_to_solution_s, "epochs": r.epochs, "evals": len(r.metrics),
               "metric": r.final_metric, **{f"t_{k}": v["seconds"] for k, v in r.timers.items()}}
        if "step" in r.timers:
            row["step_ms"] = 1000 * r.timers["step"]["mean_s"]
            row["on_path_s"] = on_path(tr, r)
    print(json.dumps({"rank": env.layout.world_rank, **row}), flush=True)
    env.close()


def on_path(tr: Any, r: Any) -> float:
    """Seconds of evaluation on the training ranks' path to the result: inline, the evaluations
    themselves; with evaluation ranks, the sends, the wait at the end and the latency of the deciding
    evaluation (from its send to its result's arrival; training went on meanwhile, but that training
    did not count)."""
    t = r.timers
    if "eval" in t:
        return t["eval"]["seconds"]
    return t.get("eval_send", {}).get("seconds", 0.0) + t.get("eval_wait", {}).get("seconds", 0.0) + \
        (r.run_stop_ms - tr.evals.last_sent_ms) / 1000.0


def launch(ranks: int, argv: list[str], timeout: float) -> dict[int, dict[str, Any]]:
    proc = subprocess.run([mpiexec(), "-n", str(ranks), sys.executable, "-m", "benchmarks.async_eval", "--worker", *argv],
                          env=one_thread_rank_env(HPCBENCH_PROGRESS="0"), capture_output=True, text=True,
                          timeout=timeout)
    if proc.returncode != 0:
        raise SystemExit(f"mpiexec -n {ranks} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return {r["rank"]: r for r in (json.loads(m) for m in re.findall(r'\{"rank"[^{}]*\}', proc.stdout))}


def main() -> None:
    if "--worker" in sys.argv:
        worker(sys.argv[sys.argv.index("--worker") + 1:])
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train-ranks", type=int, default=1)
    ap.add_argument("--eval-ranks", type=int, default=1)
    ap.add_argument("--same-total", action="store_true", help="also run T + E ranks that all train and evaluate")
    ap.add_argument("--pairs", type=int, default=5, help="interleaved pairs (at most)")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--train", type=int, default=8192, help="training samples")
    ap.add_argument("--eval", type=int, default=32768, help="validation samples (the expensive evaluation)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--target", type=float, default=0.07, help="eval_error to reach (0.07: 3 epochs)")
    add_budget_argument(ap, 300.0)
    args = ap.parse_args()
    budget = Budget(args.budget_s)
    say(header(describe()))
    t, e = args.train_ranks, args.eval_ranks
    say(f"toy MLP hidden={args.hidden}, {args.train} train / {args.eval} eval samples, global batch {args.batch}, "
        f"target eval_error <= {args.target}; 1 torch thread per rank; {os.cpu_count()} cores")
    runs: dict[str, tuple[int, list[str]]] = {
        "inline": (t, overrides(args, 0)),
        "eval": (t + e, overrides(args, e)),
    }
    if args.same_total:
        runs["inline_all"] = (t + e, overrides(args, 0))
    got: dict[str, list[dict[str, Any]]] = {k: [] for k in runs}
    round_s = 0.0
    for i in range(args.pairs):
        if i and budget.left() < round_s:
            budget.skip(f"pairs {i + 1}-{args.pairs} (one round needs ~{round_s:.0f} s)")
            break
        t0 = time.monotonic()
        for name, (ranks, ov) in runs.items():
            row = launch(ranks, ["run", *ov], budget.timeout(600))[0]
            got[name].append(row)
            tm = {k[2:]: v for k, v in row.items() if k.startswith("t_")}
            say(f"  round {i + 1} {name:10s} ({ranks} ranks): {row['status']} in {row['tts']:.2f} s, "
                f"{row['epochs']} epochs, {row['evals']} evals, final {row['metric']:.4f}; "
                f"step {tm.get('step', 0):.2f} s, eval inline {tm.get('eval', 0):.2f} s, "
                f"send {tm.get('eval_send', 0):.3f} s, end wait {tm.get('eval_wait', 0):.2f} s")
        round_s = time.monotonic() - t0
    med = {k: statistics.median(r["tts"] for r in v) for k, v in got.items() if v}
    for k, v in got.items():
        say(f"{k:10s}: median training step {statistics.median(r['step_ms'] for r in v):.2f} ms, evaluation on the "
            f"training ranks' path {statistics.median(r['on_path_s'] for r in v):.3f} s (median of {len(v)})")
    say(f"median time to train, inline ({t} ranks train+evaluate)          : {med['inline']:.2f} s "
        f"(of {len(got['inline'])})")
    say(f"median time to train, {t} training + {e} evaluation rank(s)        : {med['eval']:.2f} s "
        f"(of {len(got['eval'])})")
    say(f"ratio inline / eval-ranks (same training ranks) = {med['inline'] / med['eval']:.2f}x")
    if "inline_all" in med:
        say(f"median time to train, inline ({t + e} ranks train+evaluate)         : {med['inline_all']:.2f} s")
        say(f"ratio inline_all / eval-ranks (same total ranks) = {med['inline_all'] / med['eval']:.2f}x")
    if budget.left() > 20:
        poll_ranks = max(2, t)
        rows = launch(poll_ranks + 1, ["poll", "2000", *overrides(args, 1)], budget.timeout(120))
        polls = [rows[r]["poll_us"] for r in range(poll_ranks)]
        steps = [rows[r]["step_us"] for r in range(poll_ranks)]
        say(f"per-step result poll on {poll_ranks} training ranks (+1 evaluation rank): "
            f"{max(polls):.1f} us (slowest rank) vs a training step of {statistics.median(steps):.0f} us "
            f"= {100 * max(polls) / statistics.median(steps):.2f}% of a step")
    else:
        budget.skip("the per-step poll cost")
    budget.done()


if __name__ == "__main__":
    main()
